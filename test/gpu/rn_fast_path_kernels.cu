// The fast paths of sqrtf and / against the compiler's own (see rn_fast_path_kernels.hpp).
#include "rn_fast_path_kernels.hpp"

#include <cuda_runtime.h>

#include "core/check.hpp"
#include "kernels/common/rn_fast_path.cuh"

namespace rn_fast_path_test {
namespace {
using shardopt::kernels::div_rn_fast;
using shardopt::kernels::sqrt_rn_fast;

__device__ void record(Sweep* s, bool wrong_result, bool wrong_flag, std::uint32_t a, std::uint32_t b) {
  if (wrong_result) atomicAdd(&s->wrong_results, 1ull);
  if (wrong_flag) atomicAdd(&s->wrong_flags, 1ull);
  if ((wrong_result || wrong_flag) && atomicCAS(&s->first_a, 0xFFFFFFFFu, a) == 0xFFFFFFFFu) s->first_b = b;
}

// The documented range: zero or bits in [2^-101, FLT_MAX], sign clear.
__device__ bool sqrt_in_range(std::uint32_t u) { return u == 0u || u == 0x80000000u || (u >= 0x0D000000u && u <= 0x7F7FFFFFu); }

__global__ void sqrt_kernel(std::uint32_t lo, std::uint64_t count, Sweep* s) {
  unsigned long long local = 0;
  for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t u = lo + static_cast<std::uint32_t>(k);
    const float x = __uint_as_float(u);
    bool exact = false;
    const float got = sqrt_rn_fast(x, exact);
    const bool wrong_result = exact && __float_as_uint(got) != __float_as_uint(sqrtf(x));
    record(s, wrong_result, exact != sqrt_in_range(u), u, 0);
    ++local;
  }
  atomicAdd(&s->checked, local);
}

__device__ std::uint32_t mix(std::uint64_t x) {  // splitmix64's finalizer, high half
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<std::uint32_t>((x ^ (x >> 31)) >> 32);
}

// The documented range: b's bits with exponent field in [67, 187] and sign clear; a zero
// or with its exponent field there.
__device__ bool div_in_range(std::uint32_t a, std::uint32_t b) {
  const std::uint32_t ea = (a >> 23) & 0xFFu, eb = b >> 23;
  return eb >= 67u && eb <= 187u && ((a & 0x7FFFFFFFu) == 0u || (ea >= 67u && ea <= 187u));
}

__global__ void div_kernel(int per_divisor, int lo_exp, int hi_exp, std::uint64_t seed, Sweep* s) {
  const std::uint64_t total = (std::uint64_t{1} << 23) * static_cast<std::uint64_t>(per_divisor + 2);
  const std::uint32_t span = static_cast<std::uint32_t>(hi_exp - lo_exp + 3);  // and one beyond each end
  unsigned long long local = 0;
  for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t man_b = static_cast<std::uint32_t>(k & 0x7FFFFFu);
    const std::uint64_t j = k >> 23;
    const std::uint32_t h1 = mix(seed ^ (k * 3 + 1)), h2 = mix(seed ^ (k * 3 + 2));
    const auto exp_b = static_cast<std::uint32_t>(lo_exp - 1 + static_cast<int>(h1 % span) + 127);
    const auto exp_a = static_cast<std::uint32_t>(lo_exp - 1 + static_cast<int>(h2 % span) + 127);
    const std::uint32_t b = (exp_b << 23) | man_b;
    std::uint32_t a = (exp_a << 23) | (mix(seed ^ (k * 3 + 3)) & 0x7FFFFFu);
    if (j == 0) a = 0u;                      // +0
    if (j == 1) a = 0x80000000u;             // -0
    if ((h1 & 0x80000000u) != 0u) a |= 0x80000000u;  // negative dividends
    const float fa = __uint_as_float(a), fb = __uint_as_float(b);
    bool exact = false;
    const float got = div_rn_fast(fa, fb, exact);
    const bool wrong_result = exact && __float_as_uint(got) != __float_as_uint(fa / fb);
    record(s, wrong_result, exact != div_in_range(a, b), a, b);
    ++local;
  }
  atomicAdd(&s->checked, local);
}

template <class Launch>
Sweep run(Launch launch) {
  Sweep* d = nullptr;
  SHARDOPT_CUDA_CHECK(cudaMalloc(&d, sizeof(Sweep)));
  Sweep h;
  SHARDOPT_CUDA_CHECK(cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice));
  launch(d);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  SHARDOPT_CUDA_CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  SHARDOPT_CUDA_CHECK(cudaFree(d));
  return h;
}

}  // namespace

Sweep sqrt_sweep(std::uint32_t lo, std::uint32_t hi) {
  const std::uint64_t count = static_cast<std::uint64_t>(hi) - lo + 1;
  return run([&](Sweep* d) { sqrt_kernel<<<1056, 256>>>(lo, count, d); });
}

Sweep div_sweep(int per_divisor, int lo_exp, int hi_exp, std::uint64_t seed) {
  return run([&](Sweep* d) { div_kernel<<<1056, 256>>>(per_divisor, lo_exp, hi_exp, seed, d); });
}

}  // namespace rn_fast_path_test
