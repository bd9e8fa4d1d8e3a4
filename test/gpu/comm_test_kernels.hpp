// comm_test_kernels.hpp - small kernels of the communicator GPU tests: delays that make
// a missing stream dependency visible as wrong data.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardopt::test {

/// On `stream`: waits `ns` nanoseconds of GPU time (%globaltimer), then writes
/// `pattern` (the low `element_bytes` bytes: 2 or 4) to `count` elements of `data`.
void spin_then_fill(cudaStream_t stream, std::uint64_t ns, void* data, long long count, int element_bytes,
                    std::uint32_t pattern);

/// On `stream`: waits `ns` nanoseconds of GPU time.
void spin(cudaStream_t stream, std::uint64_t ns);

}  // namespace shardopt::test
