#include "results.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

namespace shardopt::bench {
namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

std::string number(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return "null";
  std::ostringstream os;
  os.precision(6);
  os << *v;
  return os.str();
}

// Value of a top-level string field in one of our own JSON lines.
std::string field(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\": \"";
  auto p = line.find(k);
  if (p == std::string::npos) return "";
  p += k.size();
  auto e = line.find('"', p);
  return e == std::string::npos ? "" : line.substr(p, e - p);
}

}  // namespace

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += argv[i];
  }
  return s;
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::localtime(&t));
  return buf;
}

std::string to_json(const Result& r) {
  std::optional<double> ratio, fraction;
  if (r.ours_ms && r.peer_ms && *r.ours_ms > 0) ratio = *r.peer_ms / *r.ours_ms;
  if (r.ours_ms && r.limit_ms && *r.ours_ms > 0) fraction = *r.limit_ms / *r.ours_ms;
  std::ostringstream os;
  os << "{\"bench\": " << quote(r.bench) << ", \"config\": " << quote(r.config) << ", \"device\": " << quote(r.device)
     << ", \"ours_ms\": " << number(r.ours_ms) << ", \"peer\": " << (r.peer.empty() ? "null" : quote(r.peer))
     << ", \"peer_ms\": " << number(r.peer_ms) << ", \"limit_ms\": " << number(r.limit_ms)
     << ", \"ratio_vs_peer\": " << number(ratio) << ", \"fraction_of_limit\": " << number(fraction);
  for (const auto& [k, v] : r.numbers) os << ", " << quote(k) << ": " << number(v);
  for (const auto& [k, v] : r.notes) os << ", " << quote(k) << ": " << quote(v);
  os << ", \"command\": " << quote(r.command) << ", \"date\": " << quote(today()) << "}";
  return os.str();
}

void write(const Result& r, const std::string& results_dir) {
  const std::string line = to_json(r);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (results_dir.empty()) return;
  const std::string path = results_dir + "/" + r.bench + ".jsonl";
  std::vector<std::string> kept;
  {
    std::ifstream in(path);
    std::string l;
    while (std::getline(in, l)) {
      if (l.empty()) continue;
      if (field(l, "bench") == r.bench && field(l, "config") == r.config && field(l, "device") == r.device) continue;
      kept.push_back(l);
    }
  }
  kept.push_back(line);
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : kept) out << l << "\n";
}

std::map<std::string, PeerTiming> read_peer_file(const std::string& path) {
  std::map<std::string, PeerTiming> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto t1 = line.find('\t');
    if (t1 == std::string::npos) continue;
    const auto t2 = line.find('\t', t1 + 1);
    PeerTiming p;
    p.ms = std::atof(line.substr(t1 + 1, t2 == std::string::npos ? std::string::npos : t2 - t1 - 1).c_str());
    if (t2 != std::string::npos) p.description = line.substr(t2 + 1);
    out[line.substr(0, t1)] = p;
  }
  return out;
}

void apply_peer(Result& r, const std::string& path) {
  if (path.empty()) return;
  const auto peers = read_peer_file(path);
  if (auto it = peers.find(r.config); it != peers.end()) {
    r.peer = it->second.description;
    r.peer_ms = it->second.ms;
  }
}

Result bandwidth_result(const std::string& bench, const std::string& config, double ours_ms, double bytes,
                        std::int64_t elements, double copy_gbps) {
  Result r;
  r.bench = bench;
  r.config = config;
  r.ours_ms = ours_ms;
  r.limit_ms = bytes / (copy_gbps * 1e6);
  r.numbers["bytes"] = bytes;
  r.numbers["elements"] = static_cast<double>(elements);
  r.numbers["gbps"] = bytes / (ours_ms * 1e6);
  r.numbers["copy_gbps"] = copy_gbps;
  return r;
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace shardopt::bench
