// bench_dist_adam_none.cpp - bench_dist_adam's device half in a build without CUDA
// (bench_dist_adam_cuda.cpp takes its place in a CUDA build): Error(Unsupported).
#include "bench_dist_adam.hpp"
#include "core/check.hpp"

void shardopt::bench_dist_adam::run_device(const Args&, bench::MpiBench&, const std::string&) {
  detail::no_cuda("bench_dist_adam's measurements");
}
