// muon.cu - the CUDA kernels of the Muon step (kernels/muon/muon_launch.hpp): the pack, the
// copies and the apply over uploaded run tables (one block per tile), and the update's
// elementwise parts around the cuBLAS Newton-Schulz (muon_gemm.cpp): momentum with the
// per-tile sums of squares, the normalization into the GEMMs' input, the copy back. Every
// kernel reads its per-step values from StepScalars when it runs; the element math is
// muon_math.cuh's, shared with the host twins (-fmad=false: the same roundings).
#include <algorithm>
#include <cstdint>

#include "core/check.hpp"
#include "kernels/common/convert_math.cuh"
#include "kernels/muon/muon_launch.hpp"
#include "kernels/muon/muon_math.cuh"

namespace shardopt::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void pack_kernel(const MuonPack* __restrict__ runs, const MuonTile* __restrict__ tiles, DType grad_dtype,
                            const StepScalars* __restrict__ sc) {
  const MuonTile t = tiles[blockIdx.x];
  const MuonPack r = runs[t.run];
  const float inv = sc->inv_loss_scale, clip = sc->clip_coef;
  for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x)
    r.dst[i] = muon_scale_grad(load_as_f32(r.grad, grad_dtype, i), inv, clip);
}

__global__ void copy_kernel(const MuonCopy* __restrict__ runs, const MuonTile* __restrict__ tiles) {
  const MuonTile t = tiles[blockIdx.x];
  const MuonCopy r = runs[t.run];
  for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x)
    store_from_f32(r.dst, r.dst_dtype, i, load_as_f32(r.src, r.src_dtype, i));
}

__global__ void apply_kernel(const MuonApply* __restrict__ runs, const MuonTile* __restrict__ tiles,
                             const StepScalars* __restrict__ sc) {
  if (sc->found_inf != 0) return;
  const MuonTile t = tiles[blockIdx.x];
  const MuonApply r = runs[t.run];
  const MuonApplyFactors f = muon_apply_factors(sc->lr, r.lr_scale, r.weight_decay, r.lr_ratio);
  for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x) {
    const float m = muon_apply_element(r.master[i], load_as_f32(r.u, r.u_dtype, i), f);
    r.master[i] = m;
    if (r.param != nullptr) store_from_f32(r.param, r.param_dtype, i, m);
  }
}

// Momentum, Nesterov, the start value into g; the tile's sum of squares in double: each
// thread sums its elements in order, then a fixed tree over the block (deterministic).
__global__ void momentum_kernel(const MuonElemMatrix* __restrict__ mats, const MuonTile* __restrict__ tiles, int t0,
                                double* __restrict__ partials, const StepScalars* __restrict__ sc) {
  if (sc->found_inf != 0) return;  // a skipped step leaves the momentum as it was
  const MuonTile t = tiles[t0 + blockIdx.x];
  const MuonElemMatrix e = mats[t.run];
  const float inv = sc->inv_loss_scale, clip = sc->clip_coef;
  double acc = 0.0;
  for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x) {
    float m = e.m[i];
    // A fused pack: the raw gradient scaled as pack_kernel scales it.
    const float g = e.grad != nullptr ? muon_scale_grad(load_as_f32(e.grad, e.grad_dtype, i), inv, clip) : e.g[i];
    const float u = muon_momentum(m, g, e.w_buf, e.w_nes, e.nesterov != 0);
    e.m[i] = m;
    e.g[i] = u;
    acc += static_cast<double>(u) * u;
  }
  __shared__ double sh[kThreads];
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[t0 + blockIdx.x] = sh[0];
}

// x = g / norm in x's dtype (norm_kernel's max(||g||_F, eps)).
__global__ void normalize_kernel(const MuonElemMatrix* __restrict__ mats, const MuonTile* __restrict__ tiles, int t0,
                                 const float* __restrict__ norms, const StepScalars* __restrict__ sc) {
  if (sc->found_inf != 0) return;
  const MuonTile t = tiles[t0 + blockIdx.x];
  const MuonElemMatrix e = mats[t.run];
  const float norm = norms[t.run];
  const DType xt = e.x_f32 != 0 ? DType::f32 : DType::bf16;
  for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x) store_from_f32(e.x, xt, i, e.g[i] / norm);
}

// g = the orthogonalized update (x shifted by `shift` bytes: the buffer the iteration ended in).
__global__ void finish_kernel(const MuonElemMatrix* __restrict__ mats, const MuonTile* __restrict__ tiles, int t0,
                              std::int64_t shift, const StepScalars* __restrict__ sc) {
  if (sc->found_inf != 0) return;
  const MuonTile t = tiles[t0 + blockIdx.x];
  const MuonElemMatrix e = mats[t.run];
  const void* x = static_cast<const char*>(e.x) + shift;
  const DType xt = e.x_f32 != 0 ? DType::f32 : DType::bf16;
  const MuonApply& r = e.apply;
  if (r.master == nullptr) {
    for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x) e.g[i] = load_as_f32(x, xt, i);
    return;
  }
  // A fused apply: apply_kernel's element math on the same value it would read from g.
  const MuonApplyFactors f = muon_apply_factors(sc->lr, r.lr_scale, r.weight_decay, r.lr_ratio);
  for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x) {
    const float m = muon_apply_element(r.master[i], load_as_f32(x, xt, i), f);
    r.master[i] = m;
    if (r.param != nullptr) store_from_f32(r.param, r.param_dtype, i, m);
  }
}

// The lower part of symmetric n x n matrices (column-major, one per blockIdx.y, `stride`
// elements apart) from their upper part, after products computed by block columns of
// width `block`: for block column J = columns [c0, c1), rows [c1, n) are filled, element
// (r, c) from (c, r). Those regions are rectangles; blockIdx.x numbers their 64 x 64
// tiles, rectangle after rectangle. A tile goes through shared memory so that both the
// read (along a row of the source) and the write (along a column) are coalesced; V = 2
// moves two elements per access (n and stride even, so every pair is aligned).
constexpr int kMirrorTile = 64;

template <class T>
struct alignas(2 * sizeof(T)) Pair {
  T lo, hi;
};

template <class T, int V>
__global__ void mirror_kernel(T* __restrict__ a, int n, int block, long long stride) {
  int t = static_cast<int>(blockIdx.x), c0 = 0, c1 = 0, col_tiles = 1;
  for (;; c0 += block) {  // the rectangle of tile t
    c1 = min(n, c0 + block);
    if (c1 >= n) return;
    col_tiles = (c1 - c0 + kMirrorTile - 1) / kMirrorTile;
    const int tiles = (n - c1 + kMirrorTile - 1) / kMirrorTile * col_tiles;
    if (t < tiles) break;
    t -= tiles;
  }
  const int r0 = c1 + t / col_tiles * kMirrorTile, tc0 = c0 + t % col_tiles * kMirrorTile;
  T* m = a + blockIdx.y * stride;
  __shared__ T tile[kMirrorTile][kMirrorTile + 1];  // [r - r0][c - tc0]
  for (int i = threadIdx.y; i < kMirrorTile; i += blockDim.y) {
    const int r = r0 + i;
    if (r >= n) break;
    for (int j = threadIdx.x * V; j < kMirrorTile; j += 32 * V) {
      const int c = tc0 + j;
      const long long at = static_cast<long long>(r) * n + c;  // source (c, r)
      if (V == 2 && c + 1 < c1) {
        const Pair<T> p = *reinterpret_cast<const Pair<T>*>(m + at);
        tile[i][j] = p.lo;
        tile[i][j + 1] = p.hi;
      } else {
        for (int v = 0; v < V && c + v < c1; ++v) tile[i][j + v] = m[at + v];
      }
    }
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kMirrorTile; j += blockDim.y) {
    const int c = tc0 + j;
    if (c >= c1) break;
    for (int i = threadIdx.x * V; i < kMirrorTile; i += 32 * V) {
      const int r = r0 + i;
      const long long at = static_cast<long long>(c) * n + r;  // destination (r, c)
      if (V == 2 && r + 1 < n) {
        *reinterpret_cast<Pair<T>*>(m + at) = Pair<T>{tile[i][j], tile[i + 1][j]};
      } else {
        for (int v = 0; v < V && r + v < n; ++v) m[at + v] = tile[i + v][j];
      }
    }
  }
}

// The tiles of mirror_kernel's rectangles.
int mirror_tiles(int n, int block) {
  int tiles = 0;
  for (int c0 = 0; c0 < n; c0 += block) {
    const int c1 = std::min(n, c0 + block);
    if (c1 >= n) break;
    tiles += (n - c1 + kMirrorTile - 1) / kMirrorTile * ((c1 - c0 + kMirrorTile - 1) / kMirrorTile);
  }
  return tiles;
}

// Each matrix's norm max(sqrt(sum of its tiles' partial sums, in tile order), eps), one
// block per matrix: the partials go through shared memory a chunk at a time and thread 0
// adds them in order (the same sums as one thread reading them one by one).
__global__ void norm_kernel(const MuonElemMatrix* __restrict__ mats, int m0, const double* __restrict__ partials,
                            float* __restrict__ norms, const StepScalars* __restrict__ sc) {
  if (sc->found_inf != 0) return;
  const MuonElemMatrix e = mats[m0 + blockIdx.x];
  __shared__ double chunk[kThreads];
  double sumsq = 0.0;
  for (int j0 = 0; j0 < e.tiles; j0 += kThreads) {
    const int j = j0 + static_cast<int>(threadIdx.x);
    if (j < e.tiles) chunk[threadIdx.x] = partials[e.tile0 + j];
    __syncthreads();
    if (threadIdx.x == 0) {
      const int end = min(kThreads, e.tiles - j0);
      for (int i = 0; i < end; ++i) sumsq += chunk[i];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) norms[m0 + blockIdx.x] = fmaxf(static_cast<float>(sqrt(sumsq)), e.eps);
}

void check_launch() { SHARDOPT_CUDA_CHECK(cudaGetLastError()); }

// cudaFuncGetAttributes references a kernel, which makes the runtime load it now.
template <class Kernel>
void load_kernel(Kernel* kernel) {
  cudaFuncAttributes attributes{};
  SHARDOPT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
}

}  // namespace

void muon_load_cuda() {
  load_kernel(pack_kernel);
  load_kernel(copy_kernel);
  load_kernel(apply_kernel);
  load_kernel(momentum_kernel);
  load_kernel(normalize_kernel);
  load_kernel(finish_kernel);
  load_kernel(norm_kernel);
  load_kernel(mirror_kernel<std::uint16_t, 1>);
  load_kernel(mirror_kernel<std::uint16_t, 2>);
  load_kernel(mirror_kernel<std::uint32_t, 1>);
  load_kernel(mirror_kernel<std::uint32_t, 2>);
}

void muon_pack_cuda(const MuonRuns<MuonPack>& runs, DType grad_dtype, const StepScalars* scalars, Stream stream) {
  if (runs.tiles() == 0) return;
  pack_kernel<<<runs.tiles(), kThreads, 0, stream>>>(runs.device_runs(), runs.device_tiles(), grad_dtype, scalars);
  check_launch();
}

void muon_copy_cuda(const MuonRuns<MuonCopy>& runs, Stream stream) {
  if (runs.tiles() == 0) return;
  copy_kernel<<<runs.tiles(), kThreads, 0, stream>>>(runs.device_runs(), runs.device_tiles());
  check_launch();
}

void muon_apply_cuda(const MuonRuns<MuonApply>& runs, const StepScalars* scalars, Stream stream) {
  if (runs.tiles() == 0) return;
  apply_kernel<<<runs.tiles(), kThreads, 0, stream>>>(runs.device_runs(), runs.device_tiles(), scalars);
  check_launch();
}

void muon_momentum_cuda(const MuonElemMatrix* matrices, const MuonTile* tiles, int t0, int n, double* partials,
                        const StepScalars* scalars, Stream stream) {
  if (n == 0) return;
  momentum_kernel<<<n, kThreads, 0, stream>>>(matrices, tiles, t0, partials, scalars);
  check_launch();
}

void muon_normalize_cuda(const MuonElemMatrix* matrices, const MuonTile* tiles, int t0, int n, int m0, int count,
                         const double* partials, float* norms, const StepScalars* scalars, Stream stream) {
  if (n == 0) return;
  norm_kernel<<<count, kThreads, 0, stream>>>(matrices, m0, partials, norms, scalars);
  check_launch();
  normalize_kernel<<<n, kThreads, 0, stream>>>(matrices, tiles, t0, norms, scalars);
  check_launch();
}

void muon_finish_cuda(const MuonElemMatrix* matrices, const MuonTile* tiles, int t0, int n, std::int64_t shift,
                      const StepScalars* scalars, Stream stream) {
  if (n == 0) return;
  finish_kernel<<<n, kThreads, 0, stream>>>(matrices, tiles, t0, shift, scalars);
  check_launch();
}

void muon_mirror_cuda(void* a, int n, int block, long long stride, int count, bool f32, Stream stream) {
  if (n == 0 || count == 0 || block >= n) return;
  SHARDOPT_REQUIRE(block > 0 && count <= 65535, ErrorCode::InvalidArgument, "muon_mirror_cuda: bad block or count");
  const int tiles = mirror_tiles(n, block);
  if (tiles == 0) return;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(count));
  const dim3 threads(32, 8);
  const bool pairs = n % 2 == 0 && stride % 2 == 0 && block % 2 == 0;
  if (f32) {
    auto* m = static_cast<std::uint32_t*>(a);
    if (pairs) {
      mirror_kernel<std::uint32_t, 2><<<grid, threads, 0, stream>>>(m, n, block, stride);
    } else {
      mirror_kernel<std::uint32_t, 1><<<grid, threads, 0, stream>>>(m, n, block, stride);
    }
  } else {
    auto* m = static_cast<std::uint16_t*>(a);
    if (pairs) {
      mirror_kernel<std::uint16_t, 2><<<grid, threads, 0, stream>>>(m, n, block, stride);
    } else {
      mirror_kernel<std::uint16_t, 1><<<grid, threads, 0, stream>>>(m, n, block, stride);
    }
  }
  check_launch();
}

}  // namespace shardopt::kernels
