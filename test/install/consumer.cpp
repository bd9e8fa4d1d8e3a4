// A tiny outside program: only the installed public headers and library, compiled with
// the flags of `pkg-config --cflags --libs shardopt` alone (test_pkgconfig.sh). Under
// mpiexec it trains a toy model for a few steps with distributed Adam over MPI (host
// backend) and checks that the parameters moved. With -DCONSUMER_CUDA (a CUDA build) it
// also calls the CUDA runtime, whose flags shardopt.pc carries too.
#include <shardopt/mpi.hpp>
#include <shardopt/shardopt.hpp>

#ifdef CONSUMER_CUDA
#include <cuda_runtime.h>
#endif

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  using namespace shardopt;
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    const auto specs = presets::transformer({256, 2, 512, 64, 1000});
    Layout layout(specs, 4);
    Communicator comm = communicator_from_mpi(MPI_COMM_WORLD, {Backend::Host});
    const bool talk = comm.rank() == 0;
    if (talk)
      std::printf("consumer: %zu params, %zu buckets at world 4, fingerprint %016llx\n", layout.specs().size(),
                  layout.buckets().size(), static_cast<unsigned long long>(layout.fingerprint()));
#ifdef CONSUMER_CUDA
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (talk) std::printf("consumer: CUDA runtime linked: %d device(s) (%s)\n", devices, cudaGetErrorString(e));
#endif
    DistributedAdamOptions o;
    o.grad_dtype = DType::bf16;
    DistributedAdam opt(comm, specs, o);
    HostStream s;
    for (int i = 0; i < opt.num_params(); ++i) {
      const ParamView p = opt.param(i);
      auto* v = p.as<std::uint16_t>();
      for (std::int64_t j = 0; j < p.numel(); ++j) v[j] = num::f32_to_bf16(0.01f * static_cast<float>(j % 7));
    }
    opt.init_master(s.handle());
    const float before = num::bf16_to_f32(opt.param(0).as<std::uint16_t>()[1]);
    for (int step = 0; step < 3; ++step) {
      for (int i = 0; i < opt.num_params(); ++i) {
        const GradView g = opt.grad(i);
        auto* v = g.as<std::uint16_t>();
        for (std::int64_t j = 0; j < g.numel(); ++j) v[j] = num::f32_to_bf16(0.5f);
      }
      opt.step(s.handle());
      opt.zero_grad(s.handle());
    }
    const float after = num::bf16_to_f32(opt.param(0).as<std::uint16_t>()[1]);
    if (talk)
      std::printf("consumer: %d ranks: param moved %g -> %g after %lld steps\n", comm.size(), before, after,
                  static_cast<long long>(opt.read_scalars(s.handle()).step));
    status = after < before ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
