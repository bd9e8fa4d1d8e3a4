// convert_math.cuh - one element of a dtype conversion (host and device).
#pragma once

#include <cstdint>

#include "shardopt/numerics.hpp"

namespace shardopt::kernels {

SHARDOPT_HD float load_as_f32(const void* base, DType t, std::int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::bf16: return num::bf16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    case DType::f16: return num::f16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    default: return 0.0f;
  }
}

SHARDOPT_HD void store_from_f32(void* base, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = v; break;
    case DType::bf16: static_cast<std::uint16_t*>(base)[i] = num::f32_to_bf16(v); break;
    case DType::f16: static_cast<std::uint16_t*>(base)[i] = num::f32_to_f16(v); break;
    default: break;
  }
}

}  // namespace shardopt::kernels
