// bench_adam.hpp - what bench_adam's two halves share: its options, the configurations
// (one per state mode, with its bytes per parameter), the one-bucket layout, and the
// device half (bench_adam_cuda.cpp in a CUDA build; in a build without CUDA,
// common/device_halves_none.cpp, which refuses with exit code 77). The host half
// (bench_adam.cpp) parses, runs the host smoke run and the torch check, and calls run_device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"

namespace shardopt::bench_adam {

struct Options {
  Backend backend = Backend::Cuda;
  bool small = false;
  int iters = 50;
  std::string peer_json, results, torch_dir;
  std::string only;  ///< run only the configs whose name contains this (empty: all)
  std::string command;
};

/// One benchmark configuration.
struct Config {
  std::string name;
  AdamConfig adam;
  double bytes_per_param;
  std::string peer_key, peer_desc;
};

/// Every configuration, in the order of the results: fp32, bf16 grads and params, then
/// the state precision modes.
std::vector<Config> configs();

/// A one-rank layout with one bucket holding the whole model: the shard is one flat buffer
/// and buffer offsets equal shard offsets. `small`: a tiny transformer (the host runs);
/// `q8`: parameter starts on 8-bit moment blocks (what the optimizers' layouts do then).
Layout one_bucket_layout(bool small, bool q8 = false);

/// The number of elements a chunk table covers.
std::int64_t chunk_elements(const std::vector<ShardChunk>& t);

/// The numeric value of "key" in a flat JSON object written by adam_peer.py; nullopt if absent.
std::optional<double> json_number(const std::string& text, const std::string& key);
/// The whole file at `path` (std::runtime_error if it cannot be read).
std::string read_file(const std::string& path);

/// The CUDA benchmark: every configuration whose name contains Options::only, against the
/// copy bandwidth measured first and the peer's file; returns the exit code.
int run_device(const Options& o);

}  // namespace shardopt::bench_adam
