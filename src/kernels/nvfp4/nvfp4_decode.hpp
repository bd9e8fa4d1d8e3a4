// nvfp4_decode.hpp - internal: the launch (nvfp4_decode.cu) and the host twin
// (nvfp4_decode.cpp) of the batched bf16 NVFP4 decode (dequantize_nvfp4_batch), whose
// kernel also runs the one-tensor decode (dequantize_nvfp4, f32 or bf16: a list of one,
// launch_dequantize in nvfp4_launch.hpp). Arguments are validated by the entry points
// before they get here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardopt/backend.hpp"
#include "shardopt/nvfp4.hpp"

namespace shardopt::nvfp4 {

/// Elements of one unit of work of the batched decode (one thread's group: one 4-byte
/// word of codes, one 16-byte store of bf16 where aligned).
inline constexpr std::int64_t kDecodeGroup = 8;

/// One tensor of a launch: the call's arguments and where its groups start in the
/// launch's sequence of groups.
struct DecodeEntry {
  Nvfp4Decode tensor;
  std::int64_t first_group = 0;
};

/// The tensors of one launch, passed by value in the kernel's parameters (at most
/// kNvfp4DecodeLaunch of them: 64 x 56 bytes, within the 4 KB of a launch's parameters).
struct DecodeList {
  DecodeEntry entries[kNvfp4DecodeLaunch];
  int count = 0;
  std::int64_t groups = 0;  ///< the groups of all entries
  /// Set: the list's one tensor (count 1, its `out` null) is decoded to f32 here instead
  /// of to bf16 (dequantize_nvfp4's f32 form).
  float* out_f32 = nullptr;

  /// Appends `t` (the caller keeps count < kNvfp4DecodeLaunch).
  void add(const Nvfp4Decode& t) {
    entries[count++] = DecodeEntry{t, groups};
    groups += (t.shape.numel() + kDecodeGroup - 1) / kDecodeGroup;
  }
};

/// The decode of every tensor of `list` in one launch (bf16, or f32 into list.out_f32);
/// nothing is written when `skip_flag` (device int32, may be null) is nonzero.
void launch_dequantize_list(const DecodeList& list, const std::int32_t* skip_flag, Stream stream);

/// Host twin: each tensor's bf16 decode, in order (host_dequantize of nvfp4_host.cpp).
void host_dequantize_list(const Nvfp4Decode* tensors, std::size_t count);

}  // namespace shardopt::nvfp4
