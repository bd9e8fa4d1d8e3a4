// nvfp4_batch.cpp - multi-tensor NVFP4 quantization: the Nvfp4Batch table (checks,
// upload) and quantize_nvfp4_batch (the CUDA launches or the host twin, enqueued on the
// HostStream so that it joins captures).
#include <string>
#include <vector>

#include "core/check.hpp"
#include "kernels/common/entry_table.hpp"
#include "kernels/nvfp4/nvfp4_checks.hpp"
#include "kernels/nvfp4/nvfp4_launch.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/nvfp4.hpp"

namespace shardopt {

struct Nvfp4Batch::Impl {
  detail::EntryTable table;  // the QuantizeEntry of every tensor, in order
  std::int64_t numel = 0;
  nvfp4::QuantizeUnits units;  // of all tensors
};

namespace {

constexpr const char* kType = "Nvfp4Batch";

// The batch's state (detail::live_batch: a moved-from batch has none).
template <class ImplPtr>
const auto& live(const ImplPtr& impl) { return detail::live_batch(impl, kType); }

}  // namespace

Nvfp4Batch::Nvfp4Batch(const std::vector<Nvfp4Tensor>& tensors, Backend backend) : impl_(std::make_unique<Impl>()) {
  SHARDOPT_REQUIRE(!tensors.empty(), ErrorCode::InvalidArgument,
                   "Nvfp4Batch of an empty tensor list; give it at least one tensor to quantize");
  SHARDOPT_REQUIRE(tensors.size() <= 0x7FFFFFFF, ErrorCode::InvalidArgument,
                   "Nvfp4Batch of more than 2^31 - 1 tensors; split the list into several batches");
  if (backend == Backend::Cuda && !cuda_compiled()) detail::no_cuda("Nvfp4Batch");
  Impl& im = *impl_;
  std::vector<nvfp4::QuantizeEntry> entries;
  entries.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Nvfp4Tensor& t = tensors[i];
    try {
      validate(t.shape);
      nvfp4::require_ptr(t.src, "the bf16 source");
      nvfp4::require_planes(t.out);
    } catch (const Error& e) {
      throw Error(e.code(), "Nvfp4Batch tensor " + std::to_string(i) + ": " + e.what());
    }
    entries.push_back(nvfp4::make_quantize_entry(t.shape, t.src, t.out, im.units));
    im.units = nvfp4::units_after(entries.back());
    im.numel += t.shape.numel();
  }
  im.table = detail::EntryTable(backend, entries);
}

Nvfp4Batch::~Nvfp4Batch() = default;
Nvfp4Batch::Nvfp4Batch(Nvfp4Batch&&) noexcept = default;
Nvfp4Batch& Nvfp4Batch::operator=(Nvfp4Batch&&) noexcept = default;

Backend Nvfp4Batch::backend() const { return live(impl_).table.backend(); }
std::size_t Nvfp4Batch::size() const { return static_cast<std::size_t>(live(impl_).table.count()); }
std::int64_t Nvfp4Batch::numel() const { return live(impl_).numel; }

void quantize_nvfp4_batch(const Nvfp4Batch& batch, const std::int32_t* skip_flag, Backend backend, Stream stream) {
  const auto& im = detail::batch_for_call(batch.impl_, kType, backend, "quantize_nvfp4_batch");
  const auto* entries = im.table.entries<nvfp4::QuantizeEntry>();
  const int count = im.table.count();
  if (backend == Backend::Host) {
    // The flag, the table and the sources are read when the work runs (a replay reads them then).
    host_enqueue(stream, [entries, count, skip_flag] {
      if (skip_flag == nullptr || *skip_flag == 0) nvfp4::host_quantize(entries, count);
    });
    return;
  }
  nvfp4::launch_quantize(entries, count, nvfp4::QuantizeEntry{}, im.units, skip_flag, stream);
}

}  // namespace shardopt
