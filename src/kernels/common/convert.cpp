#include "kernels/common/convert.hpp"

#include "core/check.hpp"
#include "kernels/common/convert_math.cuh"
#include "shardopt/host_stream.hpp"
#include "shardopt/numerics.hpp"

namespace shardopt::kernels {

void convert_host(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) store_from_f32(dst, dst_dtype, i, load_as_f32(src, src_dtype, i));
}

void accumulate_host(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    store_from_f32(dst, dst_dtype, i, load_as_f32(dst, dst_dtype, i) + load_as_f32(src, src_dtype, i));
}

void accumulate(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Backend backend,
                Stream stream) {
  SHARDOPT_REQUIRE(is_float_storage(src_dtype) && is_float_storage(dst_dtype), ErrorCode::InvalidArgument,
                   std::string("accumulate: ") + to_string(src_dtype) + " into " + to_string(dst_dtype) +
                       " is not between f32, bf16 and f16");
  if (n <= 0) return;
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] { accumulate_host(src, src_dtype, dst, dst_dtype, n); });
    return;
  }
  accumulate_cuda(src, src_dtype, dst, dst_dtype, n, stream);
}

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, Backend backend,
             Stream stream) {
  SHARDOPT_REQUIRE(is_float_storage(src_dtype) && is_float_storage(dst_dtype), ErrorCode::InvalidArgument,
                   std::string("convert: ") + to_string(src_dtype) + " -> " + to_string(dst_dtype) +
                       " is not a conversion between f32, bf16 and f16");
  SHARDOPT_REQUIRE(n >= 0, ErrorCode::InvalidArgument, "convert: negative element count");
  if (n == 0) return;
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] { convert_host(src, src_dtype, dst, dst_dtype, n); });
    return;
  }
  convert_cuda(src, src_dtype, dst, dst_dtype, n, stream);
}

void remainder_join(const std::uint16_t* params, const std::uint16_t* remainders, float* master, std::int64_t n,
                    Backend backend, Stream stream) {
  SHARDOPT_REQUIRE(n >= 0, ErrorCode::InvalidArgument, "remainder_join: negative element count");
  if (n == 0) return;
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] {
      for (std::int64_t i = 0; i < n; ++i) master[i] = num::remainder_join(params[i], remainders[i]);
    });
    return;
  }
  remainder_join_cuda(params, remainders, master, n, stream);
}

void remainder_split(const float* master, std::uint16_t* params, std::uint16_t* remainders, std::int64_t n,
                     Backend backend, Stream stream) {
  SHARDOPT_REQUIRE(n >= 0, ErrorCode::InvalidArgument, "remainder_split: negative element count");
  if (n == 0) return;
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] {
      for (std::int64_t i = 0; i < n; ++i) {
        params[i] = num::remainder_split_param(master[i]);
        remainders[i] = num::remainder_split_low(master[i]);
      }
    });
    return;
  }
  remainder_split_cuda(master, params, remainders, n, stream);
}

}  // namespace shardopt::kernels

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launches refuse.
namespace shardopt::kernels {
void accumulate_cuda(const void*, DType, void*, DType, std::int64_t, Stream) { detail::no_cuda("dtype conversion"); }
void convert_cuda(const void*, DType, void*, DType, std::int64_t, Stream) { detail::no_cuda("dtype conversion"); }
void remainder_join_cuda(const std::uint16_t*, const std::uint16_t*, float*, std::int64_t, Stream) {
  detail::no_cuda("remainder join");
}
void remainder_split_cuda(const float*, std::uint16_t*, std::uint16_t*, std::int64_t, Stream) {
  detail::no_cuda("remainder split");
}
}  // namespace shardopt::kernels
#endif
