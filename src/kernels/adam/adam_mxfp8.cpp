// adam_mxfp8.cpp - the fused Adam step of MXFP8 shards (adam_mxfp8.hpp): the owned bands
// as Adam chunks, the plain chunks left around them, the pass's tables and its call (the
// CUDA launch, or the host twin: Adam over the bands, then the owned pass).
#include "kernels/adam/adam_mxfp8.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "kernels/adam/adam_math.cuh"
#include "kernels/common/entry_table.hpp"
#include "kernels/mxfp8/mxfp8_shard_spans.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt_config.h"

namespace shardopt::kernels {
namespace {

// Whether the 8-element chunks of a range's whole tiles may take 16-byte Adam accesses:
// the plain pass's own decision (split_chunk, given its vector_ok: every base pointer
// aligned16) for a chunk of the range that starts at an element index that is a
// multiple of 8, where every whole tile's chunk starts. `vec`: the variant's vector width.
bool tiles_vector_ok(const Mxfp8ShardTensor& t, const AdamMxfp8Place& p, int vec, bool vector_ok) {
  const std::int64_t first = (t.range.begin + 7) / 8 * 8;
  if (first >= t.range.end) return false;
  ShardChunk c;
  c.shard_offset = p.shard_offset + (first - t.range.begin);
  c.buffer_offset = p.buffer_offset + (first - t.range.begin);
  c.moment_shift = p.moment_shift;
  c.length = t.range.end - first;
  const ChunkSplit sp = split_chunk(c, vec, vector_ok);
  return sp.head == 0 && sp.nvec > 0;
}

}  // namespace

std::vector<ShardChunk> adam_mxfp8_owned_chunks(const std::vector<Mxfp8ShardTensor>& tensors,
                                                const std::vector<AdamMxfp8Place>& places) {
  SHARDOPT_REQUIRE(tensors.size() == places.size(), ErrorCode::InvalidArgument,
                   "adam_mxfp8_owned_chunks: " + std::to_string(tensors.size()) + " tensors but " +
                       std::to_string(places.size()) + " places; give one place per tensor");
  std::vector<ShardChunk> bands;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Mxfp8ShardTensor& t = tensors[i];
    const mxfp8::ShardEntry e = mxfp8::make_shard_entry(t.shape, t.range, t.master, t.out, 0);
    if (e.owned_end <= e.owned_begin) continue;
    ShardChunk c;
    c.shard_offset = places[i].shard_offset + (e.owned_begin - t.range.begin);
    c.buffer_offset = places[i].buffer_offset + (e.owned_begin - t.range.begin);
    c.length = e.owned_end - e.owned_begin;
    c.group = places[i].group;
    c.moment_shift = places[i].moment_shift;
    bands.push_back(c);
  }
  return bands;
}

std::vector<ShardChunk> adam_mxfp8_plain_chunks(const std::vector<ShardChunk>& pieces,
                                                const std::vector<ShardChunk>& bands) {
  std::vector<ShardChunk> out;
  std::size_t b = 0;
  for (const ShardChunk& piece : pieces) {
    std::int64_t at = piece.shard_offset;
    const std::int64_t end = piece.shard_offset + piece.length;
    while (b < bands.size() && bands[b].shard_offset + bands[b].length <= at) ++b;
    for (std::size_t k = b; k < bands.size() && bands[k].shard_offset < end; ++k) {
      const std::int64_t lo = std::max(at, bands[k].shard_offset);
      if (lo > at) {
        ShardChunk c = piece;
        c.shard_offset = at;
        c.buffer_offset = piece.buffer_offset + (at - piece.shard_offset);
        c.length = lo - at;
        out.push_back(c);
      }
      at = std::max(at, std::min(end, bands[k].shard_offset + bands[k].length));
    }
    if (at < end) {
      ShardChunk c = piece;
      c.shard_offset = at;
      c.buffer_offset = piece.buffer_offset + (at - piece.shard_offset);
      c.length = end - at;
      out.push_back(c);
    }
  }
  return out;
}

struct AdamMxfp8Pass::Impl {
  Backend backend = Backend::Host;
  AdamApplyLaunch adam;                  // params.chunks: the bands (host memory; the host twin reads them)
  std::vector<ShardChunk> bands;
  detail::EntryTable entries, places;   // in the backend's memory
  std::vector<std::pair<std::uint8_t*, std::size_t>> spans;
  std::int64_t tiles = 0;
};

AdamMxfp8Pass::AdamMxfp8Pass(const std::vector<Mxfp8ShardTensor>& tensors, const std::vector<AdamMxfp8Place>& places,
                             const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars,
                             Backend backend)
    : impl_(std::make_unique<Impl>()) {
  SHARDOPT_REQUIRE(!config.write_params, ErrorCode::InvalidArgument,
                   "AdamMxfp8Pass: AdamConfig::write_params must be false (MXFP8 shards keep no parameter copy)");
  // The same checks (and refusals) as the batch of the two-pass composition.
  { const Mxfp8ShardBatch check(tensors, backend); }
  Impl& im = *impl_;
  im.backend = backend;
  im.bands = adam_mxfp8_owned_chunks(tensors, places);
  std::vector<mxfp8::ShardEntry> entries;
  std::vector<AdamMxfp8Place> where = places;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Mxfp8ShardTensor& t = tensors[i];
    entries.push_back(mxfp8::make_shard_entry(t.shape, t.range, t.master, t.out, im.tiles));
    im.tiles = entries.back().end_tile;
    if (t.range.size() == 0) continue;
    SHARDOPT_REQUIRE(t.master == shard.master + where[i].shard_offset, ErrorCode::InvalidArgument,
                     "AdamMxfp8Pass tensor " + std::to_string(i) +
                         ": its master is not shard.master + places[i].shard_offset; give the shard's master");
  }
  ShardPointers sp = shard;
  sp.chunks = im.bands.data();
  sp.num_chunks = static_cast<std::int64_t>(im.bands.size());
  im.adam = prepare_adam_apply(config, sp, scalars, Backend::Host);  // checks every band against the shard
  // The vector width of the variant (write_params is off: the pass writes no params).
  const int vec = adam_vec_elems(config.grad_dtype, config.moment_dtype, DType::f32, false);
  for (std::size_t i = 0; i < tensors.size(); ++i)
    where[i].vec_ok = tensors[i].range.size() > 0 && tiles_vector_ok(tensors[i], where[i], vec, im.adam.params.vector_ok)
                          ? 1
                          : 0;
  if (backend != Backend::Host) im.adam.params.chunks = nullptr;      // the kernel walks tiles, not chunks
  im.entries = detail::EntryTable(backend, entries);
  im.places = detail::EntryTable(backend, where);
  im.spans = mxfp8::merged_scale_spans(entries);
}

AdamMxfp8Pass::~AdamMxfp8Pass() = default;
AdamMxfp8Pass::AdamMxfp8Pass(AdamMxfp8Pass&&) noexcept = default;
AdamMxfp8Pass& AdamMxfp8Pass::operator=(AdamMxfp8Pass&&) noexcept = default;

const std::vector<ShardChunk>& AdamMxfp8Pass::bands() const { return detail::live_batch(impl_, "AdamMxfp8Pass").bands; }
std::int64_t AdamMxfp8Pass::tiles() const { return detail::live_batch(impl_, "AdamMxfp8Pass").tiles; }

void AdamMxfp8Pass::run(Stream stream) const {
  const Impl& im = detail::live_batch(impl_, "AdamMxfp8Pass");
  im.entries.require_call(im.backend, "AdamMxfp8Pass::run");
  const auto* entries = im.entries.entries<mxfp8::ShardEntry>();
  const int count = im.entries.count();
  if (im.backend == Backend::Host) {
    host_enqueue(stream, [v = im.adam.variant, a = im.adam.params, entries, count] {
      host_adam_apply(v, a);
      mxfp8::host_owned_batch(entries, count);
    });
    return;
  }
  for (const auto& [p, n] : im.spans) fill_zero_async(im.backend, p, n, stream);
  launch_adam_mxfp8_owned(im.adam.variant, im.adam.params, entries, im.places.entries<AdamMxfp8Place>(), count,
                          im.tiles, stream);
}

}  // namespace shardopt::kernels

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launch refuses.
namespace shardopt::kernels {
void launch_adam_mxfp8_owned(const AdamVariant&, const AdamApplyParams&, const mxfp8::ShardEntry*,
                             const AdamMxfp8Place*, int, std::int64_t, Stream) {
  detail::no_cuda("fused Adam + MXFP8");
}
}  // namespace shardopt::kernels
#endif
