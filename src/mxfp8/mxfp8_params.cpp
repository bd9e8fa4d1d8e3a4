#include "mxfp8/mxfp8_params.hpp"

#include <algorithm>
#include <string>

#include "core/check.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {
namespace {

constexpr std::size_t kAlign = 16;

std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

const char* state_name(GatherState s) {
  switch (s) {
    case GatherState::Idle: return "Idle";
    case GatherState::InFlight: return "InFlight";
    case GatherState::Landed: return "Landed";
    case GatherState::Consumed: return "Consumed";
  }
  return "?";
}

}  // namespace

bool is_mxfp8_spec(const ParamSpec& spec) {
  // Mxfp8Shape::of's rule: a grouped spec's shape is [G, member...] and each member needs
  // two dims; a plain spec needs two.
  const std::size_t lead = spec.members() > 1 ? 1 : 0;
  return spec.shape.size() >= lead + 2;
}

Mxfp8Params::Mxfp8Params(Backend backend, const Layout& L, BucketStore& store,
                         const std::vector<MasterPiece>& masters, const std::vector<bool>& mx_buffer)
    : backend_(backend),
      layout_(L),
      store_(store) {
  const int world = L.world_size(), rank = store.comm().rank();
  param_.resize(L.params().size());
  bucket_.resize(L.buckets().size());

  // Storage offsets: data planes per parameter, then scales bucket by bucket.
  std::size_t cursor = 0;
  std::vector<Mxfp8Member> member_table;
  for (std::size_t p = 0; p < L.params().size(); ++p) {
    if (!mx_buffer[static_cast<std::size_t>(L.params()[p].buffer)]) continue;
    ParamInfo& pi = param_[p];
    pi.mx = true;
    any_ = true;
    pi.shape = Mxfp8Shape::of(L.specs()[p]);
    const auto n = static_cast<std::size_t>(pi.shape.numel());
    pi.data_row = cursor;
    cursor = align_up(cursor + n);
    pi.data_col = cursor;
    cursor = align_up(cursor + n);
    pi.members = member_table.size();
    for (const Mxfp8Member& m : mxfp8_contiguous_members(pi.shape)) member_table.push_back(m);
  }
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    const Bucket& bk = L.buckets()[b];
    BucketInfo& bi = bucket_[b];
    bi.mx = mx_buffer[static_cast<std::size_t>(bk.buffer)];
    if (!bi.mx) continue;
    bi.scale_begin = cursor;
    for (int p : bk.params) {
      ParamInfo& pi = param_[static_cast<std::size_t>(p)];
      pi.scale_row = cursor;
      cursor = align_up(cursor + static_cast<std::size_t>(pi.shape.scale_row_numel()));
      pi.scale_col = cursor;
      cursor = align_up(cursor + static_cast<std::size_t>(pi.shape.scale_col_numel()));
    }
    bi.scale_end = cursor;
  }
  storage_ = DeviceBuffer(backend_, cursor);
  fill_zero_async(backend_, storage_.data(), storage_.bytes(), nullptr);
  members_ = DeviceBuffer(backend_, member_table.size() * sizeof(Mxfp8Member));
  copy_async(backend_, members_.data(), member_table.data(), members_.bytes(), nullptr);

  // Staging geometry: this rank's phase-2 targets, and every rank piece's landing copies.
  const std::size_t gsize = size_of(store.options().grad_dtype);
  SHARDOPT_REQUIRE(!any_ || gsize >= static_cast<std::size_t>(kMxfp8StagedBytes), ErrorCode::InvalidArgument,
                   std::string("MXFP8 parameters stage their all-gather in the gradient buffer, which needs ") +
                       std::to_string(kMxfp8StagedBytes) + " bytes per element; grad_dtype " +
                       to_string(store.options().grad_dtype) + " holds " + std::to_string(gsize) +
                       ": use bf16, f16 or f32 gradients");
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    BucketInfo& bi = bucket_[b];
    if (!bi.mx) continue;
    const Bucket& bk = L.buckets()[b];
    bi.region = static_cast<std::uint8_t*>(store.grad_buffer(bk.buffer)) +
                static_cast<std::size_t>(bk.range.begin) * gsize;
    bi.region_bytes = static_cast<std::size_t>(bk.range.size()) * gsize;
  }
  for (std::size_t p = 0; p < L.params().size(); ++p) {
    ParamInfo& pi = param_[p];
    if (!pi.mx) continue;
    const MasterPiece& piece = masters[p];
    const ParamPlacement& pl = L.params()[p];
    const Bucket& bk = L.buckets()[static_cast<std::size_t>(pl.bucket)];
    const std::int64_t S = bk.range.size() / world;
    pi.range = Range{piece.param_offset, piece.param_offset + piece.length};
    if (piece.length == 0) continue;
    pi.master = piece.master;
    // Element i of the param goes to staging byte (rank * 2S + k0 + i - param_offset):
    // k0 is the piece's offset inside this rank's slice. The base may point outside the
    // region; the kernels only add indices of the range. Computed as integers.
    const std::int64_t k0 = piece.shard_offset - bk.shard_offset;
    const auto base = reinterpret_cast<std::uintptr_t>(bucket_[static_cast<std::size_t>(pl.bucket)].region);
    pi.staged_row = base + static_cast<std::uintptr_t>(rank * 2 * S + k0) - static_cast<std::uintptr_t>(piece.param_offset);
    pi.staged_col = pi.staged_row + static_cast<std::uintptr_t>(S);
  }
  // Per bucket, one table of this rank's ranges of its params (an empty range where the
  // rank owns none of a param: phase 1 still zero-fills its scales for the Max).
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    BucketInfo& bi = bucket_[b];
    if (!bi.mx) continue;
    std::vector<Mxfp8ShardTensor> tensors;
    for (int p : L.buckets()[b].params) {
      const ParamInfo& pi = param_[static_cast<std::size_t>(p)];
      Mxfp8ShardTensor t;
      t.shape = pi.shape;
      t.range = pi.range;
      t.master = pi.master;
      t.out.scale_row = at(pi.scale_row);
      t.out.scale_col = at(pi.scale_col);
      t.out.data_row = reinterpret_cast<std::uint8_t*>(pi.staged_row);
      t.out.data_col = reinterpret_cast<std::uint8_t*>(pi.staged_col);
      tensors.push_back(t);
    }
    bi.batch = static_cast<int>(batches_.size());
    batches_.emplace_back(tensors, backend_);
  }
  std::vector<std::vector<Segment>> per_bucket(L.buckets().size());
  std::vector<std::vector<int>> seg_rank(L.buckets().size());
  for (std::size_t buf = 0; buf < L.buffers().size(); ++buf) {
    if (!mx_buffer[buf]) continue;
    for (int r = 0; r < world; ++r)
      for (const Segment& seg : L.segments(static_cast<int>(buf), r)) {
        const auto b = static_cast<std::size_t>(L.params()[static_cast<std::size_t>(seg.param)].bucket);
        per_bucket[b].push_back(seg);
        seg_rank[b].push_back(r);
      }
  }
  std::vector<BytePiece> table;
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    BucketInfo& bi = bucket_[b];
    if (!bi.mx) continue;
    const Bucket& bk = L.buckets()[b];
    const std::int64_t S = bk.range.size() / world;
    bi.pieces_begin = static_cast<std::int64_t>(table.size());
    for (std::size_t k = 0; k < per_bucket[b].size(); ++k) {
      const Segment& seg = per_bucket[b][k];
      const ParamInfo& pi = param_[static_cast<std::size_t>(seg.param)];
      const std::int64_t k0 = seg.shard_offset - bk.shard_offset;
      const std::uint8_t* src = bi.region + static_cast<std::size_t>(seg_rank[b][k] * 2 * S + k0);
      split_copy(table, src, at(pi.data_row) + seg.param_offset, seg.length);
      split_copy(table, src + S, at(pi.data_col) + seg.param_offset, seg.length);
    }
    bi.pieces_end = static_cast<std::int64_t>(table.size());
  }
  pieces_ = DeviceBuffer(backend_, table.size() * sizeof(BytePiece));
  copy_async(backend_, pieces_.data(), table.data(), pieces_.bytes(), nullptr);
  synchronize(backend_, nullptr);
  warm_up();
}

// NCCL connects lazily, per algorithm: run the scale all-reduce eagerly once per bucket
// span and once over all of them (the scales are zero, and stay zero), so that a captured
// step's all-reduce is never the first of its kind. Collective (every rank constructs).
void Mxfp8Params::warm_up() {
  if (!any_ || backend_ != Backend::Cuda || layout_.world_size() == 1) return;
  std::size_t lo = 0, hi = 0;
  bool have = false;
  for (const BucketInfo& bi : bucket_) {
    if (!bi.mx) continue;
    store_.all_reduce(at(bi.scale_begin), static_cast<std::int64_t>(bi.scale_end - bi.scale_begin), DType::e8m0,
                      ReduceOp::Max, nullptr);
    if (!have) lo = bi.scale_begin;
    hi = bi.scale_end;
    have = true;
  }
  store_.all_reduce(at(lo), static_cast<std::int64_t>(hi - lo), DType::e8m0, ReduceOp::Max, nullptr);
  synchronize(backend_, nullptr);
}

Mxfp8View Mxfp8Params::view(int param) const {
  const ParamInfo& pi = param_[static_cast<std::size_t>(param)];
  Mxfp8View v;
  v.shape = pi.shape;
  v.planes.data_row = at(pi.data_row);
  v.planes.scale_row = at(pi.scale_row);
  v.planes.data_col = at(pi.data_col);
  v.planes.scale_col = at(pi.scale_col);
  v.members = members_.as<Mxfp8Member>() + pi.members;
  return v;
}

int Mxfp8Params::first_pending() const {
  for (std::size_t b = 0; b < bucket_.size(); ++b)
    if (bucket_[b].mx && bucket_[b].state != GatherState::Idle) return static_cast<int>(b);
  return -1;
}

void Mxfp8Params::advance(int bucket, GatherState to) {
  GatherState& s = bucket_[static_cast<std::size_t>(bucket)].state;
  const bool legal = (s == GatherState::Idle && to == GatherState::InFlight) ||
                     (s == GatherState::InFlight && to == GatherState::Landed) ||
                     (s == GatherState::Landed && to == GatherState::Consumed) ||
                     (s == GatherState::Consumed && to == GatherState::Idle);
  SHARDOPT_REQUIRE(legal, ErrorCode::Internal,
                   "MXFP8 bucket " + std::to_string(bucket) + ": illegal gather transition " + state_name(s) + " -> " +
                       state_name(to));
  s = to;
}

void Mxfp8Params::reduce_scales(std::size_t begin, std::size_t end, Stream stream) {
  if (end <= begin || layout_.world_size() == 1) return;
  // Through the store, behind the all-gathers already started on its communication
  // stream: every collective of the step runs in one order, and `stream` waits only for
  // this one.
  store_.all_reduce(at(begin), static_cast<std::int64_t>(end - begin), DType::e8m0, ReduceOp::Max, stream);
}

void Mxfp8Params::quantize(int first, int last, Stream stream) {
  std::size_t span_begin = 0, span_end = 0;
  bool have = false;
  for (int b = first; b < last; ++b) {
    const BucketInfo& bi = bucket_[static_cast<std::size_t>(b)];
    if (!bi.mx) continue;
    SHARDOPT_REQUIRE(bi.state == GatherState::Idle, ErrorCode::Internal,
                     "MXFP8 bucket " + std::to_string(b) + " is quantized while its gather is " + state_name(bi.state));
    // Phase 1 on every param of the bucket, an empty range where this rank owns none of
    // it: its zeros join the Max. One memset and one launch for the bucket.
    mxfp8_partial_scales_batch(batches_[static_cast<std::size_t>(bi.batch)], backend_, stream);
    if (!have) span_begin = bi.scale_begin;
    span_end = bi.scale_end;
    have = true;
  }
  if (!have) return;
  reduce_scales(span_begin, span_end, stream);
  for (int b = first; b < last; ++b) {
    const BucketInfo& bi = bucket_[static_cast<std::size_t>(b)];
    if (!bi.mx) continue;
    quantize_mxfp8_shard_data_batch(batches_[static_cast<std::size_t>(bi.batch)], backend_, stream);
  }
}

void Mxfp8Params::dispatched(int first, int last) {
  for (int b = first; b < last; ++b)
    if (bucket_[static_cast<std::size_t>(b)].mx) advance(b, GatherState::InFlight);
}

void Mxfp8Params::consume(BucketStore& store, int first, int last, Stream stream) {
  auto pending = [&](int b) {
    const BucketInfo& bi = bucket_[static_cast<std::size_t>(b)];
    return bi.mx && (bi.state == GatherState::InFlight || bi.state == GatherState::Landed);
  };
  int b = first;
  while (b < last) {
    if (!pending(b)) {
      ++b;
      continue;
    }
    // A run of pending buckets whose gradient regions are adjacent: one copy launch and
    // one memset for all of them.
    int e = b;
    while (e < last && pending(e) &&
           (e == b || bucket_[static_cast<std::size_t>(e)].region ==
                          bucket_[static_cast<std::size_t>(e - 1)].region + bucket_[static_cast<std::size_t>(e - 1)].region_bytes)) {
      if (bucket_[static_cast<std::size_t>(e)].state == GatherState::InFlight) {
        store.wait_param_gather(e, stream);
        advance(e, GatherState::Landed);
      }
      ++e;
    }
    const BucketInfo& head = bucket_[static_cast<std::size_t>(b)];
    const BucketInfo& tail = bucket_[static_cast<std::size_t>(e - 1)];
    copy_pieces(pieces_.as<BytePiece>() + head.pieces_begin, tail.pieces_end - head.pieces_begin, backend_, stream);
    // The staging bytes (and whatever else the region held) must not meet the next
    // backward: the region is zero from here on (staging in a gradient region must be
    // zeroed on every path before the next backward, train -> eval -> train included).
    fill_zero_async(backend_, head.region, static_cast<std::size_t>(tail.region + tail.region_bytes - head.region),
                    stream);
    for (int k = b; k < e; ++k) {
      advance(k, GatherState::Consumed);
      advance(k, GatherState::Idle);
    }
    b = e;
  }
}

}  // namespace shardopt::detail
