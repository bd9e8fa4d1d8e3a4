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
  // Nothing is staged: phase 2 writes the storage (shard planes, or this rank's slice of
  // the bucket's gather planes), so there are no landing copies.
  void landing(int, std::vector<kernels::BytePiece>&) const override {}
  std::size_t storage_bytes() const override { return storage_.bytes() + planes_.bytes(); }
  std::vector<GatherPlane> gather_planes(int b) const override;
  BufferToRegister gather_memory() const override {
    return BufferToRegister{planes_.data(), planes_.bytes(), BufferUse::Collectives};
  }

  std::vector<ShardChunk> fuse_adam(int b, const AdamConfig& config, const ShardPointers& shard, StepScalars* scalars,
                                    const std::vector<kernels::AdamMxfp8Place>& places) const;
  void adam_pass(int b, Stream stream) const;

  Mxfp8View view(int param) const;
  std::uint8_t* shard_plane(int buffer, Mxfp8Plane plane) const;

 private:
  struct ParamInfo {
    bool mx = false;
    Mxfp8Shape shape;
    std::size_t data_row = 0, data_col = 0;    // byte offsets in planes_ (whole storage)
    std::size_t scale_row = 0, scale_col = 0;  // byte offsets in storage_
    std::size_t members = 0;  // entry offset in members_
  };
  struct BucketInfo {
    std::size_t plane_row = 0, plane_col = 0;    // whole storage: its gather planes in planes_
    std::size_t scale_begin = 0, scale_end = 0;  // byte span of its scales in storage_
    int batch = -1;                               // its params' ranges in batches_ (phase 1 and 2)
    std::vector<Mxfp8ShardTensor> tensors;        // the same ranges, for the fused Adam pass
  };

  std::uint8_t* plane_at(std::size_t offset) const { return planes_.as<std::uint8_t>() + offset; }

  DeviceBuffer planes_;  // whole storage: per MXFP8 bucket its rowwise and columnwise plane
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
  param_.resize(L.params().size());
  bucket_.resize(L.buckets().size());

  // Storage offsets: with shard storage the buffers' shard planes, then the scales bucket
  // by bucket. Whole storage (issue 29): the data in planes_, per MXFP8 bucket a rowwise
  // and a columnwise plane of one byte per bucket element (padding included), so that
  // rank r's slice is bytes [r S, (r + 1) S) of each (S = bucket elements / world) and the
  // store all-gathers both in place; a parameter's data is its bucket's plane at its
  // element offset inside the bucket.
  std::size_t cursor = 0, plane_cursor = 0;
  for (std::size_t b = 0; b < L.buckets().size() && !shard_storage_; ++b) {
    const Bucket& bk = L.buckets()[b];
    if (!mx_buffer[static_cast<std::size_t>(bk.buffer)]) continue;
    const auto n = static_cast<std::size_t>(bk.range.size());
    bucket_[b].plane_row = plane_cursor;
    plane_cursor = align_up(plane_cursor + n);
    bucket_[b].plane_col = plane_cursor;
    plane_cursor = align_up(plane_cursor + n);
  }
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
      // The layout aligns every parameter start (64 elements by default, and a bucket
      // starts at a parameter), so the views stay 16-byte aligned; checked, not assumed.
      const ParamPlacement& pl = L.params()[p];
      const Bucket& bk = L.buckets()[static_cast<std::size_t>(pl.bucket)];
      const auto off = static_cast<std::size_t>(pl.offset - bk.range.begin);
      if (off % 16 != 0 || pl.offset + static_cast<std::int64_t>(n) > bk.range.end)
        throw_internal("MXFP8 parameter " + std::to_string(p) + " at element " + std::to_string(off) +
                       " of its bucket: not a 16-byte aligned view inside the bucket's planes");
      pi.data_row = bucket_[static_cast<std::size_t>(pl.bucket)].plane_row + off;
      pi.data_col = bucket_[static_cast<std::size_t>(pl.bucket)].plane_col + off;
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
  if (plane_cursor > 0) {
    planes_ = DeviceBuffer(backend_, plane_cursor, ctx.gather_memory);
    fill_zero_async(backend_, planes_.data(), planes_.bytes(), nullptr);
  }
  members_ = DeviceBuffer(backend_, member_table.size() * sizeof(Mxfp8Member));
  copy_async(backend_, members_.data(), member_table.data(), members_.bytes(), nullptr);

  // Per bucket, one table of this rank's ranges of its params (an empty range where the
  // rank owns none of a param: phase 1 still zero-fills its scales for the Max). Whole
  // storage: element i of a param goes to the param's own view + i in each of its bucket's
  // planes (rank r's slice of a plane holds exactly the elements rank r owns). Shard
  // storage: to byte (shard_offset + i - param_offset) of the buffer's shard planes; that
  // base may point outside the planes, the kernels only add indices of the range
  // (computed as integers).
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
      } else if (piece.length > 0) {
        // The piece's first element sits at byte rank * S + k0 of the bucket's planes,
        // which is the parameter's view + param_offset.
        const std::int64_t k0 = piece.shard_offset - bk.shard_offset;
        if (rank * S + k0 - piece.param_offset != L.params()[static_cast<std::size_t>(p)].offset - bk.range.begin)
          throw_internal("MXFP8 parameter " + std::to_string(p) + ": its piece is not where its view puts it");
        t.master = piece.master;
        t.out.data_row = plane_at(pi.data_row);
        t.out.data_col = plane_at(pi.data_col);
      }
      tensors.push_back(t);
    }
    bucket_[b].batch = static_cast<int>(batches_.size());
    batches_.emplace_back(tensors, backend_);
    bucket_[b].tensors = std::move(tensors);
  }
  synchronize(backend_, nullptr);
}

std::vector<GatherPlane> Mxfp8Format::gather_planes(int b) const {
  const BucketInfo& bi = bucket_[static_cast<std::size_t>(b)];
  if (shard_storage_ || bi.batch < 0) return {};
  const std::int64_t S = layout_.buckets()[static_cast<std::size_t>(b)].range.size() / layout_.world_size();
  return {GatherPlane{plane_at(bi.plane_row), S}, GatherPlane{plane_at(bi.plane_col), S}};
}

std::vector<ShardChunk> Mxfp8Format::fuse_adam(int b, const AdamConfig& config, const ShardPointers& shard,
                                               StepScalars* scalars,
                                               const std::vector<kernels::AdamMxfp8Place>& places) const {
  const BucketInfo& bi = bucket_.at(static_cast<std::size_t>(b));
  if (bi.batch < 0) throw_internal("mxfp8_fuse_adam of a bucket that is not MXFP8");
  fused_of_.resize(bucket_.size(), -1);
  if (fused_of_[static_cast<std::size_t>(b)] >= 0) throw_internal("mxfp8_fuse_adam twice for one bucket");
  // The pass writes the owned tile rows' bytes once, into the storage (shard planes, or
  // this rank's slice of the gather planes): no copy places.
  fused_.emplace_back(bi.tensors, places, config, shard, scalars, backend_);
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
  v.planes.data_row = shard_storage_ ? nullptr : plane_at(pi.data_row);
  v.planes.scale_row = at(pi.scale_row);
  v.planes.data_col = shard_storage_ ? nullptr : plane_at(pi.data_col);
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
