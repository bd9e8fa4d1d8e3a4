// SHARDOPT_CUDA_CHECK: code, failing call, file and line (compiled into unit_errors in
// CUDA builds only; no GPU needed: the macro is given error codes directly).
#include <gtest/gtest.h>

#include <string>

#include "core/check.hpp"
#include "shardopt/error.hpp"

namespace {
using namespace shardopt;

TEST(Errors, CudaCheckNamesTheCall) {
  try {
    SHARDOPT_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Cuda);
    const std::string m = e.what();
    EXPECT_NE(m.find("cudaErrorInvalidValue"), std::string::npos) << m;
    EXPECT_NE(m.find("test_errors_cuda.cpp:"), std::string::npos) << m;
  }
  try {
    SHARDOPT_CUDA_CHECK(cudaErrorMemoryAllocation);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos);
  }
}

}  // namespace
