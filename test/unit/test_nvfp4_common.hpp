// test_nvfp4_common.hpp - NVFP4 test helpers shared by the host suite
// (test/unit/test_nvfp4*.cpp) and the GPU suite (test/gpu/test_nvfp4_gpu.cpp): running
// the calls on either backend into poisoned buffers, and the sharded protocol simulated
// over W ranks. Test data generators and upload/download are the MXFP8 suite's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/float_env.hpp"
#include "core/memory.hpp"
#include "shardopt/nvfp4.hpp"
#include "unit/test_mxfp8_common.hpp"
#include "unit/test_nvfp4_reference.hpp"

namespace nvfp4_test {

using mxfp8_test::bounds_str;
using mxfp8_test::download;
using mxfp8_test::first_diff;
using mxfp8_test::kPoison;
using mxfp8_test::upload;

inline constexpr std::uint32_t kPoisonWord = 0xA5A5A5A5u;

inline nvfp4_ref::Quantized reference(const shardopt::Nvfp4Shape& s, const std::vector<std::uint16_t>& x) {
  // The oracle's float code needs IEEE subnormals; a library the GPU suites load during
  // CUDA's start-up turns the CPU's FTZ / DAZ on for the thread that loads it.
  const shardopt::detail::IeeeSubnormals ieee;
  return nvfp4_ref::quantize(s.rows, s.cols, x);
}

/// The outputs of a shape in the memory of a backend, poisoned.
struct DevicePlanes {
  shardopt::DeviceBuffer data, scale, amax, decode_scale;
  DevicePlanes(shardopt::Backend b, const shardopt::Nvfp4Shape& s)
      : data(upload(b, std::vector<std::uint8_t>(static_cast<std::size_t>(s.data_bytes()), kPoison))),
        scale(upload(b, std::vector<std::uint8_t>(static_cast<std::size_t>(s.scale_numel()), kPoison))),
        amax(upload(b, std::vector<std::uint32_t>{kPoisonWord})),
        decode_scale(upload(b, std::vector<std::uint32_t>{kPoisonWord})) {}
  shardopt::Nvfp4Planes planes() const {
    return {data.as<std::uint8_t>(), scale.as<std::uint8_t>(), amax.as<float>(), decode_scale.as<float>()};
  }
  /// The planes of a rank's phase 2: data at the first byte of the range's span (inside
  /// this whole-plane buffer, so that a stray write shows), null for an empty range.
  shardopt::Nvfp4Planes shard_planes(shardopt::Range range) const {
    shardopt::Nvfp4Planes p = planes();
    p.data = range.size() > 0 ? p.data + shardopt::nvfp4_shard_bytes(range).begin : nullptr;
    return p;
  }
  nvfp4_ref::Quantized get(shardopt::Backend b, const shardopt::Nvfp4Shape& s) const {
    return {download<std::uint8_t>(b, data, static_cast<std::size_t>(s.data_bytes())),
            download<std::uint8_t>(b, scale, static_cast<std::size_t>(s.scale_numel())),
            download<std::uint32_t>(b, amax, 1)[0], download<std::uint32_t>(b, decode_scale, 1)[0]};
  }
};

/// Whole-tensor quantization on a backend.
inline nvfp4_ref::Quantized quantize_on(shardopt::Backend b, const shardopt::Nvfp4Shape& s,
                                        const std::vector<std::uint16_t>& x) {
  const shardopt::DeviceBuffer src = upload(b, x);
  DevicePlanes out(b, s);
  shardopt::quantize_nvfp4(s, src.as<std::uint16_t>(), out.planes(), nullptr, b, nullptr);
  return out.get(b, s);
}

/// Dequantize of q on a backend, to f32 bit patterns (bf16 = false) or to bf16 (true).
inline std::vector<std::uint32_t> dequantize_on(shardopt::Backend b, const shardopt::Nvfp4Shape& s,
                                                const nvfp4_ref::Quantized& q, bool bf16) {
  const shardopt::DeviceBuffer data = upload(b, q.data), scale = upload(b, q.scale);
  const shardopt::DeviceBuffer decode = upload(b, std::vector<std::uint32_t>{q.decode_scale});
  const auto n = static_cast<std::size_t>(s.numel());
  std::vector<std::uint32_t> out(n);
  if (bf16) {
    const shardopt::DeviceBuffer d(b, n * 2);
    shardopt::dequantize_nvfp4(s, data.as<std::uint8_t>(), scale.as<std::uint8_t>(), decode.as<float>(),
                               d.as<std::uint16_t>(), b, nullptr);
    const auto v = download<std::uint16_t>(b, d, n);
    for (std::size_t i = 0; i < n; ++i) out[i] = v[i];
  } else {
    const shardopt::DeviceBuffer d(b, n * 4);
    shardopt::dequantize_nvfp4(s, data.as<std::uint8_t>(), scale.as<std::uint8_t>(), decode.as<float>(),
                               d.as<float>(), b, nullptr);
    out = download<std::uint32_t>(b, d, n);
  }
  return out;
}

/// A quantized tensor in a backend's memory and a poisoned bf16 output, for the bf16
/// decode with a skip flag: run() enqueues it on `stream`, out() reads the output.
struct SkippableDecode {
  shardopt::Nvfp4Shape shape;
  shardopt::DeviceBuffer data, scale, decode, out_bf16;
  SkippableDecode(shardopt::Backend b, const shardopt::Nvfp4Shape& s, const nvfp4_ref::Quantized& q)
      : shape(s),
        data(upload(b, q.data)),
        scale(upload(b, q.scale)),
        decode(upload(b, std::vector<std::uint32_t>{q.decode_scale})),
        out_bf16(upload(b, std::vector<std::uint16_t>(static_cast<std::size_t>(s.numel()), 0xA5A5))) {}
  void run(shardopt::Backend b, const std::int32_t* skip_flag, shardopt::Stream stream) const {
    shardopt::dequantize_nvfp4(shape, data.as<std::uint8_t>(), scale.as<std::uint8_t>(), decode.as<float>(),
                               out_bf16.as<std::uint16_t>(), skip_flag, b, stream);
  }
  /// The output as dequantize_on's bf16 result (bit patterns widened).
  std::vector<std::uint32_t> out(shardopt::Backend b) const {
    const auto v = download<std::uint16_t>(b, out_bf16, static_cast<std::size_t>(shape.numel()));
    return std::vector<std::uint32_t>(v.begin(), v.end());
  }
  /// What nothing wrote.
  std::vector<std::uint32_t> untouched() const {
    return std::vector<std::uint32_t>(static_cast<std::size_t>(shape.numel()), 0xA5A5);
  }
};

/// Simulates W ranks (bounds: W + 1 increasing offsets from 0 to numel) running the
/// sharded protocol of shardopt/nvfp4.hpp on backend `b`: phase 1 on every rank into a
/// poisoned amax buffer, the u32 Max all-reduce, phase 2 on every rank into its own
/// poisoned planes, then the data bytes gathered with a bitwise OR of the ranks' byte
/// spans (each rank's data pointer at its span's first byte). Appends to `problems` a
/// byte a rank wrote outside its span, or scales / fp32 values that differ between ranks.
inline nvfp4_ref::Quantized simulate(shardopt::Backend b, const shardopt::Nvfp4Shape& s,
                                     const std::vector<float>& master, const std::vector<std::int64_t>& bounds,
                                     std::string* problems) {
  using namespace shardopt;
  const int world = static_cast<int>(bounds.size()) - 1;
  const auto na = static_cast<std::size_t>(s.amax_numel());
  const DeviceBuffer master_dev = upload(b, master);
  auto range_of = [&](int r) {
    return Range{bounds[static_cast<std::size_t>(r)], bounds[static_cast<std::size_t>(r) + 1]};
  };
  auto shard_of = [&](int r) { return master_dev.as<float>() + bounds[static_cast<std::size_t>(r)]; };

  std::vector<std::vector<std::uint32_t>> partial(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    const DeviceBuffer amax = upload(b, std::vector<std::uint32_t>(na, kPoisonWord));
    nvfp4_partial_amax(s, range_of(r), shard_of(r), amax.as<std::uint32_t>(), b, nullptr);
    partial[static_cast<std::size_t>(r)] = download<std::uint32_t>(b, amax, na);
  }
  const DeviceBuffer combined = upload(b, mxfp8_test::all_reduce_max(partial));

  nvfp4_ref::Quantized out;
  out.data.assign(static_cast<std::size_t>(s.data_bytes()), 0);
  for (int r = 0; r < world; ++r) {
    const Range range = range_of(r), span = nvfp4_shard_bytes(range);
    DevicePlanes p(b, s);
    quantize_nvfp4_shard(s, range, shard_of(r), combined.as<std::uint32_t>(), p.shard_planes(range), b, nullptr);
    const nvfp4_ref::Quantized q = p.get(b, s);
    if (r == 0) {
      out.scale = q.scale;
      out.amax = q.amax;
      out.decode_scale = q.decode_scale;
    } else if (q.scale != out.scale || q.amax != out.amax || q.decode_scale != out.decode_scale) {
      *problems += "rank " + std::to_string(r) + " computed other scales than rank 0; ";
    }
    for (std::size_t k = 0; k < q.data.size(); ++k) {
      const auto kk = static_cast<std::int64_t>(k);
      if (kk >= span.begin && kk < span.end) {
        out.data[k] |= q.data[k];
      } else if (q.data[k] != kPoison) {
        *problems += "rank " + std::to_string(r) + " wrote byte " + std::to_string(k) + " outside [" +
                     std::to_string(span.begin) + ", " + std::to_string(span.end) + "); ";
        break;
      }
    }
  }
  return out;
}

}  // namespace nvfp4_test
