#include "core/check.hpp"
#include "kernels/common/byte_copies.hpp"
#include "kernels/common/kernel_files.hpp"

namespace shardopt::kernels {
namespace {

constexpr int kThreads = 256;

// Block b copies piece b (ORs its two sources when it has `also`). When source and destination share their alignment modulo 16,
// a scalar head brings the destination to a 16-byte boundary, the body moves uint4s and
// a scalar tail finishes; otherwise every byte is copied on its own.
__global__ void copy_pieces_kernel(const BytePiece* __restrict__ pieces) {
  const BytePiece p = pieces[blockIdx.x];
  const std::uint8_t* __restrict__ src = p.src;
  std::uint8_t* __restrict__ dst = p.dst;
  const std::int64_t n = p.bytes;
  if (p.also != nullptr) {  // a shared NVFP4 byte (or a few): OR of the two sources
    for (std::int64_t i = threadIdx.x; i < n; i += kThreads) dst[i] = static_cast<std::uint8_t>(src[i] | p.also[i]);
    return;
  }
  const auto s_addr = reinterpret_cast<std::uintptr_t>(src);
  const auto d_addr = reinterpret_cast<std::uintptr_t>(dst);
  if (((s_addr ^ d_addr) & 15u) != 0) {
    for (std::int64_t i = threadIdx.x; i < n; i += kThreads) dst[i] = src[i];
    return;
  }
  std::int64_t head = static_cast<std::int64_t>((16u - (d_addr & 15u)) & 15u);
  if (head > n) head = n;
  const std::int64_t vectors = (n - head) / 16;
  for (std::int64_t i = threadIdx.x; i < head; i += kThreads) dst[i] = src[i];
  const auto* vsrc = reinterpret_cast<const uint4*>(src + head);
  auto* vdst = reinterpret_cast<uint4*>(dst + head);
  for (std::int64_t i = threadIdx.x; i < vectors; i += kThreads) vdst[i] = vsrc[i];
  for (std::int64_t i = head + vectors * 16 + threadIdx.x; i < n; i += kThreads) dst[i] = src[i];
}

}  // namespace

void copy_pieces_cuda(const BytePiece* pieces, std::int64_t count, Stream stream) {
  // One launch per 2^31 - 1 pieces (a grid's x dimension); in practice always one.
  constexpr std::int64_t kMaxGrid = 2147483647;
  for (std::int64_t first = 0; first < count; first += kMaxGrid) {
    const std::int64_t n = count - first < kMaxGrid ? count - first : kMaxGrid;
    copy_pieces_kernel<<<static_cast<unsigned>(n), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(pieces +
                                                                                                          first);
    SHARDOPT_CUDA_CHECK(cudaGetLastError());
  }
}

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void byte_copies_kernels_cuda(const KernelVisitor& visit) { visit(kernel_symbol(copy_pieces_kernel)); }

}  // namespace shardopt::kernels
