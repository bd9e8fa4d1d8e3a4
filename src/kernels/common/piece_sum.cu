#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "core/check.hpp"
#include "kernels/adam/adam_vec.cuh"
#include "kernels/common/device_attribute.cuh"
#include "kernels/common/piece_sum.hpp"
#include "kernels/common/piece_sum_math.cuh"

namespace shardopt::kernels {
namespace {

constexpr int kSumThreads = 256;
// The vector kernel: each thread takes kSumVecs vectors of 16 bytes of every piece per
// step of its loop, and loads up to kSumBatch pieces before it adds them (with 2 pieces
// of bf16: 64 bytes in flight per thread).
constexpr int kSumVecs = 2;
constexpr int kSumBatch = 4;

// One thread per element (grid-stride); the dtypes are template arguments so that the
// element math's switches fold away. The fallback for pieces the vector kernel cannot
// take (a length or a base not aligned to its 16-byte loads). `own` (piece own_index, or
// null) may be `out`: a thread reads its element of every piece before it writes it, and
// no other thread touches that element (so no pointer is __restrict__: see below).
template <DType In, DType Out, bool Accumulate>
__global__ void __launch_bounds__(kSumThreads)
    piece_sum_kernel(const void* pieces, const void* own, int own_index, int n, std::int64_t count,
                     bool average, void* out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    piece_sum_store(pieces, own, own_index, In, n, count, average, out, Out, Accumulate, i);
}

// Elements of one 16-byte vector of a piece.
template <DType In>
constexpr int kVecElems = 16 / static_cast<int>(sizeof(storage_t<In>));

// Pieces whose length is a multiple of kVecElems and whose bases (`pieces`, `own`, and
// `out` for its vector) are aligned: a block's step covers kSumThreads * kSumVecs vectors,
// thread t taking vectors t, t + kSumThreads, ... (every load and store instruction of a
// warp covers 512 consecutive bytes of a piece). Per vector: the 16-byte loads of up to
// kSumBatch pieces are issued before their adds; the sum is piece_sum_at's, element by
// element (0.0f, then the pieces in rank order, then piece_sum_finish; the accumulate
// add of piece_sum_write), so the bits are those of the scalar kernel and of the host
// twin; the outputs leave in 8-, 16- or 32-byte vector stores. `own` may be `out`: a
// thread loads every piece (and, accumulating, `out`) of its vectors before it stores
// them, and no other thread touches them. No pointer is __restrict__: with `pieces`
// restricted, nvcc read `own` (selected with it) through the read-only cache too, which
// PTX allows only for data that no thread writes during the kernel.
template <DType In, DType Out, bool Accumulate>
__global__ void __launch_bounds__(kSumThreads)
    piece_sum_vec_kernel(const void* pieces, const void* own, int own_index, int n, std::int64_t count,
                         bool average, void* out) {
  constexpr int V = kVecElems<In>;
  constexpr std::int64_t kTile = static_cast<std::int64_t>(kSumThreads) * kSumVecs * V;
  const std::size_t piece_bytes = static_cast<std::size_t>(count) * sizeof(storage_t<In>);
  for (std::int64_t tile = static_cast<std::int64_t>(blockIdx.x) * kTile; tile < count;
       tile += static_cast<std::int64_t>(gridDim.x) * kTile) {
    std::int64_t at[kSumVecs];
    bool live[kSumVecs];
#pragma unroll
    for (int u = 0; u < kSumVecs; ++u) {
      at[u] = tile + static_cast<std::int64_t>(u * kSumThreads + static_cast<int>(threadIdx.x)) * V;
      live[u] = at[u] < count;
    }
    float acc[kSumVecs][V];
#pragma unroll
    for (int u = 0; u < kSumVecs; ++u)
#pragma unroll
      for (int k = 0; k < V; ++k) acc[u][k] = 0.0f;
    for (int r0 = 0; r0 < n; r0 += kSumBatch) {
      uint4 raw[kSumBatch][kSumVecs];  // widened only when added: 4 registers a vector
#pragma unroll
      for (int b = 0; b < kSumBatch; ++b) {
        const int r = r0 + b;
        const char* base = r == own_index ? static_cast<const char*>(own)
                                          : static_cast<const char*>(pieces) + static_cast<std::size_t>(r) * piece_bytes;
#pragma unroll
        for (int u = 0; u < kSumVecs; ++u)
          if (r < n && live[u]) raw[b][u] = *reinterpret_cast<const uint4*>(base + at[u] * sizeof(storage_t<In>));
      }
#pragma unroll
      for (int b = 0; b < kSumBatch; ++b) {
#pragma unroll
        for (int u = 0; u < kSumVecs; ++u) {
          if (r0 + b < n && live[u]) {
            storage_t<In> v[V];
            static_assert(sizeof v == sizeof(uint4));
            memcpy(v, &raw[b][u], sizeof v);
#pragma unroll
            for (int k = 0; k < V; ++k) acc[u][k] += num::Storage<In>::load(v[k]);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kSumVecs; ++u) {
      if (!live[u]) continue;
      float s[V];
      if constexpr (Accumulate) load_vec<Out, V, false>(out, at[u], s);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float sum = piece_sum_finish(acc[u][k], n, average);
        s[k] = Accumulate ? s[k] + sum : sum;
      }
      store_vec<Out, V>(out, at[u], s);
    }
  }
}

bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// What a kernel can have resident on the current device: SMs and blocks of kSumThreads
// per SM (the occupancy API), cached per kernel and device. Device queries only, no
// stream work: fine for a first launch inside a stream capture.
struct Residency {
  int sms = 1;
  int per_sm = 1;
};
Residency residency(const void* kernel) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, Residency> known;
  int device = 0;
  SHARDOPT_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find({kernel, device});
  if (it != known.end()) return it->second;
  Residency r;
  r.sms = device_attribute<cudaDevAttrMultiProcessorCount>();
  SHARDOPT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.per_sm, kernel, kSumThreads, 0));
  r.sms = std::max(1, r.sms);
  r.per_sm = std::max(1, r.per_sm);
  known.emplace(std::make_pair(kernel, device), r);
  return r;
}

// Blocks for a kernel whose blocks each take `per_block` of `items`: enough for the
// items, at most one resident wave (the kernels loop over the rest), with share_sms at
// most kShareSmsBlocksPerSm of them per SM.
template <typename Kernel>
unsigned grid_for(Kernel* kernel, std::int64_t items, std::int64_t per_block, bool share_sms) {
  const Residency r = residency(reinterpret_cast<const void*>(kernel));
  const int per_sm = share_sms ? std::min(r.per_sm, kShareSmsBlocksPerSm) : r.per_sm;
  const std::int64_t wave = static_cast<std::int64_t>(r.sms) * per_sm;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min((items + per_block - 1) / per_block, wave)));
}

template <typename Kernel>
void launch(Kernel* kernel, const PieceSum& a, int own_index, std::int64_t per_block, cudaStream_t s) {
  const unsigned grid = grid_for(kernel, a.count, per_block, a.share_sms);
  kernel<<<grid, kSumThreads, 0, s>>>(a.pieces, a.own, own_index, a.n, a.count, a.average, a.out);
}

template <DType In, DType Out>
void launch3(const PieceSum& a, cudaStream_t s) {
  constexpr int V = kVecElems<In>;
  const int own_index = a.own != nullptr ? a.own_index : -1;
  const bool vec = a.count % V == 0 && aligned(a.pieces, 16) && aligned(a.own, 16) &&
                   aligned(a.out, std::min<std::size_t>(16, V * sizeof(storage_t<Out>)));
  if (vec) {
    constexpr std::int64_t kTile = static_cast<std::int64_t>(kSumThreads) * kSumVecs * V;
    if (a.accumulate) {
      launch(piece_sum_vec_kernel<In, Out, true>, a, own_index, kTile, s);
    } else {
      launch(piece_sum_vec_kernel<In, Out, false>, a, own_index, kTile, s);
    }
  } else if (a.accumulate) {
    launch(piece_sum_kernel<In, Out, true>, a, own_index, kSumThreads, s);
  } else {
    launch(piece_sum_kernel<In, Out, false>, a, own_index, kSumThreads, s);
  }
}

template <DType In>
void launch2(const PieceSum& a, cudaStream_t s) {
  switch (a.out_dtype) {
    case DType::f32: launch3<In, DType::f32>(a, s); break;
    case DType::bf16: launch3<In, DType::bf16>(a, s); break;
    case DType::f16: launch3<In, DType::f16>(a, s); break;
    default: break;
  }
}

}  // namespace

void piece_sum_cuda(const PieceSum& a, Stream stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  switch (a.piece_dtype) {
    case DType::f32: launch2<DType::f32>(a, s); break;
    case DType::bf16: launch2<DType::bf16>(a, s); break;
    case DType::f16: launch2<DType::f16>(a, s); break;
    default: break;
  }
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::kernels

// Every kernel of this file, for load_step_kernels: each kernel launch3<In, Out> can pick.
#include "kernels/common/kernel_files.hpp"

namespace shardopt::kernels {

void piece_sum_kernels_cuda(const KernelVisitor& visit) {
  auto out = [&]<DType In, DType Out>() {
    visit(kernel_symbol(piece_sum_kernel<In, Out, true>));
    visit(kernel_symbol(piece_sum_kernel<In, Out, false>));
    visit(kernel_symbol(piece_sum_vec_kernel<In, Out, true>));
    visit(kernel_symbol(piece_sum_vec_kernel<In, Out, false>));
  };
  auto in = [&]<DType In>() {
    out.template operator()<In, DType::f32>();
    out.template operator()<In, DType::bf16>();
    out.template operator()<In, DType::f16>();
  };
  in.template operator()<DType::f32>();
  in.template operator()<DType::bf16>();
  in.template operator()<DType::f16>();
}

}  // namespace shardopt::kernels
