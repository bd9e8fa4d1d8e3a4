// muon_pass.hpp - the Muon part of one rank's step (docs/muon.md), owned by the shard
// engine when a group chooses Muon. After the gradient norm and found-inf are known:
// copy this rank's raw gradient pieces of every Muon matrix homed elsewhere into the send
// slots of their homes; one all-to-all in the gradient dtype; the home scales them into
// each of its matrices (its own pieces straight from its gradients), updates its momentum
// and runs Newton-Schulz; the updates go back by a second all-to-all (bf16 when every
// group runs bf16 GEMMs); each rank applies weight decay and the adjusted lr to its fp32
// master pieces (and writes its parameter slices). All buffers are allocated here, at
// construction; the step enqueues work only, so it captures.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.hpp"
#include "kernels/muon/muon.hpp"
#include "optimizer/muon_plan.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/memory_report.hpp"

namespace shardopt::detail {

/// Where this rank's piece of one parameter lives in the engine's storage (its first
/// element in each), for the Muon parameters.
struct MuonPieceStorage {
  const void* grad = nullptr;
  float* master = nullptr;
  void* param = nullptr;  ///< null: the parameter is stored elsewhere (master only)
  DType param_dtype = DType::bf16;
  std::int64_t param_offset = 0;  ///< the piece's first element within the parameter
};

/// The dtype the updates travel back in: bf16 on CUDA when every Muon matrix runs bf16
/// GEMMs (Newton-Schulz's result is then a bf16 value, exact in bf16), else fp32 (the host
/// backend's Newton-Schulz is fp32 whatever the setting).
DType muon_update_exchange_dtype(Backend backend, const std::vector<AdamGroup>& groups,
                                 const std::vector<MuonMatrixInfo>& matrices) noexcept;

class MuonPass {
 public:
  /// `groups` by layout group index; validates them (see muon_matrices). `host_params`
  /// (by layout parameter index; empty: none) names the parameters whose state lives in
  /// pinned host memory (AdamOptions::offload_fraction): the momentum of such a matrix
  /// homed here is not allocated on the device but placed by place_host_momentum.
  MuonPass(Backend backend, const Layout& layout, int rank, const std::vector<AdamGroup>& groups,
           const std::vector<bool>& host_params = {});

  /// Binds the storage of this rank's pieces (indexed by parameter; read for Muon
  /// parameters only). The engine calls it once every buffer is bound (construction).
  void bind(const std::vector<MuonPieceStorage>& pieces, DType grad_dtype);
  bool bound() const noexcept { return bound_; }
  /// Floats of momentum that live on the host (the homed matrices of host_params).
  std::int64_t host_momentum_numel() const noexcept { return host_momentum_numel_; }
  /// Where that momentum lives: host_momentum_numel() zeroed floats of pinned memory,
  /// which the step's kernels read and write in place (mapped). Before bind.
  void place_host_momentum(float* host);
  /// Enqueues the Muon step on `stream`: two all-to-alls over `comm` (the layout's world).
  /// Error(Internal) before bind.
  void step(const Communicator& comm, StepScalars* scalars, Stream stream) const;

  const std::vector<MuonMatrixInfo>& matrices() const noexcept { return matrices_; }
  /// The dtypes of the two all-to-alls: the gradients travel raw in the gradient dtype
  /// (set by bind), the updates in muon_update_exchange_dtype.
  DType gradient_exchange_dtype() const noexcept { return grad_dtype_; }
  DType update_exchange_dtype() const noexcept { return update_dtype_; }
  /// Elements of one rank's slot in either all-to-all (0: no exchange).
  std::int64_t exchange_slot() const noexcept { return plan_.slot; }
  /// Hash of the matrices and homes, for the ranks' agreement check.
  std::uint64_t plan_hash() const noexcept { return muon_plan_hash(matrices_); }
  /// The momentum of a matrix homed here (fp32, whole; device or pinned host memory), or
  /// null for a matrix homed elsewhere.
  float* momentum(int matrix) const;
  /// The device momentum -> moments; the exchange slots, the matrices' work buffers -> pool
  /// (the host momentum is the offload's, counted by it).
  void add_memory(MemoryReport& r) const;

 private:
  Backend backend_;
  std::vector<AdamGroup> groups_;
  std::vector<MuonMatrixInfo> matrices_;
  MuonExchangePlan plan_;
  std::vector<std::int64_t> local_;     // per matrix: its offset in matrix_ (-1: homed elsewhere)
  std::vector<std::int64_t> momentum_at_;  // per homed matrix: its offset in momentum_ or in the host momentum
  std::vector<bool> momentum_on_host_;     // per matrix
  std::int64_t host_momentum_numel_ = 0;
  float* host_momentum_ = nullptr;
  DeviceBuffer send_, recv_, momentum_, matrix_;
  DType grad_dtype_ = DType::f32;
  DType update_dtype_ = DType::f32;
  bool bound_ = false;
  kernels::MuonRuns<kernels::MuonCopy> send_copy_;       // raw gradient pieces into the send slots
  kernels::MuonRuns<kernels::MuonPack> pack_, unpack_;  // local partial pieces; received pieces
  kernels::MuonRuns<kernels::MuonCopy> repack_;          // updates into the send slots
  kernels::MuonUpdate update_;  // the homed matrices' momentum + Newton-Schulz (cuBLASLt on CUDA); made by bind
  kernels::MuonRuns<kernels::MuonApply> apply_;
};

}  // namespace shardopt::detail
