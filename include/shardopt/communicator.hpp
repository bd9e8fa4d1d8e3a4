// shardopt/communicator.hpp - collectives over a group of ranks, one interface for two
// backends: NCCL on CUDA devices (every call ordered on the given stream) and MPI on
// the host backend (work enqueued on a HostStream, so it joins host captures).
//
// A Communicator is a shared handle: copies refer to the same group. After any failed
// call (a backend error, an invalid argument, a stream of another device, a missed
// deadline) the group is marked failed (NCCL communicators are aborted): that rank may be
// out of step with its peers, so every later call throws quoting the first failure
// (Error(Timeout) after a missed deadline, Error(InvalidState) otherwise). Deadlines
// are off by default (shardopt/watchdog.hpp, set_watchdog).
// check_layout's LayoutMismatch is the exception: every rank detects it together.
//
// Numerics (both backends): f32, bf16 and f16 are reduced pairwise, adding in fp32 and
// rounding to the storage type (nearest even) at every combine, in the order of the
// backend's algorithm (NCCL's ring or tree; MPI's). Results are therefore exact
// wherever every partial sum is representable, equal to the one rounded sum on two
// ranks, and within (size + 1) * u * sum|x| of the exact sum otherwise (u: 2^-8 bf16,
// 2^-11 f16, 2^-24 f32). Average is the sum divided by size() (NCCL's ncclAvg scales
// each input by 1/size first; for power-of-two sizes both give exactly sum / size).
// Max of floats with NaNs is backend-defined: carry NaN-aware maxima as u32 ordered bit
// patterns (u32 Max). Host backend: at most 2^31 - 1 elements per rank per call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/watchdog.hpp"

namespace shardopt {

/// Reduction of a collective.
enum class ReduceOp {
  Sum,
  Average,  ///< sum divided by the number of ranks
  Max,
};

/// "Sum", "Average" or "Max" ("?" for a value outside the enum).
const char* to_string(ReduceOp op) noexcept;

/// How a gradient reduce-scatter adds the ranks' values (DistributedAdamOptions,
/// FsdpOptions, BucketStoreOptions; docs/grad_reduce.md).
enum class GradReducePrecision {
  /// The backend's reduce-scatter in the gradient dtype: bf16 rounded at every combine,
  /// in the order of NCCL's ring or tree (or MPI's), so the bits depend on the algorithm.
  Native,
  /// An all-to-all of the gradient pieces in their dtype (the same bytes as a
  /// reduce-scatter), then one fp32 sum per element in rank order (0, 1, ..., n-1) and
  /// one division by n for Average: deterministic, equal on both backends.
  /// A bucket's all-to-all and sum run in chunks, each chunk's sum beside the next
  /// chunk's all-to-all (BucketStoreOptions::grad_reduce_chunks); the bits do not depend
  /// on the chunks. The numbers that decide the default: docs/grad_reduce.md.
  F32Accumulate,
};

/// "Native" or "F32Accumulate" ("?" for a value outside the enum).
const char* to_string(GradReducePrecision precision) noexcept;

/// The id every rank of a new NCCL group needs; rank 0 creates it and the trainer's own
/// launcher distributes the bytes.
struct UniqueId {
  std::array<char, 128> bytes{};
  /// A fresh id (ncclGetUniqueId). Throws Error(Unsupported) without NCCL.
  static UniqueId create();
};

namespace detail {
class CommImpl;
struct CommAccess;
}  // namespace detail

/// A buffer registered with a communicator's backend (NCCL's zero-copy buffer
/// registration), deregistered by the destructor on the communicator's device. Where the
/// backend has no registration (host backend, a one-rank group, a build without NCCL)
/// it is an empty object. Move-only; destroy it before the buffer it registers.
class BufferRegistration {
 public:
  BufferRegistration() = default;
  ~BufferRegistration();
  BufferRegistration(BufferRegistration&& other) noexcept;
  BufferRegistration& operator=(BufferRegistration&& other) noexcept;
  BufferRegistration(const BufferRegistration&) = delete;
  BufferRegistration& operator=(const BufferRegistration&) = delete;
  /// True when the backend holds a registration.
  explicit operator bool() const noexcept { return handle_ != nullptr; }

 private:
  friend class Communicator;
  void reset() noexcept;
  std::shared_ptr<detail::CommImpl> comm_;
  void* handle_ = nullptr;
};

/// What a buffer given to Communicator::register_buffers will be used for.
enum class BufferUse {
  Collectives,  ///< reduce-scatter, all-gather, all-reduce (in place or not)
  SendRecv,     ///< all_to_all / all_to_all_peers only
  Both,         ///< both kinds of call
};

/// One buffer for Communicator::register_buffers.
struct BufferToRegister {
  void* data = nullptr;     ///< device memory (best from ncclMemAlloc)
  std::size_t bytes = 0;    ///< 0: nothing to register (an empty registration)
  BufferUse use = BufferUse::Collectives;
};

/// A group of ranks and its collectives.
class Communicator {
 public:
  /// An empty handle; valid() is false and every collective throws.
  Communicator() = default;

  /// A group of one rank on `backend` (collectives leave the data as it is); no MPI
  /// needed. On CUDA its device is the current one.
  static Communicator self(Backend backend);
  /// An NCCL group from a unique id, for trainers with their own launcher (collective
  /// over the `size` ranks). Sets the calling thread's CUDA device to `device` first and
  /// runs a small warm-up collective. Error(InvalidArgument) for an empty id, a rank
  /// outside [0, size) or a device that does not exist; Error(Unsupported) without NCCL.
  static Communicator from_unique_id(const UniqueId& id, int rank, int size, int device);

  /// False for a default-constructed or moved-from communicator.
  bool valid() const noexcept { return impl_ != nullptr; }
  /// This rank in [0, size()), the number of ranks, and where the collectives run.
  int rank() const;
  int size() const;
  Backend backend() const;
  /// The CUDA device of this rank (-1 on the host backend).
  int device() const;

  /// In place: `data` holds size() * count_per_rank elements; afterwards this rank's
  /// reduced slice is at data + rank() * count_per_rank and the other slices keep their
  /// values. dtype f32, bf16 or f16; op Sum, Average or Max. Ordered on `stream` (CUDA:
  /// a stream of this communicator's device; host: a HostStream handle or nullptr).
  void reduce_scatter(void* data, std::int64_t count_per_rank, DType dtype, ReduceOp op, Stream stream) const;
  /// In place: this rank's slice at data + rank() * count_per_rank is sent; afterwards
  /// `data` holds every rank's slice. Any dtype (moved as bytes: fp8 and e8m0 too).
  void all_gather(void* data, std::int64_t count_per_rank, DType dtype, Stream stream) const;
  /// Not in place: `send` holds size() pieces of count_per_rank elements, piece r going
  /// to rank r; afterwards `recv` holds size() pieces, piece r received from rank r. Any
  /// dtype (moved as bytes). `send` and `recv` must not overlap (Error(InvalidArgument)).
  /// Ordered on `stream` like the other collectives and capturable (NCCL: one group of
  /// ncclSend / ncclRecv; host: MPI_Alltoall; one rank: a copy). NCCL: register both
  /// buffers (register_buffer) or neither, on every rank; one registered and the other
  /// not is refused (Error(InvalidArgument)): NCCL leaves the mix undefined.
  void all_to_all(const void* send, void* recv, std::int64_t count_per_rank, DType dtype, Stream stream) const;
  /// all_to_all without this rank's own piece: piece rank() of `recv` is left as it was
  /// and piece rank() of `send` is not read, so a caller that uses its own piece where it
  /// lies saves that copy. Same rules and order otherwise.
  void all_to_all_peers(const void* send, void* recv, std::int64_t count_per_rank, DType dtype, Stream stream) const;
  /// all_to_all_peers over pieces spaced apart: piece r of `send` starts at element
  /// r * send_stride, piece r of `recv` at element r * recv_stride (each stride at least
  /// count_per_rank; 0 means count_per_rank). One slice of every piece at a time, e.g.
  /// a chunk of each rank's piece of a bucket (a pipelined F32Accumulate reduce).
  void all_to_all_peers(const void* send, std::int64_t send_stride, void* recv, std::int64_t recv_stride,
                        std::int64_t count_per_rank, DType dtype, Stream stream) const;
  /// In place over `count` elements: f32, bf16, f16 (Sum, Average, Max), u32 (Sum,
  /// Max: found-inf flags, ordered bit patterns of non-negative floats) or e8m0 (Max
  /// only: byte-wise unsigned maximum of MXFP8 scale bytes, scheme A of mxfp8.hpp).
  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) const;
  /// Blocks the calling host thread until every rank has arrived. Not while the calling
  /// thread captures a CUDA stream (it synchronizes).
  void barrier() const;
  /// Splits into sub-groups (collective over this group): ranks with equal `color`
  /// (>= 0) form one group, ordered by `key` then by rank. The new group inherits this
  /// one's deadlines, and the two fail together: a failure of either (a dead rank breaks
  /// both) marks the other failed. Host backend: MPI has no nonblocking split, so this
  /// one wait is not bounded by the deadlines.
  Communicator split(int color, int key) const;

  /// Blocking host-side all-gather of one 64-bit value per rank (for agreement checks);
  /// element r is rank r's value. Not while the calling thread captures a CUDA stream.
  std::vector<std::uint64_t> all_gather_value(std::uint64_t value) const;
  /// Blocking host-side all-gather of `values` (the same length on every rank): returns
  /// size() * values.size() values, rank r's at [r * values.size(), (r + 1) *
  /// values.size()). Not while the calling thread captures a CUDA stream.
  std::vector<std::uint64_t> all_gather_values(const std::vector<std::uint64_t>& values) const;

  /// Runs `calls` (collectives of this group, possibly on several buffers) as one
  /// backend group: NCCL aggregates them into one launch (ncclGroupStart/End); the other
  /// backends run them in order. A failure inside still closes the group (and marks it
  /// failed).
  void grouped(const std::function<void()>& calls) const;

  /// Registers `bytes` of device memory at `data` with the backend for its zero-copy
  /// paths (NCCL: ncclCommRegister, best with memory from ncclMemAlloc), on this
  /// group's device. An empty registration where the backend has none (host backend,
  /// a one-rank group, no NCCL) or once an NCCL group was aborted after a failure.
  BufferRegistration register_buffer(void* data, std::size_t bytes) const;
  /// Registers buffers that work together, each with what it will serve, by this
  /// communicator's rules (docs/decisions.md, issue 31): a buffer used by both send/recv
  /// and collectives is never registered (NCCL 2.28.3 stalled on one); and the buffers
  /// that serve send/recv are the partners of one another (any may send to any), so they
  /// are registered all or none: none once one of them cannot be. Buffers that serve
  /// collectives only are registered. Returns one registration per buffer, in order
  /// (empty where not registered, or where the backend has none).
  std::vector<BufferRegistration> register_buffers(const std::vector<BufferToRegister>& buffers) const;

  /// Sets this group's deadlines (shardopt/watchdog.hpp; shared by every copy of the
  /// handle and inherited by later split()s). An optimizer whose AdamOptions::watchdog
  /// is set sets it here when it is constructed. Error(InvalidArgument) for a negative
  /// timeout or one above a year.
  void set_watchdog(const WatchdogOptions& options) const;
  /// The deadlines in force.
  WatchdogOptions watchdog() const;
  /// Blocks until the work queued on `stream` so far has finished, checking NCCL's
  /// asynchronous errors meanwhile. Error(Timeout) once the wait passes wait_timeout,
  /// or once a step watchdog gave this group up; the error of a failed group otherwise.
  /// Not while `stream` is being captured.
  void synchronize(Stream stream) const;

  /// True once a call on this group has failed.
  bool failed() const noexcept;
  /// Throws quoting the first failure when the group has failed (`call` names the
  /// refused call in the message): Error(Timeout) when it missed a deadline,
  /// Error(InvalidState) after any other failure; nothing otherwise.
  void require_usable(const char* call) const;

 private:
  friend class detail::CommImpl;
  friend struct detail::CommAccess;
  explicit Communicator(std::shared_ptr<detail::CommImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::CommImpl> impl_;
};

}  // namespace shardopt
