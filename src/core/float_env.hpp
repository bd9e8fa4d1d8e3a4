// float_env.hpp - IEEE subnormals for the host twins.
//
// The host twins must give the GPU kernels' bits. The GPU kernels keep subnormals (nvcc's
// default -ftz=false), but a process may run with the CPU's flush-to-zero (FTZ) and
// denormals-are-zero (DAZ) modes on: any shared library linked with -ffast-math sets
// them for the whole process when it is loaded. IeeeSubnormals turns both off on the
// calling thread for its lifetime and restores the caller's modes after, so that host
// work gives the same bits in every process.
#pragma once

#include <cstdint>

namespace shardopt::detail {

class IeeeSubnormals {
 public:
  IeeeSubnormals() noexcept;
  ~IeeeSubnormals();
  IeeeSubnormals(const IeeeSubnormals&) = delete;
  IeeeSubnormals& operator=(const IeeeSubnormals&) = delete;

 private:
  std::uint64_t saved_;
};

/// True on x86-64 and AArch64, whose flush modes IeeeSubnormals controls; elsewhere it
/// changes nothing.
bool float_modes_supported() noexcept;

/// True when this thread's CPU flushes subnormals (FTZ) or treats them as zero (DAZ).
bool subnormals_flushed() noexcept;

/// Test hook: turns FTZ and DAZ on (what a -ffast-math library does at load) or off for
/// this thread.
void set_subnormals_flushed_for_test(bool on) noexcept;

}  // namespace shardopt::detail
