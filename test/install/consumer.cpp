// A tiny outside program: only the installed public headers and library. It trains a
// toy model for a few steps with distributed Adam on a one-rank group and checks that
// the parameters moved.
#include <shardopt/shardopt.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  using namespace shardopt;
  const auto specs = presets::transformer({256, 2, 512, 64, 1000});
  Layout layout(specs, 4);
  std::printf("consumer: %zu params, %zu buckets at world 4, fingerprint %016llx\n", layout.specs().size(),
              layout.buckets().size(), static_cast<unsigned long long>(layout.fingerprint()));
  DistributedAdamOptions o;
  o.grad_dtype = DType::bf16;
  DistributedAdam opt(Communicator::self(Backend::Host), specs, o);
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
  std::printf("consumer: param moved %g -> %g after %lld steps\n", before, after,
              static_cast<long long>(opt.read_scalars(s.handle()).step));
  return after < before ? 0 : 1;
}
