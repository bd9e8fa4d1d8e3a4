// Exhaustive device-vs-host checks of the MXFP8 element math (see test_mxfp8_convert.hpp).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/device_copy.hpp"
#include "core/check.hpp"
#include "kernels/mxfp8/mxfp8_device.cuh"
#include "kernels/mxfp8/mxfp8_math.cuh"
#include "test_mxfp8_convert.hpp"

namespace mxfp8_test {
namespace {
using namespace shardopt;

// out[s * 65536 + x] = the kernels' byte for bf16 x under scale byte s.
__global__ void encode_all(std::uint8_t* out) {
  const std::uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;  // one pair of x per thread
  if (t >= 256u * 32768u) return;
  const std::uint32_t s = t / 32768u, pair = t % 32768u;
  const std::uint32_t two = (2 * pair) | ((2 * pair + 1) << 16);
  const float inv = mxfp8::inverse_scale(static_cast<std::uint8_t>(s));
  const std::uint32_t q = mxfp8::nan_blocks(mxfp8::encode_pair(two, inv, inv), 0x01010101u * s);
  out[s * 65536u + 2 * pair] = static_cast<std::uint8_t>(q);
  out[s * 65536u + 2 * pair + 1] = static_cast<std::uint8_t>(q >> 8);
}

// Pairs with different scales for the two elements (the columnwise plane's case).
__global__ void encode_mixed(const std::uint32_t* words, const std::uint32_t* scales, std::uint16_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const std::uint32_t s = scales[i];
  const std::uint32_t q = mxfp8::encode_pair(words[i], mxfp8::inverse_scale(s & 0xFF), mxfp8::inverse_scale((s >> 8) & 0xFF));
  out[i] = static_cast<std::uint16_t>(mxfp8::nan_blocks(q, s));
}

__global__ void scales_all(std::uint8_t* scale, float* inverse) {
  const std::uint32_t m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m < 32768u) scale[m] = mxfp8::scale_from_magnitude(m);
  if (m < 256u) inverse[m] = mxfp8::inverse_scale(static_cast<std::uint8_t>(m));
}

__global__ void decode_all(float* out) {
  const std::uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < 65536u) out[t] = mxfp8::decode_element(static_cast<std::uint8_t>(t & 0xFF), static_cast<std::uint8_t>(t >> 8));
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

bool is_nan_bf16(std::uint32_t x) { return (x & 0x7FFFu) > 0x7F80u; }

void note(std::string* report, std::int64_t& count, const char* fmt, unsigned a, unsigned b, unsigned c, unsigned d) {
  if (count++ < 8) {
    char buf[160];
    std::snprintf(buf, sizeof buf, fmt, a, b, c, d);
    *report += buf;
  }
}

}  // namespace

std::int64_t encode_mismatches(std::string* report) {
  std::int64_t count = 0;
  const std::size_t n = 256u * 65536u;
  std::uint8_t* dev = nullptr;
  SHARDOPT_CUDA_CHECK(cudaMalloc(&dev, n));
  encode_all<<<(256u * 32768u + 255u) / 256u, 256>>>(dev);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  std::vector<std::uint8_t> got(n);
  shardopt::test::bytes_to_host(shardopt::Backend::Cuda, got.data(), dev, n);
  SHARDOPT_CUDA_CHECK(cudaFree(dev));
  for (std::uint32_t s = 0; s < 256; ++s)
    for (std::uint32_t x = 0; x < 65536; ++x) {
      if (s != 0xFF && is_nan_bf16(x)) continue;  // a NaN element always sits in a NaN block
      const std::uint8_t want = mxfp8::encode_element(static_cast<std::uint16_t>(x), static_cast<std::uint8_t>(s));
      const std::uint8_t dev_byte = got[s * 65536u + x];
      if (dev_byte != want) note(report, count, "scale 0x%02x bf16 0x%04x: device 0x%02x, host 0x%02x; ", s, x, dev_byte, want);
    }
  // Mixed scales in one pair.
  const int m = 1 << 20;
  std::mt19937 rng(9);
  std::vector<std::uint32_t> words(m), scales(m);
  for (int i = 0; i < m; ++i) {
    std::uint32_t w;
    do w = rng(); while (is_nan_bf16(w & 0xFFFF) || is_nan_bf16(w >> 16));
    words[i] = w;
    scales[i] = rng() & 0xFFFF;
  }
  std::uint32_t *dw = nullptr, *ds = nullptr;
  std::uint16_t* dq = nullptr;
  SHARDOPT_CUDA_CHECK(cudaMalloc(&dw, m * 4));
  SHARDOPT_CUDA_CHECK(cudaMalloc(&ds, m * 4));
  SHARDOPT_CUDA_CHECK(cudaMalloc(&dq, m * 2));
  shardopt::test::bytes_to_device(shardopt::Backend::Cuda, dw, words.data(), m * 4);
  shardopt::test::bytes_to_device(shardopt::Backend::Cuda, ds, scales.data(), m * 4);
  encode_mixed<<<(m + 255) / 256, 256>>>(dw, ds, dq, m);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  std::vector<std::uint16_t> q(m);
  shardopt::test::bytes_to_host(shardopt::Backend::Cuda, q.data(), dq, m * 2);
  SHARDOPT_CUDA_CHECK(cudaFree(dw));
  SHARDOPT_CUDA_CHECK(cudaFree(ds));
  SHARDOPT_CUDA_CHECK(cudaFree(dq));
  for (int i = 0; i < m; ++i) {
    const std::uint32_t lo = mxfp8::encode_element(static_cast<std::uint16_t>(words[i]), static_cast<std::uint8_t>(scales[i]));
    const std::uint32_t hi = mxfp8::encode_element(static_cast<std::uint16_t>(words[i] >> 16), static_cast<std::uint8_t>(scales[i] >> 8));
    if (q[i] != (lo | (hi << 8))) note(report, count, "mixed pair %08x scales %04x: device %04x, host %04x; ", words[i], scales[i], q[i], lo | (hi << 8));
  }
  return count;
}

std::int64_t scale_and_decode_mismatches(std::string* report) {
  std::int64_t count = 0;
  std::uint8_t* ds = nullptr;
  float* di = nullptr;
  float* dd = nullptr;
  SHARDOPT_CUDA_CHECK(cudaMalloc(&ds, 32768));
  SHARDOPT_CUDA_CHECK(cudaMalloc(&di, 256 * 4));
  SHARDOPT_CUDA_CHECK(cudaMalloc(&dd, 65536 * 4));
  scales_all<<<128, 256>>>(ds, di);
  decode_all<<<256, 256>>>(dd);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
  std::vector<std::uint8_t> scale(32768);
  std::vector<float> inverse(256), decoded(65536);
  shardopt::test::bytes_to_host(shardopt::Backend::Cuda, scale.data(), ds, 32768);
  shardopt::test::bytes_to_host(shardopt::Backend::Cuda, inverse.data(), di, 256 * 4);
  shardopt::test::bytes_to_host(shardopt::Backend::Cuda, decoded.data(), dd, 65536 * 4);
  SHARDOPT_CUDA_CHECK(cudaFree(ds));
  SHARDOPT_CUDA_CHECK(cudaFree(di));
  SHARDOPT_CUDA_CHECK(cudaFree(dd));
  for (std::uint32_t m = 0; m < 32768; ++m)
    if (scale[m] != mxfp8::scale_from_magnitude(m)) note(report, count, "scale of amax 0x%04x: device %02x host %02x%c; ", m, scale[m], mxfp8::scale_from_magnitude(m), ' ');
  for (std::uint32_t s = 0; s < 256; ++s)
    if (bits(inverse[s]) != bits(mxfp8::inverse_scale(static_cast<std::uint8_t>(s))))
      note(report, count, "inverse of scale 0x%02x: device %08x host %08x%c; ", s, bits(inverse[s]), bits(mxfp8::inverse_scale(static_cast<std::uint8_t>(s))), ' ');
  for (std::uint32_t t = 0; t < 65536; ++t) {
    const float want = mxfp8::decode_element(static_cast<std::uint8_t>(t & 0xFF), static_cast<std::uint8_t>(t >> 8));
    const bool both_nan = decoded[t] != decoded[t] && want != want;
    if (!both_nan && bits(decoded[t]) != bits(want))
      note(report, count, "decode data 0x%02x scale 0x%02x: device %08x host %08x; ", t & 0xFF, t >> 8, bits(decoded[t]), bits(want));
  }
  return count;
}

}  // namespace mxfp8_test
