// A tiny outside program: only the installed public headers and library.
#include <shardopt/shardopt.hpp>

#include <cstdio>

int main() {
  auto specs = shardopt::presets::transformer({256, 2, 512, 64, 1000});
  shardopt::Layout layout(specs, 4);
  std::printf("consumer: %zu params, %zu buckets, fingerprint %016llx, backend %s\n", layout.specs().size(),
              layout.buckets().size(), static_cast<unsigned long long>(layout.fingerprint()),
              shardopt::to_string(shardopt::default_backend()));
  return layout.param_numel() > 0 ? 0 : 1;
}
