// test_documented_errors.cpp - local errors the public headers promise that no other unit
// test triggers with its code (docs/errors.md lists every promise and the test that proves
// it; test/tools/test_errors_table.py keeps the two in step). Host backend, one process.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "shardopt/shardopt.hpp"

namespace {
using namespace shardopt;
using shardopt::test::error_of;

/// Expects `f` to throw Error(code) with `part` in its message.
template <class F>
void expect_error(F&& f, ErrorCode code, const std::string& part) {
  const std::optional<Error> e = error_of(f);
  ASSERT_TRUE(e.has_value()) << "no error; expected " << to_string(code) << " with '" << part << "'";
  EXPECT_EQ(e->code(), code) << e->what();
  EXPECT_NE(std::string(e->what()).find(part), std::string::npos) << "'" << part << "' not in: " << e->what();
}

TEST(DocumentedErrors, ParseDtypeRefusesUnknownNames) {
  for (const char* name : {"float8", "", "F32", "bf32", "fp32 "}) {
    SCOPED_TRACE(name);
    expect_error([&] { (void)parse_dtype(name); }, ErrorCode::InvalidArgument, std::string("'") + name + "'");
  }
  EXPECT_EQ(parse_dtype("float16"), DType::f16);  // the aliases still parse
}

TEST(DocumentedErrors, SplitShardChunksRefusesANonPositiveMaxChunk) {
  const std::vector<ShardChunk> pieces{ShardChunk{0, 0, 10, 0, 0}};
  for (std::int64_t max_chunk : {std::int64_t{0}, std::int64_t{-4}}) {
    SCOPED_TRACE(max_chunk);
    expect_error([&] { (void)split_shard_chunks(pieces, max_chunk); }, ErrorCode::InvalidArgument, "max_chunk");
  }
  EXPECT_EQ(split_shard_chunks(pieces, 4).size(), 3u);  // 4 + 4 + 2
}

TEST(DocumentedErrors, ValidatedRefusesABadSpecNamingIt) {
  expect_error([] { (void)validated(ParamSpec::tensor("layers.0.w", {0, 4})); }, ErrorCode::InvalidArgument,
               "layers.0.w");
  expect_error([] { (void)validated(ParamSpec::tensor("layers.1.w", {4}, DType::u32)); }, ErrorCode::InvalidArgument,
               "layers.1.w");
  expect_error([] { (void)validated(ParamSpec::grouped("moe.w", 0, {4, 4})); }, ErrorCode::InvalidArgument, "moe.w");
  EXPECT_EQ(validated(ParamSpec::grouped("moe.w", 2, {4, 4})).shape, (Shape{2, 4, 4}));
}

TEST(DocumentedErrors, Mxfp8ShapesRefuseNonPositiveSizesAndBadSpecs) {
  expect_error([] { validate(Mxfp8Shape{1, 0, 8}); }, ErrorCode::InvalidArgument, "");
  expect_error([] { validate(Mxfp8Shape{0, 8, 8}); }, ErrorCode::InvalidArgument, "");
  expect_error([] { validate(Mxfp8Shape{1, 8, -32}); }, ErrorCode::InvalidArgument, "");
  EXPECT_NO_THROW(validate(Mxfp8Shape{1, 8, 8}));
  // A grouped 1-D member and a spec that fails validation (a bad spec).
  expect_error([] { (void)Mxfp8Shape::of(ParamSpec::grouped("moe.bias", 8, {64})); }, ErrorCode::InvalidArgument,
               "moe.bias");
  expect_error([] { (void)Mxfp8Shape::of(ParamSpec::tensor("w", {4, -8})); }, ErrorCode::InvalidArgument, "'w'");
}

TEST(DocumentedErrors, ReadScalarsIsRefusedWhileCapturing) {
  const std::vector<ParamSpec> specs{ParamSpec::tensor("w", {8, 4}, DType::f32)};
  DistributedAdam opt(Communicator::self(Backend::Host), specs);
  FsdpOptions fo;
  fo.param_dtype = DType::f32;
  Fsdp fsdp(Communicator::self(Backend::Host), specs, {FsdpUnit{"all", 0, 1}}, fo);
  HostStream s;
  s.begin_capture();
  expect_error([&] { (void)opt.read_scalars(s.handle()); }, ErrorCode::InvalidState, "read_scalars");
  expect_error([&] { (void)fsdp.read_scalars(s.handle()); }, ErrorCode::InvalidState, "read_scalars");
  (void)s.end_capture();
  EXPECT_EQ(opt.read_scalars(s.handle()).step, 0);  // outside the capture it reads
  EXPECT_EQ(fsdp.read_scalars(s.handle()).step, 0);
}

TEST(DocumentedErrors, Nvfp4ValidateRefusesATensorTooLargeToAddress) {
  expect_error([] { validate(Nvfp4Shape{std::int64_t{1} << 31, std::int64_t{1} << 31}); }, ErrorCode::InvalidArgument,
               "too many elements");
  EXPECT_NO_THROW(validate(Nvfp4Shape{std::int64_t{1} << 20, std::int64_t{1} << 20}));
}

TEST(DocumentedErrors, SetWatchdogRefusesATimeoutAboveAYear) {
  using std::chrono::hours;
  using std::chrono::milliseconds;
  const Communicator comm = Communicator::self(Backend::Host);
  comm.set_watchdog(WatchdogOptions{milliseconds(1000), milliseconds(2000)});
  const milliseconds past_a_year = hours(24 * 367);
  expect_error([&] { comm.set_watchdog(WatchdogOptions{past_a_year, milliseconds(0)}); }, ErrorCode::InvalidArgument,
               "at most a year");
  expect_error([&] { comm.set_watchdog(WatchdogOptions{milliseconds(0), past_a_year}); }, ErrorCode::InvalidArgument,
               "at most a year");
  EXPECT_EQ(comm.watchdog().wait_timeout, milliseconds(1000)) << "a refused value changed the deadlines";
  EXPECT_NO_THROW(comm.set_watchdog(WatchdogOptions{hours(24 * 365), hours(24 * 365)}));
}

// check_capturable itself (StepGraph::capture calls it; test_distributed_adam and test_fsdp
// prove the capture's refusal): a cast copy from shard_grad without persistent_grad_copies.
TEST(DocumentedErrors, CheckCapturableRefusesCastCopiesThatZeroGradFrees) {
  const std::vector<ParamSpec> specs{ParamSpec::tensor("w", {8, 4}, DType::f32)};
  HostStream s;
  DistributedAdamOptions o;
  o.grad_dtype = DType::f32;
  DistributedAdam opt(Communicator::self(Backend::Host), specs, o);
  opt.init_master(s.handle());
  EXPECT_NO_THROW(opt.check_capturable());
  (void)opt.shard_grad(0, DType::bf16, s.handle());  // a cast copy
  expect_error([&] { opt.check_capturable(); }, ErrorCode::CaptureRefused, "persistent_grad_copies");
  o.persistent_grad_copies = true;
  DistributedAdam kept(Communicator::self(Backend::Host), specs, o);
  kept.init_master(s.handle());
  (void)kept.shard_grad(0, DType::bf16, s.handle());
  EXPECT_NO_THROW(kept.check_capturable());
}

}  // namespace
