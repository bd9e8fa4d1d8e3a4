// muon_plan.hpp - who orthogonalizes which Muon matrix, and how the pieces travel
// (docs/muon.md). Pure host computation from the layout and the groups' settings: every
// rank computes the same plan.
//
// A Muon matrix is a 2-D parameter, or one member (expert) of a grouped parameter whose
// members are 2-D, in a group whose algorithm is Muon. Each matrix gets a home rank:
// matrices in order of falling Newton-Schulz cost (ties: the lower matrix index first)
// each go to the rank with the least cost assigned so far (ties: the lower rank).
// Every rank's piece of a matrix goes to its home in one all-to-all of equal slots
// (slot size = the largest piece total any rank sends another home); the home's update
// returns the same way. The home's own pieces take no slot: it packs them straight into
// the matrix and applies them from there (at one rank nothing is exchanged).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"

namespace shardopt::detail {

/// One Muon matrix.
struct MuonMatrixInfo {
  int param = 0;               ///< layout parameter index
  int member = 0;              ///< member of a grouped parameter (0 for a plain one)
  std::int64_t rows = 0, cols = 0;
  std::int64_t offset = 0;     ///< first element within the parameter
  int group = 0;               ///< layout group index
  double cost = 0.0;           ///< newton_schulz_cost of the matrix
  int home = 0;                ///< the rank that orthogonalizes it
};

/// Multiply-adds of ns_steps iterations on a rows x cols matrix (n = min, k = max):
/// ns_steps * (2 n^2 k + n^3).
double newton_schulz_cost(std::int64_t rows, std::int64_t cols, int ns_steps) noexcept;

/// The homes of matrices of these costs on `world` ranks (largest cost first to the
/// least-loaded rank; ties as in the file comment). Deterministic.
std::vector<int> assign_muon_homes(const std::vector<double>& costs, int world);

/// True when some group of `groups` (by layout group index) chooses Muon.
bool has_muon(const std::vector<AdamGroup>& groups) noexcept;

/// Checks the Muon groups' settings and parameters and lists their matrices with homes
/// on layout.world_size() ranks. Error(InvalidArgument) naming the parameter for one that
/// is neither 2-D nor grouped with 2-D members, or naming the group for a bad setting.
std::vector<MuonMatrixInfo> muon_matrices(const Layout& layout, const std::vector<AdamGroup>& groups);

/// One run of elements in an exchange slot.
struct MuonRun {
  int matrix = 0;              ///< index into the matrix list
  std::int64_t offset = 0;     ///< first element within the matrix
  std::int64_t length = 0;
  std::int64_t slot_pos = 0;   ///< position within the slot of the peer rank
  int peer = 0;                ///< the home (runs this rank sends) or the source (runs it receives)
};

/// This rank's part of the exchange.
struct MuonExchangePlan {
  std::int64_t slot = 0;           ///< elements per rank slot of the all-to-all (same on every rank; 0: none)
  std::vector<MuonRun> sends;      ///< this rank's pieces of matrices homed elsewhere, by home then matrix
  std::vector<MuonRun> receives;   ///< other ranks' pieces of matrices homed here, by source then matrix
  std::vector<MuonRun> locals;     ///< this rank's pieces of matrices homed here (peer = rank, slot_pos 0)
};

MuonExchangePlan muon_exchange_plan(const Layout& layout, int rank, const std::vector<MuonMatrixInfo>& matrices);

/// Hash of the matrices and their homes (equal on ranks that computed the same plan).
std::uint64_t muon_plan_hash(const std::vector<MuonMatrixInfo>& matrices);

}  // namespace shardopt::detail
