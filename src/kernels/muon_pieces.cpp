// muon_pieces.cpp - the stream-ordered entry points of the Muon kernels (kernels/muon.hpp):
// argument checks, then one host task each (the host twins); CUDA is refused for now.
#include <string>

#include "core/check.hpp"
#include "kernels/convert_math.cuh"
#include "kernels/muon.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"

namespace shardopt::kernels {
namespace {

void require_host(Backend backend, const char* what) {
  SHARDOPT_REQUIRE(backend == Backend::Host, ErrorCode::Unsupported,
                   std::string(what) + ": Muon runs on the host backend only so far (the cuBLAS path of issue 34 "
                                       "is not written); use AdamW groups on CUDA");
}

}  // namespace

void muon_pack(const std::vector<MuonPack>& runs, DType grad_dtype, const StepScalars* scalars, Backend backend,
               Stream stream) {
  require_host(backend, "muon_pack");
  SHARDOPT_REQUIRE(is_float_storage(grad_dtype), ErrorCode::InvalidArgument, "muon_pack: bad gradient dtype");
  if (runs.empty()) return;
  host_enqueue(stream, [runs, grad_dtype, scalars] {
    const float inv = scalars->inv_loss_scale, clip = scalars->clip_coef;
    for (const MuonPack& r : runs)
      for (std::int64_t i = 0; i < r.length; ++i) r.dst[i] = (load_as_f32(r.grad, grad_dtype, i) * inv) * clip;
  });
}

void muon_copy(const std::vector<MuonCopy>& runs, Backend backend, Stream stream) {
  require_host(backend, "muon_copy");
  if (runs.empty()) return;
  host_enqueue(stream, [runs] {
    for (const MuonCopy& r : runs)
      for (std::int64_t i = 0; i < r.length; ++i) r.dst[i] = r.src[i];
  });
}

void muon_update(const std::vector<MuonMatrix>& matrices, float* work, const StepScalars* scalars, Backend backend,
                 Stream stream) {
  require_host(backend, "muon_update");
  if (matrices.empty()) return;
  host_enqueue(stream, [matrices, work, scalars] {
    if (scalars->found_inf != 0) return;  // a skipped step leaves the momentum as it was
    for (const MuonMatrix& m : matrices) muon_matrix_host(m, work);
  });
}

void muon_apply(const std::vector<MuonApply>& runs, const StepScalars* scalars, Backend backend, Stream stream) {
  require_host(backend, "muon_apply");
  if (runs.empty()) return;
  host_enqueue(stream, [runs, scalars] {
    if (scalars->found_inf != 0) return;
    for (const MuonApply& r : runs) {
      const double lr = static_cast<double>(scalars->lr) * r.lr_scale;
      const float decay = static_cast<float>(1.0 - lr * r.weight_decay);
      const float step = static_cast<float>(lr * r.lr_ratio);
      for (std::int64_t i = 0; i < r.length; ++i) {
        const float p = r.master[i] * decay;
        r.master[i] = p - step * r.u[i];
        if (r.param != nullptr) store_from_f32(r.param, r.param_dtype, i, r.master[i]);
      }
    }
  });
}

}  // namespace shardopt::kernels
