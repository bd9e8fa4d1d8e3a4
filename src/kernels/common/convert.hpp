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

void accumulate_cuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Stream stream);
void convert_cuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Stream stream);

/// The element loops of the host twins.
void convert_host(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n);
void accumulate_host(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n);

}  // namespace shardopt::kernels
