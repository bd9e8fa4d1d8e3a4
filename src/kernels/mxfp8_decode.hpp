// mxfp8_decode.hpp - internal: the CUDA launch (mxfp8_decode.cu) and the host twin
// (mxfp8_decode.cpp) of the bf16-output MXFP8 decode (dequantize_mxfp8 with a
// std::uint16_t output). Arguments are validated by the entry point before they get here.
#pragma once

#include <cstdint>

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

}  // namespace shardopt::mxfp8
