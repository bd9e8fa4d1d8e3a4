// nvfp4_params_cases.hpp - the NVFP4-only cases of NVFP4 parameters inside
// DistributedAdam (issue 19): the store's per-bucket staged byte counts and the memory
// accounting. The format-generic cases (oracle, paths, state machine, grouped vs
// discrete, graph) are those of mxfp8_params_cases.hpp with ParamFormat::Nvfp4. Run on
// the host backend (test/mpi/test_nvfp4_params.cpp) and on GPUs
// (test/gpu/test_nvfp4_params_gpu.cpp).
#pragma once

#include <cstring>
#include <limits>
#include <map>

#include "common/mxfp8_params_cases.hpp"
#include "quantized/phase_probe.hpp"

namespace shardopt::test {

/// The format of the NVFP4 cases (short, for SHARDOPT_NVFP4_PARAMS_CASES).
inline constexpr ParamFormat kNvfp4 = ParamFormat::Nvfp4;

/// BucketStoreOptions::staged_gather_rank_bytes: each staged bucket all-gathers exactly
/// its own count of bytes per rank (rank r's piece at r * count), leaving the rest of
/// the region alone; a count that does not fit, or a list of the wrong length, is the
/// construction error.
inline void case_store_staged_rank_bytes(Backend b) {
  const int world = world_size();
  Communicator comm = make_comm(b);
  const Layout layout = staged_store_layout(world);
  ASSERT_EQ(layout.buffers().size(), 2u);
  const int staged_buffer = layout.buffers()[0].dtype == DType::bf16 ? 0 : 1;
  const int nb = static_cast<int>(layout.buckets().size());
  BucketStoreOptions o;
  o.grad_dtype = DType::bf16;
  o.nccl_registered = false;
  o.buffer_params = {true, true};  // (not assign(2, true): g++ 13 -Warray-bounds false positive in vector<bool>)
  o.buffer_params[static_cast<std::size_t>(staged_buffer)] = false;
  o.staged_gather_rank_bytes.assign(static_cast<std::size_t>(nb), 0);
  // A count of its own per bucket, no multiple of S: S / 2 + 1 + bucket index.
  for (int bk : layout.buffers()[static_cast<std::size_t>(staged_buffer)].buckets)
    o.staged_gather_rank_bytes[static_cast<std::size_t>(bk)] =
        layout.buckets()[static_cast<std::size_t>(bk)].range.size() / world / 2 + 1 + bk;
  BucketStore st(comm, layout, o);
  expect_staged_gathers(b, st, layout, staged_buffer,
                        [&](int bk) { return o.staged_gather_rank_bytes[static_cast<std::size_t>(bk)]; });
  const int first_staged = layout.buffers()[static_cast<std::size_t>(staged_buffer)].buckets.front();
  BucketStoreOptions big = o;
  big.staged_gather_rank_bytes[static_cast<std::size_t>(first_staged)] =
      layout.buckets()[static_cast<std::size_t>(first_staged)].range.size() / world * 2 + 1;
  expect_error(mx_error_of([&] { BucketStore bad(comm, layout, big); }), ErrorCode::InvalidArgument,
               "does not fit the bucket's gradient region");
  BucketStoreOptions miscount = o;
  miscount.staged_gather_rank_bytes.pop_back();
  expect_error(mx_error_of([&] { BucketStore bad(comm, layout, miscount); }), ErrorCode::InvalidArgument,
               "one entry per bucket");
}

/// NVFP4 parameters have no param buffer: MemoryReport::params counts the native (f32)
/// buffer only; MemoryReport::nvfp4 is, per member, ceil(numel / 2) data bytes, one scale
/// byte per 16 x 16 block and two fp32 (amax, decode scale), plus per bucket the u32
/// exchange buffers (one entry per block and one per member); each piece rounded up to
/// 16 bytes. With shapes whose sizes are multiples of 16 the data and scale pieces are
/// exact: numel / 2 + numel / 256 bytes.
inline void case_nvfp4_memory(Backend b) {
  const int world = world_size();
  auto piece = [](std::int64_t n) { return (n + 15) / 16 * 16; };
  for (DType g : {DType::bf16, DType::f32}) {
    for (bool round_shapes : {false, true}) {
      std::vector<ParamSpec> specs = q_model(ParamFormat::Nvfp4);
      if (round_shapes)
        specs = {ParamSpec::tensor("embed", {256, 128}), ParamSpec::tensor("norm", {128}, DType::bf16, "no_decay"),
                 ParamSpec::grouped("experts", 4, {64, 96}), ParamSpec::tensor("head", {256, 128})};
      DistributedAdamOptions o = mx_options(g, ParamFormat::Nvfp4);
      o.nccl_registered = false;
      DistributedAdam opt(make_comm(b), specs, o);
      const Layout& L = opt.layout();
      std::int64_t native_numel = 0, data_and_scales = 0, side = 0, exchange = 0, quantized_numel = 0;
      for (const auto& buf : L.buffers())
        if (buf.dtype == DType::f32) native_numel += buf.numel;
      for (int i = 0; i < opt.num_params(); ++i) {
        if (!opt.is_nvfp4(i)) continue;
        const Nvfp4View v = opt.nvfp4_param(i);
        const std::int64_t G = v.members;
        data_and_scales += piece(G * v.shape.data_bytes()) + piece(G * v.shape.scale_numel());
        side += 2 * piece(4 * G);  // amax and decode scale
        quantized_numel += G * v.shape.numel();
      }
      for (const Bucket& bk : L.buckets()) {
        std::int64_t e = 0;
        for (int p : bk.params)
          if (opt.is_nvfp4(p)) e += 4 * opt.nvfp4_param(p).members * opt.nvfp4_param(p).shape.amax_numel();
        exchange += piece(e);
      }
      const MemoryReport r = opt.memory();
      const std::int64_t n = L.total_numel();
      EXPECT_EQ(r.params, 4 * native_numel) << "no param allocation for the NVFP4 buffer";
      EXPECT_EQ(r.mxfp8, 0);
      EXPECT_EQ(r.nvfp4, data_and_scales + side + exchange);
      if (round_shapes) {
        EXPECT_EQ(data_and_scales, quantized_numel / 2 + quantized_numel / 256) << "half a byte per element + scales";
      }
      EXPECT_EQ(r.grads, static_cast<std::int64_t>(size_of(g)) * n);
      EXPECT_EQ(r.master, 4 * n / world);
      EXPECT_EQ(r.moments, 8 * n / world);
      EXPECT_EQ(r.total(), r.params + r.grads + r.master + r.moments + r.nvfp4 + r.nccl_overhead);
    }
  }
}

/// Counts the phase marks by name while alive (quantized/phase_probe.hpp).
struct MarkCounter {
  std::map<std::string, int> marks;
  MarkCounter() {
    detail::set_phase_probe(
        [](const char* phase, Stream, void* user) { ++static_cast<MarkCounter*>(user)->marks[phase]; }, this);
  }
  ~MarkCounter() { detail::set_phase_probe(nullptr, nullptr); }
  MarkCounter(const MarkCounter&) = delete;
  MarkCounter& operator=(const MarkCounter&) = delete;
  int take(const std::string& name) {
    const int n = marks[name];
    marks.clear();
    return n;
  }
};

/// Issue 29: the step's Adam emits the partial amaxes, so a step launches no amax pass
/// (no "amax" mark) while init_from_master and gather_params, whose master Adam did not
/// write, still run it; the storage equals the oracle after steps whose masters hold NaN,
/// +Inf, -Inf, -0 (a whole member), a subnormal and a finite value that rounds to bf16
/// Inf (refused tensors on whichever rank holds the element), and a found-inf step
/// requantizes the same bytes (Adam writes nothing and emits the unchanged master's
/// amaxes).
inline void case_nvfp4_step_emits_amaxes(Backend b) {
  auto bits = [](std::uint32_t u) {
    float f = 0;
    std::memcpy(&f, &u, 4);
    return f;
  };
  DistributedAdamOptions o = mx_options(DType::bf16, kNvfp4);
  o.gather_pipeline = 2;
  DistributedAdam opt(make_comm(b), q_model(kNvfp4), o);
  TestStream s(b);
  const int embed = opt.param_index("embed"), w1 = opt.param_index("w1"), w2 = opt.param_index("w2");
  const int odd = opt.param_index("odd_experts"), small = opt.param_index("small"), head = opt.param_index("head");
  write_master(opt, [&](int i, std::int64_t e) {
    const std::int64_t cols = opt.layout().specs()[static_cast<std::size_t>(i)].shape.back();
    if (i == odd && e < 45) return -0.0f;                        // member 0 all -0
    if (i == embed && e == 333) return bits(0x7F7F8000u);        // finite, rounds to bf16 Inf
    if (i == w1 && e == 17) return std::numeric_limits<float>::quiet_NaN();
    if (i == w2 && e == 1000) return std::numeric_limits<float>::infinity();
    if (i == small && e == 3) return -std::numeric_limits<float>::infinity();
    if (i == head && e == 5) return bits(0x00000003u);           // subnormal
    return mx_init_value(i, e, cols);
  });
  MarkCounter marks;
  opt.init_from_master(s.get());
  EXPECT_GT(marks.take("amax"), 0) << "init_from_master runs the amax pass";
  s.sync();
  expect_matches_oracle(opt, "after init");
  std::vector<QPlanes> before;
  for (int t = 0; t < 5; ++t) {
    const bool poison = t == 3;  // mx_backward poisons the 4th step
    if (poison) {
      s.sync();
      for (int i = 0; i < opt.num_params(); ++i)
        if (opt.is_nvfp4(i)) before.push_back(read_q(opt, i));
    }
    marks.take("amax");
    mx_backward(opt, b, s.get(), GradKind::Random, poison);
    opt.step(s.get());
    EXPECT_EQ(marks.take("amax"), 0) << "step " << t << " runs no amax pass";
    s.sync();
    expect_matches_oracle(opt, "after step " + std::to_string(t));
    if (poison) {
      std::size_t k = 0;
      for (int i = 0; i < opt.num_params(); ++i)
        if (opt.is_nvfp4(i)) {
          const QPlanes now = read_q(opt, i);
          EXPECT_TRUE(now == before[k]) << "found-inf step: " << opt.layout().specs()[static_cast<std::size_t>(i)].name
                                        << ": " << differing_planes(now, before[k]);
          ++k;
        }
    }
    opt.zero_grad(s.get());
  }
  EXPECT_EQ(read_nvfp4_member(opt, w1, 0).amax, 0x7FC00000u) << "a NaN master refuses w1 (its amax is the NaN flag)";
  opt.gather_params(s.get());
  EXPECT_GT(marks.take("amax"), 0) << "gather_params runs the amax pass";
  s.sync();
  expect_matches_oracle(opt, "after gather_params");
}

}  // namespace shardopt::test

/// Instantiates every NVFP4 parameter case (the generic ones with ParamFormat::Nvfp4) as
/// tests of suite `Suite` on backend `B`.
#define SHARDOPT_NVFP4_PARAMS_CASES(Suite, B) \
  TEST(Suite, StoreStagedGatherPerBucketBytes) { case_store_staged_rank_bytes(B); }                               \
  TEST(Suite, MatchesOracleBf16Grads) { case_mx_matches_oracle(B, DType::bf16, 1, 4, false, kNvfp4); }            \
  TEST(Suite, MatchesOracleF32GradsMicrobatches) { case_mx_matches_oracle(B, DType::f32, 2, 3, false, kNvfp4); }  \
  TEST(Suite, MatchesOracleF16Grads) { case_mx_matches_oracle(B, DType::f16, 1, 2, false, kNvfp4); }              \
  TEST(Suite, MatchesOracleOneRank) { case_mx_matches_oracle(B, DType::bf16, 2, 2, true, kNvfp4); }               \
  TEST(Suite, OneRankWritesStorageWithoutLanding) { case_one_rank_writes_storage(B, kNvfp4); }                    \
  TEST(Suite, MasterEqualsNativeF32Params) { case_mx_master_equals_native(B, kNvfp4); }                           \
  TEST(Suite, ZeroGradSkipsLandedRegions) { case_zero_grad_skips_landed(B, kNvfp4); }                             \
  TEST(Suite, TrainTrainWithoutZeroGrad) { case_mx_path(B, MxPath::TrainTrain, false, kNvfp4); }                  \
  TEST(Suite, TrainTrainWithZeroGrad) { case_mx_path(B, MxPath::TrainTrain, true, kNvfp4); }                      \
  TEST(Suite, TrainEvalTrainWithoutZeroGrad) { case_mx_path(B, MxPath::TrainEvalTrain, false, kNvfp4); }          \
  TEST(Suite, TrainEvalTrainWithZeroGrad) { case_mx_path(B, MxPath::TrainEvalTrain, true, kNvfp4); }              \
  TEST(Suite, ForcedGatherThenTrainWithoutZeroGrad) { case_mx_path(B, MxPath::ForcedGather, false, kNvfp4); }     \
  TEST(Suite, FoundInfStepInTheMiddle) { case_mx_path(B, MxPath::FoundInf, false, kNvfp4); }                      \
  TEST(Suite, DeferredForwardWaitsWithoutZeroGrad) { case_mx_path(B, MxPath::Deferred, false, kNvfp4); }          \
  TEST(Suite, DeferredEvalThenTrain) { case_mx_path(B, MxPath::DeferredEval, false, kNvfp4); }                    \
  TEST(Suite, DeferredZeroGradLandsFirstMixedModel) { case_mx_path(B, MxPath::DeferredZeroGrad, true, kNvfp4); }  \
  TEST(Suite, StateMachineRefusalsAndQueries) { case_mx_state_machine(B, kNvfp4); }                               \
  TEST(Suite, GroupedEqualsDiscreteMembers) { case_grouped_vs_discrete(B, 1, kNvfp4); }                           \
  TEST(Suite, GroupedEqualsDiscreteMembersMicrobatches) { case_grouped_vs_discrete(B, 2, kNvfp4); }               \
  TEST(Suite, MemoryHasNoParamBufferForNvfp4) { case_nvfp4_memory(B); }                                           \
  TEST(Suite, StepEmitsAmaxesWithoutAmaxPass) { case_nvfp4_step_emits_amaxes(B); }                                \
  TEST(Suite, GraphReplayEqualsEager) { case_mx_graph_equals_eager(B, 2, 6, false, false, kNvfp4); }              \
  TEST(Suite, OneGraphReplayEqualsEager) { case_mx_graph_equals_eager(B, 3, 5, true, false, kNvfp4); }            \
  TEST(Suite, GraphReplayEqualsEagerDeferred) { case_mx_graph_equals_eager(B, 2, 5, false, true, kNvfp4); }
