// Distributed Muon on the host backend under mpiexec (1, 2, 3 and 4 ranks): the step
// against a double-precision oracle, world-size independence (bitwise against a world of
// one), Fsdp equal to DistributedAdam, graph replay equal to eager, a skipped step,
// and the construction-time errors (issue 34, docs/muon.md).
#include "common/muon_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::muon;
constexpr Backend kB = Backend::Host;

// This rank's master pieces equal the matching parts of a world-of-one optimizer's whole
// masters, bitwise, for every parameter.
template <class Opt>
void expect_pieces_of_the_whole(Opt& opt, DistributedAdam& one) {
  for (int i = 0; i < opt.num_params(); ++i) {
    SCOPED_TRACE(opt.layout().specs()[static_cast<std::size_t>(i)].name);
    const ShardView v = opt.shard_master(i), w = one.shard_master(i);
    const auto mine = to_host<float>(kB, v.data, static_cast<std::size_t>(v.numel()));
    const auto whole = to_host<float>(kB, w.data, static_cast<std::size_t>(w.numel()));
    for (std::size_t j = 0; j < mine.size(); ++j)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(mine[j]),
                std::bit_cast<std::uint32_t>(whole[static_cast<std::size_t>(v.param_offset) + j]))
          << j;
  }
}

// Every rank's master pieces of a Muon parameter, after 3 steps, within the derived bound
// of a plain double Muon step on the whole matrix (per member for the experts). The AdamW
// parameters are not Muon's business here; the bound is shown not to be vacuous: the
// oracle with the other Nesterov setting, or with the other lr adjustment, lies outside it.
TEST(MuonHost, MatchesTheDoubleOracleWithinTheDerivedBound) {
  Communicator comm = make_comm(kB);
  TestStream s(kB);
  DistributedAdam opt(comm, model(), dist_options());
  opt.set_lr(kLr);
  init(opt, s.get());
  constexpr int kSteps = 3;
  for (int t = 0; t < kSteps; ++t) dist_step(opt, t, s.get());
  const DistributedAdamOptions o = dist_options();
  double worst_ratio = 0.0;
  for (int i : {1, 3, 4}) {
    const ParamSpec& spec = opt.layout().specs()[static_cast<std::size_t>(i)];
    SCOPED_TRACE(spec.name);
    const AdamGroup& grp = o.groups.at(spec.group);
    const Shape ms = spec.member_shapes.empty() ? spec.shape : spec.member_shapes[0];
    const std::int64_t rows = ms[0], cols = ms[1], mn = rows * cols;
    const ShardView v = opt.shard_master(i);
    const auto mine = to_host<float>(kB, v.data, static_cast<std::size_t>(v.numel()));
    double bound = 0.0;  // the largest member's running bound
    auto run_oracle = [&](const AdamGroup& g) {
      std::vector<double> full;
      bound = 0.0;
      for (int m = 0; m < spec.members(); ++m) {
        OracleMatrix om{rows, cols, std::vector<double>(static_cast<std::size_t>(mn)),
                        std::vector<double>(static_cast<std::size_t>(mn), 0.0)};
        for (std::int64_t j = 0; j < mn; ++j) om.p[static_cast<std::size_t>(j)] = value(-1, i, m * mn + j);
        for (int t = 0; t < kSteps; ++t) {
          std::vector<double> g2(static_cast<std::size_t>(mn));
          for (std::int64_t j = 0; j < mn; ++j) g2[static_cast<std::size_t>(j)] = value(t, i, m * mn + j);
          oracle_step(om, g2, g, static_cast<double>(kLr));
        }
        full.insert(full.end(), om.p.begin(), om.p.end());
        bound = std::max(bound, om.bound);
      }
      return full;
    };
    const std::vector<double> want = run_oracle(grp);
    // The same oracle with one setting changed: the bound must tell each apart.
    std::vector<AdamGroup> others(4, grp);
    others[0].muon.nesterov = !grp.muon.nesterov;
    others[1].muon.adjust_lr =
        grp.muon.adjust_lr == MuonLrAdjust::Original ? MuonLrAdjust::MatchRmsAdamW : MuonLrAdjust::Original;
    others[2].muon.weight_decay = 0.0;
    others[3].muon.momentum = grp.muon.momentum * 0.5;
    const char* what[] = {"the Nesterov setting", "the lr adjustment", "the weight decay", "the momentum"};
    std::vector<double> dist;
    for (const AdamGroup& other : others) {
      const std::vector<double> alt = run_oracle(other);
      double d = 0.0;
      for (std::size_t j = 0; j < want.size(); ++j) d = std::max(d, std::fabs(alt[j] - want[j]));
      dist.push_back(d);
    }
    (void)run_oracle(grp);  // the bound of the real settings
    double err = 0.0;
    for (std::size_t j = 0; j < mine.size(); ++j)
      err = std::max(err, std::fabs(mine[j] - want[static_cast<std::size_t>(v.param_offset) + j]));
    EXPECT_LE(err, bound);
    for (std::size_t a = 0; a < others.size(); ++a)
      EXPECT_GT(dist[a], 2.0 * bound) << "the bound cannot tell " << what[a] << " apart";
    if (world_rank() == 0)
      std::printf("%s: error %.3g, bound %.3g; other settings at %.3g %.3g %.3g %.3g\n", spec.name.c_str(), err,
                  bound, dist[0], dist[1], dist[2], dist[3]);
    worst_ratio = std::max(worst_ratio, err / bound);
    // The parameter slices hold the master rounded to bf16.
    const ParamView p = opt.param(i);
    const auto pb = to_host<std::uint16_t>(kB, p.data, static_cast<std::size_t>(p.numel()));
    for (std::size_t j = 0; j < mine.size(); ++j)
      ASSERT_EQ(pb[static_cast<std::size_t>(v.param_offset) + j], num::f32_to_bf16(mine[j])) << j;
  }
  if (world_rank() == 0) std::printf("Muon host twin: worst error / bound = %.3g\n", worst_ratio);
}

// The same steps on this world and on a world of one (every rank alone, given the reduced
// gradient): bitwise the same master and parameters. The home of a matrix changes with the
// world size but its update is computed the same way wherever it runs.
// bf16 gradients too (the pack reads the gradient dtype).
void world_size_case(DType grad_dtype) {
  Communicator comm = make_comm(kB);
  TestStream s(kB);
  DistributedAdamOptions o = dist_options();
  o.grad_dtype = grad_dtype;
  DistributedAdam opt(comm, model(), o);
  DistributedAdam one(Communicator::self(kB), model(), o);
  for (DistributedAdam* o : {&opt, &one}) {
    o->set_lr(kLr);
    init(*o, s.get());
  }
  for (int t = 0; t < 4; ++t) {
    dist_step(opt, t, s.get());
    dist_step(one, t, s.get(), /*every_rank=*/true);
  }
  expect_pieces_of_the_whole(opt, one);
  for (int i = 0; i < opt.num_params(); ++i) EXPECT_EQ(read_bytes(kB, opt.param(i)), read_bytes(kB, one.param(i)));
}
TEST(MuonHost, BitwiseIndependentOfTheWorldSize) { world_size_case(DType::f32); }
TEST(MuonHost, BitwiseIndependentOfTheWorldSizeWithBf16Gradients) { world_size_case(DType::bf16); }

// Fsdp runs the same Muon step: its master pieces equal a world-of-one DistributedAdam's, bitwise.
// With hybrid sharding (2 shard groups of 2 at 4 ranks) the exchange runs in the shard group.
void fsdp_case(int shard_group_size) {
  Communicator comm = make_comm(kB);
  TestStream s(kB);
  FsdpOptions fo = fsdp_options();
  fo.shard_group_size = shard_group_size;
  Fsdp f(comm, model(), units(), fo);
  DistributedAdam one(Communicator::self(kB), model(), dist_options());
  f.set_lr(kLr);
  one.set_lr(kLr);
  init(f, s.get());
  init(one, s.get());
  for (int t = 0; t < 3; ++t) {
    fsdp_step(f, t, s.get());
    dist_step(one, t, s.get(), /*every_rank=*/true);
  }
  expect_pieces_of_the_whole(f, one);
}
TEST(MuonHost, FsdpEqualsDistributedAdamBitwise) { fsdp_case(0); }
TEST(MuonHost, HsdpEqualsDistributedAdamBitwise) {
  if (world_size() != 4) GTEST_SKIP() << "HSDP 2 x 2 needs 4 ranks";
  fsdp_case(2);
}

// A step captured by StepGraph and replayed equals the eager steps bitwise. The gradients
// depend on the device step counter, read when the (recorded) work runs.
TEST(MuonHost, GraphReplayEqualsEagerBitwise) {
  Communicator comm = make_comm(kB);
  TestStream s(kB);
  DistributedAdam eager(comm, model(), dist_options());
  DistributedAdam graphed(comm, model(), dist_options());
  for (DistributedAdam* o : {&eager, &graphed}) {
    o->set_lr(kLr);
    init(*o, s.get());
  }
  StepGraph ge(eager, graph_microbatch(eager));
  StepGraph gg(graphed, graph_microbatch(graphed));
  for (int t = 0; t < 5; ++t) ge.run_eager(s.get());
  gg.capture(s.get());  // one warm-up iteration, then the capture
  for (int t = 0; t < 4; ++t) gg.replay(s.get());
  eager.synchronize(s.get());
  graphed.synchronize(s.get());
  EXPECT_EQ(eager.read_scalars(s.get()).step, 5);
  EXPECT_EQ(graphed.read_scalars(s.get()).step, 5);
  for (int i = 0; i < eager.num_params(); ++i) {
    SCOPED_TRACE(eager.layout().specs()[static_cast<std::size_t>(i)].name);
    EXPECT_EQ(read_bytes(kB, eager.shard_master(i)), read_bytes(kB, graphed.shard_master(i)));
    EXPECT_EQ(read_bytes(kB, eager.param(i)), read_bytes(kB, graphed.param(i)));
  }
}

// A step whose gradients hold a NaN changes nothing, Muon's momentum included: steps
// (g0, NaN, g1) end where (g0, g1) do, bitwise.
TEST(MuonHost, ANonFiniteGradientSkipsTheStepMomentumIncluded) {
  Communicator comm = make_comm(kB);
  TestStream s(kB);
  DistributedAdam a(comm, model(), dist_options());
  DistributedAdam b(comm, model(), dist_options());
  for (DistributedAdam* o : {&a, &b}) {
    o->set_lr(kLr);
    init(*o, s.get());
    dist_step(*o, 0, s.get());
  }
  {  // a NaN in one element of an expert's gradient on the last rank
    for (int i = 0; i < a.num_params(); ++i) {
      const GradView g = a.grad(i);
      auto v = grad_values(7, i, g.numel(), a.comm().rank() == 0);
      if (i == 4 && a.comm().rank() == a.comm().size() - 1) v[5] = std::numeric_limits<float>::quiet_NaN();
      from_host(kB, g.data, v);
    }
    a.step(s.get());
    a.zero_grad(s.get());
    EXPECT_NE(a.read_scalars(s.get()).found_inf, 0);
  }
  dist_step(a, 1, s.get());
  dist_step(b, 1, s.get());
  for (int i = 0; i < a.num_params(); ++i) {
    SCOPED_TRACE(a.layout().specs()[static_cast<std::size_t>(i)].name);
    EXPECT_EQ(read_bytes(kB, a.shard_master(i)), read_bytes(kB, b.shard_master(i)));
  }
}

// A Muon group may hold only matrices and grouped parameters of matrices: anything else is
// Error(InvalidArgument) on every rank at construction, naming the parameter.
TEST(MuonHost, ConstructionRefusesWhatMuonCannotUpdate) {
  Communicator comm = make_comm(kB);
  auto expect_refused = [&](std::vector<ParamSpec> specs, const std::string& name) {
    try {
      DistributedAdam opt(comm, std::move(specs), dist_options());
      ADD_FAILURE() << "no error for " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
    }
  };
  std::vector<ParamSpec> bias = model();
  bias.push_back(ParamSpec::tensor("bias", {16}, DType::bf16, "muon"));
  expect_refused(bias, "bias");
  std::vector<ParamSpec> conv = model();
  conv.push_back(ParamSpec::tensor("conv", {4, 3, 3}, DType::bf16, "muon_x"));
  expect_refused(conv, "conv");
  std::vector<ParamSpec> grouped_vectors = model();
  grouped_vectors.push_back(ParamSpec::grouped("scales", 2, {16}, DType::bf16, "muon"));
  expect_refused(grouped_vectors, "scales");
  // Fsdp checks the same way.
  try {
    Fsdp f(comm, bias, {{"all", 0, static_cast<int>(bias.size())}}, fsdp_options());
    ADD_FAILURE() << "no error from Fsdp";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'bias'"), std::string::npos) << e.what();
  }
}

// Ranks that pass other Muon settings fail together, naming the groups option.
TEST(MuonHost, RanksWithOtherMuonSettingsFailTogether) {
  Communicator comm = make_comm(kB);
  if (comm.size() == 1) GTEST_SKIP() << "needs two ranks";
  DistributedAdamOptions o = dist_options();
  if (comm.rank() == comm.size() - 1) o.groups["muon"].muon.ns_steps = 4;
  try {
    DistributedAdam opt(comm, model(), o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::LayoutMismatch);
    EXPECT_NE(std::string(e.what()).find("groups"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {
using namespace shardopt;
using namespace shardopt::test;
using namespace shardopt::test::muon;

// The momentum lives once, whole, at each matrix's home: over all ranks, the moments grow
// by 4 bytes per Muon matrix element (24x16 + 16x40 + 3 x 8x48) against the same model all
// in AdamW groups; the exchange and work buffers are counted under pool.
TEST(MuonHost, MemoryCountsTheMomentumOnceAtTheHomes) {
  Communicator comm = make_comm(Backend::Host);
  DistributedAdam muon(comm, model(), dist_options());
  DistributedAdamOptions adamw = dist_options();
  adamw.groups["muon"] = AdamGroup{};
  adamw.groups["muon_x"] = AdamGroup{};
  DistributedAdam plain(comm, model(), adamw);
  const MemoryReport a = muon.memory(), b = plain.memory();
  std::int64_t extra[2] = {a.moments - b.moments, a.pool - b.pool}, total[2] = {0, 0};
  MPI_Allreduce(extra, total, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(total[0], 4 * (24 * 16 + 16 * 40 + 3 * 8 * 48));
  EXPECT_GT(total[1], 0);
  EXPECT_EQ(a.master, b.master);
}

}  // namespace
