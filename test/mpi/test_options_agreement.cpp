// Ranks that pass different options are refused at construction, on every rank, with an
// error that names the option and each rank's value (host backend under mpiexec, 2, 3 and
// 4 ranks): the last rank changes one option at a time. The variants cover exactly the
// fields the constructors compare (detail::distributed_adam_fields / fsdp_fields): a
// compared field without a variant, or a variant whose field is not compared, fails.
#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "common/fsdp_cases.hpp"
#include "optimizer/options_agreement.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

template <class Options>
struct Variant {
  std::string field;
  std::string other_value;  // how the last rank's value is printed
  std::function<void(Options&)> change;
};

/// Each variant changes its own field of the compared list, and only that one; and every
/// compared field has a variant. `fields_of` is the list the constructor compares.
template <class Options, class FieldsOf>
void expect_variants_cover_the_compared_fields(const Options& base, const std::vector<Variant<Options>>& variants,
                                               const FieldsOf& fields_of) {
  const std::vector<detail::OptionField> before = fields_of(base);
  std::set<std::string> compared, covered;
  for (const auto& f : before) compared.insert(f.first);
  for (const auto& v : variants) {
    SCOPED_TRACE(v.field);
    Options o = base;
    v.change(o);
    const std::vector<detail::OptionField> after = fields_of(o);
    ASSERT_EQ(after.size(), before.size());
    std::set<std::string> changed;
    for (std::size_t k = 0; k < before.size(); ++k) {
      ASSERT_EQ(after[k].first, before[k].first);
      if (after[k].second != before[k].second) changed.insert(after[k].first);
    }
    EXPECT_EQ(changed, std::set<std::string>{v.field}) << "the variant must change its field, and only it, "
                                                          "in the list the constructor compares";
    covered.insert(v.field);
  }
  for (const std::string& f : compared)
    EXPECT_TRUE(covered.count(f)) << "the compared option " << f << " has no variant here: add one";
  for (const std::string& f : covered) EXPECT_TRUE(compared.count(f)) << "the option " << f << " is not compared";
}

template <class Make>
void expect_refused_everywhere(const std::string& field, const std::string& other, const Make& make) {
  SCOPED_TRACE(field);
  std::optional<Error> e;
  try {
    make();
  } catch (const Error& err) {
    e = err;
  }
  ASSERT_TRUE(e.has_value()) << "construction with a different " << field << " on one rank did not fail";
  EXPECT_EQ(e->code(), ErrorCode::LayoutMismatch) << e->what();
  const std::string what = e->what();
  EXPECT_NE(what.find("ranks pass different " + field + " ("), std::string::npos) << what;
  EXPECT_NE(what.find("rank " + std::to_string(world_size() - 1) + ": " + other), std::string::npos) << what;
  EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
}

TEST(OptionsAgreementHost, DistributedAdamOptionsThatDifferAreNamed) {
  Communicator comm = make_comm(Backend::Host);
  const bool last = comm.rank() == comm.size() - 1;
  const std::vector<Variant<DistributedAdamOptions>> variants = {
      {"beta1", "0.91000000000000003", [](auto& o) { o.beta1 = 0.91; }},
      {"beta2", "0.995", [](auto& o) { o.beta2 = 0.995; }},
      {"eps", "9.9999999999999995e-07", [](auto& o) { o.eps = 1e-6; }},
      {"decoupled_weight_decay", "false", [](auto& o) { o.decoupled_weight_decay = false; }},
      {"default_group", "{weight_decay=0.01", [](auto& o) { o.default_group = AdamGroup{0.01, 1.0}; }},
      {"groups", "{decay{weight_decay=0.20000000000000001", [](auto& o) { o.groups["decay"] = AdamGroup{0.2, 1.0}; }},
      {"clip_max_norm", "2", [](auto& o) { o.clip_max_norm = 2.0f; }},
      {"moment_dtype", "bf16", [](auto& o) { o.moment_dtype = DType::bf16; }},
      {"master_storage", "bf16_remainder", [](auto& o) { o.master_storage = MasterStorage::bf16_remainder; }},
      {"lr_schedule", "constant(", [](auto& o) { o.lr_schedule = LrSchedule::constant(1e-3f); }},
      {"microbatches", "2", [](auto& o) { o.microbatches = 2; }},
      {"grad_dtype", "bf16", [](auto& o) { o.grad_dtype = DType::bf16; }},
      {"param_format", "Mxfp8", [](auto& o) { o.param_format = ParamFormat::Mxfp8; }},
      {"grad_reduce", "Sum", [](auto& o) { o.grad_reduce = ReduceOp::Sum; }},
      {"grad_reduce_precision", "F32Accumulate",
       [](auto& o) { o.grad_reduce_precision = GradReducePrecision::F32Accumulate; }},
      {"overlap_grad_reduce", "false", [](auto& o) { o.overlap_grad_reduce = false; }},
      {"grouped_collectives", "false", [](auto& o) { o.grouped_collectives = false; }},
      {"gather_pipeline", "2", [](auto& o) { o.gather_pipeline = 2; }},
      {"param_dtype", "bf16", [](auto& o) { o.param_dtype = DType::bf16; }},
      {"bucket_numel", "96", [](auto& o) { o.bucket_numel = 96; }},
      {"overlap_param_gather", "true", [](auto& o) { o.overlap_param_gather = true; }},
      {"nccl_registered", "false", [](auto& o) { o.nccl_registered = false; }},
      // An invalid value on one rank is a disagreement too: every rank fails, none hangs.
      {"beta1", "1.5", [](auto& o) { o.beta1 = 1.5; }},
  };
  expect_variants_cover_the_compared_fields(base_options(DType::f32), variants,
                                            [](const auto& o) { return detail::distributed_adam_fields(o); });
  for (const auto& v : variants) {
    DistributedAdamOptions o = base_options(DType::f32);
    if (last) v.change(o);
    expect_refused_everywhere(v.field, v.other_value, [&] { DistributedAdam opt(comm, small_model(), o); });
  }
  // The same options everywhere still construct.
  DistributedAdam ok(comm, small_model(), base_options(DType::f32));
  EXPECT_EQ(ok.num_params(), 7);
  // Rank-local options are not compared: memory (persistent_grad_copies) and the
  // watchdog's deadlines (they change when an error is raised, not what is computed).
  DistributedAdamOptions local = base_options(DType::f32);
  if (last) {
    local.persistent_grad_copies = true;
    local.watchdog = WatchdogOptions{std::chrono::milliseconds(60000), std::chrono::milliseconds(0)};
  }
  DistributedAdam differs_locally(comm, small_model(), local);
  EXPECT_EQ(comm.watchdog().wait_timeout.count(), last ? 60000 : 0);
}

TEST(OptionsAgreementHost, FsdpOptionsThatDifferAreNamed) {
  Communicator comm = make_comm(Backend::Host);
  const bool last = comm.rank() == comm.size() - 1;
  const std::vector<Variant<FsdpOptions>> variants = {
      {"beta2", "0.995", [](auto& o) { o.beta2 = 0.995; }},
      {"clip_max_norm", "2", [](auto& o) { o.clip_max_norm = 2.0f; }},
      {"slot_grad_dtype", "f32", [](auto& o) { o.slot_grad_dtype = DType::f32; }},
      {"grad_reduce_precision", "F32Accumulate",
       [](auto& o) { o.grad_reduce_precision = GradReducePrecision::F32Accumulate; }},
      {"prefetch", "false", [](auto& o) { o.prefetch = false; }},
      {"keep_last_unit", "false", [](auto& o) { o.keep_last_unit = false; }},
      {"shard_group_size", "1", [](auto& o) { o.shard_group_size = 1; }},
      {"param_format", "Mxfp8", [](auto& o) { o.param_format = ParamFormat::Mxfp8; }},
      {"param_dtype", "f32", [](auto& o) { o.param_dtype = DType::f32; }},
      {"grad_dtype", "f32", [](auto& o) { o.grad_dtype = DType::f32; }},
      {"grad_reduce", "Sum", [](auto& o) { o.grad_reduce = ReduceOp::Sum; }},
      {"bucket_numel", "96", [](auto& o) { o.bucket_numel = 96; }},
      // The AdamOptions fields, compared by the same code as DistributedAdam's.
      {"beta1", "0.91000000000000003", [](auto& o) { o.beta1 = 0.91; }},
      {"eps", "9.9999999999999995e-07", [](auto& o) { o.eps = 1e-6; }},
      {"decoupled_weight_decay", "false", [](auto& o) { o.decoupled_weight_decay = false; }},
      {"default_group", "{weight_decay=0.01", [](auto& o) { o.default_group = AdamGroup{0.01, 1.0}; }},
      {"groups", "{decay{weight_decay=0.20000000000000001", [](auto& o) { o.groups["decay"] = AdamGroup{0.2, 1.0}; }},
      {"moment_dtype", "bf16", [](auto& o) { o.moment_dtype = DType::bf16; }},
      {"master_storage", "bf16_remainder", [](auto& o) { o.master_storage = MasterStorage::bf16_remainder; }},
      {"lr_schedule", "constant(", [](auto& o) { o.lr_schedule = LrSchedule::constant(1e-3f); }},
      {"microbatches", "2", [](auto& o) { o.microbatches = 2; }},
  };
  expect_variants_cover_the_compared_fields(fsdp_options(base_options(DType::bf16)), variants,
                                            [](const auto& o) { return detail::fsdp_fields(o); });
  for (const auto& v : variants) {
    FsdpOptions o = fsdp_options(base_options(DType::bf16));
    if (last) v.change(o);
    expect_refused_everywhere(v.field, v.other_value, [&] { Fsdp f(comm, fsdp_model(), small_units(), o); });
  }
}

}  // namespace
