// shardopt::Error and the check macros: code, message, failing call, file and line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "common/error_of.hpp"
#include "core/check.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"

namespace {
using namespace shardopt;

TEST(Errors, RequireCarriesCodeMessageAndPlace) {
  try {
    SHARDOPT_REQUIRE(1 + 1 == 3, ErrorCode::InvalidArgument, "arithmetic is broken; fix the universe");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("invalid_argument"), std::string::npos);
    EXPECT_NE(m.find("fix the universe"), std::string::npos);
    EXPECT_NE(m.find("test_errors.cpp:"), std::string::npos);
  }
}

// SHARDOPT_BACKEND: "cuda" without a usable device is Error(Unsupported); a value that
// is not a backend is Error(InvalidArgument) (shardopt/backend.hpp).
class BackendEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("SHARDOPT_BACKEND")) saved_ = v;
  }
  void TearDown() override {
    if (saved_) setenv("SHARDOPT_BACKEND", saved_->c_str(), 1);
    else unsetenv("SHARDOPT_BACKEND");
  }
  std::optional<std::string> saved_;
};

TEST_F(BackendEnv, CudaWithoutADeviceIsUnsupported) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is usable here";
  setenv("SHARDOPT_BACKEND", "cuda", 1);
  const std::optional<Error> e = test::error_of([] { (void)default_backend(); });
  ASSERT_TRUE(e.has_value()) << "SHARDOPT_BACKEND=cuda without a device did not throw";
  EXPECT_EQ(e->code(), ErrorCode::Unsupported) << e->what();
  EXPECT_NE(std::string(e->what()).find("SHARDOPT_BACKEND=host"), std::string::npos) << e->what();
}

TEST_F(BackendEnv, UnknownBackendIsInvalidArgument) {
  setenv("SHARDOPT_BACKEND", "tpu", 1);
  const std::optional<Error> e = test::error_of([] { (void)default_backend(); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidArgument) << e->what();
  setenv("SHARDOPT_BACKEND", "host", 1);
  EXPECT_EQ(default_backend(), Backend::Host);
}

// Without NCCL, UniqueId::create and Communicator::from_unique_id are Error(Unsupported)
// (shardopt/communicator.hpp).
TEST(Errors, UniqueIdWithoutNcclIsUnsupported) {
  if (nccl_compiled()) GTEST_SKIP() << "this build has NCCL";
  const std::optional<Error> c = test::error_of([] { (void)UniqueId::create(); });
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->code(), ErrorCode::Unsupported) << c->what();
  UniqueId id;
  id.bytes[0] = 1;  // not empty
  const std::optional<Error> f = test::error_of([&] { (void)Communicator::from_unique_id(id, 0, 1, 0); });
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->code(), ErrorCode::Unsupported) << f->what();
}

#if SHARDOPT_HAVE_NCCL
TEST(Errors, NcclCheckNamesTheCall) {
  try {
    SHARDOPT_NCCL_CHECK(ncclInvalidArgument);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Nccl);
    const std::string m = e.what();
    EXPECT_NE(m.find("ncclInvalidArgument"), std::string::npos) << m;
    EXPECT_NE(m.find("test_errors.cpp:"), std::string::npos) << m;
  }
}
#endif

}  // namespace
