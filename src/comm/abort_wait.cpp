#include "comm/abort_wait.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace shardopt::detail {
namespace {

std::atomic<int> g_running{0};
std::once_flag g_exit_handler;

void wait_at_exit() {
  if (!wait_for_aborts(kAbortExitWait)) {
    std::fprintf(stderr,
                 "shardopt: %d NCCL communicator abort(s) still running after %lld ms at exit; exiting anyway "
                 "(an abort waits for the CUDA graphs that use its communicator: destroy them before exit)\n",
                 running_aborts(), static_cast<long long>(kAbortExitWait.count()));
  }
}

}  // namespace

RunningAbort::RunningAbort() {
  g_running.fetch_add(1);
  std::call_once(g_exit_handler, [] { (void)std::atexit(wait_at_exit); });
}

RunningAbort::~RunningAbort() { g_running.fetch_sub(1); }

int running_aborts() noexcept { return g_running.load(); }

bool wait_for_aborts(std::chrono::milliseconds limit) noexcept {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (g_running.load() > 0) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace shardopt::detail
