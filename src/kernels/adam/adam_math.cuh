// adam_math.cuh - the element math of the fused Adam step, shared by the CUDA kernels
// (adam.cu) and their host twin (adam_host.cpp), so that both round identically.
//
// Which operations, in which order (torch.optim.AdamW / Adam, single-tensor path, as
// PyTorch's CUDA kernels evaluate them; nvcc contracts a + b*c there, so those places
// are explicit fmaf here, and every other operation is a single IEEE rounding):
//   g  = (grad * inv_loss_scale) * clip_coef          GradScaler unscale, then clip
//   Adam:  g = fmaf(wd, p, g)                          grad.add(param, alpha=wd)
//   AdamW: p = p * float(1 - lr*wd)                    param.mul_(1 - lr*wd)
//   m  = fmaf(w, g - m, m), w = float(1 - b1)          exp_avg.lerp_(grad, 1-b1), w < 0.5
//        (w >= 0.5: fmaf(-(g - m), 1 - w, g))
//   v  = fmaf(float(1-b2) * g, g, v * float(b2))       exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
//   d  = sqrtf(v) * (1 / float(bc2_sqrt)) + eps        (sqrt / bc2_sqrt): torch's CUDA divides
//                                                      by a CPU scalar as a reciprocal multiply
//   p  = fmaf(-float(lr/bc1), m / d, p)                param.addcdiv_(m, d, value=-step_size)
// The scalar factors are computed in double and rounded once to float, as PyTorch does
// with Python floats; bc1 = 1 - b1^t and bc2 = 1 - b2^t use an integer power by
// repeated squaring (the same IEEE double operations on device and host; glibc's pow
// and CUDA's pow may differ in the last double bit).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/nvfp4/nvfp4_math.cuh"
#include "shardopt/fused_adam.hpp"
#include "shardopt/numerics.hpp"

/// `#pragma unroll` in device compilation only (host compilers warn about it).
#if defined(__CUDA_ARCH__)
#define SHARDOPT_DEVICE_UNROLL _Pragma("unroll")
#else
#define SHARDOPT_DEVICE_UNROLL
#endif

namespace shardopt::kernels {

/// Threads per block of the main Adam kernel.
inline constexpr int kAdamThreads = 256;
/// Elements one thread updates per loop iteration (one or two vectors).
inline constexpr int kAdamElementsPerIter = 8;

/// Which kernel variant: grad, moment and param-output dtypes, Adam vs AdamW.
struct AdamVariant {
  DType grad = DType::f32;
  DType moment = DType::f32;
  DType param = DType::bf16;
  bool write_params = true;
  bool decoupled = true;
  /// The master is the bf16 parameter plus a 16-bit remainder (needs bf16 params written):
  /// no fp32 master is read or written (numerics.hpp, "bf16 parameter + 16-bit remainder").
  bool remainder = false;
};

/// Inputs of the one-thread prologue (from AdamConfig, by value).
struct AdamPrologueParams {
  double beta1 = 0.9;
  double beta2 = 0.999;
  int num_groups = 1;
  bool decoupled = true;
  double lr_scale[kMaxAdamGroups] = {};
  double weight_decay[kMaxAdamGroups] = {};
};

/// Constant fp32 factors of the element update (from AdamConfig, by value).
struct AdamElementConsts {
  float beta2 = 0.999f;            ///< float(beta2)
  float one_minus_beta1 = 0.1f;    ///< float(1 - beta1), formed in double
  float beta1_rounded = 0.9f;      ///< 1.0f - one_minus_beta1 in float (adam_moments' form for w >= 0.5)
  float one_minus_beta2 = 0.001f;  ///< float(1 - beta2), formed in double
  float eps = 1e-8f;               ///< float(eps)
  float l2[kMaxAdamGroups] = {};   ///< float(weight_decay) per group (Adam's L2 term)
};

/// Where the main pass emits the NVFP4 partial amaxes of one chunk (one entry per chunk,
/// parallel to the chunk table; docs/nvfp4.md, "Adam emits the partial amaxes"): the
/// u32 buffers of the chunk's parameter, member after member, as nvfp4_partial_amax
/// lays them out (per member its blocks' entries, then the range's amax).
struct AdamAmaxChunk {
  std::uint32_t* amax = nullptr;  ///< member 0's buffer; null: the chunk emits nothing
  std::int64_t first = 0;         ///< parameter-local index of the chunk's first element
  std::int64_t member_numel = 1;  ///< elements of one member (rows * cols)
  std::int64_t cols = 1;          ///< columns of a member
  std::int64_t block_cols = 1;    ///< ceil(cols / 16)
  std::int64_t amax_numel = 2;    ///< entries per member: blocks + 1
};

/// Everything the main pass reads: the shard, the constants and the device scalars.
struct AdamApplyParams {
  const ShardChunk* chunks = nullptr;
  std::int64_t num_chunks = 0;
  const void* grads = nullptr;
  void* params = nullptr;
  float* master = nullptr;
  std::uint16_t* remainder = nullptr;  ///< remainder variants: by shard index, instead of master
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  float* exp_avg_scale = nullptr;     ///< q8_block moments: one scale per kMomentBlock moment elements
  float* exp_avg_sq_scale = nullptr;
  const StepScalars* scalars = nullptr;
  AdamElementConsts consts;
  int num_groups = 1;
  bool vector_ok = true;  ///< every base pointer 16-byte aligned
  /// Per chunk (indexed like `chunks`), where to emit NVFP4 partial amaxes; null: none.
  /// Only for variants that write no params (NVFP4 buffers have none).
  const AdamAmaxChunk* amax = nullptr;
};

/// The exchanged amax of one new master value: amax_bits of bf16(p), as phase 1 of the
/// sharded NVFP4 quantize reads it (NaN, Inf and values rounding to Inf: 0x7FC00000).
SHARDOPT_HD std::uint32_t adam_amax_of(float p) { return nvfp4::amax_bits(nvfp4::master_to_bf16(p)); }

/// The u32 entry of the 16 x 16 block holding parameter-local element q.
SHARDOPT_HD std::int64_t adam_amax_block_slot(const AdamAmaxChunk& t, std::int64_t q) {
  const std::int64_t g = q / t.member_numel, e = q - g * t.member_numel;
  const std::int64_t r = e / t.cols, c = e - r * t.cols;
  return g * t.amax_numel + (r / 16) * t.block_cols + c / 16;
}

/// The u32 entry of the range's amax of the member holding parameter-local element q.
SHARDOPT_HD std::int64_t adam_amax_tensor_slot(const AdamAmaxChunk& t, std::int64_t q) {
  return (q / t.member_numel + 1) * t.amax_numel - 1;
}

/// Host twin of the emission: folds element q's new master p into its block's and its
/// member's entries (integer max of the bits: the order of elements does not matter).
inline void host_emit_amax(const AdamAmaxChunk& t, std::int64_t q, float p) {
  const std::uint32_t v = adam_amax_of(p);
  std::uint32_t& b = t.amax[adam_amax_block_slot(t, q)];
  std::uint32_t& m = t.amax[adam_amax_tensor_slot(t, q)];
  b = v > b ? v : b;
  m = v > m ? v : m;
}

/// base^n for n >= 0 by repeated squaring: deterministic IEEE double operations.
SHARDOPT_HD double pow_int(double base, std::int64_t n) {
  double result = 1.0;
  double x = base;
  while (n > 0) {
    if (n & 1) result *= x;
    x *= x;
    n >>= 1;
  }
  return result;
}

/// The one-thread prologue: unless found_inf is set, step += 1 and the derived factors.
SHARDOPT_HD void adam_prologue(const AdamPrologueParams& c, StepScalars* s) {
  if (s->found_inf != 0) return;
  const std::int64_t step = s->step + 1;
  s->step = step;
  const double bc1 = 1.0 - pow_int(c.beta1, step);
  const double bc2 = 1.0 - pow_int(c.beta2, step);
  const double lr = static_cast<double>(s->lr);
  s->step_size = static_cast<float>(lr / bc1);
  s->bc2_sqrt = static_cast<float>(sqrt(bc2));
  for (int g = 0; g < kMaxAdamGroups; ++g) {
    if (g >= c.num_groups) {
      s->group_step_size[g] = 0.0f;
      s->group_decay[g] = 1.0f;
      continue;
    }
    const double lr_g = lr * c.lr_scale[g];
    s->group_step_size[g] = static_cast<float>(lr_g / bc1);
    s->group_decay[g] = c.decoupled ? static_cast<float>(1.0 - lr_g * c.weight_decay[g]) : 1.0f;
  }
}

/// Per-chunk values of one step (one optimizer group).
struct AdamStepValues {
  float inv_loss_scale;
  float clip_coef;
  float inv_bc2_sqrt;  ///< 1.0f / bc2_sqrt (fp32 division, as torch forms it)
  float step_size;     ///< group_step_size[group]
  float decay;         ///< group_decay[group] (AdamW)
  float l2;            ///< float(weight_decay) of the group (Adam)
};

/// The update of one element, first part: the gradient's scaling, the decay (AdamW) or L2
/// term (Adam), and the new moments. p (fp32 master), m, v (fp32 values of the moments).
template <bool kDecoupled>
SHARDOPT_HD void adam_moments(const AdamElementConsts& c, const AdamStepValues& s, float grad, float& p, float& m,
                              float& v) {
  float g = grad * s.inv_loss_scale;
  g = g * s.clip_coef;
  if constexpr (kDecoupled) {
    p = p * s.decay;
  } else {
    g = fmaf(s.l2, p, g);
  }
  const float w = c.one_minus_beta1;
  const float diff = g - m;
  m = w < 0.5f ? fmaf(w, diff, m) : fmaf(-diff, c.beta1_rounded, g);
  v = fmaf(c.one_minus_beta2 * g, g, v * c.beta2);
}

/// Second part: Adam's denominator from sqrt_v = sqrtf(new v).
SHARDOPT_HD float adam_denominator(const AdamElementConsts& c, const AdamStepValues& s, float sqrt_v) {
  return sqrt_v * s.inv_bc2_sqrt + c.eps;
}

/// Last part: the master's step by quotient = m / denominator.
SHARDOPT_HD void adam_apply_quotient(const AdamStepValues& s, float quotient, float& p) {
  p = fmaf(-s.step_size, quotient, p);
}

/// The update of one element: p (fp32 master), m, v (fp32 values of the moments). The three
/// parts in order, with IEEE sqrtf and division between them (a kernel may interleave
/// several elements between the parts: adam_q8.cu).
template <bool kDecoupled>
SHARDOPT_HD void adam_element(const AdamElementConsts& c, const AdamStepValues& s, float grad,
                              float& p, float& m, float& v) {
  adam_moments<kDecoupled>(c, s, grad, p, m, v);
  adam_apply_quotient(s, m / adam_denominator(c, s, sqrtf(v)), p);
}

/// Storage element type of a dtype (f32 -> float, bf16/f16 -> uint16_t).
template <DType T>
using storage_t = typename num::Storage<T>::type;

/// Elements per 16-byte vector of an Adam variant: 16 bytes of its narrowest array (4 when
/// grads, moments and any params it writes are all fp32, else 8).
SHARDOPT_HD constexpr int adam_vec_elems(DType grad, DType moment, DType param, bool write_params) {
  return (grad == DType::f32 && moment == DType::f32 && (!write_params || param == DType::f32)) ? 4 : 8;
}

/// A variant fixed at compile time.
template <DType G, DType M, DType P, bool kWriteParams, bool kDecoupled, bool kRemainder = false>
struct AdamTraits {
  static_assert(!kRemainder || (kWriteParams && P == DType::bf16), "remainders go with written bf16 params");
  static constexpr DType grad = G;
  static constexpr DType moment = M;
  static constexpr DType param = P;
  static constexpr bool write_params = kWriteParams;
  static constexpr bool decoupled = kDecoupled;
  /// The master is the bf16 param plus a remainder (AdamVariant::remainder).
  static constexpr bool remainder = kRemainder;
  /// Elements per vector (adam_vec_elems).
  static constexpr int vec = adam_vec_elems(G, M, P, kWriteParams);
};

/// Reads the step values of one group from the device scalars.
SHARDOPT_HD AdamStepValues adam_step_values(const AdamApplyParams& a, int group) {
  const StepScalars* s = a.scalars;
  AdamStepValues v;
  v.inv_loss_scale = s->inv_loss_scale;
  v.clip_coef = s->clip_coef;
  v.inv_bc2_sqrt = 1.0f / s->bc2_sqrt;
  v.step_size = s->group_step_size[group];
  v.decay = s->group_decay[group];
  // Selected with constant indices (a fully unrolled loop: no local-memory copy of the
  // kernel-parameter array on the device).
  float l2 = 0.0f;
  SHARDOPT_DEVICE_UNROLL
  for (int g = 0; g < kMaxAdamGroups; ++g)
    if (g == group) l2 = a.consts.l2[g];
  v.l2 = l2;
  return v;
}

/// The master of one element (fp32 master, or bf16 parameter + remainder) at shard index
/// si / buffer index bi.
template <class Tr>
SHARDOPT_HD float adam_load_master(const AdamApplyParams& a, std::int64_t si, std::int64_t bi) {
  if constexpr (Tr::remainder) {
    return num::remainder_join(static_cast<const std::uint16_t*>(a.params)[bi], a.remainder[si]);
  } else {
    return a.master[si];
  }
}

/// Stores one element's new master (and its parameter when the variant writes them).
template <class Tr>
SHARDOPT_HD void adam_store_master(const AdamApplyParams& a, std::int64_t si, std::int64_t bi, float p) {
  if constexpr (Tr::remainder) {
    static_cast<std::uint16_t*>(a.params)[bi] = num::remainder_split_param(p);
    a.remainder[si] = num::remainder_split_low(p);
  } else {
    a.master[si] = p;
    if constexpr (Tr::write_params) {
      using PT = storage_t<Tr::param>;
      static_cast<PT*>(a.params)[bi] = num::Storage<Tr::param>::store(p);
    }
  }
}

/// Updates one element by scalar accesses: shard index si, buffer index bi, moment index
/// si - ms (ShardChunk::moment_shift). Returns the new master value.
template <class Tr>
SHARDOPT_HD float adam_scalar(const AdamApplyParams& a, const AdamStepValues& sv, std::int64_t si,
                             std::int64_t bi, std::int64_t ms) {
  using GT = storage_t<Tr::grad>;
  using MT = storage_t<Tr::moment>;
  const float grad = num::Storage<Tr::grad>::load(static_cast<const GT*>(a.grads)[bi]);
  MT* m_ptr = static_cast<MT*>(a.exp_avg);
  MT* v_ptr = static_cast<MT*>(a.exp_avg_sq);
  float p = adam_load_master<Tr>(a, si, bi);
  float m = num::Storage<Tr::moment>::load(m_ptr[si - ms]);
  float v = num::Storage<Tr::moment>::load(v_ptr[si - ms]);
  adam_element<Tr::decoupled>(a.consts, sv, grad, p, m, v);
  m_ptr[si - ms] = num::Storage<Tr::moment>::store(m);
  v_ptr[si - ms] = num::Storage<Tr::moment>::store(v);
  adam_store_master<Tr>(a, si, bi, p);
  return p;
}

/// How a chunk splits into a scalar head, a vector body and a scalar tail. Without a
/// common alignment of shard and buffer offsets (or without aligned bases) the head is
/// the whole chunk.
struct ChunkSplit {
  std::int64_t head = 0;  ///< scalar elements before the first vector
  std::int64_t nvec = 0;  ///< vectors of `vec` elements
};

SHARDOPT_HD ChunkSplit split_chunk(const ShardChunk& ch, int vec, bool vector_ok) {
  ChunkSplit s;
  if (!vector_ok || (ch.shard_offset - ch.buffer_offset) % vec != 0 || ch.moment_shift % vec != 0) {
    s.head = ch.length;
    return s;
  }
  std::int64_t head = (vec - ch.shard_offset % vec) % vec;
  if (head > ch.length) head = ch.length;
  s.head = head;
  s.nvec = (ch.length - head) / vec;
  return s;
}

/// Calls f.template operator()<Traits>() for the variant's compiled instantiation.
/// kWithRemainder: also the remainder variants (the plain Adam pass; other users of the
/// element math keep an fp32 master and compile none of them). kMomentsOwn: the caller
/// handles the moments itself (the 8-bit pass): only Traits with f32 moments are compiled.
template <bool kWithRemainder = false, bool kMomentsOwn = false, class F>
void dispatch_adam_variant(const AdamVariant& v, F&& f) {
  auto with_p = [&]<DType G, DType M>() {
    if constexpr (kWithRemainder) {
      if (v.remainder) {
        if (v.decoupled)
          f.template operator()<AdamTraits<G, M, DType::bf16, true, true, true>>();
        else
          f.template operator()<AdamTraits<G, M, DType::bf16, true, false, true>>();
        return;
      }
    }
    auto with_d = [&]<DType P, bool W>() {
      if (v.decoupled)
        f.template operator()<AdamTraits<G, M, P, W, true>>();
      else
        f.template operator()<AdamTraits<G, M, P, W, false>>();
    };
    if (!v.write_params) return with_d.template operator()<DType::f32, false>();
    switch (v.param) {
      case DType::f32: return with_d.template operator()<DType::f32, true>();
      case DType::bf16: return with_d.template operator()<DType::bf16, true>();
      default: return with_d.template operator()<DType::f16, true>();
    }
  };
  auto with_m = [&]<DType G>() {
    if constexpr (kMomentsOwn) {
      with_p.template operator()<G, DType::f32>();
    } else if (v.moment == DType::bf16) {
      with_p.template operator()<G, DType::bf16>();
    } else {
      with_p.template operator()<G, DType::f32>();
    }
  };
  switch (v.grad) {
    case DType::f32: return with_m.template operator()<DType::f32>();
    case DType::bf16: return with_m.template operator()<DType::bf16>();
    default: return with_m.template operator()<DType::f16>();
  }
}

}  // namespace shardopt::kernels
