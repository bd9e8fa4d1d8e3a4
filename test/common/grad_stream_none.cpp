// grad_stream_none.cpp - the CUDA writers of the test gradient stream in a build without
// CUDA (grad_stream.cu takes their place in a CUDA build): no stream of Backend::Cuda
// exists there, so add_grads and delay_stream never reach them; they refuse all the same.
#include "core/check.hpp"
#include "grad_stream.hpp"

namespace shardopt::test {

void add_grads_cuda(Stream, const GradStreamParams&, const std::vector<GradTarget>&) {
  detail::no_cuda("the test gradient stream");
}

void delay_stream_cuda(Stream, int) { detail::no_cuda("the test stream delay"); }

}  // namespace shardopt::test
