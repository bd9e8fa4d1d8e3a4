// Multi-tensor MXFP8 quantization on the host backend (the host twin of the batch
// kernel): quantize_mxfp8_batch over a list of mixed shapes (partial blocks, 1 x 1,
// grouped members contiguous and through member tables, misaligned sources) and over a
// small model's weight list equals, byte for byte over the whole arenas (gaps
// included), both one quantize_mxfp8 call per tensor and the independent oracle; the
// skip flag leaves poisoned outputs untouched; a captured HostStream reads the flag
// and the sources at replay; bad lists are rejected with messages that say what to do.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/mxfp8.hpp"
#include "unit/test_mxfp8_batch_common.hpp"

namespace {
using namespace shardopt;
using namespace mxfp8_test;

constexpr Backend kHost = Backend::Host;

// Host arenas of a list (the host backend's "device" memory is host memory).
struct HostRun {
  const TensorList& list;
  Arenas out;
  explicit HostRun(const TensorList& l) : list(l), out(l.poisoned_arenas()) {}
  std::vector<Mxfp8Tensor> tensors() {
    return list.tensors(list.src.data(), out.data_row.data(), out.data_col.data(), out.scale_row.data(),
                        out.scale_col.data(), list.member_arena.data());
  }
};

// One quantize_mxfp8 call per tensor of the list, on the host backend.
Arenas per_tensor(const TensorList& list) {
  HostRun run(list);
  for (const Mxfp8Tensor& t : run.tensors()) quantize_mxfp8(t.shape, t.src, t.out, nullptr, kHost, nullptr, t.members);
  return run.out;
}

Arenas batched(const TensorList& list, const std::int32_t* flag = nullptr) {
  HostRun run(list);
  const Mxfp8Batch batch(run.tensors(), kHost);
  quantize_mxfp8_batch(batch, flag, kHost, nullptr);
  return run.out;
}

TensorList mixed(std::uint64_t seed, int small_tensors = 60) {
  std::vector<ListItem> items = mixed_list();
  for (const ListItem& it : many_small_list(small_tensors, static_cast<std::uint32_t>(seed))) items.push_back(it);
  TensorList list(items);
  list.fill_random(seed, 0.01);
  return list;
}

TEST(Mxfp8Batch, MixedListEqualsPerTensorQuantizeAndOracle) {
  const TensorList list = mixed(1);
  const Arenas got = batched(list);
  const Arenas want = per_tensor(list);
  EXPECT_TRUE(got == want) << "batch vs per-tensor: " << arena_diff(got, want);
  const Arenas oracle = list.oracle_arenas();
  EXPECT_TRUE(got == oracle) << "batch vs oracle: " << arena_diff(got, oracle);
  // Sensitivity: the source gaps hold NaN and the outputs start poisoned, so the oracle
  // arenas are not trivially the poisoned ones.
  EXPECT_FALSE(oracle == list.poisoned_arenas());
}

TEST(Mxfp8Batch, SmallModelWeightListEqualsPerTensorQuantizeAndOracle) {
  // A Llama-like list whose widths are no multiples of 32 or 128 (partial blocks and
  // tiles everywhere), in registration order like the optimizer's.
  const presets::TransformerShape shape{200, 2, 520, 40, 1001};
  TensorList list(model_list(shape));
  ASSERT_EQ(list.size(), 2u * 7 + 2);
  list.fill_random(2, 0.001);
  const Arenas got = batched(list);
  const Arenas want = per_tensor(list);
  EXPECT_TRUE(got == want) << arena_diff(got, want);
  const Arenas oracle = list.oracle_arenas();
  EXPECT_TRUE(got == oracle) << arena_diff(got, oracle);
}

TEST(Mxfp8Batch, AccessorsCountTensorsElementsAndTiles) {
  const TensorList list = mixed(3);
  HostRun run(list);
  Mxfp8Batch batch(run.tensors(), kHost);
  EXPECT_EQ(batch.backend(), kHost);
  EXPECT_EQ(batch.size(), list.size());
  EXPECT_EQ(batch.numel(), list.numel());
  EXPECT_EQ(batch.tiles(), list.tiles());
  EXPECT_EQ(batch.grid(), 0);
  // A moved batch keeps its table; the moved-from one refuses to work.
  Mxfp8Batch moved = std::move(batch);
  EXPECT_EQ(moved.size(), list.size());
  quantize_mxfp8_batch(moved, nullptr, kHost, nullptr);
  EXPECT_TRUE(run.out == list.oracle_arenas());
  try {
    quantize_mxfp8_batch(batch, nullptr, kHost, nullptr);
    FAIL() << "a moved-from batch was used";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidState);
    EXPECT_NE(std::string(e.what()).find("moved"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ skip flag (seed 000)

TEST(Mxfp8Batch, SkipFlagLeavesPoisonedOutputsUntouched) {
  const TensorList list = mixed(4);
  const Arenas oracle = list.oracle_arenas();
  for (std::int32_t flag : {1, 0, 7, -1}) {
    const Arenas got = batched(list, &flag);
    if (flag != 0) {
      EXPECT_TRUE(got == list.poisoned_arenas()) << "flag " << flag << ": " << arena_diff(got, list.poisoned_arenas());
    } else {
      EXPECT_TRUE(got == oracle) << "flag 0: " << arena_diff(got, oracle);
    }
  }
}

TEST(Mxfp8Batch, CapturedBatchReadsTheFlagAndTheSourcesAtReplay) {
  TensorList list = mixed(5);
  HostRun run(list);
  const Mxfp8Batch batch(run.tensors(), kHost);
  std::int32_t flag = 1;  // set at capture time: must not be frozen into the graph
  HostStream stream;
  stream.begin_capture();
  quantize_mxfp8_batch(batch, &flag, kHost, stream.handle());
  const HostGraph graph = stream.end_capture();
  EXPECT_EQ(graph.size(), 1u) << "one recorded operation for the whole list";
  EXPECT_TRUE(run.out == list.poisoned_arenas()) << "nothing runs at capture";

  flag = 0;  // first microbatch: quantize
  graph.replay();
  const Arenas first = list.oracle_arenas();
  EXPECT_TRUE(run.out == first) << "replay, flag clear: " << arena_diff(run.out, first);

  list.fill_random(55, 0.01);  // the weights change in place...
  flag = 1;                    // ...but later microbatches skip
  graph.replay();
  EXPECT_TRUE(run.out == first) << "replay, flag set: " << arena_diff(run.out, first);

  flag = 0;  // next step's first microbatch
  graph.replay();
  const Arenas second = list.oracle_arenas();
  EXPECT_FALSE(second == first);
  EXPECT_TRUE(run.out == second) << "replay, flag clear again: " << arena_diff(run.out, second);
}

// ------------------------------------------------------------------ the GPU suite's harness

// test/gpu/test_mxfp8_batch_gpu.cpp runs these steps with Backend::Cuda (ListRun in
// device memory, the batch kernel against host_twin); here the same harness runs on
// the host backend, so its logic (placements, uploads, the threaded twin, in-place
// poisoning that keeps a built batch valid) is proven without a GPU.
TEST(Mxfp8Batch, GpuSuiteHarnessOnTheHostBackend) {
  for (int small : {0, 300}) {
    const TensorList list = mixed(static_cast<std::uint64_t>(40 + small), small);
    const ListRun run(kHost, list);
    const Mxfp8Batch batch(run.tensors(list), kHost);
    quantize_mxfp8_batch(batch, nullptr, kHost, nullptr);
    const Arenas got = run.get(list);
    const Arenas twin = host_twin(list);
    EXPECT_TRUE(got == twin) << arena_diff(got, twin);
    const Arenas oracle = list.oracle_arenas();
    EXPECT_TRUE(got == oracle) << arena_diff(got, oracle);
    run.poison(list);
    EXPECT_TRUE(run.get(list) == list.poisoned_arenas());
    run.quantize_each(list);
    EXPECT_TRUE(run.get(list) == oracle) << "per tensor: " << arena_diff(run.get(list), oracle);
    run.poison(list);
    const std::int32_t flag = 1;
    quantize_mxfp8_batch(batch, &flag, kHost, nullptr);  // the batch still points at the poisoned buffers
    EXPECT_TRUE(run.get(list) == list.poisoned_arenas());
    quantize_mxfp8_batch(batch, nullptr, kHost, nullptr);
    EXPECT_TRUE(run.get(list) == oracle);
  }
  // The model-list test's shape of work, on a small model.
  TensorList model(model_list(presets::TransformerShape{128, 2, 384, 64, 700}));
  model.fill_random(7, 0.0005);
  const ListRun run(kHost, model);
  const Mxfp8Batch batch(run.tensors(model), kHost);
  EXPECT_EQ(batch.tiles(), model.tiles());
  quantize_mxfp8_batch(batch, nullptr, kHost, nullptr);
  const Arenas got = run.get(model);
  EXPECT_TRUE(got == host_twin(model));
  EXPECT_TRUE(got == model.oracle_arenas());
}

// ------------------------------------------------------------------ errors

TEST(Mxfp8Batch, BadListsSayWhatToChange) {
  const TensorList list = mixed(6);
  HostRun run(list);
  const auto good = run.tensors();
  auto expect_error = [](const std::vector<Mxfp8Tensor>& tensors, ErrorCode code,
                         const std::vector<std::string>& words) {
    try {
      const Mxfp8Batch batch(tensors, kHost);
      ADD_FAILURE() << "accepted a bad list";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      for (const std::string& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  };
  expect_error({}, ErrorCode::InvalidArgument, {"empty", "at least one tensor"});
  auto bad = good;
  bad[2].src = nullptr;
  expect_error(bad, ErrorCode::InvalidArgument, {"tensor 2", "source"});
  bad = good;
  bad[5].out.scale_col = nullptr;
  expect_error(bad, ErrorCode::InvalidArgument, {"tensor 5", "scale_col"});
  bad = good;
  bad[1].shape.rows = 0;
  expect_error(bad, ErrorCode::InvalidArgument, {"tensor 1", "dimension"});
  bad = good;
  bad[3].shape.members = -2;
  expect_error(bad, ErrorCode::InvalidArgument, {"tensor 3"});
  // Shapes past the kernels' 32-bit tile and column counters (checked before any access).
  bad = good;
  bad[0].shape.members = 1;
  bad[0].shape.rows = 1;
  bad[0].shape.cols = std::int64_t{1} << 31;
  expect_error(bad, ErrorCode::InvalidArgument, {"2^31 - 1 columns"});
  bad[0].shape.rows = std::int64_t{1} << 36;  // 2^31 tile rows of one 128-column tile
  bad[0].shape.cols = 128;
  expect_error(bad, ErrorCode::InvalidArgument, {"2^31 - 1 tiles"});
  // A batch runs on the backend it was built for.
  const Mxfp8Batch batch(good, kHost);
  try {
    quantize_mxfp8_batch(batch, nullptr, Backend::Cuda, nullptr);
    FAIL() << "a host batch ran on the CUDA backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Backend::host"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(run.out == list.poisoned_arenas()) << "a rejected call wrote something";
}

}  // namespace
