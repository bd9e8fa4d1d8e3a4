// main() of the suites run under mpiexec: every rank runs every test; only rank 0
// prints progress (other ranks print failures); all ranks exit with the same code.
// With SHARDOPT_TEST_NEEDS_GPU=1 in the environment the suite exits 77 when a rank
// has no CUDA device of its own (see test/gpu/run_mpi.sh).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "shardopt/backend.hpp"

namespace {
// Prints only failures on ranks other than 0.
class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* needs_gpu = std::getenv("SHARDOPT_TEST_NEEDS_GPU");
  if (needs_gpu != nullptr && std::string(needs_gpu) == "1") {
    int have = shardopt::cuda_device_count() > 0 ? 1 : 0, all = 0;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all == 0) {
      if (rank == 0) std::printf("no CUDA device on some rank: skipping\n");
      MPI_Finalize();
      return 77;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(rank));
  }
  const int local = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&local, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("[%d ranks] %s\n", size, worst == 0 ? "all ranks passed" : "a rank failed");
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
