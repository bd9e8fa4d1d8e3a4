// test_nvfp4_decode_common.hpp - the batched bf16 NVFP4 decode (dequantize_nvfp4_batch)
// on either backend, shared by the host suite (test_nvfp4_decode.cpp) and the GPU suite
// (test/gpu/test_nvfp4_gpu.cpp): a list of quantized tensors in a backend's memory, each
// at its own (optionally odd) offset, decoded into poisoned outputs with margins, and
// the oracle's bf16 of each element.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/float_env.hpp"
#include "core/memory.hpp"
#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_common.hpp"

namespace nvfp4_test {

inline constexpr std::uint16_t kPoisonBf16 = 0xA5A5;
/// Poisoned elements before and after each output (a stray write shows there).
inline constexpr std::int64_t kMargin = 8;

/// The oracle's bf16 decode of q: bf16 (nearest even) of e2m1 * (float(scale) * S_dec),
/// the one NaN 0x7FC0 for a NaN element.
inline std::vector<std::uint16_t> reference_bf16(const shardopt::Nvfp4Shape& s, const nvfp4_ref::Quantized& q) {
  const shardopt::detail::IeeeSubnormals ieee;
  std::vector<std::uint16_t> out(static_cast<std::size_t>(s.numel()));
  for (std::int64_t i = 0; i < s.numel(); ++i) {
    const float v = nvfp4_ref::dequantize(q, s.cols, i);
    out[static_cast<std::size_t>(i)] = v != v ? std::uint16_t{0x7FC0} : mxfp8_ref::to_bf16(v);
  }
  return out;
}

/// Quantized tensors in a backend's memory and their poisoned bf16 outputs. Tensor t's
/// data and scales start `offset` bytes into their buffers and its output kMargin +
/// `offset` elements into its buffer (offset = t % 3 when `misalign`, else 0: unaligned
/// codes and outputs take the kernel's element-by-element path).
struct DecodeList {
  std::vector<shardopt::Nvfp4Shape> shapes;
  std::vector<shardopt::DeviceBuffer> data, scale, decode, out;
  std::vector<std::int64_t> offsets;
  std::vector<shardopt::Nvfp4Decode> list;

  DecodeList(shardopt::Backend b, const std::vector<shardopt::Nvfp4Shape>& s,
             const std::vector<nvfp4_ref::Quantized>& q, bool misalign)
      : shapes(s) {
    for (std::size_t t = 0; t < s.size(); ++t) {
      const std::int64_t off = misalign ? static_cast<std::int64_t>(t % 3) : 0;
      std::vector<std::uint8_t> d(static_cast<std::size_t>(off), kPoison), sc(static_cast<std::size_t>(off), kPoison);
      d.insert(d.end(), q[t].data.begin(), q[t].data.end());
      sc.insert(sc.end(), q[t].scale.begin(), q[t].scale.end());
      data.push_back(upload(b, d));
      scale.push_back(upload(b, sc));
      decode.push_back(upload(b, std::vector<std::uint32_t>{q[t].decode_scale}));
      out.push_back(upload(b, std::vector<std::uint16_t>(static_cast<std::size_t>(s[t].numel() + 2 * kMargin + off),
                                                         kPoisonBf16)));
      offsets.push_back(off);
      list.push_back({s[t], data.back().as<std::uint8_t>() + off, scale.back().as<std::uint8_t>() + off,
                      decode.back().as<float>(), out.back().as<std::uint16_t>() + kMargin + off});
    }
  }
  /// Tensor t's output buffer whole: margins and the decoded elements.
  std::vector<std::uint16_t> buffer(shardopt::Backend b, std::size_t t) const {
    return download<std::uint16_t>(b, out[t], static_cast<std::size_t>(shapes[t].numel() + 2 * kMargin + offsets[t]));
  }
  /// What the buffer must hold when tensor t decodes to `values` (or, empty, is untouched).
  std::vector<std::uint16_t> expected(std::size_t t, const std::vector<std::uint16_t>& values) const {
    std::vector<std::uint16_t> want(static_cast<std::size_t>(shapes[t].numel() + 2 * kMargin + offsets[t]), kPoisonBf16);
    for (std::size_t i = 0; i < values.size(); ++i) want[static_cast<std::size_t>(kMargin + offsets[t]) + i] = values[i];
    return want;
  }
};

/// The bf16 per-tensor decode of q on a backend (one dequantize_nvfp4 call).
inline std::vector<std::uint16_t> decode_one(shardopt::Backend b, const shardopt::Nvfp4Shape& s,
                                             const nvfp4_ref::Quantized& q) {
  const std::vector<std::uint32_t> wide = dequantize_on(b, s, q, /*bf16=*/true);
  return std::vector<std::uint16_t>(wide.begin(), wide.end());
}

}  // namespace nvfp4_test
