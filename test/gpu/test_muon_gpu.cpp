// Muon on GPUs (issue 34, docs/muon.md): the CUDA kernels and cuBLAS Newton-Schulz against
// a plain double Muon within the derived bounds (bf16 GEMMs, and the much tighter fp32-GEMM
// mode), equal shapes batched equal to one by one bitwise, a skipped step, and the
// distributed cases shared with the host suite (test/common/muon_cases.hpp) under mpirun:
// DistributedAdam and Fsdp at 1 and 2 GPUs, graph replay equal to eager.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/muon_cases.hpp"
#include "kernels/muon/muon.hpp"
#include "kernels/muon/muon_launch.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::muon;
constexpr Backend kB = Backend::Cuda;

using Shapes = std::vector<std::pair<std::int64_t, std::int64_t>>;

// The matrices of the kernel cases: both orientations (Newton-Schulz on the transpose when
// rows > cols), one and several elementwise tiles (16384 elements each), small and odd.
const Shapes kShapes = {{24, 16}, {16, 40}, {160, 200}, {300, 96}, {128, 128}};

struct Result {
  std::vector<float> g, m;  // the update and the momentum after the call
};

// The gradient and momentum of matrix `idx` (pseudo-random: well-spread singular values,
// see noise(); the momentum nonzero).
std::vector<float> start_grad(int idx, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) v[static_cast<std::size_t>(j)] = noise(2 * idx, j);
  return v;
}
std::vector<float> start_momentum(int idx, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) v[static_cast<std::size_t>(j)] = 0.5f * noise(2 * idx + 1, j);
  return v;
}

// One MuonUpdate call over matrices of these shapes on backend `b`.
std::vector<Result> run_update(Backend b, const Shapes& shapes, const MuonSettings& s, bool batch,
                               bool found_inf = false, kernels::MuonGemmPlan plan = {}) {
  std::vector<DeviceBuffer> gs, ms;
  std::vector<kernels::MuonMatrix> mats;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::int64_t n = shapes[i].first * shapes[i].second;
    gs.emplace_back(b, static_cast<std::size_t>(n) * sizeof(float));
    ms.emplace_back(b, static_cast<std::size_t>(n) * sizeof(float));
    from_host(b, gs.back().data(), start_grad(static_cast<int>(i), n));
    from_host(b, ms.back().data(), start_momentum(static_cast<int>(i), n));
    mats.push_back({gs.back().as<float>(), ms.back().as<float>(), shapes[i].first, shapes[i].second, s});
  }
  StepScalars sc;
  sc.found_inf = found_inf ? 1 : 0;
  DeviceBuffer scalars(b, sizeof(StepScalars));
  from_host(b, scalars.data(), std::vector<StepScalars>{sc});
  TestStream stream(b);
  kernels::MuonUpdate update(b, mats, batch, plan);
  if (b == Backend::Cuda && !batch) {
    EXPECT_EQ(update.groups(), static_cast<int>(shapes.size()));
  }
  update.run(scalars.as<StepScalars>(), stream.get());
  stream.sync();
  std::vector<Result> out;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto n = static_cast<std::size_t>(shapes[i].first * shapes[i].second);
    out.push_back({to_host<float>(b, gs[i].data(), n), to_host<float>(b, ms[i].data(), n)});
  }
  return out;
}

// The normalized Newton-Schulz input of matrix idx, in double (torch.optim.Muon's step).
std::vector<double> double_input(int idx, std::int64_t rows, std::int64_t cols, const MuonSettings& s) {
  const std::int64_t n = rows * cols;
  const std::vector<float> g = start_grad(idx, n), m0 = start_momentum(idx, n);
  std::vector<double> u(static_cast<std::size_t>(n));
  for (std::size_t j = 0; j < u.size(); ++j) {
    const double m = s.momentum * m0[j] + (1.0 - s.momentum) * g[j];
    u[j] = s.nesterov ? (1.0 - s.momentum) * g[j] + s.momentum * m : m;
  }
  const double norm = std::max(frob(u), s.eps);
  for (double& v : u) v /= norm;
  return u;
}

double frob_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (std::size_t j = 0; j < a.size(); ++j) sum += (a[j] - b[j]) * (a[j] - b[j]);
  return std::sqrt(sum);
}

// One update of each matrix against the double Muon within the bound of its GEMM mode
// (docs/muon.md, "The CUDA path's bounds"); the momentum equals the host twin's bitwise
// (the same element math). The bf16 bound is shown to mean something: at most a quarter of
// ||U||_F, and smaller than the change one Newton-Schulz iteration fewer makes; the fp32
// bound is at least 100 times tighter than the bf16 one.
void kernel_bound_case(MuonGemm gemm) {
  MuonSettings s;
  s.gemm = gemm;
  const std::vector<Result> gpu = run_update(kB, kShapes, s, true);
  const std::vector<Result> host = run_update(Backend::Host, kShapes, s, true);
  double worst = 0.0;
  for (std::size_t i = 0; i < kShapes.size(); ++i) {
    const auto [rows, cols] = kShapes[i];
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    EXPECT_EQ(gpu[i].m, host[i].m) << "the momentum is the host twin's element math";
    const std::vector<double> x = double_input(static_cast<int>(i), rows, cols, s);
    const std::vector<double> want = ns_double(x, rows, cols, s);
    const double err = frob_diff(gpu[i].g, want);
    const double bound_bf16 = update_error_bound_gemm(x, rows, cols, s, 1, true);
    const double bound_f32 = update_error_bound_gemm(x, rows, cols, s, 1, false);
    const double bound = gemm == MuonGemm::Bf16 ? bound_bf16 : bound_f32;
    EXPECT_LE(err, bound);
    EXPECT_LT(100.0 * bound_f32, bound_bf16);
    if (gemm == MuonGemm::Bf16) {
      EXPECT_LE(bound, 0.25 * frob(want));
      MuonSettings fewer = s;
      fewer.ns_steps = s.ns_steps - 1;
      const std::vector<double> alt = ns_double(x, rows, cols, fewer);
      double d = 0.0;
      for (std::size_t j = 0; j < alt.size(); ++j) d += (alt[j] - want[j]) * (alt[j] - want[j]);
      EXPECT_GT(std::sqrt(d), bound) << "the bound cannot tell a missing iteration apart";
    }
    std::printf("%lld x %lld (%s GEMMs): ||U - U_double|| %.3g, bound %.3g (ratio %.3g), ||U|| %.3g\n",
                static_cast<long long>(rows), static_cast<long long>(cols), to_string(gemm), err, bound, err / bound,
                frob(want));
    worst = std::max(worst, err / bound);
  }
  std::printf("Muon kernels (%s GEMMs): worst error / bound = %.3g\n", to_string(gemm), worst);
}

TEST(MuonGpu, Bf16GemmUpdateWithinTheDerivedBound) { kernel_bound_case(MuonGemm::Bf16); }
TEST(MuonGpu, F32GemmUpdateWithinTheTightBound) { kernel_bound_case(MuonGemm::F32); }

// Equal shapes in one strided batched GEMM per product equal each matrix alone (a batch
// of one): MoE experts of both orientations among other shapes. Bitwise with bf16 GEMMs
// (the default); with fp32 GEMMs cuBLAS computes a batch and a lone matrix with different
// kernels (seen on H100, 2026-11-27: differences of a few fp32 ulps), so there the two
// agree to 1e-5 of the largest element, far inside the fp32 mode's bound.
TEST(MuonGpu, BatchedEqualShapesEqualOneByOneBitwise) {
  const Shapes shapes = {{64, 256}, {256, 64}, {64, 256}, {128, 128}, {256, 64}, {64, 256},
                         {24, 16},  {256, 64}, {64, 256}, {256, 64}};
  for (MuonGemm gemm : {MuonGemm::Bf16, MuonGemm::F32}) {
    SCOPED_TRACE(to_string(gemm));
    MuonSettings s;
    s.gemm = gemm;
    const std::vector<Result> batched = run_update(kB, shapes, s, true);
    const std::vector<Result> single = run_update(kB, shapes, s, false);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      SCOPED_TRACE(i);
      if (gemm == MuonGemm::Bf16) {
        EXPECT_EQ(batched[i].g, single[i].g);
        EXPECT_EQ(batched[i].m, single[i].m);
        continue;
      }
      EXPECT_EQ(batched[i].m, single[i].m);  // the momentum is elementwise: bitwise in both modes
      ASSERT_EQ(batched[i].g.size(), single[i].g.size());
      float largest = 0.0f, worst = 0.0f;
      for (std::size_t k = 0; k < single[i].g.size(); ++k) {
        largest = std::max(largest, std::fabs(single[i].g[k]));
        worst = std::max(worst, std::fabs(batched[i].g[k] - single[i].g[k]));
      }
      EXPECT_LE(worst, 1e-5f * largest);
    }
  }
}

// The mirror of symmetric products (kernels::muon_mirror_cuda) against the rule written
// here: in each of `count` n x n column-major matrices, element (r, c) with r at or below
// the end of c's block column, min(n, (c / block + 1) * block), becomes (c, r); every other
// element, and the padding between matrices, keeps its bits. n is not a multiple of the
// block (a ragged last block column) nor of the kernel's 64-wide tiles; an even n (two
// elements per access) and an odd one (one), both widths. `filled` is worked by hand.
template <class T>
void mirror_case(bool f32, int n, int block, std::size_t filled_per_matrix) {
  SCOPED_TRACE(std::to_string(n) + " / " + std::to_string(block));
  constexpr int count = 3;
  const long long stride = 1LL * n * n + (n % 2 == 0 ? 64 : 63);
  std::vector<T> before(static_cast<std::size_t>(stride * count));
  for (std::size_t i = 0; i < before.size(); ++i) before[i] = static_cast<T>(i * 2654435761u >> 7);
  DeviceBuffer a(kB, before.size() * sizeof(T));
  from_host(kB, a.data(), before);
  TestStream stream(kB);
  kernels::muon_mirror_cuda(a.data(), n, block, stride, count, f32, stream.get());
  stream.sync();
  const std::vector<T> after = to_host<T>(kB, a.data(), before.size());
  std::size_t filled = 0, wrong = 0;
  for (int z = 0; z < count; ++z) {
    for (int c = 0; c < n; ++c) {
      const int c1 = std::min(n, (c / block + 1) * block);
      for (int r = 0; r < n; ++r) {
        const auto at = [&](int row, int col) { return static_cast<std::size_t>(z * stride + 1LL * col * n + row); };
        const T want = r >= c1 ? before[at(c, r)] : before[at(r, c)];
        filled += r >= c1 ? 1 : 0;
        wrong += after[at(r, c)] != want ? 1 : 0;
      }
    }
    for (long long p = 1LL * n * n; p < stride; ++p) wrong += after[z * stride + p] != before[z * stride + p] ? 1 : 0;
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(filled, count * filled_per_matrix);
}
// 700 / 256: 256 columns x 444 rows + 256 x 188 = 161792; 333 / 128: 128 x 205 + 128 x 77 = 36096.
TEST(MuonGpu, MirrorFillsTheLowerPartFromTheUpperBf16) {
  mirror_case<std::uint16_t>(false, 700, 256, 161792);
  mirror_case<std::uint16_t>(false, 333, 128, 36096);
}
TEST(MuonGpu, MirrorFillsTheLowerPartFromTheUpperF32) {
  mirror_case<std::uint32_t>(true, 700, 256, 161792);
  mirror_case<std::uint32_t>(true, 333, 128, 36096);
}

// Symmetric products by block columns (the default) against every product computed whole,
// on shapes whose n (the smaller side) takes 256- and 512-wide block columns, ragged ones
// included, in both orientations and a batch. The same inner products in the same order
// make both ways agree closely: to 1e-4 of ||U||_F with fp32 GEMMs, and to 5% with bf16 ones
// (whose roundings Newton-Schulz amplifies, docs/muon.md), while a wrong block or mirror
// gives an O(1) difference. Whether they agree bitwise is printed.
TEST(MuonGpu, SymmetricProductsAgreeWithDenseOnes) {
  EXPECT_EQ(kernels::muon_symmetric_block(400), 400);
  EXPECT_EQ(kernels::muon_symmetric_block(520), 256);
  EXPECT_EQ(kernels::muon_symmetric_block(1100), 512);
  const Shapes shapes = {{520, 600}, {600, 520}, {520, 600}, {1100, 1100}};
  for (MuonGemm gemm : {MuonGemm::Bf16, MuonGemm::F32}) {
    SCOPED_TRACE(to_string(gemm));
    MuonSettings s;
    s.gemm = gemm;
    const std::vector<Result> sym = run_update(kB, shapes, s, true, false, {});
    const std::vector<Result> dense = run_update(kB, shapes, s, true, false, {1 << 30});
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(sym[i].m, dense[i].m);
      double d = 0.0, u = 0.0;
      for (std::size_t k = 0; k < sym[i].g.size(); ++k) {
        d += (static_cast<double>(sym[i].g[k]) - dense[i].g[k]) * (static_cast<double>(sym[i].g[k]) - dense[i].g[k]);
        u += static_cast<double>(dense[i].g[k]) * dense[i].g[k];
      }
      const double rel = std::sqrt(d / u);
      EXPECT_LE(rel, gemm == MuonGemm::F32 ? 1e-4 : 5e-2);
      std::printf("%lld x %lld (%s GEMMs): ||U_sym - U_dense|| / ||U|| = %.3g%s\n",
                  static_cast<long long>(shapes[i].first), static_cast<long long>(shapes[i].second), to_string(gemm),
                  rel, sym[i].g == dense[i].g ? " (bitwise equal)" : "");
    }
  }
}

// The exchange's typed copies and the apply of a bf16 update (issue 48; at 2+ ranks on
// CUDA the gradients travel raw in their dtype and bf16 results travel as bf16): the CUDA
// kernels equal the host twins bitwise, and each copy is exact: bf16 gradients arrive as
// they left, fp32 values that bf16 represents come back unchanged, and applying a bf16
// update equals applying the same values in fp32. Runs of odd lengths over several tiles.
TEST(MuonGpu, TypedExchangeCopiesAndBf16ApplyEqualTheHostTwinsAndAreExact) {
  constexpr std::int64_t n = 3 * kernels::kMuonRunTile + 77;
  std::vector<std::uint16_t> grad(n);
  std::vector<float> exact(n), master(n);
  for (std::int64_t i = 0; i < n; ++i) {
    grad[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(0x3c00u + (i * 7919u) % 0x0800u);  // bf16 bits
    std::uint32_t bits = static_cast<std::uint32_t>(grad[static_cast<std::size_t>(i)] ^ 0x8000u) << 16;
    std::memcpy(&exact[static_cast<std::size_t>(i)], &bits, 4);  // a value bf16 represents
    master[static_cast<std::size_t>(i)] = 0.01f * noise(3, i);
  }
  StepScalars sc;
  sc.lr = 0.02f;
  struct Out {
    std::vector<std::uint16_t> sent, back;
    std::vector<float> applied_bf16, applied_f32;
  };
  const auto run = [&](Backend b) {
    DeviceBuffer g(b, n * 2), slot(b, n * 2), f(b, n * 4), back(b, n * 2), m1(b, n * 4), m2(b, n * 4), scalars(b, sizeof sc);
    from_host(b, g.data(), grad);
    from_host(b, f.data(), exact);
    from_host(b, m1.data(), master);
    from_host(b, m2.data(), master);
    from_host(b, scalars.data(), std::vector<StepScalars>{sc});
    TestStream stream(b);
    const kernels::MuonRuns<kernels::MuonCopy> copies(
        b, {{g.data(), DType::bf16, slot.data(), DType::bf16, n}, {f.data(), DType::f32, back.data(), DType::bf16, n}});
    kernels::MuonApply a;
    a.length = n;
    a.lr_ratio = 1.5;
    a.weight_decay = 0.1;
    kernels::MuonApply a_bf16 = a, a_f32 = a;
    a_bf16.u = back.data();
    a_bf16.u_dtype = DType::bf16;
    a_bf16.master = m1.as<float>();
    a_f32.u = f.data();
    a_f32.u_dtype = DType::f32;
    a_f32.master = m2.as<float>();
    const kernels::MuonRuns<kernels::MuonApply> applies(b, {a_bf16, a_f32});
    kernels::muon_copy(copies, b, stream.get());
    kernels::muon_apply(applies, scalars.as<StepScalars>(), b, stream.get());
    stream.sync();
    return Out{to_host<std::uint16_t>(b, slot.data(), n), to_host<std::uint16_t>(b, back.data(), n),
               to_host<float>(b, m1.data(), n), to_host<float>(b, m2.data(), n)};
  };
  const Out gpu = run(kB), host = run(Backend::Host);
  EXPECT_EQ(gpu.sent, grad);
  EXPECT_EQ(host.sent, grad);
  std::vector<std::uint16_t> exact_bits(n);
  for (std::int64_t i = 0; i < n; ++i) exact_bits[static_cast<std::size_t>(i)] = grad[static_cast<std::size_t>(i)] ^ 0x8000u;
  EXPECT_EQ(gpu.back, exact_bits);
  EXPECT_EQ(host.back, exact_bits);
  EXPECT_EQ(gpu.applied_bf16, gpu.applied_f32);
  EXPECT_EQ(gpu.applied_bf16, host.applied_bf16);
  EXPECT_NE(gpu.applied_bf16, master);  // the apply did something
}

// MuonUpdate::profile: one entry per stage and group, in launch order, named by the group;
// a group whose products take block columns has the mirror stage, a dense one not; no
// time negative and the whole positive. Error(InvalidArgument) for no runs.
TEST(MuonGpu, ProfileNamesEveryStageOfEveryGroup) {
  const Shapes shapes = {{520, 600}, {24, 16}};
  std::vector<DeviceBuffer> bufs;
  std::vector<kernels::MuonMatrix> mats;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto [r, c] = shapes[i];
    bufs.emplace_back(kB, static_cast<std::size_t>(2 * r * c) * sizeof(float));
    from_host(kB, bufs.back().data(), start_grad(static_cast<int>(i), 2 * r * c));
    mats.push_back({bufs.back().as<float>(), bufs.back().as<float>() + r * c, r, c, MuonSettings{}});
  }
  DeviceBuffer scalars(kB, sizeof(StepScalars));
  from_host(kB, scalars.data(), std::vector<StepScalars>{StepScalars{}});
  TestStream stream(kB);
  const kernels::MuonUpdate update(kB, mats);
  const std::vector<kernels::MuonStageTime> stages = update.profile(scalars.as<StepScalars>(), stream.get(), 2);
  const std::vector<std::string> want = {
      "1 x 520x600 bf16: momentum, Nesterov, norm", "1 x 520x600 bf16: X X^T", "1 x 520x600 bf16: mirror",
      "1 x 520x600 bf16: b A + c A A", "1 x 520x600 bf16: a X + B X", "1 x 520x600 bf16: copy back",
      "1 x 24x16 bf16: momentum, Nesterov, norm", "1 x 24x16 bf16: X X^T", "1 x 24x16 bf16: b A + c A A",
      "1 x 24x16 bf16: a X + B X", "1 x 24x16 bf16: copy back"};
  std::vector<std::string> got;
  double total = 0.0;
  for (const kernels::MuonStageTime& t : stages) {
    got.push_back(t.stage);
    EXPECT_GE(t.ms, 0.0) << t.stage;
    total += t.ms;
  }
  EXPECT_EQ(got, want);
  EXPECT_GT(total, 0.0);
  EXPECT_THROW((void)update.profile(scalars.as<StepScalars>(), stream.get(), 0), Error);
}

// Four groups of equal shape and settings form four GEMM groups, whatever their order.
TEST(MuonGpu, EqualShapesFormOneGroupEach) {
  const Shapes shapes = {{64, 256}, {256, 64}, {64, 256}, {128, 128}, {256, 64}, {24, 16}};
  std::vector<DeviceBuffer> bufs;
  std::vector<kernels::MuonMatrix> mats;
  for (const auto& [r, c] : shapes) {
    bufs.emplace_back(kB, static_cast<std::size_t>(2 * r * c) * sizeof(float));
    mats.push_back({bufs.back().as<float>(), bufs.back().as<float>() + r * c, r, c, MuonSettings{}});
  }
  EXPECT_EQ(kernels::MuonUpdate(kB, mats, true).groups(), 4);
  EXPECT_EQ(kernels::MuonUpdate(kB, mats, false).groups(), static_cast<int>(shapes.size()));
  mats[1].settings.gemm = MuonGemm::F32;  // another GEMM mode is another group
  EXPECT_EQ(kernels::MuonUpdate(kB, mats, true).groups(), 5);
}

// found_inf set: the update and the momentum stay as they were, bitwise.
TEST(MuonGpu, FoundInfChangesNothing) {
  MuonSettings s;
  const std::vector<Result> r = run_update(kB, kShapes, s, true, /*found_inf=*/true);
  for (std::size_t i = 0; i < kShapes.size(); ++i) {
    const std::int64_t n = kShapes[i].first * kShapes[i].second;
    EXPECT_EQ(r[i].g, start_grad(static_cast<int>(i), n));
    EXPECT_EQ(r[i].m, start_momentum(static_cast<int>(i), n));
  }
}

// ---------------------------------------------------------------- the optimizers (shared cases)

TEST(MuonGpu, DistributedAdamWithinTheBf16Bound) { case_matches_oracle(kB, MuonGemm::Bf16); }
TEST(MuonGpu, DistributedAdamF32GemmsWithinTheTightBound) { case_matches_oracle(kB, MuonGemm::F32); }
// Against a world of one: at 1 GPU the same homes (a check of the pack, exchange and
// apply); at 2 GPUs other homes, so other GEMM batches: bitwise as long as batched equals
// one by one (BatchedEqualShapesEqualOneByOneBitwise), which holds for the bf16 GEMMs only
// (the fp32 mode's results stay within its bound at each world size:
// DistributedAdamF32GemmsWithinTheTightBound).
TEST(MuonGpu, BitwiseIndependentOfTheWorldSize) { case_world_size(kB, DType::f32); }
TEST(MuonGpu, BitwiseIndependentOfTheWorldSizeWithBf16Gradients) { case_world_size(kB, DType::bf16); }
TEST(MuonGpu, FsdpEqualsDistributedAdamBitwise) { case_fsdp(kB, 0); }
TEST(MuonGpu, ANonFiniteGradientSkipsTheStepMomentumIncluded) { case_nonfinite_skips(kB); }
TEST(MuonGpu, AdamMomentsLeaveMuonParametersOut) { case_adam_moments_left_out(kB); }

// A StepGraph capture of the whole step (gradients written on the device from the step
// counter, the Muon exchange, cuBLAS Newton-Schulz, the Adam groups) replays bitwise like
// the eager steps.
void graph_case(MuonGemm gemm) {
  Communicator comm = make_comm(kB);
  const int rank = comm.rank();
  DistributedAdam eager(comm, model(), dist_options(gemm));
  DistributedAdam graphed(comm, model(), dist_options(gemm));
  TestStream se(kB), sg(kB);
  for (auto [opt, st] : {std::pair{&eager, se.get()}, std::pair{&graphed, sg.get()}}) {
    opt->set_lr(kLr);
    init(*opt, st);
  }
  StepGraph ge(eager, random_grads_fn(eager, kB, rank));
  StepGraph gg(graphed, random_grads_fn(graphed, kB, rank), StepGraphOptions{1});
  constexpr int kIterations = 6;
  gg.capture(sg.get());
  for (int it = 1; it < kIterations; ++it) gg.replay(sg.get());
  for (int it = 0; it < kIterations; ++it) ge.run_eager(se.get());
  se.sync();
  sg.sync();
  EXPECT_EQ(graphed.read_scalars(sg.get()).step, kIterations);
  expect_same_state(eager, graphed, se.get(), sg.get());
}
TEST(MuonGpu, GraphReplayEqualsEagerBitwise) { graph_case(MuonGemm::Bf16); }
TEST(MuonGpu, GraphReplayEqualsEagerBitwiseF32Gemms) { graph_case(MuonGemm::F32); }

}  // namespace
