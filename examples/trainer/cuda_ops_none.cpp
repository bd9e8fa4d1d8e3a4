// cuda_ops_none.cpp - stands in for the cuda_*.cu files in builds without CUDA: the trainer then
// runs only on the host backend.
#include <stdexcept>

#include "ops.hpp"

namespace trainer {

bool cuda_ops_built() noexcept { return false; }

std::unique_ptr<Ops> make_cuda_ops() {
  throw std::runtime_error("this trainer was built without CUDA: only the host backend is available");
}

}  // namespace trainer
