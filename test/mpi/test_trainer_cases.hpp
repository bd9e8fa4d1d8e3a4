// test_trainer_cases.hpp - the example trainer's end-to-end regression cases, written once
// and run on the host backend under mpiexec (test/mpi/test_trainer.cpp, CI) and on GPUs
// under mpirun (test/gpu/test_trainer_gpu.cpp, the device suite).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <shardopt/checkpoint.hpp>
#include <shardopt/mpi.hpp>
#include <shardopt/mxfp8.hpp>

#include "op_math.hpp"
#include "trainer.hpp"
#include "unit/test_nvfp4_reference.hpp"  // the oracles' decodes (test/ on the include path)

namespace trainer::test {

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline shardopt::Communicator make_comm(shardopt::Backend b) {
  shardopt::MpiBootstrapOptions o;
  o.backend = b;
  return shardopt::communicator_from_mpi(MPI_COMM_WORLD, o);
}

/// Options of the test runs: the tiny model (or `size`), quiet.
inline TrainOptions options(const std::string& size, const std::string& mode, int microbatches, int steps) {
  TrainOptions o = parse_options({"--size", size, "--mode", mode});
  o.microbatches = microbatches;
  o.steps = steps;
  o.quiet = true;
  return o;
}

/// Sanitizer-sized cases: SHARDOPT_SANITIZER_CASES=1 (set for the trainer's tests by the
/// -Db_sanitize build, CI's ASan/UBSan run: examples/trainer/meson.build). The learning
/// cases then run kSanitizerSteps steps (warm-up and cosine steps: the same code as 60) and
/// check that the loss fell, not the threshold, and graph-vs-eager comparisons stop after
/// kSanitizerGraphSteps steps (eager warm-up, capture, replays); CI's unsanitized run
/// checks the thresholds and the full comparisons at every rank count.
inline bool sanitizer_cases() {
  const char* v = std::getenv("SHARDOPT_SANITIZER_CASES");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}
inline constexpr int kSanitizerSteps = 12;
inline constexpr int kSanitizerGraphSteps = 4;
/// Steps before and after the checkpoint of a sanitizer-sized resume case (6 and 6
/// otherwise): enough for --graph's eager warm-up and capture on both sides.
inline constexpr int kSanitizerResumeSteps = 3;

/// Relative difference, 0 when both are 0.
inline double rel(double a, double b) {
  const double d = std::fabs(a - b), m = std::max(std::fabs(a), std::fabs(b));
  return m == 0.0 ? 0.0 : d / m;
}

/// The stated learning claim. Task: the next token is (a * token + 7) mod V of uniform
/// random tokens (a bijection): the cross-entropy floor is 0, a uniform guess scores
/// ln V (4.16 for V = 64). THRESHOLD: the tiny model (V=64, H=32, N=2, F=64, G=4,
/// Fe=32, T=64 tokens per microbatch per rank), 2 microbatches, AdamW peak lr 1e-2
/// (warm-up 6 steps, cosine to 1e-3), reaches a mean loss below 0.1 on the 60th step,
/// on any number of ranks (host backend: 0.024 / 0.019 / 0.017 on 1 / 2 / 4 ranks).
/// The same claim holds with --params mxfp8 (dist-adam: E4M3 weights decoded to bf16 for
/// the GEMMs, fp32 master; host backend: 0.024 / 0.019 / 0.016 on 1 / 2 / 4 ranks) and
/// with --params nvfp4 (E2M1 weights with 16 x 16 E4M3 block scales decoded to bf16;
/// host backend: 0.024 / 0.020 / 0.018 on 1 / 2 / 4 ranks), and with --mode fsdp --params
/// mxfp8 (each pass decodes the plane it gathered: rowwise forward, columnwise backward).
inline constexpr int kThresholdSteps = 60;
inline constexpr double kLossThreshold = 0.1;

/// Sanitizer-sized (sanitizer_cases()): kSanitizerSteps steps, and the loss must fall.
inline void case_loss_below_threshold(shardopt::Backend b, const std::string& mode, const std::string& experts,
                                      const std::string& grad_dtype, const std::string& params = "bf16") {
  const bool sized = sanitizer_cases();
  const int steps = sized ? kSanitizerSteps : kThresholdSteps;
  TrainOptions o = options("tiny", mode, 2, steps);
  o.experts = experts;
  o.grad_dtype = grad_dtype;
  o.params = params;
  Trainer t(o, make_comm(b));
  t.step();
  const StepStats first = t.stats();
  for (int s = 2; s <= steps; ++s) t.step();
  const StepStats last = t.stats();
  EXPECT_EQ(last.step, steps);
  EXPECT_GT(first.loss, 3.5) << "a fresh model guesses about uniformly (ln 64 = 4.16)";
  EXPECT_LT(last.loss, sized ? first.loss : kLossThreshold)
      << mode << " " << experts << " grads " << grad_dtype << " params " << params << " on " << world_size()
      << " ranks: loss " << first.loss << " -> " << last.loss << " after " << steps << " steps";
  EXPECT_FALSE(last.skipped);
}

/// The bit pattern of a double or float (bitwise comparisons of statistics).
template <class T>
inline std::vector<std::uint8_t> bits_of(const T& v) {
  std::vector<std::uint8_t> out(sizeof v);
  std::memcpy(out.data(), &v, sizeof v);
  return out;
}

/// This rank's piece of parameter i's fp32 master (dist-adam or fsdp), as bytes.
inline std::vector<std::uint8_t> master_bytes(Trainer& t, int i) {
  const shardopt::ShardView m = t.dist_adam() != nullptr ? t.dist_adam()->shard_master(i) : t.fsdp()->shard_master(i);
  std::vector<std::uint8_t> out(m.bytes());
  t.synchronize();
  if (!out.empty()) t.ops().download(out.data(), Tensor{m.data, Elem::f32, m.numel()});
  return out;
}

/// Runs two trainers (same options but the graph) step by step and compares, after every
/// step, the per-group gradient norms taken on the device from the gradient views before
/// the step, the losses and the global norm, bitwise (with `expect_equal`); at the end
/// every parameter (the full views with dist-adam, this rank's shard pieces with fsdp)
/// and this rank's fp32 master pieces, bitwise.
/// Returns the largest relative group-norm difference seen, per group. Sanitizer-sized
/// (sanitizer_cases()): at most kSanitizerGraphSteps steps.
inline std::array<double, kNormGroups> compare_graph_and_eager(shardopt::Backend b, const std::string& mode,
                                                              const std::string& experts, bool one_graph,
                                                              bool seed000, int steps, int microbatches,
                                                              bool expect_equal,
                                                              const std::string& params = "bf16") {
  if (sanitizer_cases()) steps = std::min(steps, kSanitizerGraphSteps);
  TrainOptions o = options("tiny", mode, microbatches, steps);
  o.experts = experts;
  o.params = params;
  TrainerTestHooks h;
  h.one_graph = one_graph;
  h.seed000_host_flag = seed000;
  TrainOptions og = o, oe = o;
  og.graph = true;
  oe.graph = false;
  Trainer graph(og, make_comm(b), h), eager(oe, make_comm(b), h);
  std::array<double, kNormGroups> worst{};
  for (int s = 1; s <= steps; ++s) {
    graph.step();
    const StepStats g = graph.stats();
    eager.step();
    const StepStats e = eager.stats();
    for (int k = 0; k < kNormGroups; ++k) {
      const double d = rel(g.group_norm[static_cast<std::size_t>(k)], e.group_norm[static_cast<std::size_t>(k)]);
      worst[static_cast<std::size_t>(k)] = std::max(worst[static_cast<std::size_t>(k)], d);
      if (expect_equal) {
        EXPECT_EQ(bits_of(g.group_norm[static_cast<std::size_t>(k)]), bits_of(e.group_norm[static_cast<std::size_t>(k)]))
            << "step " << s << " group " << to_string(static_cast<NormGroup>(k)) << ": graph "
                           << g.group_norm[static_cast<std::size_t>(k)] << " eager "
                           << e.group_norm[static_cast<std::size_t>(k)];
        EXPECT_GT(e.group_norm[static_cast<std::size_t>(k)], 0.0) << "group " << to_string(static_cast<NormGroup>(k));
      }
    }
    if (expect_equal) {
      EXPECT_EQ(bits_of(g.loss), bits_of(e.loss)) << "step " << s << ": graph " << g.loss << " eager " << e.loss;
      EXPECT_EQ(bits_of(g.grad_norm), bits_of(e.grad_norm))
          << "step " << s << ": graph " << g.grad_norm << " eager " << e.grad_norm;
      EXPECT_EQ(g.step, e.step);
    }
  }
  if (expect_equal) {
    for (int i = 0; i < graph.spec().num_params(); ++i) {
      SCOPED_TRACE(graph.spec().params()[static_cast<std::size_t>(i)].name);
      EXPECT_EQ(graph.param_bytes(i), eager.param_bytes(i));
      EXPECT_EQ(master_bytes(graph, i), master_bytes(eager, i));
    }
  }
  return worst;
}

/// Single (one grouped tensor per MoE weight) and discrete (G tensors) registrations train
/// identically, bitwise: losses every step and every parameter at the end. Clipping is off
/// (the global norm sums the gradient buffers in layout order, which the registration
/// changes, so a clip coefficient could differ in its last bit), and at most 2 ranks (a
/// sum of two values is the same in either order; with more ranks the reduce-scatter's
/// summation order depends on where an element falls in the layout).
inline void case_single_equals_discrete(shardopt::Backend b, const std::string& mode, const std::string& grad_dtype,
                                        bool graph, const std::string& params = "bf16") {
  TrainOptions o = options("tiny", mode, 2, 6);
  o.clip = 0.0f;
  o.grad_dtype = grad_dtype;
  o.graph = graph;
  o.params = params;
  TrainOptions os = o, od = o;
  os.experts = "single";
  od.experts = "discrete";
  Trainer ts(os, make_comm(b)), td(od, make_comm(b));
  for (int s = 1; s <= o.steps; ++s) {
    ts.step();
    const StepStats a = ts.stats();
    td.step();
    const StepStats d = td.stats();
    ASSERT_EQ(a.microbatch_loss.size(), d.microbatch_loss.size());
    for (std::size_t m = 0; m < a.microbatch_loss.size(); ++m)
      EXPECT_EQ(a.microbatch_loss[m], d.microbatch_loss[m]) << "step " << s << " microbatch " << m;
  }
  if (mode != "dist-adam") return;  // FSDP holds shard pieces, whose boundaries the registration moves
  const ModelSpec& ss = ts.spec();
  const ModelSpec& sd = td.spec();
  auto same = [&](int i, int member, int j, const std::string& what) {
    EXPECT_EQ(ts.param_bytes(i, member), td.param_bytes(j)) << what;
  };
  same(ss.embed(), -1, sd.embed(), "embed");
  same(ss.final_norm(), -1, sd.final_norm(), "final_norm");
  same(ss.head(), -1, sd.head(), "head");
  for (std::size_t l = 0; l < ss.blocks().size(); ++l) {
    const BlockParams& a = ss.blocks()[l];
    const BlockParams& d = sd.blocks()[l];
    same(a.norm1, -1, d.norm1, "norm1");
    same(a.up, -1, d.up, "up");
    same(a.down, -1, d.down, "down");
    same(a.norm2, -1, d.norm2, "norm2");
    same(a.router, -1, d.router, "router");
    for (int g = 0; g < ss.config().experts; ++g) {
      same(a.expert_up[0], g, d.expert_up[static_cast<std::size_t>(g)], "expert up " + std::to_string(g));
      same(a.expert_down[0], g, d.expert_down[static_cast<std::size_t>(g)], "expert down " + std::to_string(g));
    }
  }
}

// ---------------------------------------------------------------- MXFP8 parameters

/// The MXFP8 or NVFP4 parameters of a trainer (registration indices).
inline std::vector<int> mxfp8_params(const Trainer& t) {
  std::vector<int> out;
  for (int i = 0; i < t.spec().num_params(); ++i)
    if (t.dist_adam()->is_mxfp8(i) || t.dist_adam()->is_nvfp4(i)) out.push_back(i);
  return out;
}

/// `n` bytes at `src` in the trainer's device memory (synchronous).
inline std::vector<std::uint8_t> download_bytes(Trainer& t, const void* src, std::int64_t n) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n));
  const auto* p = static_cast<const std::uint8_t*>(src);
  // Whole bf16 elements (the trainer moves no byte tensors); an odd last byte is the
  // second of the two bytes that end at src + n.
  if (n >= 2) t.ops().download(out.data(), Tensor{const_cast<std::uint8_t*>(p), Elem::bf16, n / 2});
  if (n % 2 == 1 && n >= 2) {
    std::uint8_t two[2];
    t.ops().download(two, Tensor{const_cast<std::uint8_t*>(p + n - 2), Elem::bf16, 1});
    out.back() = two[1];
  }
  return out;
}

/// bf16 of the test oracle's f32 decode (test/unit's mxfp8_ref / nvfp4_ref, not the
/// library's dequantize) of parameter i's MXFP8 rowwise plane, or of its NVFP4 planes
/// member by member, as the optimizer holds them now.
inline std::vector<std::uint16_t> dequantized_bf16(Trainer& t, int i) {
  shardopt::DistributedAdam& opt = *t.dist_adam();
  t.synchronize();
  std::vector<std::uint16_t> out;
  if (opt.is_nvfp4(i)) {
    const shardopt::Nvfp4View v = opt.nvfp4_param(i);
    for (std::int64_t g = 0; g < v.members; ++g) {
      const shardopt::Nvfp4Planes m = v.member(g);
      nvfp4_ref::Quantized q;
      q.data = download_bytes(t, m.data, v.shape.data_bytes());
      q.scale = download_bytes(t, m.scale, v.shape.scale_numel());
      const auto decode = download_bytes(t, m.decode_scale, 4);
      std::memcpy(&q.decode_scale, decode.data(), 4);
      for (std::int64_t e = 0; e < v.shape.numel(); ++e)
        out.push_back(mxfp8_ref::to_bf16(nvfp4_ref::dequantize(q, v.shape.cols, e)));
    }
  } else {
    const shardopt::Mxfp8View v = opt.mxfp8_param(i);
    const auto data = download_bytes(t, v.planes.data_row, v.shape.numel());
    const auto scale = download_bytes(t, v.planes.scale_row, v.shape.scale_row_numel());
    for (std::int64_t g = 0; g < v.shape.members; ++g)
      for (std::int64_t r = 0; r < v.shape.rows; ++r)
        for (std::int64_t c = 0; c < v.shape.cols; ++c)
          out.push_back(mxfp8_ref::to_bf16(mxfp8_ref::dequantize(
              data[static_cast<std::size_t>(v.shape.element_index(g, r, c))],
              scale[static_cast<std::size_t>(v.shape.scale_row_index(g, r, c))])));
  }
  return out;
}

/// The bf16 weights the model's GEMMs read for parameter i (its compute buffer).
inline std::vector<std::uint16_t> compute_bits(Trainer& t, int i) {
  const Tensor c = t.model().compute_buffer(i);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(c.numel));
  t.synchronize();
  t.ops().download(out.data(), c);
  return out;
}

/// --params mxfp8: the bf16 weights the GEMMs read in an iteration are exactly the decoded
/// MXFP8 parameters that iteration started from -- bf16 of the oracle's decode of the
/// rowwise plane, bitwise -- on every step, so the compute buffers (refreshed on the first microbatch only,
/// by the device flag skip_weight_update) are never stale: not under graph replay (one
/// graph, or one microbatch graph replayed for microbatches 0..K-2), not after a step that
/// found an Inf and changed nothing (step 4: loss scale 1e-45, so the unscaled gradient
/// overflows), and not on the step after it. Also: the parameters do change every other
/// step (so a stale buffer would be seen), and every compute value is an E4M3 value times a
/// power of two (at most 4 significant bits: the GEMMs really read MXFP8 weights).
/// With params "nvfp4" the same, for bf16 of the oracle's decode of each member (no bit-count check:
/// an NVFP4 value is an E2M1 code times an E4M3 scale times the fp32 decode scale).
inline void case_mxfp8_compute_weights_are_current(shardopt::Backend b, const std::string& experts, bool graph,
                                                   bool one_graph, const std::string& params = "mxfp8") {
  constexpr int kSteps = 6, kSkippedStep = 4;
  TrainOptions o = options("tiny", "dist-adam", 3, kSteps);
  o.params = params;
  o.experts = experts;
  o.graph = graph;
  TrainerTestHooks h;
  h.one_graph = one_graph;
  Trainer t(o, make_comm(b), h);
  const std::vector<int> mx = mxfp8_params(t);
  // Every 2-D parameter is MXFP8, the 1-D ones (norm weights) are not.
  int two_d = 0;
  for (const ParamInfo& p : t.spec().params()) two_d += p.shape.size() >= 2;
  ASSERT_EQ(static_cast<int>(mx.size()), two_d);
  ASSERT_GT(two_d, 0);
  std::vector<std::vector<std::uint16_t>> before;
  for (int i : mx) before.push_back(dequantized_bf16(t, i));
  for (int s = 1; s <= kSteps; ++s) {
    t.dist_adam()->set_loss_scale(s == kSkippedStep ? 1e-45f : 1.0f);
    t.step();
    const StepStats st = t.stats();
    EXPECT_EQ(st.skipped, s == kSkippedStep) << "step " << s;
    EXPECT_EQ(st.step, s < kSkippedStep ? s : s - 1) << "a skipped step does not count";
    bool changed = false;
    for (std::size_t k = 0; k < mx.size(); ++k) {
      const int i = mx[k];
      const std::string name = t.spec().params()[static_cast<std::size_t>(i)].name;
      const std::vector<std::uint16_t> used = compute_bits(t, i);
      ASSERT_EQ(used, before[k]) << "step " << s << ": the compute buffer of '" << name
                                 << "' is not the decoded MXFP8 weight this iteration started from";
      for (std::uint16_t bits : used) {
        if (params == "mxfp8") {
          ASSERT_EQ(bits & 0x000Fu, 0u) << name << ": " << math::from_bf16(bits) << " is not an E4M3 value x 2^k";
        }
      }
      std::vector<std::uint16_t> after = dequantized_bf16(t, i);
      changed = changed || after != before[k];
      before[k] = std::move(after);
    }
    EXPECT_EQ(changed, s != kSkippedStep) << "step " << s << ": the MXFP8 parameters change exactly on the "
                                          << "applied steps";
  }
}

/// --params `params` (nvfp4) with --mode fsdp is refused with an error that says
/// `phrase` and what to use instead; dist-adam takes it.
inline void case_quantized_fsdp_refused(shardopt::Backend b, const std::string& params, const std::string& phrase) {
  TrainOptions o = options("tiny", "fsdp", 1, 1);
  o.params = params;
  try {
    Trainer t(o, make_comm(b));
    ADD_FAILURE() << "--params " << params << " --mode fsdp must be refused";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(phrase), std::string::npos) << what;
    EXPECT_NE(what.find("--mode dist-adam"), std::string::npos) << "it says what to use instead: " << what;
  }
  o.mode = "dist-adam";
  EXPECT_NO_THROW(check_supported(o)) << "dist-adam takes --params " << params;
}

// ---------------------------------------------------------------- checkpoints

/// A fresh directory every rank sees (rank 0 makes it under TMPDIR, all ranks learn its
/// name); removed by rank 0 at destruction, after every rank is done with it.
class SharedTempDir {
 public:
  SharedTempDir() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::array<char, 4096> name{};
    if (rank == 0) {
      const char* tmp = std::getenv("TMPDIR");
      std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/trainer-ckpt-XXXXXX";
      if (pattern.size() < name.size()) {
        std::copy(pattern.begin(), pattern.end(), name.begin());
        if (mkdtemp(name.data()) == nullptr) name[0] = '\0';
      }
    }
    MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name.data();
    owner_ = rank == 0;
  }
  ~SharedTempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    std::error_code ec;
    if (owner_ && !path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  const std::string& path() const noexcept { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
  bool owner_ = false;
};

/// Every parameter's bytes as this rank holds them (Trainer::param_bytes).
inline std::vector<std::vector<std::uint8_t>> all_param_bytes(const Trainer& t) {
  std::vector<std::vector<std::uint8_t>> out;
  for (int i = 0; i < t.spec().num_params(); ++i) out.push_back(t.param_bytes(i));
  return out;
}

/// The losses and parameters of `steps` more iterations of t.
struct RunResult {
  std::vector<double> loss;                   ///< the mean loss of each iteration
  std::vector<std::vector<double>> mb_loss;   ///< this rank's loss per microbatch, each iteration
  std::vector<std::int64_t> step;             ///< the step count after each iteration
  std::vector<std::vector<std::uint8_t>> params;  ///< at the end
};

inline RunResult train_more(Trainer& t, int steps) {
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    t.step();
    const StepStats st = t.stats();
    r.loss.push_back(st.loss);
    r.mb_loss.push_back(st.microbatch_loss);
    r.step.push_back(st.step);
  }
  r.params = all_param_bytes(t);
  return r;
}

/// Every MXFP8 parameter's compute buffer equals the decode of what the optimizer holds.
inline void expect_compute_buffers_current(Trainer& t, const std::string& what) {
  if (!t.mxfp8() && !t.nvfp4()) return;
  for (int i : mxfp8_params(t))
    EXPECT_EQ(compute_bits(t, i), dequantized_bf16(t, i))
        << what << ": the compute buffer of '" << t.spec().params()[static_cast<std::size_t>(i)].name
        << "' is stale after the load";
}

inline void expect_same_run(const RunResult& a, const RunResult& b, const Trainer& t, const std::string& what) {
  ASSERT_EQ(a.loss.size(), b.loss.size());
  for (std::size_t s = 0; s < a.loss.size(); ++s) {
    EXPECT_EQ(a.loss[s], b.loss[s]) << what << ": iteration " << s + 1 << " after the save";
    EXPECT_EQ(a.mb_loss[s], b.mb_loss[s]) << what << ": iteration " << s + 1 << " after the save";
    EXPECT_EQ(a.step[s], b.step[s]) << what;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (std::size_t i = 0; i < a.params.size(); ++i)
    EXPECT_EQ(a.params[i], b.params[i]) << what << ": parameter '" << t.spec().params()[i].name << "'";
}

/// Resume equals the uninterrupted run, bitwise: a trainer trained 6 steps, saved, trained
/// 6 more (the reference); a fresh Trainer of the same options that loads the checkpoint
/// gives the same parameter bytes right after the load (as the saving one held them), the
/// same losses (every microbatch, every rank) and step counts on each of the next 6
/// iterations and the same parameters at the end. With --graph on the fresh trainer
/// warms up eagerly and captures after the load, and the reference has replayed its graph
/// all along; then the reference itself loads the checkpoint into its captured graph
/// (in place, no recapture) and trains the 6 steps again, with the same result. MXFP8:
/// the compute buffers are current right after each load. Sanitizer-sized: 3 steps on
/// each side (kSanitizerResumeSteps).
inline void case_resume_equals_uninterrupted(shardopt::Backend b, const std::string& mode, const std::string& params,
                                             const std::string& experts, bool graph) {
  const int before = sanitizer_cases() ? kSanitizerResumeSteps : 6, after = before;
  TrainOptions o = options("tiny", mode, 2, before + after + 6);
  o.params = params;
  o.experts = experts;
  o.graph = graph;
  o.grad_dtype = mode == "fsdp" ? "bf16" : "fp32";
  const std::string what = mode + " --params " + params + " --experts " + experts + " --graph " + (graph ? "on" : "off") +
                           " on " + std::to_string(world_size()) + " rank(s)";
  SharedTempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp / "step-00006";
  Trainer a(o, make_comm(b));
  for (int s = 0; s < before; ++s) a.step();
  a.save(dir);
  const std::vector<std::vector<std::uint8_t>> saved = all_param_bytes(a);
  const RunResult reference = train_more(a, after);
  ASSERT_EQ(reference.step.back(), before + after);

  Trainer fresh(o, make_comm(b));
  const shardopt::CheckpointInfo info = fresh.load(dir);
  EXPECT_EQ(info.step, before);
  EXPECT_EQ(fresh.iterations(), before);
  EXPECT_EQ(info.user.at("trainer.seed"), std::to_string(o.seed));
  EXPECT_EQ(fresh.resume_differences(info), "") << what;
  EXPECT_EQ(fresh.stats().step, before);
  EXPECT_EQ(all_param_bytes(fresh), saved) << what << ": the loaded parameters";
  expect_compute_buffers_current(fresh, what + ", fresh trainer");
  expect_same_run(reference, train_more(fresh, after), a, what + ", fresh trainer");

  a.load(dir);  // into the trainer that trained on (its graph captured with --graph on)
  EXPECT_EQ(a.iterations(), before);
  EXPECT_EQ(all_param_bytes(a), saved) << what << ": loaded into the running trainer";
  expect_compute_buffers_current(a, what + ", running trainer");
  expect_same_run(reference, train_more(a, after), a, what + ", loaded into the running trainer");
}

/// A checkpoint of one expert registration loads into the other (--experts single: one
/// grouped tensor per MoE weight whose members are named like the discrete tensors,
/// ParamSpec::member_names): right after the load the parameters are the same bytes
/// (dist-adam; FSDP holds shard pieces whose boundaries the registration moves), and the
/// next iteration's loss is the same, bitwise, on every microbatch and rank. Bitwise at any
/// rank count and with clipping on: that loss is the forward of the loaded parameters on
/// the same batch (same seed, rank and step), before any gradient reduction, and both
/// registrations issue the same forward ops (case_single_equals_discrete).
inline void case_checkpoint_across_expert_layouts(shardopt::Backend b, const std::string& mode,
                                                  const std::string& params, bool graph, const std::string& from,
                                                  const std::string& to) {
  TrainOptions o = options("tiny", mode, 2, 12);
  o.params = params;
  o.graph = graph;
  TrainOptions of = o, ot = o;
  of.experts = from;
  ot.experts = to;
  const std::string what = "--experts " + from + " -> " + to + ", " + mode + " --params " + params;
  SharedTempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp / "ckpt";
  Trainer src(of, make_comm(b));
  for (int s = 0; s < 6; ++s) src.step();
  src.save(dir);
  Trainer dst(ot, make_comm(b));
  const shardopt::CheckpointInfo info = dst.load(dir);
  EXPECT_EQ(info.step, 6);
  EXPECT_EQ(info.user.at("trainer.experts"), from);
  expect_compute_buffers_current(dst, what);
  if (mode == "dist-adam") {
    const Trainer& single = from == "single" ? src : dst;
    const Trainer& discrete = from == "single" ? dst : src;
    for (std::size_t l = 0; l < single.spec().blocks().size(); ++l) {
      const BlockParams& s = single.spec().blocks()[l];
      const BlockParams& d = discrete.spec().blocks()[l];
      for (int g = 0; g < single.spec().config().experts; ++g) {
        EXPECT_EQ(single.param_bytes(s.expert_up[0], g), discrete.param_bytes(d.expert_up[static_cast<std::size_t>(g)]))
            << what << ": layer " << l << " expert " << g << " up";
        EXPECT_EQ(single.param_bytes(s.expert_down[0], g),
                  discrete.param_bytes(d.expert_down[static_cast<std::size_t>(g)]))
            << what << ": layer " << l << " expert " << g << " down";
      }
    }
    EXPECT_EQ(single.param_bytes(single.spec().head()), discrete.param_bytes(discrete.spec().head())) << what;
  }
  src.step();
  dst.step();
  const StepStats a = src.stats(), d = dst.stats();
  EXPECT_EQ(a.step, 7);
  EXPECT_EQ(d.step, 7);
  EXPECT_EQ(a.microbatch_loss, d.microbatch_loss) << what;
  EXPECT_EQ(a.loss, d.loss) << what;
}

}  // namespace trainer::test

/// Instantiates the --params nvfp4 cases (dist-adam) as tests of suite `Suite` on backend
/// `B`: the MXFP8 cases' claims for NVFP4 weights.
#define SHARDOPT_TRAINER_NVFP4_CASES(Suite, B) \
  TEST(Suite, LossBelowThresholdNvfp4) { case_loss_below_threshold(B, "dist-adam", "single", "fp32", "nvfp4"); }  \
  TEST(Suite, LossBelowThresholdNvfp4DiscreteBf16Grads) {                                                         \
    case_loss_below_threshold(B, "dist-adam", "discrete", "bf16", "nvfp4");                                       \
  }                                                                                                               \
  TEST(Suite, GraphEqualsEagerNvfp4OneGraph) {                                                                    \
    compare_graph_and_eager(B, "dist-adam", "single", /*one_graph=*/true, false, 10, 4, true, "nvfp4");           \
  }                                                                                                               \
  TEST(Suite, GraphEqualsEagerNvfp4SplitGraphsDiscrete) {                                                         \
    compare_graph_and_eager(B, "dist-adam", "discrete", /*one_graph=*/false, false, 10, 4, true, "nvfp4");        \
  }                                                                                                               \
  TEST(Suite, SingleEqualsDiscreteNvfp4) {                                                                        \
    if (world_size() > 2) GTEST_SKIP() << "bitwise only where the reduction order cannot differ (<= 2 ranks)";    \
    case_single_equals_discrete(B, "dist-adam", "fp32", true, "nvfp4");                                           \
    case_single_equals_discrete(B, "dist-adam", "bf16", false, "nvfp4");                                          \
  }                                                                                                               \
  TEST(Suite, Nvfp4ComputeWeightsAreCurrent) {                                                                    \
    case_mxfp8_compute_weights_are_current(B, "single", /*graph=*/true, /*one_graph=*/true, "nvfp4");             \
    case_mxfp8_compute_weights_are_current(B, "discrete", /*graph=*/true, /*one_graph=*/false, "nvfp4");          \
    case_mxfp8_compute_weights_are_current(B, "discrete", /*graph=*/false, /*one_graph=*/true, "nvfp4");          \
  }                                                                                                               \
  TEST(Suite, ResumeEqualsUninterruptedNvfp4) {                                                                   \
    case_resume_equals_uninterrupted(B, "dist-adam", "nvfp4", "discrete", /*graph=*/false);                       \
    case_resume_equals_uninterrupted(B, "dist-adam", "nvfp4", "single", /*graph=*/true);                          \
  }
