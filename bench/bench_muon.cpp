// bench_muon.cpp - Muon (issue 34, docs/muon.md) on the hidden matrices of a Llama-like 1B
// model (Llama-3.2-1B's: 16 layers of q 2048 x 2048, k and v 512 x 2048, o 2048 x 2048,
// gate and up 8192 x 2048, down 2048 x 8192; 112 matrices, 973,078,528 parameters, bf16
// parameters, bf16 gradients, every matrix in one Muon group), one GPU per rank:
//
//   muon_step         DistributedAdam's whole step (exchange, momentum, cuBLAS Newton-Schulz,
//                     apply, parameter all-gather) replayed from a CUDA graph, against the peer
//                     in the same job (bench/peers/muon_peer.py: torch.optim.Muon at 1 rank, a
//                     gather-orthogonalize-scatter torch peer at 2+); the eager step, and the host
//                     CPU time of one replay and of one eager step
//   muon_ns_gemm      (a run of one rank) the Newton-Schulz update of all 112 matrices on one GPU
//                     (kernels::MuonUpdate, bf16 GEMMs, then the fp32-GEMM mode) against plain
//                     cuBLAS GEMMs of the same shapes, batches and count, bf16 in / out with
//                     fp32 accumulation, measured in this process (limit_ms: fraction_of_limit is
//                     the Newton-Schulz GEMM throughput as a fraction of the plain GEMMs'); rows
//                     bf16-gemm (symmetric products by block columns of the default widths),
//                     bf16-gemm-no-split-k, bf16-gemm-block256 (256 wide), bf16-gemm-dense (every
//                     product whole), f32-gemm
//   muon_ns_phases    (one rank) the bf16 update's stages per GEMM group (MuonUpdate::profile)
//                     against plain dense GEMMs per group and the elementwise bytes at the copy
//                     bandwidth measured in this process
//   muon_offload      (--offload F, one rank) the same step with a share F of the state on the
//                     host (AdamOptions::offload_fraction: the moved buckets' fp32 masters and
//                     momentum in pinned memory, read and written in place by Muon's kernels),
//                     against max(the on-GPU step, a duplex pinned <-> device copy of the moved
//                     state, 8 bytes an element each way), both measured in this process
//
//   mpirun -n N bench_muon [--results DIR] [--peer FILE] [--iters N] [--layers L] [--offload F]
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "cuda_bench.hpp"
#include "kernels/muon/muon.hpp"
#include "mpi_bench.hpp"
#include "optimizer/state_offload.hpp"
#include "results.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/muon.hpp"

namespace {
using namespace shardopt;
using Clock = std::chrono::steady_clock;

struct Matrix {
  std::string name;
  std::int64_t rows, cols;
};

std::vector<Matrix> llama_matrices(int layers) {
  std::vector<Matrix> m;
  for (int l = 0; l < layers; ++l) {
    const std::string p = "layer" + std::to_string(l) + ".";
    for (const Matrix& x : std::vector<Matrix>{{"q", 2048, 2048}, {"k", 512, 2048}, {"v", 512, 2048},
                                               {"o", 2048, 2048}, {"gate", 8192, 2048}, {"up", 8192, 2048},
                                               {"down", 2048, 8192}})
      m.push_back({p + x.name, x.rows, x.cols});
  }
  return m;
}

std::int64_t numel(const std::vector<Matrix>& ms) {
  std::int64_t n = 0;
  for (const Matrix& m : ms) n += m.rows * m.cols;
  return n;
}

// Multiply-adds x 2 of the iterations: per step 2 n^2 k (A) + 2 n^3 (A A) + 2 n^2 k (B X).
double ns_flops(const std::vector<Matrix>& ms, int steps) {
  double f = 0.0;
  for (const Matrix& m : ms) {
    const double n = static_cast<double>(std::min(m.rows, m.cols)), k = static_cast<double>(std::max(m.rows, m.cols));
    f += steps * (4.0 * n * n * k + 2.0 * n * n * n);
  }
  return f;
}

cudaStream_t cu(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

double host_us(Stream s, int iters, const std::function<void()>& launch) {
  std::vector<double> t;
  for (int it = 0; it < iters; ++it) {
    const auto t0 = Clock::now();
    launch();
    const auto t1 = Clock::now();
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(cu(s)));
    t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return bench::median(t);
}

void check(cublasStatus_t st) {
  if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string("cuBLAS: ") + cublasGetStatusString(st));
}

// The Newton-Schulz update alone, and plain cuBLAS GEMMs of the same shapes (equal shapes
// batched as MuonUpdate batches them), on rank 0's GPU.
void ns_rows(const std::vector<Matrix>& ms, Stream s, int iters, const std::string& device, const std::string& cmd,
             const std::string& results) {
  const std::int64_t n_all = numel(ms);
  DeviceBuffer g(Backend::Cuda, static_cast<std::size_t>(n_all) * 4), m(Backend::Cuda, static_cast<std::size_t>(n_all) * 4);
  bench::fill_random(m.data(), DType::f32, n_all, 11, 1e-3f, s);
  DeviceBuffer scalars(Backend::Cuda, sizeof(StepScalars));
  const StepScalars sc;
  SHARDOPT_CUDA_CHECK(cudaMemcpy(scalars.data(), &sc, sizeof sc, cudaMemcpyHostToDevice));
  // Plain GEMMs: per group of equal shape (n, k, count), ns_steps x the three products.
  struct Group {
    int n, k, count;
  };
  std::vector<Group> groups;
  for (const Matrix& x : ms) {
    const int n = static_cast<int>(std::min(x.rows, x.cols)), k = static_cast<int>(std::max(x.rows, x.cols));
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& gr) { return gr.n == n && gr.k == k; });
    if (it != groups.end()) {
      ++it->count;
    } else {
      groups.push_back({n, k, 1});
    }
  }
  std::size_t plain_bytes = 0;
  for (const Group& gr : groups)
    plain_bytes = std::max<std::size_t>(plain_bytes, 2ull * gr.count * (2ull * gr.n * gr.k + 2ull * gr.n * gr.n));
  const MuonSettings defaults;
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h));
  DeviceBuffer ws(Backend::Cuda, 32u << 20), plain(Backend::Cuda, plain_bytes);
  SHARDOPT_CUDA_CHECK(cudaMemsetAsync(plain.data(), 0, plain_bytes, cu(s)));
  check(cublasSetStream(h, cu(s)));
  check(cublasSetWorkspace(h, ws.data(), ws.bytes()));
  const auto plain_group = [&](const Group& gr) {
    const float one = 1.0f, zero = 0.0f;
    {
      char* X = plain.as<char>();
      char* Y = X + 2ull * gr.count * gr.n * gr.k;
      char* A = Y + 2ull * gr.count * gr.n * gr.k;
      char* B = A + 2ull * gr.count * gr.n * gr.n;
      const long long sx = 1ll * gr.n * gr.k, sa = 1ll * gr.n * gr.n;
      for (int st = 0; st < defaults.ns_steps; ++st) {
        check(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, gr.n, gr.n, gr.k, &one, X, CUDA_R_16BF, gr.k, sx, X,
                                         CUDA_R_16BF, gr.k, sx, &zero, A, CUDA_R_16BF, gr.n, sa, gr.count,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        check(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, gr.n, gr.n, gr.n, &one, A, CUDA_R_16BF, gr.n, sa, A,
                                         CUDA_R_16BF, gr.n, sa, &zero, B, CUDA_R_16BF, gr.n, sa, gr.count,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        check(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_T, gr.k, gr.n, gr.n, &one, X, CUDA_R_16BF, gr.k, sx, B,
                                         CUDA_R_16BF, gr.n, sa, &zero, Y, CUDA_R_16BF, gr.k, sx, gr.count,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
    }
  };
  const auto plain_gemms = [&] {
    for (const Group& gr : groups) plain_group(gr);
  };
  const double plain_ms = bench::time_ms(s, 3, iters, plain_gemms);
  const double flops = ns_flops(ms, defaults.ns_steps);
  // HBM bandwidth in this process: a device-to-device copy of the gradients (read + write).
  DeviceBuffer g_copy(Backend::Cuda, g.bytes());
  const double hbm_copy_ms = bench::time_ms(s, 2, iters, [&] {
    SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(g_copy.data(), g.data(), g.bytes(), cudaMemcpyDeviceToDevice, cu(s)));
  });
  const double hbm_gbps = 2.0 * static_cast<double>(g.bytes()) / (hbm_copy_ms * 1e6);
  struct Mode {
    MuonGemm gemm;
    kernels::MuonGemmPlan plan;  // block width 1 << 30: every product whole
    const char* config;
    const char* note;
  };
  const Mode modes[] = {
      {MuonGemm::Bf16, {}, "bf16-gemm", "X X^T and A A by upper block columns (the default widths), mirrored"},
      {MuonGemm::Bf16, {0, false}, "bf16-gemm-no-split-k", "the default, but no algorithm that splits K"},
      {MuonGemm::Bf16, {256, true}, "bf16-gemm-block256", "X X^T and A A by upper block columns 256 wide"},
      {MuonGemm::Bf16, {1 << 30, true}, "bf16-gemm-dense", "every product whole"},
      {MuonGemm::F32, {}, "f32-gemm", "X X^T and A A by upper block columns (the default widths), mirrored"}};
  for (const Mode& mode : modes) {
    std::vector<kernels::MuonMatrix> mats;
    std::int64_t at = 0;
    MuonSettings st;
    st.gemm = mode.gemm;
    for (const Matrix& x : ms) {
      mats.push_back({g.as<float>() + at, m.as<float>() + at, x.rows, x.cols, st});
      at += x.rows * x.cols;
    }
    kernels::MuonUpdate update(Backend::Cuda, mats, true, mode.plan);
    // Every call starts from the same gradient (the update overwrites it).
    DeviceBuffer g0(Backend::Cuda, g.bytes());
    bench::fill_random(g0.data(), DType::f32, n_all, 12, 1e-3f, s);
    const double ours_ms = bench::time_ms(s, 2, iters, [&] {
      SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(g.data(), g0.data(), g.bytes(), cudaMemcpyDeviceToDevice, cu(s)));
      update.run(scalars.as<StepScalars>(), s);
    });
    const double copy_ms = bench::time_ms(s, 2, iters, [&] {
      SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(g.data(), g0.data(), g.bytes(), cudaMemcpyDeviceToDevice, cu(s)));
    });
    bench::Result r;
    r.bench = "muon_ns_gemm";
    r.config = std::string("llama1b/") + mode.config;
    r.device = device;
    r.ours_ms = ours_ms - copy_ms;  // the restoring copy is not Muon's
    r.limit_ms = plain_ms;
    r.numbers["matrices"] = static_cast<double>(ms.size());
    r.numbers["elements"] = static_cast<double>(n_all);
    r.numbers["gemm_groups"] = update.groups();
    r.numbers["ns_tflops"] = flops / (*r.ours_ms * 1e9);
    r.numbers["plain_bf16_gemm_ms"] = plain_ms;
    r.numbers["plain_bf16_gemm_tflops"] = flops / (plain_ms * 1e9);
    r.numbers["scratch_bytes"] = static_cast<double>(update.scratch_bytes());
    r.numbers["hbm_copy_gbps"] = hbm_gbps;
    r.notes["ours"] = std::string("MuonUpdate of all matrices (momentum, Nesterov, norm, ns_steps=5 iterations, copy "
                                  "back); ") + mode.note;
    r.notes["limit"] = "plain cuBLAS bf16 GEMMs (fp32 accumulation, beta 0) of the same shapes and batches, same process";
    r.command = cmd;
    std::printf("muon_ns_gemm %s: %.3f ms, plain dense bf16 GEMMs %.3f ms (%.3f of limit)\n", mode.config, *r.ours_ms,
                plain_ms, plain_ms / *r.ours_ms);
    bench::write(r, results);
    if (mode.gemm != MuonGemm::Bf16) continue;
    // The breakdown: each stage's time per group, and the limit of each part: the plain
    // GEMMs of the group, and the bytes of the elementwise stages at this process's copy
    // bandwidth (momentum + norm: read g, m, write m, g, then read g, write bf16 X: 22 B an
    // element; copy back: read bf16, write fp32: 6 B).
    const std::vector<kernels::MuonStageTime> stages = update.profile(scalars.as<StepScalars>(), s, iters);
    bench::Result b;
    b.bench = "muon_ns_phases";
    b.config = r.config;
    b.device = device;
    double total = 0.0;
    for (const kernels::MuonStageTime& t : stages) {
      b.numbers[t.stage + " ms"] = t.ms;
      total += t.ms;
      std::printf("  %-48s %8.3f ms\n", t.stage.c_str(), t.ms);
    }
    b.ours_ms = total;
    double plain_sum = 0.0;
    for (const Group& gr : groups) {
      const double ms_g = bench::time_ms(s, 2, iters, [&] { plain_group(gr); });
      plain_sum += ms_g;
      const std::string name = std::to_string(gr.count) + " matrices " + std::to_string(gr.n) + "x" + std::to_string(gr.k);
      b.numbers["plain dense GEMMs, " + name + " ms"] = ms_g;
      std::printf("  plain dense GEMMs, %-30s %8.3f ms\n", name.c_str(), ms_g);
    }
    const double elem_limit_ms = 28.0 * static_cast<double>(n_all) / (hbm_gbps * 1e6);
    b.limit_ms = plain_sum + elem_limit_ms;
    b.numbers["elementwise bytes limit ms"] = elem_limit_ms;
    b.numbers["hbm_copy_gbps"] = hbm_gbps;
    b.notes["ours"] = "MuonUpdate::profile: each stage's median time (eager, an event after every stage)";
    b.notes["limit"] = "plain dense cuBLAS bf16 GEMMs per group plus 28 bytes an element at the copy bandwidth, same process";
    b.command = cmd;
    bench::write(b, results);
  }
  check(cublasDestroy(h));
}

// DistributedAdam's whole step with every matrix in one Muon group, `offload` of its state
// on the host. Writes the muon_step row (offload 0) and returns the replay's median ms.
double step_rows(const Communicator& comm, const std::vector<Matrix>& ms, Stream s, int iters, const std::string& device,
                 const std::string& cmd, const bench::RunArgs& a, double offload = 0.0, double on_gpu_ms = 0.0) {
  std::vector<ParamSpec> specs;
  for (const Matrix& x : ms) specs.push_back(ParamSpec::tensor(x.name, {x.rows, x.cols}, DType::bf16, "muon"));
  DistributedAdamOptions o;
  o.grad_dtype = DType::bf16;
  o.offload_fraction = offload;
  AdamGroup grp;
  grp.algorithm = GroupAlgorithm::Muon;
  o.groups["muon"] = grp;
  DistributedAdam opt(comm, specs, o);
  opt.set_lr(0.02f);
  for (int i = 0; i < opt.num_params(); ++i) {
    const ParamView p = opt.param(i);
    bench::fill_random(p.data, p.dtype, p.numel(), 100 + static_cast<std::uint64_t>(i), 0.02f, s);
    const GradView gv = opt.grad(i);
    bench::fill_random(gv.data, gv.dtype, gv.numel(), 7000 + static_cast<std::uint64_t>(i), 1e-3f, s);
  }
  opt.init_master(s);
  opt.step(s);  // warm-up: module loads, NCCL connections, cuBLAS kernels
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(cu(s)));
  const double eager_ms = bench::time_ms(s, 1, iters, [&] { opt.step(s); });
  const double eager_host = host_us(s, iters, [&] { opt.step(s); });
  bench::CapturedGraph graph(s, [&] { opt.step(s); });
  graph.launch(s);
  const double replay_ms = bench::time_ms(s, 2, iters, [&] { graph.launch(s); });
  const double replay_host = host_us(s, std::max(iters, 100), [&] { graph.launch(s); });
  if (offload > 0.0) {
    // The moved state's bytes each way: the fp32 master and the momentum of every element
    // of the moved buckets (one rank: every matrix is homed here).
    std::int64_t moved = 0;
    const std::vector<bool> host = detail::offloaded_buckets(opt.layout(), offload);
    for (std::size_t b = 0; b < host.size(); ++b)
      if (host[b]) moved += opt.layout().buckets()[b].real_numel;
    const auto bytes = static_cast<std::size_t>(8 * moved);
    const double pcie_ms = bytes > 0 ? bench::duplex_copy_ms(s, iters, bytes, std::size_t{16} << 20) : 0.0;
    bench::Result r;
    r.bench = "muon_offload";
    char fraction[32];
    std::snprintf(fraction, sizeof fraction, "%g", offload);
    r.config = std::string("llama1b/n1/F") + fraction;
    r.device = device;
    r.ours_ms = replay_ms;
    r.limit_ms = std::max(on_gpu_ms, pcie_ms);
    r.numbers["on_gpu_ms"] = on_gpu_ms;
    r.numbers["pcie_duplex_ms"] = pcie_ms;
    r.numbers["pcie_gbps_each_way"] = pcie_ms > 0 ? static_cast<double>(bytes) / (pcie_ms * 1e6) : 0.0;
    r.numbers["moved_bytes_each_way"] = static_cast<double>(bytes);
    r.numbers["offloaded_bytes"] = static_cast<double>(opt.memory().offloaded);
    r.numbers["eager_ms"] = eager_ms;
    r.notes["ours"] = "the muon_step's step with offload_fraction F, one CUDA graph replayed";
    r.notes["limit"] = "max(the same step on the GPU, a duplex pinned <-> device copy of 8 bytes an element each way, "
                       "16 MiB pieces), same process";
    r.command = cmd;
    std::printf("muon_offload F=%g: replay %.3f ms, on-GPU %.3f ms, PCIe duplex %.3f ms (%.1f GB/s each way)\n", offload,
                replay_ms, on_gpu_ms, pcie_ms, r.numbers["pcie_gbps_each_way"]);
    bench::write(r, a.results);
    return replay_ms;
  }
  if (comm.rank() != 0) return replay_ms;
  bench::Result r;
  r.bench = "muon_step";
  r.config = "llama1b/n" + std::to_string(comm.size());
  r.device = device;
  r.ours_ms = replay_ms;
  bench::apply_peer(r, a.peer);
  r.numbers["eager_ms"] = eager_ms;
  r.numbers["replay_host_us"] = replay_host;
  r.numbers["eager_host_us"] = eager_host;
  r.numbers["matrices"] = static_cast<double>(ms.size());
  r.numbers["params"] = static_cast<double>(numel(ms));
  r.numbers["ranks"] = comm.size();
  r.notes["ours"] = "DistributedAdam step, every matrix Muon (bf16 GEMMs), one CUDA graph replayed; bf16 params and grads";
  r.command = cmd;
  std::printf("muon_step n%d: replay %.3f ms, eager %.3f ms\n", comm.size(), replay_ms, eager_ms);
  bench::write(r, a.results);
  return replay_ms;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::mpi_main(argc, argv, "bench_muon", {}, [&] {
    bench::RunArgs a;
    a.iters = 10;
    int layers = 16;
    double offload = 0.0;
    bench::parse_run_args(argc, argv, a, [&](bench::ArgReader& r) {
      if (r.arg() == "--layers") {
        layers = std::atoi(r.value().c_str());
      } else if (r.arg() == "--offload") {
        offload = std::atof(r.value().c_str());
      } else {
        return false;
      }
      return true;
    });
    bench::MpiBench mb(Backend::Cuda);
    const std::vector<Matrix> ms = llama_matrices(layers);
    const std::string device = mb.device(), cmd = bench::command_line(argc, argv);
    SHARDOPT_REQUIRE(offload == 0.0 || (offload > 0.0 && offload <= 1.0 && mb.comm().size() == 1),
                     ErrorCode::InvalidArgument, "bench_muon --offload takes a fraction in (0, 1], at one rank");
    if (mb.comm().size() == 1 && offload == 0.0) ns_rows(ms, mb.stream(), a.iters, device, cmd, a.results);
    const double on_gpu = step_rows(mb.comm(), ms, mb.stream(), a.iters, device, cmd, a);
    if (offload > 0.0) step_rows(mb.comm(), ms, mb.stream(), a.iters, device, cmd, a, offload, on_gpu);
    return 0;
  });
}
