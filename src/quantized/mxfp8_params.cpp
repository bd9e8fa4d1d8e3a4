#include "quantized/mxfp8_params.hpp"

#include <algorithm>
#include <string>

#include "core/check.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {
namespace {

class Mxfp8Format final : public StoredFormat {
 public:
  explicit Mxfp8Format(const FormatContext& ctx);

  const char* name() const override { return "MXFP8"; }
  DType exchange_dtype() const override { return DType::e8m0; }
  std::uint8_t* exchange_begin(int b) const override { return at(bucket_[static_cast<std::size_t>(b)].scale_begin); }
  std::uint8_t* exchange_end(int b) const override { return at(bucket_[static_cast<std::size_t>(b)].scale_end); }
  // Phase 1 is the owned pass: the partial scales, and the data of every tile row
  // wholly inside this rank's piece (their scales need no exchange), in the one read of
  // the master; phase 2 writes the data of the boundary tile rows only (none with one
  // rank: no launch). One memset and at most two launches for the bucket.
  const char* partials_mark() const override { return "quantize"; }
  const char* quantize_mark() const override { return "quantize rest"; }
  void partials(int b, Stream stream) const override {
    quantize_mxfp8_shard_owned_batch(batches_[static_cast<std::size_t>(bucket_[static_cast<std::size_t>(b)].batch)],
                                     backend_, stream);
  }
  void quantize(int b, Stream stream) const override {
    quantize_mxfp8_shard_rest_batch(batches_[static_cast<std::size_t>(bucket_[static_cast<std::size_t>(b)].batch)],
                                    backend_, stream);
  }
  void landing(int b, std::vector<BytePiece>& table) const override;
  void landing_after_fused(int b, std::vector<BytePiece>& table) const override;

  std::vector<ShardChunk> fuse_adam(int b, const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars,
                                    const std::vector<kernels::AdamMxfp8Place>& places) const;
  void adam_pass(int b, Stream stream) const;

  Mxfp8View view(int param) const;
  std::uint8_t* shard_plane(int buffer, Mxfp8Plane plane) const;

 private:
  struct ParamInfo {
    bool mx = false;
    Mxfp8Shape shape;
    std::size_t data_row = 0, data_col = 0, scale_row = 0, scale_col = 0;  // byte offsets in storage_
    std::size_t members = 0;  // entry offset in members_
    // This rank's owned tile rows of the parameter (ShardEntry::owned_begin..owned_end,
    // parameter elements; empty: none): the fused pass writes their bytes into the
    // storage too (issue 29), so landing_after_fused leaves them out.
    std::int64_t owned_begin = 0, owned_end = 0;
  };
  struct BucketInfo {
    std::size_t scale_begin = 0, scale_end = 0;  // byte span of its scales in storage_
    int batch = -1;                               // its params' ranges in batches_ (phase 1 and 2)
    std::vector<Mxfp8ShardTensor> tensors;        // the same ranges, for the fused Adam pass
  };

  void land(int bucket, bool skip_owned, std::vector<BytePiece>& table) const;

  int rank_ = 0;
  std::vector<std::size_t> shard_row_, shard_col_;  // shard storage: per buffer, its data planes' offsets
  std::vector<ParamInfo> param_;
  std::vector<BucketInfo> bucket_;
  DeviceBuffer members_;  // Mxfp8Member tables of every MXFP8 param
  std::vector<Mxfp8ShardBatch> batches_;  // per MXFP8 bucket: this rank's ranges of its params
  // Per fused bucket, Adam over its owned tile rows + their quantization (built at the
  // optimizer's construction, after the format: hence mutable).
  mutable std::vector<kernels::AdamMxfp8Pass> fused_;
  mutable std::vector<int> fused_of_;  // per bucket, its pass in fused_ (-1: none)
};

Mxfp8Format::Mxfp8Format(const FormatContext& ctx)
    : StoredFormat(ctx) {
  const Layout& L = layout_;
  const std::vector<bool>& mx_buffer = *ctx.buffers;
  const int world = L.world_size(), rank = ctx.rank;
  rank_ = rank;
  param_.resize(L.params().size());
  bucket_.resize(L.buckets().size());

  // Storage offsets: data planes (per parameter, or per buffer shard with shard
  // storage), then scales bucket by bucket.
  std::size_t cursor = 0;
  shard_row_.assign(L.buffers().size(), 0);
  shard_col_.assign(L.buffers().size(), 0);
  if (shard_storage_) {
    for (std::size_t b = 0; b < L.buffers().size(); ++b) {
      if (!mx_buffer[b]) continue;
      const auto n = static_cast<std::size_t>(L.buffers()[b].shard_numel);
      shard_row_[b] = cursor;
      cursor = align_up(cursor + n);
      shard_col_[b] = cursor;
      cursor = align_up(cursor + n);
    }
  }
  std::vector<Mxfp8Member> member_table;
  for (std::size_t p = 0; p < L.params().size(); ++p) {
    if (!mx_buffer[static_cast<std::size_t>(L.params()[p].buffer)]) continue;
    ParamInfo& pi = param_[p];
    pi.mx = true;
    pi.shape = Mxfp8Shape::of(L.specs()[p]);
    const auto n = static_cast<std::size_t>(pi.shape.numel());
    if (!shard_storage_) {
      pi.data_row = cursor;
      cursor = align_up(cursor + n);
      pi.data_col = cursor;
      cursor = align_up(cursor + n);
    }
    pi.members = member_table.size();
    for (const Mxfp8Member& m : mxfp8_contiguous_members(pi.shape)) member_table.push_back(m);
  }
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    const Bucket& bk = L.buckets()[b];
    if (!mx_buffer[static_cast<std::size_t>(bk.buffer)]) continue;
    BucketInfo& bi = bucket_[b];
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
  allocate(cursor);
  members_ = DeviceBuffer(backend_, member_table.size() * sizeof(Mxfp8Member));
  copy_async(backend_, members_.data(), member_table.data(), members_.bytes(), nullptr);

  // Per bucket, one table of this rank's ranges of its params (an empty range where the
  // rank owns none of a param: phase 1 still zero-fills its scales for the Max). Element
  // i of a param goes to staging byte (rank * 2S + k0 + i - param_offset): k0 is the
  // piece's offset inside this rank's slice; with shard storage, to byte
  // (shard_offset + i - param_offset) of the buffer's shard planes. The base may point
  // outside the region; the kernels only add indices of the range. Computed as integers.
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    const Bucket& bk = L.buckets()[b];
    if (!mx_buffer[static_cast<std::size_t>(bk.buffer)]) continue;
    const std::int64_t S = bk.range.size() / world;
    std::vector<Mxfp8ShardTensor> tensors;
    for (int p : bk.params) {
      const ParamInfo& pi = param_[static_cast<std::size_t>(p)];
      const MasterPiece& piece = (*ctx.masters)[static_cast<std::size_t>(p)];
      Mxfp8ShardTensor t;
      t.shape = pi.shape;
      t.range = Range{piece.param_offset, piece.param_offset + piece.length};
      t.out.scale_row = at(pi.scale_row);
      t.out.scale_col = at(pi.scale_col);
      if (piece.length > 0 && shard_storage_) {
        t.master = piece.master;
        const auto row = reinterpret_cast<std::uintptr_t>(at(shard_row_[static_cast<std::size_t>(bk.buffer)])) +
                         static_cast<std::uintptr_t>(piece.shard_offset) - static_cast<std::uintptr_t>(piece.param_offset);
        const auto col = reinterpret_cast<std::uintptr_t>(at(shard_col_[static_cast<std::size_t>(bk.buffer)])) +
                         static_cast<std::uintptr_t>(piece.shard_offset) - static_cast<std::uintptr_t>(piece.param_offset);
        t.out.data_row = reinterpret_cast<std::uint8_t*>(row);
        t.out.data_col = reinterpret_cast<std::uint8_t*>(col);
      } else if (piece.length > 0 && direct_) {  // one rank: each parameter's planes in the storage
        t.master = piece.master;
        t.out.data_row = at(pi.data_row);
        t.out.data_col = at(pi.data_col);
      } else if (piece.length > 0) {
        t.master = piece.master;
        const std::int64_t k0 = piece.shard_offset - bk.shard_offset;
        const auto base = reinterpret_cast<std::uintptr_t>(staging_[b].region);
        const std::uintptr_t row = base + static_cast<std::uintptr_t>(rank * 2 * S + k0) -
                                   static_cast<std::uintptr_t>(piece.param_offset);
        t.out.data_row = reinterpret_cast<std::uint8_t*>(row);
        t.out.data_col = reinterpret_cast<std::uint8_t*>(row + static_cast<std::uintptr_t>(S));
      }
      if (piece.length > 0) {
        const mxfp8::ShardEntry e = mxfp8::make_shard_entry(t.shape, t.range, t.master, t.out, 0);
        param_[static_cast<std::size_t>(p)].owned_begin = e.owned_begin;
        param_[static_cast<std::size_t>(p)].owned_end = e.owned_end;
      }
      tensors.push_back(t);
    }
    bucket_[b].batch = static_cast<int>(batches_.size());
    batches_.emplace_back(tensors, backend_);
    bucket_[b].tensors = std::move(tensors);
  }
  synchronize(backend_, nullptr);
}

void Mxfp8Format::landing(int bucket, std::vector<BytePiece>& table) const { land(bucket, false, table); }

// After the fused pass (issue 29, "land only the other ranks' bytes"): it wrote this
// rank's owned tile rows into the storage beside the staging (fuse_adam's copy places),
// so only the other ranks' pieces and this rank's boundary tile rows are copied.
void Mxfp8Format::landing_after_fused(int bucket, std::vector<BytePiece>& table) const { land(bucket, true, table); }

void Mxfp8Format::land(int bucket, bool skip_owned, std::vector<BytePiece>& table) const {
  if (writes_storage()) return;  // phase 2 wrote the storage itself
  const Layout& L = layout_;
  const Bucket& bk = L.buckets()[static_cast<std::size_t>(bucket)];
  const std::int64_t S = bk.range.size() / L.world_size();
  const std::uint8_t* region = staging_[static_cast<std::size_t>(bucket)].region;
  for (int r = 0; r < L.world_size(); ++r)
    for (const Segment& seg : L.segments(bk.buffer, r)) {
      if (L.params()[static_cast<std::size_t>(seg.param)].bucket != bucket) continue;
      const ParamInfo& pi = param_[static_cast<std::size_t>(seg.param)];
      const std::int64_t k0 = seg.shard_offset - bk.shard_offset;
      const std::uint8_t* src = region + static_cast<std::size_t>(r * 2 * S + k0);
      // Parameter elements [lo, hi) of the segment, at src + (i - seg.param_offset).
      auto copy = [&](std::int64_t lo, std::int64_t hi) {
        if (hi <= lo) return;
        const auto off = static_cast<std::size_t>(lo - seg.param_offset);
        split_copy(table, src + off, at(pi.data_row) + lo, hi - lo);
        split_copy(table, src + S + off, at(pi.data_col) + lo, hi - lo);
      };
      const std::int64_t end = seg.param_offset + seg.length;
      if (skip_owned && r == rank_ && pi.owned_end > pi.owned_begin) {
        copy(seg.param_offset, std::min(end, pi.owned_begin));
        copy(std::max(seg.param_offset, pi.owned_end), end);
      } else {
        copy(seg.param_offset, end);
      }
    }
}

std::vector<ShardChunk> Mxfp8Format::fuse_adam(int b, const AdamConfig& config, const ShardPointers& shard,
                                               StepScalars* scalars,
                                               const std::vector<kernels::AdamMxfp8Place>& places) const {
  const BucketInfo& bi = bucket_.at(static_cast<std::size_t>(b));
  if (bi.batch < 0) throw_internal("mxfp8_fuse_adam of a bucket that is not MXFP8");
  fused_of_.resize(bucket_.size(), -1);
  if (fused_of_[static_cast<std::size_t>(b)] >= 0) throw_internal("mxfp8_fuse_adam twice for one bucket");
  // Staged (two or more ranks): the owned tile rows' bytes also into the storage, where
  // the landing would copy them (landing_after_fused leaves them out).
  std::vector<kernels::AdamMxfp8Place> where = places;
  const std::vector<int>& params = layout_.buckets()[static_cast<std::size_t>(b)].params;
  if (!writes_storage() && where.size() == params.size())
    for (std::size_t i = 0; i < where.size(); ++i) {
      const ParamInfo& pi = param_[static_cast<std::size_t>(params[i])];
      where[i].copy_row = at(pi.data_row);
      where[i].copy_col = at(pi.data_col);
    }
  fused_.emplace_back(bi.tensors, where, config, shard, scalars, backend_);
  fused_of_[static_cast<std::size_t>(b)] = static_cast<int>(fused_.size()) - 1;
  return fused_.back().bands();
}

void Mxfp8Format::adam_pass(int b, Stream stream) const {
  const int k = static_cast<std::size_t>(b) < fused_of_.size() ? fused_of_[static_cast<std::size_t>(b)] : -1;
  if (k < 0) throw_internal("mxfp8_adam_pass of a bucket without a fused pass");
  fused_[static_cast<std::size_t>(k)].run(stream);
}

Mxfp8View Mxfp8Format::view(int param) const {
  const ParamInfo& pi = param_[static_cast<std::size_t>(param)];
  Mxfp8View v;
  v.shape = pi.shape;
  v.planes.data_row = shard_storage_ ? nullptr : at(pi.data_row);
  v.planes.scale_row = at(pi.scale_row);
  v.planes.data_col = shard_storage_ ? nullptr : at(pi.data_col);
  v.planes.scale_col = at(pi.scale_col);
  v.members = members_.as<Mxfp8Member>() + pi.members;
  return v;
}

std::uint8_t* Mxfp8Format::shard_plane(int buffer, Mxfp8Plane plane) const {
  if (!shard_storage_) throw_internal("mxfp8_shard_plane of a format that stores whole parameters");
  const auto b = static_cast<std::size_t>(buffer);
  return at(plane == Mxfp8Plane::Rowwise ? shard_row_[b] : shard_col_[b]);
}

}  // namespace

std::unique_ptr<QuantizedFormat> make_mxfp8_format(const FormatContext& ctx) {
  return std::make_unique<Mxfp8Format>(ctx);
}

Mxfp8View mxfp8_view(const QuantizedFormat& format, int param) {
  return format_as<Mxfp8Format>(format, "mxfp8_view").view(param);
}

std::vector<ShardChunk> mxfp8_fuse_adam(const QuantizedFormat& format, int bucket, const AdamConfig& config,
                                        const ShardPointers& shard, StepScalars* scalars,
                                        const std::vector<kernels::AdamMxfp8Place>& places) {
  return format_as<Mxfp8Format>(format, "mxfp8_fuse_adam").fuse_adam(bucket, config, shard, scalars, places);
}

void mxfp8_adam_pass(const QuantizedFormat& format, int bucket, Stream stream) {
  format_as<Mxfp8Format>(format, "mxfp8_adam_pass").adam_pass(bucket, stream);
}

std::uint8_t* mxfp8_shard_plane(const QuantizedFormat& format, int buffer, Mxfp8Plane plane) {
  return format_as<Mxfp8Format>(format, "mxfp8_shard_plane").shard_plane(buffer, plane);
}

}  // namespace shardopt::detail
