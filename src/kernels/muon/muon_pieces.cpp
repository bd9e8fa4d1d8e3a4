// muon_pieces.cpp - the stream-ordered entry points of the Muon kernels (kernels/muon/muon.hpp):
// argument checks, then one host task each (the host twins) or the CUDA launch
// (muon_launch.hpp); MuonUpdate's construction and dispatch.
#include <algorithm>
#include <string>

#include "core/check.hpp"
#include "kernels/common/convert.hpp"
#include "kernels/common/convert_math.cuh"
#include "kernels/muon/muon.hpp"
#include "kernels/muon/muon_launch.hpp"
#include "kernels/muon/muon_math.cuh"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt::kernels {

DeviceBuffer upload_table(Backend backend, const void* data, std::size_t bytes) {
  DeviceBuffer b(backend, bytes);
  if (bytes == 0) return b;
  copy_async(backend, b.data(), data, bytes, nullptr);
  synchronize(backend, nullptr);
  return b;
}

std::vector<MuonTile> muon_tiles(const std::vector<std::int64_t>& lengths, std::int64_t tile) {
  std::vector<MuonTile> out;
  for (std::size_t r = 0; r < lengths.size(); ++r)
    for (std::int64_t b = 0; b < lengths[r]; b += tile)
      out.push_back({static_cast<std::int32_t>(r), b, std::min(lengths[r], b + tile)});
  return out;
}

namespace {

// The host twins' element loops, shared by the runs and by MuonUpdate's fused passes.
void pack_host(const MuonPack& r, DType grad_dtype, const StepScalars& sc) {
  for (std::int64_t i = 0; i < r.length; ++i)
    r.dst[i] = muon_scale_grad(load_as_f32(r.grad, grad_dtype, i), sc.inv_loss_scale, sc.clip_coef);
}

void apply_host(const MuonApply& r, const StepScalars& sc) {
  const MuonApplyFactors f = muon_apply_factors(sc.lr, r.lr_scale, r.weight_decay, r.lr_ratio);
  for (std::int64_t i = 0; i < r.length; ++i) {
    r.master[i] = muon_apply_element(r.master[i], load_as_f32(r.u, r.u_dtype, i), f);
    if (r.param != nullptr) store_from_f32(r.param, r.param_dtype, i, r.master[i]);
  }
}

}  // namespace

void muon_pack(const MuonRuns<MuonPack>& runs, DType grad_dtype, const StepScalars* scalars, Backend backend,
               Stream stream) {
  SHARDOPT_REQUIRE(is_float_storage(grad_dtype), ErrorCode::InvalidArgument, "muon_pack: bad gradient dtype");
  if (runs.empty()) return;
  if (backend == Backend::Cuda) return muon_pack_cuda(runs, grad_dtype, scalars, stream);
  host_enqueue(stream, [&runs, grad_dtype, scalars] {
    for (const MuonPack& r : runs.runs()) pack_host(r, grad_dtype, *scalars);
  });
}

void muon_copy(const MuonRuns<MuonCopy>& runs, Backend backend, Stream stream) {
  if (runs.empty()) return;
  if (backend == Backend::Cuda) return muon_copy_cuda(runs, stream);
  host_enqueue(stream, [&runs] {
    for (const MuonCopy& r : runs.runs()) convert_host(r.src, r.src_dtype, r.dst, r.dst_dtype, r.length);
  });
}

void muon_apply(const MuonRuns<MuonApply>& runs, const StepScalars* scalars, Backend backend, Stream stream) {
  if (runs.empty()) return;
  if (backend == Backend::Cuda) return muon_apply_cuda(runs, scalars, stream);
  host_enqueue(stream, [&runs, scalars] {
    if (scalars->found_inf != 0) return;
    for (const MuonApply& r : runs.runs()) apply_host(r, *scalars);
  });
}

void muon_load(Backend backend) {
  if (backend == Backend::Cuda) muon_load_cuda();
}

// ---------------------------------------------------------------- MuonUpdate

int muon_symmetric_block(int n) noexcept {
  if (n >= 1024) return 512;
  if (n >= 512) return 256;
  return n;
}

void MuonCudaStateDelete::operator()(MuonCudaState* s) const noexcept { muon_cuda_destroy(s); }

MuonUpdate::MuonUpdate(Backend backend, std::vector<MuonMatrix> matrices, bool batch_equal_shapes, MuonGemmPlan plan)
    : backend_(backend), matrices_(std::move(matrices)) {
  if (matrices_.empty()) return;
  if (backend_ == Backend::Cuda) {
    cuda_.reset(muon_cuda_create(matrices_, batch_equal_shapes, plan));
    return;
  }
  std::int64_t work = 0;
  for (const MuonMatrix& m : matrices_) work = std::max(work, muon_workspace(m.rows, m.cols));
  host_work_ = DeviceBuffer(backend_, static_cast<std::size_t>(work) * sizeof(float));
}

MuonUpdate::MuonUpdate(MuonUpdate&&) noexcept = default;
MuonUpdate& MuonUpdate::operator=(MuonUpdate&&) noexcept = default;
MuonUpdate::~MuonUpdate() = default;

void MuonUpdate::run(const StepScalars* scalars, Stream stream) const {
  if (matrices_.empty()) return;
  if (backend_ == Backend::Cuda) return muon_cuda_run(*cuda_, scalars, stream);
  float* work = host_work_.as<float>();
  host_enqueue(stream, [this, work, scalars] {
    if (scalars->found_inf != 0) return;  // a skipped step leaves the momentum as it was
    for (const MuonMatrix& m : matrices_) {
      const std::int64_t count = m.rows * m.cols;
      if (m.grad != nullptr) pack_host({m.grad, m.g, count}, m.grad_dtype, *scalars);  // a fused pack
      muon_matrix_host(m, work);
      if (m.apply.master == nullptr) continue;
      MuonApply r = m.apply;  // a fused apply, from the result in g
      r.u = m.g;
      r.u_dtype = DType::f32;
      r.length = count;
      apply_host(r, *scalars);
    }
  });
}

std::size_t MuonUpdate::scratch_bytes() const noexcept {
  return cuda_ ? muon_cuda_scratch_bytes(*cuda_) : host_work_.bytes();
}

int MuonUpdate::groups() const noexcept { return cuda_ ? muon_cuda_groups(*cuda_) : 0; }

std::vector<MuonStageTime> MuonUpdate::profile(const StepScalars* scalars, Stream stream, int iters) const {
  SHARDOPT_REQUIRE(backend_ == Backend::Cuda, ErrorCode::Unsupported,
                   "MuonUpdate::profile times the CUDA update's stages; the host backend has none to time");
  if (matrices_.empty()) return {};
  return muon_cuda_profile(*cuda_, scalars, stream, iters);
}

}  // namespace shardopt::kernels

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launches refuse.
namespace shardopt::kernels {
void muon_pack_cuda(const MuonRuns<MuonPack>&, DType, const StepScalars*, Stream) { detail::no_cuda("Muon"); }
void muon_copy_cuda(const MuonRuns<MuonCopy>&, Stream) { detail::no_cuda("Muon"); }
void muon_apply_cuda(const MuonRuns<MuonApply>&, const StepScalars*, Stream) { detail::no_cuda("Muon"); }
void muon_load_cuda() { detail::no_cuda("Muon"); }
}  // namespace shardopt::kernels
#endif

#if !SHARDOPT_HAVE_CUBLAS
// Newton-Schulz on CUDA multiplies through cuBLAS: without it, Muon is refused on CUDA.
namespace shardopt::kernels {
MuonCudaState* muon_cuda_create(const std::vector<MuonMatrix>&, bool, MuonGemmPlan) {
  if (!SHARDOPT_HAVE_CUDA) detail::no_cuda("Muon");
  throw Error(ErrorCode::Unsupported,
              "Muon groups on Backend::Cuda need cuBLAS (Newton-Schulz runs its GEMMs), and this build of shardopt "
              "found none: install the CUDA toolkit's cuBLAS (libcublas-dev) and reconfigure, or use AdamW groups");
}
void muon_cuda_run(const MuonCudaState&, const StepScalars*, Stream) {}
std::vector<MuonStageTime> muon_cuda_profile(const MuonCudaState&, const StepScalars*, Stream, int) { return {}; }
std::size_t muon_cuda_scratch_bytes(const MuonCudaState&) noexcept { return 0; }
int muon_cuda_groups(const MuonCudaState&) noexcept { return 0; }
void muon_cuda_destroy(MuonCudaState*) noexcept {}
}  // namespace shardopt::kernels
#endif
