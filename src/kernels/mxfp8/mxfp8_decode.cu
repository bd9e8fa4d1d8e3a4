// mxfp8_decode.cu - the bf16-output MXFP8 decode: one plane's e4m3 bytes and e8m0 scales
// straight to bf16, bitwise the host twin (mxfp8_decode.cpp). The f32 decode is in
// mxfp8.cu; this one saves its f32 round trip (and the separate bf16 cast) for callers
// whose GEMMs read bf16.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/check.hpp"
#include "kernels/common/fast_divide.hpp"
#include "kernels/common/kernel_files.hpp"
#include "kernels/mxfp8/mxfp8_decode.cuh"
#include "kernels/mxfp8/mxfp8_decode.hpp"

namespace shardopt::mxfp8 {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements per thread on the vector path

// Byte i (0..7) of an 8-byte word held as two u32.
__device__ std::uint8_t byte_of(uint2 w, int i) {
  return static_cast<std::uint8_t>((i < 4 ? w.x : w.y) >> (8 * (i & 3)));
}

// Eight consecutive elements of one row per thread: cols % 8 == 0, the data 8-byte and
// the output 16-byte aligned, and (columnwise) the scales 8-byte aligned, so the 8
// columnwise scales of a group are one 8-byte load. Group q holds elements [8q, 8q + 8)
// of row q / (cols / 8), counted across members. Fewer than 2^31 groups and rows
// (make_decode_entry checks), so the divisions are 32-bit multiply-shifts.
template <bool Rowwise>
__device__ __forceinline__ void decode_group8(std::int64_t rows, std::int64_t cols, std::int64_t q,
                                              const FastDivider& group_div, const FastDivider& member_div,
                                              const std::uint8_t* __restrict__ data,
                                              const std::uint8_t* __restrict__ scale, std::uint16_t* __restrict__ out) {
  const std::int64_t per_row = cols / kVec;
  const std::int64_t row = group_div.divide(static_cast<std::uint32_t>(q));
  const std::int64_t c = (q - row * per_row) * kVec;
  const uint2 d = *reinterpret_cast<const uint2*>(data + q * kVec);
  std::uint16_t v[kVec];
  if constexpr (Rowwise) {
    const std::int64_t row_blocks = (cols + kBlock - 1) / kBlock;
    const std::uint8_t s = scale[row * row_blocks + c / kBlock];  // a group never straddles a block
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = decode_element_bf16(byte_of(d, i), s);
  } else {
    const std::int64_t col_blocks = (rows + kBlock - 1) / kBlock;
    const std::int64_t g = member_div.divide(static_cast<std::uint32_t>(row)), r = row - g * rows;
    const uint2 s = *reinterpret_cast<const uint2*>(scale + (g * col_blocks + r / kBlock) * cols + c);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = decode_element_bf16(byte_of(d, i), byte_of(s, i));
  }
  uint4 o;
  o.x = v[0] | (static_cast<std::uint32_t>(v[1]) << 16);
  o.y = v[2] | (static_cast<std::uint32_t>(v[3]) << 16);
  o.z = v[4] | (static_cast<std::uint32_t>(v[5]) << 16);
  o.w = v[6] | (static_cast<std::uint32_t>(v[7]) << 16);
  *reinterpret_cast<uint4*>(out + q * kVec) = o;
}

template <bool Rowwise>
__global__ void decode8_kernel(std::int64_t rows, std::int64_t cols, std::int64_t groups, FastDivider group_div,
                               FastDivider member_div, const std::uint8_t* __restrict__ data,
                               const std::uint8_t* __restrict__ scale, std::uint16_t* __restrict__ out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < groups; q += stride)
    decode_group8<Rowwise>(rows, cols, q, group_div, member_div, data, scale, out);
}

// One element per thread: any width, any alignment.
__global__ void decode1_kernel(PlaneIndex index, std::int64_t n, const std::uint8_t* __restrict__ data,
                               const std::uint8_t* __restrict__ scale, std::uint16_t* __restrict__ out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    out[e] = decode_element_bf16(data[e], scale[index.scale_of(e)]);
}

// A list of tensors (dequantize_mxfp8_batch), in the kernel's parameters: one group of 8
// elements per thread in a grid stride over the tensors' groups, a vector entry's groups
// as decode8_kernel's, the others' elements one by one as decode1_kernel's. A thread's
// groups only move forward, so it finds a group's tensor by stepping from the tensor of
// its previous group.
__global__ void __launch_bounds__(kThreads) decode_list_kernel(const __grid_constant__ DecodeList list) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  int e = 0;  // the tensor of this thread's current group
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < list.groups;
       q += stride) {
    while (e + 1 < list.count && q >= list.entries[e + 1].first_group) ++e;
    const DecodeEntry& en = list.entries[e];
    const Mxfp8Decode& t = en.tensor;
    const std::int64_t local = q - en.first_group;
    const bool rowwise = t.plane == Mxfp8Plane::Rowwise;
    if (en.vector) {
      if (rowwise) {
        decode_group8<true>(t.shape.rows, t.shape.cols, local, en.group_div, en.member_div, t.data, t.scale, t.out);
      } else {
        decode_group8<false>(t.shape.rows, t.shape.cols, local, en.group_div, en.member_div, t.data, t.scale, t.out);
      }
      continue;
    }
    const PlaneIndex index{t.shape.rows, t.shape.cols, rowwise};
    const std::int64_t n = t.shape.members * t.shape.rows * t.shape.cols;  // numel() is host code
    for (std::int64_t i = local * kVec; i < n && i < (local + 1) * kVec; ++i)
      t.out[i] = decode_element_bf16(t.data[i], t.scale[index.scale_of(i)]);
  }
}

int grid_for(std::int64_t items) {
  return static_cast<int>(std::clamp<std::int64_t>((items + kThreads - 1) / kThreads, 1, 65536));
}

}  // namespace

void launch_dequantize_bf16(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data,
                            const std::uint8_t* scale, std::uint16_t* out, Stream stream) {
  const auto st = reinterpret_cast<cudaStream_t>(stream);
  const DecodeEntry en = make_decode_entry(Mxfp8Decode{shape, plane, data, scale, out}, 0);
  const std::int64_t groups = decode_groups(en);
  if (en.vector && plane == Mxfp8Plane::Rowwise) {
    decode8_kernel<true><<<grid_for(groups), kThreads, 0, st>>>(shape.rows, shape.cols, groups, en.group_div,
                                                                en.member_div, data, scale, out);
  } else if (en.vector) {
    decode8_kernel<false><<<grid_for(groups), kThreads, 0, st>>>(shape.rows, shape.cols, groups, en.group_div,
                                                                 en.member_div, data, scale, out);
  } else {  // odd widths, unaligned pointers, and tensors of 2^34 elements or more
    decode1_kernel<<<grid_for(shape.numel()), kThreads, 0, st>>>(
        PlaneIndex{shape.rows, shape.cols, plane == Mxfp8Plane::Rowwise}, shape.numel(), data, scale, out);
  }
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_dequantize_bf16_list(const DecodeList& list, Stream stream) {
  decode_list_kernel<<<grid_for(list.groups), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(list);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::mxfp8

namespace shardopt::kernels {

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void mxfp8_decode_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(mxfp8::decode8_kernel<true>));
  visit(kernel_symbol(mxfp8::decode8_kernel<false>));
  visit(kernel_symbol(mxfp8::decode1_kernel));
  visit(kernel_symbol(mxfp8::decode_list_kernel));
}

}  // namespace shardopt::kernels
