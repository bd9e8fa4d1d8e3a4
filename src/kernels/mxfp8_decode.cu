// mxfp8_decode.cu - the bf16-output MXFP8 decode: one plane's e4m3 bytes and e8m0 scales
// straight to bf16, bitwise the host twin (mxfp8_decode.cpp). The f32 decode is in
// mxfp8.cu; this one saves its f32 round trip (and the separate bf16 cast) for callers
// whose GEMMs read bf16.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/check.hpp"
#include "kernels/fast_divide.hpp"
#include "kernels/kernel_files.hpp"
#include "kernels/mxfp8_decode.cuh"
#include "kernels/mxfp8_decode.hpp"

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
// of row q / (cols / 8), counted across members. Fewer than 2^31 groups and rows (the
// launch checks), so the divisions are 32-bit multiply-shifts.
template <bool Rowwise>
__global__ void decode8_kernel(std::int64_t rows, std::int64_t cols, std::int64_t groups, FastDivider group_div,
                               FastDivider member_div, const std::uint8_t* __restrict__ data,
                               const std::uint8_t* __restrict__ scale, std::uint16_t* __restrict__ out) {
  const std::int64_t per_row = cols / kVec;
  const std::int64_t row_blocks = (cols + kBlock - 1) / kBlock, col_blocks = (rows + kBlock - 1) / kBlock;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < groups; q += stride) {
    const std::int64_t row = group_div.divide(static_cast<std::uint32_t>(q));
    const std::int64_t c = (q - row * per_row) * kVec;
    const uint2 d = *reinterpret_cast<const uint2*>(data + q * kVec);
    std::uint16_t v[kVec];
    if constexpr (Rowwise) {
      const std::uint8_t s = scale[row * row_blocks + c / kBlock];  // a group never straddles a block
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = decode_element_bf16(byte_of(d, i), s);
    } else {
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
}

// One element per thread: any width, any alignment.
__global__ void decode1_kernel(PlaneIndex index, std::int64_t n, const std::uint8_t* __restrict__ data,
                               const std::uint8_t* __restrict__ scale, std::uint16_t* __restrict__ out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    out[e] = decode_element_bf16(data[e], scale[index.scale_of(e)]);
}

int grid_for(std::int64_t items) {
  return static_cast<int>(std::clamp<std::int64_t>((items + kThreads - 1) / kThreads, 1, 65536));
}

bool aligned(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

}  // namespace

void launch_dequantize_bf16(const Mxfp8Shape& shape, Mxfp8Plane plane, const std::uint8_t* data,
                            const std::uint8_t* scale, std::uint16_t* out, Stream stream) {
  const auto st = reinterpret_cast<cudaStream_t>(stream);
  const bool rowwise = plane == Mxfp8Plane::Rowwise;
  const std::int64_t groups = shape.numel() / kVec, lim = std::numeric_limits<std::int32_t>::max();
  if (shape.cols % kVec == 0 && aligned(data, 8) && aligned(out, 16) && (rowwise || aligned(scale, 8)) &&
      groups <= lim && shape.members * shape.rows <= lim) {
    const FastDivider per_row = make_divider(static_cast<std::uint32_t>(shape.cols / kVec)),
                      per_member = make_divider(static_cast<std::uint32_t>(shape.rows));
    if (rowwise) {
      decode8_kernel<true><<<grid_for(groups), kThreads, 0, st>>>(shape.rows, shape.cols, groups, per_row, per_member,
                                                                  data, scale, out);
    } else {
      decode8_kernel<false><<<grid_for(groups), kThreads, 0, st>>>(shape.rows, shape.cols, groups, per_row, per_member,
                                                                   data, scale, out);
    }
  } else {  // odd widths, unaligned pointers, and tensors of 2^34 elements or more
    decode1_kernel<<<grid_for(shape.numel()), kThreads, 0, st>>>(PlaneIndex{shape.rows, shape.cols, rowwise},
                                                                 shape.numel(), data, scale, out);
  }
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::mxfp8

namespace shardopt::kernels {

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void mxfp8_decode_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(mxfp8::decode8_kernel<true>));
  visit(kernel_symbol(mxfp8::decode8_kernel<false>));
  visit(kernel_symbol(mxfp8::decode1_kernel));
}

}  // namespace shardopt::kernels
