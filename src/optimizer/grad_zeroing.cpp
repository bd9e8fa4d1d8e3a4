#include "optimizer/grad_zeroing.hpp"

#include <algorithm>
#include <atomic>

namespace shardopt::detail {
namespace {
std::atomic<std::int64_t> zeroed_bytes{0};
}  // namespace

std::vector<std::vector<GradBytes>> grads_outside(const Layout& L, std::size_t grad_size,
                                                  const std::vector<bool>& landed) {
  std::vector<std::vector<GradBytes>> out(L.buffers().size());
  for (std::size_t f = 0; f < L.buffers().size(); ++f) {
    std::size_t cursor = 0;
    const std::size_t end = static_cast<std::size_t>(L.buffers()[f].numel) * grad_size;
    auto keep = [&](std::size_t to) {
      if (to <= cursor) return;
      if (!out[f].empty() && out[f].back().end == cursor) {
        out[f].back().end = to;
      } else {
        out[f].push_back(GradBytes{cursor, to});
      }
    };
    for (int b : L.buffers()[f].buckets) {  // in buffer order
      if (!landed[static_cast<std::size_t>(b)]) continue;
      const Range r = L.buckets()[static_cast<std::size_t>(b)].range;
      keep(static_cast<std::size_t>(r.begin) * grad_size);
      cursor = std::max(cursor, static_cast<std::size_t>(r.end) * grad_size);
    }
    keep(end);
  }
  return out;
}

void count_zero_grad_bytes(std::size_t bytes) {
  zeroed_bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
}

std::int64_t zero_grad_bytes() { return zeroed_bytes.load(std::memory_order_relaxed); }

}  // namespace shardopt::detail
