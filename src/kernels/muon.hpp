// muon.hpp - the kernels of a distributed Muon step (docs/muon.md): the pack of this
// rank's gradient pieces into the all-to-all send buffer, the copies between the
// exchange buffers and the whole matrices a home rank holds, the per-matrix momentum +
// Newton-Schulz update, and the apply of the returned update to the fp32 master (and the
// parameter slices). Every call is stream-ordered, reads its per-step values (lr, loss
// scale, clip coefficient, found-inf) from StepScalars when it runs, and so captures.
// The host backend runs the plain CPU twins below (fp32 GEMMs, fp32 accumulation in a
// fixed order); the CUDA path is not written yet (Error(Unsupported) at construction).
#pragma once

#include <cstdint>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/muon.hpp"

namespace shardopt::kernels {

/// One run of gradient elements into the send buffer: dst[i] = (grad[i] * inv_loss_scale)
/// * clip_coef in fp32, as the fused Adam scales its gradients.
struct MuonPack {
  const void* grad = nullptr;  ///< first element (grad dtype)
  float* dst = nullptr;
  std::int64_t length = 0;
};

/// A plain fp32 copy of `length` elements.
struct MuonCopy {
  const float* src = nullptr;
  float* dst = nullptr;
  std::int64_t length = 0;
};

/// One matrix a home rank updates: `g` holds the (scaled) gradient on entry and the
/// orthogonalized update on exit; `m` is its momentum buffer (both rows x cols, row-major).
struct MuonMatrix {
  float* g = nullptr;
  float* m = nullptr;
  std::int64_t rows = 0, cols = 0;
  MuonSettings settings{};
};

/// One run of returned update elements applied to this rank's shard:
/// master = master * float(1 - lr_g * weight_decay) - float(lr_g * lr_ratio) * u, with
/// lr_g = StepScalars::lr * lr_scale (in double); the parameter (when not null) gets the
/// new master rounded to `param_dtype`.
struct MuonApply {
  const float* u = nullptr;
  float* master = nullptr;
  void* param = nullptr;  ///< first element of the parameter slice, or null (master only)
  DType param_dtype = DType::bf16;
  std::int64_t length = 0;
  double lr_scale = 1.0;
  double weight_decay = 0.0;
  double lr_ratio = 1.0;
};

/// Scratch of the Newton-Schulz iteration of the largest matrix (n = min(rows, cols),
/// k = max(rows, cols)): n*k + n*k + n*n + n*n floats.
std::int64_t newton_schulz_workspace(std::int64_t rows, std::int64_t cols) noexcept;

/// The Newton-Schulz iteration in place on x (n x k row-major, n <= k), fp32 with fp32
/// accumulation (sums in index order). `work` holds newton_schulz_workspace(n, k) floats.
void newton_schulz_host(float* x, std::int64_t n, std::int64_t k, int steps, const std::array<double, 3>& coefficients,
                        float* work);
/// Scratch of muon_matrix_host for a rows x cols matrix: the iteration's and a transposed copy.
std::int64_t muon_workspace(std::int64_t rows, std::int64_t cols) noexcept;
/// One matrix's Muon update on the host (momentum, Nesterov, normalization, iteration);
/// `work` holds muon_workspace(rows, cols) floats.
void muon_matrix_host(const MuonMatrix& mat, float* work);

/// Stream-ordered entry points (host: one enqueued task each; refused on CUDA for now).
/// None of them writes anything when found_inf is set (the pack and copies still run).
void muon_pack(const std::vector<MuonPack>& runs, DType grad_dtype, const StepScalars* scalars, Backend backend,
               Stream stream);
void muon_copy(const std::vector<MuonCopy>& runs, Backend backend, Stream stream);
void muon_update(const std::vector<MuonMatrix>& matrices, float* work, const StepScalars* scalars, Backend backend,
                 Stream stream);
void muon_apply(const std::vector<MuonApply>& runs, const StepScalars* scalars, Backend backend, Stream stream);

}  // namespace shardopt::kernels
