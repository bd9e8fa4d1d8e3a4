// layout_report: the placement of a Llama-3.2-1B-shaped model at several world sizes
// (buckets, padding, bytes per rank by category for distributed Adam).
//
// Usage: layout_report [world sizes...]   (default: 1 2 4 8)
#include <shardopt/shardopt.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {
double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }
}  // namespace

int main(int argc, char** argv) {
  std::vector<int> worlds;
  for (int i = 1; i < argc; ++i) worlds.push_back(std::atoi(argv[i]));
  if (worlds.empty()) worlds = {1, 2, 4, 8};
  const auto specs = shardopt::presets::transformer(shardopt::presets::kLlama32_1B, shardopt::DType::bf16);
  std::int64_t real = 0;
  for (const auto& s : specs) real += shardopt::numel(s.shape);
  std::printf("Llama-3.2-1B-shaped model: %zu tensors, %lld parameters, bf16 params\n", specs.size(),
              static_cast<long long>(real));
  std::printf("distributed Adam, fp32 main grads (anchor: 6 + 12/d bytes/param) and bf16 grads (4 + 12/d)\n\n");
  std::printf("%5s %8s %14s %9s %10s %10s %10s %10s %10s %10s\n", "world", "buckets", "padded elems", "padding%",
              "params GiB", "grads32", "master", "moments", "total(f32)", "B/param");
  for (int w : worlds) {
    try {
      shardopt::Layout L(specs, w);
      const double n = static_cast<double>(L.total_numel());
      const double params = 2 * n, grads32 = 4 * n, master = 4 * n / w, moments = 8 * n / w;
      const double total = params + grads32 + master + moments;
      std::printf("%5d %8zu %14lld %8.4f%% %10.3f %10.3f %10.3f %10.3f %10.3f %10.4f\n", w, L.buckets().size(),
                  static_cast<long long>(L.total_numel()), 100.0 * static_cast<double>(L.padding_numel()) / n,
                  gib(params), gib(grads32), gib(master), gib(moments), gib(total),
                  total / static_cast<double>(real));
    } catch (const shardopt::Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
  }
  std::printf("\n(B/param includes padding; the formula 6 + 12/d assumes none)\n");
  return 0;
}
