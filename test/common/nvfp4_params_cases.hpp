// nvfp4_params_cases.hpp - the NVFP4-only cases of NVFP4 parameters inside
// DistributedAdam (issue 19): the store's per-bucket staged byte counts and the memory
// accounting. The format-generic cases (oracle, paths, state machine, grouped vs
// discrete, graph) are those of mxfp8_params_cases.hpp with ParamFormat::Nvfp4. Run on
// the host backend (test/mpi/test_nvfp4_params.cpp) and on GPUs
// (test/gpu/test_nvfp4_params_gpu.cpp).
#pragma once

#include "common/mxfp8_params_cases.hpp"

namespace shardopt::test {

/// BucketStoreOptions::staged_gather_rank_bytes: each staged bucket all-gathers exactly
/// its own count of bytes per rank (rank r's piece at r * count), leaving the rest of
/// the region alone; a count that does not fit, or a list of the wrong length, is the
/// construction error.
inline void case_store_staged_rank_bytes(Backend b) {
  const int rank = world_rank(), world = world_size();
  Communicator comm = make_comm(b);
  const std::vector<ParamSpec> specs = {ParamSpec::tensor("a", {37, 11}), ParamSpec::tensor("n", {129}, DType::f32),
                                        ParamSpec::tensor("b", {61, 7}), ParamSpec::tensor("c", {1000})};
  LayoutOptions lo;
  lo.bucket_numel = 700;
  const Layout layout(specs, world, lo);
  ASSERT_EQ(layout.buffers().size(), 2u);
  const int staged_buffer = layout.buffers()[0].dtype == DType::bf16 ? 0 : 1;
  const int nb = static_cast<int>(layout.buckets().size());
  BucketStoreOptions o;
  o.grad_dtype = DType::bf16;
  o.nccl_registered = false;
  o.buffer_params.assign(2, true);
  o.buffer_params[static_cast<std::size_t>(staged_buffer)] = false;
  o.staged_gather_rank_bytes.assign(static_cast<std::size_t>(nb), 0);
  // Odd counts, different per bucket: S / 2 + 1 + bucket index.
  for (int bk : layout.buffers()[static_cast<std::size_t>(staged_buffer)].buckets)
    o.staged_gather_rank_bytes[static_cast<std::size_t>(bk)] =
        layout.buckets()[static_cast<std::size_t>(bk)].range.size() / world / 2 + 1 + bk;
  BucketStore st(comm, layout, o);
  TestStream s(b);
  auto pattern = [](int r, int bk, std::int64_t j) { return static_cast<std::uint8_t>(r * 61 + bk * 17 + j * 3 + 5); };
  for (bool grouped : {false, true}) {
    for (int bk : layout.buffers()[static_cast<std::size_t>(staged_buffer)].buckets) {
      const Bucket& B = layout.buckets()[static_cast<std::size_t>(bk)];
      const std::int64_t n = o.staged_gather_rank_bytes[static_cast<std::size_t>(bk)], bytes = B.range.size() * 2;
      std::vector<std::uint8_t> region(static_cast<std::size_t>(bytes), 0xEE);
      for (std::int64_t j = 0; j < n; ++j) region[static_cast<std::size_t>(rank * n + j)] = pattern(rank, bk, j);
      from_host(b, static_cast<char*>(st.grad_buffer(staged_buffer)) + B.range.begin * 2, region);
    }
    if (grouped) {
      st.start_param_gathers(0, nb, s.get());
    } else {
      for (int bk = 0; bk < nb; ++bk) st.start_param_gather(bk, s.get());
    }
    for (int bk = 0; bk < nb; ++bk) st.wait_param_gather(bk, s.get());
    s.sync();
    for (int bk : layout.buffers()[static_cast<std::size_t>(staged_buffer)].buckets) {
      const Bucket& B = layout.buckets()[static_cast<std::size_t>(bk)];
      const std::int64_t n = o.staged_gather_rank_bytes[static_cast<std::size_t>(bk)], bytes = B.range.size() * 2;
      const auto got = to_host<std::uint8_t>(b, static_cast<char*>(st.grad_buffer(staged_buffer)) + B.range.begin * 2,
                                             static_cast<std::size_t>(bytes));
      std::int64_t wrong_piece = 0, touched = 0;
      for (int r = 0; r < world; ++r)
        for (std::int64_t j = 0; j < n; ++j)
          wrong_piece += got[static_cast<std::size_t>(r * n + j)] != pattern(r, bk, j) ? 1 : 0;
      for (std::int64_t j = world * n; j < bytes; ++j) touched += got[static_cast<std::size_t>(j)] != 0xEE ? 1 : 0;
      EXPECT_EQ(wrong_piece, 0) << "bucket " << bk << (grouped ? " (grouped)" : "") << ": staged bytes not gathered";
      EXPECT_EQ(touched, 0) << "bucket " << bk << ": bytes beyond the staging changed";
    }
  }
  const int first_staged = layout.buffers()[static_cast<std::size_t>(staged_buffer)].buckets.front();
  BucketStoreOptions big = o;
  big.staged_gather_rank_bytes[static_cast<std::size_t>(first_staged)] =
      layout.buckets()[static_cast<std::size_t>(first_staged)].range.size() / world * 2 + 1;
  expect_error(mx_error_of([&] { BucketStore bad(comm, layout, big); }), ErrorCode::InvalidArgument,
               "does not fit the bucket's gradient region");
  BucketStoreOptions miscount = o;
  miscount.staged_gather_rank_bytes.pop_back();
  expect_error(mx_error_of([&] { BucketStore bad(comm, layout, miscount); }), ErrorCode::InvalidArgument,
               "one entry per bucket");
}

/// NVFP4 parameters have no param buffer: MemoryReport::params counts the native (f32)
/// buffer only; MemoryReport::nvfp4 is, per member, ceil(numel / 2) data bytes, one scale
/// byte per 16 x 16 block and two fp32 (amax, decode scale), plus per bucket the u32
/// exchange buffers (one entry per block and one per member); each piece rounded up to
/// 16 bytes. With shapes whose sizes are multiples of 16 the data and scale pieces are
/// exact: numel / 2 + numel / 256 bytes.
inline void case_nvfp4_memory(Backend b) {
  const int world = world_size();
  auto piece = [](std::int64_t n) { return (n + 15) / 16 * 16; };
  for (DType g : {DType::bf16, DType::f32}) {
    for (bool round_shapes : {false, true}) {
      std::vector<ParamSpec> specs = q_model(ParamFormat::Nvfp4);
      if (round_shapes)
        specs = {ParamSpec::tensor("embed", {256, 128}), ParamSpec::tensor("norm", {128}, DType::bf16, "no_decay"),
                 ParamSpec::grouped("experts", 4, {64, 96}), ParamSpec::tensor("head", {256, 128})};
      DistributedAdamOptions o = mx_options(g, ParamFormat::Nvfp4);
      o.nccl_registered = false;
      DistributedAdam opt(make_comm(b), specs, o);
      const Layout& L = opt.layout();
      std::int64_t native_numel = 0, data_and_scales = 0, side = 0, exchange = 0, quantized_numel = 0;
      for (const auto& buf : L.buffers())
        if (buf.dtype == DType::f32) native_numel += buf.numel;
      for (int i = 0; i < opt.num_params(); ++i) {
        if (!opt.is_nvfp4(i)) continue;
        const Nvfp4View v = opt.nvfp4_param(i);
        const std::int64_t G = v.members;
        data_and_scales += piece(G * v.shape.data_bytes()) + piece(G * v.shape.scale_numel());
        side += 2 * piece(4 * G);  // amax and decode scale
        quantized_numel += G * v.shape.numel();
      }
      for (const Bucket& bk : L.buckets()) {
        std::int64_t e = 0;
        for (int p : bk.params)
          if (opt.is_nvfp4(p)) e += 4 * opt.nvfp4_param(p).members * opt.nvfp4_param(p).shape.amax_numel();
        exchange += piece(e);
      }
      const MemoryReport r = opt.memory();
      const std::int64_t n = L.total_numel();
      EXPECT_EQ(r.params, 4 * native_numel) << "no param allocation for the NVFP4 buffer";
      EXPECT_EQ(r.mxfp8, 0);
      EXPECT_EQ(r.nvfp4, data_and_scales + side + exchange);
      if (round_shapes)
        EXPECT_EQ(data_and_scales, quantized_numel / 2 + quantized_numel / 256) << "half a byte per element + scales";
      EXPECT_EQ(r.grads, static_cast<std::int64_t>(size_of(g)) * n);
      EXPECT_EQ(r.master, 4 * n / world);
      EXPECT_EQ(r.moments, 8 * n / world);
      EXPECT_EQ(r.total(), r.params + r.grads + r.master + r.moments + r.nvfp4 + r.nccl_overhead);
    }
  }
}

}  // namespace shardopt::test
