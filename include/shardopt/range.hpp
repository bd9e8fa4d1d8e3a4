// shardopt/range.hpp - small value types shared by every layer.
#pragma once

#include <cstdint>

namespace shardopt {

/// Half-open element range [begin, end).
struct Range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const noexcept { return end - begin; }
  friend bool operator==(const Range&, const Range&) = default;
};

}  // namespace shardopt
