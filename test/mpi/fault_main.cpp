// A dead or stuck rank becomes Error(Timeout) on every other rank (host backend under
// mpiexec in CI; NCCL with one GPU per rank when SHARDOPT_BACKEND=cuda; run_fault.sh runs
// each scenario under `timeout` and counts the PASS lines). The last rank is the faulty
// one: an injected fault makes it skip every collective from some point on (it never
// enters them, then goes on to MPI_Finalize; on CUDA it then exits at once, since its
// NCCL teardown would wait for peers that gave up) or exit the process in the middle of
// a step. On CUDA the collectives only enqueue, so the error comes from synchronize().
// Every other rank must get Error(Timeout) within the deadline + 20%, naming the
// collective, the bucket or unit and the time waited; then every further call that needs
// the communicator throws Error(Timeout) at once, and the process exits cleanly.
//
//   mpi_fault_cases <scenario> <timeout_ms>
//   scenarios: skip_eager, exit_mid_step, skip_replay, skip_offload, skip_fsdp, skip_hsdp,
//              skip_construct
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <execinfo.h>
#include <unistd.h>

#include "comm/comm_impl.hpp"
#include "common/error_of.hpp"
#include "common/device_util.hpp"
#include "common/fsdp_cases.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/step_graph.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
using Clock = std::chrono::steady_clock;

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL rank %d: %s\n", world_rank(), what.c_str());
    std::fflush(stdout);
  }
}

long long ms_since(Clock::time_point t0) {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
}

const Clock::time_point started = Clock::now();

// A progress line: where a rank is when a scenario hangs (run_fault.sh prints the output
// of a job that `timeout` ended).
void progress(const std::string& what) {
  std::printf("rank %d +%lld ms: %s\n", world_rank(), ms_since(started), what.c_str());
  std::fflush(stdout);
}

// Runs `call`, which must throw Error(Timeout) after about `timeout_ms`, with a message
// holding every string of `names`.
void expect_timeout(const std::string& label, long long timeout_ms, const std::vector<std::string>& names,
                    const std::function<void()>& call) {
  const Clock::time_point t0 = Clock::now();
  progress(label + ": waiting for the timeout");
  const std::optional<Error> err = error_of(call);
  const long long took = ms_since(t0);
  progress(label + ": the call returned");
  check(err.has_value(), label + ": no error (returned after " + std::to_string(took) + " ms)");
  if (!err) return;
  const std::string what = err->what();
  check(err->code() == ErrorCode::Timeout, label + ": code " + to_string(err->code()) + ", not timeout: " + what);
  check(took >= timeout_ms, label + ": gave up after " + std::to_string(took) + " ms, before the deadline");
  check(took <= timeout_ms + timeout_ms / 5, label + ": gave up after " + std::to_string(took) + " ms, past " +
                                                  std::to_string(timeout_ms) + " ms + 20%");
  for (const std::string& n : names) check(what.find(n) != std::string::npos, label + ": '" + n + "' not in: " + what);
  std::printf("rank %d %s: Error(Timeout) after %lld ms: %s\n", world_rank(), label.c_str(), took, what.c_str());
}

// After a timeout: refused at once with Error(Timeout), and the communicator is failed.
void expect_refused(const std::string& label, const Communicator& comm, const std::function<void()>& call) {
  const Clock::time_point t0 = Clock::now();
  const std::optional<Error> err = error_of(call);
  check(err.has_value(), label + ": a call after the timeout did not throw");
  if (err) {
    check(err->code() == ErrorCode::Timeout, label + ": code " + to_string(err->code()) + ": " + err->what());
    check(std::string(err->what()).find("refused") != std::string::npos, label + ": not a refusal: " + err->what());
  }
  check(ms_since(t0) < 1000, label + ": the refusal took " + std::to_string(ms_since(t0)) + " ms");
  check(comm.failed(), label + ": the communicator is not marked failed");
}

void arm(const Communicator& comm, detail::InjectedFault fault, int after) {
  if (comm.rank() == comm.size() - 1) detail::inject_fault_for_test(comm, fault, after);
}

DistributedAdamOptions with_wait_timeout(long long ms) {
  DistributedAdamOptions o = base_options(DType::f32);
  o.watchdog.emplace().wait_timeout = std::chrono::milliseconds(ms);  // step_timeout: the default
  return o;
}

// The faulty rank, done with its part: on CUDA it leaves at once (see the file comment).
void faulty_done(Backend b) {
  progress("faulty rank done");
  if (b == Backend::Cuda) {
    std::fflush(nullptr);
    std::_Exit(0);
  }
}

// The test's own gradient kernel, launched once before any collective so that CUDA's lazy
// loading has loaded it: its first launch behind NCCL kernels waiting for a dead peer would
// wait with them (docs/faults.md). The optimizers load the library's kernels themselves.
void load_own_kernels(Backend b, Stream s) {
  if (b != Backend::Cuda) return;
  const DeviceBuffer scratch(b, sizeof(float));
  add_grads(b, s, GradStreamParams{}, {GradTarget{scratch.data(), 1, 0, DType::f32}});
  synchronize(b, s);
}

void run(const std::string& scenario, long long t) {
  const Backend b = default_backend();
  const bool host = b == Backend::Host;
  Communicator comm = make_comm(b);  // first: on CUDA it selects this rank's GPU
  TestStream ts(b);                   // so the stream is made on that GPU
  const Stream s = ts.get();
  const bool faulty = comm.rank() == comm.size() - 1;
  const std::string me = "rank " + std::to_string(comm.rank());
  progress("communicator up");
  load_own_kernels(b, s);

  if (scenario == "skip_construct") {
    // The faulty rank never constructs: the others give up in the options agreement.
    if (faulty) return faulty_done(b);
    DistributedAdamOptions o = with_wait_timeout(t);
    expect_timeout(scenario, t, {"all_gather_value", "wait_timeout", "waited", me},
                   [&] { DistributedAdam opt(comm, small_model(), o); });
    expect_refused(scenario, comm, [&] { comm.barrier(); });
  } else if (scenario == "skip_eager" || scenario == "exit_mid_step") {
    DistributedAdam opt(comm, small_model(), with_wait_timeout(t));
    init_params(opt, s);
    opt.step(s);  // a healthy step first
    opt.synchronize(s);
    const bool exits = scenario == "exit_mid_step";
    // exit_mid_step: the first reduce-scatter of the step completes, the rank dies in the second.
    arm(comm, exits ? detail::InjectedFault::ExitProcess : detail::InjectedFault::SkipCollectives, exits ? 1 : 0);
    if (faulty) {
      opt.step(s);  // skips its collectives (or exits inside)
      return faulty_done(b);
    }
    const std::vector<std::string> names =
        host ? std::vector<std::string>{"reduce_scatter",
                                        exits ? "bucket 1 gradient reduce-scatter" : "bucket 0 gradient reduce-scatter",
                                        "wait_timeout", "waited", me}
             : std::vector<std::string>{"DistributedAdam::synchronize", "wait_timeout", "waited", me};
    expect_timeout(scenario, t, names, [&] {
      opt.step(s);
      opt.synchronize(s);
    });
    expect_refused(scenario + " step", comm, [&] { opt.step(s); });
    expect_refused(scenario + " gather_params", comm, [&] { opt.gather_params(s); });
  } else if (scenario == "skip_replay" || scenario == "skip_offload") {
    // No wait_timeout: the replay's step_timeout alone bounds it. skip_offload: the whole
    // state in host memory, streamed through the replayed step (docs/offload.md).
    DistributedAdamOptions o = base_options(DType::f32);
    o.watchdog = WatchdogOptions{std::chrono::milliseconds(0), std::chrono::milliseconds(t)};
    if (scenario == "skip_offload") {
      o.offload_fraction = 1.0;
      o.offload_stage_numel = 256;
    }
    DistributedAdam opt(comm, small_model(), o);
    init_params(opt, s);
    StepGraph graph(opt, [](Stream, bool) {});
    graph.capture(s);
    graph.replay(s);  // a healthy replay first
    opt.synchronize(s);
    arm(comm, detail::InjectedFault::SkipCollectives, 0);
    if (faulty) {
      if (host) graph.replay(s);  // on CUDA the graph's collectives are not host calls: it just never replays
      return faulty_done(b);
    }
    const std::vector<std::string> names =
        host ? std::vector<std::string>{"step_timeout", "iteration #2", "gradient reduce-scatter", "waited"}
             : std::vector<std::string>{"step_timeout", "iteration #2 of DistributedAdam", me};
    expect_timeout(scenario, t, names, [&] {
      graph.replay(s);
      opt.synchronize(s);
    });
    expect_refused(scenario + " replay", comm, [&] { graph.replay(s); });
    expect_refused(scenario + " synchronize", comm, [&] { opt.synchronize(s); });
  } else if (scenario == "skip_fsdp") {
    FsdpOptions o = fsdp_options(base_options(DType::f32));
    o.watchdog.emplace().wait_timeout = std::chrono::milliseconds(t);  // step_timeout: the default
    Fsdp f(comm, fsdp_model(), small_units(), o);
    init_fsdp(f, s);
    f.synchronize(s);
    arm(comm, detail::InjectedFault::SkipCollectives, 0);
    if (faulty) {
      (void)f.wait_param(1, s);
      return faulty_done(b);
    }
    const std::vector<std::string> names =
        host ? std::vector<std::string>{"all_gather", "unit 'block0' parameter all-gather", "waited", me}
             : std::vector<std::string>{"Fsdp::synchronize", "wait_timeout", "waited", me};
    expect_timeout(scenario, t, names, [&] {
      (void)f.wait_param(1, s);
      f.synchronize(s);
    });
    expect_refused(scenario + " step", comm, [&] { f.step(s); });
  } else if (scenario == "skip_hsdp") {
    // HSDP, shard groups of 2 (4 ranks: shard groups {0, 1} and {2, 3}, replica groups
    // {0, 2} and {1, 3}): the deadline is set on the world only, so the shard and
    // replica groups split from it must inherit it. The faulty rank 3 stops after the
    // construction (it never enters another collective): rank 2 waits for it in its
    // shard group's parameter all-gather; ranks 0 and 1 gather in their own shard group
    // and wait in the replica groups' gradient all-reduce (for rank 3, or for rank 2
    // stuck behind it). Every live rank gets Error(Timeout) from a 2-rank group in time.
    FsdpOptions o = fsdp_options(base_options(DType::f32));
    o.shard_group_size = 2;
    o.watchdog.emplace().wait_timeout = std::chrono::milliseconds(t);  // step_timeout: the default
    Fsdp f(comm, fsdp_model(), small_units(), o);
    check(f.shard_size() == 2 && f.replicas() == comm.size() / 2, "HSDP with shard groups of 2");
    init_fsdp(f, s);
    f.synchronize(s);
    if (faulty) return faulty_done(b);
    const std::vector<std::string> names = host ? std::vector<std::string>{"of 2 did not complete", "wait_timeout", "waited"}
                                                : std::vector<std::string>{"Fsdp::synchronize", "wait_timeout", "waited", me};
    expect_timeout(scenario, t, names, [&] {
      fsdp_microbatch(f, s, comm.rank(), GradKind::Grid);
      f.step(s);
      f.synchronize(s);
    });
    expect_refused(scenario + " synchronize", comm, [&] { f.synchronize(s); });
  } else {
    check(false, "unknown scenario '" + scenario + "'");
    return;
  }
  if (failures == 0) {
    std::printf("PASS %s rank %d\n", scenario.c_str(), comm.rank());
    std::fflush(stdout);
  }
  progress("releasing the optimizer, the communicator and the stream");
}

}  // namespace

// SIGUSR1 prints the receiving thread's stack (run_fault.sh sends it to every rank of a
// job that hangs, before ending it; the kernel hands a process-directed signal to the
// main thread unless that thread blocks it).
void print_stack(int) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  static const char head[] = "---- stack of a rank that hangs (SIGUSR1):\n";
  (void)!write(STDOUT_FILENO, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, STDOUT_FILENO);
}

int main(int argc, char** argv) {
  {
    void* warm[1];
    (void)backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  }
  std::signal(SIGUSR1, print_stack);
  MPI_Init(&argc, &argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <scenario> <timeout_ms>\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    run(scenario, std::stoll(argv[2]));
  } catch (const std::exception& e) {
    check(false, std::string("unexpected exception: ") + e.what());
  }
  progress("released; exiting");
  std::fflush(nullptr);
  // MPI_Finalize is collective over the whole job and cannot complete once a rank has
  // died (MPI 3 has no fault tolerance: Open MPI's waits for the dead rank, sometimes
  // forever): after exit_mid_step the survivors end without it, as a trainer does after
  // a timeout (the example trainer calls MPI_Abort). The others finalize as usual.
  // On CUDA the faulty rank always exits (faulty_done), so no scenario finalizes there.
  if (scenario == "exit_mid_step" || default_backend() == Backend::Cuda) std::exit(failures == 0 ? 0 : 1);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
