// step_graph_stream_cases.hpp - which stream a StepGraph's microbatch function runs on
// (issue 30): the trainer's own stream in every call, so a trainer that enqueues on the
// stream it passed to capture() instead of the one it is handed trains exactly as
// eagerly. Run on the host backend under mpiexec and on GPUs under mpirun.
#pragma once

#include <vector>

#include "fsdp_cases.hpp"

namespace shardopt::test {

/// Wraps `inner` so that every stream it is handed is appended to `handed`.
inline StepGraph::MicrobatchFn recording(std::vector<Stream>& handed, StepGraph::MicrobatchFn inner) {
  return [&handed, inner = std::move(inner)](Stream s, bool last) {
    handed.push_back(s);
    inner(s, last);
  };
}

/// Every stream a StepGraph hands its microbatch function: capture(s) (warm-up and
/// capture) hands `s` only, run_eager(e) hands `e` only, replay() calls nothing.
inline void expect_handed_callers_stream(Backend b, StepGraph& g, std::vector<Stream>& handed, int microbatches,
                                         int warmup) {
  TestStream s(b), e(b);
  g.capture(s.get());
  EXPECT_GE(handed.size(), static_cast<std::size_t>(warmup * microbatches + 1));
  for (std::size_t i = 0; i < handed.size(); ++i) EXPECT_EQ(handed[i], s.get()) << "capture(): call " << i;
  handed.clear();
  s.sync();
  g.run_eager(e.get());
  EXPECT_EQ(handed.size(), static_cast<std::size_t>(microbatches));
  for (std::size_t i = 0; i < handed.size(); ++i) EXPECT_EQ(handed[i], e.get()) << "run_eager(): call " << i;
  handed.clear();
  e.sync();
  g.replay(s.get());
  EXPECT_TRUE(handed.empty()) << "replay() called the microbatch function";
  s.sync();
}

/// The microbatch function of a StepGraph gets the stream passed to capture() in every
/// warm-up and capture call (and run_eager()'s in its calls), for both optimizers.
inline void case_microbatch_gets_callers_stream(Backend b) {
  const int rank = world_rank();
  constexpr int kMicrobatches = 2, kWarmup = 2;
  DistributedAdamOptions o = base_options(DType::bf16);
  o.microbatches = kMicrobatches;
  Communicator comm = make_comm(b);
  {
    SCOPED_TRACE("DistributedAdam");
    DistributedAdam opt(comm, small_model(), o);
    TestStream init(b);
    init_params(opt, init.get());
    init.sync();
    std::vector<Stream> handed;
    StepGraph g(opt, recording(handed, random_grads_fn(opt, b, rank)), StepGraphOptions{kWarmup});
    expect_handed_callers_stream(b, g, handed, kMicrobatches, kWarmup);
  }
  {
    SCOPED_TRACE("Fsdp");
    Fsdp f(comm, fsdp_model(), small_units(), fsdp_options(o));
    TestStream init(b);
    init_fsdp(f, init.get());
    init.sync();
    std::vector<Stream> handed;
    StepGraph g(f, recording(handed, [&f, rank](Stream s, bool) { fsdp_microbatch(f, s, rank, GradKind::Random); }),
                StepGraphOptions{kWarmup});
    expect_handed_callers_stream(b, g, handed, kMicrobatches, kWarmup);
  }
}

/// How long the trainer's stream sleeps before each of its microbatches (CUDA): far
/// longer than the library's work of a microbatch, so that work on another stream that
/// is not ordered after it would overtake it.
inline constexpr int kTrainerDelayUs = 2000;

/// A trainer that enqueues every microbatch on its own stream (the one it passes to
/// capture()), ignoring the stream it is handed, captured and replayed equals eager
/// iterations bitwise (grad norm, params, master, moments): DistributedAdam with 4
/// microbatches.
inline void case_dist_adam_trainer_own_stream(Backend b) {
  case_graph_equals_eager(b, DType::bf16, 4, 6, false, on_own_stream(b, kTrainerDelayUs));
}

/// The same for Fsdp (the whole iteration in one graph), 4 microbatches.
inline void case_fsdp_trainer_own_stream(Backend b) {
  case_fsdp_graph_equals_eager(b, 4, 6, on_own_stream(b, kTrainerDelayUs));
}

}  // namespace shardopt::test

/// The cases above as tests of suite `Suite` on backend `B`.
#define SHARDOPT_STEP_GRAPH_STREAM_CASES(Suite, B)                                                                 \
  TEST(Suite, MicrobatchGetsTheCallersStream) { shardopt::test::case_microbatch_gets_callers_stream(B); }         \
  TEST(Suite, DistAdamTrainerOnItsOwnStreamEqualsEager) { shardopt::test::case_dist_adam_trainer_own_stream(B); } \
  TEST(Suite, FsdpTrainerOnItsOwnStreamEqualsEager) { shardopt::test::case_fsdp_trainer_own_stream(B); }
