#include "grad_stream.hpp"

#include <chrono>
#include <thread>

#include <mpi.h>

#include "shardopt/host_stream.hpp"

namespace shardopt::test {

void add_grads(Backend backend, Stream stream, const GradStreamParams& p, const std::vector<GradTarget>& targets) {
  if (p.only_world_rank_zero) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) return;
  }
  if (backend == Backend::Host) {
    host_enqueue(stream, [p, targets] {
      const std::int64_t step = p.scalars != nullptr ? p.scalars->step : 0;
      const std::int32_t mb = p.microbatch != nullptr ? p.microbatch->index : 0;
      for (const auto& t : targets)
        for (std::int64_t j = 0; j < t.numel; ++j) add_grad_element(p, step, mb, t, j);
    });
    return;
  }
  add_grads_cuda(stream, p, targets);
}

void delay_stream(Backend backend, Stream stream, int microseconds) {
  if (backend == Backend::Host) {
    host_enqueue(stream, [microseconds] { std::this_thread::sleep_for(std::chrono::microseconds(microseconds)); });
    return;
  }
  if (stream == nullptr) return;
  delay_stream_cuda(stream, microseconds);
}

}  // namespace shardopt::test
