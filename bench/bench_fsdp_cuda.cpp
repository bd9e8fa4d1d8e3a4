// bench_fsdp_cuda.cpp - bench_fsdp's device half (bench_fsdp.hpp): the cuBLAS model, the
// captured iteration and its pieces, timed on the GPU; bench_fsdp.cpp's header comment says
// what each row is. Compiled only in a CUDA build.
#include "bench_fsdp.hpp"

#include <cublas_v2.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "cuda_bench.hpp"
#include "mpi_bench.hpp"
#include "results.hpp"
#include "shardopt/fsdp.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/step_graph.hpp"

namespace shardopt::bench_fsdp {
namespace {

// Initial values: random bf16 parameter shards (init_master), or, for MXFP8, the same
// random values written as fp32 into the master (init_from_master).
void init_shard(Fsdp& f, Stream s) {
  for (int i = 0; i < f.num_params(); ++i) {
    const bool mx = f.is_mxfp8(i);
    const ShardView v = mx ? f.shard_master(i) : f.shard_param(i);
    bench::fill_random(v.data, mx ? DType::f32 : DType::bf16, v.numel(), 100 + static_cast<std::uint64_t>(i), 0.02f, s);
  }
  if (f.options().param_format == ParamFormat::Mxfp8) {
    f.init_from_master(s);
  } else {
    f.init_master(s);
  }
}

// wait_param of unit u for `pass`: bf16 views, or (MXFP8) the pass's plane of each
// weight decoded straight to bf16 into `weights`, which the GEMMs read.
struct UnitWeights {
  const void* up = nullptr;
  const void* down = nullptr;
};
UnitWeights unit_weights(Fsdp& f, int u, FsdpPass pass, DeviceBuffer* weights, Stream s) {
  const auto w = f.wait_param(u, pass, s);
  if (f.options().param_format != ParamFormat::Mxfp8) return {w[0].data, w[1].data};
  auto* out = weights->as<std::uint16_t>();
  std::vector<Mxfp8Decode> list;  // both weights of the unit in one launch
  for (int k = 0; k < 2; ++k) {
    const Mxfp8PassView v = f.mxfp8_param(2 * u + k, pass);
    list.push_back({v.shape, v.plane, v.data, v.scales, out + static_cast<std::size_t>(k) * kHidden * kMlp});
  }
  dequantize_mxfp8_batch(list, f.backend(), s);
  return {out, out + kHidden * kMlp};
}

// One iteration without the GEMMs: every gather and reduce-scatter, the step, zero_grad.
void comm_iteration(Fsdp& f, Stream s) {
  for (int u = 0; u < kUnits; ++u) (void)f.wait_param(u, FsdpPass::Forward, s);
  for (int u = kUnits - 1; u >= 0; --u) {
    (void)f.wait_param(u, FsdpPass::Backward, s);
    (void)f.grad_slot(u, s);
    f.grad_ready(u, s);
  }
  f.step(s);
  f.zero_grad(s);
}

// Bytes of parameter all-gathers of one eager iteration (forward + backward, no
// compute) and the persistent memory per rank of an optimizer of the same options.
struct Traffic {
  std::int64_t gathered = 0, memory = 0, pool = 0, mxfp8 = 0;
};
Traffic traffic(Fsdp& f, Stream s) {
  comm_iteration(f, s);  // learns the order
  const FsdpGatherStats before = f.gather_stats();
  comm_iteration(f, s);
  const FsdpGatherStats after = f.gather_stats();
  f.synchronize(s);
  const MemoryReport m = f.memory();
  return {after.forward_bytes + after.backward_bytes - before.forward_bytes - before.backward_bytes, m.total(), m.pool,
          m.mxfp8};
}

#define CUBLAS_CHECK(call)                                                                        \
  do {                                                                                            \
    const cublasStatus_t st_ = (call);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                           \
      std::fprintf(stderr, "cuBLAS call %s failed: %d at %s:%d\n", #call, static_cast<int>(st_), __FILE__, \
                   __LINE__);                                                                     \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// Row-major C[M,N] = op(A)[M,K] op(B)[K,N] + beta C, bf16 in and out, fp32 accumulation.
void gemm(cublasHandle_t h, bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const void* A,
          std::int64_t lda, const void* B, std::int64_t ldb, void* C, std::int64_t ldc, float beta) {
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                            static_cast<int>(M), static_cast<int>(K), &alpha, B, CUDA_R_16BF, static_cast<int>(ldb), A,
                            CUDA_R_16BF, static_cast<int>(lda), &beta, C, CUDA_R_16BF, static_cast<int>(ldc),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Binds the cuBLAS handle to `s` with a fixed workspace, so that no GEMM allocates
// (inside a capture it must not). cublasSetStream resets the workspace, hence both.
void bind(cublasHandle_t h, Stream s, void* workspace, std::size_t bytes) {
  CUBLAS_CHECK(cublasSetStream(h, reinterpret_cast<cudaStream_t>(s)));
  CUBLAS_CHECK(cublasSetWorkspace(h, workspace, bytes));
}

// Activations of the synthetic model: x[u] (input of unit u), a[u] (its up output).
struct Activations {
  std::vector<DeviceBuffer> x, a;
  DeviceBuffer dy, dx, da;
  Activations(std::int64_t T, Stream s) {
    for (int u = 0; u <= kUnits; ++u) x.emplace_back(Backend::Cuda, static_cast<std::size_t>(T * kHidden) * 2);
    for (int u = 0; u < kUnits; ++u) a.emplace_back(Backend::Cuda, static_cast<std::size_t>(T * kMlp) * 2);
    dy = DeviceBuffer(Backend::Cuda, static_cast<std::size_t>(T * kHidden) * 2);
    dx = DeviceBuffer(Backend::Cuda, static_cast<std::size_t>(T * kHidden) * 2);
    da = DeviceBuffer(Backend::Cuda, static_cast<std::size_t>(T * kMlp) * 2);
    bench::fill_random(x[0].data(), DType::bf16, T * kHidden, 11, 1.0f, s);
    bench::fill_random(dy.data(), DType::bf16, T * kHidden, 12, 1e-3f, s);
  }
};

// Forward and backward of one unit on given weights / weight-gradient views.
void unit_forward(cublasHandle_t h, std::int64_t T, const void* up, const void* down, Activations& act, int u) {
  gemm(h, false, true, T, kMlp, kHidden, act.x[static_cast<std::size_t>(u)].data(), kHidden, up, kHidden,
       act.a[static_cast<std::size_t>(u)].data(), kMlp, 0.0f);
  gemm(h, false, true, T, kHidden, kMlp, act.a[static_cast<std::size_t>(u)].data(), kMlp, down, kMlp,
       act.x[static_cast<std::size_t>(u) + 1].data(), kHidden, 0.0f);
}

void unit_backward(cublasHandle_t h, std::int64_t T, const void* up, const void* down, void* gup, void* gdown,
                   Activations& act, int u) {
  const void* dy = u == kUnits - 1 ? act.dy.data() : act.dx.data();
  gemm(h, false, false, T, kMlp, kHidden, dy, kHidden, down, kMlp, act.da.data(), kMlp, 0.0f);
  gemm(h, true, false, kHidden, kMlp, T, dy, kHidden, act.a[static_cast<std::size_t>(u)].data(), kMlp, gdown, kMlp, 1.0f);
  gemm(h, false, false, T, kHidden, kMlp, act.da.data(), kMlp, up, kHidden, act.dx.data(), kHidden, 0.0f);
  gemm(h, true, false, kMlp, kHidden, T, act.da.data(), kMlp, act.x[static_cast<std::size_t>(u)].data(), kHidden, gup,
       kHidden, 1.0f);
}

// Iteration time with one captured graph (median), prefetch on or off.
double iteration_ms(const Communicator& comm, cublasHandle_t h, DeviceBuffer& ws, Activations& act, std::int64_t T,
                    bool prefetch, bool mxfp8, Stream s, int iters) {
  Fsdp f(comm, model_specs(kHidden, kMlp), model_units(), options(prefetch, mxfp8));
  init_shard(f, s);
  DeviceBuffer weights;  // MXFP8: the decoded bf16 weights of the unit in use
  if (mxfp8) weights = DeviceBuffer(Backend::Cuda, static_cast<std::size_t>(2 * kHidden * kMlp) * 2);
  StepGraph g(f, [&](Stream st, bool) {
    bind(h, st, ws.data(), ws.bytes());
    for (int u = 0; u < kUnits; ++u) {
      const UnitWeights w = unit_weights(f, u, FsdpPass::Forward, &weights, st);
      unit_forward(h, T, w.up, w.down, act, u);
    }
    for (int u = kUnits - 1; u >= 0; --u) {
      const UnitWeights w = unit_weights(f, u, FsdpPass::Backward, &weights, st);
      const auto g = f.grad_slot(u, st);
      unit_backward(h, T, w.up, w.down, g[0].data, g[1].data, act, u);
      f.grad_ready(u, st);
    }
  });
  g.capture(s);
  const double ms = bench::time_ms(s, 3, iters, [&] { g.replay(s); });
  bind(h, s, ws.data(), ws.bytes());
  return ms;
}
// The row of the same iteration against Megatron-FSDP (config "<config>/vs-megatron-fsdp"),
// from the file bench/peers/megatron_fsdp_peer.py wrote; none, with a line on stderr,
// when the file has no timing of this config (the peer failed, or does not run MXFP8).
void write_megatron_row(const bench::Result& ours, const std::string& path, const std::string& results) {
  bench::Result m;
  m.bench = ours.bench;
  m.config = ours.config;
  bench::apply_peer(m, path);
  if (!m.peer_ms) {
    std::fprintf(stderr, "bench_fsdp: no Megatron-FSDP timing of %s in %s: no vs-Megatron-FSDP row\n",
                 ours.config.c_str(), path.c_str());
    return;
  }
  m.config = ours.config + "/vs-megatron-fsdp";
  m.device = ours.device;
  m.ours_ms = ours.ours_ms;
  m.limit_ms = ours.limit_ms;
  m.notes = ours.notes;
  m.notes["peer_kind"] = "Megatron-FSDP (bench/peers/megatron_fsdp_peer.py; version in the peer field)";
  m.command = ours.command;
  bench::write(m, results);
}

}  // namespace

void run_device(const Args& a, bench::MpiBench& mb, const std::string& command) {
  const Communicator& comm = mb.comm();
  const Stream s = mb.stream();
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(cublasCreate(&h));
  DeviceBuffer workspace(Backend::Cuda, 64u << 20);
  bind(h, s, workspace.data(), workspace.bytes());
  const std::int64_t T = a.tokens;
  Activations act(T, s);
  const double on = iteration_ms(comm, h, workspace, act, T, true, a.mxfp8, s, a.iters);
  const double off = iteration_ms(comm, h, workspace, act, T, false, a.mxfp8, s, a.iters);

  // Pieces alone: compute on resident weights; communication of an iteration; the step.
  DeviceBuffer w(Backend::Cuda, static_cast<std::size_t>(2 * kHidden * kMlp) * 2),
      gw(Backend::Cuda, static_cast<std::size_t>(2 * kHidden * kMlp) * 2);
  bench::fill_random(w.data(), DType::bf16, 2 * kHidden * kMlp, 5, 0.02f, s);
  char* up = w.as<char>();
  char* down = up + kHidden * kMlp * 2;
  const double compute = bench::time_ms(s, 2, a.iters, [&] {
    for (int u = 0; u < kUnits; ++u) unit_forward(h, T, up, down, act, u);
    for (int u = kUnits - 1; u >= 0; --u)
      unit_backward(h, T, up, down, gw.as<char>(), gw.as<char>() + kHidden * kMlp * 2, act, u);
  });
  // Communication + step: the same iteration without the GEMMs.
  Fsdp f(comm, model_specs(kHidden, kMlp), model_units(), options(false, a.mxfp8));
  init_shard(f, s);
  const double comm_and_step = bench::time_ms(s, 2, a.iters, [&] { comm_iteration(f, s); });
  // The step alone: an optimizer whose learned order is empty (no gathers).
  Fsdp fa(comm, model_specs(kHidden, kMlp), model_units(), options(false, a.mxfp8));
  init_shard(fa, s);
  const double step = bench::time_ms(s, 2, a.iters, [&] { fa.step(s); });
  Fsdp ft(comm, model_specs(kHidden, kMlp), model_units(), options(true, a.mxfp8));
  init_shard(ft, s);
  const Traffic tr = traffic(ft, s);
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(s));
  if (comm.rank() == 0) {
    // The bf16 row keeps the key of the FSDP2 peer's file (and of earlier results).
    const std::string config = "16xMLP/T" + std::to_string(T) + "/n" + std::to_string(comm.size()) +
                               (a.mxfp8 ? "/mxfp8" : "");
    bench::Result r;
    r.bench = "fsdp_iteration";
    r.config = config;
    r.device = mb.device();
    r.ours_ms = on;
    r.limit_ms = std::max(compute, comm_and_step - step) + step;
    bench::apply_peer(r, a.peer);
    r.numbers["prefetch_off_ms"] = off;
    r.numbers["compute_only_ms"] = compute;
    r.numbers["comm_and_step_ms"] = comm_and_step;
    r.numbers["step_only_ms"] = step;
    r.numbers["param_count"] = static_cast<double>(2 * kUnits * kHidden * kMlp);
    r.numbers["gathered_bytes_per_iteration"] = static_cast<double>(tr.gathered);
    r.numbers["memory_per_rank_bytes"] = static_cast<double>(tr.memory);
    r.numbers["pool_bytes"] = static_cast<double>(tr.pool);
    r.numbers["mxfp8_storage_bytes"] = static_cast<double>(tr.mxfp8);
    r.notes["params"] = a.mxfp8 ? "MXFP8 (one plane gathered per pass, decoded straight to bf16 for the cuBLAS "
                                  "GEMMs)"
                                : "bf16";
    r.notes["limit"] = "max(compute alone, gathers + reduce-scatters alone) + the step alone, same process";
    r.notes["ours"] = "whole iteration (fwd + bwd + step + zero_grad) replayed from one CUDA graph, prefetch on";
    r.command = command;
    bench::write(r, a.results);
    if (!a.peer_megatron.empty()) write_megatron_row(r, a.peer_megatron, a.results);
  }
  CUBLAS_CHECK(cublasDestroy(h));
}

}  // namespace shardopt::bench_fsdp
