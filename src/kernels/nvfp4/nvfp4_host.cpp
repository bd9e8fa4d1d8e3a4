// nvfp4_host.cpp - host twins of the NVFP4 kernels: loops over the same units of work
// (nvfp4_units.cuh) that the kernels' threads run.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/nvfp4/nvfp4_launch.hpp"
#include "kernels/nvfp4/nvfp4_math.cuh"
#include "kernels/nvfp4/nvfp4_units.cuh"

namespace shardopt::nvfp4 {
namespace {

// The scales of every block and the tensor's two fp32 values from the block amaxes
// (`block_amax`, scale_numel() entries) and the tensor's amax bits.
void write_scales(const Nvfp4Shape& s, const std::uint32_t* block_amaxes, std::uint32_t tensor_amax,
                  const Nvfp4Planes& out) {
  for (std::int64_t b = 0; b < s.scale_numel(); ++b) out.scale[b] = block_scale(block_amaxes[b], tensor_amax);
  const GlobalScale g = global_scale(tensor_amax);
  *out.amax = g.amax;
  *out.decode_scale = g.decode;
}

// The data bytes `bytes` (elements outside `elements` left 0) from the scales and
// decode_scale already written; byte k at out.data[k - bytes.begin].
template <class Source>
void write_bytes(const Nvfp4Shape& s, Source src, Range bytes, Range elements, const Nvfp4Planes& out) {
  for (std::int64_t k = bytes.begin; k < bytes.end; ++k)
    out.data[k - bytes.begin] = encode_byte(s, k, src, out.scale, *out.decode_scale, elements.begin, elements.end);
}

}  // namespace

void host_quantize(const QuantizeEntry* entries, int count) {
  for (int t = 0; t < count; ++t) {
    const QuantizeEntry& e = entries[t];
    const Nvfp4Shape& s = e.shape;
    const Bf16Source src{e.src};
    std::vector<std::uint32_t> amax(static_cast<std::size_t>(s.scale_numel()));
    for (std::int64_t b = 0; b < s.scale_numel(); ++b)
      amax[static_cast<std::size_t>(b)] = block_amax(s, b, src, 0, s.numel());
    write_scales(s, amax.data(), *std::max_element(amax.begin(), amax.end()), e.out);
    write_bytes(s, src, {0, s.data_bytes()}, {0, s.numel()}, e.out);
  }
}

void host_partial_amax(const ShardEntry* entries, int count) {
  for (int t = 0; t < count; ++t) {
    const ShardEntry& e = entries[t];
    const Nvfp4Shape& s = e.shape;
    std::memset(e.amax, 0, static_cast<std::size_t>(s.amax_numel()) * sizeof(std::uint32_t));
    const MasterSource src{e.master, e.range.begin};
    std::uint32_t& tensor = e.amax[s.scale_numel()];
    for (std::int64_t b = e.touched.begin; b < e.touched.end; ++b) {
      e.amax[b] = block_amax(s, b, src, e.range.begin, e.range.end);
      tensor = std::max(tensor, e.amax[b]);
    }
  }
}

void host_quantize_shard(const ShardEntry* entries, int count) {
  for (int t = 0; t < count; ++t) {
    const ShardEntry& e = entries[t];
    write_scales(e.shape, e.amax, e.amax[e.shape.scale_numel()], e.out);
    write_bytes(e.shape, MasterSource{e.master, e.range.begin}, nvfp4_shard_bytes(e.range), e.range, e.out);
  }
}

void host_dequantize(const Nvfp4Shape& s, const std::uint8_t* data, const std::uint8_t* scale,
                     const float* decode_scale, float* out_f32, std::uint16_t* out_bf16) {
  for (std::int64_t i = 0; i < s.numel(); ++i) {
    const float v = decode_at(s, i, data, scale, *decode_scale);
    if (out_f32 != nullptr) out_f32[i] = v;
    if (out_bf16 != nullptr) out_bf16[i] = num::f32_to_bf16(v);
  }
}

}  // namespace shardopt::nvfp4
