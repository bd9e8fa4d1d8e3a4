// dependent_launch.cpp - the process-wide switch of dependent_launch.hpp.
#include "kernels/common/dependent_launch.hpp"

#include <atomic>

namespace shardopt::kernels {
namespace {

std::atomic<bool>& switch_state() {
  static std::atomic<bool> on{true};
  return on;
}

}  // namespace

void set_dependent_launch(bool on) { switch_state().store(on, std::memory_order_relaxed); }

bool dependent_launch() { return switch_state().load(std::memory_order_relaxed); }

}  // namespace shardopt::kernels
