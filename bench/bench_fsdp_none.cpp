// bench_fsdp_none.cpp - bench_fsdp's device half in a build without CUDA
// (bench_fsdp_cuda.cpp takes its place in a CUDA build): Error(Unsupported).
#include "bench_fsdp.hpp"
#include "core/check.hpp"

void shardopt::bench_fsdp::run_device(const Args&, bench::MpiBench&, const std::string&) {
  detail::no_cuda("bench_fsdp's measurements");
}
