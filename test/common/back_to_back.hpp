// back_to_back.hpp - tensors laid back to back in one flat buffer (each after an optional
// gap of elements) and one simulated rank's view of it: the part of each tensor inside
// the rank's range and the rank's pieces as ShardChunks. Shared by the fused Adam tests
// (test/unit/test_adam_mxfp8_common.hpp, test/unit/test_adam_amax_common.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "shardopt/fused_adam.hpp"
#include "shardopt/range.hpp"

namespace shardopt::test {

class BackToBack {
 public:
  /// Tensors of `numels` elements in order, tensor t after gaps[t] unused elements (no
  /// gaps when `gaps` is empty).
  explicit BackToBack(const std::vector<std::int64_t>& numels, const std::vector<std::int64_t>& gaps = {}) {
    for (std::size_t t = 0; t < numels.size(); ++t) {
      total_ += gaps.empty() ? 0 : gaps[t];
      start_.push_back(total_);
      numel_.push_back(numels[t]);
      total_ += numels[t];
    }
  }

  /// The buffer's elements (gaps included).
  std::int64_t total() const noexcept { return total_; }
  /// Where tensor t begins (all of them: starts()), and its elements.
  std::int64_t start(std::size_t t) const { return start_[t]; }
  const std::vector<std::int64_t>& starts() const noexcept { return start_; }
  std::int64_t numel(std::size_t t) const { return numel_[t]; }
  std::size_t count() const noexcept { return start_.size(); }

  /// The tensor holding flat element i (which must lie in a tensor, not in a gap after the
  /// last one).
  std::size_t tensor_at(std::int64_t i) const {
    std::size_t t = 0;
    while (start_[t] + numel_[t] <= i) ++t;
    return t;
  }

  /// Tensor t's flat elements inside the rank range [lo, hi): [max(lo, start),
  /// min(hi, end)); empty (begin >= end) when they do not meet.
  Range overlap(std::size_t t, std::int64_t lo, std::int64_t hi) const {
    return Range{std::max(lo, start_[t]), std::min(hi, start_[t] + numel_[t])};
  }

  /// The rank's pieces, one per tensor it meets, in tensor order: shard offsets from lo,
  /// buffer offsets flat, group group_of(t) (0 when not given).
  std::vector<ShardChunk> pieces(std::int64_t lo, std::int64_t hi,
                                 const std::function<std::int32_t(std::size_t)>& group_of = {}) const {
    std::vector<ShardChunk> out;
    for (std::size_t t = 0; t < count(); ++t) {
      const Range r = overlap(t, lo, hi);
      if (r.begin >= r.end) continue;
      ShardChunk c;
      c.shard_offset = r.begin - lo;
      c.buffer_offset = r.begin;
      c.length = r.size();
      c.group = group_of ? group_of(t) : 0;
      out.push_back(c);
    }
    return out;
  }

 private:
  std::vector<std::int64_t> start_, numel_;
  std::int64_t total_ = 0;
};

}  // namespace shardopt::test
