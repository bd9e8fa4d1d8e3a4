#include "optimizer/muon_plan.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.hpp"
#include "core/fnv.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {
namespace {

std::string shape_text(const Shape& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

void check_settings(const MuonSettings& s, const std::string& group) {
  const std::string where = "optimizer group '" + group + "' (Muon): ";
  SHARDOPT_REQUIRE(s.momentum >= 0.0 && s.momentum < 1.0, ErrorCode::InvalidArgument,
                   where + "momentum must lie in [0, 1)");
  SHARDOPT_REQUIRE(s.ns_steps >= 1 && s.ns_steps < 100, ErrorCode::InvalidArgument,
                   where + "ns_steps must lie in [1, 100)");
  SHARDOPT_REQUIRE(s.eps > 0.0 && std::isfinite(s.eps), ErrorCode::InvalidArgument,
                   where + "eps must be positive and finite");
  SHARDOPT_REQUIRE(std::isfinite(s.weight_decay), ErrorCode::InvalidArgument, where + "weight_decay must be finite");
  for (double c : s.ns_coefficients)
    SHARDOPT_REQUIRE(std::isfinite(c), ErrorCode::InvalidArgument, where + "ns_coefficients must be finite");
}

// Rank r's piece of every parameter: (first element within the parameter, length).
std::vector<std::pair<std::int64_t, std::int64_t>> pieces_of(const Layout& L, int r) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out(L.params().size(), {0, 0});
  for (std::size_t b = 0; b < L.buffers().size(); ++b)
    for (const Segment& s : L.segments(static_cast<int>(b), r))
      out[static_cast<std::size_t>(s.param)] = {s.param_offset, s.length};
  return out;
}

}  // namespace

double newton_schulz_cost(std::int64_t rows, std::int64_t cols, int ns_steps) noexcept {
  const double n = static_cast<double>(std::min(rows, cols)), k = static_cast<double>(std::max(rows, cols));
  return ns_steps * (2.0 * n * n * k + n * n * n);
}

std::vector<int> assign_muon_homes(const std::vector<double>& costs, int world) {
  SHARDOPT_REQUIRE(world >= 1, ErrorCode::InvalidArgument, "assign_muon_homes: world must be >= 1");
  std::vector<std::size_t> order(costs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(static_cast<std::size_t>(world), 0.0);
  std::vector<int> home(costs.size(), 0);
  for (std::size_t k : order) {
    const auto least = std::min_element(load.begin(), load.end());  // the first of equal loads
    home[k] = static_cast<int>(least - load.begin());
    *least += costs[k];
  }
  return home;
}

bool has_muon(const std::vector<AdamGroup>& groups) noexcept {
  return std::any_of(groups.begin(), groups.end(),
                     [](const AdamGroup& g) { return g.algorithm == GroupAlgorithm::Muon; });
}

std::vector<MuonMatrixInfo> muon_matrices(const Layout& L, const std::vector<AdamGroup>& groups) {
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (groups[g].algorithm == GroupAlgorithm::Muon) check_settings(groups[g].muon, L.groups()[g]);
  std::vector<MuonMatrixInfo> out;
  for (std::size_t p = 0; p < L.params().size(); ++p) {
    const ParamPlacement& pl = L.params()[p];
    const AdamGroup& g = groups[static_cast<std::size_t>(pl.group)];
    if (g.algorithm != GroupAlgorithm::Muon) continue;
    const ParamSpec& spec = L.specs()[p];
    const Shape& member = spec.member_shapes.empty() ? spec.shape : spec.member_shapes.front();
    SHARDOPT_REQUIRE(member.size() == 2, ErrorCode::InvalidArgument,
                     "parameter '" + spec.name + "' " + shape_text(spec.shape) + " is in Muon group '" + spec.group +
                         "' but is not a 2-D matrix nor a grouped parameter of 2-D members; Muon orthogonalizes "
                         "matrices only: put it in an AdamW group");
    for (int m = 0; m < pl.members; ++m) {
      MuonMatrixInfo mi;
      mi.param = static_cast<int>(p);
      mi.member = m;
      mi.rows = member[0];
      mi.cols = member[1];
      mi.offset = m * pl.member_numel;
      mi.group = pl.group;
      mi.cost = newton_schulz_cost(mi.rows, mi.cols, g.muon.ns_steps);
      out.push_back(mi);
    }
  }
  std::vector<double> costs;
  for (const auto& mi : out) costs.push_back(mi.cost);
  const std::vector<int> homes = assign_muon_homes(costs, L.world_size());
  for (std::size_t k = 0; k < out.size(); ++k) out[k].home = homes[k];
  return out;
}

MuonExchangePlan muon_exchange_plan(const Layout& L, int rank, const std::vector<MuonMatrixInfo>& matrices) {
  const int world = L.world_size();
  MuonExchangePlan plan;
  std::vector<std::int64_t> sent(static_cast<std::size_t>(world) * world, 0);  // [src * world + home]
  for (int r = 0; r < world; ++r) {
    const auto pieces = pieces_of(L, r);
    for (std::size_t k = 0; k < matrices.size(); ++k) {
      const MuonMatrixInfo& mi = matrices[k];
      const auto [first, length] = pieces[static_cast<std::size_t>(mi.param)];
      const std::int64_t lo = std::max(first, mi.offset), hi = std::min(first + length, mi.offset + mi.rows * mi.cols);
      if (lo >= hi) continue;
      if (r == mi.home) {  // the home's own piece stays on the rank: no slot
        if (r == rank) plan.locals.push_back({static_cast<int>(k), lo - mi.offset, hi - lo, 0, rank});
        continue;
      }
      std::int64_t& pos = sent[static_cast<std::size_t>(r) * world + mi.home];
      const MuonRun run{static_cast<int>(k), lo - mi.offset, hi - lo, pos, 0};
      if (r == rank) plan.sends.push_back({run.matrix, run.offset, run.length, run.slot_pos, mi.home});
      if (mi.home == rank) plan.receives.push_back({run.matrix, run.offset, run.length, run.slot_pos, r});
      pos += hi - lo;
    }
  }
  plan.slot = *std::max_element(sent.begin(), sent.end());
  return plan;
}

std::uint64_t muon_plan_hash(const std::vector<MuonMatrixInfo>& matrices) {
  Fnv f;
  for (const auto& mi : matrices) {
    const std::int64_t v[] = {mi.param, mi.member, mi.rows, mi.cols, mi.offset, mi.group, mi.home};
    f.bytes(v, sizeof v);
  }
  return f.h;
}

}  // namespace shardopt::detail
