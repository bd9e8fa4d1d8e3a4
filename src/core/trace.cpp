#include "core/trace.hpp"

#if SHARDOPT_HAVE_NVTX
#include <string>
#include <type_traits>

namespace shardopt::detail {

TraceName::TraceName(const char* name) : name_(name) {
  nvtxDomainHandle_t d = trace_domain();
  if (d == nullptr) return;  // no tool: register nothing
  plain_ = nvtxDomainRegisterStringA(d, name);
  indexed_ = new std::atomic<nvtxStringHandle_t>[kIndexed];  // never freed: see trace.hpp
  for (int i = 0; i < kIndexed; ++i) indexed_[i].store(nullptr, std::memory_order_relaxed);
}

static_assert(std::is_trivially_destructible_v<TraceName>);

nvtxStringHandle_t TraceName::handle(int index) const {
  if (index < 0 || index >= kIndexed || indexed_ == nullptr) return plain_;
  std::atomic<nvtxStringHandle_t>& slot = indexed_[index];
  nvtxStringHandle_t h = slot.load(std::memory_order_acquire);
  if (h == nullptr) {
    // Registering the same string twice gives the same handle: a race here is harmless.
    const std::string full = std::string(name_) + " " + std::to_string(index);
    h = nvtxDomainRegisterStringA(trace_domain(), full.c_str());
    slot.store(h, std::memory_order_release);
  }
  return h;
}

void TraceRange::open(nvtxDomainHandle_t domain, const TraceName& name, int index) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = name.handle(index);
  if (index >= 0) {
    a.payloadType = NVTX_PAYLOAD_TYPE_INT32;
    a.payload.iValue = index;
  }
  nvtxDomainRangePushEx(domain, &a);
  domain_ = domain;
}

}  // namespace shardopt::detail
#endif
