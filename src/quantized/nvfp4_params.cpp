#include "quantized/nvfp4_params.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "core/check.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {
namespace {

/// One member's part of a segment: elements `range` of member `member`, whose first
/// element is element `param_first` of the parameter.
struct MemberPiece {
  int member = 0;
  Range range;
  std::int64_t param_first = 0;
};

/// The member pieces of a segment, in element order.
std::vector<MemberPiece> member_pieces(const ParamPlacement& pl, std::int64_t offset, std::int64_t length) {
  std::vector<MemberPiece> out;
  const std::int64_t m = pl.member_numel;
  for (std::int64_t e = offset; e < offset + length;) {
    const auto g = static_cast<int>(e / m);
    const std::int64_t end = std::min(offset + length, (g + 1) * m);
    out.push_back(MemberPiece{g, Range{e - g * m, end - g * m}, e});
    e = end;
  }
  return out;
}

/// The member shape of a spec (its leading dims folded into rows).
Nvfp4Shape member_shape(const ParamSpec& spec) {
  return Nvfp4Shape::of(spec.member_shapes.empty() ? spec.shape : spec.member_shapes.front());
}

/// Calls f(segment, piece, staged byte position in rank r's slice) for every member
/// piece of rank r's segments of bucket b, in staging order; returns the slice's bytes.
template <class F>
std::int64_t for_staged_pieces(const Layout& L, int bucket, int r, F f) {
  const Bucket& bk = L.buckets()[static_cast<std::size_t>(bucket)];
  std::int64_t pos = 0;
  for (const Segment& seg : L.segments(bk.buffer, r)) {
    const ParamPlacement& pl = L.params()[static_cast<std::size_t>(seg.param)];
    if (pl.bucket != bucket) continue;
    for (const MemberPiece& mp : member_pieces(pl, seg.param_offset, seg.length)) {
      f(seg, mp, pos);
      pos += nvfp4_shard_bytes(mp.range).size();
    }
  }
  return pos;
}

class Nvfp4Format final : public StoredFormat {
 public:
  explicit Nvfp4Format(const FormatContext& ctx);

  const char* name() const override { return "NVFP4"; }
  DType exchange_dtype() const override { return DType::u32; }
  std::uint8_t* exchange_begin(int b) const override { return at(bucket_[static_cast<std::size_t>(b)].amax_begin); }
  std::uint8_t* exchange_end(int b) const override { return at(bucket_[static_cast<std::size_t>(b)].amax_end); }
  void partials(int b, Stream stream) const override { nvfp4_partial_amax_batch(batch(b), backend_, stream); }
  void quantize(int b, Stream stream) const override { quantize_nvfp4_shard_batch(batch(b), backend_, stream); }
  void landing(int b, std::vector<kernels::BytePiece>& table) const override;

  Nvfp4View view(int param) const;
  std::optional<kernels::AdamAmaxChunk> adam_amax(int param) const;

 private:
  struct ParamInfo {
    bool quantized = false;
    Nvfp4Shape shape;  // one member
    std::int64_t members = 1;
    std::size_t data = 0, amax_u32 = 0, scale = 0, amax = 0, decode = 0;  // byte offsets in storage_
  };
  struct BucketInfo {
    std::size_t amax_begin = 0, amax_end = 0;  // byte span of its u32 exchange buffers in storage_
    int batch = -1;
  };
  const Nvfp4ShardBatch& batch(int b) const {
    return batches_[static_cast<std::size_t>(bucket_[static_cast<std::size_t>(b)].batch)];
  }

  std::vector<ParamInfo> param_;
  std::vector<BucketInfo> bucket_;
  std::vector<Nvfp4ShardBatch> batches_;  // per NVFP4 bucket: every member of its params
};

Nvfp4Format::Nvfp4Format(const FormatContext& ctx) : StoredFormat(ctx) {
  if (shard_storage_) throw_internal("NVFP4 has no shard storage (Fsdp refuses ParamFormat::Nvfp4)");
  const Layout& L = layout_;
  const std::vector<bool>& quantized = *ctx.buffers;
  param_.resize(L.params().size());
  bucket_.resize(L.buckets().size());

  std::size_t cursor = 0;
  for (std::size_t p = 0; p < L.params().size(); ++p) {
    const ParamPlacement& pl = L.params()[p];
    if (!quantized[static_cast<std::size_t>(pl.buffer)]) continue;
    ParamInfo& pi = param_[p];
    pi.quantized = true;
    pi.shape = member_shape(L.specs()[p]);
    pi.members = pl.members;
    SHARDOPT_REQUIRE(pi.shape.numel() == pl.member_numel, ErrorCode::Internal,
                     "NVFP4 parameter '" + L.specs()[p].name + "': member shape and layout disagree");
    pi.data = cursor;
    cursor = align_up(cursor + static_cast<std::size_t>(pi.members * pi.shape.data_bytes()));
  }
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    const Bucket& bk = L.buckets()[b];
    if (!quantized[static_cast<std::size_t>(bk.buffer)]) continue;
    bucket_[b].amax_begin = cursor;
    for (int p : bk.params) {
      ParamInfo& pi = param_[static_cast<std::size_t>(p)];
      pi.amax_u32 = cursor;
      cursor += static_cast<std::size_t>(pi.members * pi.shape.amax_numel()) * sizeof(std::uint32_t);
    }
    cursor = align_up(cursor);
    bucket_[b].amax_end = cursor;
  }
  for (ParamInfo& pi : param_) {
    if (!pi.quantized) continue;
    pi.scale = cursor;
    cursor = align_up(cursor + static_cast<std::size_t>(pi.members * pi.shape.scale_numel()));
    pi.amax = cursor;
    cursor = align_up(cursor + static_cast<std::size_t>(pi.members) * sizeof(float));
    pi.decode = cursor;
    cursor = align_up(cursor + static_cast<std::size_t>(pi.members) * sizeof(float));
  }
  allocate(cursor);

  // Per bucket, one table of every member of its params: this rank's range of it (empty
  // where it owns none: phase 1 still zeroes its exchange buffer for the Max), its
  // master, and where phase 2 writes its bytes in this rank's staging slice.
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    const Bucket& bk = L.buckets()[b];
    if (!quantized[static_cast<std::size_t>(bk.buffer)]) continue;
    std::map<std::pair<int, int>, Nvfp4ShardTensor> mine;
    std::uint8_t* slice = staging_[b].region + static_cast<std::size_t>(ctx.rank * staging_[b].rank_bytes);
    for_staged_pieces(L, static_cast<int>(b), ctx.rank, [&](const Segment& seg, const MemberPiece& mp, std::int64_t pos) {
      const MasterPiece& piece = (*ctx.masters)[static_cast<std::size_t>(seg.param)];
      Nvfp4ShardTensor t;
      t.range = mp.range;
      t.master = piece.master + (mp.param_first - piece.param_offset);
      t.out.data = slice + pos;
      mine[{seg.param, mp.member}] = t;
    });
    std::vector<Nvfp4ShardTensor> tensors;
    for (int p : bk.params) {
      const ParamInfo& pi = param_[static_cast<std::size_t>(p)];
      for (int g = 0; g < static_cast<int>(pi.members); ++g) {
        const auto it = mine.find({p, g});
        Nvfp4ShardTensor t = it == mine.end() ? Nvfp4ShardTensor{} : it->second;
        t.shape = pi.shape;
        t.amax = reinterpret_cast<std::uint32_t*>(at(pi.amax_u32)) + g * pi.shape.amax_numel();
        std::uint8_t* const staged = t.out.data;  // this rank's bytes go to the staging (null: none)
        t.out = view(p).member(g);
        if (direct_ && staged != nullptr) {
          // One rank: the storage bytes of its range (no byte is shared with another rank).
          t.out.data += nvfp4_shard_bytes(t.range).begin;
        } else {
          t.out.data = staged;
        }
        tensors.push_back(t);
      }
    }
    bucket_[b].batch = static_cast<int>(batches_.size());
    batches_.emplace_back(tensors, backend_);
  }
  synchronize(backend_, nullptr);
}

void Nvfp4Format::landing(int bucket, std::vector<kernels::BytePiece>& table) const {
  if (writes_storage()) return;  // phase 2 wrote the storage itself
  const Layout& L = layout_;
  const Staging& st = staging_[static_cast<std::size_t>(bucket)];
  // The staged address of the last byte of the piece of (param, member) that ends at an
  // element, for the next rank's piece that starts there mid-byte.
  std::map<std::tuple<int, int, std::int64_t>, const std::uint8_t*> last_byte;
  for (int r = 0; r < L.world_size(); ++r) {
    const std::uint8_t* slice = st.region + static_cast<std::size_t>(r * st.rank_bytes);
    for_staged_pieces(L, bucket, r, [&](const Segment& seg, const MemberPiece& mp, std::int64_t pos) {
      const std::int64_t numel = param_[static_cast<std::size_t>(seg.param)].shape.numel();
      const Range bytes = nvfp4_shard_bytes(mp.range);
      const std::uint8_t* src = slice + pos;
      std::uint8_t* dst = view(seg.param).member(mp.member).data;
      // A byte shared with the previous rank (odd begin) or the next one (odd end that
      // is not the member's last element) is ORed / left to the next rank's piece.
      const bool shared_front = mp.range.begin % 2 != 0;
      const bool shared_back = mp.range.end % 2 != 0 && mp.range.end < numel;
      if (shared_front) {
        const auto prev = last_byte.find({seg.param, mp.member, mp.range.begin});
        SHARDOPT_REQUIRE(prev != last_byte.end(), ErrorCode::Internal,
                         "NVFP4 landing: no piece ends where a piece starts mid-byte");
        table.push_back(kernels::BytePiece{src, dst + bytes.begin, 1, prev->second});
      }
      const std::int64_t first = bytes.begin + (shared_front ? 1 : 0);
      const std::int64_t last = bytes.end - (shared_back ? 1 : 0);
      if (last > first) kernels::split_copy(table, src + (first - bytes.begin), dst + first, last - first);
      if (shared_back) last_byte[{seg.param, mp.member, mp.range.end}] = src + (bytes.size() - 1);
    });
  }
}

std::optional<kernels::AdamAmaxChunk> Nvfp4Format::adam_amax(int param) const {
  const ParamInfo& pi = param_[static_cast<std::size_t>(param)];
  if (!pi.quantized) return std::nullopt;
  kernels::AdamAmaxChunk t;
  t.amax = reinterpret_cast<std::uint32_t*>(at(pi.amax_u32));
  t.member_numel = pi.shape.numel();
  t.cols = pi.shape.cols;
  t.block_cols = pi.shape.block_cols();
  t.amax_numel = pi.shape.amax_numel();
  return t;
}

Nvfp4View Nvfp4Format::view(int param) const {
  const ParamInfo& pi = param_[static_cast<std::size_t>(param)];
  Nvfp4View v;
  v.shape = pi.shape;
  v.members = pi.members;
  v.planes.data = at(pi.data);
  v.planes.scale = at(pi.scale);
  v.planes.amax = reinterpret_cast<float*>(at(pi.amax));
  v.planes.decode_scale = reinterpret_cast<float*>(at(pi.decode));
  return v;
}

}  // namespace

std::vector<std::int64_t> nvfp4_staged_rank_bytes(const Layout& L, const std::vector<bool>& quantized) {
  std::vector<std::int64_t> out(L.buckets().size(), 0);
  for (std::size_t b = 0; b < out.size(); ++b) {
    if (!quantized[static_cast<std::size_t>(L.buckets()[b].buffer)]) continue;
    for (int r = 0; r < L.world_size(); ++r)
      out[b] = std::max(out[b], for_staged_pieces(L, static_cast<int>(b), r,
                                                  [](const Segment&, const MemberPiece&, std::int64_t) {}));
    out[b] = std::max<std::int64_t>(out[b], 1);  // a bucket of padding only still gathers a byte
  }
  return out;
}

std::unique_ptr<QuantizedFormat> make_nvfp4_format(const FormatContext& ctx) {
  return std::make_unique<Nvfp4Format>(ctx);
}

std::optional<kernels::AdamAmaxChunk> nvfp4_adam_amax(const QuantizedFormat& format, int param) {
  return format_as<Nvfp4Format>(format, "nvfp4_adam_amax").adam_amax(param);
}

Nvfp4View nvfp4_view(const QuantizedFormat& format, int param) {
  return format_as<Nvfp4Format>(format, "nvfp4_view").view(param);
}

}  // namespace shardopt::detail
