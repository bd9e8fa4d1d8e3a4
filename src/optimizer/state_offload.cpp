#include "optimizer/state_offload.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include "core/check.hpp"
#include "core/trace.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

namespace {

constexpr std::size_t kRegionAlign = 256;  // bytes; every region of a slot starts on it

std::size_t rounded(std::size_t bytes) { return (bytes + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

std::int64_t slice_of(const Layout& L, int bucket) {
  return L.buckets()[static_cast<std::size_t>(bucket)].range.size() / L.world_size();
}

}  // namespace

std::vector<bool> offloaded_buckets(const Layout& L, double fraction) {
  const int nb = static_cast<int>(L.buckets().size());
  std::vector<bool> out(static_cast<std::size_t>(nb), false);
  if (!(fraction > 0.0)) return out;
  std::int64_t total = 0;
  for (int b = 0; b < nb; ++b) total += slice_of(L, b);
  const auto target = static_cast<std::int64_t>(std::ceil(fraction * static_cast<double>(total)));
  std::int64_t taken = 0;
  for (int b = nb - 1; b >= 0 && taken < target; --b) {
    out[static_cast<std::size_t>(b)] = true;
    taken += slice_of(L, b);
  }
  // Within a buffer the chosen buckets must be those from some shard offset on: the
  // device arrays keep [0, split), the host arrays the rest.
  for (const BufferLayout& buf : L.buffers()) {
    bool seen = false;
    for (int bk : buf.buckets) {
      seen = seen || out[static_cast<std::size_t>(bk)];
      SHARDOPT_REQUIRE(!seen || out[static_cast<std::size_t>(bk)], ErrorCode::Internal,
                       "offload: a buffer's buckets are not in bucket order");
    }
  }
  return out;
}

StateOffload::StateOffload(Backend backend, const Layout& L, const std::vector<bool>& offloaded,
                           const std::vector<BufferInfo>& buffers, DType moment_dtype, std::int64_t stage_numel,
                           std::int64_t muon_momentum_numel)
    : backend_(backend),
      moment_dtype_(moment_dtype),
      buffers_(L.buffers().size()),
      bucket_stages_(L.buckets().size(), {0, 0}),
      up_(backend),
      compute_(backend),
      down_(backend),
      start_(backend),
      prologue_(backend),
      compute_end_(backend),
      down_end_(backend) {
  const bool q8 = moment_dtype == DType::q8_block;
  const std::size_t msize = size_of(moment_dtype);
  // The stages, bucket by bucket in bucket order, and their chunks rebased to the slot.
  std::vector<ShardChunk> table;
  for (std::size_t b = 0; b < buffers_.size(); ++b) buffers_[b].split = buffers[b].split;
  for (int bk = 0; bk < static_cast<int>(L.buckets().size()); ++bk) {
    if (!offloaded[static_cast<std::size_t>(bk)]) continue;
    const Bucket& bucket = L.buckets()[static_cast<std::size_t>(bk)];
    const std::int64_t lo = bucket.shard_offset, hi = lo + slice_of(L, bk);
    SHARDOPT_REQUIRE(lo >= buffers_[static_cast<std::size_t>(bucket.buffer)].split, ErrorCode::Internal,
                     "offload: an offloaded bucket starts below its buffer's split");
    const std::vector<ShardChunk>& chunks = *buffers[static_cast<std::size_t>(bucket.buffer)].chunks;
    bucket_stages_[static_cast<std::size_t>(bk)].first = stages_.size();
    for (std::int64_t a = lo; a < hi;) {
      const std::int64_t e = std::min(hi, (a / stage_numel + 1) * stage_numel);
      Stage st;
      st.buffer = bucket.buffer;
      st.bucket = bk;
      st.begin = a;
      st.end = e;
      st.base = a / kMomentBlock * kMomentBlock;
      st.first_chunk = static_cast<std::int64_t>(table.size());
      auto it = std::upper_bound(chunks.begin(), chunks.end(), a,
                                 [](std::int64_t v, const ShardChunk& c) { return v < c.shard_offset; });
      if (it != chunks.begin()) --it;
      for (; it != chunks.end() && it->shard_offset < e; ++it) {
        const std::int64_t s = std::max(it->shard_offset, a), t = std::min(it->shard_offset + it->length, e);
        if (t <= s) continue;
        SHARDOPT_REQUIRE(it->moment_shift == 0, ErrorCode::Internal, "offload: compact moments (Muon) are not offloaded");
        ShardChunk c = *it;
        c.shard_offset = s - st.base;
        c.buffer_offset = it->buffer_offset + (s - it->shard_offset);
        c.length = t - s;
        table.push_back(c);
      }
      st.num_chunks = static_cast<std::int64_t>(table.size()) - st.first_chunk;
      // The ranges this stage moves: [a, e) less the Muon pieces in it.
      st.first_run = runs_.size();
      std::int64_t from = a;
      for (const auto& [mb, me] : buffers[static_cast<std::size_t>(bucket.buffer)].muon_ranges) {
        if (me <= from || mb >= e) continue;
        if (mb > from) runs_.emplace_back(from, mb);
        from = std::max(from, me);
      }
      if (from < e) runs_.emplace_back(from, e);
      st.num_runs = runs_.size() - st.first_run;
      SHARDOPT_REQUIRE(!q8 || (a % kMomentBlock == 0 && e % kMomentBlock == 0), ErrorCode::Internal,
                       "offload: a stage of 8-bit moments does not start and end on block boundaries");
      if (st.num_chunks > 0) stages_.push_back(st);  // a stage of padding only has nothing to update
      a = e;
    }
    bucket_stages_[static_cast<std::size_t>(bk)].second = stages_.size() - bucket_stages_[static_cast<std::size_t>(bk)].first;
  }
  bucket_done_.reserve(L.buckets().size());
  for (std::size_t bk = 0; bk < L.buckets().size(); ++bk) bucket_done_.emplace_back(backend_);
  for (int s = 0; s < kOffloadSlots; ++s) {
    uploaded_.emplace_back(backend_);
    updated_.emplace_back(backend_);
    downloaded_.emplace_back(backend_);
  }
  if (std::none_of(offloaded.begin(), offloaded.end(), [](bool v) { return v; })) return;

  // The host arrays: each offloaded buffer's shard from its split to its end, zeroed as
  // the device arrays are (and Muon's masters kept apart, Muon's momentum). Their sizes
  // first: a refusal names what the whole offload needs.
  std::vector<std::array<std::size_t, 7>> sizes(buffers_.size());
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    const std::int64_t n = L.buffers()[b].shard_numel;
    if (buffers_[b].split >= n) continue;
    const auto numel = static_cast<std::size_t>(n - buffers_[b].split);
    const std::size_t scales = q8 ? numel / kMomentBlock * sizeof(float) : 0;
    sizes[b] = {buffers[b].remainder ? 0 : numel * sizeof(float), buffers[b].remainder ? numel * sizeof(std::uint16_t) : 0,
                numel * msize, numel * msize, scales, scales,
                static_cast<std::size_t>(buffers[b].muon_master_numel) * sizeof(float)};
    for (std::size_t bytes : sizes[b]) host_bytes_ += static_cast<std::int64_t>(bytes);
  }
  const std::size_t momentum_bytes = static_cast<std::size_t>(muon_momentum_numel) * sizeof(float);
  host_bytes_ += static_cast<std::int64_t>(momentum_bytes);
  try {
    muon_momentum_ = DeviceBuffer(backend_, momentum_bytes, MemoryKind::Pinned);
    if (muon_momentum_) std::memset(muon_momentum_.data(), 0, muon_momentum_.bytes());
    for (std::size_t b = 0; b < buffers_.size(); ++b) {
      BufferState& bs = buffers_[b];
      if (bs.split >= L.buffers()[b].shard_numel) continue;
      for (std::size_t k = 0; k < sizes[b].size(); ++k) {
        DeviceBuffer& buf = *bs.arrays()[k];
        buf = DeviceBuffer(backend_, sizes[b][k], MemoryKind::Pinned);
        if (buf) std::memset(buf.data(), 0, buf.bytes());
      }
      bs.host.begin = bs.split;
      bs.host.master = bs.master.as<float>();
      bs.host.remainders = bs.remainders.as<std::uint16_t>();
      bs.host.exp_avg = bs.exp_avg.data();
      bs.host.exp_avg_sq = bs.exp_avg_sq.data();
      bs.host.exp_avg_scales = bs.exp_avg_scales.as<float>();
      bs.host.exp_avg_sq_scales = bs.exp_avg_sq_scales.as<float>();
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::OutOfMemory) throw;
    failed_ = std::current_exception();
    muon_momentum_ = DeviceBuffer();
    for (BufferState& bs : buffers_) {  // nothing half-built: every host array goes
      for (DeviceBuffer* buf : bs.arrays()) *buf = DeviceBuffer();
      bs.host = StateArrays{};
    }
    return;
  }

  // The ring: per slot a master (or remainder) region, the two moments and the scales,
  // each as wide as the widest stage (from its base), never wider than stage_numel.
  for (const Stage& st : stages_) slot_numel_ = std::max(slot_numel_, st.end - st.base);
  slot_numel_ = (slot_numel_ + kMomentBlock - 1) / kMomentBlock * kMomentBlock;
  const auto S = static_cast<std::size_t>(slot_numel_);
  region_[0] = 0;
  region_[1] = region_[0] + rounded(S * sizeof(float));
  region_[2] = region_[1] + rounded(S * msize);
  region_[3] = region_[2] + rounded(S * msize);
  slot_bytes_ = region_[3] + (q8 ? rounded(2 * (S / kMomentBlock) * sizeof(float)) : 0);
  ring_ = DeviceBuffer(backend_, slot_bytes_ * kOffloadSlots);  // also where this rank's slices are padding only
  fill_zero_async(backend_, ring_.data(), ring_.bytes(), nullptr);
  chunks_dev_ = DeviceBuffer(backend_, table.size() * sizeof(ShardChunk));
  copy_async(backend_, chunks_dev_.data(), table.data(), chunks_dev_.bytes(), nullptr);
  synchronize(backend_, nullptr);
}

void StateOffload::bind(int buffer, const AdamConfig* config, const void* grads, void* params) {
  BufferState& bs = buffers_.at(static_cast<std::size_t>(buffer));
  bs.config = config;
  bs.grads = grads;
  bs.params = params;
}

StateArrays StateOffload::slot_arrays(int slot, std::int64_t base, bool remainder) const {
  char* at = ring_.as<char>() + static_cast<std::size_t>(slot) * slot_bytes_;
  StateArrays a;
  a.begin = base;
  if (remainder) {
    a.remainders = reinterpret_cast<std::uint16_t*>(at + region_[0]);
  } else {
    a.master = reinterpret_cast<float*>(at + region_[0]);
  }
  a.exp_avg = at + region_[1];
  a.exp_avg_sq = at + region_[2];
  if (moment_dtype_ == DType::q8_block) {
    a.exp_avg_scales = reinterpret_cast<float*>(at + region_[3]);
    a.exp_avg_sq_scales = a.exp_avg_scales + slot_numel_ / kMomentBlock;
  }
  return a;
}

void StateOffload::copy_stage(const Stage& st, int slot, bool upload, Stream stream) const {
  const BufferState& bs = buffers_[static_cast<std::size_t>(st.buffer)];
  const StateArrays& h = bs.host;
  const StateArrays d = slot_arrays(slot, st.base, h.remainders != nullptr);
  // One array's [from, to): bytes per element `size`, or per block with `per_block`.
  auto move = [&](void* host, void* dev, std::size_t size, bool per_block, std::int64_t from, std::int64_t to) {
    if (host == nullptr) return;
    const std::int64_t div = per_block ? kMomentBlock : 1;
    char* hp = static_cast<char*>(host) + static_cast<std::size_t>((from - h.begin) / div) * size;
    char* dp = static_cast<char*>(dev) + static_cast<std::size_t>((from - d.begin) / div) * size;
    const std::size_t bytes = static_cast<std::size_t>((to - from) / div) * size;
    if (upload) {
      copy_async(backend_, dp, hp, bytes, stream);
    } else {
      copy_async(backend_, hp, dp, bytes, stream);
    }
  };
  const std::size_t msize = size_of(moment_dtype_);
  // Only the stage's ranges outside Muon's pieces: Muon's pass updates their masters in
  // place (a copy would race with it), and their other slots hold nothing. A block of
  // scales is moved when an AdamW element starts in it (8-bit layouts start every
  // parameter on a block, so a block a Muon piece ends in holds no AdamW element).
  for (std::size_t r = st.first_run; r < st.first_run + st.num_runs; ++r) {
    const auto [from, to] = runs_[r];
    const std::int64_t block_from = (from + kMomentBlock - 1) / kMomentBlock * kMomentBlock;
    move(h.master, d.master, sizeof(float), false, from, to);
    move(h.remainders, d.remainders, sizeof(std::uint16_t), false, from, to);
    move(h.exp_avg, d.exp_avg, msize, false, from, to);
    move(h.exp_avg_sq, d.exp_avg_sq, msize, false, from, to);
    if (block_from < to) {
      move(h.exp_avg_scales, d.exp_avg_scales, sizeof(float), true, block_from, to);
      move(h.exp_avg_sq_scales, d.exp_avg_sq_scales, sizeof(float), true, block_from, to);
    }
  }
}

void StateOffload::begin(Stream caller) {
  next_upload_ = 0;
  if (stages_.empty()) return;
  SHARDOPT_TRACE("shardopt/offload_prefetch");
  const Stream up = up_.on(caller);
  start_.record(caller);
  start_.wait(up);
  for (; next_upload_ < std::min<std::size_t>(kOffloadSlots, stages_.size()); ++next_upload_) {
    const int slot = static_cast<int>(next_upload_ % kOffloadSlots);
    copy_stage(stages_[next_upload_], slot, true, up);
    uploaded_[static_cast<std::size_t>(slot)].record(up);
  }
}

void StateOffload::run(Stream caller, StepScalars* scalars) {
  if (stages_.empty()) return;
  SHARDOPT_TRACE("shardopt/offload_stream");
  const Stream up = up_.on(caller), comp = compute_.on(caller), down = down_.on(caller);
  prologue_.record(caller);
  prologue_.wait(comp);
  for (std::size_t k = 0; k < stages_.size(); ++k) {
    const Stage& st = stages_[k];
    const int slot = static_cast<int>(k % kOffloadSlots);
    const auto s = static_cast<std::size_t>(slot);
    const BufferState& bs = buffers_[static_cast<std::size_t>(st.buffer)];
    SHARDOPT_REQUIRE(bs.config != nullptr, ErrorCode::Internal, "offload: a buffer was not bound");
    uploaded_[s].wait(comp);
    const StateArrays d = slot_arrays(slot, st.base, bs.host.remainders != nullptr);
    ShardPointers p;
    p.chunks = chunks_dev_.as<ShardChunk>() + st.first_chunk;
    p.num_chunks = st.num_chunks;
    p.shard_numel = slot_numel_;
    p.moment_numel = slot_numel_;
    p.grads = bs.grads;
    p.params = bs.params;
    p.master = d.master;
    p.remainders = d.remainders;
    p.exp_avg = d.exp_avg;
    p.exp_avg_sq = d.exp_avg_sq;
    p.exp_avg_scales = d.exp_avg_scales;
    p.exp_avg_sq_scales = d.exp_avg_sq_scales;
    adam_step_apply(*bs.config, p, scalars, backend_, comp);
    updated_[s].record(comp);
    const auto& [first, count] = bucket_stages_[static_cast<std::size_t>(st.bucket)];
    if (k + 1 == first + count) bucket_done_[static_cast<std::size_t>(st.bucket)].record(comp);
    updated_[s].wait(down);
    copy_stage(st, slot, false, down);
    downloaded_[s].record(down);
    if (next_upload_ < stages_.size()) {  // stage k + kOffloadSlots takes the slot once stage k is down
      downloaded_[s].wait(up);
      copy_stage(stages_[next_upload_], slot, true, up);
      uploaded_[s].record(up);
      ++next_upload_;
    }
  }
  compute_end_.record(comp);
  down_end_.record(down);
}

void StateOffload::wait_bucket(int bucket, Stream caller) const {
  if (bucket_stages_.at(static_cast<std::size_t>(bucket)).second == 0) return;
  bucket_done_[static_cast<std::size_t>(bucket)].wait(caller);
}

void StateOffload::finish(Stream caller) {
  if (stages_.empty()) return;
  compute_end_.wait(caller);
  down_end_.wait(caller);
}

}  // namespace shardopt::detail
