// Issue 29, point 3: no step launches one small kernel per tensor. A step of
// DistributedAdam with quantized parameters (MXFP8, NVFP4) is captured on a HostStream
// with the gradients' grad_ready calls (one recorded op per launch on the host backend)
// for models of 2 and of 24 small matrices in one bucket: both must record the same
// number of ops. A
// per-tensor quantize or landing would add 22 or more.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/mxfp8_params_cases.hpp"
#include "shardopt/host_stream.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

// n small matrices of odd shapes (each under one MXFP8 tile), and one native bias.
std::vector<ParamSpec> small_matrices(int n) {
  std::vector<ParamSpec> s = {ParamSpec::tensor("bias", {7}, DType::bf16, "no_decay")};  // a native one
  for (int i = 0; i < n; ++i) {
    std::string name = "m";
    name += std::to_string(i);
    s.push_back(ParamSpec::tensor(name, {3 + i % 5, 17 + 2 * (i % 7)}));
  }
  return s;
}

// Ops one iteration (the gradients' writer, grad_ready of each, step) records on the
// caller's stream, after a first eager iteration.
std::size_t step_ops(const Communicator& comm, int n, ParamFormat format) {
  DistributedAdamOptions o = mx_options(DType::bf16, format);
  o.bucket_numel = 1 << 20;  // one bucket for all
  DistributedAdam opt(comm, small_matrices(n), o);
  HostStream s;
  mx_init(opt, s.handle());
  mx_backward(opt, Backend::Host, s.handle(), GradKind::Grid);
  opt.step(s.handle());
  s.begin_capture();
  mx_backward(opt, Backend::Host, s.handle(), GradKind::Grid);  // one op for all gradients, grad_ready
  opt.step(s.handle());
  return s.end_capture().size();
}

void expect_constant(ParamFormat format) {
  const Communicator comm = make_comm(Backend::Host);
  const std::size_t few = step_ops(comm, 2, format);
  const std::size_t many = step_ops(comm, 24, format);
  EXPECT_GT(few, 0u);
  EXPECT_EQ(many, few) << "a step of 24 small matrices records " << many << " ops, of 2 records " << few;
}

TEST(SmallTensorsHost, Mxfp8StepLaunchesDoNotGrowWithTheTensorCount) { expect_constant(ParamFormat::Mxfp8); }
TEST(SmallTensorsHost, Nvfp4StepLaunchesDoNotGrowWithTheTensorCount) { expect_constant(ParamFormat::Nvfp4); }

}  // namespace
