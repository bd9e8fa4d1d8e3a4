// quantized_params.hpp - the quantized parameters of a DistributedAdam, whatever their
// format (MXFP8, NVFP4): the per-bucket quantize -> all-gather (through the gradient
// buffer) -> land -> zero pipeline and the per-bucket gather state machine
// (docs/mxfp8.md, docs/nvfp4.md). A format (QuantizedFormat) owns the persistent
// storage and says what each phase does; QuantizedParams drives the phases, the one
// all-reduce of the formats' exchange buffers, the landing copies and the zeroing, so
// that every format follows the same rules.
//
// A bucket of a quantized buffer: phase 1 (this rank's partial block statistics into
// the format's exchange buffer; MXFP8 also writes the data that needs no exchange
// here) -> one Max all-reduce over the exchange span of a run of
// consecutive buckets -> phase 2 (every scale, and this rank's data bytes into its
// staging slice of the bucket's gradient region) -> the store's staged all-gather ->
// landing (one table of byte copies, staging -> storage) -> the region zeroed.
// A format that keeps a bucket's bytes whole in gather planes of its own
// (QuantizedFormat::gather_planes: DistributedAdam's MXFP8, issue 29) writes them there
// in phase 2 and the store all-gathers the planes in place: no staging, no landing, no
// zeroing; the gradient region is never touched (zero_grad clears it as a native one).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "core/streams.hpp"
#include "kernels/common/byte_copies.hpp"
#include "shardopt/bucket_store.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/mxfp8_param.hpp"

namespace shardopt::detail {

/// The layout storage class of quantized parameters (LayoutOptions::param_storage).
inline constexpr int kQuantizedStorage = 1;

/// This rank's piece of one parameter in the fp32 master (length 0: none; master null).
struct MasterPiece {
  float* master = nullptr;         ///< the piece's first element
  std::int64_t param_offset = 0;   ///< its first element within the parameter
  std::int64_t shard_offset = 0;   ///< its offset within the layout buffer's shard
  std::int64_t length = 0;
};

/// True when a (validated) spec can be a quantized parameter: two or more dims per
/// member (a grouped spec's shape is [G, member...]; a plain spec needs two).
bool is_quantized_spec(const ParamSpec& spec);

/// The layout storage class of every spec (LayoutOptions::param_storage) when the
/// quantizable ones (is_quantized_spec) are quantized: kQuantizedStorage or 0.
std::vector<int> quantized_storage(const std::vector<ParamSpec>& specs);
/// Per layout buffer: true when it holds the quantized storage class.
std::vector<bool> quantized_buffers(const Layout& layout);

/// A bucket's staging: its gradient region, rank r's slice at byte r * rank_bytes.
struct Staging {
  std::uint8_t* region = nullptr;
  std::size_t region_bytes = 0;
  std::int64_t rank_bytes = 0;
};

/// What a format is built from (QuantizedParams makes it).
struct FormatContext {
  Backend backend = Backend::Host;
  const Layout* layout = nullptr;
  int rank = 0;
  const std::vector<MasterPiece>* masters = nullptr;  ///< per parameter
  const std::vector<bool>* buffers = nullptr;          ///< per layout buffer: quantized
  const std::vector<Staging>* staging = nullptr;      ///< per bucket (quantized ones set)
  /// Fsdp: the storage holds only this rank's shard of the data planes (per quantized
  /// buffer, shard_numel bytes each, at the master's shard offsets); phase 2 writes them
  /// in place, nothing is staged and there are no landing copies. The scale tensors are
  /// whole either way (the exchange leaves every rank with all of them).
  bool shard_storage = false;
  /// One rank and whole storage: the all-gather moves nothing, so phase 2 writes each
  /// parameter's bytes in the storage itself (where landing would have copied them) and
  /// there are no landing copies (the region is still zeroed). Set by QuantizedParams.
  /// (MXFP8 ignores it: its whole storage is gathered in place at any world size.)
  bool direct = false;
  /// How a format allocates memory that in-place gathers target (gather_planes):
  /// NcclDevice when the store's buffers are NCCL-registered, so QuantizedParams
  /// registers it as the store registers its own.
  MemoryKind gather_memory = MemoryKind::Device;
};

/// One quantized parameter format: its storage and the work of each phase.
class QuantizedFormat {
 public:
  virtual ~QuantizedFormat() = default;
  /// "MXFP8", "NVFP4": the name errors use.
  virtual const char* name() const = 0;
  /// The element type of the exchange buffers (the Max all-reduce between the phases).
  virtual DType exchange_dtype() const = 0;
  /// Bucket b's exchange buffer [begin, end) in the storage; consecutive quantized
  /// buckets' spans are adjacent (one all-reduce for a run of them).
  virtual std::uint8_t* exchange_begin(int bucket) const = 0;
  virtual std::uint8_t* exchange_end(int bucket) const = 0;
  /// Phase 1 of bucket b on `stream` (every parameter of it, an empty range where this
  /// rank owns none: its zeros join the Max). A format may also write here the bytes
  /// that need no exchange (MXFP8: the data of blocks wholly inside this rank's piece).
  virtual void partials(int bucket, Stream stream) const = 0;
  /// Phase 2 of bucket b on `stream`: scales, and this rank's (remaining) bytes into its
  /// staging.
  virtual void quantize(int bucket, Stream stream) const = 0;
  /// The phase_probe names of the two phases (bench_dist_adam --phases).
  virtual const char* partials_mark() const { return "amax"; }
  virtual const char* quantize_mark() const { return "quantize"; }
  /// Appends bucket b's landing copies (every rank's staged bytes -> storage).
  virtual void landing(int bucket, std::vector<kernels::BytePiece>& table) const = 0;
  /// Bytes of the persistent storage (data, scales, exchange buffers, alignment gaps).
  virtual std::size_t storage_bytes() const = 0;
  /// Bucket b's own gather planes (BucketStore::set_gather_planes) when the format keeps
  /// the bucket's bytes whole in the storage and phase 2 writes this rank's slice of each
  /// plane: the store then all-gathers the planes in place, and the bucket has no
  /// staging, landing copies or zeroing. Empty (the default): staged through the region.
  virtual std::vector<GatherPlane> gather_planes(int bucket) const {
    (void)bucket;
    return {};
  }
  /// The one allocation every gather plane lies in (registered with the communicator by
  /// QuantizedParams when the store's buffers are; bytes 0: none).
  virtual BufferToRegister gather_memory() const { return {}; }
};

/// True for the transitions of the gather state machine: Idle -> InFlight -> Landed ->
/// Consumed -> Idle.
bool gather_transition_legal(GatherState from, GatherState to);
/// Error(Internal): "<what>: illegal gather transition <from> -> <to>".
[[noreturn]] void throw_illegal_transition(const std::string& what, GatherState from, GatherState to);

/// One checked transition of the gather state machine (anything but the legal ones is
/// Error(Internal) naming `what()`, which is called only then: the transitions run on
/// every eager step). QuantizedParams drives it per bucket, Fsdp per staging region of
/// its gradient slot.
template <class What>
void advance_gather(GatherState& state, GatherState to, What&& what) {
  if (!gather_transition_legal(state, to)) throw_illegal_transition(what(), state, to);
  state = to;
}
/// "Idle", "InFlight", "Landed", "Consumed".
const char* gather_state_name(GatherState s);

/// Throws Error(Internal) with `message` (format_as's failure).
[[noreturn]] void throw_internal(const std::string& message);

/// What every format holds: the context it was built from and its one storage allocation
/// (pieces on 16-byte boundaries; the gaps stay zero, and zero is neutral for Max).
class StoredFormat : public QuantizedFormat {
 public:
  std::size_t storage_bytes() const override { return storage_.bytes(); }

 protected:
  explicit StoredFormat(const FormatContext& ctx)
      : backend_(ctx.backend),
        layout_(*ctx.layout),
        staging_(*ctx.staging),
        shard_storage_(ctx.shard_storage),
        direct_(ctx.direct) {}
  /// Allocates `bytes` of storage and zeroes it on the null stream (QuantizedParams'
  /// constructor synchronizes before the first use).
  void allocate(std::size_t bytes);
  std::uint8_t* at(std::size_t offset) const { return storage_.as<std::uint8_t>() + offset; }
  static std::size_t align_up(std::size_t x) { return (x + 15) / 16 * 16; }
  /// Phase 2 writes the storage itself (shard storage, or `direct`): no landing copies.
  bool writes_storage() const { return shard_storage_ || direct_; }

  Backend backend_;
  const Layout& layout_;
  const std::vector<Staging>& staging_;
  const bool shard_storage_;  // FormatContext::shard_storage
  const bool direct_;         // FormatContext::direct
  DeviceBuffer storage_;
};

/// `format` as the concrete format F; Error(Internal) naming `call` for another format.
template <class F>
const F& format_as(const QuantizedFormat& format, const char* call) {
  const auto* f = dynamic_cast<const F*>(&format);
  if (f == nullptr) throw_internal(std::string(call) + " of a " + format.name() + " format");
  return *f;
}

class QuantizedParams {
 public:
  using MakeFormat = std::unique_ptr<QuantizedFormat> (*)(const FormatContext&);
  /// The exchange between the phases: an in-place Max all-reduce of `count` elements of
  /// `dtype`, ordered after `stream`'s work (`stream` waits for it). Collective.
  using ExchangeFn = std::function<void(void* data, std::int64_t count, DType dtype, Stream stream)>;
  /// DistributedAdam's parameters. No buffer marked in `quantized`: no quantized
  /// parameters (every query says so, and `make` is not called). Otherwise
  /// `quantized[b]`: layout buffer b holds the format's parameters (the store has no
  /// param buffer for it and stages its gathers through the gradient buffer). The
  /// exchange is `store`'s all_reduce (store_exchange), so that the one owner of the
  /// step's collectives orders it; `store` must outlive this object.
  QuantizedParams(Backend backend, const Layout& layout, BucketStore& store, const std::vector<MasterPiece>& masters,
                  const std::vector<bool>& quantized, MakeFormat make);
  /// Fsdp's parameters (FormatContext::shard_storage): the format keeps this rank's
  /// shard of the data planes and phase 2 writes them in place, so quantize() is the
  /// whole publication; dispatched() and consume() are not used. `rank` within the
  /// layout's world; `exchange` runs the Max all-reduce (collective).
  QuantizedParams(Backend backend, const Layout& layout, int rank, ExchangeFn exchange,
                  const std::vector<MasterPiece>& masters, const std::vector<bool>& quantized, MakeFormat make);
  // The format refers to staging_: the object stays where it was built.
  QuantizedParams(const QuantizedParams&) = delete;
  QuantizedParams& operator=(const QuantizedParams&) = delete;
  /// Waits for the store's communication stream when a bucket gathers in place, so that
  /// no gather still writes the storage when it is freed.
  ~QuantizedParams();

  bool is_param(int param) const { return param_[static_cast<std::size_t>(param)]; }
  bool is_bucket(int bucket) const { return bucket_[static_cast<std::size_t>(bucket)].quantized; }
  /// True when quantized bucket `bucket` gathers in place into the storage
  /// (QuantizedFormat::gather_planes): its step never writes its gradient region.
  bool in_place(int bucket) const { return bucket_[static_cast<std::size_t>(bucket)].in_place; }
  /// True when some quantized bucket stages its gather through its gradient region (NVFP4):
  /// a forced gather then overwrites gradients.
  bool any_staged() const;
  bool any() const noexcept { return format_ != nullptr; }
  /// The format ("MXFP8", "NVFP4"; "quantized" when there is none).
  const char* name() const { return format_ ? format_->name() : "quantized"; }
  /// The format object, for its typed views (null when there is none).
  const QuantizedFormat* format() const { return format_.get(); }
  GatherState state(int bucket) const { return bucket_[static_cast<std::size_t>(bucket)].state; }
  /// The first quantized bucket that is not Idle, or -1.
  int first_pending() const;
  std::size_t storage_bytes() const { return format_ ? format_->storage_bytes() : 0; }

  /// Phase 1 of every quantized bucket of [first, last), the exchange all-reduce (one
  /// call for the run) and phase 2, after the work queued on `stream` (Adam). Every such
  /// bucket must be Idle. Does not start the all-gathers. partials_done: phase 1's
  /// values are already in the exchange buffers (the Adam pass emitted them), so phase 1
  /// is not run.
  void quantize(int first, int last, Stream stream, bool partials_done = false);
  /// The caller started the all-gathers of [first, last): quantized buckets -> InFlight.
  void dispatched(int first, int last);
  /// Lands and consumes every quantized bucket of [first, last) that is in flight:
  /// `stream` waits for its all-gather (InFlight -> Landed), the bytes are copied into
  /// the storage and the gradient region zeroed on `stream` (-> Consumed -> Idle). Runs
  /// of consecutive buckets share one copy launch and one memset. A bucket gathered in
  /// place (in_place) is only waited for: nothing is copied or zeroed.
  void consume(BucketStore& store, int first, int last, Stream stream);

 private:
  // One landing of a bucket: its byte copies in pieces_ and their bytes.
  struct Landing {
    std::int64_t begin = 0, end = 0, bytes = 0;
  };
  struct BucketInfo {
    bool quantized = false;
    bool in_place = false;  // gathers into the storage (QuantizedFormat::gather_planes)
    GatherState state = GatherState::Idle;
    Landing landing;  // its section of pieces_ (in bucket order)
  };

  bool mark(const std::vector<bool>& quantized);
  void make_format(int rank, const std::vector<MasterPiece>& masters, const std::vector<bool>& quantized,
                   MakeFormat make, bool shard_storage, MemoryKind gather_memory = MemoryKind::Device);
  void gather_in_place(BucketStore& store, bool registered);
  void wait_gather(BucketStore& store, int bucket, Stream stream);
  void warm_up();
  void advance(int bucket, GatherState to);
  void exchange(std::uint8_t* begin, std::uint8_t* end, Stream stream);

  Backend backend_;
  const Layout& layout_;
  ExchangeFn exchange_fn_;  // the Max all-reduce between the phases (the one way to it)
  std::vector<bool> param_;
  std::vector<BucketInfo> bucket_;
  std::vector<Staging> staging_;
  BucketStore* store_ = nullptr;  // DistributedAdam's: the in-place gathers' owner
  std::unique_ptr<QuantizedFormat> format_;
  DeviceBuffer pieces_;  // kernels::BytePiece table of every quantized bucket's landing
  // The format's gather memory registered with the communicator: declared after format_,
  // so deregistered before the memory is freed.
  std::vector<BufferRegistration> registrations_;
};

/// The exchange through `store`: BucketStore::all_reduce with Max, behind the
/// collectives already started on its communication stream (`store` must outlive it).
QuantizedParams::ExchangeFn store_exchange(BucketStore& store);

/// Bytes every QuantizedParams::consume of this process asked to land (the byte copies
/// staging -> storage) so far: tests see which bytes a step lands.
std::int64_t landed_bytes();

/// Bytes per rank of a quantized bucket's staged all-gather, as the store moves them.
std::int64_t staged_rank_bytes(const BucketStoreOptions& options, const Layout& layout, int bucket);

}  // namespace shardopt::detail
