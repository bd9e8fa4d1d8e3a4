// shardopt/param_format.hpp - how an optimizer stores the model parameters
// (DistributedAdamOptions::param_format, FsdpOptions::param_format).
#pragma once

namespace shardopt {

/// How the model parameters are stored (DistributedAdamOptions::param_format,
/// FsdpOptions::param_format).
enum class ParamFormat {
  /// Flat bf16 / f16 / f32 parameter buffers that Adam writes and the all-gather fills.
  Native,
  /// Every parameter of two or more dims (grouped ones: every member) is an MXFP8
  /// parameter (shardopt/mxfp8.hpp; docs/mxfp8.md): no bf16 copy exists; after Adam each
  /// rank quantizes its fp32 master shard (scheme A: partial scales, one e8m0 Max
  /// all-reduce, data bytes). DistributedAdam all-gathers the data bytes through the
  /// gradient buffer (free between the step and the next backward) into persistent MXFP8
  /// storage (mxfp8_param), then zeroes that gradient region; Fsdp keeps this rank's
  /// shard of both planes and gathers one plane per pass (Fsdp::wait_param). 1-D
  /// parameters (norm weights, biases) stay native.
  Mxfp8,
  /// As Mxfp8, in NVFP4 (shardopt/nvfp4.hpp; docs/nvfp4.md): each member is one NVFP4
  /// tensor (E2M1 data, 16 x 16 block scales, a global amax), rowwise only; the sharded
  /// quantize exchanges partial u32 block and tensor amaxes in one Max all-reduce, the
  /// all-gather moves half a byte per element through the gradient buffer, and the
  /// storage (nvfp4_param) holds numel / 2 bytes plus scales. 1-D parameters stay f32.
  /// DistributedAdam only.
  Nvfp4,
};

/// "Native", "Mxfp8", "Nvfp4" (errors and the options agreement name formats so).
constexpr const char* to_string(ParamFormat f) noexcept {
  switch (f) {
    case ParamFormat::Native: return "Native";
    case ParamFormat::Mxfp8: return "Mxfp8";
    case ParamFormat::Nvfp4: return "Nvfp4";
  }
  return "?";
}

}  // namespace shardopt
