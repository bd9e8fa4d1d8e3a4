// shardopt/communicator.hpp - collectives over a group of ranks, one interface for two
// backends: NCCL on CUDA devices (every call ordered on the given stream) and MPI on
// the host backend (work enqueued on a HostStream, so it joins host captures).
//
// A Communicator is a shared handle: copies refer to the same group. After any failed
// call the group is marked failed (NCCL communicators are aborted) and every later
// call throws Error(InvalidState) naming the first failure.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"

namespace shardopt {

class Layout;

/// Reduction of a collective.
enum class ReduceOp {
  Sum,
  Average,  ///< sum divided by the number of ranks
  Max,
};

/// The id every rank of a new NCCL group needs; rank 0 creates it and the trainer's own
/// launcher distributes the bytes.
struct UniqueId {
  std::array<char, 128> bytes{};
  /// A fresh id (ncclGetUniqueId). Throws Error(Unsupported) without NCCL.
  static UniqueId create();
};

namespace detail {
class CommImpl;
}

/// A group of ranks and its collectives.
class Communicator {
 public:
  /// An empty handle; valid() is false and every collective throws.
  Communicator() = default;

  /// A group of one rank on `backend` (collectives are copies or no-ops); no MPI needed.
  static Communicator self(Backend backend);
  /// An NCCL group from a unique id, for trainers with their own launcher. Sets the
  /// calling thread's CUDA device to `device` first.
  static Communicator from_unique_id(const UniqueId& id, int rank, int size, int device);

  bool valid() const noexcept { return impl_ != nullptr; }
  int rank() const;
  int size() const;
  Backend backend() const;
  /// The CUDA device of this rank (-1 on the host backend).
  int device() const;

  /// In place: `data` holds size() * count_per_rank elements; afterwards this rank's
  /// reduced slice is at data + rank() * count_per_rank.
  void reduce_scatter(void* data, std::int64_t count_per_rank, DType dtype, ReduceOp op, Stream stream) const;
  /// In place: this rank's slice at data + rank() * count_per_rank is sent; afterwards
  /// `data` holds every rank's slice.
  void all_gather(void* data, std::int64_t count_per_rank, DType dtype, Stream stream) const;
  /// In place over `count` elements (Sum, Average or Max).
  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) const;
  /// Blocks the calling host thread until every rank has arrived.
  void barrier() const;
  /// Splits into sub-groups (collective over this group): ranks with equal `color` form
  /// one group, ordered by `key` then by rank.
  Communicator split(int color, int key) const;

  /// Blocking host-side all-gather of one 64-bit value per rank (for agreement checks).
  std::vector<std::uint64_t> all_gather_value(std::uint64_t value) const;
  /// Checks that every rank computed the same layout (one all-gather of fingerprints).
  /// On disagreement every rank throws Error(LayoutMismatch) naming the first
  /// differing parameter and the ranks that differ, instead of hanging.
  void check_layout(const Layout& layout) const;

  /// True once a call on this group has failed.
  bool failed() const noexcept;

  /// Backend-specific access for the library itself (ncclComm_t or MPI_Comm).
  detail::CommImpl* impl() const noexcept { return impl_.get(); }

 private:
  friend class detail::CommImpl;
  explicit Communicator(std::shared_ptr<detail::CommImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::CommImpl> impl_;
};

}  // namespace shardopt
