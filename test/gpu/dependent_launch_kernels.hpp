// dependent_launch_kernels.hpp - a producer kernel for test_dependent_launch_gpu.cpp: it
// lets the next kernel on the stream be scheduled at once (griddepcontrol.launch_dependents),
// then waits, then writes its output - so a consumer launched as a programmatic dependent
// launch that read its input before griddepcontrol.wait would read the old values.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dependent_launch_test {

/// Enqueues on `stream`: dst[i] = values[i] for i < n, written only after the kernel has
/// spun about `spin_us` microseconds, and allowing dependents to launch before that.
void launch_late_copy(std::uint16_t* dst, const std::uint16_t* values, std::int64_t n, int spin_us,
                      cudaStream_t stream);

}  // namespace dependent_launch_test
