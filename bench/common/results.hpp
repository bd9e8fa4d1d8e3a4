// results.hpp - one benchmark result as a JSON line: bench, config, device, ours_ms, peer,
// peer_ms, limit_ms, ratio_vs_peer (peer_ms / ours_ms), fraction_of_limit
// (limit_ms / ours_ms), extra numbers and notes, the exact command and the date (null for
// what is missing). Printed, and upserted into bench/results/<bench>.jsonl (a newer run
// replaces the older line of the same bench, config and device).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace shardopt::bench {

/// One configuration's measurement. Unset optionals are written as null.
struct Result {
  std::string bench;                ///< e.g. "adam_step"
  std::string config;               ///< e.g. "fp32/1.5B/147"
  std::string device;               ///< the device name as the driver reports it
  std::optional<double> ours_ms;
  std::string peer;                 ///< what the peer is ("" -> null)
  std::optional<double> peer_ms;
  std::optional<double> limit_ms;
  std::map<std::string, double> numbers;      ///< extra numeric fields (GB/s, bytes, ...)
  std::map<std::string, std::string> notes;   ///< extra string fields
  std::string command;              ///< the exact command line
};

/// The command line of this process, joined with spaces (for Result::command).
std::string command_line(int argc, char** argv);

/// Today's date, YYYY-MM-DD.
std::string today();

/// The JSON object for a result, with ratio_vs_peer = peer/ours and
/// fraction_of_limit = limit/ours (null where an input is missing).
std::string to_json(const Result& r);

/// Prints the JSON line and upserts it into `results_dir`/<bench>.jsonl (skipped when
/// results_dir is empty).
void write(const Result& r, const std::string& results_dir);

/// A peer's timing of one configuration.
struct PeerTiming {
  double ms = 0;
  std::string description;
};

/// Reads a peer file written by a script in bench/peers: one line per configuration,
/// "config<TAB>ms<TAB>description". Missing file -> empty map.
std::map<std::string, PeerTiming> read_peer_file(const std::string& path);

/// Fills r.peer and r.peer_ms from the peer file at `path` when it has r.config (an
/// empty path or a missing config leaves them unset, i.e. null).
void apply_peer(Result& r, const std::string& path);

/// A result measured against copy bandwidth (bench_mxfp8, bench_nvfp4): ours_ms, limit_ms
/// = bytes / copy bandwidth, and the numbers bytes, elements, gbps (bytes / ours_ms) and
/// copy_gbps. The caller sets device, command, notes and any other numbers.
Result bandwidth_result(const std::string& bench, const std::string& config, double ours_ms, double bytes,
                        std::int64_t elements, double copy_gbps);

/// Median of a sample (the sample is copied).
double median(std::vector<double> v);

}  // namespace shardopt::bench
