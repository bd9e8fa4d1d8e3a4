// muon_torch_run.cpp - our side of bench/peers/muon_torch_check.py (issue 34, docs/muon.md
// "Against torch.optim.Muon"): reads the matrices, gradients and Muon settings the script
// wrote (DIR/inputs.safetensors, the settings as JSON in its metadata key "muon_check"),
// runs DistributedAdam on a world of one with every matrix in one Muon group (f32
// parameters and gradients, loss scale 1, no clipping, the given lr per step), once per
// case, and writes each case's updated masters as DIR/ours_<case>.safetensors (F32, the
// parameters' names and shapes).
//
//   muon_torch_run DIR cuda|host      exit 77 (skip) for cuda without a usable GPU
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "common/device_util.hpp"
#include "formats/json.hpp"
#include "formats/safetensors.hpp"
#include "shardopt/error.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/muon.hpp"

namespace {
using namespace shardopt;

struct Param {
  std::string name;
  std::vector<std::uint64_t> shape;  // rows x cols, or experts x rows x cols
};

MuonSettings settings_of(const json::Value& c) {
  MuonSettings s;
  const std::string gemm = json::as_string(json::at(c, "gemm")), adjust = json::as_string(json::at(c, "adjust_lr"));
  SHARDOPT_REQUIRE(gemm == "bf16" || gemm == "f32", ErrorCode::InvalidArgument, "gemm must be bf16 or f32");
  SHARDOPT_REQUIRE(adjust == "original" || adjust == "match_rms_adamw", ErrorCode::InvalidArgument,
                   "adjust_lr must be original or match_rms_adamw");
  s.gemm = gemm == "bf16" ? MuonGemm::Bf16 : MuonGemm::F32;
  s.adjust_lr = adjust == "original" ? MuonLrAdjust::Original : MuonLrAdjust::MatchRmsAdamW;
  s.nesterov = json::as_bool(json::at(c, "nesterov"));
  s.momentum = json::as_double(json::at(c, "momentum"));
  s.weight_decay = json::as_double(json::at(c, "weight_decay"));
  s.ns_steps = static_cast<int>(json::as_int(json::at(c, "ns_steps")));
  s.eps = json::as_double(json::at(c, "eps"));
  const json::Array& co = json::as_array(json::at(c, "ns_coefficients"));
  SHARDOPT_REQUIRE(co.size() == 3, ErrorCode::InvalidArgument, "ns_coefficients needs 3 numbers");
  for (std::size_t i = 0; i < 3; ++i) s.ns_coefficients[i] = json::as_double(co[i]);
  return s;
}

std::vector<float> read_f32(const SafetensorsReader& r, const std::string& name, std::size_t n) {
  const SafetensorsEntry& e = r.tensor(name);
  SHARDOPT_REQUIRE(e.dtype == "F32" && e.bytes() == n * 4, ErrorCode::InvalidArgument,
                   "tensor '" + name + "' must be F32 with " + std::to_string(n) + " elements");
  std::vector<float> v(n);
  r.read(e, 0, v.data(), n * 4);
  return v;
}

void run_case(Backend b, const SafetensorsReader& in, const std::vector<Param>& params, const json::Value& c,
              const std::vector<double>& lrs, const std::string& out) {
  std::vector<ParamSpec> specs;
  for (const Param& p : params) {
    const auto d = [&](std::size_t i) { return static_cast<std::int64_t>(p.shape[i]); };
    specs.push_back(p.shape.size() == 2 ? ParamSpec::tensor(p.name, {d(0), d(1)}, DType::f32, "muon")
                                        : ParamSpec::grouped(p.name, static_cast<int>(d(0)), {d(1), d(2)},
                                                             DType::f32, "muon"));
  }
  DistributedAdamOptions o;
  o.grad_dtype = DType::f32;
  AdamGroup g;
  g.algorithm = GroupAlgorithm::Muon;
  g.muon = settings_of(c);
  o.groups["muon"] = g;
  test::TestStream s(b);
  DistributedAdam opt(Communicator::self(b), specs, o);
  for (int i = 0; i < opt.num_params(); ++i) {
    const ShardView v = opt.shard_master(i);
    test::from_host(b, v.data, read_f32(in, params[static_cast<std::size_t>(i)].name + ".master0",
                                        static_cast<std::size_t>(v.numel())));
  }
  opt.init_from_master(s.get());
  for (std::size_t t = 0; t < lrs.size(); ++t) {
    for (int i = 0; i < opt.num_params(); ++i) {
      const GradView gv = opt.grad(i);
      test::from_host(b, gv.data, read_f32(in, params[static_cast<std::size_t>(i)].name + ".grad" + std::to_string(t),
                                           static_cast<std::size_t>(gv.numel())));
    }
    opt.set_lr(static_cast<float>(lrs[t]));
    opt.step(s.get());
    opt.zero_grad(s.get());
    opt.synchronize(s.get());
  }
  SafetensorsWriter w(out);
  for (const Param& p : params) w.add_tensor(p.name, "F32", p.shape);
  w.set_metadata("backend", b == Backend::Cuda ? "cuda" : "host");
  for (int i = 0; i < opt.num_params(); ++i) {
    const ShardView v = opt.shard_master(i);
    const std::vector<float> m = test::to_host<float>(b, v.data, static_cast<std::size_t>(v.numel()));
    w.write(static_cast<std::size_t>(i), m.data(), m.size() * 4);
  }
  w.finish();
}

int run(const std::string& dir, Backend b) {
  const SafetensorsReader in(dir + "/inputs.safetensors");
  const std::string* text = in.find_metadata("muon_check");
  SHARDOPT_REQUIRE(text != nullptr, ErrorCode::InvalidArgument, "inputs.safetensors has no 'muon_check' metadata");
  const json::Value meta = json::parse(*text);
  std::vector<Param> params;
  for (const json::Value& p : json::as_array(json::at(meta, "params"))) {
    Param x{json::as_string(json::at(p, "name")), {}};
    for (const json::Value& d : json::as_array(json::at(p, "shape"))) x.shape.push_back(static_cast<std::uint64_t>(json::as_int(d)));
    SHARDOPT_REQUIRE(x.shape.size() == 2 || x.shape.size() == 3, ErrorCode::InvalidArgument,
                     "parameter '" + x.name + "' must be 2-D (a matrix) or 3-D (experts x rows x cols)");
    params.push_back(std::move(x));
  }
  std::vector<double> lrs;
  for (const json::Value& l : json::as_array(json::at(meta, "lrs"))) lrs.push_back(json::as_double(l));
  for (const json::Value& c : json::as_array(json::at(meta, "cases"))) {
    const std::string name = json::as_string(json::at(c, "name"));
    run_case(b, in, params, c, lrs, dir + "/ours_" + name + ".safetensors");
    std::printf("muon_torch_run: case %s done on %s\n", name.c_str(), b == Backend::Cuda ? "cuda" : "host");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[2]) != "cuda" && std::string(argv[2]) != "host")) {
    std::fprintf(stderr, "usage: muon_torch_run DIR cuda|host\n");
    return 2;
  }
  const Backend b = std::string(argv[2]) == "cuda" ? Backend::Cuda : Backend::Host;
  if (b == Backend::Cuda && (!cuda_compiled() || cuda_device_count() == 0)) {
    std::printf("muon_torch_run: no CUDA device, skipping\n");
    return 77;
  }
  try {
    return run(argv[1], b);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "muon_torch_run: %s\n", e.what());
    return 1;
  }
}
