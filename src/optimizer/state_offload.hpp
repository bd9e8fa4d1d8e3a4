// state_offload.hpp - optimizer state in pinned host memory, streamed through the GPU's
// own Adam pass inside the step (AdamOptions::offload_fraction; docs/offload.md).
//
// The last buckets in step order keep their state (fp32 master or bf16 remainders, both
// moments, the 8-bit moments' scales) in pinned host arrays, indexed by shard offset like
// the device arrays. Each step cuts their shard slices into stages of at most
// AdamOptions::offload_stage_numel elements (boundaries inside a bucket on its multiples,
// a multiple of kMomentBlock, so 8-bit blocks never straddle two stages) and streams every
// stage through one slot of a ring of kOffloadSlots device slots (each as wide as the
// widest stage): stage k + 1 uploads on the upload stream while Adam updates stage k on
// the offload's compute stream and stage k - 1 downloads on the download stream, ordered
// by events, all forked from and joined back into the caller's stream (so a capture
// records it). Adam runs on a slot through a chunk table rebased to the slot: the same
// kernel, the same elements, the same bits as on-GPU state. On the host backend the side
// streams are the caller's and the events no-ops: the same schedule runs in order,
// copying between two host arenas.
//
// Muon's state in those buckets lives here too, but is not staged: Muon's pass reads and
// writes its pieces' fp32 masters and its home's momentum in place, in these pinned arrays
// (mapped into the device's address space), so the stages move nothing of a Muon piece.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "core/streams.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"

namespace shardopt::detail {

/// Device slots of the ring: one uploading, one in Adam, one downloading, one spare.
inline constexpr int kOffloadSlots = 4;

/// The buckets that keep their state on the host for `fraction` (in [0, 1]): the last ones
/// in bucket order, whole, until their shard elements reach fraction x this rank's shard
/// elements (every rank's shard has the same size: the same buckets on every rank). Within
/// each buffer they are the buckets from some shard offset on.
std::vector<bool> offloaded_buckets(const Layout& layout, double fraction);

/// The state arrays of one buffer, device or host: element i of the shard at index
/// i - begin. Null pointers for what the mode does not keep.
struct StateArrays {
  std::int64_t begin = 0;
  float* master = nullptr;
  std::uint16_t* remainders = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  float* exp_avg_scales = nullptr;
  float* exp_avg_sq_scales = nullptr;
};

class StateOffload {
 public:
  /// One layout buffer as the engine keeps it: the Adam chunk table (shard order), whether
  /// its master is kept as remainders, and its split (the first offloaded bucket's shard
  /// offset; its shard size when none is).
  struct BufferInfo {
    const std::vector<ShardChunk>* chunks = nullptr;
    bool remainder = false;
    std::int64_t split = 0;
    /// Shard ranges [begin, end) of the Muon pieces from the split on, ascending: their
    /// fp32 master (in the host master array) is Muon's pass's to update; the stages move
    /// nothing of them.
    std::vector<std::pair<std::int64_t, std::int64_t>> muon_ranges;
    /// With remainders: the fp32 masters of those Muon pieces, in an array of their own.
    std::int64_t muon_master_numel = 0;
  };
  /// Plans the stages of the buckets `offloaded` names (over this rank's chunk tables)
  /// and allocates the pinned host arrays (zeroed), the ring and the stage chunk tables.
  /// A refused pinned allocation leaves the object empty and failed() set: the front end
  /// makes every rank learn of it (ShardEngine::agree_offload).
  /// `muon_momentum_numel`: floats of Muon momentum homed here that live on the host
  /// (MuonPass::host_momentum_numel).
  StateOffload(Backend backend, const Layout& layout, const std::vector<bool>& offloaded,
               const std::vector<BufferInfo>& buffers, DType moment_dtype, std::int64_t stage_numel,
               std::int64_t muon_momentum_numel = 0);
  StateOffload(const StateOffload&) = delete;
  StateOffload& operator=(const StateOffload&) = delete;

  /// The pinned allocation's error (null when everything was allocated).
  const std::exception_ptr& failed() const noexcept { return failed_; }
  /// Pinned bytes the host arrays need (what a failure could not allocate).
  std::int64_t host_bytes() const noexcept { return host_bytes_; }
  /// Device bytes of the ring.
  std::int64_t ring_bytes() const noexcept { return static_cast<std::int64_t>(ring_.bytes()); }

  /// Buffer b's host arrays (begin: the shard offset of their element 0).
  const StateArrays& host(int buffer) const { return buffers_.at(static_cast<std::size_t>(buffer)).host; }
  /// Buffer b's host array of Muon masters (BufferInfo::muon_master_numel floats; null: none).
  float* muon_master(int buffer) const { return buffers_.at(static_cast<std::size_t>(buffer)).muon_master.as<float>(); }
  /// The host array of Muon momentum (muon_momentum_numel floats, zeroed; null: none).
  float* muon_momentum() const { return muon_momentum_.as<float>(); }

  /// Buffer b's Adam settings and bound gradient / parameter storage (ShardEngine::bind).
  void bind(int buffer, const AdamConfig* config, const void* grads, void* params);

  /// The step's start (before the gradient norm): forks the upload stream from `caller`
  /// and uploads the first stages into the free slots.
  void begin(Stream caller);
  /// After the Adam prologue on `caller`: enqueues every stage's Adam (on the compute
  /// stream), download and the remaining uploads.
  void run(Stream caller, StepScalars* scalars);
  /// `caller` waits until bucket `bucket`'s stages are updated (its parameters written).
  void wait_bucket(int bucket, Stream caller) const;
  /// The step's end: `caller` joins the compute and download streams (the host arrays
  /// hold the new state once `caller` reaches this point).
  void finish(Stream caller);

 private:
  struct Stage {
    int buffer = 0;
    int bucket = 0;
    std::int64_t begin = 0, end = 0;  // shard offsets
    std::int64_t base = 0;            // the shard offset of slot element 0 (begin rounded down)
    std::int64_t first_chunk = 0, num_chunks = 0;  // in the stage chunk table
    std::size_t first_run = 0, num_runs = 0;       // in runs_: the ranges it moves
  };
  struct BufferState {
    std::int64_t split = 0;
    StateArrays host;
    DeviceBuffer master, remainders, exp_avg, exp_avg_sq, exp_avg_scales, exp_avg_sq_scales, muon_master;  // pinned
    std::array<DeviceBuffer*, 7> arrays() {  // in that order
      return {&master, &remainders, &exp_avg, &exp_avg_sq, &exp_avg_scales, &exp_avg_sq_scales, &muon_master};
    }
    const AdamConfig* config = nullptr;
    const void* grads = nullptr;
    void* params = nullptr;
  };
  // Stage k's copies between the host arrays and its slot (upload: host -> slot).
  void copy_stage(const Stage& st, int slot, bool upload, Stream stream) const;
  StateArrays slot_arrays(int slot, std::int64_t base, bool remainder) const;

  Backend backend_;
  DType moment_dtype_;
  std::int64_t slot_numel_ = 0;  // elements of each array in a slot: the widest stage, rounded up to kMomentBlock
  std::vector<BufferState> buffers_;
  std::vector<Stage> stages_;
  std::vector<std::pair<std::int64_t, std::int64_t>> runs_;  // per stage: [begin, end) less Muon's pieces
  std::vector<std::pair<std::size_t, std::size_t>> bucket_stages_;  // per bucket: first stage, count
  DeviceBuffer chunks_dev_;  // every stage's chunks, rebased to its slot
  DeviceBuffer ring_;
  DeviceBuffer muon_momentum_;  // pinned
  std::size_t slot_bytes_ = 0;
  std::size_t region_[4] = {};  // byte offsets in a slot: master / remainders, exp_avg, exp_avg_sq, scales
  std::int64_t host_bytes_ = 0;
  std::exception_ptr failed_;
  SideStream up_, compute_, down_;
  Event start_, prologue_, compute_end_, down_end_;
  std::vector<Event> uploaded_, updated_, downloaded_;  // per slot
  std::vector<Event> bucket_done_;                       // per bucket (recorded once its last stage is updated)
  std::size_t next_upload_ = 0;  // during a step: the next stage begin() / run() uploads
};

}  // namespace shardopt::detail
