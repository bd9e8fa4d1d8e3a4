// main.cpp - the trainer program: one rank per GPU under mpirun, or the host backend on
// machines without a GPU. It links shardopt only through its public headers.
//
//   mpirun -n 2 trainer --size tiny --steps 200
//
// Every log_every steps rank 0 prints the step's loss, global gradient norm, learning
// rate, step time, tokens/s and memory per rank, and this rank's gradient norm per
// parameter group. Values are read after the step (outside the captured graph), only on
// logged steps, so the other steps run without a host synchronisation.
//
// --metrics FILE: rank 0 also writes every step's loss, gradient norm, learning rate,
// step time and tokens/s to FILE as JSON lines (reading them every step synchronizes the
// host each step; scripts/run_main.sh draws the loss curve from them).
//
// Checkpoints: --save-dir DIR saves into DIR/step-NNNNN after the last step and, with
// --save-every K, after every K-th step (those with save_async: the state is snapshotted
// and written in the background while training goes on; each is waited for, on every
// rank, before the next save and before exit). --resume CKPT loads a checkpoint before
// the first step and continues from its step up to --steps.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <shardopt/checkpoint.hpp>
#include <shardopt/error.hpp>
#include <shardopt/mpi.hpp>

#include "trainer.hpp"

namespace {

std::string bytes_str(std::int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024.0 * 1024.0)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  else
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024.0));
  return buf;
}

std::string rate(double tokens_per_s) {
  char buf[32];
  if (tokens_per_s >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", tokens_per_s / 1e6);
  else if (tokens_per_s >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", tokens_per_s / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", tokens_per_s);
  return buf;
}

int run(int argc, char** argv, int world_rank) {
  // Option errors are the same on every rank and come before any collective: every rank
  // returns, rank 0 says why.
  trainer::CommandLine line;
  shardopt::Backend backend = shardopt::Backend::Host;
  try {
    line = trainer::parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
    if (line.help) {
      if (world_rank == 0) std::printf("%s", trainer::usage().c_str());
      return 0;
    }
    trainer::prepare_task(line.train);
    trainer::check_supported(line.train);
    backend = trainer::choose_backend(line.train);
  } catch (const std::exception& e) {
    if (world_rank == 0) std::fprintf(stderr, "trainer: %s\n", e.what());
    return 2;
  }
  const trainer::TrainOptions& o = line.train;
  const std::string& metrics_path = line.program.metrics_path;
  const std::string& save_init = line.program.save_init;
  const double expect_below = line.program.expect_loss_below;
  const double expect_val_below = line.program.expect_val_loss_below;
  if (!o.save_dir.empty()) {
    // The checkpoints go into subdirectories of --save-dir: make it (and its parents) on
    // every rank; any rank's failure stops every rank here, before any other collective.
    std::error_code ec;
    std::filesystem::create_directories(o.save_dir, ec);
    int bad = std::filesystem::is_directory(o.save_dir) ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad != 0) {
      if (world_rank == 0)
        std::fprintf(stderr, "trainer: --save-dir %s: cannot make the directory%s%s\n", o.save_dir.c_str(),
                     ec ? ": " : " (on some rank)", ec ? ec.message().c_str() : "");
      return 2;
    }
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> metrics(nullptr, &std::fclose);
  if (!metrics_path.empty()) {
    // Rank 0 writes the file; its failure to open it stops every rank here.
    if (world_rank == 0) metrics.reset(std::fopen(metrics_path.c_str(), "w"));
    int bad = world_rank == 0 && !metrics ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad != 0) {
      if (world_rank == 0) std::fprintf(stderr, "trainer: --metrics %s: cannot open it for writing\n", metrics_path.c_str());
      return 2;
    }
  }
  shardopt::MpiBootstrapOptions mo;
  mo.backend = backend;
  shardopt::Communicator comm = shardopt::communicator_from_mpi(MPI_COMM_WORLD, mo);
  const bool root = comm.rank() == 0;

  trainer::Trainer t(o, comm);
  const trainer::ModelConfig& c = o.model;
  const int log_every = o.log_every > 0 ? o.log_every : std::max(1, o.steps / 20);
  if (root) {
    if (c.gpt)
      std::printf("shardopt trainer: --model gpt --size %s (%.3gM params: V=%lld H=%lld N=%d heads=%d F=%lld "
                  "context=%lld, %lld sequences/microbatch/rank)\n",
                  o.size.c_str(), static_cast<double>(c.param_count()) / 1e6, static_cast<long long>(c.vocab),
                  static_cast<long long>(c.hidden), c.layers, c.heads, static_cast<long long>(c.mlp),
                  static_cast<long long>(c.context), static_cast<long long>(c.tokens / c.context));
    else
      std::printf("shardopt trainer: --size %s (%.3gM params: V=%lld H=%lld N=%d F=%lld G=%d Fe=%lld C=%lld T=%lld)\n",
                  o.size.c_str(), static_cast<double>(c.param_count()) / 1e6, static_cast<long long>(c.vocab),
                  static_cast<long long>(c.hidden), c.layers, static_cast<long long>(c.mlp), c.experts,
                  static_cast<long long>(c.expert_mlp), static_cast<long long>(c.capacity()),
                  static_cast<long long>(c.tokens));
    std::printf("  %d rank(s) on the %s backend, --mode %s --params %s --grad-dtype %s --experts %s --graph %s, "
                "%d microbatch(es), %lld tokens/step\n",
                comm.size(), shardopt::to_string(backend), o.mode.c_str(), o.params.c_str(), o.grad_dtype.c_str(),
                o.experts.c_str(), o.graph ? "on" : "off", o.microbatches,
                static_cast<long long>(t.tokens_per_step()));
    if (o.task == "shakespeare")
      std::printf("  task: the next character of Shakespeare's works (%s, %lld characters in the vocabulary); "
                  "uniform guess: %.3f\n",
                  o.data_dir.c_str(), static_cast<long long>(c.vocab), std::log(static_cast<double>(c.vocab)));
    else
      std::printf("  task: next token = (%lld * token + %lld) mod %lld on random tokens; cross-entropy floor 0 "
                  "(uniform guess: %.3f)\n",
                  static_cast<long long>(trainer::rule_multiplier(c.vocab)),
                  static_cast<long long>(trainer::kRuleOffset), static_cast<long long>(c.vocab),
                  std::log(static_cast<double>(c.vocab)));
    std::fflush(stdout);
  }

  if (!save_init.empty() && o.resume.empty()) {
    // The initial weights, as a checkpoint of step 0 (the PyTorch peer starts from them).
    t.save(save_init);
    if (root) {
      std::printf("saved the initial weights to %s\n", save_init.c_str());
      std::fflush(stdout);
    }
  }

  int start = 0;  // iterations already run (by the run that saved --resume)
  if (!o.resume.empty()) {
    // A bad checkpoint is an Error on every rank, before anything changed: every rank
    // returns, rank 0 says why (shardopt's words).
    shardopt::CheckpointInfo info;
    try {
      info = t.load(o.resume);
    } catch (const shardopt::Error& e) {
      if (root) std::fprintf(stderr, "trainer: --resume %s: %s\n", o.resume.c_str(), e.what());
      return 2;
    }
    start = t.iterations();
    if (root) {
      std::printf("resumed from %s at step %d (optimizer step %lld), training to step %d\n", o.resume.c_str(), start,
                  static_cast<long long>(info.step), o.steps);
      const std::string diff = t.resume_differences(info);
      if (!diff.empty()) std::printf("  note: this run does not continue that one identically: %s\n", diff.c_str());
      std::fflush(stdout);
    }
    if (start >= o.steps) {
      if (root) std::printf("nothing to train: the checkpoint is at step %d, --steps is %d\n", start, o.steps);
      return 0;
    }
  }

  // Checkpoints: periodic ones with save_async (one in flight at a time: each is waited
  // for, on every rank, before the next save and before exit; a failed write is an error
  // there), the last one with save. Rank 0 prints one line per save.
  shardopt::SaveHandle pending;

  using clock = std::chrono::steady_clock;
  double first_loss = -1.0, last_loss = 0.0;
  auto t0 = clock::now();
  int interval_steps = 0;
  for (int s = start + 1; s <= o.steps; ++s) {
    t.step();
    ++interval_steps;
    const bool log = s % log_every == 0 || s == o.steps || s == start + 1;
    if (log || !metrics_path.empty()) {
      const trainer::StepStats st = t.stats();  // synchronizes: outside the captured graph
      const auto t1 = clock::now();
      const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / interval_steps;
      if (first_loss < 0.0) first_loss = st.loss;
      last_loss = st.loss;
      const double tokens_per_s = static_cast<double>(t.tokens_per_step()) * 1000.0 / ms;
      if (metrics) {
        std::fprintf(metrics.get(),
                     "{\"step\": %d, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.9g, \"step_ms\": %.6g, "
                     "\"tokens_per_s\": %.6g, \"skipped\": %s}\n",
                     s, st.loss, st.grad_norm, st.lr, ms, tokens_per_s, st.skipped ? "true" : "false");
        std::fflush(metrics.get());
      }
      if (log && root && !o.quiet) {
        const trainer::MemoryUse m = t.memory();
        std::printf("step %5d/%d | loss %.4f | grad norm %.3e | lr %.2e | %8.2f ms/step%s | %s tok/s | mem/rank %s%s "
                    "(optimizer %s, activations %s)%s\n",
                    s, o.steps, st.loss, st.grad_norm, st.lr, ms, s == start + 1 && o.graph ? " (warm-up+capture)" : "",
                    rate(tokens_per_s).c_str(),
                    bytes_str(m.device > 0 ? m.device : m.optimizer + m.activations).c_str(),
                    m.device > 0 ? " on the GPU" : "",
                    bytes_str(m.optimizer).c_str(), bytes_str(m.activations).c_str(),
                    st.skipped ? " | STEP SKIPPED (non-finite gradient)" : "");
        if (o.group_norms) {
          std::printf("      grad norms (rank 0):");
          for (int g = 0; g < trainer::kNormGroups; ++g)
            if (!c.gpt || (g != static_cast<int>(trainer::NormGroup::Router) &&
                           g != static_cast<int>(trainer::NormGroup::Experts)))  // none in the GPT
              std::printf(" %s %.3e", trainer::to_string(static_cast<trainer::NormGroup>(g)),
                          st.group_norm[static_cast<std::size_t>(g)]);
          std::printf("\n");
        }
        std::fflush(stdout);
      }
      interval_steps = 0;
      t0 = clock::now();
    }
    if (o.eval_every > 0 && s % o.eval_every == 0 && s != o.steps) {
      const double val = t.evaluate();  // forward only, between iterations
      if (metrics) {
        std::fprintf(metrics.get(), "{\"step\": %d, \"val_loss\": %.9g}\n", s, val);
        std::fflush(metrics.get());
      }
      if (root && !o.quiet) {
        std::printf("step %5d/%d | val loss %.4f\n", s, o.steps, val);
        std::fflush(stdout);
      }
      t0 = clock::now();  // the evaluation is not part of the next step's time
    }
    if (!o.save_dir.empty() && o.save_every > 0 && s % o.save_every == 0 && s != o.steps) {
      pending.wait();  // collective; a no-op without a save in flight
      const std::string dir = trainer::checkpoint_dir(o.save_dir, s);
      pending = t.save_async(dir);
      if (root) {
        std::printf("saving checkpoint of step %d to %s (written in the background)\n", s, dir.c_str());
        std::fflush(stdout);
      }
    }
  }
  pending.wait();
  double final_val = -1.0;
  if (o.eval_every > 0 || o.task == "shakespeare") {
    final_val = t.evaluate();
    if (metrics) {
      std::fprintf(metrics.get(), "{\"step\": %d, \"val_loss\": %.9g}\n", o.steps, final_val);
      std::fflush(metrics.get());
    }
  }
  if (!o.save_dir.empty()) {
    const std::string dir = trainer::checkpoint_dir(o.save_dir, o.steps);
    t.save(dir);
    if (root) {
      std::printf("saved checkpoint of step %d to %s\n", o.steps, dir.c_str());
      std::fflush(stdout);
    }
  }
  if (root) {
    std::printf("loss %.4f -> %.4f after %d steps%s\n", first_loss, last_loss, o.steps,
                o.task == "shakespeare" ? "" : " (floor 0)");
    if (final_val >= 0.0) std::printf("final val loss %.9g at step %d\n", final_val, o.steps);
    // All the digits (a resumed run must end with exactly the loss of an uninterrupted one).
    std::printf("final loss %.9g at step %d\n", last_loss, o.steps);
    std::fflush(stdout);
  }
  if (o.sample_chars > 0 && o.model.gpt && o.task == "shakespeare") {
    const std::string text = t.sample(o.sample_chars, o.seed);  // every rank (FSDP gathers)
    if (root) {
      std::printf("sample (%d characters, seed %llu):\n%s\n", o.sample_chars,
                  static_cast<unsigned long long>(o.seed), text.c_str());
      std::fflush(stdout);
    }
  }
  if (expect_val_below >= 0.0 && !(final_val >= 0.0 && final_val < expect_val_below)) {
    if (root) std::fprintf(stderr, "FAILED: final val loss %.4f is not below %.4f\n", final_val, expect_val_below);
    return 1;
  }
  if (expect_below >= 0.0 && !(last_loss < expect_below)) {
    if (root) std::fprintf(stderr, "FAILED: final loss %.4f is not below %.4f\n", last_loss, expect_below);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int code = 0;
  try {
    code = run(argc, argv, rank);
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const shardopt::Error*>(&e);
    if (error != nullptr && error->code() == shardopt::ErrorCode::Timeout) {
      // A dead or stuck rank: this job cannot go on. End it, so that the launcher can
      // restart it from the last checkpoint (--resume).
      std::fprintf(stderr, "[rank %d] timeout: %s\nrestart the job with --resume <the last checkpoint>\n", rank,
                   e.what());
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int worst = 0;
  MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
