// A checkpoint written by an earlier build still loads, and today's writer writes the same
// bytes. test/data/checkpoint_v1 was written by the code before the JSON layer moved to
// nlohmann's DOM (issue 49): one rank, host backend, a DistributedAdam of three small
// parameters after two steps of the gradients below. The values checked here were read
// from that run and written down; nothing in this test recomputes them.
// Regenerate (only when the format changes on purpose, with a new format_version):
//   SHARDOPT_CKPT_V1_WRITE=DIR build/test/unit_checkpoint_v1 --gtest_filter='*Write*'
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include "shardopt/shardopt.hpp"

namespace {
using namespace shardopt;
namespace fs = std::filesystem;

std::vector<ParamSpec> v1_model() {
  return {ParamSpec::tensor("w", {2, 3}, DType::f32),
          ParamSpec::tensor("b", {3}, DType::bf16, "no_decay"),
          ParamSpec::grouped("e", /*members=*/2, {2})};
}

DistributedAdamOptions v1_options() {
  DistributedAdamOptions o;
  o.grad_dtype = DType::f32;
  o.groups["decay"] = AdamGroup{0.1, 1.0};
  o.groups["no_decay"] = AdamGroup{0.0, 1.0};
  o.lr_schedule = LrSchedule::constant(1e-2f);
  return o;
}

std::string data_dir() {
  const char* d = std::getenv("SHARDOPT_CKPT_V1_DIR");  // set by test/unit/meson.build
  return d != nullptr ? d : "test/data/checkpoint_v1";
}

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Element j of parameter i's view as a float (f32 or bf16).
float param_at(const DistributedAdam& opt, int i, std::int64_t j) {
  const ParamView v = opt.param(i);
  if (v.dtype == DType::f32) return v.as<float>()[j];
  return num::bf16_to_f32(v.as<std::uint16_t>()[j]);
}

float shard_at(const ShardView& v, std::int64_t j) {
  if (v.dtype == DType::f32) return v.as<float>()[j];
  return num::bf16_to_f32(v.as<std::uint16_t>()[j]);
}

// The run that wrote the data: parameters 0.1 * (k + 1) - 0.3 (k counting every element
// of every parameter), then two steps of gradients (k - 2) / 8 + step / 16.
void train_v1(DistributedAdam& opt, Stream s) {
  int k = 0;
  for (int i = 0; i < opt.num_params(); ++i)
    for (std::int64_t j = 0; j < opt.param(i).numel(); ++j, ++k) {
      const float x = 0.1f * static_cast<float>(k + 1) - 0.3f;
      const ParamView v = opt.param(i);
      if (v.dtype == DType::f32) v.as<float>()[j] = x;
      else v.as<std::uint16_t>()[j] = num::f32_to_bf16(x);
    }
  opt.init_master(s);
  for (int step = 1; step <= 2; ++step) {
    k = 0;
    for (int i = 0; i < opt.num_params(); ++i)
      for (std::int64_t j = 0; j < opt.grad(i).numel(); ++j, ++k)
        opt.grad(i).as<float>()[j] = static_cast<float>(k - 2) / 8.0f + static_cast<float>(step) / 16.0f;
    for (int i = opt.num_params() - 1; i >= 0; --i) opt.grad_ready(i, s);
    opt.step(s);
    opt.zero_grad(s);
  }
  opt.synchronize(s);
}

// Writes the checkpoint and prints the values the load test checks (run by hand).
TEST(CheckpointV1, WriteWithThisBuild) {
  const char* out = std::getenv("SHARDOPT_CKPT_V1_WRITE");
  if (out == nullptr) GTEST_SKIP() << "SHARDOPT_CKPT_V1_WRITE is not set";
  HostStream hs;
  DistributedAdam opt(Communicator::self(Backend::Host), v1_model(), v1_options());
  train_v1(opt, hs.handle());
  opt.save(out, hs.handle(), {{"data_position", "42"}, {"note", "checkpoint_v1"}});
  for (int i = 0; i < opt.num_params(); ++i) {
    std::printf("param %d:", i);
    for (std::int64_t j = 0; j < opt.param(i).numel(); ++j) std::printf(" %.9g", param_at(opt, i, j));
    std::printf("\n");
    for (const auto& [what, v] : {std::pair{"master", opt.shard_master(i)}, std::pair{"exp_avg", opt.shard_exp_avg(i)},
                                  std::pair{"exp_avg_sq", opt.shard_exp_avg_sq(i)}}) {
      std::printf("  %s:", what);
      for (std::int64_t j = 0; j < v.numel(); ++j) std::printf(" %.9g", shard_at(v, j));
      std::printf("\n");
    }
  }
}

// The values the writing run printed (WriteWithThisBuild), in %.9g: exact for floats.
struct Expected {
  std::vector<float> param, master, exp_avg, exp_avg_sq;
};
const std::vector<Expected> kExpected = {
    {{-0.179906696f, -0.0831095278f, -0.0196418166f, 0.0798368677f, 0.179604053f, 0.279397786f},
     {-0.179906696f, -0.0831095278f, -0.0196418166f, 0.0798368677f, 0.179604053f, 0.279397786f},
     {-0.0293750018f, -0.00562500022f, 0.0181249995f, 0.041875001f, 0.065624997f, 0.0893750042f},
     {5.07460936e-05f, 3.90234391e-06f, 1.95273442e-05f, 9.7621094e-05f, 0.000238183595f, 0.000441214885f}},
    {{0.380859375f, 0.48046875f, 0.58203125f},
     {0.380377054f, 0.479986817f, 0.581550062f},
     {0.113125004f, 0.136875004f, 0.160625011f},
     {0.000706714927f, 0.00103468366f, 0.0014251211f}},
    {{0.6796875f, 0.77734375f, 0.875f, 0.9765625f},
     {0.677819431f, 0.779179633f, 0.876641512f, 0.978001654f},
     {0.184375003f, 0.208124995f, 0.231875002f, 0.25562501f},
     {0.00187802745f, 0.00239340239f, 0.00297124637f, 0.00361155905f}},
};

TEST(CheckpointV1, LoadsWithTheValuesItWasWrittenWith) {
  HostStream hs;
  DistributedAdam opt(Communicator::self(Backend::Host), v1_model(), v1_options());
  const CheckpointInfo info = opt.load(data_dir(), hs.handle());
  opt.synchronize(hs.handle());
  EXPECT_EQ(info.step, 2);
  EXPECT_EQ(info.saved_world_size, 1);
  EXPECT_EQ(info.loss_scale, 1.0f);
  EXPECT_EQ(info.lr, 1e-2f);
  EXPECT_EQ(info.user, (CheckpointUserData{{"data_position", "42"}, {"note", "checkpoint_v1"}}));
  EXPECT_NE(info.options_json.find("\"eps\":1e-08,"), std::string::npos) << info.options_json;
  EXPECT_EQ(opt.read_scalars(hs.handle()).step, 2);
  ASSERT_EQ(opt.num_params(), static_cast<int>(kExpected.size()));
  for (int i = 0; i < opt.num_params(); ++i) {
    SCOPED_TRACE("param " + std::to_string(i));
    const Expected& e = kExpected[static_cast<std::size_t>(i)];
    ASSERT_EQ(opt.param(i).numel(), static_cast<std::int64_t>(e.param.size()));
    for (std::size_t j = 0; j < e.param.size(); ++j) {
      const auto jj = static_cast<std::int64_t>(j);
      EXPECT_EQ(param_at(opt, i, jj), e.param[j]) << j;
      EXPECT_EQ(shard_at(opt.shard_master(i), jj), e.master[j]) << j;
      EXPECT_EQ(shard_at(opt.shard_exp_avg(i), jj), e.exp_avg[j]) << j;
      EXPECT_EQ(shard_at(opt.shard_exp_avg_sq(i), jj), e.exp_avg_sq[j]) << j;
    }
  }
}

TEST(CheckpointV1, ThisBuildWritesTheSameBytes) {
  // The writer's bytes (index.json's and the safetensors header's JSON, numbers included)
  // are the format: the same run today must write the same two files.
  const fs::path dir = fs::temp_directory_path() / ("shardopt-ckpt-v1-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    HostStream hs;
    DistributedAdam opt(Communicator::self(Backend::Host), v1_model(), v1_options());
    train_v1(opt, hs.handle());
    opt.save(dir.string(), hs.handle(), {{"data_position", "42"}, {"note", "checkpoint_v1"}});
  }
  for (const char* name : {"index.json", "shard-00000-of-00001.safetensors"}) {
    const std::string want = file_text(fs::path(data_dir()) / name);
    ASSERT_FALSE(want.empty()) << name;
    EXPECT_TRUE(file_text(dir / name) == want) << name << " differs from test/data/checkpoint_v1";
  }
  fs::remove_all(dir);
}

}  // namespace
