#include "comm/registered_ranges.hpp"

#include <algorithm>

namespace shardopt::detail {

void RegisteredRanges::add(const void* handle, const void* data, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back({handle, begin, begin + bytes});
}

void RegisteredRanges::remove(const void* handle) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.handle == handle; }),
                   entries_.end());
  } catch (...) {  // a failed lock: the entry stays, which only keeps a range counted as registered
  }
}

bool RegisteredRanges::covers(const void* data, std::size_t bytes) const {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t end = begin + bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const Entry& e) { return bytes > 0 && e.begin <= begin && end <= e.end; });
}

}  // namespace shardopt::detail
