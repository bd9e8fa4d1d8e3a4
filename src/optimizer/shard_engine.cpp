#include "optimizer/shard_engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <map>
#include <numeric>
#include <optional>
#include <string>

#include "comm/comm_impl.hpp"
#include "comm/deadline.hpp"
#include "core/check.hpp"
#include "kernels/adam/adam_amax.hpp"
#include "kernels/adam/adam_launch.hpp"
#include "kernels/common/convert.hpp"
#include "kernels/adam/step_control.hpp"
#include "quantized/phase_probe.hpp"
#include "core/trace.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

void validate(const AdamOptions& h, DType grad_dtype) {
  SHARDOPT_REQUIRE(is_float_storage(grad_dtype), ErrorCode::InvalidArgument,
                   std::string("grad_dtype ") + to_string(grad_dtype) + " is not one of f32, bf16, f16");
  SHARDOPT_REQUIRE(h.moment_dtype == DType::f32 || h.moment_dtype == DType::bf16 || h.moment_dtype == DType::q8_block,
                   ErrorCode::InvalidArgument,
                   std::string("moment_dtype is ") + to_string(h.moment_dtype) +
                       "; use f32, bf16 or q8_block (8-bit codes with a scale per block, docs/state_precision.md)");
  SHARDOPT_REQUIRE(h.clip_max_norm >= 0.0f, ErrorCode::InvalidArgument,
                   "clip_max_norm must be >= 0 (0 disables clipping)");
  SHARDOPT_REQUIRE(h.microbatches >= 1, ErrorCode::InvalidArgument, "microbatches must be >= 1");
  SHARDOPT_REQUIRE(h.beta1 >= 0.0 && h.beta1 < 1.0 && h.beta2 >= 0.0 && h.beta2 < 1.0,
                   ErrorCode::InvalidArgument, "beta1 and beta2 must lie in [0, 1)");
  SHARDOPT_REQUIRE(h.eps > 0.0 && std::isfinite(h.eps), ErrorCode::InvalidArgument, "eps must be positive and finite");
  SHARDOPT_REQUIRE(h.offload_fraction >= 0.0 && h.offload_fraction <= 1.0, ErrorCode::InvalidArgument,
                   "offload_fraction is " + std::to_string(h.offload_fraction) +
                       "; give the share of the optimizer state to keep in pinned host memory, in [0, 1] (0: all "
                       "on the GPU; docs/offload.md)");
  SHARDOPT_REQUIRE(h.offload_stage_numel > 0 && h.offload_stage_numel % kMomentBlock == 0, ErrorCode::InvalidArgument,
                   "offload_stage_numel is " + std::to_string(h.offload_stage_numel) + "; give a positive multiple of " +
                       std::to_string(kMomentBlock) + " (kMomentBlock) elements per staging slot");
}

void moment_layout_options(const AdamOptions& adam, int world, LayoutOptions& lo) {
  if (adam.moment_dtype != DType::q8_block) return;
  lo.alignment = std::lcm(lo.alignment, kMomentBlock);
  lo.pad_multiple = static_cast<std::int64_t>(world) * kMomentBlock;
}

namespace {

// Adam's moments leave the Muon pieces out (docs/muon.md, "Memory per rank"): in shard
// order, each run of Muon elements shifts the moments of the AdamW pieces after it down by
// its length rounded down to a multiple of `align`, so that every moment keeps its shard
// offset's alignment: 16 for the kernels' vector accesses, a whole block of 8-bit moments
// (kMomentBlock) so that their blocks stay the parameters'. Sets the shift of each AdamW
// chunk and piece, marks the Muon pieces, and returns the moment arrays' length.
std::int64_t compact_moments(const Layout& L, int buffer, int rank, const std::vector<AdamGroup>& groups,
                             std::int64_t align, std::vector<ShardChunk>& chunks, std::vector<ParamPiece>& pieces) {
  const auto is_muon = [&](std::int32_t g) {
    return groups[static_cast<std::size_t>(g)].algorithm == GroupAlgorithm::Muon;
  };
  std::map<std::int64_t, std::int64_t> shift_at;  // AdamW piece's shard offset -> its shift
  std::int64_t shift = 0, run = 0, end = 0;
  for (const Segment& seg : L.segments(buffer, rank)) {
    SHARDOPT_REQUIRE(seg.shard_offset >= end, ErrorCode::Internal, "a shard's segments are not in shard order");
    end = seg.shard_offset + seg.length;
    ParamPiece& ps = pieces[static_cast<std::size_t>(seg.param)];
    if (is_muon(seg.group)) {
      ps.muon = true;
      run += seg.length;
      continue;
    }
    shift += run / align * align;
    run = 0;
    ps.moment_shift = shift;
    shift_at[seg.shard_offset] = shift;
  }
  for (ShardChunk& c : chunks)
    if (!is_muon(c.group)) c.moment_shift = std::prev(shift_at.upper_bound(c.shard_offset))->second;
  return L.buffers()[static_cast<std::size_t>(buffer)].shard_numel - shift - run / align * align;
}

}  // namespace

ShardEngine::ShardEngine(Backend backend, const Layout& layout, int rank, EngineSettings settings)
    : backend_(backend), layout_(layout), rank_(rank), settings_(std::move(settings)) {
  validate(settings_.adam, settings_.grad_dtype);
  const Layout& L = layout_;
  SHARDOPT_REQUIRE(static_cast<int>(L.groups().size()) <= kMaxAdamGroups, ErrorCode::InvalidArgument,
                   "the specs use " + std::to_string(L.groups().size()) + " optimizer groups; at most " +
                       std::to_string(kMaxAdamGroups) + " are supported");
  for (const auto& [name, g] : settings_.adam.groups) {
    SHARDOPT_REQUIRE(std::find(L.groups().begin(), L.groups().end(), name) != L.groups().end(),
                     ErrorCode::InvalidArgument, "options name optimizer group '" + name + "', which no ParamSpec uses");
  }
  std::vector<AdamGroup> groups;  // by layout group index
  for (const auto& gname : L.groups()) {
    auto it = settings_.adam.groups.find(gname);
    groups.push_back(it != settings_.adam.groups.end() ? it->second : settings_.adam.default_group);
  }
  const bool offload = settings_.adam.offload_fraction > 0.0;
  if (offload) {
    for (const BufferLayout& buf : L.buffers())
      SHARDOPT_REQUIRE(buf.storage != kQuantizedStorage, ErrorCode::Unsupported,
                       settings_.options_name + "::offload_fraction > 0 with MXFP8 or NVFP4 parameters: their fused "
                       "quantizing passes read the master in place, so their state stays on the GPU so far. Use "
                       "offload_fraction 0 with a quantized param_format");
  }
  const std::vector<bool> offloaded = offloaded_buckets(L, settings_.adam.offload_fraction);
  std::vector<bool> host_params(L.params().size(), false);  // their buckets' state lives on the host
  for (std::size_t p = 0; p < L.params().size(); ++p)
    host_params[p] = offloaded[static_cast<std::size_t>(L.params()[p].bucket)];
  if (has_muon(groups)) muon_ = std::make_unique<MuonPass>(backend_, L, rank, groups, host_params);
  pieces_.resize(L.params().size());
  shards_.resize(L.buffers().size());
  const bool q8 = settings_.adam.moment_dtype == DType::q8_block;
  const std::int64_t moment_align = q8 ? kMomentBlock : 16;
  for (std::size_t b = 0; b < L.buffers().size(); ++b) {
    BufferShard& sh = shards_[b];
    const std::int64_t n = L.buffers()[b].shard_numel;
    // With offload the device arrays end where the first offloaded bucket starts.
    sh.split = n;
    for (int bk : L.buffers()[b].buckets)
      if (offloaded[static_cast<std::size_t>(bk)])
        sh.split = std::min(sh.split, L.buckets()[static_cast<std::size_t>(bk)].shard_offset);
    sh.chunks = shard_chunks(L, static_cast<int>(b), rank);
    if (settings_.shard_addressed)
      for (auto& c : sh.chunks) c.buffer_offset = c.shard_offset;
    for (const auto& seg : L.segments(static_cast<int>(b), rank)) {
      ParamPiece& ps = pieces_[static_cast<std::size_t>(seg.param)];
      ps.buffer = static_cast<int>(b);
      ps.param_offset = seg.param_offset;
      ps.shard_offset = seg.shard_offset;
      ps.length = seg.length;
      ps.buffer_offset = L.params()[static_cast<std::size_t>(seg.param)].offset + seg.param_offset;
      sh.real_numel += seg.length;
      if (seg.shard_offset < sh.split) sh.device_real += seg.length;
    }
    std::int64_t moment_numel = sh.split;  // n without offload
    if (muon_) {  // the norm covers every gradient; Adam skips the Muon groups' chunks
      moment_numel = compact_moments(L, static_cast<int>(b), rank, groups, moment_align, sh.chunks, pieces_);
      if (offload) {  // only the device part is compacted: the host arrays are indexed by shard offset
        for (ShardChunk& c : sh.chunks)
          if (c.shard_offset >= sh.split) c.moment_shift = 0;
        for (const auto& seg : L.segments(static_cast<int>(b), rank))
          if (seg.shard_offset >= sh.split) pieces_[static_cast<std::size_t>(seg.param)].moment_shift = 0;
        moment_numel = 0;
        for (const ShardChunk& c : sh.chunks)
          if (c.shard_offset < sh.split && groups[static_cast<std::size_t>(c.group)].algorithm != GroupAlgorithm::Muon)
            moment_numel = std::max(moment_numel, c.shard_offset + c.length - c.moment_shift);
        moment_numel = (moment_numel + moment_align - 1) / moment_align * moment_align;
      }
      sh.num_norm_chunks = static_cast<std::int64_t>(sh.chunks.size());
      sh.norm_chunks_dev = DeviceBuffer(backend_, sh.chunks.size() * sizeof(ShardChunk));
      copy_async(backend_, sh.norm_chunks_dev.data(), sh.chunks.data(), sh.chunks.size() * sizeof(ShardChunk), nullptr);
      std::erase_if(sh.chunks, [&](const ShardChunk& c) {
        return groups[static_cast<std::size_t>(c.group)].algorithm == GroupAlgorithm::Muon;
      });
    }
    // Only empty AdamW pieces: set pointers (a wholly offloaded buffer's device arrays stay empty).
    if (!sh.chunks.empty() && moment_numel == 0 && !offload) moment_numel = moment_align;
    if (q8) {
      SHARDOPT_REQUIRE(L.buffers()[b].storage != kQuantizedStorage, ErrorCode::Unsupported,
                       settings_.options_name +
                           "::moment_dtype q8_block: 8-bit moments apply to native parameters; MXFP8 and NVFP4 "
                           "parameters update through their own fused passes, which keep f32 or bf16 moments. Use "
                           "moment_dtype f32 or bf16 with a quantized param_format");
      for (const ShardChunk& c : sh.chunks)
        SHARDOPT_REQUIRE((c.shard_offset - c.moment_shift) % kMomentBlock == 0 && moment_numel % kMomentBlock == 0,
                         ErrorCode::Internal,
                         "8-bit moments need a layout whose parameter starts and shard slices are multiples of " +
                             std::to_string(kMomentBlock) + " elements (moment_layout_options)");
    }
    sh.chunks_dev = DeviceBuffer(backend_, sh.chunks.size() * sizeof(ShardChunk));
    copy_async(backend_, sh.chunks_dev.data(), sh.chunks.data(), sh.chunks.size() * sizeof(ShardChunk), nullptr);
    // The fp32 master: the whole shard, or with remainders only the Muon pieces (compact).
    sh.remainder = settings_.adam.master_storage == MasterStorage::bf16_remainder &&
                   L.buffers()[b].dtype == DType::bf16 && L.buffers()[b].storage != kQuantizedStorage;
    // With offload, the Muon pieces from the split on keep theirs in a host array (master_of).
    std::int64_t master_numel = sh.remainder ? 0 : sh.split;
    for (const auto& seg : L.segments(static_cast<int>(b), rank)) {
      ParamPiece& ps = pieces_[static_cast<std::size_t>(seg.param)];
      ps.remainder = sh.remainder && !ps.muon;
      std::int64_t& compact = ps.shard_offset < sh.split ? master_numel : sh.host_muon_master_numel;
      ps.master_offset = sh.remainder ? (ps.muon ? compact : 0) : ps.shard_offset;
      if (sh.remainder && ps.muon) compact += ps.length;
      if (ps.muon && ps.length > 0 && ps.shard_offset >= sh.split)
        sh.host_muon_ranges.emplace_back(ps.shard_offset, ps.shard_offset + ps.length);
    }
    if (sh.remainder) {
      sh.remainders = DeviceBuffer(backend_, static_cast<std::size_t>(sh.split) * sizeof(std::uint16_t));
      fill_zero_async(backend_, sh.remainders.data(), sh.remainders.bytes(), nullptr);
    }
    sh.master = DeviceBuffer(backend_, static_cast<std::size_t>(master_numel) * 4);
    sh.exp_avg = DeviceBuffer(backend_, static_cast<std::size_t>(moment_numel) * size_of(settings_.adam.moment_dtype));
    sh.exp_avg_sq = DeviceBuffer(backend_, static_cast<std::size_t>(moment_numel) * size_of(settings_.adam.moment_dtype));
    fill_zero_async(backend_, sh.master.data(), sh.master.bytes(), nullptr);
    fill_zero_async(backend_, sh.exp_avg.data(), sh.exp_avg.bytes(), nullptr);
    fill_zero_async(backend_, sh.exp_avg_sq.data(), sh.exp_avg_sq.bytes(), nullptr);
    sh.q8 = q8;
    if (q8) {  // one scale per block of each moment; zero scales decode every byte to 0
      for (DeviceBuffer* s : {&sh.exp_avg_scales, &sh.exp_avg_sq_scales}) {
        *s = DeviceBuffer(backend_, static_cast<std::size_t>(moment_numel / kMomentBlock) * sizeof(float));
        fill_zero_async(backend_, s->data(), s->bytes(), nullptr);
      }
    }

    AdamConfig& cfg = sh.config;
    cfg.beta1 = settings_.adam.beta1;
    cfg.beta2 = settings_.adam.beta2;
    cfg.eps = settings_.adam.eps;
    cfg.decoupled_weight_decay = settings_.adam.decoupled_weight_decay;
    cfg.grad_dtype = settings_.grad_dtype;
    cfg.param_dtype = L.buffers()[b].dtype;
    sh.param_dtype = L.buffers()[b].dtype;
    cfg.write_params = true;
    cfg.moment_dtype = settings_.adam.moment_dtype;
    cfg.master_storage = sh.remainder ? MasterStorage::bf16_remainder : MasterStorage::fp32;
    cfg.groups = groups;
    ShardPointers& p = sh.ptrs;
    p.chunks = sh.chunks_dev.as<ShardChunk>();
    p.num_chunks = static_cast<std::int64_t>(sh.chunks.size());
    p.shard_numel = n;
    p.moment_numel = moment_numel;
    p.master = sh.remainder ? nullptr : sh.master.as<float>();
    p.remainders = sh.remainder ? sh.remainders.as<std::uint16_t>() : nullptr;
    p.exp_avg = sh.exp_avg.data();
    p.exp_avg_sq = sh.exp_avg_sq.data();
    p.exp_avg_scales = q8 ? sh.exp_avg_scales.as<float>() : nullptr;
    p.exp_avg_sq_scales = q8 ? sh.exp_avg_sq_scales.as<float>() : nullptr;
    sh.device_chunks = static_cast<std::size_t>(
        std::lower_bound(sh.chunks.begin(), sh.chunks.end(), sh.split,
                         [](const ShardChunk& c, std::int64_t v) { return c.shard_offset < v; }) -
        sh.chunks.begin());
  }
  if (offload) {
    std::vector<StateOffload::BufferInfo> infos;
    for (const BufferShard& sh : shards_)
      infos.push_back({&sh.chunks, sh.remainder, sh.split, sh.host_muon_ranges, sh.host_muon_master_numel});
    offload_ = std::make_unique<StateOffload>(backend_, L, offloaded, infos, settings_.adam.moment_dtype,
                                              settings_.adam.offload_stage_numel,
                                              muon_ ? muon_->host_momentum_numel() : 0);
    if (muon_ && !offload_->failed()) muon_->place_host_momentum(offload_->muon_momentum());
    for (int bk = 0; bk < static_cast<int>(L.buckets().size()); ++bk) {
      if (!offloaded[static_cast<std::size_t>(bk)]) continue;
      const auto [c0, c1] = bucket_chunks(bk);
      shards_[static_cast<std::size_t>(L.buckets()[static_cast<std::size_t>(bk)].buffer)].offloaded.emplace_back(c0, c1, bk);
    }
  }
  SHARDOPT_REQUIRE(settings_.adam.master_storage != MasterStorage::bf16_remainder ||
                       std::any_of(shards_.begin(), shards_.end(), [](const BufferShard& sh) { return sh.remainder; }),
                   ErrorCode::InvalidArgument,
                   settings_.options_name +
                       "::master_storage is bf16_remainder, but no parameter is a native bf16 tensor: remainders "
                       "complete a bf16 parameter to its fp32 master (f32 and f16 parameters, and MXFP8 / NVFP4 "
                       "parameters, whose master is their only full-precision copy, keep an fp32 master). Give "
                       "the parameters dtype bf16 (param_dtype) or use MasterStorage::fp32");
  scalars_ = DeviceBuffer(backend_, sizeof(StepScalars));
  const StepScalars init{};
  copy_async(backend_, scalars_.data(), &init, sizeof init, nullptr);
  microbatch_ = DeviceBuffer(backend_, sizeof(MicrobatchState));
  MicrobatchState mb{};
  mb.count = settings_.adam.microbatches;
  mb.last = settings_.adam.microbatches == 1 ? 1 : 0;
  copy_async(backend_, microbatch_.data(), &mb, sizeof mb, nullptr);
  slots_ = DeviceBuffer(backend_, 2 * sizeof(float), MemoryKind::Pinned);
  slots_.as<float>()[0] = settings_.adam.lr_schedule.peak;  // lr for LrSchedule::Kind::Host until set_lr
  slots_.as<float>()[1] = 1.0f;                     // inverse loss scale
  readback_ = DeviceBuffer(backend_, sizeof(StepScalars), MemoryKind::Pinned);
  synchronize(backend_, nullptr);
}

void ShardEngine::bind(int buffer, const void* grads, void* params) {
  SHARDOPT_REQUIRE(buffer >= 0 && buffer < static_cast<int>(shards_.size()), ErrorCode::Internal, "bad buffer index");
  BufferShard& sh = shards_[static_cast<std::size_t>(buffer)];
  SHARDOPT_REQUIRE(!sh.remainder || params != nullptr, ErrorCode::Internal,
                   "a buffer whose master is kept as remainders was bound without its bf16 parameters");
  sh.ptrs.grads = grads;
  sh.ptrs.params = params;
  sh.config.write_params = params != nullptr;
  sh.bound = true;
  if (offload_) offload_->bind(buffer, &sh.config, grads, params);
  if (muon_ && params == nullptr)
    for (const MuonMatrixInfo& mi : muon_->matrices())
      SHARDOPT_REQUIRE(pieces_[static_cast<std::size_t>(mi.param)].buffer != buffer || pieces_[static_cast<std::size_t>(mi.param)].length == 0,
                       ErrorCode::Unsupported,
                       "parameter '" + layout_.specs()[static_cast<std::size_t>(mi.param)].name +
                           "' is in a Muon group but stored in a quantized format (MXFP8 / NVFP4); Muon supports "
                           "native parameters only so far: use ParamFormat::Native or an AdamW group");
  // Once every buffer is bound, the Muon pass learns where its pieces live (construction:
  // nothing of it is set up inside a step, which may be captured).
  if (muon_ && std::all_of(shards_.begin(), shards_.end(), [](const BufferShard& b) { return b.bound; })) bind_muon();
}

void ShardEngine::bind_muon() {
  std::vector<MuonPieceStorage> st(pieces_.size());
  for (std::size_t p = 0; p < pieces_.size(); ++p) {
    const ParamPiece& ps = pieces_[p];
    if (ps.length == 0) continue;
    const BufferShard& sh = shards_[static_cast<std::size_t>(ps.buffer)];
    st[p].grad = static_cast<const char*>(sh.ptrs.grads) + storage_offset(ps) * size_of(settings_.grad_dtype);
    st[p].master = master_of(static_cast<int>(p));
    st[p].param = sh.ptrs.params == nullptr ? nullptr
                                            : static_cast<char*>(sh.ptrs.params) + storage_offset(ps) * size_of(sh.param_dtype);
    st[p].param_dtype = sh.param_dtype;
    st[p].param_offset = ps.param_offset;
  }
  muon_->bind(st, settings_.grad_dtype);
}

void ShardEngine::check_muon_agreement(const Communicator& comm) const {
  if (!muon_ || comm.size() == 1) return;
  const std::vector<std::uint64_t> all = comm.all_gather_value(muon_->plan_hash());
  for (std::size_t r = 1; r < all.size(); ++r)
    SHARDOPT_REQUIRE(all[r] == all[0], ErrorCode::LayoutMismatch,
                     "rank " + std::to_string(r) + " computed other Muon matrices or home ranks than rank 0; give "
                     "every rank the same specs and options");
}

float* ShardEngine::master_of(int param) const {
  const ParamPiece& ps = piece(param);
  if (ps.length == 0 || ps.remainder) return nullptr;
  const BufferShard& sh = shards_[static_cast<std::size_t>(ps.buffer)];
  if (sh.remainder) {  // a Muon piece's compact fp32 master: on the device, or offloaded
    float* const compact = offload_ && ps.shard_offset >= sh.split ? offload_->muon_master(ps.buffer) : sh.master.as<float>();
    return compact + ps.master_offset;
  }
  const StateArrays a = arrays_at(static_cast<std::size_t>(ps.buffer), ps.shard_offset);
  return a.master + (ps.master_offset - a.begin);
}

bool ShardEngine::has_staged_state() const noexcept {
  return std::any_of(shards_.begin(), shards_.end(), [](const BufferShard& sh) { return sh.remainder || sh.q8; });
}

template <class F>
void ShardEngine::for_own_ranges(std::size_t b, F&& f) const {
  const Layout& L = layout_;
  for (int bk : L.buffers()[b].buckets) {
    const Range own = L.shard_range(bk, rank_);
    const std::int64_t shard_offset = L.buckets()[static_cast<std::size_t>(bk)].shard_offset;
    f(settings_.shard_addressed ? shard_offset : own.begin, shard_offset, own.size());
  }
}

void ShardEngine::publish_master(Stream stream) {
  const Layout& L = layout_;
  for (std::size_t b = 0; b < L.buffers().size(); ++b) {
    BufferShard& sh = shards_[b];
    if (sh.ptrs.params == nullptr) continue;
    const DType dt = L.buffers()[b].dtype;
    auto* params = static_cast<char*>(sh.ptrs.params);
    if (sh.remainder) {
      // A staged master (a loaded checkpoint) goes back into the parameters and their
      // remainders; without one the parameters already are the master.
      if (sh.staging) {
        for_own_ranges(b, [&](std::int64_t dst, std::int64_t shard, std::int64_t n) {
          const StateArrays a = arrays_at(b, shard);
          kernels::remainder_split(sh.staging.as<float>() + shard, reinterpret_cast<std::uint16_t*>(params) + dst,
                                   a.remainders + (shard - a.begin), n, backend_, stream);
        });
      }
      // The Muon pieces keep an fp32 master: their parameters are it, rounded to nearest even.
      for (const ParamPiece& ps : pieces_)
        if (ps.buffer == static_cast<int>(b) && ps.muon && ps.length > 0)
          kernels::convert(master_of(static_cast<int>(&ps - pieces_.data())), DType::f32,
                           params + storage_offset(ps) * size_of(dt), dt, ps.length, backend_, stream);
      continue;
    }
    for_own_ranges(b, [&](std::int64_t dst, std::int64_t shard, std::int64_t n) {
      const StateArrays a = arrays_at(b, shard);
      kernels::convert(a.master + (shard - a.begin), DType::f32, params + static_cast<std::size_t>(dst) * size_of(dt),
                       dt, n, backend_, stream);
    });
  }
  // Staged 8-bit moments (a loaded checkpoint): quantized once, by blocks (the device
  // part, and the offloaded part into the host arrays).
  for (std::size_t b = 0; b < shards_.size(); ++b) {
    BufferShard& sh = shards_[b];
    if (!sh.moment_staging[0]) continue;
    for_state_parts(b, [&](const StateArrays& a, std::int64_t from, std::int64_t n) {
      kernels::q8_encode(sh.moment_staging[0].as<float>() + from, static_cast<std::uint8_t*>(a.exp_avg) + (from - a.begin),
                         a.exp_avg_scales + (from - a.begin) / kMomentBlock, n, false, backend_, stream);
      kernels::q8_encode(sh.moment_staging[1].as<float>() + from,
                         static_cast<std::uint8_t*>(a.exp_avg_sq) + (from - a.begin),
                         a.exp_avg_sq_scales + (from - a.begin) / kMomentBlock, n, true, backend_, stream);
    });
  }
  if (std::any_of(shards_.begin(), shards_.end(),
                  [](const BufferShard& sh) { return bool(sh.staging) || bool(sh.moment_staging[0]); })) {
    synchronize(backend_, stream);  // the split and the quantize have read the staging arrays
    drop_staged_master();
  }
  initialized_ = true;
}

void ShardEngine::init_master(Stream stream) {
  const Layout& L = layout_;
  for (std::size_t b = 0; b < L.buffers().size(); ++b) {
    BufferShard& sh = shards_[b];
    const DType dt = L.buffers()[b].dtype;
    const auto* params = static_cast<const char*>(sh.ptrs.params);
    if (params == nullptr) continue;
    if (sh.remainder) {  // the bf16 parameters are the master exactly: zero remainders
      fill_zero_async(backend_, sh.remainders.data(), sh.remainders.bytes(), stream);
      if (offload_ && sh.split < L.buffers()[b].shard_numel) {  // the host part: written by the host, once the stream is idle
        synchronize(backend_, stream);
        std::memset(offload_->host(static_cast<int>(b)).remainders, 0,
                    static_cast<std::size_t>(L.buffers()[b].shard_numel - sh.split) * sizeof(std::uint16_t));
      }
      for (const ParamPiece& ps : pieces_)
        if (ps.buffer == static_cast<int>(b) && ps.muon && ps.length > 0)
          kernels::convert(params + storage_offset(ps) * size_of(dt), dt, master_of(static_cast<int>(&ps - pieces_.data())),
                           DType::f32, ps.length, backend_, stream);
      continue;
    }
    for_own_ranges(b, [&](std::int64_t src, std::int64_t shard, std::int64_t n) {
      const StateArrays a = arrays_at(b, shard);
      kernels::convert(params + static_cast<std::size_t>(src) * size_of(dt), dt, a.master + (shard - a.begin),
                       DType::f32, n, backend_, stream);
    });
  }
  initialized_ = true;
}

void ShardEngine::stage_master(Stream stream) {
  for (std::size_t b = 0; b < shards_.size(); ++b) {
    BufferShard& sh = shards_[b];
    if (!sh.q8 || sh.moment_staging[0]) continue;
    SHARDOPT_REQUIRE(!is_capturing(backend_, stream), ErrorCode::CaptureRefused,
                     "a checkpoint of 8-bit moments allocates fp32 staging arrays; save or load outside a capture");
    const std::int64_t n = offload_ ? layout_.buffers()[b].shard_numel : sh.ptrs.moment_numel;
    for (DeviceBuffer& s : sh.moment_staging) s = DeviceBuffer(backend_, static_cast<std::size_t>(n) * sizeof(float));
    for_state_parts(b, [&](const StateArrays& a, std::int64_t from, std::int64_t count) {
      kernels::q8_decode(static_cast<const std::uint8_t*>(a.exp_avg) + (from - a.begin),
                         a.exp_avg_scales + (from - a.begin) / kMomentBlock, sh.moment_staging[0].as<float>() + from,
                         count, false, backend_, stream);
      kernels::q8_decode(static_cast<const std::uint8_t*>(a.exp_avg_sq) + (from - a.begin),
                         a.exp_avg_sq_scales + (from - a.begin) / kMomentBlock, sh.moment_staging[1].as<float>() + from,
                         count, true, backend_, stream);
    });
  }
  for (std::size_t b = 0; b < shards_.size(); ++b) {
    BufferShard& sh = shards_[b];
    if (!sh.remainder || sh.staging) continue;
    SHARDOPT_REQUIRE(!is_capturing(backend_, stream), ErrorCode::CaptureRefused,
                     "a checkpoint of remainder-kept masters allocates a staging array; save or load outside a capture");
    sh.staging = DeviceBuffer(backend_, static_cast<std::size_t>(sh.ptrs.shard_numel) * sizeof(float));
    const auto* params = static_cast<const std::uint16_t*>(sh.ptrs.params);
    for_own_ranges(b, [&](std::int64_t src, std::int64_t shard, std::int64_t n) {
      const StateArrays a = arrays_at(b, shard);
      kernels::remainder_join(params + src, a.remainders + (shard - a.begin), sh.staging.as<float>() + shard, n,
                              backend_, stream);
    });
  }
}

void ShardEngine::drop_staged_master() noexcept {
  for (BufferShard& sh : shards_) {
    sh.staging = DeviceBuffer();
    for (DeviceBuffer& s : sh.moment_staging) s = DeviceBuffer();
  }
}

DType ShardEngine::checkpoint_moment_dtype() const noexcept {
  return settings_.adam.moment_dtype == DType::q8_block ? DType::f32 : settings_.adam.moment_dtype;
}

void ShardEngine::throw_not_initialized(std::string_view call, std::string_view init_calls) {
  throw Error(ErrorCode::InvalidState,
              std::string(call) +
                  " before the fp32 master was initialized: it is still zero, and a step would overwrite the "
                  "weights written into the parameters with values computed from it. Call " +
                  std::string(init_calls) +
                  " once after writing the initial values (a trainer that wants zeros calls it too), or load a "
                  "checkpoint");
}

void ShardEngine::step(const Communicator& norm_comm, Stream stream) {
  begin_step(norm_comm, stream);
  for (std::size_t b = 0; b < shards_.size(); ++b) apply(static_cast<int>(b), 0, shards_[b].chunks.size(), stream);
  end_step(stream);
}

void ShardEngine::end_step(Stream stream) {
  if (offload_) offload_->finish(stream);
}

void ShardEngine::apply(int buffer, std::size_t first, std::size_t last, Stream stream) {
  const BufferShard& sh = shards_[static_cast<std::size_t>(buffer)];
  if (offload_) {  // offloaded buckets were updated by the offload's stream: wait for those in range
    for (const auto& [c0, c1, bucket] : sh.offloaded)
      if (c0 < last && first < c1) offload_->wait_bucket(bucket, stream);
    last = std::min(last, sh.device_chunks);
  }
  if (first >= last) return;
  SHARDOPT_TRACE("shardopt/adam");
  ShardPointers p = sh.ptrs;
  p.chunks = sh.ptrs.chunks + first;
  p.num_chunks = static_cast<std::int64_t>(last - first);
  if (offload_) p.shard_numel = sh.split;  // the device arrays' length (the moments' is already)
  phase_mark("adam", stream);
  if (sh.amax_chunks) {
    kernels::adam_step_apply_emitting(sh.config, p, sh.amax_chunks.as<kernels::AdamAmaxChunk>() + first, scalars(),
                                      backend_, stream);
  } else {
    adam_step_apply(sh.config, p, scalars(), backend_, stream);
  }
  phase_mark("after adam", stream);
}

bool ShardEngine::emit_amaxes(int buffer,
                              const std::function<std::optional<kernels::AdamAmaxChunk>(int param)>& target) {
  SHARDOPT_REQUIRE(buffer >= 0 && buffer < static_cast<int>(shards_.size()), ErrorCode::Internal, "bad buffer index");
  BufferShard& sh = shards_[static_cast<std::size_t>(buffer)];
  // This rank's pieces of the buffer, by shard offset: each chunk lies in one of them.
  std::map<std::int64_t, int> by_offset;
  for (std::size_t p = 0; p < pieces_.size(); ++p)
    if (pieces_[p].buffer == buffer && pieces_[p].length > 0) by_offset[pieces_[p].shard_offset] = static_cast<int>(p);
  std::vector<kernels::AdamAmaxChunk> table(sh.chunks.size());
  std::map<int, std::int64_t> covered;  // per emitting parameter, its elements in Adam's chunks
  for (const auto& [offset, p] : by_offset)
    if (target(p)) covered[p] = 0;
  for (std::size_t c = 0; c < sh.chunks.size(); ++c) {
    const ShardChunk& ch = sh.chunks[c];
    const auto it = std::prev(by_offset.upper_bound(ch.shard_offset));
    const ParamPiece& ps = pieces_[static_cast<std::size_t>(it->second)];
    const std::optional<kernels::AdamAmaxChunk> t = target(it->second);
    if (!t) continue;
    table[c] = *t;
    table[c].first = ps.param_offset + (ch.shard_offset - ps.shard_offset);
    covered[it->second] += ch.length;
  }
  for (const auto& [p, n] : covered)
    if (n != pieces_[static_cast<std::size_t>(p)].length) return false;
  if (covered.empty()) return true;  // nothing of this rank's shard to emit
  sh.amax_chunks = DeviceBuffer(backend_, table.size() * sizeof(kernels::AdamAmaxChunk));
  copy_async(backend_, sh.amax_chunks.data(), table.data(), sh.amax_chunks.bytes(), nullptr);
  synchronize(backend_, nullptr);
  return true;
}

const AdamConfig& ShardEngine::adam_config(int buffer) const {
  return shards_.at(static_cast<std::size_t>(buffer)).config;
}

ShardPointers ShardEngine::adam_pointers(int buffer) const {
  ShardPointers p = shards_.at(static_cast<std::size_t>(buffer)).ptrs;
  p.chunks = nullptr;
  p.num_chunks = 0;
  return p;
}

std::optional<kernels::AdamMxfp8Place> ShardEngine::adam_place(int param) const {
  const ParamPiece& ps = pieces_.at(static_cast<std::size_t>(param));
  if (ps.length == 0) return std::nullopt;
  const auto& chunks = shards_[static_cast<std::size_t>(ps.buffer)].chunks;
  // The chunks of the piece: they must cover it, in one group, at one buffer distance.
  auto it = std::lower_bound(chunks.begin(), chunks.end(), ps.shard_offset,
                             [](const ShardChunk& c, std::int64_t v) { return c.shard_offset < v; });
  if (it == chunks.end() || it->shard_offset != ps.shard_offset) return std::nullopt;
  kernels::AdamMxfp8Place place;
  place.shard_offset = ps.shard_offset;
  place.buffer_offset = it->buffer_offset;
  place.group = it->group;
  place.moment_shift = it->moment_shift;
  std::int64_t at = ps.shard_offset;
  for (; it != chunks.end() && at < ps.shard_offset + ps.length; ++it) {
    // One moment shift for the piece (compact moments after Muon pieces): the fused
    // kernel shifts its moment index as the plain pass does.
    if (it->shard_offset != at || it->group != place.group || it->moment_shift != place.moment_shift ||
        it->buffer_offset - it->shard_offset != place.buffer_offset - place.shard_offset)
      return std::nullopt;
    at += it->length;
  }
  if (at != ps.shard_offset + ps.length) return std::nullopt;
  return place;
}

void ShardEngine::exclude_from_adam(int buffer, const std::vector<ShardChunk>& bands) {
  BufferShard& sh = shards_.at(static_cast<std::size_t>(buffer));
  if (bands.empty()) return;
  if (!sh.norm_chunks_dev) {  // the norm keeps every chunk
    sh.num_norm_chunks = static_cast<std::int64_t>(sh.chunks.size());
    sh.norm_chunks_dev = DeviceBuffer(backend_, sh.chunks.size() * sizeof(ShardChunk));
    copy_async(backend_, sh.norm_chunks_dev.data(), sh.chunks.data(), sh.chunks.size() * sizeof(ShardChunk), nullptr);
  }
  sh.chunks = kernels::adam_mxfp8_plain_chunks(sh.chunks, bands);
  sh.chunks_dev = DeviceBuffer(backend_, std::max<std::size_t>(1, sh.chunks.size()) * sizeof(ShardChunk));
  if (!sh.chunks.empty())
    copy_async(backend_, sh.chunks_dev.data(), sh.chunks.data(), sh.chunks.size() * sizeof(ShardChunk), nullptr);
  sh.ptrs.chunks = sh.chunks_dev.as<ShardChunk>();
  sh.ptrs.num_chunks = static_cast<std::int64_t>(sh.chunks.size());
  synchronize(backend_, nullptr);
}

std::pair<std::size_t, std::size_t> ShardEngine::bucket_chunks(int bucket) const {
  const Bucket& bk = layout_.buckets()[static_cast<std::size_t>(bucket)];
  const auto& chunks = shards_[static_cast<std::size_t>(bk.buffer)].chunks;
  const std::int64_t lo = bk.shard_offset, hi = bk.shard_offset + bk.range.size() / layout_.world_size();
  auto first = std::lower_bound(chunks.begin(), chunks.end(), lo,
                                [](const ShardChunk& c, std::int64_t v) { return c.shard_offset < v; });
  auto last = std::lower_bound(first, chunks.end(), hi,
                               [](const ShardChunk& c, std::int64_t v) { return c.shard_offset < v; });
  return {static_cast<std::size_t>(first - chunks.begin()), static_cast<std::size_t>(last - chunks.begin())};
}

void ShardEngine::begin_step(const Communicator& norm_comm, Stream stream) {
  // Offloaded state: its first stages upload while the norm runs (they need no gradient).
  if (offload_) offload_->begin(stream);
  SHARDOPT_TRACE("shardopt/norm");
  phase_mark("norm", stream);
  StepScalars* sc = scalars();
  // Per-step values, all on the device: lr, inverse loss scale, fresh norm accumulators.
  if (settings_.adam.lr_schedule.kind == LrSchedule::Kind::Host) {
    copy_async(backend_, &sc->lr, slots_.as<float>(), sizeof(float), stream);
  } else {
    kernels::apply_lr_schedule(settings_.adam.lr_schedule, nullptr, sc, backend_, stream);
  }
  copy_async(backend_, &sc->inv_loss_scale, slots_.as<float>() + 1, sizeof(float), stream);
  // Fresh per-step results: grad_sumsq, nonfinite, grad_norm and found_inf are adjacent.
  static_assert(offsetof(StepScalars, found_inf) + sizeof(std::int32_t) - offsetof(StepScalars, grad_sumsq) ==
                4 * sizeof(float));
  fill_zero_async(backend_, &sc->grad_sumsq, 4 * sizeof(float), stream);
  // Global norm and found-inf: shard partial sums, one all-reduce of two adjacent floats.
  for (const auto& sh : shards_) {
    ShardPointers p = sh.ptrs;
    if (sh.norm_chunks_dev) {
      p.chunks = sh.norm_chunks_dev.as<ShardChunk>();
      p.num_chunks = sh.num_norm_chunks;
    }
    accumulate_grad_sumsq(settings_.grad_dtype, p, sc, backend_, stream);
  }
  if (norm_comm.size() > 1) {
    std::optional<OperationLabel> label;  // names it if a host-backend wait times out
    if (backend_ == Backend::Host) label.emplace("gradient norm and found-inf all-reduce");
    norm_comm.all_reduce(&sc->grad_sumsq, 2, DType::f32, ReduceOp::Sum, stream);
  }
  finalize_grad_norm(settings_.adam.clip_max_norm, sc, backend_, stream);
  adam_step_prologue(shards_.front().config, sc, backend_, stream);
  if (offload_) offload_->run(stream, sc);  // every offloaded stage, beside the device part's Adam
  if (muon_) {  // Muon's matrices: exchange, orthogonalize at home, apply (docs/muon.md)
    muon_->step(norm_comm, sc, stream);
  }
}

const ParamPiece& ShardEngine::piece(int param) const {
  SHARDOPT_REQUIRE(param >= 0 && param < static_cast<int>(pieces_.size()), ErrorCode::OutOfRange,
                   "param index " + std::to_string(param) + " is out of range [0, " + std::to_string(pieces_.size()) +
                       ")");
  return pieces_[static_cast<std::size_t>(param)];
}

ShardView ShardEngine::piece_view(int param, const DeviceBuffer& buf, DType dtype, std::int64_t shift) const {
  return piece_view(param, buf.data(), dtype, shift);
}

ShardView ShardEngine::piece_view(int param, const void* base, DType dtype, std::int64_t origin) const {
  const ParamPiece& ps = piece(param);
  ShardView v;
  v.dtype = dtype;
  v.shape = {ps.length};
  v.strides = {1};
  v.param_offset = ps.param_offset;
  v.data = ps.length == 0 ? nullptr
                          : const_cast<char*>(static_cast<const char*>(base)) +
                                static_cast<std::size_t>(ps.shard_offset - origin) * size_of(dtype);
  return v;
}

StateArrays ShardEngine::arrays_at(std::size_t b, std::int64_t at) const {
  const BufferShard& sh = shards_[b];
  if (offload_ && at >= sh.split) return offload_->host(static_cast<int>(b));
  StateArrays a;
  a.master = sh.master.as<float>();
  a.remainders = sh.remainders.as<std::uint16_t>();
  a.exp_avg = sh.exp_avg.data();
  a.exp_avg_sq = sh.exp_avg_sq.data();
  a.exp_avg_scales = sh.exp_avg_scales.as<float>();
  a.exp_avg_sq_scales = sh.exp_avg_sq_scales.as<float>();
  return a;
}

template <class F>
void ShardEngine::for_state_parts(std::size_t b, F&& f) const {
  const BufferShard& sh = shards_[b];
  const std::int64_t n = layout_.buffers()[b].shard_numel;
  if (!offload_) {
    f(arrays_at(b, 0), std::int64_t{0}, sh.ptrs.moment_numel);
    return;
  }
  if (sh.ptrs.moment_numel > 0) f(arrays_at(b, 0), std::int64_t{0}, sh.ptrs.moment_numel);
  if (sh.split < n) f(arrays_at(b, sh.split), sh.split, n - sh.split);
}

ShardView ShardEngine::master_view(int param) const {
  const ParamPiece& ps = piece(param);
  const BufferShard& sh = shards_[static_cast<std::size_t>(ps.buffer)];
  if (!ps.remainder) return piece_view(param, master_of(param), DType::f32, ps.shard_offset);
  SHARDOPT_REQUIRE(sh.staging, ErrorCode::Unsupported,
                   "parameter '" + layout_.specs()[static_cast<std::size_t>(param)].name +
                       "' keeps no fp32 master (master_storage = bf16_remainder): its master is the bf16 parameter "
                       "plus a 16-bit remainder, rebuilt inside the step and in checkpoints. Write its bf16 "
                       "parameter and call init_master, or load a checkpoint; shard_param shows it");
  return piece_view(param, sh.staging, DType::f32);
}
// A Muon parameter has no Adam moments: an empty view (no elements, no data).
ShardView ShardEngine::moment_view(int param, int which) const {
  const ParamPiece& ps = piece(param);
  const BufferShard& sh = shards_[static_cast<std::size_t>(ps.buffer)];
  const bool staged = sh.q8 && sh.moment_staging[which];  // 8-bit moments decoded for a checkpoint
  const DType dtype = staged ? DType::f32 : settings_.adam.moment_dtype;
  if (staged && !ps.muon) return piece_view(param, sh.moment_staging[which], dtype, ps.moment_shift);
  if (!ps.muon) {
    const StateArrays a = arrays_at(static_cast<std::size_t>(ps.buffer), ps.shard_offset);
    return piece_view(param, which == 0 ? a.exp_avg : a.exp_avg_sq, dtype, a.begin + ps.moment_shift);
  }
  ShardView v;
  v.dtype = dtype;
  v.shape = {0};
  v.strides = {1};
  v.param_offset = ps.param_offset;
  return v;
}
ShardView ShardEngine::remainder_view(int param) const {
  const ParamPiece& ps = piece(param);
  if (ps.remainder) {
    const StateArrays a = arrays_at(static_cast<std::size_t>(ps.buffer), ps.shard_offset);
    return piece_view(param, a.remainders, DType::u16, a.begin);
  }
  ShardView v;
  v.dtype = DType::u16;
  v.shape = {0};
  v.strides = {1};
  v.param_offset = ps.param_offset;
  return v;
}
ShardView ShardEngine::exp_avg_view(int param) const { return moment_view(param, 0); }
ShardView ShardEngine::exp_avg_sq_view(int param) const { return moment_view(param, 1); }

void ShardEngine::set_step(std::int64_t step, Stream stream) {
  // Through a pinned slot: a pageable source could be overwritten before the copy runs.
  step_slot_ = DeviceBuffer(backend_, sizeof(std::int64_t), MemoryKind::Pinned);
  *step_slot_.as<std::int64_t>() = step;
  copy_async(backend_, &scalars()->step, step_slot_.data(), sizeof(std::int64_t), stream);
  synchronize(backend_, stream);
}

void ShardEngine::set_loss_scale(float scale) {
  SHARDOPT_REQUIRE(scale > 0.0f, ErrorCode::InvalidArgument, "loss scale must be positive");
  slots_.as<float>()[1] = 1.0f / scale;
}

StepScalars ShardEngine::read_scalars(const Communicator& comm, Stream stream) const {
  SHARDOPT_REQUIRE(!is_capturing(backend_, stream), ErrorCode::InvalidState,
                   "read_scalars() synchronizes and cannot run inside a capture; read device_scalars() from a "
                   "kernel instead, or call it after replay");
  copy_async(backend_, readback_.data(), scalars(), sizeof(StepScalars), stream);
  CommAccess::require(comm).synchronize(stream, "read_scalars");
  StepScalars out;
  std::memcpy(&out, readback_.data(), sizeof out);
  return out;
}

void ShardEngine::advance_microbatch(Stream stream) { kernels::advance_microbatch(microbatch(), backend_, stream); }

void ShardEngine::agree_offload(const Communicator& comm) const {
  const bool mine = offload_ && offload_->failed();
  const std::int64_t bytes = offload_ ? offload_->host_bytes() : 0;
  const std::vector<std::uint64_t> failed =
      comm.size() > 1 ? comm.all_gather_value(mine ? 1 : 0) : std::vector<std::uint64_t>{mine ? 1u : 0u};
  const auto first = std::find(failed.begin(), failed.end(), std::uint64_t{1});
  if (first == failed.end()) return;
  const std::string option = settings_.options_name + "::offload_fraction " + std::to_string(settings_.adam.offload_fraction);
  const std::string advice = ". Lower offload_fraction, free host memory, or raise the locked-memory limit (ulimit -l)";
  if (mine) {
    std::string why;
    try {
      std::rethrow_exception(offload_->failed());
    } catch (const std::exception& e) {
      why = e.what();
    }
    throw Error(ErrorCode::OutOfMemory, option + " keeps " + std::to_string(bytes) +
                                            " bytes of this rank's optimizer state in pinned host memory, which the "
                                            "host refused (" + why + "); nothing was built" + advice);
  }
  throw Error(ErrorCode::OutOfMemory, option + ": rank " + std::to_string(first - failed.begin()) +
                                          " could not pin the host memory of its offloaded optimizer state, so no "
                                          "rank builds the optimizer" + advice);
}

void ShardEngine::add_memory(MemoryReport& r) const {
  const std::int64_t msize = static_cast<std::int64_t>(size_of(settings_.adam.moment_dtype));
  for (const auto& sh : shards_) {
    r.master += static_cast<std::int64_t>(sh.master.bytes());
    r.remainders += static_cast<std::int64_t>(sh.remainders.bytes());
    r.moments += static_cast<std::int64_t>(sh.exp_avg.bytes() + sh.exp_avg_sq.bytes());
    r.moment_scales += static_cast<std::int64_t>(sh.exp_avg_scales.bytes() + sh.exp_avg_sq_scales.bytes());
    // Device padding: the shard's below the offload split (all of it without offload).
    r.padding += (sh.split - sh.device_real) * ((sh.remainder ? 2 : 4) + 2 * msize);
  }
  if (offload_) {
    r.offloaded += offload_->host_bytes();
    r.offload_staging += offload_->ring_bytes();
  }
  for (const auto& [key, buf] : copies_) r.copies += static_cast<std::int64_t>(buf.bytes());
  if (muon_) muon_->add_memory(r);
}

// Where this rank's piece of `param` starts in the bound grad / param storage.
std::size_t ShardEngine::storage_offset(const ParamPiece& ps) const {
  return static_cast<std::size_t>(settings_.shard_addressed ? ps.shard_offset : ps.buffer_offset);
}

ShardView ShardEngine::param_view(int param) const {
  const ParamPiece& ps = piece(param);
  const BufferShard& sh = shards_[static_cast<std::size_t>(ps.buffer)];
  ShardView v;
  v.dtype = sh.param_dtype;
  v.shape = {ps.length};
  v.strides = {1};
  v.param_offset = ps.param_offset;
  v.data = ps.length == 0 || sh.ptrs.params == nullptr
               ? nullptr
               : static_cast<char*>(sh.ptrs.params) + storage_offset(ps) * size_of(sh.param_dtype);
  return v;
}

ShardView ShardEngine::grad_view(int param, DType dtype, Stream stream, const std::string& call) {
  const ParamPiece& ps = piece(param);
  SHARDOPT_REQUIRE(is_float_storage(dtype), ErrorCode::InvalidArgument,
                   call + ": dtype " + to_string(dtype) + " is not one of f32, bf16, f16");
  const DType gdt = settings_.grad_dtype;
  ShardView v;
  v.dtype = dtype;
  v.shape = {ps.length};
  v.strides = {1};
  v.param_offset = ps.param_offset;
  if (ps.length == 0) return v;
  const void* grads = shards_[static_cast<std::size_t>(ps.buffer)].ptrs.grads;
  void* src = const_cast<char*>(static_cast<const char*>(grads)) + storage_offset(ps) * size_of(gdt);
  if (dtype == gdt) {
    v.data = src;  // a view of the reduced shard: no copy
    return v;
  }
  copies_requested_ = true;
  const auto key = std::make_pair(param, dtype);
  auto it = copies_.find(key);
  if (it == copies_.end()) {
    SHARDOPT_REQUIRE(!is_capturing(backend_, stream), ErrorCode::CaptureRefused,
                     call + " would allocate a cast copy inside a capture; call it once before capturing (a warm-up "
                            "iteration) with " + settings_.options_name + "::persistent_grad_copies = true");
    it = copies_.emplace(key, DeviceBuffer(backend_, static_cast<std::size_t>(ps.length) * size_of(dtype))).first;
  }
  kernels::convert(src, gdt, it->second.data(), dtype, ps.length, backend_, stream);
  v.data = it->second.data();
  return v;
}

void ShardEngine::release_copies(Stream stream) {
  if (settings_.persistent_copies || copies_.empty()) return;
  SHARDOPT_REQUIRE(!is_capturing(backend_, stream), ErrorCode::CaptureRefused,
                   "zero_grad would free shard_grad cast copies inside a capture; set " + settings_.options_name +
                       "::persistent_grad_copies = true for graph mode");
  synchronize(backend_, stream);  // queued work may still read the copies
  copies_.clear();
}

void ShardEngine::check_capturable() const {
  SHARDOPT_REQUIRE(!copies_requested_ || settings_.persistent_copies, ErrorCode::CaptureRefused,
                   "this optimizer hands out shard_grad cast copies, which zero_grad frees; capturing its step would "
                   "free memory inside the graph. Set " + settings_.options_name +
                       "::persistent_grad_copies = true (graph mode: copies persist and are reported under "
                       "MemoryReport::copies)");
}

std::vector<MasterPiece> master_pieces(const ShardEngine& engine, const Layout& L) {
  std::vector<MasterPiece> out(L.params().size());
  for (std::size_t p = 0; p < out.size(); ++p) {
    const ParamPiece& piece = engine.piece(static_cast<int>(p));
    out[p] = {engine.master_of(static_cast<int>(p)), piece.param_offset,
              piece.shard_offset, piece.length};
  }
  return out;
}

}  // namespace shardopt::detail
