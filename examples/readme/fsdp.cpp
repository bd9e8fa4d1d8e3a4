// The README's FSDP example as a complete program: a toy model of four units (every
// weight pulled towards 0.25) trained for 100 eager iterations on the host backend.
//   mpiexec -n 2 build/examples/readme/readme_fsdp [SHARD_GROUP_SIZE]
// The lines between the [readme:fsdp] and [readme:end] markers are the README's code,
// verbatim (examples/readme/check_readme_code.py, test readme_code_excerpts).
#include <shardopt/mpi.hpp>
#include <shardopt/shardopt.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace shardopt;

namespace {

constexpr float kTarget = 0.25f;
struct Loss {
  double sum = 0.0;
  std::int64_t n = 0;
  double mean() const { return sum / static_cast<double>(n); }
};
std::vector<Loss> losses;  // per iteration: the toy forward's (w - 0.25)^2 over every weight

float bf16_at(const TensorView& v, std::int64_t j) { return num::bf16_to_f32(v.as<std::uint16_t>()[j]); }

// The toy model's forward and backward of unit u, enqueued on the stream as kernels would be.
void forward(int unit, const std::vector<ParamView>& w, Stream s) {
  host_enqueue(s, [unit, w] {
    if (unit == 0) losses.emplace_back();
    for (const ParamView& v : w)
      for (std::int64_t j = 0; j < v.numel(); ++j, ++losses.back().n) losses.back().sum += std::pow(bf16_at(v, j) - kTarget, 2);
  });
}
void backward(int /*unit*/, const std::vector<ParamView>& w, const std::vector<GradView>& g, Stream s) {
  host_enqueue(s, [w, g] {
    for (std::size_t i = 0; i < w.size(); ++i)
      for (std::int64_t j = 0; j < w[i].numel(); ++j)
        g[i].as<std::uint16_t>()[j] = num::f32_to_bf16(bf16_at(w[i], j) - kTarget);
  });
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int shard_group_size = argc > 1 ? std::atoi(argv[1]) : 0;
  int status = 0;
  {
    Communicator comm = communicator_from_mpi(MPI_COMM_WORLD, {Backend::Host});
    HostStream host_stream;
    Stream stream = host_stream.handle();
    const int steps = 100;
    // [readme:fsdp]
    // FSDP (ZeRO-3): only this rank's shard persists; a unit is gathered when it is used.
    std::vector<ParamSpec> specs = {
        ParamSpec::tensor("embed.weight", {512, 64}), ParamSpec::tensor("block.0.w", {64, 64}),
        ParamSpec::tensor("block.1.w", {64, 64}), ParamSpec::tensor("head.weight", {512, 64})};
    std::vector<FsdpUnit> units = {{"embed", 0, 1}, {"block.0", 1, 1}, {"block.1", 2, 1}, {"head", 3, 1}};
    FsdpOptions o;                               // the Adam options above, plus FSDP's own
    o.shard_group_size = shard_group_size;       // 0: shard over all ranks; k: HSDP, k ranks per shard
    Fsdp opt(comm, specs, units, o);
    // ... write initial weights into this rank's opt.shard_param(i) pieces, then:
    // [readme:end]
    for (int i = 0; i < opt.num_params(); ++i) {
      const ShardView v = opt.shard_param(i);
      for (std::int64_t j = 0; j < v.numel(); ++j)
        v.as<std::uint16_t>()[j] = num::f32_to_bf16(0.01f * ((v.param_offset + j) % 7));
    }
    // [readme:fsdp]
    opt.init_master(stream);
    for (int step = 0; step < steps; ++step) {
      for (int u = 0; u < opt.num_units(); ++u)
        forward(u, opt.wait_param(u, stream), stream);  // gathers unit u (prefetches the next)
      for (int u = opt.num_units() - 1; u >= 0; --u) {
        std::vector<ParamView> w = opt.wait_param(u, stream);  // the last unit stays gathered
        std::vector<GradView> g = opt.grad_slot(u, stream);    // zeroed full gradients of unit u
        backward(u, w, g, stream);
        opt.grad_ready(u, stream);               // reduce-scatters them into this rank's shard
      }
      opt.step(stream);
      opt.zero_grad(stream);
    }
    // [readme:end]
    const double first_loss = losses.front().mean(), last_loss = losses.back().mean();
    const StepScalars sc = opt.read_scalars(stream);
    if (comm.rank() == 0)
      std::printf("readme_fsdp: %d ranks, shard groups of %d (%d replicas), step %lld, loss %.4f -> %.4f\n",
                  comm.size(), opt.shard_size(), opt.replicas(), static_cast<long long>(sc.step), first_loss,
                  last_loss);
    if (!(last_loss < 0.5 * first_loss) || sc.step != steps) status = 1;
  }
  MPI_Finalize();
  return status;
}
