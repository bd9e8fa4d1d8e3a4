// The fused Adam and gradient-norm CUDA kernels: bitwise equal to their host twins (which
// test/unit checks against a double oracle) for every variant over many steps, with
// vector and scalar paths; a found-inf step leaves everything untouched; 50 replays of
// one captured step with lr changed through a pinned slot equal 50 eager steps
// bitwise; and a shard of more than 2^31 elements.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "../unit/adam_test_util.hpp"
#include "common/device_copy.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"
#include "shardopt/fused_adam.hpp"

namespace {
using namespace shardopt;
using namespace adamtest;

using test::bytes_to_device;
using test::bytes_to_host;

/// A device copy of a State; `shift` elements of offset on every base pointer (a shift
/// of 1 makes them misaligned, so the kernels take their scalar paths).
struct DeviceState {
  DeviceBuffer chunks, grads, params, master, m, v, scalars;
  ShardPointers ptrs;
  std::size_t gbytes = 0, pbytes = 0, mbytes = 0;
  int shift = 0;
  DType gt, pt, mt;

  static void* at(const DeviceBuffer& b, int shift, DType t) {
    return static_cast<unsigned char*>(b.data()) + static_cast<std::size_t>(shift) * size_of(t);
  }

  DeviceState(const Problem& p, const State& h, int shift_elems)
      : shift(shift_elems), gt(h.grads.dtype), pt(h.params.dtype), mt(h.exp_avg.dtype) {
    chunks = DeviceBuffer(Backend::Cuda, p.chunks.size() * sizeof(ShardChunk));
    bytes_to_device(Backend::Cuda, chunks.data(), p.chunks.data(), p.chunks.size() * sizeof(ShardChunk));
    gbytes = h.grads.nbytes();
    pbytes = h.params.nbytes();
    mbytes = h.exp_avg.nbytes();
    grads = DeviceBuffer(Backend::Cuda, gbytes + 64);
    params = DeviceBuffer(Backend::Cuda, pbytes + 64);
    master = DeviceBuffer(Backend::Cuda, h.master.size() * 4 + 64);
    m = DeviceBuffer(Backend::Cuda, mbytes + 64);
    v = DeviceBuffer(Backend::Cuda, mbytes + 64);
    scalars = DeviceBuffer(Backend::Cuda, sizeof(StepScalars));
    ptrs.chunks = chunks.as<ShardChunk>();
    ptrs.num_chunks = static_cast<std::int64_t>(p.chunks.size());
    ptrs.shard_numel = p.shard_numel;
    ptrs.grads = at(grads, shift, gt);
    ptrs.params = at(params, shift, pt);
    ptrs.master = static_cast<float*>(at(master, shift, DType::f32));
    ptrs.exp_avg = at(m, shift, mt);
    ptrs.exp_avg_sq = at(v, shift, mt);
    bytes_to_device(Backend::Cuda, const_cast<void*>(ptrs.grads), h.grads.data(), gbytes);
    bytes_to_device(Backend::Cuda, ptrs.params, h.params.data(), pbytes);
    bytes_to_device(Backend::Cuda, ptrs.master, h.master.data(), h.master.size() * 4);
    bytes_to_device(Backend::Cuda, ptrs.exp_avg, h.exp_avg.data(), mbytes);
    bytes_to_device(Backend::Cuda, ptrs.exp_avg_sq, h.exp_avg_sq.data(), mbytes);
  }
  StepScalars* sc() const { return scalars.as<StepScalars>(); }
  void set_scalars(const StepScalars& s) { bytes_to_device(Backend::Cuda, scalars.data(), &s, sizeof s); }
  StepScalars get_scalars() const {
    StepScalars s;
    bytes_to_host(Backend::Cuda, &s, scalars.data(), sizeof s);
    return s;
  }
  void upload_grads(const State& h) { bytes_to_device(Backend::Cuda, const_cast<void*>(ptrs.grads), h.grads.data(), gbytes); }
  void download(State& out) const {
    bytes_to_host(Backend::Cuda, out.params.data(), ptrs.params, pbytes);
    bytes_to_host(Backend::Cuda, out.master.data(), ptrs.master, out.master.size() * 4);
    bytes_to_host(Backend::Cuda, out.exp_avg.data(), ptrs.exp_avg, mbytes);
    bytes_to_host(Backend::Cuda, out.exp_avg_sq.data(), ptrs.exp_avg_sq, mbytes);
  }
};

/// Bitwise comparison of two states (host twin vs device), with the first difference.
void expect_same_state(const State& a, const State& b, const std::string& what) {
  auto first_diff = [](const std::vector<unsigned char>& x, const std::vector<unsigned char>& y, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      if (x[i] != y[i]) return static_cast<std::int64_t>(i);
    return std::int64_t{-1};
  };
  EXPECT_EQ(std::memcmp(a.master.data(), b.master.data(), a.master.size() * 4), 0) << what << ": master differs";
  EXPECT_EQ(first_diff(a.exp_avg.bytes, b.exp_avg.bytes, a.exp_avg.nbytes()), -1) << what << ": exp_avg differs";
  EXPECT_EQ(first_diff(a.exp_avg_sq.bytes, b.exp_avg_sq.bytes, a.exp_avg_sq.nbytes()), -1)
      << what << ": exp_avg_sq differs";
  EXPECT_EQ(first_diff(a.params.bytes, b.params.bytes, a.params.nbytes()), -1) << what << ": params differ";
}

void expect_same_scalars(const StepScalars& a, const StepScalars& b, const std::string& what) {
  EXPECT_EQ(a.step, b.step) << what;
  EXPECT_EQ(a.found_inf, b.found_inf) << what;
  // Every float the kernels derive, bit for bit.
  const float* fa[] = {&a.step_size, &a.bc2_sqrt, &a.grad_sumsq, &a.nonfinite, &a.grad_norm, &a.clip_coef};
  const float* fb[] = {&b.step_size, &b.bc2_sqrt, &b.grad_sumsq, &b.nonfinite, &b.grad_norm, &b.clip_coef};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(std::memcmp(fa[i], fb[i], 4), 0) << what << ": scalar " << i;
  EXPECT_EQ(std::memcmp(a.group_step_size, b.group_step_size, sizeof a.group_step_size), 0) << what;
  EXPECT_EQ(std::memcmp(a.group_decay, b.group_decay, sizeof a.group_decay), 0) << what;
}

/// `steps` steps of norm + finalize + Adam on the host twin and on the device, then a
/// bitwise comparison of everything.
void kernel_vs_twin(const AdamConfig& cfg, const Problem& prob, int shift, int steps) {
  const std::string what = describe(cfg) + (shift ? " (misaligned bases)" : "");
  State host(prob, cfg, 99);
  DeviceState dev(prob, host, shift);
  StepScalars hs;
  dev.set_scalars(hs);
  cudaStream_t stream = nullptr;
  for (int s = 0; s < steps; ++s) {
    random_grads(host.grads, 500 + static_cast<std::uint64_t>(s), s % 5 == 4 ? 50.0f : 1.0f);
    dev.upload_grads(host);
    const float lr = schedule_lr(s);
    // The same per-step inputs on both sides; the norm clips on the large-grad steps.
    StepScalars in = dev.get_scalars();
    in.lr = lr;
    in.inv_loss_scale = 0.5f;
    in.grad_sumsq = 0.0f;
    in.nonfinite = 0.0f;
    dev.set_scalars(in);
    hs.lr = lr;
    hs.inv_loss_scale = 0.5f;
    hs.grad_sumsq = 0.0f;
    hs.nonfinite = 0.0f;
    ShardPointers hp = host.pointers(prob);
    accumulate_grad_sumsq(cfg.grad_dtype, hp, &hs, Backend::Host, nullptr);
    finalize_grad_norm(2.0f, &hs, Backend::Host, nullptr);
    fused_adam_step(cfg, hp, &hs, Backend::Host, nullptr);
    accumulate_grad_sumsq(cfg.grad_dtype, dev.ptrs, dev.sc(), Backend::Cuda, reinterpret_cast<Stream>(stream));
    finalize_grad_norm(2.0f, dev.sc(), Backend::Cuda, reinterpret_cast<Stream>(stream));
    fused_adam_step(cfg, dev.ptrs, dev.sc(), Backend::Cuda, reinterpret_cast<Stream>(stream));
    SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  State got(prob, cfg, 0);
  dev.download(got);
  expect_same_state(host, got, what);
  expect_same_scalars(hs, dev.get_scalars(), what);
  EXPECT_EQ(hs.step, steps);
}

TEST(FusedAdamGpu, KernelEqualsHostTwinBitwiseEveryVariant) {
  const Problem aligned = default_problem(3), skewed = skewed_problem(3);
  for (const AdamConfig& cfg : all_variants()) {
    kernel_vs_twin(cfg, aligned, 0, 30);
    kernel_vs_twin(cfg, skewed, 0, 10);
  }
}

TEST(FusedAdamGpu, KernelEqualsHostTwinWithLargeChunksAndMisalignedBases) {
  // 64K-element chunks (long vector bodies, the U = 2 loop) and, with shift 1, every base
  // pointer misaligned (scalar path everywhere).
  const Problem big = make_problem(odd_specs(40), 2, 1, 1 << 16, 1 << 20, 64);
  for (const AdamConfig& cfg : all_variants()) {
    if (cfg.param_dtype == DType::f16 && cfg.write_params) continue;
    kernel_vs_twin(cfg, big, 0, 5);
    if (cfg.grad_dtype == DType::bf16) kernel_vs_twin(cfg, big, 1, 3);
  }
}

/// `p` with every third chunk left out (as an optimizer leaves out its Muon chunks) and
/// the moments of the chunks after each left-out run moved down by the run's length
/// (ShardChunk::moment_shift): exactly (`rounded` false: shifts that are no multiple of
/// the vector width, so those chunks take the scalar path) or rounded down to 16 (the
/// engine's rule, docs/muon.md: vector bodies).
Problem with_moment_shifts(Problem p, bool rounded) {
  std::vector<ShardChunk> kept;
  std::int64_t shift = 0, run = 0;
  for (std::size_t c = 0; c < p.chunks.size(); ++c) {
    if (c % 3 == 1) {
      run += p.chunks[c].length;
      continue;
    }
    shift += rounded ? run / 16 * 16 : run;
    run = 0;
    ShardChunk ch = p.chunks[c];
    ch.moment_shift = shift;
    kept.push_back(ch);
  }
  p.chunks = kept;
  return p;
}

// Issue 34: chunks whose moments sit at shard_offset - moment_shift (compact moments
// without the Muon pieces) give the host twin's bits on both the vector and scalar paths.
TEST(FusedAdamGpu, KernelEqualsHostTwinWithMomentShifts) {
  const Problem big = make_problem(odd_specs(40), 2, 1, 1 << 12, 1 << 20, 64);
  for (const AdamConfig& cfg : all_variants()) {
    if (cfg.param_dtype == DType::f16 && cfg.write_params) continue;
    kernel_vs_twin(cfg, with_moment_shifts(default_problem(3), false), 0, 5);
    kernel_vs_twin(cfg, with_moment_shifts(big, true), 0, 3);
  }
}

TEST(FusedAdamGpu, FoundInfLeavesEverythingUntouched) {
  const Problem prob = default_problem(3);
  AdamConfig cfg;
  cfg.grad_dtype = DType::bf16;
  cfg.groups = {AdamGroup{0.1, 1.0}, AdamGroup{0.0, 1.0}};
  State host(prob, cfg, 5);
  random_grads(host.grads, 6, 1.0f);
  DeviceState dev(prob, host, 0);
  StepScalars s;
  s.lr = 1e-3f;
  s.step = 7;
  dev.set_scalars(s);
  fused_adam_step(cfg, dev.ptrs, dev.sc(), Backend::Cuda, nullptr);  // one good step
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  State before(prob, cfg, 0);
  dev.download(before);
  const StepScalars sb = dev.get_scalars();
  ASSERT_EQ(sb.step, 8);
  host.grads.set(prob.chunks.back().buffer_offset + prob.chunks.back().length - 1,
                 std::numeric_limits<float>::quiet_NaN());
  dev.upload_grads(host);
  StepScalars z = sb;
  z.grad_sumsq = 0.0f;
  z.nonfinite = 0.0f;
  dev.set_scalars(z);
  accumulate_grad_sumsq(cfg.grad_dtype, dev.ptrs, dev.sc(), Backend::Cuda, nullptr);
  finalize_grad_norm(1.0f, dev.sc(), Backend::Cuda, nullptr);
  fused_adam_step(cfg, dev.ptrs, dev.sc(), Backend::Cuda, nullptr);
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  State after(prob, cfg, 0);
  dev.download(after);
  expect_same_state(before, after, "found-inf step");
  const StepScalars sa = dev.get_scalars();
  EXPECT_EQ(sa.found_inf, 1);
  EXPECT_EQ(sa.step, 8);
  EXPECT_EQ(std::memcmp(sa.group_step_size, sb.group_step_size, sizeof sa.group_step_size), 0);
}

TEST(FusedAdamGpu, GraphReplaysEqualEagerStepsBitwise) {
  const Problem prob = default_problem(3);
  for (DType gd : {DType::f32, DType::bf16}) {
    AdamConfig cfg;
    cfg.grad_dtype = gd;
    cfg.param_dtype = DType::bf16;
    cfg.groups = {AdamGroup{0.1, 1.0}, AdamGroup{0.0, 0.5}};
    State host(prob, cfg, 21);
    random_grads(host.grads, 22, 4.0f);
    DeviceState eager(prob, host, 0), graph(prob, host, 0);
    StepScalars s0;
    eager.set_scalars(s0);
    graph.set_scalars(s0);
    DeviceBuffer slot(Backend::Cuda, sizeof(float), MemoryKind::Pinned);
    float* lr_slot = slot.as<float>();
    *lr_slot = 0.0f;
    cudaStream_t stream;
    SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const Stream st = reinterpret_cast<Stream>(stream);
    // One captured step: lr from the pinned slot, the norm (zeroed first), clip, Adam.
    auto step_ops = [&](DeviceState& d) {
      copy_async(Backend::Cuda, &d.sc()->lr, lr_slot, sizeof(float), st);
      fill_zero_async(Backend::Cuda, &d.sc()->grad_sumsq, 2 * sizeof(float), st);
      accumulate_grad_sumsq(cfg.grad_dtype, d.ptrs, d.sc(), Backend::Cuda, st);
      finalize_grad_norm(1.0f, d.sc(), Backend::Cuda, st);
      fused_adam_step(cfg, d.ptrs, d.sc(), Backend::Cuda, st);
    };
    cudaGraph_t g;
    cudaGraphExec_t exec;
    SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    step_ops(graph);
    SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int s = 0; s < 50; ++s) {
      *lr_slot = schedule_lr(s);  // the stream is idle here: the slot may change
      step_ops(eager);
      SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
      SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    State a(prob, cfg, 0), b(prob, cfg, 0);
    eager.download(a);
    graph.download(b);
    expect_same_state(a, b, std::string("graph vs eager, grad ") + to_string(gd));
    const StepScalars se = eager.get_scalars(), sg = graph.get_scalars();
    expect_same_scalars(se, sg, "graph vs eager scalars");
    EXPECT_EQ(sg.step, 50);
    EXPECT_EQ(sg.lr, schedule_lr(49)) << "the last replay read the last lr";
    SHARDOPT_CUDA_CHECK(cudaGraphExecDestroy(exec));
    SHARDOPT_CUDA_CHECK(cudaGraphDestroy(g));
    SHARDOPT_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

TEST(FusedAdamGpu, ShardOfMoreThan2Pow31Elements) {
  const std::int64_t n = (std::int64_t{1} << 31) + 4099;
  // fp32 master + bf16 grads, moments and param output: 12 bytes per element, 26 GB.
  std::size_t free_b = 0, total_b = 0;
  SHARDOPT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < static_cast<std::size_t>(n) * 12 + (std::size_t{2} << 30)) GTEST_SKIP() << "needs ~28 GB free";
  AdamConfig cfg;
  cfg.grad_dtype = DType::bf16;
  cfg.moment_dtype = DType::bf16;
  cfg.param_dtype = DType::bf16;
  cfg.groups = {AdamGroup{0.1, 1.0}, AdamGroup{0.0, 0.5}};
  // Chunks of 2^24 up to 2^31 - 5, then one odd chunk across 2^31 to the end; groups
  // alternate. One bucket: buffer offsets equal shard offsets.
  std::vector<ShardChunk> table;
  const std::int64_t split = (std::int64_t{1} << 31) - 5;
  for (std::int64_t off = 0; off < split; off += std::int64_t{1} << 24) {
    ShardChunk c;
    c.shard_offset = c.buffer_offset = off;
    c.length = std::min(std::int64_t{1} << 24, split - off);
    c.group = static_cast<int>(table.size() % 2);
    table.push_back(c);
  }
  ShardChunk last;
  last.shard_offset = last.buffer_offset = split;
  last.length = n - split;
  last.group = 1;
  table.push_back(last);

  const std::size_t un = static_cast<std::size_t>(n);
  DeviceBuffer chunks(Backend::Cuda, table.size() * sizeof(ShardChunk));
  bytes_to_device(Backend::Cuda, chunks.data(), table.data(), table.size() * sizeof(ShardChunk));
  DeviceBuffer grads(Backend::Cuda, un * 2), params(Backend::Cuda, un * 2), master(Backend::Cuda, un * 4),
      m(Backend::Cuda, un * 2), v(Backend::Cuda, un * 2), scalars(Backend::Cuda, sizeof(StepScalars));
  // Every element starts equal: master 0x3F3F3F3F (0.747), grads bf16 0x3E3E (0.186),
  // moments 0; an index that wraps at 2^31 or 2^32 leaves high elements at their start
  // values or updates low ones twice, which the samples below see.
  SHARDOPT_CUDA_CHECK(cudaMemset(master.data(), 0x3F, un * 4));
  SHARDOPT_CUDA_CHECK(cudaMemset(grads.data(), 0x3E, un * 2));
  SHARDOPT_CUDA_CHECK(cudaMemset(m.data(), 0, un * 2));
  SHARDOPT_CUDA_CHECK(cudaMemset(v.data(), 0, un * 2));
  SHARDOPT_CUDA_CHECK(cudaMemset(params.data(), 0, un * 2));
  StepScalars s;
  s.lr = 1e-2f;
  bytes_to_device(Backend::Cuda, scalars.data(), &s, sizeof s);
  ShardPointers sp;
  sp.chunks = chunks.as<ShardChunk>();
  sp.num_chunks = static_cast<std::int64_t>(table.size());
  sp.shard_numel = n;
  sp.grads = grads.data();
  sp.params = params.data();
  sp.master = master.as<float>();
  sp.exp_avg = m.data();
  sp.exp_avg_sq = v.data();
  StepScalars* dsc = scalars.as<StepScalars>();
  for (int step = 0; step < 2; ++step) {
    fill_zero_async(Backend::Cuda, &dsc->grad_sumsq, 2 * sizeof(float), nullptr);
    accumulate_grad_sumsq(DType::bf16, sp, dsc, Backend::Cuda, nullptr);
    fused_adam_step(cfg, sp, dsc, Backend::Cuda, nullptr);
  }
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  StepScalars got;
  bytes_to_host(Backend::Cuda, &got, scalars.data(), sizeof got);
  EXPECT_EQ(got.step, 2);
  const double g0 = num::bf16_to_f32(0x3E3E);
  // 129 blocks see chunks here; each lane adds 8192 equal squares in fp32 (systematic
  // error up to ~8192 * 2^-25 = 2.4e-4 relative), then the trees: 2e-3 is a safe bound.
  EXPECT_NEAR(got.grad_sumsq, static_cast<double>(n) * g0 * g0, 2e-3 * static_cast<double>(n) * g0 * g0);
  EXPECT_EQ(got.nonfinite, 0.0f);

  // The expected element values per group: the host twin on a two-element shard.
  Array rg(DType::bf16, 2), rp(DType::bf16, 2), rm(DType::bf16, 2), rv(DType::bf16, 2);
  float rmaster[2];
  std::uint32_t bits = 0x3F3F3F3Fu;
  std::memcpy(&rmaster[0], &bits, 4);
  rmaster[1] = rmaster[0];
  rg.set(0, static_cast<float>(g0));
  rg.set(1, static_cast<float>(g0));
  const ShardChunk rchunks[2] = {ShardChunk{0, 0, 1, 0, 0}, ShardChunk{1, 1, 1, 1, 0}};
  ShardPointers rsp;
  rsp.chunks = rchunks;
  rsp.num_chunks = 2;
  rsp.shard_numel = 2;
  rsp.grads = rg.data();
  rsp.params = rp.data();
  rsp.master = rmaster;
  rsp.exp_avg = rm.data();
  rsp.exp_avg_sq = rv.data();
  StepScalars rs;
  rs.lr = 1e-2f;
  for (int step = 0; step < 2; ++step) fused_adam_step(cfg, rsp, &rs, Backend::Host, nullptr);

  // Samples: the first elements, around 2^31, the last ones, and a spread in between.
  std::vector<std::int64_t> where;
  for (std::int64_t i = 0; i < 16; ++i) where.push_back(i);
  for (std::int64_t i = split - 8; i < split + 8; ++i) where.push_back(i);
  for (std::int64_t i = n - 16; i < n; ++i) where.push_back(i);
  for (std::int64_t k = 1; k < 64; ++k) where.push_back(k * (n / 64) + 12345);
  for (std::int64_t i : where) {
    const ShardChunk* c = nullptr;
    for (const auto& t : table)
      if (i >= t.shard_offset && i < t.shard_offset + t.length) c = &t;
    ASSERT_NE(c, nullptr);
    const int g = c->group;
    float gm;
    std::uint16_t gp, gmm, gv;
    bytes_to_host(Backend::Cuda, &gm, master.as<float>() + i, 4);
    bytes_to_host(Backend::Cuda, &gp, static_cast<std::uint16_t*>(params.data()) + i, 2);
    bytes_to_host(Backend::Cuda, &gmm, static_cast<std::uint16_t*>(m.data()) + i, 2);
    bytes_to_host(Backend::Cuda, &gv, static_cast<std::uint16_t*>(v.data()) + i, 2);
    EXPECT_EQ(num::f32_bits(gm), num::f32_bits(rmaster[g])) << "master at " << i;
    EXPECT_EQ(gp, rp.bits(g)) << "param at " << i;
    EXPECT_EQ(gmm, rm.bits(g)) << "exp_avg at " << i;
    EXPECT_EQ(gv, rv.bits(g)) << "exp_avg_sq at " << i;
  }
}

}  // namespace
