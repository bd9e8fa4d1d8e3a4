// cuda_ops.cu - the model's operations on a CUDA device: bf16 GEMMs with fp32 accumulation
// through cuBLAS (cublasGemmEx, cublasGemmStridedBatchedEx for the experts' forward and
// data gradients, cublasGemmBatchedEx with device pointer arrays for the experts' weight
// gradients), and the elementwise, row and MoE kernels.
//
// Capture rules kept here: every launch has fixed shapes; per-step values (step counter,
// microbatch index and flags) are read by the kernels from device memory; cuBLAS runs on
// a workspace of our own (cublasSetWorkspace, rebound after every cublasSetStream), so
// nothing allocates inside a captured graph and graph replay picks the same kernels as
// eager execution. Reductions use fixed launch shapes and fixed orders (no atomics on
// floats), so a replay computes bitwise what an eager run computes.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include <shardopt/error.hpp>

#include "op_math.hpp"
#include "ops.hpp"

namespace trainer {
namespace {

void cuda_check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    throw shardopt::Error(shardopt::ErrorCode::Cuda, std::string(call) + " failed: " + cudaGetErrorString(e) + " (at " +
                                                         file + ":" + std::to_string(line) + ")");
}
void cublas_check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw shardopt::Error(shardopt::ErrorCode::Cuda, std::string(call) + " failed: cuBLAS status " +
                                                         std::to_string(static_cast<int>(s)) + " (at " + file + ":" +
                                                         std::to_string(line) + ")");
}
#define TRAINER_CUDA(call) cuda_check((call), #call, __FILE__, __LINE__)
#define TRAINER_CUBLAS(call) cublas_check((call), #call, __FILE__, __LINE__)
#define TRAINER_LAUNCHED() cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

using i64 = std::int64_t;
using bf16 = std::uint16_t;

constexpr int kThreads = 256;
constexpr int kSumsqBlocks = 256;    // partial sums of sumsq

inline unsigned blocks_for(i64 n, int threads = kThreads) {
  const i64 b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

inline cudaStream_t cu(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

// ---------------------------------------------------------------- storage

__device__ __forceinline__ float ld(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, i64 i) { return math::from_bf16(p[i]); }
__device__ __forceinline__ void st(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, i64 i, float v) { p[i] = math::to_bf16(v); }

/// Sum over the block in a fixed order (shuffle tree in each warp, then warp 0 over the
/// warp sums). Every thread gets the result. `shared` holds 32 values.
template <class T>
__device__ T block_sum(T v, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  // Only warp 0 reads the warp sums, and it has read them all (__syncwarp) before its
  // lane 0 overwrites shared[0]: no other warp reads a slot that is being written.
  const int warps = (blockDim.x + 31) / 32;
  if (warp == 0) {
    T total = lane < warps ? shared[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    __syncwarp();
    if (lane == 0) shared[0] = total;
  }
  __syncthreads();
  const T total = shared[0];
  __syncthreads();
  return total;
}

__device__ float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  if (warp == 0) {  // as in block_sum
    float m = lane < warps ? shared[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __syncwarp();
    if (lane == 0) shared[0] = m;
  }
  __syncthreads();
  const float m = shared[0];
  __syncthreads();
  return m;
}

// ---------------------------------------------------------------- kernels

template <class P>
__global__ void k_init_param(P* out, InitArgs a, i64 n) {
  for (i64 e = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; e < n; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 q = a.offset + e;
    const float v = a.is_constant ? a.constant : math::init_uniform(a.keys[q / a.member_numel], q % a.member_numel, a.bound);
    st(out, e, v);
  }
}

__global__ void k_make_batch(BatchArgs a, std::int32_t* tokens, std::int32_t* targets) {
  const i64 step = a.scalars != nullptr ? a.scalars->step : a.step;
  const std::int32_t mb = a.microbatch != nullptr ? a.microbatch->index : 0;
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < a.tokens; t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const std::int32_t x = math::token_at(a.seed, a.rank, step, mb, t, a.vocab);
    tokens[t] = x;
    targets[t] = math::target_of(x, a.rule_a, a.rule_c, a.vocab);
  }
}

__global__ void k_embed_forward(const bf16* table, const std::int32_t* tokens, float* out, i64 T, i64 H) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < T * H; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 t = i / H, h = i % H;
    out[i] = math::from_bf16(table[static_cast<i64>(tokens[t]) * H + h]);
  }
}

// links[t] = next position with the same token (T if none), plus kNotFirst when an earlier
// position has it. Tiles of tokens in shared memory; O(T^2) compares, no atomics.
constexpr std::int32_t kNotFirst = 0x40000000;
__global__ void k_embed_links(const std::int32_t* tokens, std::int32_t* links, i64 T) {
  __shared__ std::int32_t tile[kThreads];
  const i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x;
  const std::int32_t mine = t < T ? tokens[t] : -1;
  i64 next = T;
  bool first = true;
  for (i64 base = 0; base < T; base += kThreads) {
    const i64 u = base + threadIdx.x;
    tile[threadIdx.x] = u < T ? tokens[u] : -2;
    __syncthreads();
    for (int k = 0; k < kThreads && base + k < T; ++k) {
      const i64 u2 = base + k;
      if (tile[k] != mine) continue;
      if (u2 < t) first = false;
      if (u2 > t && u2 < next) next = u2;
    }
    __syncthreads();
  }
  if (t < T) links[t] = static_cast<std::int32_t>(next) | (first ? 0 : kNotFirst);
}

template <class D>
__global__ void k_embed_backward(const float* dout, const std::int32_t* tokens, const std::int32_t* links, D* dtable,
                                 i64 T, i64 H) {
  for (i64 t = blockIdx.y; t < T; t += gridDim.y) {
    if (links[t] & kNotFirst) continue;
    for (i64 h = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; h < H; h += static_cast<i64>(gridDim.x) * blockDim.x) {
      float s = 0.0f;
      for (i64 u = t; u < T; u = links[u] & ~kNotFirst) s += dout[u * H + h];
      const i64 at = static_cast<i64>(tokens[t]) * H + h;
      st(dtable, at, ld(dtable, at) + s);
    }
  }
}

template <class W>
__global__ void k_rmsnorm_forward(const float* x, const W* w, bf16* y, float* rstd, i64 T, i64 H, float eps) {
  __shared__ float shared[32];
  for (i64 t = blockIdx.x; t < T; t += gridDim.x) {
    const float* row = x + t * H;
    float ss = 0.0f;
    for (i64 h = threadIdx.x; h < H; h += blockDim.x) ss += row[h] * row[h];
    ss = block_sum(ss, shared);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
    if (threadIdx.x == 0) rstd[t] = r;
    for (i64 h = threadIdx.x; h < H; h += blockDim.x) y[t * H + h] = math::to_bf16(row[h] * r * ld(w, h));
  }
}

template <class W>
__global__ void k_rmsnorm_backward_dx(const float* dy, const float* x, const W* w, const float* rstd, float* dx,
                                      i64 T, i64 H) {
  __shared__ float shared[32];
  for (i64 t = blockIdx.x; t < T; t += gridDim.x) {
    const float r = rstd[t];
    float dot = 0.0f;
    for (i64 h = threadIdx.x; h < H; h += blockDim.x) dot += dy[t * H + h] * ld(w, h) * x[t * H + h];
    dot = block_sum(dot, shared);
    const float c = dot * r * r * r / static_cast<float>(H);
    for (i64 h = threadIdx.x; h < H; h += blockDim.x)
      dx[t * H + h] += r * (dy[t * H + h] * ld(w, h)) - x[t * H + h] * c;
  }
}

// partial[c * H + h] = sum over rows t of chunk c of dy * x * rstd (fixed row order).
__global__ void k_rmsnorm_backward_partial(const float* dy, const float* x, const float* rstd, float* partial, i64 T,
                                           i64 H, i64 chunks) {
  const i64 rows = (T + chunks - 1) / chunks;
  for (i64 c = blockIdx.y; c < chunks; c += gridDim.y)
    for (i64 h = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; h < H; h += static_cast<i64>(gridDim.x) * blockDim.x) {
      float s = 0.0f;
      const i64 end = (c + 1) * rows < T ? (c + 1) * rows : T;
      for (i64 t = c * rows; t < end; ++t) s += dy[t * H + h] * x[t * H + h] * rstd[t];
      partial[c * H + h] = s;
    }
}

template <class D>
__global__ void k_rmsnorm_backward_dw(const float* partial, D* dw, i64 H, i64 chunks) {
  for (i64 h = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; h < H; h += static_cast<i64>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (i64 c = 0; c < chunks; ++c) s += partial[c * H + h];
    st(dw, h, ld(dw, h) + s);
  }
}

__global__ void k_silu_forward(const float* u, bf16* a, i64 n) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    a[i] = math::to_bf16(math::silu(u[i]));
}

__global__ void k_silu_backward(const float* da, const float* u, bf16* du, i64 n) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    du[i] = math::to_bf16(da[i] * math::silu_grad(u[i]));
}

__global__ void k_to_low(const float* x, bf16* y, i64 n) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    y[i] = math::to_bf16(x[i]);
}

__global__ void k_router_forward(const float* logits, float* probs, std::int32_t* expert, float* gate, i64 T, int G) {
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < T; t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const float* l = logits + t * G;
    int best = 0;
    for (int j = 1; j < G; ++j)
      if (l[j] > l[best]) best = j;
    float s = 0.0f;
    for (int j = 0; j < G; ++j) s += expf(l[j] - l[best]);
    for (int j = 0; j < G; ++j) probs[t * G + j] = expf(l[j] - l[best]) / s;
    expert[t] = best;
    gate[t] = probs[t * G + best];
  }
}

__global__ void k_router_backward(const float* dgate, const float* probs, const std::int32_t* expert, bf16* dlogits,
                                  i64 T, int G) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < T * G; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 t = i / G;
    const int j = static_cast<int>(i % G);
    const float g = probs[t * G + expert[t]];
    const float onehot = j == expert[t] ? 1.0f : 0.0f;
    dlogits[i] = math::to_bf16(dgate[t] * g * (onehot - probs[i]));
  }
}

// One block per expert: slots in token order (a block-wide prefix count per tile of
// tokens), then the unused slots marked as padding.
constexpr int kDispatchThreads = 1024;
__global__ void k_dispatch_assign(const std::int32_t* expert, std::int32_t* slot, std::int32_t* row_token, i64 T,
                                  i64 C) {
  __shared__ std::int32_t warp_count[32];
  __shared__ i64 total;
  const int g = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  for (i64 base = 0; base < T; base += kDispatchThreads) {
    const i64 t = base + threadIdx.x;
    const bool mine = t < T && expert[t] == g;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    i64 before = total;
    for (int w = 0; w < warp; ++w) before += warp_count[w];
    before += __popc(ballot & ((1u << lane) - 1u));
    if (mine) {
      slot[t] = before < C ? static_cast<std::int32_t>(before) : -1;
      if (before < C) row_token[g * C + before] = static_cast<std::int32_t>(t);
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int w = 0; w < kDispatchThreads / 32; ++w) total += warp_count[w];
    __syncthreads();
  }
  const i64 used = total < C ? total : C;
  for (i64 s = used + threadIdx.x; s < C; s += blockDim.x) row_token[g * C + s] = -1;
}

__global__ void k_dispatch_gather(const bf16* x, const std::int32_t* row_token, bf16* xe, i64 rows, i64 H) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < rows * H; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const std::int32_t t = row_token[i / H];
    xe[i] = t >= 0 ? x[static_cast<i64>(t) * H + i % H] : bf16(0);
  }
}

__global__ void k_combine_forward(const float* ye, const std::int32_t* expert, const std::int32_t* slot,
                                  const float* gate, float* h, i64 T, i64 H, i64 C) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < T * H; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 t = i / H;
    if (slot[t] < 0) continue;
    h[i] += gate[t] * ye[(expert[t] * C + slot[t]) * H + i % H];
  }
}

__global__ void k_combine_backward_rows(const float* dh, const float* gate, const std::int32_t* row_token, bf16* dye,
                                        i64 rows, i64 H) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < rows * H; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const std::int32_t t = row_token[i / H];
    dye[i] = math::to_bf16(t >= 0 ? gate[t] * dh[static_cast<i64>(t) * H + i % H] : 0.0f);
  }
}

__global__ void k_combine_backward_gate(const float* dh, const float* ye, const std::int32_t* expert,
                                        const std::int32_t* slot, float* dgate, i64 T, i64 H, i64 C) {
  __shared__ float shared[32];
  for (i64 t = blockIdx.x; t < T; t += gridDim.x) {
    float s = 0.0f;
    if (slot[t] >= 0) {
      const float* y = ye + (expert[t] * C + slot[t]) * H;
      for (i64 k = threadIdx.x; k < H; k += blockDim.x) s += dh[t * H + k] * y[k];
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) dgate[t] = s;
  }
}

__global__ void k_dispatch_backward(const float* dxe, const std::int32_t* expert, const std::int32_t* slot, float* dx,
                                    i64 T, i64 H, i64 C) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < T * H; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 t = i / H;
    dx[i] = slot[t] >= 0 ? dxe[(expert[t] * C + slot[t]) * H + i % H] : 0.0f;
  }
}

// ---------------------------------------------------------------- GPT kernels

__global__ void k_text_batch(TextBatchArgs a, std::int32_t* tokens, std::int32_t* targets) {
  const i64 step = a.scalars != nullptr ? a.scalars->step : a.step;
  const std::int32_t mb = a.microbatch != nullptr ? a.microbatch->index : 0;
  const i64 n = a.seqs * a.context;
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < n; t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 j = t / a.context, i = t % a.context;
    const i64 start = math::window_start(a.seed, a.rank, step, mb, j, a.data_tokens - a.context);
    tokens[t] = a.data[start + i];
    targets[t] = a.data[start + i + 1];
  }
}

template <class P>
__global__ void k_pos_embed_forward(const P* table, float* h, i64 T, i64 S, i64 H) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < T * H; i += static_cast<i64>(gridDim.x) * blockDim.x)
    h[i] += ld(table, ((i / H) % S) * H + i % H);
}

// One thread per table element sums its column over the sequences in order (deterministic).
template <class D>
__global__ void k_pos_embed_backward(const float* dh, D* dtable, i64 T, i64 S, i64 H) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < S * H; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 p = i / H, k = i % H;
    float s = 0.0f;
    for (i64 t = p; t < T; t += S) s += dh[t * H + k];
    st(dtable, i, ld(dtable, i) + s);
  }
}

__global__ void k_gelu_forward(const float* u, bf16* a, i64 n) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    a[i] = math::to_bf16(math::gelu(u[i]));
}

__global__ void k_gelu_backward(const float* da, const float* u, bf16* du, i64 n) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    du[i] = math::to_bf16(da[i] * math::gelu_grad(u[i]));
}

// One block per score row (row i of its S x S block attends to j <= i).
__global__ void k_causal_softmax_forward(const float* x, float* p, bf16* pl, i64 rows, i64 S) {
  __shared__ float shared[32];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const i64 i = r % S;
    const float* xr = x + r * S;
    float m = -INFINITY;
    for (i64 j = threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m, shared);
    float s = 0.0f;
    for (i64 j = threadIdx.x; j <= i; j += blockDim.x) s += expf(xr[j] - m);
    s = block_sum(s, shared);
    for (i64 j = threadIdx.x; j < S; j += blockDim.x) {
      const float v = j <= i ? expf(xr[j] - m) / s : 0.0f;
      p[r * S + j] = v;
      pl[r * S + j] = math::to_bf16(v);
    }
  }
}

__global__ void k_causal_softmax_backward(const float* dp, const float* p, bf16* ds, i64 rows, i64 S) {
  __shared__ float shared[32];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const i64 i = r % S;
    float dot = 0.0f;
    for (i64 j = threadIdx.x; j <= i; j += blockDim.x) dot += p[r * S + j] * dp[r * S + j];
    dot = block_sum(dot, shared);
    for (i64 j = threadIdx.x; j < S; j += blockDim.x)
      ds[r * S + j] = math::to_bf16(j <= i ? p[r * S + j] * (dp[r * S + j] - dot) : 0.0f);
  }
}

constexpr int kLossThreads = 512;
__global__ void k_cross_entropy(const float* logits, const std::int32_t* targets, bf16* dlogits, float* token_loss,
                                float grad_scale, i64 T, i64 V) {
  __shared__ float shared[32];
  for (i64 t = blockIdx.x; t < T; t += gridDim.x) {
    const float* l = logits + t * V;
    float m = -INFINITY;
    for (i64 v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, l[v]);
    m = block_max(m, shared);
    float s = 0.0f;
    for (i64 v = threadIdx.x; v < V; v += blockDim.x) s += expf(l[v] - m);
    s = block_sum(s, shared);
    const std::int32_t y = targets[t];
    if (threadIdx.x == 0) token_loss[t] = m + logf(s) - l[y];
    for (i64 v = threadIdx.x; v < V; v += blockDim.x) {
      const float p = expf(l[v] - m) / s;
      dlogits[t * V + v] = math::to_bf16(grad_scale * (p - (v == y ? 1.0f : 0.0f)));
    }
  }
}

__global__ void k_loss_reduce(const float* token_loss, float* loss_slots, const shardopt::MicrobatchState* mb, i64 T) {
  __shared__ float shared[32];
  float s = 0.0f;
  for (i64 t = threadIdx.x; t < T; t += blockDim.x) s += token_loss[t];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) loss_slots[mb != nullptr ? mb->index : 0] = s / static_cast<float>(T);
}

struct PackArgs {
  const void* src[kMaxExperts];
  int count = 0;
  i64 numel = 0;  // of each source (bf16 elements)
};

// dst[i] = concatenation of the sources, unless the device says the weights are current.
__global__ void k_pack(PackArgs a, bf16* dst, const shardopt::MicrobatchState* skip) {
  if (skip != nullptr && skip->skip_weight_update != 0) return;
  const bool vec = a.numel % 8 == 0;
  const i64 per = vec ? a.numel / 8 : a.numel;
  const i64 total = per * a.count;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < total; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 g = i / per, j = i % per;
    if (vec)
      reinterpret_cast<uint4*>(dst + g * a.numel)[j] = reinterpret_cast<const uint4*>(a.src[g])[j];
    else
      dst[g * a.numel + j] = static_cast<const bf16*>(a.src[g])[j];
  }
}

struct DequantArgs {
  const std::uint8_t* data[kMaxExperts];
  const std::uint8_t* scale[kMaxExperts];
  const shardopt::Mxfp8Member* members[kMaxExperts];  // device tables, or null (contiguous)
  i64 groups[kMaxExperts];      // G of each source
  i64 rows[kMaxExperts];
  i64 cols[kMaxExperts];
  i64 out_offset[kMaxExperts];  // first output element of each source
  bool colwise[kMaxExperts];    // the source is a columnwise plane (FSDP backward)
  int count = 0;
};

// dst = bf16 of the sources' planes (blockIdx.y = source), unless the device says the
// weights are current. A thread decodes a run of 8 elements of one row when the row
// length is a multiple of 8 and the plane is rowwise (one scale byte: a run never crosses
// a 32-element block; an 8-byte load and a 16-byte store where aligned), else one element
// (a columnwise plane has a scale byte per column of a 32-row block).
__global__ void k_dequantize_mxfp8(DequantArgs a, bf16* dst, const shardopt::MicrobatchState* skip) {
  if (skip != nullptr && skip->skip_weight_update != 0) return;
  const int s = blockIdx.y;
  const i64 rows = a.rows[s], cols = a.cols[s], member_numel = rows * cols;
  const i64 row_blocks = (cols + shardopt::kMxfp8Block - 1) / shardopt::kMxfp8Block;
  const shardopt::Mxfp8Member* table = a.members[s];
  const std::uint8_t* data = a.data[s];
  const std::uint8_t* scale = a.scale[s];
  const bool col = a.colwise[s];
  const i64 col_blocks = (rows + shardopt::kMxfp8Block - 1) / shardopt::kMxfp8Block;
  const int run = !col && cols % 8 == 0 ? 8 : 1;
  const i64 runs = a.groups[s] * member_numel / run;
  bf16* out = dst + a.out_offset[s];
  for (i64 k = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; k < runs; k += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 e = k * run;  // element of this source's output: member g, row r, column c
    const i64 g = e / member_numel, rem = e % member_numel, r = rem / cols, c = rem % cols;
    const i64 data_at = table != nullptr ? table[g].element_offset : g * member_numel;
    const i64 scale_at = table != nullptr ? (col ? table[g].scale_col_offset : table[g].scale_row_offset)
                                          : (col ? g * col_blocks * cols : g * rows * row_blocks);
    const std::uint8_t* in = data + data_at + r * cols + c;
    const std::uint8_t sc = scale[scale_at + (col ? (r / shardopt::kMxfp8Block) * cols + c
                                                  : r * row_blocks + c / shardopt::kMxfp8Block)];
    if (run == 1) {
      out[e] = math::mxfp8_to_bf16(in[0], sc);
      continue;
    }
    std::uint8_t b[8];
    if (reinterpret_cast<std::uintptr_t>(in) % 8 == 0) {
      const uint2 v = *reinterpret_cast<const uint2*>(in);
      memcpy(b, &v, 8);
    } else {
      for (int j = 0; j < 8; ++j) b[j] = in[j];
    }
    bf16 o[8];
    for (int j = 0; j < 8; ++j) o[j] = math::mxfp8_to_bf16(b[j], sc);
    if (reinterpret_cast<std::uintptr_t>(out + e) % 16 == 0) {
      uint4 v;
      memcpy(&v, o, 16);
      *reinterpret_cast<uint4*>(out + e) = v;
    } else {
      for (int j = 0; j < 8; ++j) out[e + j] = o[j];
    }
  }
}

template <class D>
__global__ void k_sumsq_partial(const D* x, i64 n, double* partial) {
  __shared__ double shared[32];
  const i64 per = (n + gridDim.x - 1) / gridDim.x;
  const i64 begin = blockIdx.x * per, end = begin + per < n ? begin + per : n;
  double s = 0.0;
  for (i64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = ld(x, i);
    s += v * v;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void k_sumsq_final(const double* partial, int blocks, float* slot, const shardopt::MicrobatchState* mb,
                              SumsqWhen when) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const bool write = mb == nullptr || when == SumsqWhen::SumOverMicrobatches || mb->last != 0;
  if (!write) return;
  const bool add = mb != nullptr && when == SumsqWhen::SumOverMicrobatches && mb->first == 0;
  double s = 0.0;
  for (int b = 0; b < blocks; ++b) s += partial[b];
  slot[0] = add ? slot[0] + static_cast<float>(s) : static_cast<float>(s);
}

struct PointerArgs {
  const void* a[kMaxExperts];
  const void* b[kMaxExperts];
  void* c[kMaxExperts];
  int count = 0;
};

// The pointer arrays of cublasGemmBatchedEx, written in stream order from by-value
// arguments (what a graph captures), cuBLAS's operand order: B's pointers, then A's.
__global__ void k_set_pointers(PointerArgs p, const void** first, const void** second, void** out) {
  const int i = threadIdx.x;
  if (i >= p.count) return;
  first[i] = p.b[i];
  second[i] = p.a[i];
  out[i] = p.c[i];
}

// ---------------------------------------------------------------- the Ops

cudaDataType_t cuda_type(Elem e) {
  switch (e) {
    case Elem::f32: return CUDA_R_32F;
    case Elem::bf16: return CUDA_R_16BF;
    default: throw std::invalid_argument(std::string("cuda ops: no GEMM on ") + to_string(e) + " tensors");
  }
}

class CudaOps final : public Ops {
 public:
  CudaOps() {
    TRAINER_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TRAINER_CUBLAS(cublasCreate(&handle_));
    TRAINER_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
    TRAINER_CUDA(cudaMalloc(&pointers_, 3 * kMaxExperts * sizeof(void*)));
    TRAINER_CUDA(cudaMalloc(&partials_, kSumsqBlocks * sizeof(double)));
    TRAINER_CUDA(cudaEventCreate(&ev0_));
    TRAINER_CUDA(cudaEventCreate(&ev1_));
    bind(stream_);
  }
  ~CudaOps() override {
    (void)cudaStreamSynchronize(stream_);
    (void)cublasDestroy(handle_);
    (void)cudaFree(workspace_);
    (void)cudaFree(pointers_);
    (void)cudaFree(partials_);
    (void)cudaEventDestroy(ev0_);
    (void)cudaEventDestroy(ev1_);
    (void)cudaStreamDestroy(stream_);
  }

  shardopt::Backend backend() const noexcept override { return shardopt::Backend::Cuda; }
  Precision precision() const noexcept override { return Precision::Mixed; }
  Stream stream() const noexcept override { return reinterpret_cast<Stream>(stream_); }
  void synchronize() override { TRAINER_CUDA(cudaStreamSynchronize(stream_)); }
  double time_ms(const std::function<void()>& enqueue) override {
    TRAINER_CUDA(cudaEventRecord(ev0_, stream_));
    enqueue();
    TRAINER_CUDA(cudaEventRecord(ev1_, stream_));
    TRAINER_CUDA(cudaEventSynchronize(ev1_));
    float ms = 0.0f;
    TRAINER_CUDA(cudaEventElapsedTime(&ms, ev0_, ev1_));
    return ms;
  }

  Buffer alloc(Elem elem, std::int64_t numel) override {
    void* p = nullptr;
    const std::size_t bytes = static_cast<std::size_t>(numel) * elem_size(elem);
    TRAINER_CUDA(cudaMalloc(&p, bytes > 0 ? bytes : 256));
    // Zeroed on stream_ and waited for: cudaMemset would run on the legacy default stream,
    // which neither the host nor stream_ (non-blocking) waits for -- a kernel enqueued right
    // after (ArrayWeights' init_param) could run first and have its output zeroed.
    TRAINER_CUDA(cudaMemsetAsync(p, 0, bytes > 0 ? bytes : 256, stream_));
    TRAINER_CUDA(cudaStreamSynchronize(stream_));
    return Buffer(Tensor{p, elem, numel}, [](void* q) { (void)cudaFree(q); });
  }
  void zero(const Tensor& t, Stream s) override { TRAINER_CUDA(cudaMemsetAsync(t.data, 0, t.bytes(), cu(s))); }
  void copy(const Tensor& dst, const Tensor& src, Stream s) override {
    if (dst.elem != src.elem || dst.numel != src.numel) throw std::invalid_argument("copy: tensors differ in type or length");
    TRAINER_CUDA(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, cu(s)));
  }
  void upload(const Tensor& dst, const void* src) override {
    TRAINER_CUDA(cudaDeviceSynchronize());
    TRAINER_CUDA(cudaMemcpy(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice));
    // A pageable copy may return before its DMA lands; the trainer's streams do not
    // wait for the legacy stream.
    TRAINER_CUDA(cudaDeviceSynchronize());
  }
  void download(void* dst, const Tensor& src) override {
    TRAINER_CUDA(cudaDeviceSynchronize());
    TRAINER_CUDA(cudaMemcpy(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost));
  }
  std::int64_t memory_in_use() const override {
    std::size_t free_b = 0, total_b = 0;
    TRAINER_CUDA(cudaMemGetInfo(&free_b, &total_b));
    return static_cast<std::int64_t>(total_b - free_b);
  }

  std::string device_name() const override {
    int device = 0;
    TRAINER_CUDA(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    TRAINER_CUDA(cudaGetDeviceProperties(&prop, device));
    return prop.name;
  }

  void init_param(const Tensor& t, const InitArgs& a, Stream s) override {
    if (t.elem == Elem::bf16)
      k_init_param<<<blocks_for(t.numel), kThreads, 0, cu(s)>>>(t.as<bf16>(), a, t.numel);
    else if (t.elem == Elem::f32)
      k_init_param<<<blocks_for(t.numel), kThreads, 0, cu(s)>>>(t.as<float>(), a, t.numel);
    else
      throw std::invalid_argument("cuda ops: init_param takes bf16 parameters or f32 master pieces");
    TRAINER_LAUNCHED();
  }

  void make_batch(const BatchArgs& a, const Tensor& tokens, const Tensor& targets, Stream s) override {
    k_make_batch<<<blocks_for(a.tokens), kThreads, 0, cu(s)>>>(a, tokens.as<std::int32_t>(), targets.as<std::int32_t>());
    TRAINER_LAUNCHED();
  }

  void text_batch(const TextBatchArgs& a, const Tensor& tokens, const Tensor& targets, Stream s) override {
    check_text_batch(a, tokens, targets);
    k_text_batch<<<blocks_for(a.seqs * a.context), kThreads, 0, cu(s)>>>(a, tokens.as<std::int32_t>(),
                                                                          targets.as<std::int32_t>());
    TRAINER_LAUNCHED();
  }

  void pos_embed_forward(const Tensor& table, const Tensor& h, std::int64_t T, std::int64_t S, std::int64_t H,
                         Stream s) override {
    if (table.elem == Elem::f32)
      k_pos_embed_forward<<<blocks_for(T * H), kThreads, 0, cu(s)>>>(table.as<float>(), h.as<float>(), T, S, H);
    else
      k_pos_embed_forward<<<blocks_for(T * H), kThreads, 0, cu(s)>>>(table.as<bf16>(), h.as<float>(), T, S, H);
    TRAINER_LAUNCHED();
  }
  void pos_embed_backward(const Tensor& dh, const Tensor& dtable, std::int64_t T, std::int64_t S, std::int64_t H,
                          Stream s) override {
    if (dtable.elem == Elem::f32)
      k_pos_embed_backward<<<blocks_for(S * H), kThreads, 0, cu(s)>>>(dh.as<float>(), dtable.as<float>(), T, S, H);
    else
      k_pos_embed_backward<<<blocks_for(S * H), kThreads, 0, cu(s)>>>(dh.as<float>(), dtable.as<bf16>(), T, S, H);
    TRAINER_LAUNCHED();
  }
  void gelu_forward(const Tensor& u, const Tensor& a, std::int64_t n, Stream s) override {
    k_gelu_forward<<<blocks_for(n), kThreads, 0, cu(s)>>>(u.as<float>(), a.as<bf16>(), n);
    TRAINER_LAUNCHED();
  }
  void gelu_backward(const Tensor& da, const Tensor& u, const Tensor& du, std::int64_t n, Stream s) override {
    k_gelu_backward<<<blocks_for(n), kThreads, 0, cu(s)>>>(da.as<float>(), u.as<float>(), du.as<bf16>(), n);
    TRAINER_LAUNCHED();
  }
  void causal_softmax_forward(const Tensor& scores, const Tensor& probs, const Tensor& probs_low, std::int64_t blocks,
                              std::int64_t S, Stream s) override {
    const i64 rows = blocks * S;
    k_causal_softmax_forward<<<static_cast<unsigned>(std::min<i64>(rows, 65536)), kThreads, 0, cu(s)>>>(
        scores.as<float>(), probs.as<float>(), probs_low.as<bf16>(), rows, S);
    TRAINER_LAUNCHED();
  }
  void causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores, std::int64_t blocks,
                               std::int64_t S, Stream s) override {
    const i64 rows = blocks * S;
    k_causal_softmax_backward<<<static_cast<unsigned>(std::min<i64>(rows, 65536)), kThreads, 0, cu(s)>>>(
        dprobs.as<float>(), probs.as<float>(), dscores.as<bf16>(), rows, S);
    TRAINER_LAUNCHED();
  }

  void gemm(const GemmArgs& g, Stream s) override {
    bind(s);
    const cublasOperation_t opa = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float alpha = g.alpha, beta = g.beta;
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    if (g.batch == 1) {
      TRAINER_CUBLAS(cublasGemmEx(handle_, opb, opa, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k),
                                  &alpha, g.b.data, cuda_type(g.b.elem), static_cast<int>(g.ldb), g.a.data,
                                  cuda_type(g.a.elem), static_cast<int>(g.lda), &beta, g.c.data, cuda_type(g.c.elem),
                                  static_cast<int>(g.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      TRAINER_CUBLAS(cublasGemmStridedBatchedEx(
          handle_, opb, opa, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), &alpha, g.b.data,
          cuda_type(g.b.elem), static_cast<int>(g.ldb), g.stride_b, g.a.data, cuda_type(g.a.elem),
          static_cast<int>(g.lda), g.stride_a, &beta, g.c.data, cuda_type(g.c.elem), static_cast<int>(g.ldc),
          g.stride_c, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }

  void grouped_gemm(const GroupedGemmArgs& g, Stream s) override {
    const int n = static_cast<int>(g.a.size());
    if (n < 1 || n > kMaxExperts || g.b.size() != g.a.size() || g.c.size() != g.a.size())
      throw std::invalid_argument("grouped_gemm: 1..kMaxExperts operands, the same number of a, b and c");
    PointerArgs p;
    p.count = n;
    for (int i = 0; i < n; ++i) {
      if (g.a[i].elem != g.a[0].elem || g.b[i].elem != g.b[0].elem || g.c[i].elem != g.c[0].elem)
        throw std::invalid_argument("grouped_gemm: every operand of a group has the same element type");
      p.a[i] = g.a[i].data;
      p.b[i] = g.b[i].data;
      p.c[i] = g.c[i].data;
      // cuBLAS cannot inspect pointers that live on the device: keep every operand on a
      // 16-byte boundary (the model's are when hidden and expert widths are multiples of 8).
      for (const void* q : {p.a[i], static_cast<const void*>(p.b[i]), static_cast<const void*>(p.c[i])})
        if (reinterpret_cast<std::uintptr_t>(q) % 16 != 0)
          throw std::invalid_argument("grouped_gemm: operands must start on 16-byte boundaries (use hidden and "
                                      "expert widths that are multiples of 8)");
    }
    const void** first = static_cast<const void**>(pointers_);
    const void** second = first + kMaxExperts;
    void** out = static_cast<void**>(pointers_) + 2 * kMaxExperts;
    k_set_pointers<<<1, kMaxExperts, 0, cu(s)>>>(p, first, second, out);
    TRAINER_LAUNCHED();
    bind(s);
    const cublasOperation_t opa = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float alpha = g.alpha, beta = g.beta;
    TRAINER_CUBLAS(cublasGemmBatchedEx(handle_, opb, opa, static_cast<int>(g.n), static_cast<int>(g.m),
                                       static_cast<int>(g.k), &alpha, first, cuda_type(g.b[0].elem),
                                       static_cast<int>(g.ldb), second, cuda_type(g.a[0].elem), static_cast<int>(g.lda),
                                       &beta, out, cuda_type(g.c[0].elem), static_cast<int>(g.ldc), n,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void embed_forward(const Tensor& table, const Tensor& tokens, const Tensor& out, std::int64_t T, std::int64_t H,
                     Stream s) override {
    k_embed_forward<<<blocks_for(T * H), kThreads, 0, cu(s)>>>(table.as<bf16>(), tokens.as<std::int32_t>(),
                                                               out.as<float>(), T, H);
    TRAINER_LAUNCHED();
  }

  void embed_backward(const Tensor& dout, const Tensor& tokens, const Tensor& links, const Tensor& dtable,
                      std::int64_t T, std::int64_t H, Stream s) override {
    k_embed_links<<<blocks_for(T), kThreads, 0, cu(s)>>>(tokens.as<std::int32_t>(), links.as<std::int32_t>(), T);
    TRAINER_LAUNCHED();
    const dim3 grid(blocks_for(H, 128), static_cast<unsigned>(T < 65535 ? T : 65535));
    if (dtable.elem == Elem::f32)
      k_embed_backward<<<grid, 128, 0, cu(s)>>>(dout.as<float>(), tokens.as<std::int32_t>(), links.as<std::int32_t>(),
                                                dtable.as<float>(), T, H);
    else
      k_embed_backward<<<grid, 128, 0, cu(s)>>>(dout.as<float>(), tokens.as<std::int32_t>(), links.as<std::int32_t>(),
                                                dtable.as<bf16>(), T, H);
    TRAINER_LAUNCHED();
  }

  void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t T,
                       std::int64_t H, float eps, Stream s) override {
    if (w.elem == Elem::f32)
      k_rmsnorm_forward<<<blocks_for(T, 1), kThreads, 0, cu(s)>>>(x.as<float>(), w.as<float>(), y.as<bf16>(),
                                                                   rstd.as<float>(), T, H, eps);
    else
      k_rmsnorm_forward<<<blocks_for(T, 1), kThreads, 0, cu(s)>>>(x.as<float>(), w.as<bf16>(), y.as<bf16>(),
                                                                   rstd.as<float>(), T, H, eps);
    TRAINER_LAUNCHED();
  }

  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw, const Tensor& partial, std::int64_t T, std::int64_t H, Stream s) override {
    if (w.elem == Elem::f32)
      k_rmsnorm_backward_dx<<<blocks_for(T, 1), kThreads, 0, cu(s)>>>(dy.as<float>(), x.as<float>(), w.as<float>(),
                                                                       rstd.as<float>(), dx.as<float>(), T, H);
    else
      k_rmsnorm_backward_dx<<<blocks_for(T, 1), kThreads, 0, cu(s)>>>(dy.as<float>(), x.as<float>(), w.as<bf16>(),
                                                                       rstd.as<float>(), dx.as<float>(), T, H);
    TRAINER_LAUNCHED();
    const i64 chunks = rmsnorm_partial_size(T, H) / H;
    const dim3 grid(blocks_for(H), static_cast<unsigned>(chunks));
    k_rmsnorm_backward_partial<<<grid, kThreads, 0, cu(s)>>>(dy.as<float>(), x.as<float>(), rstd.as<float>(),
                                                             partial.as<float>(), T, H, chunks);
    TRAINER_LAUNCHED();
    if (dw.elem == Elem::f32)
      k_rmsnorm_backward_dw<<<blocks_for(H), kThreads, 0, cu(s)>>>(partial.as<float>(), dw.as<float>(), H, chunks);
    else
      k_rmsnorm_backward_dw<<<blocks_for(H), kThreads, 0, cu(s)>>>(partial.as<float>(), dw.as<bf16>(), H, chunks);
    TRAINER_LAUNCHED();
  }

  void silu_forward(const Tensor& u, const Tensor& a, std::int64_t n, Stream s) override {
    k_silu_forward<<<blocks_for(n), kThreads, 0, cu(s)>>>(u.as<float>(), a.as<bf16>(), n);
    TRAINER_LAUNCHED();
  }
  void silu_backward(const Tensor& da, const Tensor& u, const Tensor& du, std::int64_t n, Stream s) override {
    k_silu_backward<<<blocks_for(n), kThreads, 0, cu(s)>>>(da.as<float>(), u.as<float>(), du.as<bf16>(), n);
    TRAINER_LAUNCHED();
  }
  void to_low(const Tensor& x, const Tensor& y, std::int64_t n, Stream s) override {
    k_to_low<<<blocks_for(n), kThreads, 0, cu(s)>>>(x.as<float>(), y.as<bf16>(), n);
    TRAINER_LAUNCHED();
  }

  void router_forward(const Tensor& logits, const Tensor& probs, const Tensor& expert, const Tensor& gate,
                      std::int64_t T, int G, Stream s) override {
    k_router_forward<<<blocks_for(T), kThreads, 0, cu(s)>>>(logits.as<float>(), probs.as<float>(),
                                                            expert.as<std::int32_t>(), gate.as<float>(), T, G);
    TRAINER_LAUNCHED();
  }
  void router_backward(const Tensor& dgate, const Tensor& probs, const Tensor& expert, const Tensor& dlogits,
                       std::int64_t T, int G, Stream s) override {
    k_router_backward<<<blocks_for(T * G), kThreads, 0, cu(s)>>>(dgate.as<float>(), probs.as<float>(),
                                                                 expert.as<std::int32_t>(), dlogits.as<bf16>(), T, G);
    TRAINER_LAUNCHED();
  }

  void dispatch(const Tensor& expert, const Tensor& x, const Tensor& slot, const Tensor& row_token, const Tensor& xe,
                std::int64_t T, std::int64_t H, int G, std::int64_t C, Stream s) override {
    k_dispatch_assign<<<G, kDispatchThreads, 0, cu(s)>>>(expert.as<std::int32_t>(), slot.as<std::int32_t>(),
                                                         row_token.as<std::int32_t>(), T, C);
    TRAINER_LAUNCHED();
    k_dispatch_gather<<<blocks_for(G * C * H), kThreads, 0, cu(s)>>>(x.as<bf16>(), row_token.as<std::int32_t>(),
                                                                     xe.as<bf16>(), G * C, H);
    TRAINER_LAUNCHED();
  }

  void combine_forward(const Tensor& ye, const Tensor& expert, const Tensor& slot, const Tensor& gate, const Tensor& h,
                       std::int64_t T, std::int64_t H, std::int64_t C, Stream s) override {
    k_combine_forward<<<blocks_for(T * H), kThreads, 0, cu(s)>>>(ye.as<float>(), expert.as<std::int32_t>(),
                                                                 slot.as<std::int32_t>(), gate.as<float>(),
                                                                 h.as<float>(), T, H, C);
    TRAINER_LAUNCHED();
  }

  void combine_backward(const Tensor& dh, const Tensor& ye, const Tensor& expert, const Tensor& slot,
                        const Tensor& gate, const Tensor& row_token, const Tensor& dye, const Tensor& dgate,
                        std::int64_t T, std::int64_t H, int G, std::int64_t C, Stream s) override {
    k_combine_backward_rows<<<blocks_for(G * C * H), kThreads, 0, cu(s)>>>(
        dh.as<float>(), gate.as<float>(), row_token.as<std::int32_t>(), dye.as<bf16>(), G * C, H);
    TRAINER_LAUNCHED();
    k_combine_backward_gate<<<blocks_for(T, 1), kThreads, 0, cu(s)>>>(
        dh.as<float>(), ye.as<float>(), expert.as<std::int32_t>(), slot.as<std::int32_t>(), dgate.as<float>(), T, H, C);
    TRAINER_LAUNCHED();
  }

  void dispatch_backward(const Tensor& dxe, const Tensor& expert, const Tensor& slot, const Tensor& dx,
                         std::int64_t T, std::int64_t H, std::int64_t C, Stream s) override {
    k_dispatch_backward<<<blocks_for(T * H), kThreads, 0, cu(s)>>>(dxe.as<float>(), expert.as<std::int32_t>(),
                                                                   slot.as<std::int32_t>(), dx.as<float>(), T, H, C);
    TRAINER_LAUNCHED();
  }

  void cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& dlogits, const Tensor& token_loss,
                     const Tensor& loss_slots, const shardopt::MicrobatchState* mb, float grad_scale, std::int64_t T,
                     std::int64_t V, Stream s) override {
    k_cross_entropy<<<blocks_for(T, 1), kLossThreads, 0, cu(s)>>>(logits.as<float>(), targets.as<std::int32_t>(),
                                                                   dlogits.as<bf16>(), token_loss.as<float>(),
                                                                   grad_scale, T, V);
    TRAINER_LAUNCHED();
    k_loss_reduce<<<1, kLossThreads, 0, cu(s)>>>(token_loss.as<float>(), loss_slots.as<float>(), mb, T);
    TRAINER_LAUNCHED();
  }

  void pack(const std::vector<Tensor>& src, const Tensor& dst, const shardopt::MicrobatchState* skip,
            Stream s) override {
    if (src.empty() || src.size() > static_cast<std::size_t>(kMaxExperts))
      throw std::invalid_argument("pack: 1..kMaxExperts sources");
    PackArgs a;
    a.count = static_cast<int>(src.size());
    a.numel = src.front().numel;
    bool aligned = reinterpret_cast<std::uintptr_t>(dst.data) % 16 == 0;
    for (std::size_t i = 0; i < src.size(); ++i) {
      if (src[i].elem != Elem::bf16 || src[i].numel != a.numel)
        throw std::invalid_argument("pack: bf16 sources of equal length");
      a.src[i] = src[i].data;
      aligned = aligned && reinterpret_cast<std::uintptr_t>(src[i].data) % 16 == 0;
    }
    if (!aligned && a.numel % 8 == 0)
      throw std::invalid_argument("pack: expert weights must start on 16-byte boundaries");
    k_pack<<<blocks_for(a.numel * a.count / 8 + 1), kThreads, 0, cu(s)>>>(a, dst.as<bf16>(), skip);
    TRAINER_LAUNCHED();
  }

  void dequantize_mxfp8(const std::vector<Mxfp8Source>& src, const Tensor& dst, const shardopt::MicrobatchState* skip,
                        Stream s) override {
    check_mxfp8_sources(src, dst);
    DequantArgs a;
    a.count = static_cast<int>(src.size());
    i64 offset = 0, most = 1;
    for (int i = 0; i < a.count; ++i) {
      const Mxfp8Source& x = src[static_cast<std::size_t>(i)];
      a.data[i] = x.data;
      a.scale[i] = x.scale;
      a.members[i] = x.members;
      a.groups[i] = x.shape.members;
      a.rows[i] = x.shape.rows;
      a.cols[i] = x.shape.cols;
      a.out_offset[i] = offset;
      a.colwise[i] = x.plane == shardopt::Mxfp8Plane::Columnwise;
      offset += x.shape.numel();
      most = std::max<i64>(most, x.shape.numel() / (!a.colwise[i] && x.shape.cols % 8 == 0 ? 8 : 1));
    }
    const dim3 grid(blocks_for(most), static_cast<unsigned>(a.count));
    k_dequantize_mxfp8<<<grid, kThreads, 0, cu(s)>>>(a, dst.as<bf16>(), skip);
    TRAINER_LAUNCHED();
  }

  void sumsq(const Tensor& x, const Tensor& slot, const shardopt::MicrobatchState* mb, SumsqWhen when,
             Stream s) override {
    const int blocks = static_cast<int>(x.numel < kSumsqBlocks * 1024 ? (x.numel + 1023) / 1024 : kSumsqBlocks);
    const int b = blocks < 1 ? 1 : blocks;
    if (x.elem == Elem::f32)
      k_sumsq_partial<<<b, kThreads, 0, cu(s)>>>(x.as<float>(), x.numel, partials_);
    else
      k_sumsq_partial<<<b, kThreads, 0, cu(s)>>>(x.as<bf16>(), x.numel, partials_);
    TRAINER_LAUNCHED();
    k_sumsq_final<<<1, 32, 0, cu(s)>>>(partials_, b, slot.as<float>(), mb, when);
    TRAINER_LAUNCHED();
  }

 private:
  static constexpr std::size_t kWorkspaceBytes = 32u << 20;

  // cuBLAS on `s` with our workspace. cublasSetStream resets the workspace to cuBLAS's
  // own pool, which could allocate inside a capture: set it again after every switch.
  void bind(Stream s) {
    if (bound_ && s == bound_stream_) return;
    TRAINER_CUBLAS(cublasSetStream(handle_, cu(s)));
    TRAINER_CUBLAS(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes));
    bound_stream_ = s;
    bound_ = true;
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  void* pointers_ = nullptr;  // 3 x kMaxExperts device pointers
  double* partials_ = nullptr;
  cudaEvent_t ev0_ = nullptr, ev1_ = nullptr;
  Stream bound_stream_ = nullptr;
  bool bound_ = false;
};

}  // namespace

bool cuda_ops_built() noexcept { return true; }

std::unique_ptr<Ops> make_cuda_ops() { return std::make_unique<CudaOps>(); }

}  // namespace trainer
