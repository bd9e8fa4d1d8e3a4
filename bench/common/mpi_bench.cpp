#include "mpi_bench.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <utility>

#include "core/streams.hpp"
#include "cuda_bench.hpp"
#include "shardopt/mpi.hpp"

namespace shardopt::bench {

int mpi_main(int& argc, char**& argv, const char* name, const MpiMainOptions& options,
             const std::function<int()>& body) {
  if (options.serialized) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  } else {
    MPI_Init(&argc, &argv);
  }
  int code = 0;
  try {
    code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    code = 1;
    if (options.abort_on_error) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}

MpiBench::MpiBench(Backend backend) : backend_(backend) {
  MpiBootstrapOptions mo;
  mo.backend = backend;
  comm_ = communicator_from_mpi(MPI_COMM_WORLD, mo);
  stream_ = std::make_unique<SideStream>(backend);
}

MpiBench::~MpiBench() = default;

Stream MpiBench::stream() const { return stream_->get(); }

std::string MpiBench::device() const {
  if (backend_ == Backend::Cuda) return device_name(comm_.device());
  return "host backend (MPI)";
}

ArgReader::ArgReader(int argc, char** argv, Fail fail) : argc_(argc), argv_(argv), fail_(std::move(fail)) {}

bool ArgReader::next() {
  if (++i_ >= argc_) return false;
  arg_ = argv_[i_];
  return true;
}

std::string ArgReader::value() {
  if (i_ + 1 >= argc_) fail(Problem::MissingValue);
  return argv_[++i_];
}

void ArgReader::unknown() { fail(Problem::Unknown); }

void ArgReader::fail(Problem problem) {
  if (!fail_) exit_on_bad_argument(arg_, problem);
  fail_(arg_, problem);
  std::exit(2);
}

void exit_on_bad_argument(const std::string& arg, ArgReader::Problem problem) {
  if (problem == ArgReader::Problem::MissingValue) std::fprintf(stderr, "%s needs a value\n", arg.c_str());
  else std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
  std::exit(2);
}

void parse_run_args(int argc, char** argv, RunArgs& args, const std::function<bool(ArgReader&)>& extra) {
  for (ArgReader r(argc, argv); r.next();) {
    if (r.arg() == "--results") args.results = r.value();
    else if (r.arg() == "--peer") args.peer = r.value();
    else if (r.arg() == "--iters") args.iters = std::atoi(r.value().c_str());
    else if (!extra(r)) r.unknown();
  }
}

}  // namespace shardopt::bench
