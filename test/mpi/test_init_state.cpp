// A step before the master is initialized is refused (host backend under mpiexec): step,
// reduce_grads, gather_params and grad_ready of DistributedAdam, step, wait_param and
// grad_ready of Fsdp throw Error(InvalidState) naming the init calls, on every rank,
// before anything is enqueued (the weights the trainer wrote stay as written); the init
// calls and a checkpoint load each count as initializing.
#include <string>
#include <vector>

#include "common/checkpoint_cases.hpp"
#include "common/fsdp_cases.hpp"
#include "shardopt/host_stream.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

template <class F>
void expect_needs_init(const std::string& call, const std::string& init_calls, const F& f) {
  SCOPED_TRACE(call);
  try {
    f();
    ADD_FAILURE() << call << " before the master was initialized did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidState) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find(call + " before the fp32 master was initialized"), std::string::npos) << what;
    EXPECT_NE(what.find(init_calls), std::string::npos) << what;
    EXPECT_NE(what.find("load a checkpoint"), std::string::npos) << what;
  }
}

// The bytes the trainer wrote into the param views, as they are now.
std::vector<std::vector<std::uint8_t>> param_bytes(DistributedAdam& opt) {
  std::vector<std::vector<std::uint8_t>> out;
  for (int i = 0; i < opt.num_params(); ++i) out.push_back(read_bytes(opt.backend(), opt.param(i)));
  return out;
}

// Writes the initial values without init_master (init_params without its last line).
void write_params_only(DistributedAdam& opt) {
  for (int i = 0; i < opt.num_params(); ++i) {
    const ParamView v = opt.param(i);
    std::vector<std::uint8_t> bytes(v.bytes());
    for (std::int64_t j = 0; j < v.numel(); ++j) {
      const std::uint32_t code = num::encode(v.dtype, init_value(i, j));
      std::memcpy(bytes.data() + static_cast<std::size_t>(j) * size_of(v.dtype), &code, size_of(v.dtype));
    }
    from_host(opt.backend(), v.data, bytes);
  }
}

TEST(InitStateHost, DistributedAdamRefusesStepReduceGatherBeforeInit) {
  Communicator comm = make_comm(Backend::Host);
  HostStream hs;
  const Stream s = hs.handle();
  DistributedAdam opt(comm, small_model(), base_options(DType::f32));
  write_params_only(opt);
  const auto written = param_bytes(opt);
  const std::string init_calls = "init_master(stream) (after writing the param views) or init_from_master(stream)";
  expect_needs_init("step()", init_calls, [&] { opt.step(s); });
  expect_needs_init("reduce_grads()", init_calls, [&] { opt.reduce_grads(s); });
  expect_needs_init("gather_params()", init_calls, [&] { opt.gather_params(s); });
  expect_needs_init("grad_ready('w1')", init_calls, [&] { opt.grad_ready(2, s); });
  // A capture's eager warm-up is refused too (its last microbatch reduces first).
  StepGraph graph(opt, [](Stream, bool) {});
  expect_needs_init("reduce_grads()", init_calls, [&] { graph.capture(s); });
  EXPECT_EQ(opt.read_scalars(s).step, 0);
  EXPECT_EQ(param_bytes(opt), written) << "a refused call changed the parameters";
  // init_master counts: the step now runs.
  opt.init_master(s);
  opt.step(s);
  EXPECT_EQ(opt.read_scalars(s).step, 1);
}

TEST(InitStateHost, InitFromMasterAndLoadCount) {
  Communicator comm = make_comm(Backend::Host);
  HostStream hs;
  const Stream s = hs.handle();
  DistributedAdamOptions mx = base_options(DType::f32);
  mx.param_format = ParamFormat::Mxfp8;
  mx.param_dtype = DType::f32;
  DistributedAdam a(comm, small_model(DType::f32), mx);
  expect_needs_init("step()", "init_from_master(stream)", [&] { a.step(s); });
  a.init_from_master(s);
  a.step(s);
  EXPECT_EQ(a.read_scalars(s).step, 1);

  // A checkpoint load initializes a fresh optimizer.
  SharedDir dir("init-state");
  DistributedAdam b(comm, small_model(), base_options(DType::f32));
  init_params(b, s);
  b.step(s);
  b.save(dir.sub("ckpt"), s);
  DistributedAdam c(comm, small_model(), base_options(DType::f32));
  expect_needs_init("step()", "init_master(stream)", [&] { c.step(s); });
  c.load(dir.sub("ckpt"), s);
  c.step(s);
  EXPECT_EQ(c.read_scalars(s).step, 2);
}

TEST(InitStateHost, FsdpRefusesStepGatherReduceBeforeInit) {
  Communicator comm = make_comm(Backend::Host);
  HostStream hs;
  const Stream s = hs.handle();
  Fsdp f(comm, fsdp_model(), small_units(), fsdp_options(base_options(DType::f32)));
  const std::string init_calls = "init_master(stream) (after writing the shard_param(i) pieces)";
  expect_needs_init("step()", init_calls, [&] { f.step(s); });
  expect_needs_init("wait_param('block0')", init_calls, [&] { f.wait_param(1, s); });
  expect_needs_init("grad_ready('embed')", init_calls, [&] { f.grad_ready(0, s); });
  init_fsdp(f, s);
  (void)f.wait_param(0, s);
  (void)f.grad_slot(0, s);
  f.grad_ready(0, s);
}

}  // namespace
