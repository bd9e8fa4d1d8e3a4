// cuda_weights.cu - CudaOps' weight forms for the GEMMs: discrete expert tensors packed into
// one grouped tensor (pack), and MXFP8 parameters decoded to bf16 (dequantize_mxfp8); both
// skip their work when the device says the weights are current.
#include <algorithm>
#include <stdexcept>

#include "cuda_ops.cuh"

namespace trainer::gpu {
namespace {

struct PackArgs {
  const void* src[kMaxExperts];
  int count = 0;
  i64 numel = 0;  // of each source (bf16 elements)
};

// dst[i] = concatenation of the sources, unless the device says the weights are current.
__global__ void k_pack(PackArgs a, bf16* dst, const shardopt::MicrobatchState* skip) {
  if (skip != nullptr && skip->skip_weight_update != 0) return;
  const bool vec = a.numel % 8 == 0;
  const i64 per = vec ? a.numel / 8 : a.numel;
  const i64 total = per * a.count;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < total; i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 g = i / per, j = i % per;
    if (vec)
      reinterpret_cast<uint4*>(dst + g * a.numel)[j] = reinterpret_cast<const uint4*>(a.src[g])[j];
    else
      dst[g * a.numel + j] = static_cast<const bf16*>(a.src[g])[j];
  }
}

struct DequantArgs {
  const std::uint8_t* data[kMaxExperts];
  const std::uint8_t* scale[kMaxExperts];
  const shardopt::Mxfp8Member* members[kMaxExperts];  // device tables, or null (contiguous)
  i64 groups[kMaxExperts];      // G of each source
  i64 rows[kMaxExperts];
  i64 cols[kMaxExperts];
  i64 out_offset[kMaxExperts];  // first output element of each source
  bool colwise[kMaxExperts];    // the source is a columnwise plane (FSDP backward)
  int count = 0;
};

// dst = bf16 of the sources' planes (blockIdx.y = source), unless the device says the
// weights are current. A thread decodes a run of 8 elements of one row when the row
// length is a multiple of 8 and the plane is rowwise (one scale byte: a run never crosses
// a 32-element block; an 8-byte load and a 16-byte store where aligned), else one element
// (a columnwise plane has a scale byte per column of a 32-row block).
__global__ void k_dequantize_mxfp8(DequantArgs a, bf16* dst, const shardopt::MicrobatchState* skip) {
  if (skip != nullptr && skip->skip_weight_update != 0) return;
  const int s = blockIdx.y;
  const i64 rows = a.rows[s], cols = a.cols[s], member_numel = rows * cols;
  const i64 row_blocks = (cols + shardopt::kMxfp8Block - 1) / shardopt::kMxfp8Block;
  const shardopt::Mxfp8Member* table = a.members[s];
  const std::uint8_t* data = a.data[s];
  const std::uint8_t* scale = a.scale[s];
  const bool col = a.colwise[s];
  const i64 col_blocks = (rows + shardopt::kMxfp8Block - 1) / shardopt::kMxfp8Block;
  const int run = !col && cols % 8 == 0 ? 8 : 1;
  const i64 runs = a.groups[s] * member_numel / run;
  bf16* out = dst + a.out_offset[s];
  for (i64 k = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; k < runs; k += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 e = k * run;  // element of this source's output: member g, row r, column c
    const i64 g = e / member_numel, rem = e % member_numel, r = rem / cols, c = rem % cols;
    const i64 data_at = table != nullptr ? table[g].element_offset : g * member_numel;
    const i64 scale_at = table != nullptr ? (col ? table[g].scale_col_offset : table[g].scale_row_offset)
                                          : (col ? g * col_blocks * cols : g * rows * row_blocks);
    const std::uint8_t* in = data + data_at + r * cols + c;
    const std::uint8_t sc = scale[scale_at + (col ? (r / shardopt::kMxfp8Block) * cols + c
                                                  : r * row_blocks + c / shardopt::kMxfp8Block)];
    if (run == 1) {
      out[e] = math::mxfp8_to_bf16(in[0], sc);
      continue;
    }
    std::uint8_t b[8];
    if (reinterpret_cast<std::uintptr_t>(in) % 8 == 0) {
      const uint2 v = *reinterpret_cast<const uint2*>(in);
      memcpy(b, &v, 8);
    } else {
      for (int j = 0; j < 8; ++j) b[j] = in[j];
    }
    bf16 o[8];
    for (int j = 0; j < 8; ++j) o[j] = math::mxfp8_to_bf16(b[j], sc);
    if (reinterpret_cast<std::uintptr_t>(out + e) % 16 == 0) {
      uint4 v;
      memcpy(&v, o, 16);
      *reinterpret_cast<uint4*>(out + e) = v;
    } else {
      for (int j = 0; j < 8; ++j) out[e + j] = o[j];
    }
  }
}

}  // namespace

void CudaOps::pack(const std::vector<Tensor>& src, const Tensor& dst, const shardopt::MicrobatchState* skip,
                   Stream s) {
  if (src.empty() || src.size() > static_cast<std::size_t>(kMaxExperts))
    throw std::invalid_argument("pack: 1..kMaxExperts sources");
  PackArgs a;
  a.count = static_cast<int>(src.size());
  a.numel = src.front().numel;
  bool aligned = reinterpret_cast<std::uintptr_t>(dst.data) % 16 == 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i].elem != Elem::bf16 || src[i].numel != a.numel)
      throw std::invalid_argument("pack: bf16 sources of equal length");
    a.src[i] = src[i].data;
    aligned = aligned && reinterpret_cast<std::uintptr_t>(src[i].data) % 16 == 0;
  }
  if (!aligned && a.numel % 8 == 0)
    throw std::invalid_argument("pack: expert weights must start on 16-byte boundaries");
  k_pack<<<blocks_for(a.numel * a.count / 8 + 1), kThreads, 0, cu(s)>>>(a, dst.as<bf16>(), skip);
  TRAINER_LAUNCHED();
}

void CudaOps::dequantize_mxfp8(const std::vector<Mxfp8Source>& src, const Tensor& dst, const shardopt::MicrobatchState* skip,
                               Stream s) {
  check_mxfp8_sources(src, dst);
  DequantArgs a;
  a.count = static_cast<int>(src.size());
  i64 offset = 0, most = 1;
  for (int i = 0; i < a.count; ++i) {
    const Mxfp8Source& x = src[static_cast<std::size_t>(i)];
    a.data[i] = x.data;
    a.scale[i] = x.scale;
    a.members[i] = x.members;
    a.groups[i] = x.shape.members;
    a.rows[i] = x.shape.rows;
    a.cols[i] = x.shape.cols;
    a.out_offset[i] = offset;
    a.colwise[i] = x.plane == shardopt::Mxfp8Plane::Columnwise;
    offset += x.shape.numel();
    most = std::max<i64>(most, x.shape.numel() / (!a.colwise[i] && x.shape.cols % 8 == 0 ? 8 : 1));
  }
  const dim3 grid(blocks_for(most), static_cast<unsigned>(a.count));
  k_dequantize_mxfp8<<<grid, kThreads, 0, cu(s)>>>(a, dst.as<bf16>(), skip);
  TRAINER_LAUNCHED();
}

}  // namespace trainer::gpu
