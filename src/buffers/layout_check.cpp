// check_layout: every rank must have computed the same layout (same specs and world size, same layout).
//
// Round 1 all-gathers each rank's fingerprint, parameter count and layout options. If
// the fingerprints differ, round 2 all-gathers the per-parameter hashes, padded to the
// longest list so every rank runs the same collectives, and finds the first index where
// ranks differ; round 3 all-gathers each rank's description of that parameter. Every
// rank sees the same gathered data, so every rank throws the same Error(LayoutMismatch)
// at the same point and none is left waiting in a collective. The group stays usable:
// the mismatch is not a failure of the communicator.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"
#include "shardopt/layout.hpp"

namespace shardopt {
namespace {

constexpr std::size_t kRound1 = 6;          // fingerprint, count, world, threshold, alignment, pad multiple
constexpr std::size_t kDescriptionWords = 32;  // 256 bytes of text per rank
constexpr std::uint64_t kMissing = 0;       // hash slot of a parameter a rank does not have

std::vector<std::uint64_t> pack(const std::string& text) {
  std::vector<std::uint64_t> words(kDescriptionWords, 0);
  const std::size_t n = std::min(text.size(), kDescriptionWords * 8 - 1);
  std::memcpy(words.data(), text.data(), n);
  return words;
}

std::string unpack(const std::uint64_t* words) {
  const char* c = reinterpret_cast<const char*>(words);
  return std::string(c, strnlen(c, kDescriptionWords * 8));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// "ranks 0, 1: <a>; rank 2: <b>" with keys grouped in order of first appearance.
template <class Key>
std::string grouped(const std::vector<Key>& per_rank, const std::vector<std::string>& text) {
  std::vector<Key> order;
  std::map<Key, std::vector<int>> ranks;
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    if (!ranks.count(per_rank[r])) order.push_back(per_rank[r]);
    ranks[per_rank[r]].push_back(static_cast<int>(r));
  }
  std::string s;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto& rs = ranks[order[i]];
    s += (i ? "; " : "") + rank_list(rs) + ": " + text[static_cast<std::size_t>(rs.front())];
  }
  return s;
}

}  // namespace

void check_layout(const Communicator& comm, const Layout& layout) {
  const int world = comm.size();
  const auto& specs = layout.specs();
  const std::size_t count = specs.size();

  // Round 1.
  const std::vector<std::uint64_t> mine = {layout.fingerprint(),
                                           static_cast<std::uint64_t>(count),
                                           static_cast<std::uint64_t>(layout.world_size()),
                                           static_cast<std::uint64_t>(layout.bucket_threshold()),
                                           static_cast<std::uint64_t>(layout.alignment()),
                                           static_cast<std::uint64_t>(layout.pad_multiple())};
  const std::vector<std::uint64_t> r1 = comm.all_gather_values(mine);
  auto at1 = [&](int r, std::size_t field) { return r1[static_cast<std::size_t>(r) * kRound1 + field]; };
  bool agree = true;
  std::size_t longest = 0;
  for (int r = 0; r < world; ++r) {
    agree = agree && at1(r, 0) == at1(0, 0);
    longest = std::max<std::size_t>(longest, at1(r, 1));
  }
  if (agree) {
    SHARDOPT_REQUIRE(layout.world_size() == world, ErrorCode::InvalidArgument,
                     "the layout was computed for a world size of " + std::to_string(layout.world_size()) +
                         " but the communicator has " + std::to_string(world) +
                         " ranks; build the Layout with comm.size()");
    return;
  }

  // Round 2: which parameter differs first.
  std::vector<std::uint64_t> hashes(longest, kMissing);
  for (std::size_t i = 0; i < count; ++i) hashes[i] = layout.param_hash(static_cast<int>(i));
  const std::vector<std::uint64_t> r2 = comm.all_gather_values(hashes);
  auto hash_at = [&](int r, std::size_t i) { return r2[static_cast<std::size_t>(r) * longest + i]; };
  std::size_t first = longest;
  for (std::size_t i = 0; i < longest && first == longest; ++i)
    for (int r = 1; r < world; ++r)
      if (hash_at(r, i) != hash_at(0, i)) {
        first = i;
        break;
      }

  if (first == longest) {
    // Same parameters everywhere: the options or the world size differ.
    std::vector<std::string> text(static_cast<std::size_t>(world));
    std::vector<std::vector<std::uint64_t>> key(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      text[static_cast<std::size_t>(r)] = "world size " + std::to_string(at1(r, 2)) + ", bucket threshold " +
                                          std::to_string(at1(r, 3)) + ", alignment " + std::to_string(at1(r, 4)) +
                                          ", padding multiple " + std::to_string(at1(r, 5));
      key[static_cast<std::size_t>(r)] = {at1(r, 2), at1(r, 3), at1(r, 4), at1(r, 5)};
    }
    throw Error(ErrorCode::LayoutMismatch,
                "ranks register the same " + std::to_string(count) +
                    " parameters but computed different layouts (" + grouped(key, text) +
                    "); pass the same LayoutOptions and world size on every rank");
  }

  // Round 3: every rank's description of the first differing parameter.
  const std::string own = first < count ? describe(specs[first])
                                        : "(no parameter #" + std::to_string(first) + ": only " +
                                              std::to_string(count) + " registered)";
  const std::vector<std::uint64_t> r3 = comm.all_gather_values(pack(own));
  std::vector<std::string> text(static_cast<std::size_t>(world));
  std::vector<std::uint64_t> key(static_cast<std::size_t>(world));
  std::vector<int> differ;
  for (int r = 0; r < world; ++r) {
    text[static_cast<std::size_t>(r)] = unpack(r3.data() + static_cast<std::size_t>(r) * kDescriptionWords);
    key[static_cast<std::size_t>(r)] = hash_at(r, first);
    if (hash_at(r, first) != hash_at(0, first)) differ.push_back(r);
  }
  throw Error(ErrorCode::LayoutMismatch,
              "ranks disagree on parameter #" + std::to_string(first) + " (registration order): " +
                  grouped(key, text) + ". " + rank_list(differ) + " differ" + (differ.size() == 1 ? "s" : "") +
                  " from rank 0. Register the same parameters (names, shapes, dtypes, groups) in the same "
                  "order on every rank");
}

}  // namespace shardopt
