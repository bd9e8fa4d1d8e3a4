// muon.cu - the CUDA kernels of the Muon step (kernels/muon/muon_launch.hpp): the pack, the
// copies and the apply over uploaded run tables (one block per tile), and the update's
// elementwise parts around the cuBLAS Newton-Schulz (muon_gemm.cpp): momentum with the
// per-tile sums of squares, the normalization into the GEMMs' input, the copy back. Every
// kernel reads its per-step values from StepScalars when it runs; the element math is
// muon_math.cuh's, shared with the host twins (-fmad=false: the same roundings).
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
  for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x) r.dst[i] = r.src[i];
}

__global__ void apply_kernel(const MuonApply* __restrict__ runs, const MuonTile* __restrict__ tiles,
                             const StepScalars* __restrict__ sc) {
  if (sc->found_inf != 0) return;
  const MuonTile t = tiles[blockIdx.x];
  const MuonApply r = runs[t.run];
  const MuonApplyFactors f = muon_apply_factors(sc->lr, r.lr_scale, r.weight_decay, r.lr_ratio);
  for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x) {
    const float m = muon_apply_element(r.master[i], r.u[i], f);
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
  double acc = 0.0;
  for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x) {
    float m = e.m[i];
    const float u = muon_momentum(m, e.g[i], e.w_buf, e.w_nes, e.nesterov != 0);
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

// x = g / max(||g||_F, eps) in x's dtype; the norm from the matrix's tiles' partial sums in order.
__global__ void normalize_kernel(const MuonElemMatrix* __restrict__ mats, const MuonTile* __restrict__ tiles, int t0,
                                 const double* __restrict__ partials, const StepScalars* __restrict__ sc) {
  if (sc->found_inf != 0) return;
  const MuonTile t = tiles[t0 + blockIdx.x];
  const MuonElemMatrix e = mats[t.run];
  __shared__ float norm;
  if (threadIdx.x == 0) {
    double sumsq = 0.0;
    for (int j = 0; j < e.tiles; ++j) sumsq += partials[e.tile0 + j];
    norm = fmaxf(static_cast<float>(sqrt(sumsq)), e.eps);
  }
  __syncthreads();
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
  for (std::int64_t i = t.begin + threadIdx.x; i < t.end; i += blockDim.x) e.g[i] = load_as_f32(x, xt, i);
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

void muon_normalize_cuda(const MuonElemMatrix* matrices, const MuonTile* tiles, int t0, int n,
                         const double* partials, const StepScalars* scalars, Stream stream) {
  if (n == 0) return;
  normalize_kernel<<<n, kThreads, 0, stream>>>(matrices, tiles, t0, partials, scalars);
  check_launch();
}

void muon_finish_cuda(const MuonElemMatrix* matrices, const MuonTile* tiles, int t0, int n, std::int64_t shift,
                      const StepScalars* scalars, Stream stream) {
  if (n == 0) return;
  finish_kernel<<<n, kThreads, 0, stream>>>(matrices, tiles, t0, shift, scalars);
  check_launch();
}

}  // namespace shardopt::kernels
