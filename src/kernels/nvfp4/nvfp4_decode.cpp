// nvfp4_decode.cpp - the batched bf16 NVFP4 decode (dequantize_nvfp4_batch): argument
// checks, then one CUDA launch per kNvfp4DecodeLaunch tensors or the host twin (enqueued
// on the HostStream so that it joins captures), and the host twin itself.
#include "kernels/nvfp4/nvfp4_decode.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "kernels/nvfp4/nvfp4_checks.hpp"
#include "kernels/nvfp4/nvfp4_launch.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt_config.h"

namespace shardopt {

namespace nvfp4 {
void host_dequantize_list(const Nvfp4Decode* tensors, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const Nvfp4Decode& t = tensors[i];
    host_dequantize(t.shape, t.data, t.scale, t.decode_scale, nullptr, t.out);
  }
}
}  // namespace nvfp4

void dequantize_nvfp4_batch(const std::vector<Nvfp4Decode>& tensors, const std::int32_t* skip_flag, Backend backend,
                            Stream stream) {
  SHARDOPT_REQUIRE(!tensors.empty(), ErrorCode::InvalidArgument,
                   "dequantize_nvfp4_batch of an empty tensor list; give it at least one tensor to decode");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Nvfp4Decode& t = tensors[i];
    const std::string which = "dequantize_nvfp4_batch tensor " + std::to_string(i) + ": ";
    try {
      validate(t.shape);
    } catch (const Error& e) {
      throw Error(e.code(), which + e.what());
    }
    for (const auto& [p, what] : {std::pair<const void*, const char*>{t.data, "data"},
                                  {t.scale, "scale"},
                                  {t.decode_scale, "decode_scale"},
                                  {t.out, "out"}})
      nvfp4::require_ptr(p, which + what);
  }
  if (backend == Backend::Host) {
    // The flag is read when the work runs (a replay reads its value then).
    host_enqueue(stream, [tensors, skip_flag] {
      if (skip_flag == nullptr || *skip_flag == 0) nvfp4::host_dequantize_list(tensors.data(), tensors.size());
    });
    return;
  }
  for (std::size_t first = 0; first < tensors.size(); first += kNvfp4DecodeLaunch) {
    nvfp4::DecodeList list;
    const std::size_t n = std::min(kNvfp4DecodeLaunch, tensors.size() - first);
    for (std::size_t k = 0; k < n; ++k) list.add(tensors[first + k]);
    nvfp4::launch_dequantize_list(list, skip_flag, stream);
  }
}

}  // namespace shardopt

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launch refuses.
namespace shardopt::nvfp4 {
void launch_dequantize_list(const DecodeList&, const std::int32_t*, Stream) { detail::no_cuda("NVFP4 batched decode"); }
}  // namespace shardopt::nvfp4
#endif
