// The README's DistributedAdam example as a complete program: a toy model (every weight
// pulled towards 0.25) trained for 20 steps on the host backend, then saved and loaded.
//   mpiexec -n 2 build/examples/readme/readme_dist_adam CKPT_DIR
// The lines between the [readme:dist_adam] and [readme:end] markers are the README's code,
// verbatim (examples/readme/check_readme_code.py, test readme_code_excerpts).
// [readme:dist_adam]
#include <shardopt/mpi.hpp>       // communicator_from_mpi (needs <mpi.h>)
#include <shardopt/shardopt.hpp>  // everything else

using namespace shardopt;

// [readme:end]

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

constexpr float kTarget = 0.25f;

float bf16_at(const TensorView& v, std::int64_t j) { return num::bf16_to_f32(v.as<std::uint16_t>()[j]); }

// Mean of (w - 0.25)^2 over every weight.
double toy_loss(const std::vector<ParamView>& w) {
  double sum = 0.0;
  std::int64_t n = 0;
  for (const ParamView& v : w)
    for (std::int64_t j = 0; j < v.numel(); ++j, ++n) sum += std::pow(bf16_at(v, j) - kTarget, 2);
  return sum / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const std::string ckpt_dir = argc > 1 ? argv[1] : "readme_ckpt";
  std::error_code ec;
  std::filesystem::create_directories(ckpt_dir, ec);  // save creates the last level only
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int status = 0;
  {
    // [readme:dist_adam]
    // Register parameters in forward order; every rank computes the same layout.
    std::vector<ParamSpec> specs = {
        ParamSpec::tensor("embed.weight", {512, 64}),
        ParamSpec::tensor("norm.weight", {64}, DType::bf16, "no_decay"),
        ParamSpec::grouped("moe.experts", /*members=*/4, {128, 64}),  // one tensor, 4 views
    };
    Communicator comm = communicator_from_mpi(MPI_COMM_WORLD, {Backend::Host});  // default: Cuda, NCCL
    HostStream host_stream;                      // on GPUs: your cudaStream_t instead
    Stream stream = host_stream.handle();
    DistributedAdamOptions o;
    o.grad_dtype = DType::bf16;                  // decoupled bf16 grads, read directly by Adam
    o.clip_max_norm = 1.0f;
    o.groups["decay"] = AdamGroup{0.1, 1.0};     // weight decay, lr multiplier
    o.lr_schedule = LrSchedule::warmup_cosine(1e-2f, 1e-3f, 5, 100);  // on the device
    o.microbatches = 4;
    DistributedAdam opt(comm, specs, o);         // checks that all ranks agree on the layout
    std::vector<ParamView> w;                    // persistent views (pointer, shape, dtype):
    std::vector<GradView> g;                     // backward accumulates into g (beta = 1 GEMMs)
    for (int i = 0; i < opt.num_params(); ++i) { w.push_back(opt.param(i)); g.push_back(opt.grad(i)); }
    // ... write initial weights into the param views, then:
    // [readme:end]
    for (const ParamView& v : w)
      for (std::int64_t j = 0; j < v.numel(); ++j) v.as<std::uint16_t>()[j] = num::f32_to_bf16(0.01f * (j % 7));
    // The toy forward + backward of one microbatch: the gradient of the mean over the
    // microbatches of 0.5 (w - 0.25)^2, added into the grad views. Enqueued on the stream
    // (host_enqueue) so that a capture records it, as a CUDA capture records kernels.
    auto forward_backward = [&](Stream s, const MicrobatchState* /*read inside kernels*/) {
      host_enqueue(s, [&] {
        for (std::size_t i = 0; i < w.size(); ++i)
          for (std::int64_t j = 0; j < w[i].numel(); ++j) {
            auto& gj = g[i].as<std::uint16_t>()[j];
            gj = num::f32_to_bf16(num::bf16_to_f32(gj) + (bf16_at(w[i], j) - kTarget) / o.microbatches);
          }
      });
    };
    const double first_loss = toy_loss(w);
    const int steps = 20;
    // [readme:dist_adam]
    opt.init_master(stream);
    // Capture one iteration (microbatches, step, zero_grad) and replay it every step.
    StepGraph graph(opt, [&](Stream s, bool last) {
      forward_backward(s, opt.device_microbatch());   // read per-microbatch flags on the device
      if (last) for (int i = opt.num_params() - 1; i >= 0; --i) opt.grad_ready(i, s);
    });
    graph.capture(stream);                       // runs one warm-up iteration first
    for (int step = 1; step < steps; ++step) graph.replay(stream);
    StepScalars scalars = opt.read_scalars(stream);  // step, lr, grad norm, found-inf

    opt.save(ckpt_dir + "/step-20", stream, {{"data_position", "123456"}});  // docs/checkpoints.md
    CheckpointInfo ckpt = opt.load(ckpt_dir + "/step-20", stream);  // any world size, either front end
    // [readme:end]
    const double last_loss = toy_loss(w);
    if (rank == 0)
      std::printf("readme_dist_adam: %d ranks, step %lld, lr %.3g, grad norm %.3g, loss %.4f -> %.4f, "
                  "loaded step %lld (data_position %s)\n",
                  comm.size(), static_cast<long long>(scalars.step), scalars.lr, scalars.grad_norm, first_loss,
                  last_loss, static_cast<long long>(ckpt.step), ckpt.user["data_position"].c_str());
    if (!(last_loss < 0.5 * first_loss) || scalars.step != steps || ckpt.step != steps) status = 1;
  }
  MPI_Finalize();
  return status;
}
