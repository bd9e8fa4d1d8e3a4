// bench_adam - the fused Adam step over a Llama-3.2-1B-shaped shard (1.50B params, 147
// tensors, one rank, one bucket) against the device-to-device copy bandwidth measured in
// the same process and against PyTorch's fused AdamW (numbers from
// bench/peers/adam_peer.py, passed with --peer-json).
//
//   bench_adam [--peer-json FILE] [--results DIR] [--iters N]      CUDA benchmark
//              [--only TEXT]                                       (only the configs whose
//                                                                  name contains TEXT)
//   bench_adam --backend host --small                              host smoke run (seconds)
//   bench_adam --torch-check-dir DIR                               inputs + our 100 steps for
//                                                                  bench/peers/adam_torch_check.py
//
// Configs: "fp32/1.5B/147" (fp32 grads, master, moments; no separate param output: 28
// bytes per param) and "bf16grad-bf16param/1.5B/147" (bf16 grads read directly, fp32
// master and moments, bf16 param output in the same pass: 2+4+8 read, 4+8+2 written =
// 28 bytes per param); then the state precision modes (docs/state_precision.md): bf16
// moments (20 bytes), the master as bf16 param + remainder (26), both (18), 8-bit block
// moments with an fp32 master (16 + scales) and with remainders (14 + scales: the 4-byte
// state), each timed against its own byte limit. Each step (prologue + main pass) is replayed from a CUDA graph;
// median of --iters (>= 20) replays after warm-up, CUDA events around each
// (bench/common/cuda_bench: time_ms, measure_copy, CapturedGraph).
#include "bench_adam.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "results.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/numerics.hpp"
#include "shardopt/presets.hpp"

namespace shardopt::bench_adam {

std::optional<double> json_number(const std::string& text, const std::string& key) {
  const std::string k = "\"" + key + "\"";
  auto p = text.find(k);
  if (p == std::string::npos) return std::nullopt;
  p = text.find(':', p + k.size());
  if (p == std::string::npos) return std::nullopt;
  const char* s = text.c_str() + p + 1;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s) return std::nullopt;
  return v;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<Config> configs() {
  std::vector<Config> out;
  // Value-initialized ({}): GCC 12 at -O3 otherwise warns that AdamConfig's default group
  // list "may be used uninitialized" (a false positive of its inlined vector copy).
  Config f{};
  f.name = "fp32/1.5B/147";
  f.adam.grad_dtype = DType::f32;
  f.adam.write_params = false;
  f.bytes_per_param = 28;  // read g, p, m, v (16); write p, m, v (12)
  f.peer_key = "fp32_ms";
  f.peer_desc = "torch.optim.AdamW fused capturable graph";
  out.push_back(f);
  Config b{};
  b.name = "bf16grad-bf16param/1.5B/147";
  b.adam.grad_dtype = DType::bf16;
  b.adam.param_dtype = DType::bf16;
  b.adam.write_params = true;
  b.bytes_per_param = 28;  // read g 2, p 4, m 4, v 4; write p 4, m 4, v 4, param 2
  b.peer_key = "bf16_ms";
  b.peer_desc = "bf16 grads cast to fp32 + torch.optim.AdamW fused capturable + cast to bf16, one graph";
  out.push_back(b);
  // The state precision modes (docs/state_precision.md), each against its own byte limit.
  Config bm = b;
  bm.name = "bf16grad-bf16param-bf16moments/1.5B/147";
  bm.adam.moment_dtype = DType::bf16;
  bm.bytes_per_param = 20;  // read g 2, p 4, m 2, v 2; write p 4, m 2, v 2, param 2
  bm.peer_key.clear();
  out.push_back(bm);
  Config r = b;
  r.name = "bf16grad-remainder/1.5B/147";
  r.adam.master_storage = MasterStorage::bf16_remainder;
  r.bytes_per_param = 26;  // read g 2, param 2, remainder 2, m 4, v 4; write param 2, remainder 2, m 4, v 4
  r.peer_key.clear();
  out.push_back(r);
  Config rm = r;
  rm.name = "bf16grad-remainder-bf16moments/1.5B/147";
  rm.adam.moment_dtype = DType::bf16;
  rm.bytes_per_param = 18;  // read g 2, param 2, remainder 2, m 2, v 2; write param 2, remainder 2, m 2, v 2
  out.push_back(rm);
  // 8-bit moments: one byte each, plus two fp32 scales per 256 elements read and written.
  constexpr double kScales = 4.0 * 2 * 2 / static_cast<double>(kMomentBlock);
  Config bq = b;
  bq.name = "bf16grad-bf16param-q8moments/1.5B/147";
  bq.adam.moment_dtype = DType::q8_block;
  bq.bytes_per_param = 16 + kScales;  // read g 2, p 4, m 1, v 1; write p 4, m 1, v 1, param 2
  bq.peer_key = "bnb_q8_ms";  // bench/peers/bnb_adam_peer.py
  bq.peer_desc = "bitsandbytes AdamW8bit (bf16 params and grads, no fp32 master), eager steps";
  out.push_back(bq);
  Config rq = r;
  rq.name = "bf16grad-remainder-q8moments/1.5B/147";
  rq.adam.moment_dtype = DType::q8_block;
  rq.bytes_per_param = 14 + kScales;  // read g 2, param 2, remainder 2, m 1, v 1; write param 2, remainder 2, m 1, v 1
  out.push_back(rq);
  for (auto& c : out) c.adam.groups = {AdamGroup{0.1, 1.0}, AdamGroup{0.0, 1.0}};  // "decay", "no_decay"
  return out;
}

Layout one_bucket_layout(bool small, bool q8) {
  presets::TransformerShape shape = presets::kLlama32_1B;
  if (small) shape = presets::TransformerShape{64, 2, 128, 32, 256};
  LayoutOptions opt;
  opt.bucket_numel = std::int64_t{1} << 40;
  if (q8) opt.alignment = kMomentBlock;
  return Layout(presets::transformer(shape), 1, opt);
}

std::int64_t chunk_elements(const std::vector<ShardChunk>& t) {
  std::int64_t n = 0;
  for (const auto& c : t) n += c.length;
  return n;
}

namespace {

// ------------------------------------------------------------------------ host smoke

int host_smoke(const Options& o) {
  for (const Config& c : configs()) {
    const Layout layout = one_bucket_layout(true, c.adam.moment_dtype == DType::q8_block);
    const auto table = shard_chunks(layout, 0, 0);
    const std::int64_t n = layout.buffers()[0].shard_numel;
    std::vector<unsigned char> grads(static_cast<std::size_t>(n) * size_of(c.adam.grad_dtype), 0x3A),
        params(static_cast<std::size_t>(n) * 2, 0);
    std::vector<float> master(static_cast<std::size_t>(n), 0.01f), m(static_cast<std::size_t>(n), 0.0f),
        v(static_cast<std::size_t>(n), 0.0f);
    std::vector<std::uint16_t> remainders(static_cast<std::size_t>(n), 0);
    std::vector<float> scales(static_cast<std::size_t>(2 * n / kMomentBlock), 0.0f);
    const bool rem = c.adam.master_storage == MasterStorage::bf16_remainder;
    if (rem) std::fill(params.begin(), params.end(), 0x3C);  // bf16 0x3C3C = 0.0115
    ShardPointers sp;
    sp.chunks = table.data();
    sp.num_chunks = static_cast<std::int64_t>(table.size());
    sp.shard_numel = n;
    sp.grads = grads.data();
    sp.params = params.data();
    sp.master = rem ? nullptr : master.data();
    sp.remainders = rem ? remainders.data() : nullptr;
    sp.exp_avg = m.data();
    sp.exp_avg_sq = v.data();
    sp.exp_avg_scales = scales.data();
    sp.exp_avg_sq_scales = scales.data() + n / kMomentBlock;
    StepScalars s;
    s.lr = 1e-3f;
    std::vector<double> ms;
    for (int i = 0; i < 3 + o.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fused_adam_step(c.adam, sp, &s, Backend::Host, nullptr);
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= 3) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    for (float x : master)
      if (!std::isfinite(x)) {
        std::fprintf(stderr, "non-finite master after the host smoke run\n");
        return 1;
      }
    if (s.step != 3 + o.iters) return 1;
    bench::Result r;
    r.bench = "adam_step";
    r.config = "host-smoke/" + c.name.substr(0, c.name.find('/'));
    r.device = "host";
    r.ours_ms = bench::median(ms);
    r.numbers["params"] = static_cast<double>(chunk_elements(table));
    r.command = o.command;
    bench::write(r, "");  // printed only: host timings are not results
  }
  return 0;
}

// ------------------------------------------------------------------------ torch check

/// Writes the inputs of a 100-step run and our results for bench/peers/adam_torch_check.py.
int torch_check_dump(const Options& o) {
  const Layout layout = one_bucket_layout(true);
  const auto table = shard_chunks(layout, 0, 0);
  const std::int64_t n = layout.buffers()[0].shard_numel;
  const int steps = 100;
  const Backend be = o.backend;
  std::mt19937_64 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> master0(static_cast<std::size_t>(n), 0.0f);
  for (const auto& c : table)
    for (std::int64_t i = 0; i < c.length; ++i) master0[static_cast<std::size_t>(c.shard_offset + i)] = 0.02f * normal(rng);
  // Raw grads (loss-scaled by 1024, so inv_loss_scale = 1/1024 is exact), per step.
  std::vector<float> grads(static_cast<std::size_t>(n) * steps, 0.0f);
  for (int s = 0; s < steps; ++s)
    for (const auto& c : table)
      for (std::int64_t i = 0; i < c.length; ++i) {
        float g = 1024.0f * (0.01f * normal(rng));
        // Keep every value a bf16 value so that both grad variants see the same numbers.
        g = num::bf16_to_f32(num::f32_to_bf16(g));
        grads[static_cast<std::size_t>(s) * static_cast<std::size_t>(n) + static_cast<std::size_t>(c.shard_offset + i)] = g;
      }
  std::vector<float> lrs(steps), clips(steps);
  for (int s = 0; s < steps; ++s) {
    const float warm = s < 10 ? static_cast<float>(s + 1) / 10.0f : 1.0f;
    lrs[static_cast<std::size_t>(s)] = 1e-3f * warm * (0.6f + 0.4f * std::cos(0.05f * static_cast<float>(s)));
    clips[static_cast<std::size_t>(s)] = s % 3 == 0 ? 0.7f : 1.0f;
  }
  const float inv_loss_scale = 1.0f / 1024.0f;
  auto write_bin = [&](const std::string& name, const void* data, std::size_t bytes) {
    std::ofstream out(o.torch_dir + "/" + name, std::ios::binary);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out) throw std::runtime_error("cannot write " + o.torch_dir + "/" + name);
  };
  write_bin("master0.f32", master0.data(), master0.size() * 4);
  write_bin("grads.f32", grads.data(), grads.size() * 4);
  write_bin("lr.f32", lrs.data(), lrs.size() * 4);
  write_bin("clip.f32", clips.data(), clips.size() * 4);

  struct Variant {
    std::string name;
    DType grad;
    bool decoupled;
    bool params;
  };
  const Variant variants[] = {{"adamw_f32", DType::f32, true, false},
                              {"adamw_bf16grad_bf16param", DType::bf16, true, true},
                              {"adam_l2_f32", DType::f32, false, false}};
  std::ofstream meta(o.torch_dir + "/meta.json");
  meta.precision(17);  // exact decimal forms of the fp32 values (1/1024)
  meta << "{\"n\": " << n << ", \"steps\": " << steps << ", \"beta1\": 0.9, \"beta2\": 0.999, \"eps\": 1e-08"
       << ", \"inv_loss_scale\": " << inv_loss_scale << ", \"groups\": [{\"weight_decay\": 0.1, \"lr_scale\": 1.0},"
       << " {\"weight_decay\": 0.0, \"lr_scale\": 0.5}], \"params\": [";
  for (std::size_t i = 0; i < table.size(); ++i)  // max_chunk is large: one chunk per param here
    meta << (i ? ", " : "") << "{\"offset\": " << table[i].shard_offset << ", \"numel\": " << table[i].length
         << ", \"group\": " << table[i].group << "}";
  meta << "], \"variants\": [";
  for (std::size_t i = 0; i < 3; ++i)
    meta << (i ? ", " : "") << "{\"name\": \"" << variants[i].name << "\", \"decoupled\": "
         << (variants[i].decoupled ? "true" : "false") << ", \"param_out\": " << (variants[i].params ? "true" : "false")
         << "}";
  meta << "], \"backend\": \"" << to_string(be) << "\"}\n";
  meta.close();

  for (const Variant& var : variants) {
    AdamConfig cfg;
    cfg.grad_dtype = var.grad;
    cfg.decoupled_weight_decay = var.decoupled;
    cfg.write_params = var.params;
    cfg.param_dtype = DType::bf16;
    cfg.groups = {AdamGroup{0.1, 1.0}, AdamGroup{0.0, 0.5}};
    const std::size_t un = static_cast<std::size_t>(n);
    const std::size_t gbytes = un * size_of(var.grad);
    DeviceBuffer d_table(be, table.size() * sizeof(ShardChunk)), d_grads(be, gbytes), d_params(be, un * 2),
        d_master(be, un * 4), d_m(be, un * 4), d_v(be, un * 4), d_s(be, sizeof(StepScalars));
    DeviceBuffer h_stage(be, std::max<std::size_t>(un * 4, sizeof(StepScalars)), MemoryKind::Pinned);
    auto upload = [&](void* dst, const void* src, std::size_t bytes) {
      std::memcpy(h_stage.data(), src, bytes);
      copy_async(be, dst, h_stage.data(), bytes, nullptr);
      synchronize(be, nullptr);
    };
    auto download = [&](void* dst, const void* src, std::size_t bytes) {
      copy_async(be, h_stage.data(), src, bytes, nullptr);
      synchronize(be, nullptr);
      std::memcpy(dst, h_stage.data(), bytes);
    };
    upload(d_table.data(), table.data(), table.size() * sizeof(ShardChunk));
    upload(d_master.data(), master0.data(), un * 4);
    fill_zero_async(be, d_m.data(), un * 4, nullptr);
    fill_zero_async(be, d_v.data(), un * 4, nullptr);
    fill_zero_async(be, d_params.data(), un * 2, nullptr);
    ShardPointers sp;
    sp.chunks = d_table.as<ShardChunk>();
    sp.num_chunks = static_cast<std::int64_t>(table.size());
    sp.shard_numel = n;
    sp.grads = d_grads.data();
    sp.params = d_params.data();
    sp.master = d_master.as<float>();
    sp.exp_avg = d_m.data();
    sp.exp_avg_sq = d_v.data();
    StepScalars s;
    s.inv_loss_scale = inv_loss_scale;
    upload(d_s.data(), &s, sizeof s);
    std::vector<std::uint16_t> g16(un);
    for (int step = 0; step < steps; ++step) {
      const float* g = grads.data() + static_cast<std::size_t>(step) * un;
      if (var.grad == DType::bf16) {
        for (std::size_t i = 0; i < un; ++i) g16[i] = num::f32_to_bf16(g[i]);
        upload(d_grads.data(), g16.data(), un * 2);
      } else {
        upload(d_grads.data(), g, un * 4);
      }
      upload(&d_s.as<StepScalars>()->lr, &lrs[static_cast<std::size_t>(step)], 4);
      upload(&d_s.as<StepScalars>()->clip_coef, &clips[static_cast<std::size_t>(step)], 4);
      fused_adam_step(cfg, sp, d_s.as<StepScalars>(), be, nullptr);
    }
    synchronize(be, nullptr);
    std::vector<float> out(un);
    download(out.data(), d_master.data(), un * 4);
    write_bin(var.name + ".master.f32", out.data(), un * 4);
    download(out.data(), d_m.data(), un * 4);
    write_bin(var.name + ".exp_avg.f32", out.data(), un * 4);
    download(out.data(), d_v.data(), un * 4);
    write_bin(var.name + ".exp_avg_sq.f32", out.data(), un * 4);
    if (var.params) {
      download(g16.data(), d_params.data(), un * 2);
      write_bin(var.name + ".params.bf16", g16.data(), un * 2);
    }
    StepScalars fin;
    download(&fin, d_s.data(), sizeof fin);
    std::printf("%s: %d steps on %s, step counter %lld\n", var.name.c_str(), steps, to_string(be),
                static_cast<long long>(fin.step));
  }
  std::printf("wrote %s (n = %lld elements in %zu tensors)\n", o.torch_dir.c_str(), static_cast<long long>(n),
              table.size());
  return 0;
}

}  // namespace
}  // namespace shardopt::bench_adam

int main(int argc, char** argv) {
  using namespace shardopt;
  using namespace shardopt::bench_adam;
  Options o;
  o.command = bench::command_line(argc, argv);
  o.backend = cuda_device_count() > 0 ? Backend::Cuda : Backend::Host;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--peer-json") o.peer_json = next();
    else if (a == "--results") o.results = next();
    else if (a == "--iters") o.iters = std::stoi(next());
    else if (a == "--small") o.small = true;
    else if (a == "--torch-check-dir") o.torch_dir = next();
    else if (a == "--backend") o.backend = next() == "host" ? Backend::Host : Backend::Cuda;
    else if (a == "--only") o.only = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_adam [--peer-json FILE] [--results DIR] [--iters N] [--backend cuda|host] "
                   "[--small] [--torch-check-dir DIR] [--only TEXT]\n");
      return 2;
    }
  }
  try {
    if (!o.torch_dir.empty()) return torch_check_dump(o);
    if (o.backend == Backend::Host) return host_smoke(o);
    return run_device(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_adam: %s\n", e.what());
    return 1;
  }
}
