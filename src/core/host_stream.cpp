#include "shardopt/host_stream.hpp"

#include <mutex>
#include <unordered_set>

#include "core/float_env.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace {
// Live HostStreams, so that a foreign handle (e.g. a cudaStream_t) is refused, not
// dereferenced.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_set<const HostStream*>& registry() {
  static std::unordered_set<const HostStream*> r;
  return r;
}
}  // namespace

void HostGraph::replay() const {
  const detail::IeeeSubnormals ieee;  // the host twins' bits do not depend on the process's FTZ / DAZ
  for (const auto& op : ops_) op();
}

HostStream::HostStream() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().insert(this);
}

HostStream::~HostStream() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(this);
}

Stream HostStream::handle() const noexcept {
  return reinterpret_cast<Stream>(const_cast<HostStream*>(this));
}

void HostStream::begin_capture() {
  SHARDOPT_REQUIRE(!capturing_, ErrorCode::InvalidState,
                   "begin_capture() on a HostStream that is already capturing; call end_capture() first");
  capturing_ = true;
  recorded_.clear();
}

HostGraph HostStream::end_capture() {
  SHARDOPT_REQUIRE(capturing_, ErrorCode::InvalidState,
                   "end_capture() on a HostStream that is not capturing; call begin_capture() first");
  capturing_ = false;
  HostGraph g;
  g.ops_ = std::move(recorded_);
  recorded_.clear();
  return g;
}

HostStream* HostStream::from(Stream stream) {
  if (stream == nullptr) return nullptr;
  auto* hs = reinterpret_cast<HostStream*>(stream);
  std::lock_guard<std::mutex> lock(registry_mutex());
  SHARDOPT_REQUIRE(registry().count(hs) != 0, ErrorCode::InvalidArgument,
                   "a host-backend call got a stream that is not a live HostStream (a cudaStream_t "
                   "passed to a host-backend object?); pass HostStream::handle() or nullptr");
  return hs;
}

void host_enqueue(Stream stream, std::function<void()> op) {
  HostStream* hs = HostStream::from(stream);
  if (hs != nullptr && hs->capturing_) {
    hs->recorded_.push_back(std::move(op));
    return;
  }
  const detail::IeeeSubnormals ieee;  // the host twins' bits do not depend on the process's FTZ / DAZ
  op();
}

}  // namespace shardopt
