// convert.hpp - element-wise dtype conversion between float storage types (f32, bf16,
// f16), stream-ordered, on either backend. Used to seed the fp32 master from the param
// shard and to make the cast copies an external optimizer asks for.
#pragma once

#include <cstdint>

#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"

namespace shardopt::kernels {

/// dst[i] = convert(src[i]) for i < n; RNE rounding (numerics.hpp). Capturable.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Backend backend,
             Stream stream);

/// dst[i] = round(dst[i] + src[i]) for i < n, the sum in f32 (gradient accumulation).
void accumulate(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Backend backend,
                Stream stream);

/// master[i] = the fp32 master rebuilt from bf16 parameter bits params[i] and remainder
/// remainders[i] (numerics.hpp, "bf16 parameter + 16-bit remainder"), for i < n. Capturable.
void remainder_join(const std::uint16_t* params, const std::uint16_t* remainders, float* master, std::int64_t n,
                    Backend backend, Stream stream);
/// The reverse: params[i] and remainders[i] <- the split of master[i], for i < n.
void remainder_split(const float* master, std::uint16_t* params, std::uint16_t* remainders, std::int64_t n,
                     Backend backend, Stream stream);

void remainder_join_cuda(const std::uint16_t* params, const std::uint16_t* remainders, float* master, std::int64_t n,
                         Stream stream);
void remainder_split_cuda(const float* master, std::uint16_t* params, std::uint16_t* remainders, std::int64_t n,
                          Stream stream);

void accumulate_cuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Stream stream);
void convert_cuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Stream stream);

/// The element loops of the host twins.
void convert_host(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n);
void accumulate_host(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n);

}  // namespace shardopt::kernels
