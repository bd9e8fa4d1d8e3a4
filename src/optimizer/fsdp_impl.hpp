// Fsdp::Impl, shared by the three files of Fsdp: fsdp.cpp (construction, gradients,
// step, checkpoints, the accessors), fsdp_plan.cpp (the iteration plan: the learned
// order of wait_param calls, its slots and staging halves, the prefetches) and
// fsdp_staging.cpp (the gathers into the parameter slots and the gradient slot's MXFP8
// staging halves, their landing and their state).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "core/streams.hpp"
#include "optimizer/checkpoint.hpp"
#include "optimizer/shard_engine.hpp"
#include "optimizer/front_end.hpp"
#include "quantized/quantized_params.hpp"
#include "shardopt/error.hpp"
#include "shardopt/fsdp.hpp"

namespace shardopt {

class Fsdp::Impl final : public detail::FrontEnd {
 public:
  // One layout buffer's part of a unit: its element range there, and where the part
  // starts in the unit's gradient slot (`grad_at`) and in its parameter place (`at`:
  // the native param slot, or an MXFP8 plane place; elements).
  struct Part {
    std::int64_t begin = 0, end = 0;
    std::int64_t grad_at = 0, at = 0;
  };
  struct UnitInfo {
    std::vector<int> buckets;  // every bucket of the unit, in layout order
    std::vector<Part> parts;   // per layout buffer (empty range: none there)
    std::int64_t numel = 0;    // elements of every part (the gradient slot's extent)
    std::int64_t native = 0;   // elements of the native parts (param slot extent)
    std::int64_t mx = 0;       // elements of the MXFP8 parts (bytes of one plane)
  };

  // Named by the errors of the calls that need an initialized master.
  static constexpr const char* kInitCalls = "init_master(stream) (after writing the shard_param(i) pieces)";
  static const char* pass_name(FsdpPass p) { return p == FsdpPass::Forward ? "Forward" : "Backward"; }
  static const char* plane_name(FsdpPass p) { return p == FsdpPass::Forward ? "rowwise" : "columnwise"; }

  Impl(Communicator c, std::vector<ParamSpec> specs, std::vector<FsdpUnit> u, FsdpOptions o);
  ~Impl() override { detail::orphan_save(last_save); }
  Layout make_layout(std::vector<ParamSpec> specs);

  bool mx_mode() const { return mx != nullptr; }
  const std::string& unit_name(int u) const { return units[static_cast<std::size_t>(u)].name; }

  void check_unit(int u) const {
    SHARDOPT_REQUIRE(u >= 0 && u < static_cast<int>(units.size()), ErrorCode::OutOfRange,
                     "unit " + std::to_string(u) + " is out of range [0, " + std::to_string(units.size()) + ")");
  }

  template <class View>
  std::vector<View> unit_views(int u, void* base, DType dtype, bool grads) const {
    std::vector<View> out;
    const FsdpUnit& unit = units[static_cast<std::size_t>(u)];
    const UnitInfo& ui = info[static_cast<std::size_t>(u)];
    for (int p = unit.first; p < unit.first + unit.count; ++p) {
      const auto& pl = layout.params()[static_cast<std::size_t>(p)];
      const Part& part = ui.parts[static_cast<std::size_t>(pl.buffer)];
      const Shape& shape = layout.specs()[static_cast<std::size_t>(p)].shape;
      if (!grads && quantized[static_cast<std::size_t>(pl.buffer)]) {
        out.push_back(View{contiguous_view(nullptr, shape, DType::e4m3)});  // read it with mxfp8_param
        continue;
      }
      const std::int64_t at = pl.offset - part.begin + (grads ? part.grad_at : part.at);
      out.push_back(View{contiguous_view(static_cast<char*>(base) + static_cast<std::size_t>(at) * size_of(dtype), shape, dtype)});
    }
    return out;
  }

  // ---- the staging (fsdp_staging.cpp)
  // The gather stream, forked from the work queued on `stream` so far.
  Stream fork_gather(Stream stream);
  // In-place all-gathers of unit u's buckets of the buffers `pick` selects into `base`
  // (the part of buffer b at part.at elements of `esize` bytes), after copying this
  // rank's shard piece (from `shard(b)`) into its slice. Counts the bytes for `pass`.
  template <class Pick, class Shard>
  void gather_parts(int u, char* base, std::size_t esize, DType dt, FsdpPass pass, bool mxfp8, Pick pick,
                    Shard shard, Stream gs);
  // Position k's native parts into its parameter slot.
  void gather_native(std::size_t k, Stream stream);
  // Position k's MXFP8 plane (rowwise for a Forward position, columnwise for a
  // Backward one) into its staging half of the gradient slot.
  void gather_mx(std::size_t k, Stream stream);
  // `stream` waits for the gather into native slot `slot` (and, on the host, it lands).
  void wait_slot(int slot, Stream stream);
  // `stream` waits for the gather into staging half h (and, on the host, it lands).
  void wait_half(int h, Stream stream);
  char* half_base(int h) const { return static_cast<char*>(grad_slot.data()) + static_cast<std::size_t>(h * max_mx); }
  // One checked transition of staging half h (the message is built only on failure).
  void advance_half(int h, GatherState to);
  // Staging half h's bytes are dead (every reader was queued before): Landed or Consumed
  // becomes Idle through the checked transitions.
  void retire_half(int h);
  bool has_mx(std::size_t k) const { return half_of[k] >= 0; }
  // `stream` waits for position k's staged plane; a Backward plane is copied into the
  // columnwise slot (the gradient slot is about to hold the unit's gradients).
  void land_mx(std::size_t k, Stream stream);

  // ---- the iteration plan (fsdp_plan.cpp)
  // The next position after k that gathers its MXFP8 plane (or order.size()).
  std::size_t next_mx(std::size_t k) const;


  // ---- the rest (fsdp.cpp)
  detail::CheckpointTarget checkpoint_target() override;

  // The parameters from the master (init_from_master, load): the native parameter shard
  // converted, the MXFP8 shard planes and whole scales quantized (the sharded quantize of
  // step(), so the planes equal those of a run that never stopped).
  void publish_master(Stream stream) override;

  // ShardedOptimizer's interface (optimizer/front_end.hpp).
  detail::ShardEngine& engine() override { return state; }
  const Layout& model_layout() const override { return layout; }
  bool stored_mxfp8(int i) const override;
  ShardView param_shard(int i) override;
  ShardView grad_shard(int i, DType dtype, Stream stream) override;
  MemoryReport memory_report() const override;

  // StepGraph's interface: FSDP captures only as one whole iteration (its gathers differ
  // per position in the learned order).
  Backend step_backend() const override { return backend; }
  const Communicator& step_comm() const override { return world; }
  int iteration_microbatches() const override { return opt.microbatches; }
  bool separate_last_microbatch() const override { return true; }
  bool whole_iteration_only() const override { return true; }
  void set_iteration_grad_sync(bool) override {}
  void advance_iteration_microbatch(Stream s) override { state.advance_microbatch(s); }
  void step_and_zero_grad(Stream s) override {
    step(s);
    zero_grad(s);
  }
  void check_step_capturable() const override;
  void finish_pending(Stream) override {}
  void join_reductions(Stream) override {}
  // The bodies of the public calls of the same names.
  std::vector<ParamView> wait_param(int unit, std::optional<FsdpPass> pass, Stream stream);
  void step(Stream stream);
  void zero_grad(Stream stream);
  // A new iteration's position 0: the per-iteration counts start again.
  void restart_iteration() {
    pos = 0;
    std::fill(seen.begin(), seen.end(), 0);
    pending_mx = npos;
  }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  Communicator world;
  FsdpOptions opt;
  Backend backend;
  std::vector<FsdpUnit> units;
  int shard_size;
  Communicator shard_comm, replica_comm;
  std::vector<int> unit_of_param;
  Layout layout;
  std::size_t psize, gsize, slot_gsize;
  detail::ShardEngine state;
  std::vector<bool> quantized;  // per layout buffer: MXFP8
  std::unique_ptr<detail::QuantizedParams> mx;  // MXFP8 parameters (null when Native)
  std::vector<UnitInfo> info;
  std::int64_t max_numel = 0, max_mx = 0;
  std::vector<DeviceBuffer> param_shards, grad_shards;  // per layout buffer (no param shard for MXFP8)
  DeviceBuffer grad_slot, col_slot;
  std::array<DeviceBuffer, 2> param_slots;
  // The host backend runs a gather at once, on the caller's stream; to behave like a
  // CUDA gather still in flight, it writes into a landing place, and its bytes reach the
  // slot (or staging half) only when a stream waits for it: an operation enqueued on
  // that stream (recorded like any other when capturing). A read without the wait finds
  // the slot's earlier bytes, as it may on a GPU. CUDA gathers write the slot directly.
  struct Landing {
    DeviceBuffer place;    // host backend only (empty on CUDA)
    char* target = nullptr;  // where the pending bytes go; null: nothing pending
    std::size_t bytes = 0;
    // Where a gather into `to` (`n` bytes) writes: the landing place on the host.
    char* receive(char* to, std::size_t n) {
      if (place.data() == nullptr) return to;
      target = to;
      bytes = n;
      return static_cast<char*>(place.data());
    }
    // The pending bytes land into their target on `stream` (no-op without any).
    void land(Backend b, Stream stream) {
      if (target == nullptr) return;
      copy_async(b, target, place.data(), bytes, stream);
      target = nullptr;
    }
  };
  std::array<Landing, 2> slot_landing, half_landing;
  SideStream gather_stream, reduce_stream;
  std::array<Event, 2> slot_ready, stage_ready;
  Event grad_free;
  Event gather_go, reduce_go;  // the side streams start after the caller's queued work
  // The gradient slot's two MXFP8 staging halves (bytes [h * max_mx, ...)).
  std::array<GatherState, 2> staging{GatherState::Idle, GatherState::Idle};
  std::array<std::size_t, 2> staged_end{0, 0};  // byte end of what each half received
  FsdpGatherStats stats;

  // The learned order of wait_param calls and its gather plan.
  bool learned = false;
  std::vector<int> order;
  std::vector<int> slot_of, half_of;  // native slot; MXFP8 staging half (-1: no MXFP8 part)
  std::vector<FsdpPass> pass_of;
  std::vector<char> needs_gather, prefetched, mx_prefetched;
  std::size_t pos = 0;
  std::vector<int> seen = std::vector<int>(units.size(), 0);  // wait_param calls per unit this iteration
  std::vector<int> place_of = std::vector<int>(units.size(), -1);  // MXFP8 plane: half 0/1, or 2 (columnwise slot)
  std::vector<FsdpPass> pass_now = std::vector<FsdpPass>(units.size(), FsdpPass::Forward);
  std::size_t pending_mx = npos;  // a Backward position's MXFP8 gather waits for grad_ready
  int next_slot = 0, next_half = 0;
  int grad_unit = -1;
  bool reduce_pending = false;
  // F32Accumulate: the shard hop's all-to-all receive buffer (one bucket in
  // slot_grad_dtype) and the replica hop's fp32 gather (replicas x a bucket's shard).
  DeviceBuffer reduce_pieces, replica_sums;

  // F32Accumulate's scratch, allocated at construction (none with Plain).
  void allocate_reduce_scratch();
  // F32Accumulate's reduce of one bucket of the slot (`at`, count per shard rank) into
  // the gradient shard at `shard_at`, on the reduce stream `rs`.
  void reduce_f32(char* at, std::int64_t count, void* shard_at, Stream rs);
};

}  // namespace shardopt
