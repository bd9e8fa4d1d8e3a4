// The fused Adam pass over 8-bit block moments (adam_q8.cu) bitwise equal to its host
// twin (adam_host.cpp, which test/unit and test/mpi check against the documented maps and
// a derived bound): every code byte, every block scale, every parameter and master (or
// remainder) after many steps, for f32 and bf16 gradients, fp32 masters and remainders,
// AdamW and Adam-L2; with odd parameter sizes (partial blocks at parameter ends), small
// and large chunks, and misaligned bases (the scalar path). Gradients span six decades,
// so the codes spread over the whole maps.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/device_copy.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/numerics.hpp"

namespace {
using namespace shardopt;
using test::bytes_to_device;
using test::bytes_to_host;

/// One rank's state of a q8 step, as host arrays (also the device copy's contents).
struct Q8State {
  std::vector<unsigned char> grads, params, m, v;
  std::vector<float> master, scales;  // scales: first moment's blocks, then the second's
  std::vector<std::uint16_t> remainders;
};

/// Odd parameter sizes, each starting on a moment block (the layout's alignment).
Layout odd_layout() {
  std::vector<ParamSpec> specs;
  const std::int64_t sizes[][2] = {{37, 129}, {1, 1}, {300, 7}, {256, 1}, {1, 4099}, {513, 3}, {19, 1000}};
  int i = 0;
  for (const auto& s : sizes) specs.push_back(ParamSpec::tensor("p" + std::to_string(i++), {s[0], s[1]}));
  LayoutOptions opt;
  opt.bucket_numel = std::int64_t{1} << 30;
  opt.alignment = kMomentBlock;
  return Layout(specs, 1, opt);
}

AdamConfig q8_config(DType grad, bool remainder, bool decoupled) {
  AdamConfig c;
  c.grad_dtype = grad;
  c.param_dtype = DType::bf16;
  c.write_params = true;
  c.moment_dtype = DType::q8_block;
  c.master_storage = remainder ? MasterStorage::bf16_remainder : MasterStorage::fp32;
  c.decoupled_weight_decay = decoupled;
  c.groups = {AdamGroup{0.1, 1.0}};
  return c;
}

/// Gradients of magnitude 10^[-7, -1], random signs: blocks whose moments span the maps.
void random_grads(std::vector<unsigned char>& out, DType dt, std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> decade(-7.0, -1.0);
  for (std::int64_t i = 0; i < n; ++i) {
    float g = static_cast<float>(std::pow(10.0, decade(rng)));
    if (rng() & 1) g = -g;
    if (dt == DType::bf16) {
      const std::uint16_t h = num::f32_to_bf16(g);
      std::memcpy(out.data() + i * 2, &h, 2);
    } else {
      std::memcpy(out.data() + i * 4, &g, 4);
    }
  }
}

/// `steps` steps on the host twin and on the device from the same start; every byte equal.
void kernel_vs_twin(const AdamConfig& cfg, std::int64_t max_chunk, int shift, int steps) {
  const std::string what = std::string(cfg.grad_dtype == DType::bf16 ? "bf16" : "f32") + " grads, " +
                           (cfg.master_storage == MasterStorage::bf16_remainder ? "remainders" : "fp32 master") +
                           (cfg.decoupled_weight_decay ? ", AdamW" : ", Adam-L2") + ", chunks of " +
                           std::to_string(max_chunk) + (shift ? ", misaligned bases" : "");
  const Layout layout = odd_layout();
  const std::vector<ShardChunk> table = shard_chunks(layout, 0, 0, max_chunk);
  const std::int64_t n = layout.buffers()[0].shard_numel;
  ASSERT_EQ(n % kMomentBlock, 0);
  const bool rem = cfg.master_storage == MasterStorage::bf16_remainder;
  const std::size_t gsz = size_of(cfg.grad_dtype), un = static_cast<std::size_t>(n);
  const std::size_t blocks = un / kMomentBlock;

  Q8State h;
  h.grads.assign(un * gsz, 0);
  h.params.assign(un * 2, 0);
  h.m.assign(un, 0);
  h.v.assign(un, 0);
  h.master.assign(un, 0.0f);
  h.remainders.assign(un, 0);
  h.scales.assign(2 * blocks, 0.0f);
  std::mt19937 rng(11);
  std::normal_distribution<float> w(0.0f, 0.02f);
  for (std::size_t i = 0; i < un; ++i) {  // bf16-exact starting masters: both storages agree
    const std::uint16_t b = num::f32_to_bf16(w(rng));
    std::memcpy(h.params.data() + i * 2, &b, 2);
    h.master[i] = num::bf16_to_f32(b);
  }

  // Device copies, each base `shift` elements past an aligned allocation.
  auto dev = [&](std::size_t bytes) { return DeviceBuffer(Backend::Cuda, bytes + 64); };
  DeviceBuffer d_table = dev(table.size() * sizeof(ShardChunk)), d_g = dev(h.grads.size()), d_p = dev(h.params.size()),
               d_master = dev(un * 4), d_rem = dev(un * 2), d_m = dev(un), d_v = dev(un), d_s = dev(2 * blocks * 4),
               d_sc = dev(sizeof(StepScalars));
  auto at = [&](const DeviceBuffer& b, std::size_t elem) { return static_cast<unsigned char*>(b.data()) + shift * elem; };
  bytes_to_device(Backend::Cuda, d_table.data(), table.data(), table.size() * sizeof(ShardChunk));
  bytes_to_device(Backend::Cuda, at(d_p, 2), h.params.data(), h.params.size());
  bytes_to_device(Backend::Cuda, at(d_master, 4), h.master.data(), un * 4);
  bytes_to_device(Backend::Cuda, at(d_rem, 2), h.remainders.data(), un * 2);
  bytes_to_device(Backend::Cuda, at(d_m, 1), h.m.data(), un);
  bytes_to_device(Backend::Cuda, at(d_v, 1), h.v.data(), un);
  bytes_to_device(Backend::Cuda, d_s.data(), h.scales.data(), 2 * blocks * 4);

  auto pointers = [&](bool device) {
    ShardPointers sp;
    sp.chunks = device ? d_table.as<ShardChunk>() : table.data();
    sp.num_chunks = static_cast<std::int64_t>(table.size());
    sp.shard_numel = n;
    sp.grads = device ? static_cast<const void*>(at(d_g, gsz)) : h.grads.data();
    sp.params = device ? static_cast<void*>(at(d_p, 2)) : h.params.data();
    sp.master = rem ? nullptr : (device ? reinterpret_cast<float*>(at(d_master, 4)) : h.master.data());
    sp.remainders = !rem ? nullptr : (device ? reinterpret_cast<std::uint16_t*>(at(d_rem, 2)) : h.remainders.data());
    sp.exp_avg = device ? static_cast<void*>(at(d_m, 1)) : h.m.data();
    sp.exp_avg_sq = device ? static_cast<void*>(at(d_v, 1)) : h.v.data();
    sp.exp_avg_scales = device ? d_s.as<float>() : h.scales.data();
    sp.exp_avg_sq_scales = (device ? d_s.as<float>() : h.scales.data()) + blocks;
    return sp;
  };
  StepScalars hs;
  bytes_to_device(Backend::Cuda, d_sc.data(), &hs, sizeof hs);
  for (int s = 0; s < steps; ++s) {
    random_grads(h.grads, cfg.grad_dtype, n, 100 + static_cast<std::uint64_t>(s));
    bytes_to_device(Backend::Cuda, at(d_g, gsz), h.grads.data(), h.grads.size());
    const float lr = 1e-3f * (1.0f + 0.1f * static_cast<float>(s));
    hs.lr = lr;
    StepScalars ds;
    bytes_to_host(Backend::Cuda, &ds, d_sc.data(), sizeof ds);
    ds.lr = lr;
    bytes_to_device(Backend::Cuda, d_sc.data(), &ds, sizeof ds);
    fused_adam_step(cfg, pointers(false), &hs, Backend::Host, nullptr);
    fused_adam_step(cfg, pointers(true), d_sc.as<StepScalars>(), Backend::Cuda, nullptr);
    SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  }

  Q8State d = h;
  bytes_to_host(Backend::Cuda, d.params.data(), at(d_p, 2), h.params.size());
  bytes_to_host(Backend::Cuda, d.master.data(), at(d_master, 4), un * 4);
  bytes_to_host(Backend::Cuda, d.remainders.data(), at(d_rem, 2), un * 2);
  bytes_to_host(Backend::Cuda, d.m.data(), at(d_m, 1), un);
  bytes_to_host(Backend::Cuda, d.v.data(), at(d_v, 1), un);
  bytes_to_host(Backend::Cuda, d.scales.data(), d_s.data(), 2 * blocks * 4);
  auto first_diff = [](const void* a, const void* b, std::size_t bytes) {
    const auto* x = static_cast<const unsigned char*>(a);
    const auto* y = static_cast<const unsigned char*>(b);
    for (std::size_t i = 0; i < bytes; ++i)
      if (x[i] != y[i]) return static_cast<std::int64_t>(i);
    return std::int64_t{-1};
  };
  EXPECT_EQ(first_diff(h.params.data(), d.params.data(), un * 2), -1) << what << ": params";
  EXPECT_EQ(first_diff(h.master.data(), d.master.data(), un * 4), -1) << what << ": master";
  EXPECT_EQ(first_diff(h.remainders.data(), d.remainders.data(), un * 2), -1) << what << ": remainders";
  EXPECT_EQ(first_diff(h.m.data(), d.m.data(), un), -1) << what << ": first-moment codes";
  EXPECT_EQ(first_diff(h.v.data(), d.v.data(), un), -1) << what << ": second-moment codes";
  EXPECT_EQ(first_diff(h.scales.data(), d.scales.data(), 2 * blocks * 4), -1) << what << ": block scales";
  // Not a vacuous comparison: the codes spread over the maps (many distinct bytes).
  std::vector<bool> seen(256, false);
  for (unsigned char c : h.v) seen[c] = true;
  int distinct = 0;
  for (bool b : seen) distinct += b ? 1 : 0;
  EXPECT_GT(distinct, 100) << what << ": second-moment codes used";
  StepScalars ds;
  bytes_to_host(Backend::Cuda, &ds, d_sc.data(), sizeof ds);
  EXPECT_EQ(ds.step, steps) << what;
  EXPECT_EQ(hs.step, steps) << what;
}

TEST(AdamQ8Gpu, KernelEqualsHostTwinEveryVariant) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (DType grad : {DType::f32, DType::bf16})
    for (bool rem : {false, true})
      for (bool decoupled : {true, false}) {
        kernel_vs_twin(q8_config(grad, rem, decoupled), 1 << 16, 0, 8);
        kernel_vs_twin(q8_config(grad, rem, decoupled), 512, 0, 4);
      }
}

TEST(AdamQ8Gpu, KernelEqualsHostTwinWithMisalignedBases) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (bool rem : {false, true}) kernel_vs_twin(q8_config(DType::bf16, rem, true), 1 << 16, 1, 4);
}

}  // namespace
