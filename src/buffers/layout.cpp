#include "shardopt/layout.hpp"

#include <algorithm>
#include <numeric>
#include <string>
#include <unordered_map>

#include "core/fnv.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace {

std::int64_t align_up(std::int64_t x, std::int64_t a) { return (x + a - 1) / a * a; }

using detail::Fnv;

std::uint64_t hash_spec(const ParamSpec& s) {
  Fnv f;
  f.str(s.name);
  f.i64(static_cast<std::int64_t>(s.shape.size()));
  for (auto d : s.shape) f.i64(d);
  f.i64(static_cast<std::int64_t>(s.dtype));
  f.str(s.group);
  f.i64(s.members());
  return f.h;
}

}  // namespace

std::int64_t default_bucket_numel(int world_size) noexcept {
  return std::max<std::int64_t>(40'000'000, 1'000'000LL * world_size);
}

Layout::Layout(std::vector<ParamSpec> specs, int world_size, LayoutOptions options)
    : world_size_(world_size) {
  SHARDOPT_REQUIRE(!specs.empty(), ErrorCode::InvalidArgument,
                   "the parameter list is empty; register at least one ParamSpec");
  SHARDOPT_REQUIRE(world_size >= 1, ErrorCode::InvalidArgument,
                   "world size " + std::to_string(world_size) + " is invalid; it must be >= 1");
  SHARDOPT_REQUIRE(!options.bucket_numel || *options.bucket_numel > 0, ErrorCode::InvalidArgument,
                   "bucket size " + std::to_string(options.bucket_numel.value_or(0)) +
                       " is invalid; give a positive number of elements or leave it unset for the default");
  SHARDOPT_REQUIRE(options.alignment > 0, ErrorCode::InvalidArgument,
                   "alignment " + std::to_string(options.alignment) + " must be a positive number of elements");
  if (options.pad_multiple) {
    SHARDOPT_REQUIRE(*options.pad_multiple > 0 && *options.pad_multiple % world_size == 0,
                     ErrorCode::InvalidArgument,
                     "padding multiple " + std::to_string(*options.pad_multiple) +
                         " must be a positive multiple of the world size " + std::to_string(world_size));
  }
  bucket_threshold_ = options.bucket_numel.value_or(default_bucket_numel(world_size));
  alignment_ = options.alignment;
  pad_multiple_ = options.pad_multiple.value_or(std::lcm<std::int64_t>(world_size, 128));

  // Validate and normalise every spec; names must be unique.
  std::unordered_map<std::string, int> seen;
  specs_.reserve(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    specs_.push_back(validated(specs[i]));
    auto [it, inserted] = seen.emplace(specs_.back().name, static_cast<int>(i));
    SHARDOPT_REQUIRE(inserted, ErrorCode::InvalidArgument,
                     "parameter name '" + specs_.back().name + "' is used twice (entries " +
                         std::to_string(it->second) + " and " + std::to_string(i) +
                         "); every parameter needs a unique name");
  }

  const std::vector<int>& units = options.param_units;
  if (!units.empty()) {
    SHARDOPT_REQUIRE(units.size() == specs_.size(), ErrorCode::InvalidArgument,
                     "param_units has " + std::to_string(units.size()) + " entries for " +
                         std::to_string(specs_.size()) + " parameters; give one unit id per parameter");
    for (std::size_t i = 1; i < units.size(); ++i) {
      if (units[i] == units[i - 1]) continue;
      for (std::size_t j = 0; j + 1 < i; ++j)
        SHARDOPT_REQUIRE(units[j] != units[i], ErrorCode::InvalidArgument,
                         "unit " + std::to_string(units[i]) + " is not contiguous in registration order (parameters " +
                             std::to_string(j) + " and " + std::to_string(i) +
                             "); register a unit's parameters one after another");
    }
  }
  auto unit_of = [&](int p) { return units.empty() ? 0 : units[static_cast<std::size_t>(p)]; };
  const std::vector<int>& storage = options.param_storage;
  SHARDOPT_REQUIRE(storage.empty() || storage.size() == specs_.size(), ErrorCode::InvalidArgument,
                   "param_storage has " + std::to_string(storage.size()) + " entries for " +
                       std::to_string(specs_.size()) + " parameters; give one storage class per parameter (or none)");
  auto storage_of = [&](int p) { return storage.empty() ? 0 : storage[static_cast<std::size_t>(p)]; };

  // Groups, sorted so that the index does not depend on registration order.
  for (const auto& s : specs_) groups_.push_back(s.group);
  std::sort(groups_.begin(), groups_.end());
  groups_.erase(std::unique(groups_.begin(), groups_.end()), groups_.end());

  const int n = static_cast<int>(specs_.size());
  params_.resize(static_cast<std::size_t>(n));
  param_hashes_.resize(static_cast<std::size_t>(n));

  // Buffers: one per (parameter dtype, storage class), in the order first met going backwards.
  for (int i = n - 1; i >= 0; --i) {
    const DType d = specs_[static_cast<std::size_t>(i)].dtype;
    const int sc = storage_of(i);
    auto it = std::find_if(buffers_.begin(), buffers_.end(),
                           [d, sc](const BufferLayout& b) { return b.dtype == d && b.storage == sc; });
    if (it == buffers_.end()) {
      buffers_.push_back(BufferLayout{});
      buffers_.back().dtype = d;
      buffers_.back().storage = sc;
      it = buffers_.end() - 1;
    }
    it->params.push_back(i);
  }

  for (std::size_t bi = 0; bi < buffers_.size(); ++bi) {
    BufferLayout& buf = buffers_[bi];
    std::int64_t bucket_start = 0;
    std::int64_t cursor = 0;
    std::int64_t shard_cursor = 0;
    Bucket current;
    auto close_bucket = [&] {
      const std::int64_t size = align_up(cursor - bucket_start, pad_multiple_);
      current.buffer = static_cast<int>(bi);
      current.range = Range{bucket_start, bucket_start + size};
      current.shard_offset = shard_cursor;
      shard_cursor += size / world_size_;
      buf.buckets.push_back(static_cast<int>(buckets_.size()));
      bucket_units_.push_back(unit_of(current.params.front()));
      buckets_.push_back(std::move(current));
      current = Bucket{};
      bucket_start += size;
      cursor = bucket_start;
    };
    for (int p : buf.params) {
      const ParamSpec& s = specs_[static_cast<std::size_t>(p)];
      const std::int64_t count = numel(s.shape);
      std::int64_t start = align_up(cursor, alignment_);
      const bool new_unit = !current.params.empty() && unit_of(current.params.back()) != unit_of(p);
      if (!current.params.empty() && (new_unit || start + count - bucket_start > bucket_threshold_)) {
        close_bucket();
        start = align_up(cursor, alignment_);
      }
      ParamPlacement& pl = params_[static_cast<std::size_t>(p)];
      pl.buffer = static_cast<int>(bi);
      pl.bucket = static_cast<int>(buckets_.size());
      pl.offset = start;
      pl.numel = count;
      pl.members = s.members();
      pl.member_numel = count / pl.members;
      pl.group = static_cast<int>(std::lower_bound(groups_.begin(), groups_.end(), s.group) - groups_.begin());
      current.params.push_back(p);
      current.real_numel += count;
      cursor = start + count;
    }
    close_bucket();
    buf.numel = bucket_start;
    buf.shard_numel = shard_cursor;
  }

  Fnv f;
  f.str("shardopt-layout-v1");
  f.i64(world_size_);
  f.i64(bucket_threshold_);
  f.i64(alignment_);
  f.i64(pad_multiple_);
  f.i64(static_cast<std::int64_t>(units.size()));
  for (int u : units) f.i64(u);
  if (!storage.empty()) {  // absent from the hash when unused: fingerprints of plain layouts stay as they were
    f.str("param_storage");
    for (int c : storage) f.i64(c);
  }
  f.i64(n);
  for (int i = 0; i < n; ++i) {
    param_hashes_[static_cast<std::size_t>(i)] = hash_spec(specs_[static_cast<std::size_t>(i)]);
    f.i64(static_cast<std::int64_t>(param_hashes_[static_cast<std::size_t>(i)]));
  }
  fingerprint_ = f.h;
}

int Layout::param_index(const std::string& name) const {
  for (std::size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return static_cast<int>(i);
  SHARDOPT_REQUIRE(false, ErrorCode::OutOfRange, "no parameter named '" + name + "' in the layout");
}

int Layout::group_index(const std::string& name) const {
  auto it = std::lower_bound(groups_.begin(), groups_.end(), name);
  SHARDOPT_REQUIRE(it != groups_.end() && *it == name, ErrorCode::OutOfRange,
                   "no optimizer group named '" + name + "' in the layout");
  return static_cast<int>(it - groups_.begin());
}

Range Layout::shard_range(int bucket, int rank) const {
  SHARDOPT_REQUIRE(bucket >= 0 && bucket < static_cast<int>(buckets_.size()), ErrorCode::OutOfRange,
                   "bucket " + std::to_string(bucket) + " is out of range [0, " +
                       std::to_string(buckets_.size()) + ")");
  SHARDOPT_REQUIRE(rank >= 0 && rank < world_size_, ErrorCode::OutOfRange,
                   "rank " + std::to_string(rank) + " is out of range [0, " + std::to_string(world_size_) + ")");
  const Range& r = buckets_[static_cast<std::size_t>(bucket)].range;
  const std::int64_t shard = r.size() / world_size_;
  return Range{r.begin + rank * shard, r.begin + (rank + 1) * shard};
}

std::vector<Segment> Layout::segments(int buffer, int rank) const {
  SHARDOPT_REQUIRE(buffer >= 0 && buffer < static_cast<int>(buffers_.size()), ErrorCode::OutOfRange,
                   "buffer " + std::to_string(buffer) + " is out of range [0, " +
                       std::to_string(buffers_.size()) + ")");
  std::vector<Segment> out;
  for (int b : buffers_[static_cast<std::size_t>(buffer)].buckets) {
    const Range own = shard_range(b, rank);
    const Bucket& bk = buckets_[static_cast<std::size_t>(b)];
    for (int p : bk.params) {
      const ParamPlacement& pl = params_[static_cast<std::size_t>(p)];
      const std::int64_t lo = std::max(own.begin, pl.offset);
      const std::int64_t hi = std::min(own.end, pl.offset + pl.numel);
      if (lo >= hi) continue;
      out.push_back(Segment{p, pl.group, lo - pl.offset, bk.shard_offset + (lo - own.begin), hi - lo});
    }
  }
  return out;
}

std::int64_t Layout::total_numel() const noexcept {
  std::int64_t t = 0;
  for (const auto& b : buffers_) t += b.numel;
  return t;
}

std::int64_t Layout::padding_numel() const noexcept {
  std::int64_t real = 0;
  for (const auto& b : buckets_) real += b.real_numel;
  return total_numel() - real;
}

std::uint64_t Layout::param_hash(int i) const {
  SHARDOPT_REQUIRE(i >= 0 && i < static_cast<int>(param_hashes_.size()), ErrorCode::OutOfRange,
                   "param " + std::to_string(i) + " is out of range");
  return param_hashes_[static_cast<std::size_t>(i)];
}

}  // namespace shardopt
