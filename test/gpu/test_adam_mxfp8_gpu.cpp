// The fused Adam step of MXFP8 shards (issue 29) on a GPU: the fused kernel
// (AdamMxfp8Pass: Adam over the owned tile rows and their quantization from registers)
// against today's composition (adam_step_apply over every chunk, then
// quantize_mxfp8_shard_owned_batch), bitwise in every output, at 1-8 simulated ranks
// with boundaries that cut tiles and bands, every gradient / moment dtype, Adam and
// AdamW, a skipped step; the oracle quantization and Adam in double at one rank; the
// kernel against its host twin; a CUDA graph of the fused step replays like eager calls.
#include <cuda_runtime.h>

#include "core/check.hpp"
#include "unit/test_adam_mxfp8_common.hpp"

namespace {
using shardopt::Backend;
using shardopt::DType;

TEST(AdamMxfp8Gpu, FusedEqualsTodaysCompositionOnEveryRank) {
  std::uint32_t seed = 1;
  for (DType g : {DType::f32, DType::bf16, DType::f16})
    for (DType m : {DType::f32, DType::bf16})
      for (bool decoupled : {true, false})
        for (int world = 1; world <= 8; ++world) {
          adam_mxfp8_test::run_case(Backend::Cuda, world, g, m, decoupled, seed++);
          if (testing::Test::HasFailure()) return;  // one failing case says enough
        }
}

// Compact moments (ShardChunk::moment_shift): the kernel indexes the moments with the
// shift, on the 16-byte path (shift 8) and the element path (shift 5), against today's
// composition at 1-4 ranks (and Adam in double at one).
TEST(AdamMxfp8Gpu, FusedEqualsTodaysCompositionWithMomentShift) {
  std::uint32_t seed = 300;
  for (std::int64_t shift : {8, 5})
    for (DType m : {DType::f32, DType::bf16})
      for (int world = 1; world <= 4; ++world) {
        adam_mxfp8_test::run_case(Backend::Cuda, world, DType::bf16, m, true, seed++, shift);
        if (testing::Test::HasFailure()) return;
      }
}

// One small case for racecheck / synccheck (every path: whole and partial tiles, owned
// and boundary rows, vector and element Adam, a skipped step).
TEST(AdamMxfp8Gpu, SanitizerSized) {
  adam_mxfp8_test::run_case(Backend::Cuda, 3, DType::bf16, DType::f32, true, 77u);
}

TEST(AdamMxfp8Gpu, RefusesBadTables) { adam_mxfp8_test::case_refusals(Backend::Cuda); }

// Every fp32 NaN bit pattern replaced by one (0x7fc00000); other patterns kept.
std::vector<std::uint32_t> nan_as_one(std::vector<std::uint32_t> bits) {
  for (std::uint32_t& b : bits)
    if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0) b = 0x7fc00000u;
  return bits;
}

// The kernel against the host twin, and a graph of the fused step (plain Adam, the pass)
// replayed against eager calls: same bytes, and nothing allocated or synchronized inside.
TEST(AdamMxfp8Gpu, KernelEqualsHostTwinAndReplays) {
  using namespace shardopt;
  using mxfp8_test::download;
  using mxfp8_test::upload;
  const Mxfp8Shape shape{2, 70, 264};
  const std::int64_t n = shape.numel();
  const auto nz = static_cast<std::size_t>(n);
  const std::vector<float> master = mxfp8_test::random_master(n, shape.cols, 9u);  // specials included
  std::vector<float> grad(nz);
  for (std::size_t i = 0; i < nz; ++i) grad[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-4f - 0.05f;
  struct Side {
    Backend b;
    DeviceBuffer master, m, v, grads, scalars;
    mxfp8_test::DevicePlanes planes;
    Side(Backend be, const Mxfp8Shape& s, const std::vector<float>& p, const std::vector<float>& g)
        : b(be),
          master(upload(be, p)),
          m(upload(be, std::vector<float>(p.size(), 0.0f))),
          v(upload(be, std::vector<float>(p.size(), 0.0f))),
          grads(upload(be, g)),
          scalars(upload(be, std::vector<StepScalars>(1, [] {
            StepScalars sc;
            sc.lr = 1e-3f;
            return sc;
          }()))),
          planes(be, s) {}
  };
  AdamConfig cfg;
  cfg.grad_dtype = DType::f32;
  cfg.write_params = false;
  // Rank 1 of 2 with a boundary mid-row: a boundary tile row before the owned bands.
  const std::int64_t lo = n / 2 + 77;
  auto tensor_of = [&](Side& s) {
    Mxfp8ShardTensor t;
    t.shape = shape;
    t.range = Range{lo, n};
    t.master = s.master.as<float>() + lo;
    t.out = s.planes.planes();
    return t;
  };
  auto shard_of = [&](Side& s) {
    ShardPointers sp;
    sp.shard_numel = n;
    sp.grads = s.grads.data();
    sp.master = s.master.as<float>();
    sp.exp_avg = s.m.data();
    sp.exp_avg_sq = s.v.data();
    return sp;
  };
  kernels::AdamMxfp8Place place;
  place.shard_offset = lo;
  place.buffer_offset = lo;
  Side host(Backend::Host, shape, master, grad), eager(Backend::Cuda, shape, master, grad),
      graphed(Backend::Cuda, shape, master, grad);
  const kernels::AdamMxfp8Pass host_pass({tensor_of(host)}, {place}, cfg, shard_of(host),
                                         host.scalars.as<StepScalars>(), Backend::Host);
  const kernels::AdamMxfp8Pass eager_pass({tensor_of(eager)}, {place}, cfg, shard_of(eager),
                                          eager.scalars.as<StepScalars>(), Backend::Cuda);
  const kernels::AdamMxfp8Pass graph_pass({tensor_of(graphed)}, {place}, cfg, shard_of(graphed),
                                          graphed.scalars.as<StepScalars>(), Backend::Cuda);
  ShardChunk piece;
  piece.shard_offset = lo;
  piece.buffer_offset = lo;
  piece.length = n - lo;
  const std::vector<ShardChunk> plain = kernels::adam_mxfp8_plain_chunks({piece}, eager_pass.bands());
  ASSERT_FALSE(plain.empty());
  ASSERT_FALSE(eager_pass.bands().empty());
  auto enqueue = [&](Side& s, const kernels::AdamMxfp8Pass& pass, const DeviceBuffer& chunks, Stream st) {
    ShardPointers sp = shard_of(s);
    sp.chunks = chunks.as<ShardChunk>();
    sp.num_chunks = static_cast<std::int64_t>(plain.size());
    fused_adam_step(cfg, sp, s.scalars.as<StepScalars>(), s.b, st);
    pass.run(st);
  };
  const DeviceBuffer host_chunks = upload(Backend::Host, plain), dev_chunks = upload(Backend::Cuda, plain),
                     graph_chunks = upload(Backend::Cuda, plain);
  cudaStream_t stream = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  enqueue(graphed, graph_pass, graph_chunks, reinterpret_cast<Stream>(stream));
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    enqueue(host, host_pass, host_chunks, nullptr);
    enqueue(eager, eager_pass, dev_chunks, nullptr);
    SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
    synchronize(Backend::Cuda, nullptr);
    synchronize(Backend::Host, nullptr);
    for (Side* s : {&eager, &graphed}) {
      const char* who = s == &eager ? "eager kernel vs host twin" : "graph replay vs host twin";
      // The master holds NaN specials (random_master): a NaN's payload is the arithmetic's
      // (x86 keeps an operand's, the GPU gives its canonical NaN), so NaNs compare as one
      // value; every other master bit pattern must be equal.
      EXPECT_EQ(nan_as_one(download<std::uint32_t>(s->b, s->master, nz)),
                nan_as_one(download<std::uint32_t>(Backend::Host, host.master, nz)))
          << who << ": master";
      EXPECT_EQ(download<std::uint32_t>(s->b, s->m, nz), download<std::uint32_t>(Backend::Host, host.m, nz)) << who;
      EXPECT_EQ(download<std::uint32_t>(s->b, s->v, nz), download<std::uint32_t>(Backend::Host, host.v, nz)) << who;
      EXPECT_TRUE(s->planes.get(s->b, shape) == host.planes.get(Backend::Host, shape)) << who << ": planes";
    }
  }
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

}  // namespace
