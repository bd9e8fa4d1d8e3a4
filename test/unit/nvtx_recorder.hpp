// nvtx_recorder - an NVTX tool for tests: a shared library that NVTX3 loads as its
// injection (NVTX_INJECTION64_PATH names it; test_trace.cpp sets that to this library's
// own path before the first NVTX call) and that records every range of every domain:
// each push as its path of the thread's open ranges ("shardopt/step>shardopt/adam"; an
// int32 payload appended as " #N"), the domains created and the strings registered.
#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace shardopt::test {

struct NvtxRecord {
  std::mutex mu;
  std::deque<std::string> strings;                           // registered strings (stable addresses)
  std::map<std::thread::id, std::vector<std::string>> open;  // each thread's open ranges
  std::vector<std::string> paths;                            // every push, as its path
  std::vector<std::string> domains;                          // every domain created
  int bad_pops = 0;                                          // pops with no open range
  std::size_t register_calls = 0;                            // nvtxDomainRegisterStringA calls
  bool attached = false;                                     // NVTX called the injection's init

  /// The pushes recorded since the last take().
  std::vector<std::string> take() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::string> out;
    out.swap(paths);
    return out;
  }
  /// How many times a string was registered so far (the same string twice counts twice).
  std::size_t registered() {
    std::lock_guard<std::mutex> lock(mu);
    return register_calls;
  }
};

/// The recorder's state (one per process).
NvtxRecord& nvtx_record();

}  // namespace shardopt::test
