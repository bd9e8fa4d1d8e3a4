// bench_adam_none.cpp - bench_adam's device half in a build without CUDA
// (bench_adam_cuda.cpp takes its place in a CUDA build): exit code 77, "skipped".
#include <cstdio>

#include "bench_adam.hpp"

int shardopt::bench_adam::run_device(const Options&) {
  std::fprintf(stderr, "bench_adam: no CUDA in this build; run with --backend host --small\n");
  return 77;
}
