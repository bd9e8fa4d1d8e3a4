// shardopt/layout.hpp - the one layout every rank computes: the same specs and world
// size give the same layout on every rank.
//
// From the same ordered ParamSpecs, world size and options, every rank computes the
// same placement of parameters in contiguous buffers (one per parameter dtype):
// params in reverse registration order (backward order), each start aligned; buckets
// closed before the parameter that would take them past the threshold (a param is
// never split); each bucket padded to a multiple of the padding multiple so that it
// divides evenly by the world size. Rank r owns slice r of every bucket; the
// concatenation of its slices is its shard, described by a segment table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/param_spec.hpp"
#include "shardopt/range.hpp"

namespace shardopt {

/// Knobs of the layout (the defaults are the library's choices, explained in docs/decisions.md).
struct LayoutOptions {
  /// Bucket threshold in elements; unset = max(40M, 1M x world size). Must be > 0.
  std::optional<std::int64_t> bucket_numel;
  /// Alignment of every parameter start, in elements (> 0).
  std::int64_t alignment = 64;
  /// Every bucket's size is a multiple of this; unset = lcm(world size, 128).
  /// When set it must be a positive multiple of the world size.
  std::optional<std::int64_t> pad_multiple;
  /// Optional unit of every parameter (by registration index), e.g. its layer for FSDP.
  /// Equal ids must be contiguous in registration order; a bucket never spans two units.
  std::vector<int> param_units;
  /// Optional storage class of every parameter (by registration index; empty: all 0).
  /// Parameters of different classes never share a buffer, and each buffer records its
  /// class (BufferLayout::storage): how a front end says "these parameters live in
  /// another format" (e.g. MXFP8) without disguising it as a dtype.
  std::vector<int> param_storage;
};

/// Where one parameter lives.
struct ParamPlacement {
  int buffer = 0;               ///< index into Layout::buffers()
  int bucket = 0;               ///< global bucket index
  std::int64_t offset = 0;      ///< element offset of the param in its buffer
  std::int64_t numel = 0;       ///< elements of the whole param
  int members = 1;              ///< G for a grouped param, else 1
  std::int64_t member_numel = 0;///< elements of one member (== numel when members == 1)
  int group = 0;                ///< index into Layout::groups()
  /// Element offset of member m in the buffer (members are contiguous).
  std::int64_t member_offset(int m) const noexcept { return offset + m * member_numel; }
};

/// A bucket: a padded range of one buffer, reduced and gathered as one unit.
struct Bucket {
  int buffer = 0;               ///< buffer index
  Range range;                  ///< element range in the buffer, padded
  std::int64_t real_numel = 0;  ///< elements that belong to parameters
  std::vector<int> params;      ///< param indices (registration indices), in buffer order
  std::int64_t shard_offset = 0;///< where this bucket's slice starts in each rank's shard
};

/// A contiguous buffer of parameters of one dtype.
struct BufferLayout {
  DType dtype = DType::bf16;    ///< the parameters' dtype
  int storage = 0;              ///< the parameters' storage class (LayoutOptions::param_storage)
  std::int64_t numel = 0;       ///< padded elements (sum of its buckets)
  std::vector<int> buckets;     ///< global bucket indices, in buffer order
  std::vector<int> params;      ///< param indices in buffer order (reverse registration)
  std::int64_t shard_numel = 0; ///< elements of each rank's shard (numel / world)
};

/// One piece of a rank's shard: a sub-range of one parameter.
struct Segment {
  int param = 0;                ///< param index
  int group = 0;                ///< optimizer group index
  std::int64_t param_offset = 0;///< first element within the param
  std::int64_t shard_offset = 0;///< first element within the rank's shard of the buffer
  std::int64_t length = 0;      ///< elements
};

/// The placement of a list of parameters across a world of ranks.
class Layout {
 public:
  /// Validates the specs and options (Error(InvalidArgument) on bad input) and computes
  /// the layout deterministically.
  Layout(std::vector<ParamSpec> specs, int world_size, LayoutOptions options = {});

  int world_size() const noexcept { return world_size_; }
  std::int64_t bucket_threshold() const noexcept { return bucket_threshold_; }
  std::int64_t alignment() const noexcept { return alignment_; }
  std::int64_t pad_multiple() const noexcept { return pad_multiple_; }

  const std::vector<ParamSpec>& specs() const noexcept { return specs_; }
  const std::vector<ParamPlacement>& params() const noexcept { return params_; }
  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  const std::vector<BufferLayout>& buffers() const noexcept { return buffers_; }
  /// The unit of every bucket (all 0 when LayoutOptions::param_units is empty).
  const std::vector<int>& bucket_units() const noexcept { return bucket_units_; }
  /// Optimizer group names, sorted; ParamPlacement::group indexes this list.
  const std::vector<std::string>& groups() const noexcept { return groups_; }

  /// Index of the param with this name; throws Error(OutOfRange) if unknown.
  int param_index(const std::string& name) const;
  /// Index of a group name; throws Error(OutOfRange) if unknown.
  int group_index(const std::string& name) const;

  /// Buffer range of bucket b owned by rank r.
  Range shard_range(int bucket, int rank) const;
  /// The segments of rank r's shard of buffer `buffer`, ordered by shard offset.
  std::vector<Segment> segments(int buffer, int rank) const;

  /// Elements of all buffers (padded) and elements that are padding.
  std::int64_t total_numel() const noexcept;
  std::int64_t padding_numel() const noexcept;
  /// Elements that belong to parameters.
  std::int64_t param_numel() const noexcept { return total_numel() - padding_numel(); }

  /// Hash of specs + options + world size; equal on ranks that agree.
  std::uint64_t fingerprint() const noexcept { return fingerprint_; }
  /// Hash of param i's spec alone (to name the first differing param).
  std::uint64_t param_hash(int i) const;

 private:
  std::vector<ParamSpec> specs_;
  int world_size_ = 1;
  std::int64_t bucket_threshold_ = 0;
  std::int64_t alignment_ = 64;
  std::int64_t pad_multiple_ = 128;
  std::vector<ParamPlacement> params_;
  std::vector<Bucket> buckets_;
  std::vector<BufferLayout> buffers_;
  std::vector<std::string> groups_;
  std::vector<int> bucket_units_;
  std::vector<std::uint64_t> param_hashes_;
  std::uint64_t fingerprint_ = 0;
};

/// Default bucket threshold for a world size: max(40M, 1M x world).
std::int64_t default_bucket_numel(int world_size) noexcept;

/// Checks that every rank of `comm` computed the same layout (one all-gather of
/// fingerprints; collective over `comm`). On disagreement every rank throws
/// Error(LayoutMismatch) naming the first differing parameter (index, each rank's
/// description) and the ranks that differ from rank 0, or the differing options,
/// instead of hanging; the group stays usable. A layout for another world size than
/// comm.size() is Error(InvalidArgument).
void check_layout(const Communicator& comm, const Layout& layout);

/// The chunks of rank `rank`'s shard of layout buffer `buffer`, each at most
/// `max_chunk` elements (> 0), in shard order (padding is in no chunk). A chunk never
/// spans two parameters; buffer_offset is the element's index in the full buffer.
std::vector<ShardChunk> shard_chunks(const Layout& layout, int buffer, int rank,
                                     std::int64_t max_chunk = 1 << 16);

}  // namespace shardopt
