// mxfp8_decode.hpp - internal: the CUDA launch (mxfp8_decode.cu) and the host twin
// (mxfp8_decode.cpp) of the bf16-output MXFP8 decode (dequantize_mxfp8 with a
// std::uint16_t output) and of its batched form (dequantize_mxfp8_batch). Arguments are
// validated by the entry points before they get here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/fast_divide.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/mxfp8.hpp"

namespace shardopt::mxfp8 {

/// Host twin: out[i] = decode_element_bf16(data[i], scale of i's block in `plane`).
void host_dequantize_bf16(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data,
                          const std::uint8_t* scale, std::uint16_t* out);

/// The same on `stream` (CUDA): 8 elements per thread (one 8-byte load, one 16-byte store)
/// where cols % 8 == 0 and the pointers allow it, one element per thread otherwise.
void launch_dequantize_bf16(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data,
                            const std::uint8_t* scale, std::uint16_t* out, Stream stream);

/// Host twin of the batch: each tensor's host_dequantize_bf16, in order.
void host_dequantize_bf16_list(const Mxfp8Decode* tensors, std::size_t count);

/// One tensor of a batched launch: the call's arguments, where its groups of 8 elements
/// start in the launch's sequence, and whether it takes the 8-element path (the
/// conditions of launch_dequantize_bf16's vector kernel), with its two dividers.
struct DecodeEntry {
  Mxfp8Decode tensor;
  std::int64_t first_group = 0;
  bool vector = false;
  FastDivider group_div;   ///< divides by cols / 8 (vector path)
  FastDivider member_div;  ///< divides by rows (vector path)
};

/// The entry of one tensor whose groups start at `first_group`; its groups: numel / 8
/// on the vector path, else ceil(numel / 8) groups of elements decoded one by one.
DecodeEntry make_decode_entry(const Mxfp8Decode& tensor, std::int64_t first_group);
std::int64_t decode_groups(const DecodeEntry& e);

/// The tensors of one launch, passed by value in the kernel's parameters (at most
/// kMxfp8DecodeLaunch: 32 x 88 bytes, within the 4 KB of a launch's parameters).
struct DecodeList {
  DecodeEntry entries[kMxfp8DecodeLaunch];
  int count = 0;
  std::int64_t groups = 0;  ///< the groups of all entries
};

/// The bf16 decode of every tensor of `list` in one launch.
void launch_dequantize_bf16_list(const DecodeList& list, Stream stream);

}  // namespace shardopt::mxfp8
