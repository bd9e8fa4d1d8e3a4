// grad_zeroing.hpp - what DistributedAdam::zero_grad clears (issue 29). After a step
// that landed every staged quantized bucket (NVFP4), those buckets' gradient regions are
// already zero (the landing zeroed them), so the zero_grad that StepGraph runs right
// behind the step clears only the rest of the gradient buffers. MXFP8 buckets gather in
// place into their storage and never touch their regions: zero_grad clears them always.
// The bytes zero_grad clears are counted per process, so that tests can see which
// regions it left alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardopt/layout.hpp"

namespace shardopt::detail {

/// A byte range [begin, end) of one gradient buffer.
struct GradBytes {
  std::size_t begin = 0, end = 0;
};

/// Per layout buffer, its gradient byte ranges (elements of `grad_size` bytes) outside
/// the regions of the buckets marked in `landed` (per bucket), merged and in order.
std::vector<std::vector<GradBytes>> grads_outside(const Layout& layout, std::size_t grad_size,
                                                  const std::vector<bool>& landed);

/// Adds `bytes` to the process's count of bytes zero_grad enqueued to clear.
void count_zero_grad_bytes(std::size_t bytes);
/// The bytes every DistributedAdam::zero_grad of this process enqueued to clear so far.
std::int64_t zero_grad_bytes();

}  // namespace shardopt::detail
