// The NVTX ranges (src/core/trace.hpp, docs/profiling.md), recorded by an NVTX tool
// built for this test (nvtx_recorder.*: the shared library that NVTX3 loads as its
// injection; this file points NVTX_INJECTION64_PATH at it before the first NVTX call).
// The recorder keeps every range the library pushes as its path of open ranges
// ("shardopt/step>shardopt/adam"), per thread, and every string registered.
// Without NVTX (the host-only build or -Dnvtx=disabled) the ranges compile to nothing and
// the recording tests skip; the macros' arguments are then not evaluated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/trace.hpp"
#include "shardopt/shardopt.hpp"

#if SHARDOPT_HAVE_NVTX
#include <dlfcn.h>

#include "nvtx_recorder.hpp"

namespace {

// NVTX reads NVTX_INJECTION64_PATH at its first call, which comes later (in a test):
// name the recorder library, wherever the loader found it.
const bool recorder_named = [] {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&shardopt::test::nvtx_record), &info) != 0 && info.dli_fname != nullptr)
    ::setenv("NVTX_INJECTION64_PATH", info.dli_fname, 1);
  return true;
}();

shardopt::test::NvtxRecord& rec() { return shardopt::test::nvtx_record(); }

}  // namespace
#endif

namespace {
using namespace shardopt;

#if SHARDOPT_HAVE_NVTX
bool has(const std::vector<std::string>& paths, const std::string& p) {
  return std::find(paths.begin(), paths.end(), p) != paths.end();
}
std::string dump(const std::vector<std::string>& paths) {
  std::string out;
  for (const auto& p : paths) out += "  " + p + "\n";
  return out;
}
#define SKIP_WITHOUT_NVTX() static_cast<void>(0)
#else
#define SKIP_WITHOUT_NVTX() GTEST_SKIP() << "built without NVTX (host-only build or -Dnvtx=disabled): no ranges"
#endif

#if SHARDOPT_HAVE_NVTX
std::vector<ParamSpec> model() {
  return {ParamSpec::tensor("w", {32, 64}, DType::f32), ParamSpec::tensor("b", {64}, DType::f32)};
}

// A one-rank host-backend DistributedAdam over model(), f32 gradients, master initialized.
struct OneRankAdam {
  explicit OneRankAdam(ParamFormat format = ParamFormat::Native, bool persistent_copies = false)
      : opt(Communicator::self(Backend::Host), model(), options(format, persistent_copies)) {
    if (format == ParamFormat::Native) {
      opt.init_master(s.handle());
    } else {
      opt.init_from_master(s.handle());
    }
  }
  static DistributedAdamOptions options(ParamFormat format, bool persistent_copies) {
    DistributedAdamOptions o;
    o.grad_dtype = DType::f32;
    o.param_format = format;
    o.persistent_grad_copies = persistent_copies;
    return o;
  }
  DistributedAdam opt;
  HostStream s;
};
#endif

// Without NVTX the macros are nothing: their arguments are not even evaluated.
TEST(Trace, CompiledOutRangesEvaluateNothing) {
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  {
    SHARDOPT_TRACE("shardopt/test");
    SHARDOPT_TRACE_INDEXED("shardopt/test indexed", count());
    SHARDOPT_TRACE_EITHER(count() > 0, "shardopt/test a", "shardopt/test b", count());
  }
#if SHARDOPT_HAVE_NVTX
  EXPECT_EQ(evaluated, 3);  // each index and the condition, once
#else
  EXPECT_EQ(evaluated, 0);
#endif
}

// A DistributedAdam step shows the step and, inside it, the norm, each bucket's
// reduce-scatter and all-gather, and Adam (no quantize: nothing is quantized); all ranges
// are in the `shardopt` domain, every range opened is closed, and a second step registers
// no new string.
TEST(Trace, DistributedAdamStepShowsItsPhases) {
  SKIP_WITHOUT_NVTX();
#if SHARDOPT_HAVE_NVTX
  OneRankAdam a;
  rec().take();
  a.opt.step(a.s.handle());
  a.opt.zero_grad(a.s.handle());
  const auto paths = rec().take();
  ASSERT_TRUE(recorder_named);
  ASSERT_TRUE(rec().attached) << "NVTX did not load the recorder (NVTX_INJECTION64_PATH)";
  EXPECT_TRUE(has(paths, "shardopt/step")) << dump(paths);
  EXPECT_TRUE(has(paths, "shardopt/step>shardopt/norm")) << dump(paths);
  EXPECT_TRUE(has(paths, "shardopt/step>shardopt/adam")) << dump(paths);
  EXPECT_TRUE(has(paths, "shardopt/step>shardopt/reduce_scatter bucket 0 #0")) << dump(paths);
  EXPECT_TRUE(has(paths, "shardopt/step>shardopt/all_gather bucket 0 #0")) << dump(paths);
  EXPECT_TRUE(has(paths, "shardopt/zero_grad")) << dump(paths);
  for (const auto& p : paths) EXPECT_EQ(p.find("quantize"), std::string::npos) << "native parameters: " << p;
  for (const auto& p : paths) EXPECT_EQ(p.rfind("shardopt/", 0), 0u) << p;
  {
    std::lock_guard<std::mutex> lock(rec().mu);
    EXPECT_EQ(rec().domains, std::vector<std::string>{"shardopt"});
    EXPECT_EQ(rec().bad_pops, 0);
    for (const auto& [thread, stack] : rec().open) EXPECT_TRUE(stack.empty()) << stack.size() << " ranges left open";
  }
  // The hot path formats and registers nothing once every name has been seen.
  const std::size_t names = rec().registered();
  a.opt.step(a.s.handle());
  a.opt.zero_grad(a.s.handle());
  EXPECT_EQ(rec().registered(), names);
  EXPECT_EQ(rec().take().size(), paths.size());
#endif
}

// NVFP4 parameters: the amax pass per bucket, the quantize (exchange and phase 2) and the
// landing are ranges of the step.
TEST(Trace, QuantizedStepShowsQuantize) {
  SKIP_WITHOUT_NVTX();
#if SHARDOPT_HAVE_NVTX
  OneRankAdam a(ParamFormat::Nvfp4);
  rec().take();
  a.opt.step(a.s.handle());
  a.opt.zero_grad(a.s.handle());
  const auto paths = rec().take();
  EXPECT_TRUE(has(paths, "shardopt/step>shardopt/quantize")) << dump(paths);
  // The NVFP4 parameter "w" is registered first, so it is the layout's last bucket.
  const int b = static_cast<int>(a.opt.layout().buckets().size()) - 1;
  const std::string idx = std::to_string(b) + " #" + std::to_string(b);
  // No amax pass: the Adam pass emits NVFP4's partial amaxes (docs/nvfp4.md, issue 29).
  EXPECT_FALSE(has(paths, "shardopt/step>shardopt/amax bucket " + idx)) << dump(paths);
  EXPECT_TRUE(has(paths, "shardopt/step>shardopt/landing bucket " + idx)) << dump(paths);
  EXPECT_TRUE(has(paths, "shardopt/step>shardopt/adam")) << dump(paths);
#endif
}

// FSDP: each unit's all-gather and reduce-scatter carries the unit's index.
TEST(Trace, FsdpShowsUnitGathersAndReduceScatters) {
  SKIP_WITHOUT_NVTX();
#if SHARDOPT_HAVE_NVTX
  FsdpOptions fo;
  fo.param_dtype = DType::f32;
  Fsdp opt(Communicator::self(Backend::Host), model(), {FsdpUnit{"w", 0, 1}, FsdpUnit{"b", 1, 1}}, fo);
  HostStream s;
  opt.init_master(s.handle());
  rec().take();
  for (int u : {0, 1}) {
    (void)opt.wait_param(u, s.handle());
    (void)opt.grad_slot(u, s.handle());
    opt.grad_ready(u, s.handle());
  }
  opt.step(s.handle());
  const auto paths = rec().take();
  EXPECT_TRUE(has(paths, "shardopt/all_gather unit 0 #0")) << dump(paths);
  EXPECT_TRUE(has(paths, "shardopt/reduce_scatter unit 0 #0")) << dump(paths);
  EXPECT_TRUE(has(paths, "shardopt/reduce_scatter unit 1 #1")) << dump(paths);
  EXPECT_TRUE(has(paths, "shardopt/step>shardopt/adam")) << dump(paths);
#endif
}

// Ranges around captured work are recorded at capture: a replay shows the replay range
// and nothing inside it (docs/profiling.md says so).
TEST(Trace, ReplayShowsOnlyTheReplay) {
  SKIP_WITHOUT_NVTX();
#if SHARDOPT_HAVE_NVTX
  OneRankAdam a(ParamFormat::Native, /*persistent_copies=*/true);
  StepGraph g(a.opt, [](Stream, bool) {});
  rec().take();
  g.capture(a.s.handle());
  const auto captured = rec().take();
  EXPECT_TRUE(has(captured, "shardopt/capture>shardopt/step>shardopt/adam")) << dump(captured);
  g.replay(a.s.handle());
  const auto replayed = rec().take();
  EXPECT_EQ(replayed, std::vector<std::string>{"shardopt/replay"}) << dump(replayed);
  EXPECT_EQ(a.opt.read_scalars(a.s.handle()).step, 2);  // the warm-up and the replay (a host capture runs nothing)
#endif
}

// The checkpoint phases: save (write, index), load (verify, read).
TEST(Trace, CheckpointPhases) {
  SKIP_WITHOUT_NVTX();
#if SHARDOPT_HAVE_NVTX
  OneRankAdam a;
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("shardopt_trace_" + std::to_string(::getpid()))).string();
  rec().take();
  a.opt.save(dir, a.s.handle());
  const auto saved = rec().take();
  EXPECT_TRUE(has(saved, "shardopt/checkpoint/save>shardopt/checkpoint/write")) << dump(saved);
  EXPECT_TRUE(has(saved, "shardopt/checkpoint/save>shardopt/checkpoint/index")) << dump(saved);
  (void)a.opt.load(dir, a.s.handle());
  const auto loaded = rec().take();
  EXPECT_TRUE(has(loaded, "shardopt/checkpoint/load>shardopt/checkpoint/verify")) << dump(loaded);
  EXPECT_TRUE(has(loaded, "shardopt/checkpoint/load>shardopt/checkpoint/read")) << dump(loaded);
  std::filesystem::remove_all(dir);
#endif
}

}  // namespace
