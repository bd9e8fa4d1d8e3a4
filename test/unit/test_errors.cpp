// shardopt::Error and the check macros: code, message, failing call, file and line.
#include <gtest/gtest.h>

#include <string>

#include "core/check.hpp"
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

#if SHARDOPT_HAVE_CUDA
TEST(Errors, CudaCheckNamesTheCall) {
  try {
    SHARDOPT_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Cuda);
    const std::string m = e.what();
    EXPECT_NE(m.find("cudaErrorInvalidValue"), std::string::npos) << m;
    EXPECT_NE(m.find("test_errors.cpp:"), std::string::npos) << m;
  }
  try {
    SHARDOPT_CUDA_CHECK(cudaErrorMemoryAllocation);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos);
  }
}
#endif

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
