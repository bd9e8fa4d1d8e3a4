// abort_wait.hpp - the NCCL aborts still running in this process, and the wait for them
// at exit.
//
// A failed NCCL communicator is aborted on a thread of its own (nccl_comm.cpp), which a
// Communicator's destructor does not join: ncclCommAbort may wait for CUDA graphs that
// the trainer destroys later. If the process exits while such an abort still runs, the
// CUDA runtime's teardown at exit unmaps memory that NCCL's threads still use, and they
// crash (seen on 2 H100s: a segfault in a NCCL thread after every test had passed).
// Each abort is counted from its start to its end, and the first one registers an exit
// handler that waits, bounded, for the count to reach zero; registered after the CUDA
// runtime started, it runs before the runtime's teardown.
#pragma once

#include <chrono>

namespace shardopt::detail {

/// How long the exit handler waits for running aborts before letting the exit go on.
inline constexpr std::chrono::milliseconds kAbortExitWait{10000};

/// Counts one running abort for its lifetime; the first one ever made registers the exit
/// handler (std::atexit).
class RunningAbort {
 public:
  RunningAbort();
  ~RunningAbort();
  RunningAbort(const RunningAbort&) = delete;
  RunningAbort& operator=(const RunningAbort&) = delete;
};

/// The number of aborts running now.
int running_aborts() noexcept;

/// Waits until no abort runs or `limit` passes; true when none runs. (The exit handler's
/// wait, with kAbortExitWait.)
bool wait_for_aborts(std::chrono::milliseconds limit) noexcept;

}  // namespace shardopt::detail
