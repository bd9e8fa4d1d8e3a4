// muon_math.cuh - Muon's element math, compiled for host and device (the host twin and
// the CUDA kernels round alike): torch.lerp's fp32 formula, the momentum + Nesterov
// element, the Adam-like gradient scaling of the pack and the apply of an update.
#pragma once

#include <cstdint>

#include "shardopt/numerics.hpp"

namespace shardopt::kernels {

/// torch.lerp's fp32 formula: start + w (end - start) for w < 0.5, else end - (end - start)(1 - w).
SHARDOPT_HD float muon_lerp(float start, float end, float w) {
  return w < 0.5f ? start + w * (end - start) : end - (end - start) * (1.0f - w);
}

/// One element's momentum update (m in place) and the value Newton-Schulz starts from:
/// m = lerp(m, g, w_buf); nesterov ? lerp(g, m, w_nes) : m.
SHARDOPT_HD float muon_momentum(float& m, float g, float w_buf, float w_nes, bool nesterov) {
  m = muon_lerp(m, g, w_buf);
  return nesterov ? muon_lerp(g, m, w_nes) : m;
}

/// The pack's scaling of a raw gradient element, as the fused Adam scales its gradients.
SHARDOPT_HD float muon_scale_grad(float g, float inv_loss_scale, float clip_coef) { return (g * inv_loss_scale) * clip_coef; }

/// The per-step factors of the apply, formed in double and rounded to fp32 once:
/// decay = 1 - lr_g wd, step = lr_g ratio, lr_g = lr * lr_scale.
struct MuonApplyFactors {
  float decay, step;
};
SHARDOPT_HD MuonApplyFactors muon_apply_factors(float lr, double lr_scale, double weight_decay, double lr_ratio) {
  const double lr_g = static_cast<double>(lr) * lr_scale;
  return {static_cast<float>(1.0 - lr_g * weight_decay), static_cast<float>(lr_g * lr_ratio)};
}

/// The new master element: master * decay - step * u.
SHARDOPT_HD float muon_apply_element(float master, float u, MuonApplyFactors f) {
  const float p = master * f.decay;
  return p - f.step * u;
}

}  // namespace shardopt::kernels
