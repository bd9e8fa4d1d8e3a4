// nvfp4_shard_batch.cpp - a rank's sharded NVFP4 quantization over many tensors: the
// Nvfp4ShardBatch table (the per-tensor checks naming the tensor, upload) and the two
// phase calls (the CUDA launches or the host twins, enqueued on the HostStream so that
// they join captures).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "kernels/common/entry_table.hpp"
#include "kernels/nvfp4/nvfp4_checks.hpp"
#include "kernels/nvfp4/nvfp4_launch.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/nvfp4.hpp"

namespace shardopt {

struct Nvfp4ShardBatch::Impl {
  detail::EntryTable table;  // the ShardEntry of every tensor, in order
  std::int64_t numel = 0;
  nvfp4::ShardUnits units;  // of all tensors
};

namespace {

constexpr const char* kType = "Nvfp4ShardBatch";

// The batch's state (detail::live_batch: a moved-from batch has none).
template <class ImplPtr>
const auto& live(const ImplPtr& impl) { return detail::live_batch(impl, kType); }

}  // namespace

Nvfp4ShardBatch::Nvfp4ShardBatch(const std::vector<Nvfp4ShardTensor>& tensors, Backend backend)
    : impl_(std::make_unique<Impl>()) {
  SHARDOPT_REQUIRE(!tensors.empty(), ErrorCode::InvalidArgument,
                   "Nvfp4ShardBatch of an empty tensor list; give it at least one tensor");
  SHARDOPT_REQUIRE(tensors.size() <= 0x7FFFFFFF, ErrorCode::InvalidArgument,
                   "Nvfp4ShardBatch of more than 2^31 - 1 tensors; split the list into several batches");
  if (backend == Backend::Cuda && !cuda_compiled()) detail::no_cuda("Nvfp4ShardBatch");
  Impl& im = *impl_;
  std::vector<nvfp4::ShardEntry> entries;
  entries.reserve(tensors.size());
  std::vector<detail::Extent> written;  // what each tensor's two phases write
  const auto at = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Nvfp4ShardTensor& t = tensors[i];
    try {
      nvfp4::require_shard(t.shape, t.range, t.master, t.amax);
      nvfp4::require_shard_planes(t.out, t.range);
    } catch (const Error& e) {
      throw Error(e.code(), "Nvfp4ShardBatch tensor " + std::to_string(i) + ": " + e.what());
    }
    const auto amax_bytes = static_cast<std::uintptr_t>(t.shape.amax_numel()) * sizeof(std::uint32_t);
    written.push_back({at(t.amax), at(t.amax) + amax_bytes, i, "amax buffer"});
    written.push_back({at(t.out.scale), at(t.out.scale) + static_cast<std::uintptr_t>(t.shape.scale_numel()), i,
                       "scales"});
    written.push_back({at(t.out.amax), at(t.out.amax) + sizeof(float), i, "out.amax"});
    written.push_back({at(t.out.decode_scale), at(t.out.decode_scale) + sizeof(float), i, "out.decode_scale"});
    const auto span = static_cast<std::uintptr_t>(nvfp4_shard_bytes(t.range).size());
    if (span > 0) written.push_back({at(t.out.data), at(t.out.data) + span, i, "data of its range"});
    entries.push_back(nvfp4::make_shard_entry(t.shape, t.range, t.master, t.amax, t.out, im.units));
    im.units = nvfp4::units_after(entries.back());
    im.numel += t.range.size();
  }
  detail::require_disjoint(std::move(written), kType);
  im.table = detail::EntryTable(backend, entries);
}

Nvfp4ShardBatch::~Nvfp4ShardBatch() = default;
Nvfp4ShardBatch::Nvfp4ShardBatch(Nvfp4ShardBatch&&) noexcept = default;
Nvfp4ShardBatch& Nvfp4ShardBatch::operator=(Nvfp4ShardBatch&&) noexcept = default;

Backend Nvfp4ShardBatch::backend() const { return live(impl_).table.backend(); }
std::size_t Nvfp4ShardBatch::size() const { return static_cast<std::size_t>(live(impl_).table.count()); }
std::int64_t Nvfp4ShardBatch::numel() const { return live(impl_).numel; }

void nvfp4_partial_amax_batch(const Nvfp4ShardBatch& batch, Backend backend, Stream stream) {
  const auto& im = detail::batch_for_call(batch.impl_, kType, backend, "nvfp4_partial_amax_batch");
  const auto* entries = im.table.entries<nvfp4::ShardEntry>();
  const int count = im.table.count();
  if (backend == Backend::Host) {
    // The table and the masters are read when the work runs (a replay reads them then).
    host_enqueue(stream, [entries, count] { nvfp4::host_partial_amax(entries, count); });
    return;
  }
  nvfp4::launch_partial_amax(entries, count, nvfp4::ShardEntry{}, im.units, stream);
}

void quantize_nvfp4_shard_batch(const Nvfp4ShardBatch& batch, Backend backend, Stream stream) {
  const auto& im = detail::batch_for_call(batch.impl_, kType, backend, "quantize_nvfp4_shard_batch");
  const auto* entries = im.table.entries<nvfp4::ShardEntry>();
  const int count = im.table.count();
  if (backend == Backend::Host) {
    host_enqueue(stream, [entries, count] { nvfp4::host_quantize_shard(entries, count); });
    return;
  }
  nvfp4::launch_quantize_shard(entries, count, nvfp4::ShardEntry{}, im.units, stream);
}

}  // namespace shardopt
