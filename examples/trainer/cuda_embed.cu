// cuda_embed.cu - CudaOps' embeddings: the token embedding (forward, and a backward that
// sums each token's rows in position order, without atomics) and the GPT's position
// embedding.
#include "cuda_ops.cuh"

namespace trainer::gpu {
namespace {

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

}  // namespace

void CudaOps::embed_forward(const Tensor& table, const Tensor& tokens, const Tensor& out, std::int64_t T, std::int64_t H,
                            Stream s) {
  k_embed_forward<<<blocks_for(T * H), kThreads, 0, cu(s)>>>(table.as<bf16>(), tokens.as<std::int32_t>(),
                                                             out.as<float>(), T, H);
  TRAINER_LAUNCHED();
}

void CudaOps::embed_backward(const Tensor& dout, const Tensor& tokens, const Tensor& links, const Tensor& dtable,
                             std::int64_t T, std::int64_t H, Stream s) {
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

void CudaOps::pos_embed_forward(const Tensor& table, const Tensor& h, std::int64_t T, std::int64_t S, std::int64_t H,
                                Stream s) {
  if (table.elem == Elem::f32)
    k_pos_embed_forward<<<blocks_for(T * H), kThreads, 0, cu(s)>>>(table.as<float>(), h.as<float>(), T, S, H);
  else
    k_pos_embed_forward<<<blocks_for(T * H), kThreads, 0, cu(s)>>>(table.as<bf16>(), h.as<float>(), T, S, H);
  TRAINER_LAUNCHED();
}

void CudaOps::pos_embed_backward(const Tensor& dh, const Tensor& dtable, std::int64_t T, std::int64_t S, std::int64_t H,
                                 Stream s) {
  if (dtable.elem == Elem::f32)
    k_pos_embed_backward<<<blocks_for(S * H), kThreads, 0, cu(s)>>>(dh.as<float>(), dtable.as<float>(), T, S, H);
  else
    k_pos_embed_backward<<<blocks_for(S * H), kThreads, 0, cu(s)>>>(dh.as<float>(), dtable.as<bf16>(), T, S, H);
  TRAINER_LAUNCHED();
}

}  // namespace trainer::gpu
