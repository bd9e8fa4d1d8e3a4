// test_mxfp8_convert.hpp - exhaustive device-vs-host checks of the MXFP8 element math
// (implemented in test_mxfp8_convert.cu, called from test_mxfp8_gpu.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace mxfp8_test {

/// The kernels' encode_pair + nan_blocks (hardware f32x2 -> e4m3x2 conversion) against
/// the host twin's encode_element (num::f32_to_e4m3) for every bf16 value and every
/// scale byte 0x00..0xFF (NaN values only with the NaN scale, the only way they occur),
/// plus random pairs with two different scales. Returns the number of mismatches and
/// describes the first ones in `report`.
std::int64_t encode_mismatches(std::string* report);

/// scale_from_magnitude, inverse_scale and decode_element on the device against the
/// host for every input. Returns the number of mismatches.
std::int64_t scale_and_decode_mismatches(std::string* report);

}  // namespace mxfp8_test
