// The offload's stages (optimizer/state_offload.hpp) on the host backend: a stage moves
// its bucket's state only outside the Muon pieces, whose masters Muon's pass updates in
// place in the host arrays while the stages stream (on a GPU, concurrently with their
// downloads), and whose moment slots hold nothing (not worth PCIe's time). The host
// schedule runs in order, so the test itself writes what Muon's pass would, between the
// stages' upload (begin) and their download (run): the downloads must leave it there, and
// bring every AdamW element back as it went up.
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "optimizer/state_offload.hpp"
#include "shardopt/shardopt.hpp"

namespace {
using namespace shardopt;

TEST(StateOffload, StagesMoveNothingOfAMuonPiece) {
  const std::vector<ParamSpec> specs{ParamSpec::tensor("a", {300}, DType::bf16, "adam"),
                                     ParamSpec::tensor("w", {16, 24}, DType::bf16, "muon"),
                                     ParamSpec::tensor("b", {100}, DType::bf16, "adam")};
  LayoutOptions lo;
  lo.bucket_numel = 1 << 20;  // one bucket, cut into stages of 256 elements
  const Layout L(specs, 1, lo);
  ASSERT_EQ(L.buffers().size(), 1u);
  const std::vector<bool> offloaded = detail::offloaded_buckets(L, 1.0);
  std::vector<ShardChunk> chunks;  // AdamW's (shard order)
  detail::StateOffload::BufferInfo info;
  info.chunks = &chunks;
  const int muon_group = static_cast<int>(std::find(L.groups().begin(), L.groups().end(), "muon") - L.groups().begin());
  for (const Segment& seg : L.segments(0, 0)) {
    if (seg.group == muon_group) {
      info.muon_ranges.emplace_back(seg.shard_offset, seg.shard_offset + seg.length);
    } else {
      chunks.push_back(ShardChunk{seg.shard_offset, L.params()[static_cast<std::size_t>(seg.param)].offset + seg.param_offset,
                                  seg.length, seg.group, 0, 0});
    }
  }
  ASSERT_EQ(info.muon_ranges.size(), 1u);
  const std::int64_t n = L.buffers()[0].numel;
  ASSERT_LE(n, 4 * 256) << "every stage must upload in begin(), before the test writes Muon's part";
  detail::StateOffload off(Backend::Host, L, offloaded, {info}, DType::f32, 256);
  ASSERT_FALSE(off.failed());
  float* master = off.host(0).master;
  auto* exp_avg = static_cast<float*>(off.host(0).exp_avg);
  ASSERT_NE(master, nullptr);
  ASSERT_EQ(off.host(0).begin, 0);
  for (std::int64_t i = 0; i < n; ++i) master[i] = exp_avg[i] = static_cast<float>(i);

  AdamConfig config;
  config.groups.assign(L.groups().size(), AdamGroup{});
  DeviceBuffer grads(Backend::Host, static_cast<std::size_t>(n) * sizeof(float));
  DeviceBuffer params(Backend::Host, static_cast<std::size_t>(n) * sizeof(std::uint16_t));
  DeviceBuffer scalars(Backend::Host, sizeof(StepScalars));
  StepScalars skipped{};
  skipped.found_inf = 1;  // Adam leaves the slots as they came: the downloads return the uploads
  *scalars.as<StepScalars>() = skipped;
  off.bind(0, &config, grads.data(), params.data());

  off.begin(nullptr);
  const auto [mb, me] = info.muon_ranges[0];
  for (std::int64_t i = mb; i < me; ++i) master[i] = exp_avg[i] = -1.0f;  // Muon's pass, in place; a slot unused
  off.run(nullptr, scalars.as<StepScalars>());
  off.finish(nullptr);
  for (std::int64_t i = 0; i < n; ++i) {
    const bool muon = i >= mb && i < me;
    ASSERT_EQ(master[i], muon ? -1.0f : static_cast<float>(i)) << "master " << i << (muon ? " (Muon's)" : "");
    ASSERT_EQ(exp_avg[i], muon ? -1.0f : static_cast<float>(i)) << "exp_avg " << i << (muon ? " (Muon's)" : "");
  }
}

}  // namespace
