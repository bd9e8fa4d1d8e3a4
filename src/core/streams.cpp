#include "core/streams.hpp"

#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/check.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt {

SideStream::SideStream(Backend backend) {
#if SHARDOPT_HAVE_CUDA
  if (backend == Backend::Cuda) {
    cudaStream_t s = nullptr;
    SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_ = reinterpret_cast<Stream>(s);
  }
#else
  (void)backend;
#endif
}

SideStream::~SideStream() {
#if SHARDOPT_HAVE_CUDA
  if (stream_ != nullptr) (void)cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream_));
#endif
}

Event::Event(Backend backend) {
#if SHARDOPT_HAVE_CUDA
  if (backend == Backend::Cuda) {
    cudaEvent_t e = nullptr;
    SHARDOPT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event_ = e;
  }
#else
  (void)backend;
#endif
}

Event::~Event() {
#if SHARDOPT_HAVE_CUDA
  if (event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
#endif
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

void Event::record(Stream stream) {
#if SHARDOPT_HAVE_CUDA
  if (event_ != nullptr)
    SHARDOPT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), reinterpret_cast<cudaStream_t>(stream)));
#else
  (void)stream;
#endif
}

void Event::wait(Stream stream) const {
#if SHARDOPT_HAVE_CUDA
  if (event_ != nullptr)
    SHARDOPT_CUDA_CHECK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event_), 0));
#else
  (void)stream;
#endif
}

bool Event::done() const {
#if SHARDOPT_HAVE_CUDA
  if (event_ == nullptr) return true;
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (e == cudaErrorNotReady) return false;
  SHARDOPT_CUDA_CHECK(e);
#endif
  return true;
}

void Event::synchronize() const {
#if SHARDOPT_HAVE_CUDA
  if (event_ != nullptr) SHARDOPT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
#endif
}

bool stream_done(Backend backend, Stream stream) {
  SHARDOPT_REQUIRE(!is_capturing(backend, stream), ErrorCode::InvalidState,
                   "a wait on a stream that is being captured; end the capture first");
  if (backend == Backend::Host) return true;
#if SHARDOPT_HAVE_CUDA
  const cudaError_t e = cudaStreamQuery(reinterpret_cast<cudaStream_t>(stream));
  if (e == cudaErrorNotReady) return false;
  SHARDOPT_CUDA_CHECK(e);
#endif
  return true;
}

void order_after(Backend backend, Stream from, Stream to) {
  if (backend == Backend::Host || from == to) return;
  Event e(backend);
  e.record(from);
  e.wait(to);
}

std::uint64_t capture_id(Backend backend, Stream stream) {
  if (backend == Backend::Host) {
    const HostStream* hs = HostStream::from(stream);
    return hs != nullptr && hs->capturing() ? reinterpret_cast<std::uintptr_t>(hs) : 0;
  }
#if SHARDOPT_HAVE_CUDA
  if (stream == nullptr) return 0;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  SHARDOPT_CUDA_CHECK(cudaStreamGetCaptureInfo(reinterpret_cast<cudaStream_t>(stream), &status, &id));
  return status == cudaStreamCaptureStatusNone ? 0 : static_cast<std::uint64_t>(id) + 1;
#else
  return 0;
#endif
}

namespace detail {

#if SHARDOPT_HAVE_CUDA
namespace {
// Devices of the streams seen outside capture. cudaStreamGetDevice is refused while the
// stream is being captured (and would invalidate the capture), so a captured call is
// checked against what an eager call on the same stream found, if any.
class StreamDevices {
 public:
  void remember(cudaStream_t s, int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    devices_[s] = device;
  }
  bool recall(cudaStream_t s, int* device) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = devices_.find(s);
    if (it == devices_.end()) return false;
    *device = it->second;
    return true;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<cudaStream_t, int> devices_;
};

StreamDevices& stream_devices() {
  static StreamDevices d;
  return d;
}
}  // namespace
#endif

void check_stream_device(Backend backend, int device, Stream stream) {
  if (backend == Backend::Host) {
    (void)HostStream::from(stream);  // throws Error(InvalidArgument) for a foreign handle
    return;
  }
#if SHARDOPT_HAVE_CUDA
  int stream_device = -1;
  if (stream == nullptr) {
    SHARDOPT_CUDA_CHECK(cudaGetDevice(&stream_device));  // the legacy stream of the current device
  } else {
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    SHARDOPT_CUDA_CHECK(cudaStreamIsCapturing(s, &status));  // capture-safe
    if (status == cudaStreamCaptureStatusNone) {
      // Relaxed capture mode for the query, so that it cannot invalidate a capture this
      // thread runs on another stream.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      SHARDOPT_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      const cudaError_t err = cudaStreamGetDevice(s, &stream_device);
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
      SHARDOPT_CUDA_CHECK(err);
      stream_devices().remember(s, stream_device);
    } else if (!stream_devices().recall(s, &stream_device)) {
      return;  // first seen inside a capture: a stream of another device fails the capture itself
    }
  }
  SHARDOPT_REQUIRE(stream_device == device, ErrorCode::InvalidArgument,
                   "the stream belongs to CUDA device " + std::to_string(stream_device) +
                       " but this communicator runs on device " + std::to_string(device) +
                       "; pass a stream created on device " + std::to_string(device) +
                       (stream == nullptr ? " (the null stream means the current device: call cudaSetDevice first)"
                                          : ""));
#else
  (void)device;
  detail::no_cuda("a stream");
#endif
}


}  // namespace detail

}  // namespace shardopt
