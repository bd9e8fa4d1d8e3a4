// nvfp4_shard.cpp - the sharded NVFP4 entry points (phase 1: partial amaxes; phase 2:
// scales and the shard's data bytes): argument checks, then the CUDA launch or the host
// twin (enqueued on the HostStream so that it joins captures).
#include <string>

#include "core/memory.hpp"
#include "kernels/nvfp4_checks.hpp"
#include "kernels/nvfp4_launch.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/nvfp4.hpp"

namespace shardopt {
namespace {

void check_range(const Nvfp4Shape& s, Range range) {
  SHARDOPT_REQUIRE(range.begin >= 0 && range.begin <= range.end && range.end <= s.numel(), ErrorCode::OutOfRange,
                   "NVFP4 shard range [" + std::to_string(range.begin) + ", " + std::to_string(range.end) +
                       ") is not inside the tensor's " + std::to_string(s.numel()) +
                       " elements; pass the rank's param_offset and param_offset + length");
}

}  // namespace

void nvfp4_partial_amax(const Nvfp4Shape& shape, Range range, const float* master, std::uint32_t* amax,
                        Backend backend, Stream stream) {
  validate(shape);
  check_range(shape, range);
  if (range.size() > 0) nvfp4::require_ptr(master, "the master shard");
  nvfp4::require_ptr(amax, "amax");
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] { nvfp4::host_partial_amax(shape, range, master, amax); });
    return;
  }
  fill_zero_async(backend, amax, static_cast<std::size_t>(shape.amax_numel()) * sizeof(std::uint32_t), stream);
  if (range.size() > 0) nvfp4::launch_partial_amax(shape, range, master, amax, stream);
}

void quantize_nvfp4_shard(const Nvfp4Shape& shape, Range range, const float* master, const std::uint32_t* amax,
                          const Nvfp4Planes& out, Backend backend, Stream stream) {
  validate(shape);
  check_range(shape, range);
  if (range.size() > 0) nvfp4::require_ptr(master, "the master shard");
  nvfp4::require_ptr(amax, "amax");
  nvfp4::require_planes(out, "");
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] { nvfp4::host_quantize_shard(shape, range, master, amax, out); });
    return;
  }
  nvfp4::launch_quantize_shard(shape, range, master, amax, out, stream);
}

}  // namespace shardopt
