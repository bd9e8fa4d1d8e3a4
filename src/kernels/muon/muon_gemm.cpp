// muon_gemm.cpp - MuonUpdate on CUDA (kernels/muon/muon.hpp): the matrices grouped once by
// shape and iteration settings, one cuBLAS handle with a preallocated workspace, and per
// group the elementwise kernels of muon.cu around the Newton-Schulz GEMMs, each GEMM one
// strided batched call over the group (docs/muon.md). Compiled only where cuBLAS is found.
#include <cublas_v2.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "core/check.hpp"
#include "core/device_guard.hpp"
#include "kernels/muon/muon_launch.hpp"
#include "shardopt/error.hpp"

namespace shardopt::kernels {
namespace {

void check_cublas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(ErrorCode::Cuda, std::string("cuBLAS call ") + call + " failed: " + cublasGetStatusName(status) + " (" +
                                   cublasGetStatusString(status) + ") in Muon's Newton-Schulz");
}
#define SHARDOPT_CUBLAS(call) check_cublas((call), #call)

// cuBLAS's recommended workspace on Hopper; set once, re-set after every cublasSetStream
// (which drops it), so no GEMM allocates (graph capture) and eager and captured calls
// choose the same kernels.
constexpr std::size_t kWorkspaceBytes = 32u << 20;

std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

// One group of matrices of equal shape and iteration settings: n = min, k = max of the
// dims; `trans` when rows > cols (the memory of a row-major rows x cols matrix is then X
// in column-major order, else X^T).
struct GemmGroup {
  int n = 0, k = 0, count = 0, steps = 0;
  bool trans = false, f32 = false;
  float a = 0, b = 0, c = 0;
  int t0 = 0, tiles = 0;  // the group's tiles in the tile table
  // Elements from one member to the next in X and in A / B: n k and n n rounded up to 128
  // (every member starts 256-byte aligned, as a matrix alone does, so cuBLAS sees the same
  // alignment batched or not).
  long long sx = 0, sa = 0;
  std::size_t x_bytes = 0, a_bytes = 0;  // one of X0 / X1, one of A / B (the whole group)
};

}  // namespace

struct MuonCudaState {
  cublasHandle_t handle = nullptr;
  int device = 0;
  DeviceBuffer workspace, scratch, partials, mats, tiles;
  std::vector<GemmGroup> groups;
  ~MuonCudaState() {
    if (handle != nullptr) cublasDestroy(handle);
  }
};

MuonCudaState* muon_cuda_create(const std::vector<MuonMatrix>& matrices, bool batch_equal_shapes) {
  auto st = std::make_unique<MuonCudaState>();
  st->device = detail::current_device();
  // Groups in order of first appearance; members in matrix order.
  using Key = std::tuple<std::int64_t, std::int64_t, int, double, double, double, int, std::size_t>;
  std::map<Key, int> index;
  std::vector<std::vector<std::size_t>> members;
  for (std::size_t i = 0; i < matrices.size(); ++i) {
    const MuonMatrix& m = matrices[i];
    SHARDOPT_REQUIRE(m.rows > 0 && m.cols > 0 && m.rows * m.cols <= (std::int64_t{1} << 31) - 1 &&
                         std::max(m.rows, m.cols) < (std::int64_t{1} << 31),
                     ErrorCode::InvalidArgument,
                     "Muon on CUDA: a " + std::to_string(m.rows) + " x " + std::to_string(m.cols) +
                         " matrix is empty or too large for one cuBLAS GEMM (at most 2^31 - 1 elements)");
    const MuonSettings& s = m.settings;
    const Key key{m.rows, m.cols, s.ns_steps, s.ns_coefficients[0], s.ns_coefficients[1], s.ns_coefficients[2],
                  static_cast<int>(s.gemm), batch_equal_shapes ? 0 : i};
    const auto [it, fresh] = index.try_emplace(key, static_cast<int>(members.size()));
    if (fresh) members.emplace_back();
    members[static_cast<std::size_t>(it->second)].push_back(i);
  }
  std::vector<MuonElemMatrix> elems;
  std::vector<MuonTile> tiles;
  std::size_t scratch = 0;
  for (const auto& mem : members) {
    const MuonMatrix& first = matrices[mem.front()];
    const MuonSettings& s = first.settings;
    GemmGroup g;
    g.n = static_cast<int>(std::min(first.rows, first.cols));
    g.k = static_cast<int>(std::max(first.rows, first.cols));
    g.count = static_cast<int>(mem.size());
    g.steps = s.ns_steps;
    g.trans = first.rows > first.cols;
    g.f32 = s.gemm == MuonGemm::F32;
    g.a = static_cast<float>(s.ns_coefficients[0]);
    g.b = static_cast<float>(s.ns_coefficients[1]);
    g.c = static_cast<float>(s.ns_coefficients[2]);
    const std::size_t esz = g.f32 ? 4 : 2;
    g.sx = (static_cast<long long>(g.n) * g.k + 127) / 128 * 128;
    g.sa = (static_cast<long long>(g.n) * g.n + 127) / 128 * 128;
    g.x_bytes = align256(esz * static_cast<std::size_t>(g.count) * static_cast<std::size_t>(g.sx));
    g.a_bytes = align256(esz * static_cast<std::size_t>(g.count) * static_cast<std::size_t>(g.sa));
    scratch = std::max(scratch, 2 * g.x_bytes + 2 * g.a_bytes);
    g.t0 = static_cast<int>(tiles.size());
    for (int slot = 0; slot < g.count; ++slot) {
      const MuonMatrix& m = matrices[mem[static_cast<std::size_t>(slot)]];
      MuonElemMatrix e;
      e.g = m.g;
      e.m = m.m;
      e.x = reinterpret_cast<void*>(esz * static_cast<std::size_t>(slot) * static_cast<std::size_t>(g.sx));  // rebased below
      e.count = m.rows * m.cols;
      e.w_buf = static_cast<float>(1.0 - m.settings.momentum);
      e.w_nes = static_cast<float>(m.settings.momentum);
      e.eps = static_cast<float>(m.settings.eps);
      e.nesterov = m.settings.nesterov ? 1 : 0;
      e.x_f32 = g.f32 ? 1 : 0;
      e.tile0 = static_cast<int>(tiles.size());
      for (const MuonTile& t : muon_tiles({e.count}, kMuonElemTile))
        tiles.push_back({static_cast<std::int32_t>(elems.size()), t.begin, t.end});
      e.tiles = static_cast<int>(tiles.size()) - e.tile0;
      elems.push_back(e);
    }
    g.tiles = static_cast<int>(tiles.size()) - g.t0;
    st->groups.push_back(g);
  }
  st->scratch = DeviceBuffer(Backend::Cuda, scratch);
  fill_zero_async(Backend::Cuda, st->scratch.data(), st->scratch.bytes(), nullptr);
  for (MuonElemMatrix& e : elems) e.x = st->scratch.as<char>() + reinterpret_cast<std::uintptr_t>(e.x);
  st->partials = DeviceBuffer(Backend::Cuda, tiles.size() * sizeof(double));
  st->mats = upload_table(Backend::Cuda, elems.data(), elems.size() * sizeof(MuonElemMatrix));
  st->tiles = upload_table(Backend::Cuda, tiles.data(), tiles.size() * sizeof(MuonTile));
  st->workspace = DeviceBuffer(Backend::Cuda, kWorkspaceBytes);
  SHARDOPT_CUBLAS(cublasCreate(&st->handle));
  // fp32 accumulation everywhere: no reduced-precision split-K reductions of bf16 GEMMs.
  SHARDOPT_CUBLAS(cublasSetMathMode(st->handle, static_cast<cublasMath_t>(
                                                    CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  SHARDOPT_CUBLAS(cublasSetPointerMode(st->handle, CUBLAS_POINTER_MODE_HOST));
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the zeroed scratch
  return st.release();
}

namespace {

// C = alpha op(A) op(B) + beta C over the group's batch (column-major, cuBLAS's order).
void gemm(const MuonCudaState& st, const GemmGroup& g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
          float alpha, const void* A, int lda, long long sa, const void* B, int ldb, long long sb, float beta, void* C,
          int ldc, long long sc) {
  const cudaDataType t = g.f32 ? CUDA_R_32F : CUDA_R_16BF;
  SHARDOPT_CUBLAS(cublasGemmStridedBatchedEx(st.handle, ta, tb, m, n, k, &alpha, A, t, lda, sa, B, t, ldb, sb, &beta,
                                             C, t, ldc, sc, g.count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void muon_cuda_run(const MuonCudaState& st, const StepScalars* scalars, Stream stream) {
  SHARDOPT_REQUIRE(detail::current_device() == st.device, ErrorCode::InvalidArgument,
                   "Muon: the update was built on CUDA device " + std::to_string(st.device) +
                       " and is run with another current; make that device current (cudaSetDevice)");
  SHARDOPT_CUBLAS(cublasSetStream(st.handle, stream));
  SHARDOPT_CUBLAS(cublasSetWorkspace(st.handle, st.workspace.data(), st.workspace.bytes()));
  const auto* mats = st.mats.as<const MuonElemMatrix>();
  const auto* tiles = st.tiles.as<const MuonTile>();
  auto* partials = st.partials.as<double>();
  for (const GemmGroup& g : st.groups) {
    muon_momentum_cuda(mats, tiles, g.t0, g.tiles, partials, scalars, stream);
    muon_normalize_cuda(mats, tiles, g.t0, g.tiles, partials, scalars, stream);
    char* base = st.scratch.as<char>();
    char* x[2] = {base, base + g.x_bytes};
    char* A = base + 2 * g.x_bytes;
    char* B = A + g.a_bytes;
    const long long sx = g.sx, sa = g.sa;
    const std::size_t esz = g.f32 ? 4 : 2;
    const int n = g.n, k = g.k;
    int cur = 0;
    for (int s = 0; s < g.steps; ++s) {
      const char* X = x[cur];
      char* Y = x[1 - cur];
      // A = X X^T
      if (g.trans) {
        gemm(st, g, CUBLAS_OP_N, CUBLAS_OP_T, n, n, k, 1.0f, X, n, sx, X, n, sx, 0.0f, A, n, sa);
      } else {
        gemm(st, g, CUBLAS_OP_T, CUBLAS_OP_N, n, n, k, 1.0f, X, k, sx, X, k, sx, 0.0f, A, n, sa);
      }
      // B = b A + c A A (B starts as a copy of A: cuBLAS's C may not alias an input)
      SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(B, A, esz * static_cast<std::size_t>(g.count) * sa, cudaMemcpyDeviceToDevice,
                                          stream));
      gemm(st, g, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, g.c, A, n, sa, A, n, sa, g.b, B, n, sa);
      // Y = a X + B X (Y starts as a copy of X)
      SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(Y, X, esz * static_cast<std::size_t>(g.count) * sx, cudaMemcpyDeviceToDevice,
                                          stream));
      if (g.trans) {  // memory holds X (n x k, ld n): Y = B X
        gemm(st, g, CUBLAS_OP_N, CUBLAS_OP_N, n, k, n, 1.0f, B, n, sa, X, n, sx, g.a, Y, n, sx);
      } else {  // memory holds X^T (k x n, ld k): Y^T = X^T B^T
        gemm(st, g, CUBLAS_OP_N, CUBLAS_OP_T, k, n, n, 1.0f, X, k, sx, B, n, sa, g.a, Y, k, sx);
      }
      cur = 1 - cur;
    }
    muon_finish_cuda(mats, tiles, g.t0, g.tiles, cur == 0 ? 0 : static_cast<std::int64_t>(g.x_bytes), scalars, stream);
  }
}

std::size_t muon_cuda_scratch_bytes(const MuonCudaState& st) noexcept {
  return st.workspace.bytes() + st.scratch.bytes() + st.partials.bytes() + st.mats.bytes() + st.tiles.bytes();
}

int muon_cuda_groups(const MuonCudaState& st) noexcept { return static_cast<int>(st.groups.size()); }

void muon_cuda_destroy(MuonCudaState* st) noexcept { delete st; }

}  // namespace shardopt::kernels
