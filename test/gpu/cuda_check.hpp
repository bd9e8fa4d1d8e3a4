// cuda_check.hpp - TEST_CUDA(call): a CUDA runtime call in a GPU test whose failure
// throws std::runtime_error naming the call and CUDA's message (the test fails there).
#pragma once

#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#define TEST_CUDA(call)                                                                                   \
  do {                                                                                                    \
    const cudaError_t e_ = (call);                                                                        \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)
