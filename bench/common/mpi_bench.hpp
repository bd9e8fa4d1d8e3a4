// mpi_bench.hpp - the main() scaffolding the MPI benchmarks share (bench_dist_adam,
// bench_fsdp, bench_comm, bench_trainer): MPI start and end around the run, the
// communicator and stream a run works on, and a flag-by-flag command-line reader.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "shardopt/backend.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
class SideStream;  // core/streams.hpp
}

namespace shardopt::bench {

/// How mpi_main starts MPI and what an exception escaping the run does.
struct MpiMainOptions {
  bool serialized = false;      ///< MPI_Init_thread(MPI_THREAD_SERIALIZED) instead of MPI_Init
  bool abort_on_error = false;  ///< after printing the exception: MPI_Abort(1) (else exit code 1)
};

/// Initialises MPI, runs `body` and finalises MPI; returns body's exit code. An exception
/// escaping `body` is printed as "<name>: <what>" on stderr and gives exit code 1.
int mpi_main(int& argc, char**& argv, const char* name, const MpiMainOptions& options,
             const std::function<int()>& body);

/// What an MPI benchmark runs on: its backend, a communicator over MPI_COMM_WORLD (on
/// CUDA it sets this thread's device to the rank's GPU) and, on CUDA, a non-blocking
/// stream of its own (a SideStream; null on the host backend). Not copyable.
class MpiBench {
 public:
  /// Builds the communicator of `backend` (collective over MPI_COMM_WORLD) and the stream.
  explicit MpiBench(Backend backend);
  ~MpiBench();

  /// The backend the run uses.
  Backend backend() const { return backend_; }
  /// The communicator over all ranks.
  const Communicator& comm() const { return comm_; }
  /// The run's stream: a CUDA stream on CUDA, null on the host backend.
  Stream stream() const;
  /// This process's rank in the communicator.
  int rank() const { return comm_.rank(); }
  /// The rank's device name as the driver reports it, "host backend (MPI)" on the host.
  std::string device() const;

 private:
  Backend backend_;
  Communicator comm_;
  std::unique_ptr<SideStream> stream_;
};

/// Reads argv[1..] flag by flag:
///   for (ArgReader r(argc, argv); r.next();) { if (r.arg() == "--x") x = r.value(); else r.unknown(); }
class ArgReader {
 public:
  /// What is wrong with an argument.
  enum class Problem { MissingValue, Unknown };
  /// Reports a bad argument and does not return (if it does, the process exits with 2).
  using Fail = std::function<void(const std::string& arg, Problem problem)>;

  /// A reader of argv[1..argc-1]; an empty `fail` means exit_on_bad_argument.
  ArgReader(int argc, char** argv, Fail fail = {});
  /// Steps to the next argument; false when none is left.
  bool next();
  /// The current argument.
  const std::string& arg() const { return arg_; }
  /// Consumes and returns the argument after the current one (reported when missing).
  std::string value();
  /// Reports the current argument as unknown.
  [[noreturn]] void unknown();

 private:
  [[noreturn]] void fail(Problem problem);
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string arg_;
  Fail fail_;
};

/// The default ArgReader::Fail: prints "<arg> needs a value" or "unknown argument <arg>"
/// on stderr and exits with 2.
[[noreturn]] void exit_on_bad_argument(const std::string& arg, ArgReader::Problem problem);

/// The flags of the MPI benchmarks that have a PyTorch peer.
struct RunArgs {
  std::string results;  ///< --results DIR: where rank 0 upserts its lines ("" = print only)
  std::string peer;     ///< --peer FILE: the peer script's timings ("" = none)
  int iters = 0;        ///< --iters N: timed iterations (std::atoi)
};

/// Parses argv into `args`: --results, --peer and --iters here, every other argument to
/// `extra`, which returns false for one it does not take (then: exit_on_bad_argument).
void parse_run_args(int argc, char** argv, RunArgs& args, const std::function<bool(ArgReader&)>& extra);

}  // namespace shardopt::bench
