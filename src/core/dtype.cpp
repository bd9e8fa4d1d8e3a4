#include "shardopt/dtype.hpp"

#include <string>

#include "shardopt/error.hpp"

namespace shardopt {

const char* to_string(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    case DType::e8m0: return "e8m0";
    case DType::u32: return "u32";
    case DType::u16: return "u16";
    case DType::q8_block: return "q8_block";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  const std::string n(name);
  if (n == "f32" || n == "fp32" || n == "float32") return DType::f32;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "f16" || n == "fp16" || n == "float16") return DType::f16;
  if (n == "e4m3") return DType::e4m3;
  if (n == "e5m2") return DType::e5m2;
  if (n == "e8m0") return DType::e8m0;
  if (n == "u32") return DType::u32;
  if (n == "u16") return DType::u16;
  if (n == "q8_block" || n == "q8") return DType::q8_block;
  detail::throw_error(ErrorCode::InvalidArgument,
                      "unknown dtype '" + n + "'; use one of f32, bf16, f16, e4m3, e5m2, e8m0, u32, u16, q8_block",
                      __FILE__, __LINE__);
}

}  // namespace shardopt
