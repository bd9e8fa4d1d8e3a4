// The fused Adam pass over 8-bit block moments (adam_q8.cu) bitwise equal to its host
// twin (adam_host.cpp, which test/unit and test/mpi check against the documented maps and
// a derived bound): every code byte, every block scale, every parameter and master (or
// remainder) after many steps, for f32 and bf16 gradients, fp32 masters and remainders,
// AdamW and Adam-L2; with odd parameter sizes (partial blocks at parameter ends), small
// and large chunks, and misaligned bases (the scalar path). Gradients span six decades,
// so the codes spread over the whole maps. And the code tables the kernels carry (built by
// the device compiler) against the host's: every key and every code boundary of both maps,
// under scales that take the reciprocal and scales that take the division.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/device_copy.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"
#include "kernels/adam/adam_launch.hpp"
#include "kernels/adam/moment_code.cuh"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/numerics.hpp"

namespace {
using namespace shardopt;
using test::bytes_to_device;
using test::bytes_to_host;

/// x in the fewest digits (%g).
std::string shortest(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

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
void random_grads(std::vector<unsigned char>& out, DType dt, std::int64_t n, std::uint64_t seed, double scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> decade(-7.0, -1.0);
  for (std::int64_t i = 0; i < n; ++i) {
    float g = static_cast<float>(scale * std::pow(10.0, decade(rng)));
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
/// grad_scale multiplies the gradients (tiny ones put the block scales below 2^-64, where
/// the codes divide instead of multiplying by a reciprocal).
void kernel_vs_twin(const AdamConfig& cfg, std::int64_t max_chunk, int shift, int steps, double grad_scale = 1.0) {
  const std::string what = std::string(cfg.grad_dtype == DType::bf16 ? "bf16" : "f32") + " grads, " +
                           (cfg.master_storage == MasterStorage::bf16_remainder ? "remainders" : "fp32 master") +
                           (cfg.decoupled_weight_decay ? ", AdamW" : ", Adam-L2") + ", chunks of " +
                           std::to_string(max_chunk) + (shift ? ", misaligned bases" : "") +
                           (grad_scale != 1.0 ? ", gradients x " + shortest(grad_scale) : "");
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
    random_grads(h.grads, cfg.grad_dtype, n, 100 + static_cast<std::uint64_t>(s), grad_scale);
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
  if (grad_scale == 1.0) {
    EXPECT_GT(distinct, 100) << what << ": second-moment codes used";
  }
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

TEST(AdamQ8Gpu, KernelEqualsHostTwinWithTinyMoments) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (bool rem : {false, true}) kernel_vs_twin(q8_config(DType::f32, rem, true), 1 << 16, 0, 4, 1e-18);
}

TEST(AdamQ8Gpu, KernelEqualsHostTwinWithMisalignedBases) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (bool rem : {false, true}) kernel_vs_twin(q8_config(DType::bf16, rem, true), 1 << 16, 1, 4);
}

/// Values whose quotients by a block's scale probe every key of a map's code table: its
/// first and last float, and both sides of the boundary its entry places; each block's
/// element 0 is the scale itself (probe 1). `second`: the values are squares whose
/// square roots are the probes (kept only where sqrtf gives the probe back).
std::vector<float> table_probes(bool second, float scale) {
  const std::uint32_t* table = second ? kernels::kMomentMaps.second_codes : kernels::kMomentMaps.first_codes;
  std::vector<float> probes;
  for (int k = 0; k < kernels::kKeys; ++k) {
    const std::uint32_t first = (kernels::kKeyLow + static_cast<std::uint32_t>(k)) << kernels::kKeyShift;
    const std::uint32_t t = kernels::code_table_boundary(table[k]);
    for (std::uint32_t b : {first, first | kernels::kKeyLowBits, first | t, first | (t + 1 > kernels::kKeyLowBits ? t : t + 1)})
      probes.push_back(num::f32_from_bits(b));
  }
  std::vector<float> out;
  std::size_t next = 0;
  while (next < probes.size()) {
    for (std::int64_t i = 0; i < kMomentBlock; ++i) {
      const float q = i == 0 || next >= probes.size() ? 1.0f : probes[next++];
      const float x = q * scale;
      if (!second) {
        out.push_back(i % 2 == 0 ? x : -x);
      } else {
        const float v = x * x;
        out.push_back(std::sqrt(v) == x ? v : 0.0f);
      }
    }
  }
  return out;
}

TEST(AdamQ8Gpu, EncodeEqualsHostTwinOnEveryKeyAndBoundary) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // 1, 2^-30 and 2^40: quotients exact; 3.7: rounded quotients near the boundaries; 2^-70
  // and 2^70 (first map): outside [2^-64, 2^64], the division itself. (The second map's
  // squares would leave the float range there; the pass test with tiny gradients below
  // takes that path for both maps: its blocks' scales lie below 2^-64.)
  for (bool second : {false, true})
    for (float scale : {1.0f, 0x1p-30f, 3.7f, 0x1p40f, 0x1p-70f, 0x1p70f}) {
      if (second && (scale < 0x1p-64f || scale > 0x1p64f)) continue;
      const std::vector<float> in = table_probes(second, scale);
      const auto n = static_cast<std::int64_t>(in.size());
      const auto un = static_cast<std::size_t>(n);
      const std::size_t blocks = un / kMomentBlock;
      std::vector<std::uint8_t> hc(un), dc(un);
      std::vector<float> hs(blocks), ds(blocks);
      kernels::q8_encode(in.data(), hc.data(), hs.data(), n, second, Backend::Host, nullptr);
      DeviceBuffer d_in(Backend::Cuda, un * 4), d_c(Backend::Cuda, un), d_s(Backend::Cuda, blocks * 4);
      bytes_to_device(Backend::Cuda, d_in.data(), in.data(), un * 4);
      kernels::q8_encode(d_in.as<float>(), d_c.as<std::uint8_t>(), d_s.as<float>(), n, second, Backend::Cuda, nullptr);
      SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
      bytes_to_host(Backend::Cuda, dc.data(), d_c.data(), un);
      bytes_to_host(Backend::Cuda, ds.data(), d_s.data(), blocks * 4);
      const std::string what = std::string(second ? "second" : "first") + " map, scale " + shortest(scale);
      ASSERT_EQ(hs, ds) << what;
      std::int64_t differ = 0, first_at = -1;
      std::vector<bool> seen(256, false);
      for (std::size_t i = 0; i < un; ++i) {
        seen[hc[i]] = true;
        if (hc[i] != dc[i]) {
          ++differ;
          if (first_at < 0) first_at = static_cast<std::int64_t>(i);
        }
      }
      EXPECT_EQ(differ, 0) << what << ": first at element " << first_at << " (" << in[static_cast<std::size_t>(std::max<std::int64_t>(first_at, 0))] << ")";
      int distinct = 0;
      for (bool b : seen) distinct += b ? 1 : 0;
      EXPECT_GT(distinct, 200) << what << ": codes reached";
    }
}

}  // namespace
