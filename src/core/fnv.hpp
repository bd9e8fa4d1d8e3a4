// fnv.hpp - FNV-1a, 64 bit: a stable hash that every rank computes identically (layout
// fingerprints, the ranks' agreement on options and staged byte counts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardopt::detail {

struct Fnv {
  std::uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= c[i];
      h *= 1099511628211ull;
    }
  }
  void i64(std::int64_t v) { bytes(&v, sizeof v); }
  /// The length, then the characters.
  void str(const std::string& s) {
    i64(static_cast<std::int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
};

}  // namespace shardopt::detail
