// muon_gemm.cpp - MuonUpdate on CUDA (kernels/muon/muon.hpp): the matrices grouped once by
// shape and iteration settings, one cuBLASLt handle with a preallocated workspace, and per
// group the elementwise kernels of muon.cu around the Newton-Schulz GEMMs. Every GEMM is
// one strided batched cublasLtMatmul over the group, planned at construction (layouts and
// algorithm), with its output in a buffer of its own, so no operand is copied; X X^T and
// A A are symmetric, so only their upper block columns are multiplied and the rest is
// mirrored (docs/muon.md, "The CUDA path"). Compiled only where cuBLAS is found.
#include <cublasLt.h>

#include <algorithm>
#include <functional>
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
  throw Error(ErrorCode::Cuda, std::string("cuBLASLt call ") + call + " failed: " + cublasLtGetStatusName(status) +
                                   " (" + cublasLtGetStatusString(status) + ") in Muon's Newton-Schulz");
}
#define SHARDOPT_CUBLAS(call) check_cublas((call), #call)

// cuBLAS's recommended workspace on Hopper, given to every call, so no GEMM allocates
// (graph capture) and eager and captured calls run the same kernels.
constexpr std::size_t kWorkspaceBytes = 32u << 20;

std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

// The buffers of a group's iteration: the iterate (X, and Y the next one, swapped each
// step), A = X X^T and B = b A + c A A.
enum class Buf : int { X, Y, A, B };

// One cublasLtMatmul, planned once: D = alpha op(P) op(Q) + beta C over the group's batch.
struct LtGemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t p = nullptr, q = nullptr, cd = nullptr;  // C and D share a layout
  cublasLtMatmulAlgo_t algo{};
  float alpha = 1.0f, beta = 0.0f;
  Buf pb = Buf::X, qb = Buf::X, cb = Buf::X, db = Buf::A;
  long long p_at = 0, q_at = 0, c_at = 0, d_at = 0;  // element offsets within their buffers
};

// One group of matrices of equal shape and iteration settings: n = min, k = max of the
// dims; `trans` when rows > cols (the memory of a row-major rows x cols matrix is then X
// in column-major order, else X^T).
struct GemmGroup {
  int n = 0, k = 0, count = 0, steps = 0;
  bool trans = false, f32 = false;
  float a = 0, b = 0, c = 0;
  int t0 = 0, tiles = 0;  // the group's tiles in the tile table
  int m0 = 0;             // its first matrix in the matrix table (members follow in order)
  // Elements from one member to the next in X and in A / B: n k and n n rounded up to 128
  // (every member starts 256-byte aligned, as a matrix alone does).
  long long sx = 0, sa = 0;
  std::size_t x_bytes = 0, a_bytes = 0;  // one of X / Y, one of A / B (the whole group)
  int block = 0;                         // width of the symmetric products' block columns (n: dense)
  std::vector<LtGemm> xxt, aa;           // A's and B's block columns
  LtGemm bx;                             // Y = a X + B X
};

}  // namespace

struct MuonCudaState {
  cublasLtHandle_t handle = nullptr;
  int device = 0;
  DeviceBuffer workspace, scratch, partials, norms, mats, tiles;
  std::vector<GemmGroup> groups;
  ~MuonCudaState() {
    for (GemmGroup& g : groups) {
      for (auto* list : {&g.xxt, &g.aa})
        for (LtGemm& m : *list) destroy(m);
      destroy(g.bx);
    }
    if (handle != nullptr) cublasLtDestroy(handle);
  }
  static void destroy(LtGemm& m) noexcept {
    if (m.p != nullptr) cublasLtMatrixLayoutDestroy(m.p);
    if (m.q != nullptr) cublasLtMatrixLayoutDestroy(m.q);
    if (m.cd != nullptr) cublasLtMatrixLayoutDestroy(m.cd);
    if (m.op != nullptr) cublasLtMatmulDescDestroy(m.op);
  }
};

namespace {

// A column-major rows x cols operand with leading dimension ld, `count` of them `stride`
// elements apart.
cublasLtMatrixLayout_t layout(cudaDataType t, int rows, int cols, int ld, int count, long long stride) {
  cublasLtMatrixLayout_t l = nullptr;
  SHARDOPT_CUBLAS(cublasLtMatrixLayoutCreate(&l, t, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), ld));
  const std::int32_t batch = count;
  const std::int64_t offset = stride;
  SHARDOPT_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
  SHARDOPT_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset, sizeof offset));
  return l;
}

struct Operand {
  Buf buf;
  long long at;
  int rows, cols, ld;  // as stored (before op)
  long long stride;
  cublasOperation_t op;
};

// Plans D (rows x cols at d, ld = ldd) = alpha op(P) op(Q) + beta C (C = `c`, same shape as D).
LtGemm plan(cublasLtHandle_t h, const GemmGroup& g, bool split_k, const Operand& P, const Operand& Q, Buf cb,
            long long c_at, Buf db, long long d_at, int rows, int cols, int ldd, long long sd, float alpha, float beta) {
  const cudaDataType t = g.f32 ? CUDA_R_32F : CUDA_R_16BF;
  LtGemm m;
  // fp32 accumulation and fp32 alpha / beta, whatever the storage.
  SHARDOPT_CUBLAS(cublasLtMatmulDescCreate(&m.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const std::int32_t ta = P.op, tb = Q.op;
  SHARDOPT_CUBLAS(cublasLtMatmulDescSetAttribute(m.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  SHARDOPT_CUBLAS(cublasLtMatmulDescSetAttribute(m.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  m.p = layout(t, P.rows, P.cols, P.ld, g.count, P.stride);
  m.q = layout(t, Q.rows, Q.cols, Q.ld, g.count, Q.stride);
  m.cd = layout(t, rows, cols, ldd, g.count, sd);
  m.alpha = alpha;
  m.beta = beta;
  m.pb = P.buf;
  m.p_at = P.at;
  m.qb = Q.buf;
  m.q_at = Q.at;
  m.cb = cb;
  m.c_at = c_at;
  m.db = db;
  m.d_at = d_at;
  // The algorithm: cuBLASLt's first choice for this problem, for at most the workspace we
  // hold, accumulating in fp32 throughout: an output's inner product in one pass, or split
  // with the partial sums reduced in fp32 (never in the output's bf16). Chosen once here,
  // so every call (eager or captured, every step) runs the same kernel.
  cublasLtMatmulPreference_t pref = nullptr;
  SHARDOPT_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = kWorkspaceBytes;
  const std::uint32_t schemes =
      split_k ? CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(h, m.op, m.p, m.q, m.cd, m.cd, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    MuonCudaState::destroy(m);
    check_cublas(st, "cublasLtMatmulAlgoGetHeuristic");
    throw Error(ErrorCode::Unsupported, "Muon on CUDA: cuBLASLt has no algorithm for a " + std::to_string(rows) + " x " +
                                            std::to_string(cols) + " Newton-Schulz product of " +
                                            std::to_string(g.count) + " matrices; report it with the shapes");
  }
  m.algo = result.algo;
  return m;
}

// The group's GEMMs. Column-major (cuBLASLt's order), X is n x k; memory holds X (ld n)
// when trans, else X^T (k x n, ld k). Block column J = columns [c0, c1) of A (and B):
// only rows [0, c1) are multiplied (the upper part and the diagonal block); the rest of
// the column is the mirror of row block J, filled by muon_mirror_cuda.
void plan_group(cublasLtHandle_t h, GemmGroup& g, bool split_k) {
  const int n = g.n, k = g.k;
  const long long sx = g.sx, sa = g.sa;
  for (int c0 = 0; c0 < n; c0 += g.block) {
    const int c1 = std::min(n, c0 + g.block), w = c1 - c0;
    // A[0:c1, c0:c1] = X[0:c1, :] X[c0:c1, :]^T
    const Operand p = g.trans ? Operand{Buf::X, 0, c1, k, n, sx, CUBLAS_OP_N} : Operand{Buf::X, 0, k, c1, k, sx, CUBLAS_OP_T};
    const Operand q = g.trans ? Operand{Buf::X, c0, w, k, n, sx, CUBLAS_OP_T}
                              : Operand{Buf::X, static_cast<long long>(c0) * k, k, w, k, sx, CUBLAS_OP_N};
    const long long at = static_cast<long long>(c0) * n;
    g.xxt.push_back(plan(h, g, split_k, p, q, Buf::A, at, Buf::A, at, c1, w, n, sa, 1.0f, 0.0f));
    // B[0:c1, c0:c1] = c A[0:c1, :] A[:, c0:c1] + b A[0:c1, c0:c1]
    const Operand ap{Buf::A, 0, c1, n, n, sa, CUBLAS_OP_N};
    const Operand aq{Buf::A, at, n, w, n, sa, CUBLAS_OP_N};
    g.aa.push_back(plan(h, g, split_k, ap, aq, Buf::A, at, Buf::B, at, c1, w, n, sa, g.c, g.b));
  }
  if (g.trans) {  // Y = B X + a X (n x k, ld n)
    g.bx = plan(h, g, split_k, Operand{Buf::B, 0, n, n, n, sa, CUBLAS_OP_N}, Operand{Buf::X, 0, n, k, n, sx, CUBLAS_OP_N}, Buf::X,
                0, Buf::Y, 0, n, k, n, sx, 1.0f, g.a);
  } else {  // Y^T = X^T B^T + a X^T (k x n, ld k)
    g.bx = plan(h, g, split_k, Operand{Buf::X, 0, k, n, k, sx, CUBLAS_OP_N}, Operand{Buf::B, 0, n, n, n, sa, CUBLAS_OP_T}, Buf::X,
                0, Buf::Y, 0, k, n, k, sx, 1.0f, g.a);
  }
}

}  // namespace

MuonCudaState* muon_cuda_create(const std::vector<MuonMatrix>& matrices, bool batch_equal_shapes, MuonGemmPlan plan) {
  const int block_width = plan.block_width;
  SHARDOPT_REQUIRE(block_width >= 0 && block_width % 64 == 0, ErrorCode::InvalidArgument,
                   "MuonUpdate: the block width of the symmetric products must be 0 (the default rule) or a positive "
                   "multiple of 64, not " + std::to_string(block_width));
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
    g.block = block_width == 0 ? muon_symmetric_block(g.n) : std::min(block_width, g.n);
    const std::size_t esz = g.f32 ? 4 : 2;
    g.sx = (static_cast<long long>(g.n) * g.k + 127) / 128 * 128;
    g.sa = (static_cast<long long>(g.n) * g.n + 127) / 128 * 128;
    g.x_bytes = align256(esz * static_cast<std::size_t>(g.count) * static_cast<std::size_t>(g.sx));
    g.a_bytes = align256(esz * static_cast<std::size_t>(g.count) * static_cast<std::size_t>(g.sa));
    scratch = std::max(scratch, 2 * g.x_bytes + 2 * g.a_bytes);
    g.t0 = static_cast<int>(tiles.size());
    g.m0 = static_cast<int>(elems.size());
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
      e.grad = m.grad;
      e.grad_dtype = m.grad_dtype;
      e.apply = m.apply;
      e.tile0 = static_cast<int>(tiles.size());
      for (const MuonTile& t : muon_tiles({e.count}, kMuonElemTile))
        tiles.push_back({static_cast<std::int32_t>(elems.size()), t.begin, t.end});
      e.tiles = static_cast<int>(tiles.size()) - e.tile0;
      elems.push_back(e);
    }
    g.tiles = static_cast<int>(tiles.size()) - g.t0;
    st->groups.push_back(std::move(g));
  }
  SHARDOPT_CUBLAS(cublasLtCreate(&st->handle));
  for (GemmGroup& g : st->groups) plan_group(st->handle, g, plan.split_k);
  st->scratch = DeviceBuffer(Backend::Cuda, scratch);
  fill_zero_async(Backend::Cuda, st->scratch.data(), st->scratch.bytes(), nullptr);
  for (MuonElemMatrix& e : elems) e.x = st->scratch.as<char>() + reinterpret_cast<std::uintptr_t>(e.x);
  st->partials = DeviceBuffer(Backend::Cuda, tiles.size() * sizeof(double));
  st->norms = DeviceBuffer(Backend::Cuda, elems.size() * sizeof(float));
  st->mats = upload_table(Backend::Cuda, elems.data(), elems.size() * sizeof(MuonElemMatrix));
  st->tiles = upload_table(Backend::Cuda, tiles.data(), tiles.size() * sizeof(MuonTile));
  st->workspace = DeviceBuffer(Backend::Cuda, kWorkspaceBytes);
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the zeroed scratch
  return st.release();
}

namespace {

// Where a stage of the update ends, for MuonUpdate::profile (null: not profiling).
using Mark = std::function<void(const GemmGroup&, const char*)>;

void matmul(const MuonCudaState& st, const LtGemm& m, char* const (&bufs)[4], std::size_t esz, Stream stream) {
  const auto at = [&](Buf b, long long e) { return bufs[static_cast<int>(b)] + static_cast<std::size_t>(e) * esz; };
  SHARDOPT_CUBLAS(cublasLtMatmul(st.handle, m.op, &m.alpha, at(m.pb, m.p_at), m.p, at(m.qb, m.q_at), m.q, &m.beta,
                                 at(m.cb, m.c_at), m.cd, at(m.db, m.d_at), m.cd, &m.algo, st.workspace.data(),
                                 st.workspace.bytes(), stream));
}

void run_groups(const MuonCudaState& st, const StepScalars* scalars, Stream stream, const Mark& mark) {
  SHARDOPT_REQUIRE(detail::current_device() == st.device, ErrorCode::InvalidArgument,
                   "Muon: the update was built on CUDA device " + std::to_string(st.device) +
                       " and is run with another current; make that device current (cudaSetDevice)");
  const auto* mats = st.mats.as<const MuonElemMatrix>();
  const auto* tiles = st.tiles.as<const MuonTile>();
  auto* partials = st.partials.as<double>();
  for (const GemmGroup& g : st.groups) {
    muon_momentum_cuda(mats, tiles, g.t0, g.tiles, partials, scalars, stream);
    muon_normalize_cuda(mats, tiles, g.t0, g.tiles, g.m0, g.count, partials, st.norms.as<float>(), scalars, stream);
    if (mark) mark(g, "momentum, Nesterov, norm");
    char* base = st.scratch.as<char>();
    char* x[2] = {base, base + g.x_bytes};
    char* A = base + 2 * g.x_bytes;
    char* B = A + g.a_bytes;
    const std::size_t esz = g.f32 ? 4 : 2;
    int cur = 0;
    for (int s = 0; s < g.steps; ++s) {
      char* const bufs[4] = {x[cur], x[1 - cur], A, B};
      const bool mirror = g.block < g.n;
      for (const LtGemm& m : g.xxt) matmul(st, m, bufs, esz, stream);
      if (mark) mark(g, "X X^T");
      if (mirror) muon_mirror_cuda(A, g.n, g.block, g.sa, g.count, g.f32, stream);
      if (mark && mirror) mark(g, "mirror");
      for (const LtGemm& m : g.aa) matmul(st, m, bufs, esz, stream);
      if (mark) mark(g, "b A + c A A");
      if (mirror) muon_mirror_cuda(B, g.n, g.block, g.sa, g.count, g.f32, stream);
      if (mark && mirror) mark(g, "mirror");
      matmul(st, g.bx, bufs, esz, stream);
      if (mark) mark(g, "a X + B X");
      cur = 1 - cur;
    }
    muon_finish_cuda(mats, tiles, g.t0, g.tiles, cur == 0 ? 0 : static_cast<std::int64_t>(g.x_bytes), scalars, stream);
    if (mark) mark(g, "copy back");
  }
}

std::string group_name(const GemmGroup& g) {
  const int rows = g.trans ? g.k : g.n, cols = g.trans ? g.n : g.k;
  return std::to_string(g.count) + " x " + std::to_string(rows) + "x" + std::to_string(cols) +
         (g.f32 ? " f32" : " bf16");
}

}  // namespace

void muon_cuda_run(const MuonCudaState& st, const StepScalars* scalars, Stream stream) {
  run_groups(st, scalars, stream, Mark{});
}

std::vector<MuonStageTime> muon_cuda_profile(const MuonCudaState& st, const StepScalars* scalars, Stream stream,
                                             int iters) {
  SHARDOPT_REQUIRE(iters > 0, ErrorCode::InvalidArgument, "MuonUpdate::profile: iters must be positive");
  // One event before the update and one after each stage; a stage's time is the sum of
  // its intervals in a run, reported as the median over the runs.
  std::vector<std::string> names;   // stage per interval, in order
  std::vector<cudaEvent_t> events;  // pooled: one per mark of every run
  std::map<std::string, std::vector<double>> per_run;
  std::vector<std::string> order;
  const auto event = [&](std::size_t i) {
    if (i == events.size()) {
      cudaEvent_t e = nullptr;
      SHARDOPT_CUDA_CHECK(cudaEventCreate(&e));
      events.push_back(e);
    }
    return events[i];
  };
  try {
    run_groups(st, scalars, stream, Mark{});  // warm-up
    for (int it = 0; it < iters; ++it) {
      names.clear();
      std::size_t used = 0;
      SHARDOPT_CUDA_CHECK(cudaEventRecord(event(used++), stream));
      run_groups(st, scalars, stream, [&](const GemmGroup& g, const char* stage) {
        names.push_back(group_name(g) + ": " + stage);
        SHARDOPT_CUDA_CHECK(cudaEventRecord(event(used++), stream));
      });
      SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::map<std::string, double> sum;
      for (std::size_t i = 0; i < names.size(); ++i) {
        float ms = 0.0f;
        SHARDOPT_CUDA_CHECK(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
        if (sum.find(names[i]) == sum.end() && it == 0) order.push_back(names[i]);
        sum[names[i]] += ms;
      }
      for (const auto& [name, ms] : sum) per_run[name].push_back(ms);
    }
  } catch (...) {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    throw;
  }
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  std::vector<MuonStageTime> out;
  for (const std::string& name : order) {
    std::vector<double> v = per_run[name];
    std::sort(v.begin(), v.end());
    out.push_back({name, v[v.size() / 2]});
  }
  return out;
}

std::size_t muon_cuda_scratch_bytes(const MuonCudaState& st) noexcept {
  return st.workspace.bytes() + st.scratch.bytes() + st.partials.bytes() + st.norms.bytes() + st.mats.bytes() +
         st.tiles.bytes();
}

int muon_cuda_groups(const MuonCudaState& st) noexcept { return static_cast<int>(st.groups.size()); }

void muon_cuda_destroy(MuonCudaState* st) noexcept { delete st; }

}  // namespace shardopt::kernels
