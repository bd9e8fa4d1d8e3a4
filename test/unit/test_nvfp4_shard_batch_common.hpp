// test_nvfp4_shard_batch_common.hpp - the sharded NVFP4 protocol over many tensors with
// Nvfp4ShardBatch, simulated over W ranks on a backend, checked on every rank against
// the per-tensor calls; shared by the host suite (test/unit/test_nvfp4_shard_batch.cpp)
// and the GPU suite (test/gpu/test_nvfp4_gpu.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/device_copy.hpp"
#include "core/memory.hpp"
#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_common.hpp"

namespace nvfp4_test {

/// One tensor of a simulated batch: its shape, fp32 master and the W + 1 bounds of the
/// ranks' ranges (every tensor of a batch has the same W).
struct ShardCase {
  shardopt::Nvfp4Shape shape;
  std::vector<float> master;
  std::vector<std::int64_t> bounds;
};

/// The buffers of one tensor on one rank: the batch's and the per-tensor calls', poisoned.
struct RankTensor {
  shardopt::DeviceBuffer amax, call_amax;
  DevicePlanes out, call_out;
  RankTensor(shardopt::Backend b, const shardopt::Nvfp4Shape& s)
      : amax(upload(b, std::vector<std::uint32_t>(static_cast<std::size_t>(s.amax_numel()), kPoisonWord))),
        call_amax(upload(b, std::vector<std::uint32_t>(static_cast<std::size_t>(s.amax_numel()), kPoisonWord))),
        out(b, s),
        call_out(b, s) {}
};

/// Simulates W ranks running the protocol over all `cases` on backend `b`: on every rank
/// an Nvfp4ShardBatch of its ranges, phase 1 (nvfp4_partial_amax_batch), the u32 Max
/// all-reduce per tensor (written back into every rank's amax buffers), phase 2
/// (quantize_nvfp4_shard_batch), the data bytes gathered with a bitwise OR. Next to the
/// batch, every rank makes the per-tensor calls into their own buffers; appends to
/// `problems` every buffer in which the two differ (poison included: a stray write shows)
/// and scales that differ between ranks. Returns the assembled tensors.
inline std::vector<nvfp4_ref::Quantized> simulate_batch(shardopt::Backend b, const std::vector<ShardCase>& cases,
                                                        std::string* problems) {
  using namespace shardopt;
  const int world = static_cast<int>(cases.front().bounds.size()) - 1;
  std::vector<DeviceBuffer> masters;
  for (const ShardCase& c : cases) masters.push_back(upload(b, c.master));
  auto range_of = [&](std::size_t t, int r) {
    const auto& bounds = cases[t].bounds;
    return Range{bounds[static_cast<std::size_t>(r)], bounds[static_cast<std::size_t>(r) + 1]};
  };
  auto what = [](int r, std::size_t t) { return "rank " + std::to_string(r) + " tensor " + std::to_string(t); };

  // Phase 1 on every rank, batch and per-tensor calls.
  std::vector<std::vector<std::unique_ptr<RankTensor>>> ranks(static_cast<std::size_t>(world));
  std::vector<std::unique_ptr<Nvfp4ShardBatch>> batches;
  std::vector<std::vector<std::vector<std::uint32_t>>> partial(cases.size());
  for (int r = 0; r < world; ++r) {
    auto& mine = ranks[static_cast<std::size_t>(r)];
    std::vector<Nvfp4ShardTensor> tensors;
    for (std::size_t t = 0; t < cases.size(); ++t) {
      const Range range = range_of(t, r);
      mine.push_back(std::make_unique<RankTensor>(b, cases[t].shape));
      const RankTensor& m = *mine.back();
      const float* master = range.size() > 0 ? masters[t].as<float>() + range.begin : nullptr;
      tensors.push_back({cases[t].shape, range, master, m.amax.as<std::uint32_t>(), m.out.shard_planes(range)});
      nvfp4_partial_amax(cases[t].shape, range, master, m.call_amax.as<std::uint32_t>(), b, nullptr);
    }
    batches.push_back(std::make_unique<Nvfp4ShardBatch>(tensors, b));
    nvfp4_partial_amax_batch(*batches.back(), b, nullptr);
    for (std::size_t t = 0; t < cases.size(); ++t) {
      const auto n = static_cast<std::size_t>(cases[t].shape.amax_numel());
      const auto got = download<std::uint32_t>(b, mine[t]->amax, n);
      if (got != download<std::uint32_t>(b, mine[t]->call_amax, n))
        *problems += what(r, t) + ": phase 1 of the batch differs from nvfp4_partial_amax; ";
      partial[t].push_back(got);
    }
  }

  // The all-reduce, then phase 2 on every rank.
  std::vector<nvfp4_ref::Quantized> out(cases.size());
  for (std::size_t t = 0; t < cases.size(); ++t) {
    const auto combined = mxfp8_test::all_reduce_max(partial[t]);
    const std::size_t bytes = combined.size() * sizeof(std::uint32_t);
    for (int r = 0; r < world; ++r) {
      const RankTensor& m = *ranks[static_cast<std::size_t>(r)][t];
      shardopt::test::bytes_to_device(b, m.amax.data(), combined.data(), bytes);
      shardopt::test::bytes_to_device(b, m.call_amax.data(), combined.data(), bytes);
    }
    out[t].data.assign(static_cast<std::size_t>(cases[t].shape.data_bytes()), 0);
  }
  for (int r = 0; r < world; ++r) {
    quantize_nvfp4_shard_batch(*batches[static_cast<std::size_t>(r)], b, nullptr);
    for (std::size_t t = 0; t < cases.size(); ++t) {
      const Nvfp4Shape& s = cases[t].shape;
      const Range range = range_of(t, r), span = nvfp4_shard_bytes(range);
      const RankTensor& m = *ranks[static_cast<std::size_t>(r)][t];
      const float* master = range.size() > 0 ? masters[t].as<float>() + range.begin : nullptr;
      quantize_nvfp4_shard(s, range, master, m.call_amax.as<std::uint32_t>(), m.call_out.shard_planes(range), b,
                           nullptr);
      const nvfp4_ref::Quantized q = m.out.get(b, s);
      if (!(q == m.call_out.get(b, s)))
        *problems += what(r, t) + ": phase 2 of the batch differs from quantize_nvfp4_shard; ";
      if (r == 0) {
        out[t].scale = q.scale;
        out[t].amax = q.amax;
        out[t].decode_scale = q.decode_scale;
      } else if (q.scale != out[t].scale || q.amax != out[t].amax || q.decode_scale != out[t].decode_scale) {
        *problems += what(r, t) + ": other scales than rank 0; ";
      }
      for (std::int64_t k = span.begin; k < span.end; ++k)
        out[t].data[static_cast<std::size_t>(k)] |= q.data[static_cast<std::size_t>(k)];
    }
  }
  return out;
}

}  // namespace nvfp4_test
