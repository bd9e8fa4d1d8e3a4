#include "core/streams.hpp"

#include <utility>

#include "core/check.hpp"

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

void order_after(Backend backend, Stream from, Stream to) {
  if (backend == Backend::Host || from == to) return;
  Event e(backend);
  e.record(from);
  e.wait(to);
}

}  // namespace shardopt
