// shard_engine.hpp - the one sharded-Adam engine under both optimizers (DistributedAdam,
// Fsdp): "the state of this rank's shard". Per layout buffer the chunk table, the fp32
// master and the moments of this rank's shard; the device step scalars and microbatch
// state; the pinned learning-rate and loss-scale slots; the device-side step sequence
// (norm, found-inf, clipping, Adam); the views of this rank's pieces (params, master,
// moments, reduced gradients) and the cast copies of shard_grad. A front end owns the
// storage and the collectives that fill it, and binds each buffer's gradient and
// parameter storage here.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "kernels/adam/adam_math.cuh"
#include "kernels/adam/adam_mxfp8.hpp"
#include "optimizer/muon_pass.hpp"
#include "optimizer/state_offload.hpp"
#include "quantized/quantized_params.hpp"
#include "shardopt/adam_options.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/memory_report.hpp"
#include "shardopt/microbatch.hpp"
#include "shardopt/schedule.hpp"
#include "shardopt/views.hpp"

namespace shardopt::detail {

/// What a front end tells the engine besides the Adam math.
struct EngineSettings {
  AdamOptions adam;
  DType grad_dtype = DType::f32;  ///< dtype of the bound gradient storage
  /// The bound grads and params are shard-contiguous arrays (FSDP) rather than the full
  /// flat buffers (distributed Adam).
  bool shard_addressed = false;
  /// Cast copies made by grad_view persist across release_copies (graph mode).
  bool persistent_copies = false;
  /// The front end's options struct, named in errors ("DistributedAdamOptions").
  std::string options_name;
};

/// Checks the Adam settings and the gradient dtype; throws Error(InvalidArgument)
/// naming the bad one.
void validate(const AdamOptions& adam, DType grad_dtype);

/// The layout 8-bit moments need (moment_dtype q8_block; nothing otherwise): every
/// parameter start and every shard slice on a multiple of kMomentBlock elements (the
/// alignment raised to it, buckets padded to a multiple of world x kMomentBlock), so that
/// each block of kMomentBlock elements of a parameter lies whole in one rank's shard.
void moment_layout_options(const AdamOptions& adam, int world, LayoutOptions& lo);

/// Where this rank's piece of one parameter lives (length 0: none).
struct ParamPiece {
  int buffer = 0;
  std::int64_t param_offset = 0;   ///< first element within the parameter
  std::int64_t shard_offset = 0;   ///< within the buffer's shard (master)
  std::int64_t buffer_offset = 0;  ///< within the full buffer
  std::int64_t length = 0;
  std::int64_t moment_shift = 0;   ///< the moments sit at shard_offset - moment_shift (ShardChunk's)
  bool muon = false;               ///< in a Muon group: no Adam moments
  /// The master is the bf16 parameter plus a remainder (MasterStorage::bf16_remainder):
  /// no fp32 master of its own.
  bool remainder = false;
  std::int64_t master_offset = 0;  ///< within the buffer's fp32 master array (unless remainder)
};

class ShardEngine {
 public:
  /// Allocates and zeroes this rank's master, moments and step state over `layout`
  /// (`rank` within the layout's world). Throws Error(InvalidArgument) for bad settings.
  ShardEngine(Backend backend, const Layout& layout, int rank, EngineSettings settings);

  /// The gradient and parameter storage of layout buffer `buffer`. `params` null: the
  /// buffer's parameters live in another format (MXFP8); Adam updates only the master.
  void bind(int buffer, const void* grads, void* params);

  /// master <- the bound params of this rank's slices (converted to fp32); buffers bound
  /// without params are left as they are. Marks the engine initialized.
  void init_master(Stream stream);
  /// The reverse: the bound params of this rank's slices <- master (rounded to the param
  /// dtype; padding included, where the master is zero). Buffers without params skipped.
  /// Marks the engine initialized (the master is what the trainer publishes).
  void publish_master(Stream stream);
  /// True once the master holds the trainer's values: after init_master, publish_master
  /// (init_from_master, a checkpoint load) or mark_initialized.
  bool initialized() const noexcept { return initialized_; }
  /// Throws Error(InvalidState) from `call` (a front end's step, reduce or gather) while
  /// the master is not initialized; `init_calls` names the front end's init calls.
  void require_initialized(std::string_view call, std::string_view init_calls) const {
    if (!initialized_) throw_not_initialized(call, init_calls);
  }
  /// The fp32 master of param i's piece (null for an empty piece, or one whose master is
  /// its bf16 parameter plus a remainder: ParamPiece::remainder).
  float* master_of(int param) const;
  /// True when a checkpoint needs stage_master: some buffer keeps its master as bf16
  /// parameters plus remainders, or its moments in 8 bits.
  bool has_staged_state() const noexcept;
  /// Checkpoints of remainder buffers and of 8-bit moments: stage_master rebuilds their
  /// fp32 master (and decodes 8-bit moments) into staging arrays that master_view (and
  /// the moment views, then f32) show (written on `stream`; allocated here, so not inside
  /// a capture); publish_master splits the master back into parameters and remainders,
  /// quantizes the moments again by blocks, and frees them; drop_staged_master frees them
  /// unchanged. No-ops without remainders and 8-bit moments.
  void stage_master(Stream stream);
  void drop_staged_master() noexcept;
  /// The dtype of the moments in checkpoint files: the moment dtype, f32 for q8_block
  /// (saved decoded, model-space; docs/checkpoints.md).
  DType checkpoint_moment_dtype() const noexcept;
  /// The device-side step: lr (slot or schedule), inverse loss scale, grad norm over the
  /// shard (one Sum all-reduce over `norm_comm` when it has several ranks), found-inf,
  /// clip coefficient, Adam on every buffer (prologue once).
  void step(const Communicator& norm_comm, Stream stream);
  /// The three parts of step(): everything up to and including the Adam prologue (and,
  /// with offloaded state, the start of its stream: docs/offload.md), then the Adam pass
  /// over chunks [first, last) of one buffer's chunk table (so that a caller can
  /// all-gather finished buckets while later ones update; chunks of offloaded buckets:
  /// `stream` waits for their streamed update), then end_step, which joins the offload's
  /// streams back into `stream` (call it once after the last apply of the step).
  void begin_step(const Communicator& norm_comm, Stream stream);
  void apply(int buffer, std::size_t first, std::size_t last, Stream stream);
  void end_step(Stream stream);
  /// Collective over `comm` (every rank of the optimizer): when some rank could not pin
  /// the host memory of its offloaded state (AdamOptions::offload_fraction), every rank
  /// throws Error(OutOfMemory) naming that rank, the bytes and the option. Front ends call
  /// it right after constructing the engine.
  void agree_offload(const Communicator& comm) const;
  /// NVFP4 buffers (issue 29): from now on Adam over buffer `buffer` also folds the
  /// partial amaxes of the new master into the u32 buffers `target(param)` names (its
  /// `first` is filled in per chunk; nullopt: the parameter emits nothing), the values
  /// nvfp4_partial_amax would write; the caller zeroes them before the pass. Returns
  /// false, and changes nothing, when a named parameter's piece is not wholly in Adam's
  /// chunks (its master is not written by Adam: a Muon matrix).
  bool emit_amaxes(int buffer, const std::function<std::optional<kernels::AdamAmaxChunk>(int param)>& target);
  /// MXFP8 buffers (issue 29): the Adam state of buffer `buffer` (its config and
  /// pointers; chunks left out) and each parameter's place in it (nullopt: no piece here,
  /// or a piece not wholly in Adam's chunks), for the fused pass that quantizes the owned
  /// tile rows (kernels/adam/adam_mxfp8.hpp).
  const AdamConfig& adam_config(int buffer) const;
  ShardPointers adam_pointers(int buffer) const;
  std::optional<kernels::AdamMxfp8Place> adam_place(int param) const;
  /// Leaves `bands` (chunks of buffer `buffer` in shard order, which the fused pass now
  /// updates) out of Adam's chunk table; the gradient norm still covers them.
  void exclude_from_adam(int buffer, const std::vector<ShardChunk>& bands);
  /// The chunk range [first, last) of bucket `bucket` in its buffer's chunk table.
  std::pair<std::size_t, std::size_t> bucket_chunks(int bucket) const;

  const ParamPiece& piece(int param) const;
  /// This rank's piece of param i in the master / moments. A remainder piece's master is
  /// shown only while staged (stage_master); otherwise Error(Unsupported).
  ShardView master_view(int param) const;
  ShardView exp_avg_view(int param) const;
  /// This rank's piece of param i's remainders (u16; empty, no data, unless ParamPiece::remainder).
  ShardView remainder_view(int param) const;
  ShardView exp_avg_sq_view(int param) const;
  /// This rank's piece of param i in the bound parameter storage (its buffer's dtype;
  /// data null where the piece is empty or the buffer was bound without params).
  ShardView param_view(int param) const;
  /// This rank's piece of param i's reduced gradient in `dtype`: a view of the bound
  /// gradient storage when `dtype` is its dtype, else a cast copy written on `stream`
  /// (allocated on first use, Error(CaptureRefused) if that would happen in a capture).
  /// `call` names the public call in errors.
  ShardView grad_view(int param, DType dtype, Stream stream, const std::string& call);
  /// zero_grad's part: frees the cast copies unless they persist (waits for `stream`
  /// first; Error(CaptureRefused) inside a capture).
  void release_copies(Stream stream);
  /// Error(CaptureRefused) when capturing a step would free cast copies in the graph.
  void check_capturable() const;

  StepScalars* scalars() const noexcept { return scalars_.as<StepScalars>(); }
  MicrobatchState* microbatch() const noexcept { return microbatch_.as<MicrobatchState>(); }
  void set_lr(float lr) noexcept { slots_.as<float>()[0] = lr; }
  void set_loss_scale(float scale);
  /// The host learning-rate slot and the loss scale as last set (checkpoints save them).
  float lr_slot() const noexcept { return slots_.as<float>()[0]; }
  float loss_scale() const noexcept { return 1.0f / slots_.as<float>()[1]; }
  /// Writes the device step count (a checkpoint's position), ordered on `stream`.
  void set_step(std::int64_t step, Stream stream);
  /// The device scalars after `stream`'s work, waited for through `comm`'s deadline
  /// (Communicator::synchronize).
  StepScalars read_scalars(const Communicator& comm, Stream stream) const;
  void advance_microbatch(Stream stream);

  /// The Muon part of the step (null when no group chooses Muon; docs/muon.md).
  const MuonPass* muon() const noexcept { return muon_.get(); }
  /// Collective over `comm` when a group chooses Muon: every rank must have computed the
  /// same Muon matrices and homes (Error(LayoutMismatch) on every rank otherwise).
  void check_muon_agreement(const Communicator& comm) const;

  /// Adds master, moments, this shard's padding in them and the cast copies to a report.
  void add_memory(MemoryReport& r) const;
  const EngineSettings& settings() const noexcept { return settings_; }
  Backend backend() const noexcept { return backend_; }

 private:
  struct BufferShard {
    std::vector<ShardChunk> chunks;  // the Adam chunks (Muon parameters' chunks left out)
    DeviceBuffer chunks_dev;
    DeviceBuffer norm_chunks_dev;    // every chunk, for the gradient norm (only with Muon)
    std::int64_t num_norm_chunks = 0;
    DeviceBuffer master, exp_avg, exp_avg_sq;  // the moments leave the Muon pieces out
    // MasterStorage::bf16_remainder on a native bf16 buffer: the masters' low halves (by
    // shard offset); `master` then holds only the Muon pieces' fp32 masters, and
    // `staging` the rebuilt fp32 master while a checkpoint needs it.
    bool remainder = false;
    DeviceBuffer remainders, staging;
    // DType::q8_block moments: `exp_avg` / `exp_avg_sq` hold the bytes, these the scales
    // (one float per kMomentBlock); while a checkpoint needs them, moment_staging holds
    // both moments decoded to fp32 (exp_avg, exp_avg_sq), and the moment views show them.
    bool q8 = false;
    DeviceBuffer exp_avg_scales, exp_avg_sq_scales;
    DeviceBuffer moment_staging[2];
    AdamConfig config;
    ShardPointers ptrs;
    std::int64_t real_numel = 0;
    DType param_dtype = DType::f32;
    bool bound = false;  // bind() has run
    // AdamOptions::offload_fraction: the device arrays keep shard offsets [0, split), the
    // offload's host arrays the rest; chunks [0, device_chunks) lie below split, and
    // `offloaded` lists the later buckets (first chunk, end chunk, bucket).
    std::int64_t split = 0;
    std::int64_t device_real = 0;  // real elements below split
    std::size_t device_chunks = 0;
    std::vector<std::tuple<std::size_t, std::size_t, int>> offloaded;
    // The Muon pieces from the split on: their shard ranges, and with remainders the floats
    // of their compact fp32 masters (the offload's host array; master_of).
    std::vector<std::pair<std::int64_t, std::int64_t>> host_muon_ranges;
    std::int64_t host_muon_master_numel = 0;
    DeviceBuffer amax_chunks;  // per chunk, where Adam emits NVFP4 partial amaxes (emit_amaxes)
  };
  ShardView piece_view(int param, const DeviceBuffer& buf, DType dtype, std::int64_t shift = 0) const;
  ShardView piece_view(int param, const void* base, DType dtype, std::int64_t origin) const;
  // The arrays that hold shard offset `at` of buffer b: the device arrays (begin 0) below
  // the buffer's offload split, the pinned host arrays from it on.
  StateArrays arrays_at(std::size_t b, std::int64_t at) const;
  ShardView moment_view(int param, int which) const;
  // Calls f(arrays, from, count) for the device part of buffer b's moment arrays
  // ([0, moment_numel), or [0, split) with offload) and the offloaded part [split, shard).
  template <class F>
  void for_state_parts(std::size_t b, F&& f) const;
  // Calls f(dst, own) for each bucket of buffer b: `own` this rank's range in the bucket's
  // buffer coordinates, `shard` its first shard offset, `dst` where it sits in the bound
  // param / grad storage.
  template <class F>
  void for_own_ranges(std::size_t b, F&& f) const;
  std::size_t storage_offset(const ParamPiece& ps) const;

  Backend backend_;
  const Layout& layout_;
  int rank_;
  EngineSettings settings_;
  std::vector<BufferShard> shards_;
  std::vector<ParamPiece> pieces_;
  DeviceBuffer scalars_, microbatch_, slots_, readback_, step_slot_;
  std::map<std::pair<int, DType>, DeviceBuffer> copies_;  // shard_grad cast copies
  std::unique_ptr<MuonPass> muon_;  // with a Muon group: its exchange, momentum and work buffers
  std::unique_ptr<StateOffload> offload_;  // with offload_fraction > 0: the host state and its stream
  void bind_muon();
  [[noreturn]] static void throw_not_initialized(std::string_view call, std::string_view init_calls);

  bool copies_requested_ = false;
  bool initialized_ = false;
};

/// Where each parameter's piece of `engine`'s fp32 master lives (the quantize's input).
std::vector<MasterPiece> master_pieces(const ShardEngine& engine, const Layout& layout);

}  // namespace shardopt::detail
