// muon_launch.hpp - internal: the CUDA side of the Muon kernels (muon.cu: the elementwise
// kernels; muon_gemm.cpp: the update's cuBLAS Newton-Schulz). Builds without CUDA (or
// without cuBLAS, for the update) get refusing stand-ins from muon_pieces.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/muon/muon.hpp"

namespace shardopt::kernels {

void muon_pack_cuda(const MuonRuns<MuonPack>& runs, DType grad_dtype, const StepScalars* scalars, Stream stream);
void muon_copy_cuda(const MuonRuns<MuonCopy>& runs, Stream stream);
void muon_apply_cuda(const MuonRuns<MuonApply>& runs, const StepScalars* scalars, Stream stream);
void muon_load_cuda();

/// One matrix of the update's elementwise kernels (device table).
struct MuonElemMatrix {
  float* g = nullptr;      ///< in: the scaled gradient; out: the update (fp32, rows x cols)
  float* m = nullptr;      ///< momentum
  void* x = nullptr;       ///< its Newton-Schulz input / output in the group's scratch (bf16 or f32)
  std::int64_t count = 0;  ///< rows * cols
  float w_buf = 0.0f, w_nes = 0.0f, eps = 0.0f;
  std::int32_t nesterov = 0;
  std::int32_t x_f32 = 0;  ///< x holds fp32 (MuonGemm::F32), else bf16
  std::int32_t tile0 = 0;  ///< its first tile (partial sums) and how many
  std::int32_t tiles = 0;
  const void* grad = nullptr;  ///< MuonMatrix::grad: the raw gradient read in place of g's input
  DType grad_dtype = DType::f32;
  MuonApply apply{};  ///< MuonMatrix::apply: applied from x instead of writing g (master null: not fused)
};

/// Elements per tile of the update's elementwise kernels (a matrix's partial sums of
/// squares are per tile, so its norm depends on its shape only).
inline constexpr std::int64_t kMuonElemTile = 16384;

/// Momentum + Nesterov of tiles [t0, t0 + n) (run = matrix index), the update's start
/// value into g, and each tile's double sum of squares into partials[tile].
void muon_momentum_cuda(const MuonElemMatrix* matrices, const MuonTile* tiles, int t0, int n, double* partials,
                        const StepScalars* scalars, Stream stream);
/// Each matrix's norm, max(||g||_F, eps) (the partials summed in tile order), into
/// norms[m0 .. m0 + count) (matrices m0 .. m0 + count, whose tiles are [t0, t0 + n)), then
/// x = g / norm rounded to x's dtype.
void muon_normalize_cuda(const MuonElemMatrix* matrices, const MuonTile* tiles, int t0, int n, int m0, int count,
                         const double* partials, float* norms, const StepScalars* scalars, Stream stream);
/// g = x (the orthogonalized update) in fp32, x read `shift` bytes past MuonElemMatrix::x
/// (the ping-pong buffer the iteration ended in); a matrix with a fused apply gets the
/// apply of x to its master (and parameter) instead.
void muon_finish_cuda(const MuonElemMatrix* matrices, const MuonTile* tiles, int t0, int n, std::int64_t shift,
                      const StepScalars* scalars, Stream stream);

/// The lower part of `count` symmetric n x n matrices (column-major, `stride` elements
/// apart, bf16 or fp32) from their upper part, where the products computed block columns
/// of width `block`: element (r, c) below the end of c's block column gets (c, r). Nothing
/// when block >= n.
void muon_mirror_cuda(void* a, int n, int block, long long stride, int count, bool f32, Stream stream);


MuonCudaState* muon_cuda_create(const std::vector<MuonMatrix>& matrices, bool batch_equal_shapes, MuonGemmPlan plan);
void muon_cuda_run(const MuonCudaState& state, const StepScalars* scalars, Stream stream);
std::vector<MuonStageTime> muon_cuda_profile(const MuonCudaState& state, const StepScalars* scalars, Stream stream,
                                             int iters);
std::size_t muon_cuda_scratch_bytes(const MuonCudaState& state) noexcept;
int muon_cuda_groups(const MuonCudaState& state) noexcept;
void muon_cuda_destroy(MuonCudaState* state) noexcept;

}  // namespace shardopt::kernels
