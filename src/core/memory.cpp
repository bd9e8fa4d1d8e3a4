#include "core/memory.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt {
namespace {
constexpr std::size_t kHostAlignment = 256;

[[maybe_unused]] [[noreturn]] void no_cuda() {
  SHARDOPT_REQUIRE(false, ErrorCode::Unsupported,
                   "this build of shardopt has no CUDA backend; rebuild with -Dcuda=enabled or use "
                   "the host backend");
}
}  // namespace

DeviceBuffer::DeviceBuffer(Backend backend, std::size_t bytes, MemoryKind kind)
    : bytes_(bytes), backend_(backend), kind_(backend == Backend::Host ? MemoryKind::Host : kind) {
  if (bytes == 0) return;
  if (backend_ == Backend::Host) {
    const std::size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    ptr_ = std::aligned_alloc(kHostAlignment, rounded);
    SHARDOPT_REQUIRE(ptr_ != nullptr, ErrorCode::InvalidState,
                     "host allocation of " + std::to_string(bytes) + " bytes failed; free memory or shrink the model");
    return;
  }
#if SHARDOPT_HAVE_CUDA
  switch (kind_) {
    case MemoryKind::Device: SHARDOPT_CUDA_CHECK(cudaMalloc(&ptr_, bytes)); break;
    case MemoryKind::Pinned: SHARDOPT_CUDA_CHECK(cudaMallocHost(&ptr_, bytes)); break;
    case MemoryKind::NcclDevice:
#if SHARDOPT_HAVE_NCCL
      SHARDOPT_NCCL_CHECK(ncclMemAlloc(&ptr_, bytes));
      break;
#else
      SHARDOPT_REQUIRE(false, ErrorCode::Unsupported,
                       "MemoryKind::NcclDevice needs NCCL, which this build lacks; use MemoryKind::Device");
#endif
    case MemoryKind::Host: {
      ptr_ = std::aligned_alloc(kHostAlignment, (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment);
      SHARDOPT_REQUIRE(ptr_ != nullptr, ErrorCode::InvalidState, "host allocation failed");
      break;
    }
  }
#else
  no_cuda();
#endif
}

void DeviceBuffer::release() noexcept {
  if (ptr_ == nullptr) return;
  switch (kind_) {
    case MemoryKind::Host: std::free(ptr_); break;
#if SHARDOPT_HAVE_CUDA
    case MemoryKind::Device: (void)cudaFree(ptr_); break;
    case MemoryKind::Pinned: (void)cudaFreeHost(ptr_); break;
#if SHARDOPT_HAVE_NCCL
    case MemoryKind::NcclDevice: (void)ncclMemFree(ptr_); break;
#endif
#endif
    default: break;
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      backend_(other.backend_),
      kind_(other.kind_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    backend_ = other.backend_;
    kind_ = other.kind_;
  }
  return *this;
}

void fill_zero_async(Backend backend, void* ptr, std::size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (backend == Backend::Host) {
    host_enqueue(stream, [ptr, bytes] { std::memset(ptr, 0, bytes); });
    return;
  }
#if SHARDOPT_HAVE_CUDA
  SHARDOPT_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, reinterpret_cast<cudaStream_t>(stream)));
#else
  no_cuda();
#endif
}

void copy_async(Backend backend, void* dst, const void* src, std::size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (backend == Backend::Host) {
    host_enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
    return;
  }
#if SHARDOPT_HAVE_CUDA
  SHARDOPT_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, reinterpret_cast<cudaStream_t>(stream)));
#else
  no_cuda();
#endif
}

}  // namespace shardopt
