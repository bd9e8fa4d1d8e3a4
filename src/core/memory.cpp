#include "core/memory.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "shardopt/host_stream.hpp"

#if SHARDOPT_HAVE_CUDA
#include <cuda.h>  // CUdeviceptr / CUresult, for cuMemGetAddressRange through the runtime's entry point
#endif

namespace shardopt {
namespace {
constexpr std::size_t kHostAlignment = 256;

std::size_t host_rounded(std::size_t bytes) { return (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment; }

// Pinned bytes held now, and the limit set_pinned_limit put on them (max: none).
std::atomic<std::size_t> g_pinned_bytes{0};
std::atomic<std::size_t> g_pinned_limit{static_cast<std::size_t>(-1)};

const char* kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::Device: return "device memory";
    case MemoryKind::NcclDevice: return "NCCL device memory";
    case MemoryKind::Pinned: return "pinned host memory";
    case MemoryKind::Host: return "host memory";
  }
  return "memory";
}

[[noreturn]] void refuse(MemoryKind kind, std::size_t bytes, const std::string& why) {
  throw Error(ErrorCode::OutOfMemory, "allocating " + std::to_string(bytes) + " bytes of " + kind_name(kind) +
                                          " failed (" + why + "); free memory, shrink the model or the state kept "
                                          "in that memory");
}

#if SHARDOPT_HAVE_CUDA
// Device allocations are requested in whole 256-byte units: NCCL reads user buffers in
// whole 16-byte words past an odd end (it never writes there), and cudaMalloc's own
// alignment is 256 bytes, so the rounding costs no memory and keeps such reads inside
// the allocation (compute-sanitizer's memcheck measures against the requested size).
constexpr std::size_t kDeviceRounding = 256;
std::size_t device_rounded(std::size_t bytes) { return (bytes + kDeviceRounding - 1) / kDeviceRounding * kDeviceRounding; }
#endif

#if SHARDOPT_HAVE_CUDA
// Bytes from `ptr` to the end of the allocation that holds it (the allocator's rounding
// included); `requested` when the driver cannot tell.
std::size_t device_extent(void* ptr, std::size_t requested) {
  using GetRange = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
  static GetRange get_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      return static_cast<GetRange>(nullptr);
    return reinterpret_cast<GetRange>(fn);
  }();
  if (get_range == nullptr || ptr == nullptr) return requested;
  CUdeviceptr base = 0;
  std::size_t size = 0;
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  if (get_range(&base, &size, p) != CUDA_SUCCESS) return requested;
  return std::max<std::size_t>(requested, static_cast<std::size_t>(base + size - p));
}
#endif

}  // namespace

DeviceBuffer::DeviceBuffer(Backend backend, std::size_t bytes, MemoryKind kind)
    : bytes_(bytes), backend_(backend), kind_(backend == Backend::Host ? MemoryKind::Host : kind) {
  if (bytes == 0) return;
  if (kind == MemoryKind::Pinned) {  // counted on both backends, so that tests of the limit run on either
    const std::size_t held = g_pinned_bytes.fetch_add(bytes) + bytes;
    if (held > g_pinned_limit.load()) {
      g_pinned_bytes.fetch_sub(bytes);
      refuse(kind, bytes, "over the pinned-memory limit; " + std::to_string(held - bytes) + " bytes are pinned already");
    }
    pinned_ = true;
  }
  try {
    allocate(kind);
  } catch (...) {
    if (pinned_) g_pinned_bytes.fetch_sub(bytes);
    throw;
  }
}

void DeviceBuffer::allocate(MemoryKind kind) {
  const std::size_t bytes = bytes_;
  if (backend_ == Backend::Host) {
    ptr_ = std::aligned_alloc(kHostAlignment, host_rounded(bytes));
    if (ptr_ == nullptr) refuse(kind, bytes, "the host's allocator returned no memory");
    return;
  }
#if SHARDOPT_HAVE_CUDA
  // The device or the driver's page-locking out of memory is Error(OutOfMemory); any
  // other failure is the CUDA error it is.
  const auto refused = [&](cudaError_t e) {
    if (e != cudaErrorMemoryAllocation) return false;
    (void)cudaGetLastError();  // clear it: the context is fine
    return true;
  };
  switch (kind_) {
    case MemoryKind::Device: {
      const cudaError_t e = cudaMalloc(&ptr_, device_rounded(bytes));
      if (refused(e)) refuse(kind_, bytes, "cudaMalloc: out of memory");
      SHARDOPT_CUDA_CHECK(e);
      break;
    }
    case MemoryKind::Pinned: {
      const cudaError_t e = cudaMallocHost(&ptr_, bytes);
      if (refused(e)) refuse(kind_, bytes, "cudaMallocHost could not page-lock them");
      SHARDOPT_CUDA_CHECK(e);
      break;
    }
    case MemoryKind::NcclDevice: {
#if SHARDOPT_HAVE_NCCL
      // ncclMemAlloc reports a device out of memory as a CUDA failure of its own: read it as
      // the memory it is when the device has fewer bytes free than asked for.
      const ncclResult_t r = ncclMemAlloc(&ptr_, device_rounded(bytes));
      if (r != ncclSuccess) {
        ptr_ = nullptr;
        (void)cudaGetLastError();
        std::size_t free = 0, total = 0;
        if (cudaMemGetInfo(&free, &total) == cudaSuccess && free < device_rounded(bytes))
          refuse(kind_, bytes, "ncclMemAlloc: the device has " + std::to_string(free) + " bytes free");
      }
      SHARDOPT_NCCL_CHECK(r);
#else
      SHARDOPT_REQUIRE(false, ErrorCode::Unsupported,
                       "MemoryKind::NcclDevice needs NCCL, which this build lacks; use MemoryKind::Device");
#endif
      break;
    }
    case MemoryKind::Host: {
      ptr_ = std::aligned_alloc(kHostAlignment, host_rounded(bytes));
      if (ptr_ == nullptr) refuse(kind_, bytes, "the host's allocator returned no memory");
      break;
    }
  }
#else
  (void)kind;
  detail::no_cuda("device memory");
#endif
}

void DeviceBuffer::release() noexcept {
  if (pinned_) g_pinned_bytes.fetch_sub(bytes_);
  pinned_ = false;
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
      kind_(other.kind_),
      pinned_(std::exchange(other.pinned_, false)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    backend_ = other.backend_;
    kind_ = other.kind_;
    pinned_ = std::exchange(other.pinned_, false);
  }
  return *this;
}

std::size_t allocation_extent(const DeviceBuffer& buffer, std::size_t requested) {
  if (requested == 0) return 0;
  if (buffer.backend() == Backend::Host) return host_rounded(requested);
#if SHARDOPT_HAVE_CUDA
  return device_extent(buffer.data(), requested);
#else
  return requested;
#endif
}

namespace detail {
void set_pinned_limit(std::optional<std::size_t> bytes) noexcept {
  g_pinned_limit.store(bytes.value_or(static_cast<std::size_t>(-1)));
}
std::size_t pinned_bytes() noexcept { return g_pinned_bytes.load(); }
}  // namespace detail

void fill_zero_async(Backend backend, void* ptr, std::size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (backend == Backend::Host) {
    host_enqueue(stream, [ptr, bytes] { std::memset(ptr, 0, bytes); });
    return;
  }
#if SHARDOPT_HAVE_CUDA
  SHARDOPT_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, reinterpret_cast<cudaStream_t>(stream)));
#else
  detail::no_cuda("device memory");
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
  detail::no_cuda("device memory");
#endif
}

}  // namespace shardopt
