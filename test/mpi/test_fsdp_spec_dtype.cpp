// Fsdp refuses a ParamSpec whose dtype differs from FsdpOptions::param_dtype (issue 30:
// the option used to win without a word), on every rank, with an error that names the
// parameter, both dtypes and the option (host backend under mpiexec, 1 and 2 ranks).
#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "common/fsdp_mxfp8_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
constexpr Backend kB = Backend::Host;

/// Constructing `Fsdp(comm, specs, units, o)` throws Error(InvalidArgument) whose text
/// holds every piece of `parts`.
void expect_refused(const Communicator& comm, const std::vector<ParamSpec>& specs, const std::vector<FsdpUnit>& units,
                    const FsdpOptions& o, const std::vector<std::string>& parts) {
  const std::optional<Error> e = error_of([&] { Fsdp f(comm, specs, units, o); });
  ASSERT_TRUE(e.has_value()) << "Fsdp took a spec dtype that differs from FsdpOptions::param_dtype";
  EXPECT_EQ(e->code(), ErrorCode::InvalidArgument) << e->what();
  for (const std::string& p : parts) EXPECT_NE(std::string(e->what()).find(p), std::string::npos) << p << ": " << e->what();
}

TEST(FsdpSpecDtypeHost, SpecDtypeOtherThanParamDtypeIsRefused) {
  Communicator comm = make_comm(kB);
  FsdpOptions o = fsdp_options(base_options(DType::bf16));
  o.param_dtype = DType::f32;  // fsdp_model() says bf16 everywhere
  expect_refused(comm, fsdp_model(), small_units(), o,
                 {"ParamSpec 'embed' (parameter 0)", "has dtype bf16", "FsdpOptions::param_dtype is f32",
                  "set FsdpOptions::param_dtype = bf16", "give the spec dtype f32"});
  // The other way round, and one spec among matching ones.
  auto specs = fsdp_model(DType::f32);
  specs[3].dtype = DType::f16;
  expect_refused(comm, specs, small_units(), o,
                 {"ParamSpec '" + specs[3].name + "' (parameter 3)", "has dtype f16", "param_dtype is f32"});
  // The communicator is still usable: a matching set constructs, stored in the spec dtype.
  Fsdp f(comm, fsdp_model(DType::f32), small_units(), o);
  for (int i = 0; i < f.num_params(); ++i) EXPECT_EQ(f.shard_param(i).dtype, DType::f32);
}

TEST(FsdpSpecDtypeHost, OneRanksMismatchIsRefusedOnEveryRank) {
  Communicator comm = make_comm(kB);
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const FsdpOptions o = fsdp_options(base_options(DType::bf16));  // param_dtype bf16
  auto specs = fsdp_model();
  const int last = comm.size() - 1;
  if (comm.rank() == last) specs[2].dtype = DType::f16;
  std::vector<std::string> parts = {"ParamSpec '" + specs[2].name + "' (parameter 2", "has dtype f16",
                                    "FsdpOptions::param_dtype is bf16"};
  if (comm.rank() != last) parts.push_back("on rank " + std::to_string(last));
  expect_refused(comm, specs, small_units(), o, parts);
  Fsdp f(comm, fsdp_model(), small_units(), o);  // every rank is past the refusal together
  EXPECT_EQ(f.shard_param(0).dtype, DType::bf16);
}

TEST(FsdpSpecDtypeHost, Mxfp8ChecksTheParametersItDoesNotQuantize) {
  Communicator comm = make_comm(kB);
  FsdpOptions o = fsdp_mx_options(mx_options());  // param_dtype bf16
  auto specs = mx_model();
  for (auto& s : specs)
    if (s.shape.size() >= 2) s.dtype = DType::f32;  // quantized to MXFP8: the spec dtype is the model's
  { Fsdp f(comm, specs, mx_units(), o); }
  specs[1].dtype = DType::f16;  // norm1, 1-D: stored in param_dtype
  expect_refused(comm, specs, mx_units(), o,
                 {"ParamSpec 'norm1' (parameter 1)", "has dtype f16", "FsdpOptions::param_dtype is bf16",
                  "parameter it does not quantize"});
}

}  // namespace
