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

TEST(MuonHost, MatchesTheDoubleOracleWithinTheDerivedBound) { case_matches_oracle(kB, MuonGemm::Bf16); }

TEST(MuonHost, BitwiseIndependentOfTheWorldSize) { case_world_size(kB, DType::f32); }
TEST(MuonHost, BitwiseIndependentOfTheWorldSizeWithBf16Gradients) { case_world_size(kB, DType::bf16); }

TEST(MuonHost, FsdpEqualsDistributedAdamBitwise) { case_fsdp(kB, 0); }
TEST(MuonHost, HsdpEqualsDistributedAdamBitwise) {
  if (world_size() != 4) GTEST_SKIP() << "HSDP 2 x 2 needs 4 ranks";
  case_fsdp(kB, 2);
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

// A step whose gradients hold a NaN changes nothing, Muon's momentum included.
TEST(MuonHost, ANonFiniteGradientSkipsTheStepMomentumIncluded) { case_nonfinite_skips(kB); }

// Adam's moments leave the Muon parameters out: the memory saved, AdamW results unchanged.
TEST(MuonHost, AdamMomentsLeaveMuonParametersOut) { case_adam_moments_left_out(kB); }

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

// A parameter of a Muon group stored as MXFP8 or NVFP4 (whose master is its only
// full-precision copy) is Error(Unsupported) on every rank at construction, naming it.
TEST(MuonHost, QuantizedParametersInAMuonGroupAreRefused) {
  Communicator comm = make_comm(kB);
  for (const ParamFormat format : {ParamFormat::Mxfp8, ParamFormat::Nvfp4}) {
    SCOPED_TRACE(static_cast<int>(format));
    DistributedAdamOptions o = dist_options();
    o.param_format = format;
    try {
      DistributedAdam opt(comm,
                          {ParamSpec::tensor("proj", {64, 64}, DType::bf16, "muon"),
                           ParamSpec::tensor("gate", {64, 64}, DType::bf16, "muon_x"),
                           ParamSpec::tensor("norm", {64}, DType::bf16, "adam")},
                          o);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::Unsupported);
      EXPECT_NE(std::string(e.what()).find("'proj'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("native parameters only"), std::string::npos) << e.what();
    }
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
// in AdamW groups, and shrink by the Adam moments the Muon pieces do not get; the exchange
// and work buffers are counted under pool.
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
  // Muon's momentum (fp32, once per matrix) less the Adam moments the Muon pieces no longer
  // have (2 x fp32 per element, each run of them on a rank rounded down to 16).
  std::int64_t saved = muon_elements_and_saving(muon.layout(), comm.rank(), dist_options()).second, all_saved = 0;
  MPI_Allreduce(&saved, &all_saved, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(total[0], 4 * (24 * 16 + 16 * 40 + 3 * 8 * 48) - 2 * 4 * all_saved);
  EXPECT_GT(total[1], 0);
  EXPECT_EQ(a.master, b.master);
}

}  // namespace
