// muon.hpp - the kernels of a distributed Muon step (docs/muon.md): the pack of this
// rank's gradient pieces into the all-to-all send buffer, the copies between the
// exchange buffers and the whole matrices a home rank holds, the per-matrix momentum +
// Newton-Schulz update, and the apply of the returned update to the fp32 master (and the
// parameter slices). Every call is stream-ordered, reads its per-step values (lr, loss
// scale, clip coefficient, found-inf) from StepScalars when it runs, and so captures.
// The host backend runs the plain CPU twins below (fp32 GEMMs, fp32 accumulation in a
// fixed order); CUDA runs the kernels of muon.cu and cuBLAS GEMMs (docs/muon.md).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/memory.hpp"
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

/// A device (or host-backend) copy of `bytes` of host memory, complete on return.
DeviceBuffer upload_table(Backend backend, const void* data, std::size_t bytes);

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

/// A tile of a run table: elements [begin, end) of run `run` (one CUDA block each).
struct MuonTile {
  std::int32_t run = 0;
  std::int64_t begin = 0, end = 0;
};

/// The tiles of runs of these lengths, at most `tile` elements each, runs in order.
std::vector<MuonTile> muon_tiles(const std::vector<std::int64_t>& lengths, std::int64_t tile);

/// A table of runs (MuonPack, MuonCopy or MuonApply), built once: on CUDA the runs and
/// their tiles are uploaded at construction, so a call only launches (and captures).
template <class Run>
class MuonRuns {
 public:
  MuonRuns() = default;
  MuonRuns(Backend backend, std::vector<Run> runs);
  const std::vector<Run>& runs() const noexcept { return runs_; }
  bool empty() const noexcept { return runs_.empty(); }
  /// CUDA: the uploaded runs and tiles (null on the host backend or when empty).
  const Run* device_runs() const noexcept { return dev_runs_.as<const Run>(); }
  const MuonTile* device_tiles() const noexcept { return dev_tiles_.as<const MuonTile>(); }
  int tiles() const noexcept { return tiles_; }

 private:
  std::vector<Run> runs_;
  DeviceBuffer dev_runs_, dev_tiles_;
  int tiles_ = 0;
};

/// Elements per tile of the pack, copy and apply kernels.
inline constexpr std::int64_t kMuonRunTile = 8192;

template <class Run>
MuonRuns<Run>::MuonRuns(Backend backend, std::vector<Run> runs) : runs_(std::move(runs)) {
  if (backend != Backend::Cuda || runs_.empty()) return;
  std::vector<std::int64_t> lengths;
  for (const Run& r : runs_) lengths.push_back(r.length);
  const std::vector<MuonTile> tiles = muon_tiles(lengths, kMuonRunTile);
  tiles_ = static_cast<int>(tiles.size());
  dev_runs_ = upload_table(backend, runs_.data(), runs_.size() * sizeof(Run));
  dev_tiles_ = upload_table(backend, tiles.data(), tiles.size() * sizeof(MuonTile));
}

/// Stream-ordered entry points (host: one enqueued task each; CUDA: one kernel each).
/// None of them writes anything when found_inf is set (the pack and copies still run).
void muon_pack(const MuonRuns<MuonPack>& runs, DType grad_dtype, const StepScalars* scalars, Backend backend,
               Stream stream);
void muon_copy(const MuonRuns<MuonCopy>& runs, Backend backend, Stream stream);
void muon_apply(const MuonRuns<MuonApply>& runs, const StepScalars* scalars, Backend backend, Stream stream);

/// CUDA: loads the Muon kernels now (lazy loading would load each at its first launch,
/// which waits for running kernels, e.g. a collective spinning on a lost peer). Host: nothing.
void muon_load(Backend backend);

/// The CUDA state of a MuonUpdate (cuBLAS handle, workspace, tables, scratch): defined in
/// muon.cu; a build without CUDA or cuBLAS has none.
struct MuonCudaState;
struct MuonCudaStateDelete {
  void operator()(MuonCudaState* s) const noexcept;
};

/// The home rank's update of its matrices, built once (construction): momentum, Nesterov,
/// normalization, then Newton-Schulz. Host: muon_matrix_host per matrix. CUDA: elementwise
/// kernels and cuBLAS GEMMs (MuonSettings::gemm: bf16 with fp32 accumulation, or fp32);
/// matrices of equal shape and iteration settings form one group whose GEMMs are strided
/// batched (one launch per GEMM for all of them) when `batch_equal_shapes`, else each
/// matrix is a group of its own. The cuBLAS handle and its workspace are made here; a
/// call sets the stream and launches only (no allocation, no host sync: it captures).
/// Error(Unsupported) on CUDA in a build without cuBLAS.
class MuonUpdate {
 public:
  MuonUpdate() = default;
  MuonUpdate(Backend backend, std::vector<MuonMatrix> matrices, bool batch_equal_shapes = true);
  MuonUpdate(MuonUpdate&&) noexcept;
  MuonUpdate& operator=(MuonUpdate&&) noexcept;
  ~MuonUpdate();

  /// Enqueues the update of every matrix on `stream`; nothing changes when found_inf is set.
  void run(const StepScalars* scalars, Stream stream) const;
  /// Bytes of scratch (host: the iteration's; CUDA: X, A, B, partial sums and the cuBLAS workspace).
  std::size_t scratch_bytes() const noexcept;
  /// The number of GEMM groups (CUDA; the host backend: 0).
  int groups() const noexcept;

 private:
  Backend backend_ = Backend::Host;
  std::vector<MuonMatrix> matrices_;
  DeviceBuffer host_work_;
  std::unique_ptr<MuonCudaState, MuonCudaStateDelete> cuda_;
};

}  // namespace shardopt::kernels
