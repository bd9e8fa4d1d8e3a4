// cuda_bench_none.cpp - cuda_bench.hpp in a build without CUDA (cuda_bench.cu takes its
// place in a CUDA build): every call throws Error(Unsupported); releases have nothing to do.
#include "core/check.hpp"
#include "cuda_bench.hpp"

namespace shardopt::bench {

std::string device_name() { detail::no_cuda("a benchmark's device name"); }
std::string device_name(int) { detail::no_cuda("a benchmark's device name"); }
double time_ms(Stream, int, int, const std::function<void()>&) { detail::no_cuda("a benchmark's timing"); }
CopyBandwidth measure_copy(std::size_t, Stream, int, int) { detail::no_cuda("a benchmark's copy bandwidth"); }
double duplex_copy_ms(Stream, int, std::size_t, std::size_t) { detail::no_cuda("a benchmark's PCIe copy"); }

BandwidthBench::BandwidthBench(std::string, int, char**, int, int) { detail::no_cuda("a bandwidth benchmark"); }
BandwidthBench::~BandwidthBench() = default;
double BandwidthBench::time_ms(const std::function<void()>&) const { detail::no_cuda("a benchmark's timing"); }
Result BandwidthBench::result(const std::string&, double, double, std::int64_t) const {
  detail::no_cuda("a bandwidth benchmark");
}

CapturedGraph::CapturedGraph(Stream, const std::function<void()>&) { detail::no_cuda("a benchmark's graph"); }
CapturedGraph::~CapturedGraph() = default;
void CapturedGraph::launch(Stream) const { detail::no_cuda("a benchmark's graph"); }

EventMarks::EventMarks(int) { detail::no_cuda("a benchmark's events"); }
EventMarks::~EventMarks() = default;
void EventMarks::record(int, Stream) { detail::no_cuda("a benchmark's events"); }
double EventMarks::ms(int, int) const { detail::no_cuda("a benchmark's events"); }

void fill_random(void*, DType, std::int64_t, std::uint64_t, float, Stream) { detail::no_cuda("a benchmark's fill"); }
void fill_normal(void*, std::size_t, bool, std::uint32_t) { detail::no_cuda("a benchmark's fill"); }

}  // namespace shardopt::bench
