// nvfp4_decode.cu - the NVFP4 decode: the batched bf16 decode (dequantize_nvfp4_batch),
// up to kNvfp4DecodeLaunch tensors of any shapes in one launch, and the one-tensor decode
// to f32 or bf16 (dequantize_nvfp4), the same kernel on a list of one. Bitwise the host
// twins (nvfp4_host.cpp's host_dequantize): every element goes through decode_element
// (nvfp4_math.cuh), and to bf16 through num::f32_to_bf16, as decode_at does.
//
// The list travels in the kernel's parameters (__grid_constant__: read in place, never
// copied), so a call needs no table in device memory and nothing built beforehand. Units
// are groups of 8 consecutive elements of one tensor (the tensors' groups form one
// sequence), one per thread in a grid-stride loop: a thread's groups only move forward,
// so it finds each group's tensor by stepping from the tensor of its previous group. A
// group of a row (cols % 8 == 0 and 4-byte aligned codes, the common case) is one
// 4-byte load of codes and, where the output is 16-byte aligned, one 16-byte store of
// bf16 (two of f32); other groups go element by element.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/check.hpp"
#include "kernels/common/kernel_files.hpp"
#include "kernels/mxfp8/mxfp8_walk.cuh"
#include "kernels/nvfp4/nvfp4_decode.hpp"
#include "kernels/nvfp4/nvfp4_grid.cuh"
#include "kernels/nvfp4/nvfp4_launch.hpp"
#include "kernels/nvfp4/nvfp4_math.cuh"

namespace shardopt::nvfp4 {
namespace {

constexpr int kGroup = static_cast<int>(kDecodeGroup);

// kF32: the list's one tensor to list.out_f32 (f32); otherwise each tensor to its bf16 out.
template <bool kF32>
__global__ void __launch_bounds__(kThreads) decode_list_kernel(const __grid_constant__ DecodeList list,
                                                               const std::int32_t* skip_flag) {
  if (skipped(skip_flag)) return;
  int e = 0;  // the tensor of this thread's current group
  for (std::int64_t q = first_unit(); q < list.groups; q += unit_stride()) {
    while (e + 1 < list.count && q >= list.entries[e + 1].first_group) ++e;
    const Nvfp4Decode& t = list.entries[e].tensor;
    const std::int64_t cols = t.shape.cols, n = t.shape.numel();
    const std::int64_t i0 = (q - list.entries[e].first_group) * kGroup;
    const float decode = *t.decode_scale;
    std::int64_t r = i0 / cols, c = i0 - r * cols;
    float v[kGroup];
    const bool whole = i0 + kGroup <= n && cols % kGroup == 0;  // 8 elements of one row
    if (whole && (reinterpret_cast<std::uintptr_t>(t.data + i0 / 2) & 3u) == 0) {
      const std::uint32_t codes = *reinterpret_cast<const std::uint32_t*>(mxfp8::in_global(t.data) + i0 / 2);
      const std::uint8_t scale = mxfp8::in_global(t.scale)[t.shape.block_index(r, c)];  // one block: c % 8 == 0
#pragma unroll
      for (int k = 0; k < kGroup; ++k)
        v[k] = decode_element(static_cast<std::uint8_t>(codes >> (4 * k)), scale, decode);
    } else {
      for (int k = 0; k < kGroup && i0 + k < n; ++k) {
        const std::int64_t i = i0 + k;
        const auto code = static_cast<std::uint8_t>(mxfp8::in_global(t.data)[i / 2] >> (4 * (i % 2)));
        v[k] = decode_element(code, mxfp8::in_global(t.scale)[t.shape.block_index(r, c)], decode);
        if (++c == cols) {
          c = 0;
          ++r;
        }
      }
    }
    if constexpr (kF32) {
      float* out = mxfp8::in_global(list.out_f32) + i0;
      if (whole && (reinterpret_cast<std::uintptr_t>(out) & 15u) == 0) {
        reinterpret_cast<float4*>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
      } else {
        for (int k = 0; k < kGroup && i0 + k < n; ++k) out[k] = v[k];
      }
    } else {
      std::uint16_t* out = mxfp8::in_global(t.out) + i0;
      if (whole && (reinterpret_cast<std::uintptr_t>(out) & 15u) == 0) {
        std::uint16_t b[kGroup];
#pragma unroll
        for (int k = 0; k < kGroup; ++k) b[k] = num::f32_to_bf16(v[k]);
        uint4 o;
        o.x = b[0] | (static_cast<std::uint32_t>(b[1]) << 16);
        o.y = b[2] | (static_cast<std::uint32_t>(b[3]) << 16);
        o.z = b[4] | (static_cast<std::uint32_t>(b[5]) << 16);
        o.w = b[6] | (static_cast<std::uint32_t>(b[7]) << 16);
        *reinterpret_cast<uint4*>(out) = o;
      } else {
        for (int k = 0; k < kGroup && i0 + k < n; ++k) out[k] = num::f32_to_bf16(v[k]);
      }
    }
  }
}

}  // namespace

void launch_dequantize_list(const DecodeList& list, const std::int32_t* skip_flag, Stream stream) {
  const auto grid = static_cast<unsigned>(std::min<std::int64_t>(grid_for(list.groups), mxfp8::resident_blocks()));
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (list.out_f32 != nullptr) {
    decode_list_kernel<true><<<grid, kThreads, 0, s>>>(list, skip_flag);
  } else {
    decode_list_kernel<false><<<grid, kThreads, 0, s>>>(list, skip_flag);
  }
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

// The one-tensor decode (nvfp4_launch.hpp): a list of one.
void launch_dequantize(const Nvfp4Shape& shape, const std::uint8_t* data, const std::uint8_t* scale,
                       const float* decode_scale, float* out_f32, std::uint16_t* out_bf16,
                       const std::int32_t* skip_flag, Stream stream) {
  DecodeList list;
  list.add(Nvfp4Decode{shape, data, scale, decode_scale, out_bf16});
  list.out_f32 = out_f32;
  launch_dequantize_list(list, skip_flag, stream);
}

}  // namespace shardopt::nvfp4

namespace shardopt::kernels {

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void nvfp4_decode_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(nvfp4::decode_list_kernel<false>));
  visit(kernel_symbol(nvfp4::decode_list_kernel<true>));
}

}  // namespace shardopt::kernels
