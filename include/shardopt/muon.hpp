// shardopt/muon.hpp - the settings of Muon, the optimizer an optimizer group may choose
// instead of AdamW (AdamGroup::algorithm), and the learning-rate adjustment it applies
// per matrix. The step follows torch.optim.Muon (docs/muon.md):
//
//   m = lerp(m, g, 1 - momentum)                     (the momentum buffer, fp32)
//   u = nesterov ? lerp(g, m, momentum) : m
//   X = u / max(||u||_F, eps), transposed when rows > cols
//   ns_steps times: A = X X^T; B = b A + c A A; X = a X + B X     ((a, b, c) = ns_coefficients)
//   p = p * (1 - lr * weight_decay) - adjusted_lr * X (transposed back)
//
// with lr = StepScalars::lr * AdamGroup::lr_scale and adjusted_lr = lr * muon_lr_ratio.
#pragma once

#include <array>
#include <cstdint>

namespace shardopt {

/// The update rule of an optimizer group. Checkpoints save a Muon matrix's momentum (the
/// kind muon_momentum, docs/checkpoints.md) and no Adam moments for it. load of a
/// checkpoint that holds Adam's moments of a parameter this optimizer updates with Muon,
/// or Muon's momentum of one it updates with AdamW, is Error(InvalidArgument) naming the
/// parameter, on every rank: optimizer state is not converted between algorithms.
enum class GroupAlgorithm {
  AdamW,  ///< the fused Adam / AdamW step (AdamOptions::decoupled_weight_decay chooses)
  Muon,   ///< momentum + Newton-Schulz orthogonalization of each 2-D matrix (MuonSettings)
};

/// torch.optim.Muon's adjust_lr_fn: how the learning rate scales with a matrix's shape
/// (rows x cols, the parameter's first two dimensions).
enum class MuonLrAdjust {
  Original,       ///< "original" (torch's default): lr * sqrt(max(1, rows / cols))
  MatchRmsAdamW,  ///< "match_rms_adamw": lr * 0.2 * sqrt(max(rows, cols))
};

/// How the CUDA path multiplies in Newton-Schulz (cuBLAS; docs/muon.md gives each
/// mode's error bound). The host backend's twin is plain fp32 in either mode.
enum class MuonGemm {
  Bf16,  ///< bf16 inputs and outputs, fp32 accumulation (torch.optim.Muon's arithmetic; the default)
  F32,   ///< fp32 inputs, outputs and accumulation (no TF32): a bound hundreds of times tighter, slower
};

/// Muon's hyper-parameters (defaults: torch.optim.Muon's). Doubles, like PyTorch's Python
/// floats; the per-step factors are formed in double and rounded to fp32 once.
struct MuonSettings {
  double momentum = 0.95;   ///< in [0, 1)
  bool nesterov = true;
  int ns_steps = 5;         ///< Newton-Schulz iterations, in [1, 100)
  std::array<double, 3> ns_coefficients{3.4445, -4.7750, 2.0315};  ///< (a, b, c) of the quintic
  double eps = 1e-7;        ///< floor of the Frobenius norm the update is divided by (> 0)
  double weight_decay = 0.1;///< decoupled: p *= 1 - lr * weight_decay
  MuonLrAdjust adjust_lr = MuonLrAdjust::Original;
  MuonGemm gemm = MuonGemm::Bf16;  ///< the CUDA Newton-Schulz GEMMs' precision (ignored on the host backend)
};

/// The factor Muon multiplies the group's learning rate by for a rows x cols matrix:
/// sqrt(max(1, rows / cols)) (Original) or 0.2 * sqrt(max(rows, cols)) (MatchRmsAdamW).
double muon_lr_ratio(MuonLrAdjust adjust, std::int64_t rows, std::int64_t cols) noexcept;

/// "adamw" / "muon", "original" / "match_rms_adamw" (torch's names), and "bf16" / "f32".
const char* to_string(GroupAlgorithm a) noexcept;
const char* to_string(MuonLrAdjust a) noexcept;
const char* to_string(MuonGemm g) noexcept;

}  // namespace shardopt
