// Multi-tensor MXFP8 quantization on the GPU: the batch kernel equals its host twin
// bitwise on all 114 2-D weights of Llama-3.2-1B (1.5B elements) and equals one
// quantize_mxfp8 launch per tensor there; on mixed lists (partial blocks, 1 x 1,
// grouped members contiguous and through member tables, misaligned sources, thousands
// of small tensors so that a grid stride jumps over many tensors) it equals the host
// twin and the oracle, gaps untouched; a captured graph honours the skip flag toggled
// between replays; and the first use of the kernels may happen under capture.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "shardopt/mxfp8.hpp"
#include "unit/test_mxfp8_batch_common.hpp"

namespace {
using namespace shardopt;
using namespace mxfp8_test;

constexpr Backend kCuda = Backend::Cuda;

TensorList mixed(std::uint64_t seed, int small_tensors) {
  std::vector<ListItem> items = mixed_list();
  for (const ListItem& it : many_small_list(small_tensors, static_cast<std::uint32_t>(seed))) items.push_back(it);
  TensorList list(items);
  list.fill_random(seed, 0.01);
  return list;
}

// ------------------------------------------------------------------ first use under capture

// Runs first in this binary: the kernels' first launches (and the launch-geometry
// queries behind them) happen while a stream is being captured.
TEST(Mxfp8BatchGpu, AFirstUseUnderCaptureWorks) {
  const TensorList list = mixed(1, 0);
  ListRun single(kCuda, list), batched(kCuda, list);
  const Mxfp8Batch batch(batched.tensors(list), kCuda);  // built (allocates) before the capture
  cudaStream_t stream;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Stream st = reinterpret_cast<Stream>(stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  single.quantize_each(list, st);
  quantize_mxfp8_batch(batch, nullptr, kCuda, st);
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  const Arenas oracle = list.oracle_arenas();
  const Arenas got_single = single.get(list), got_batch = batched.get(list);
  EXPECT_TRUE(got_single == oracle) << "per-tensor: " << arena_diff(got_single, oracle);
  EXPECT_TRUE(got_batch == oracle) << "batch: " << arena_diff(got_batch, oracle);
  SHARDOPT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SHARDOPT_CUDA_CHECK(cudaGraphDestroy(graph));
  SHARDOPT_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------ kernel == host twin

TEST(Mxfp8BatchGpu, Llama32_1BWeightListKernelEqualsHostTwinAndPerTensorLaunches) {
  TensorList list(model_list(presets::kLlama32_1B));
  ASSERT_EQ(list.size(), 114u);
  ASSERT_EQ(list.numel(), 1498482688 - 2048 * 33);  // every element but the 33 norm weights
  list.fill_random(100, 0.0005);
  ListRun run(kCuda, list);
  const Mxfp8Batch batch(run.tensors(list), kCuda);
  EXPECT_EQ(batch.tiles(), list.tiles());
  EXPECT_GT(batch.grid(), 0);
  EXPECT_LE(batch.grid(), batch.tiles());
  quantize_mxfp8_batch(batch, nullptr, kCuda, nullptr);
  const Arenas gpu = run.get(list);
  const Arenas twin = host_twin(list);
  EXPECT_TRUE(gpu == twin) << "batch kernel vs host twin: " << arena_diff(gpu, twin);
  // One quantize_mxfp8 launch per tensor gives the same bytes.
  run.poison(list);
  run.quantize_each(list);
  const Arenas per_tensor = run.get(list);
  EXPECT_TRUE(per_tensor == gpu) << "per-tensor launches vs batch: " << arena_diff(per_tensor, gpu);
}

TEST(Mxfp8BatchGpu, MixedListsKernelEqualsHostTwinAndOracle) {
  // 0 small tensors: fewer tiles than resident blocks (one tile per block); 3000: a
  // grid stride jumps over hundreds of tensors (the binary search of the entry table).
  for (int small : {0, 3000}) {
    const TensorList list = mixed(10 + small, small);
    ListRun run(kCuda, list);
    const Mxfp8Batch batch(run.tensors(list), kCuda);
    EXPECT_LE(batch.grid(), batch.tiles());
    quantize_mxfp8_batch(batch, nullptr, kCuda, nullptr);
    const Arenas gpu = run.get(list);
    const Arenas twin = host_twin(list);
    EXPECT_TRUE(gpu == twin) << small << " small tensors, kernel vs host twin: " << arena_diff(gpu, twin);
    const Arenas oracle = list.oracle_arenas();
    EXPECT_TRUE(gpu == oracle) << small << " small tensors, kernel vs oracle: " << arena_diff(gpu, oracle);
    // The single-tensor entry point on the same list.
    run.poison(list);
    run.quantize_each(list);
    const Arenas per_tensor = run.get(list);
    EXPECT_TRUE(per_tensor == oracle) << small << " small tensors, per-tensor vs oracle: "
                                      << arena_diff(per_tensor, oracle);
  }
}

// ------------------------------------------------------------------ skip flag (seed 000)

TEST(Mxfp8BatchGpu, EagerSkipFlagWritesNothing) {
  const TensorList list = mixed(20, 100);
  ListRun run(kCuda, list);
  const Mxfp8Batch batch(run.tensors(list), kCuda);
  const DeviceBuffer flag(kCuda, sizeof(std::int32_t));
  const Arenas oracle = list.oracle_arenas();
  for (std::int32_t f : {1, -1, 0}) {
    test::bytes_to_device(kCuda, flag.data(), &f, sizeof f);
    run.poison(list);
    quantize_mxfp8_batch(batch, flag.as<std::int32_t>(), kCuda, nullptr);
    const Arenas got = run.get(list);
    if (f != 0) {
      EXPECT_TRUE(got == list.poisoned_arenas()) << "flag " << f << ": " << arena_diff(got, list.poisoned_arenas());
    } else {
      EXPECT_TRUE(got == oracle) << "flag 0: " << arena_diff(got, oracle);
    }
  }
}

TEST(Mxfp8BatchGpu, GraphReplayWritesOnlyWhileTheSkipFlagIsClear) {
  // One captured launch for the whole list; the flag is toggled between replays and the
  // weights change in place, never re-captured.
  TensorList list = mixed(30, 200);
  ListRun run(kCuda, list);
  const Mxfp8Batch batch(run.tensors(list), kCuda);
  const DeviceBuffer flag(kCuda, sizeof(std::int32_t));
  auto set_flag = [&](std::int32_t v) { test::bytes_to_device(kCuda, flag.data(), &v, sizeof v); };
  set_flag(1);  // the value at capture time must not matter
  cudaStream_t stream;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  quantize_mxfp8_batch(batch, flag.as<std::int32_t>(), kCuda, reinterpret_cast<Stream>(stream));
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  std::size_t nodes = 0;
  SHARDOPT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, 1u) << "one kernel node for the whole list";
  SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  auto replay = [&] {
    SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  replay();  // flag 1: nothing
  EXPECT_TRUE(run.get(list) == list.poisoned_arenas()) << "flag set at capture and at replay";
  set_flag(0);
  replay();
  const Arenas first = list.oracle_arenas();
  Arenas got = run.get(list);
  EXPECT_TRUE(got == first) << "flag clear: " << arena_diff(got, first);
  list.fill_random(31, 0.01);  // new weights in the same device buffers
  run.upload_sources(list);
  set_flag(1);
  replay();  // a later microbatch: keep the old quantization
  got = run.get(list);
  EXPECT_TRUE(got == first) << "flag set again: " << arena_diff(got, first);
  set_flag(0);
  replay();
  const Arenas second = list.oracle_arenas();
  EXPECT_FALSE(second == first);
  got = run.get(list);
  EXPECT_TRUE(got == second) << "flag clear again: " << arena_diff(got, second);
  SHARDOPT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SHARDOPT_CUDA_CHECK(cudaGraphDestroy(graph));
  SHARDOPT_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
