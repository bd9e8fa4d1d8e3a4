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
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/muon.hpp"

namespace shardopt::kernels {

/// One run of raw gradient elements (from this rank's gradient buffer, or as received
/// from their owner) into a matrix: dst[i] = (grad[i] * inv_loss_scale) * clip_coef in
/// fp32, as the fused Adam scales its gradients.
struct MuonPack {
  const void* grad = nullptr;  ///< first element (grad dtype)
  float* dst = nullptr;
  std::int64_t length = 0;
};

/// A copy of `length` elements from src_dtype to dst_dtype, through fp32: exact for every
/// value dst_dtype represents (the exchange's uses: raw gradients in their own dtype, and
/// bf16 Newton-Schulz results sent as bf16).
struct MuonCopy {
  const void* src = nullptr;
  DType src_dtype = DType::f32;
  void* dst = nullptr;
  DType dst_dtype = DType::f32;
  std::int64_t length = 0;
};

/// One run of returned update elements applied to this rank's shard:
/// master = master * float(1 - lr_g * weight_decay) - float(lr_g * lr_ratio) * u, with
/// lr_g = StepScalars::lr * lr_scale (in double); the parameter (when not null) gets the
/// new master rounded to `param_dtype`.
struct MuonApply {
  const void* u = nullptr;  ///< the update's first element, in u_dtype
  DType u_dtype = DType::f32;
  float* master = nullptr;
  void* param = nullptr;  ///< first element of the parameter slice, or null (master only)
  DType param_dtype = DType::bf16;
  std::int64_t length = 0;
  double lr_scale = 1.0;
  double weight_decay = 0.0;
  double lr_ratio = 1.0;
};

/// One matrix a home rank updates: `g` holds the (scaled) gradient on entry and the
/// orthogonalized update on exit; `m` is its momentum buffer (both rows x cols, row-major).
/// A home that holds a whole matrix itself can fuse the passes around the update:
/// - `grad` set: the update reads the raw gradient (grad_dtype) instead of g's input, and
///   scales it as the pack does, (grad * inv_loss_scale) * clip_coef (g is then only scratch);
/// - `apply.master` set: the update applies its result to the master (and parameter) as
///   muon_apply does, right from the Newton-Schulz output, instead of writing it to g
///   (`apply.u` and `apply.length` are not read).
/// The values are those of the unfused passes, bitwise.
struct MuonMatrix {
  float* g = nullptr;
  float* m = nullptr;
  std::int64_t rows = 0, cols = 0;
  MuonSettings settings{};
  const void* grad = nullptr;
  DType grad_dtype = DType::f32;
  MuonApply apply{};
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

/// The width of the block columns in which the CUDA update computes the symmetric
/// products X X^T and A A of an n x n result: 512 for n >= 1024, 256 for n >= 512 (the
/// last block column takes what is left), else n (one dense product).
int muon_symmetric_block(int n) noexcept;

/// How the CUDA update plans its products. The defaults are the library's; a benchmark
/// compares others in one process.
struct MuonGemmPlan {
  /// The width of the block columns of X X^T and A A: 0 takes muon_symmetric_block's;
  /// another multiple of 64 sets it for every group (one at least the matrices' smaller
  /// side computes the products whole). Error(InvalidArgument) for any other value.
  int block_width = 0;
  /// Lets cuBLASLt split a product's inner dimension when the partial sums are kept and
  /// added in fp32 in the workspace (its "compute type" reduction scheme). False allows
  /// only algorithms that accumulate each output in one pass. Never a reduction in bf16.
  bool split_k = true;
};

/// The time of one stage of the CUDA update (MuonUpdate::profile): `stage` names the GEMM
/// group ("32 x 2048x2048 bf16") and the stage; `ms` is the median over the runs of the
/// stage's time summed over the run's Newton-Schulz steps.
struct MuonStageTime {
  std::string stage;
  double ms = 0.0;
};

/// The home rank's update of its matrices, built once (construction): momentum, Nesterov,
/// normalization, then Newton-Schulz. Host: muon_matrix_host per matrix. CUDA: elementwise
/// kernels and cuBLASLt GEMMs (MuonSettings::gemm: bf16 with fp32 accumulation, or fp32);
/// matrices of equal shape and iteration settings form one group whose GEMMs are strided
/// batched (one launch per GEMM for all of them) when `batch_equal_shapes`, else each
/// matrix is a group of its own. X X^T and A A are computed by their upper block columns
/// only and the rest mirrored, as `plan` says (docs/muon.md). The cuBLASLt handle, the GEMMs' plans and the
/// workspace are made here; a call launches only (no allocation, no host sync: it
/// captures). Error(Unsupported) on CUDA in a build without cuBLAS.
class MuonUpdate {
 public:
  MuonUpdate() = default;
  MuonUpdate(Backend backend, std::vector<MuonMatrix> matrices, bool batch_equal_shapes = true,
             MuonGemmPlan plan = {});
  MuonUpdate(MuonUpdate&&) noexcept;
  MuonUpdate& operator=(MuonUpdate&&) noexcept;
  ~MuonUpdate();

  /// Enqueues the update of every matrix on `stream`; nothing changes when found_inf is set.
  void run(const StepScalars* scalars, Stream stream) const;
  /// CUDA: runs the update `iters` times (after one warm-up run), eagerly, with an event
  /// after each stage, and returns each stage's median time, in order (a benchmark's
  /// breakdown; it updates the momentum like `run`). Error(Unsupported) on the host backend.
  std::vector<MuonStageTime> profile(const StepScalars* scalars, Stream stream, int iters) const;
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
