#include "optimizer/muon_pass.hpp"

#include <algorithm>
#include <optional>

#include "comm/deadline.hpp"
#include "core/check.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

MuonPass::MuonPass(Backend backend, const Layout& layout, int rank, const std::vector<AdamGroup>& groups,
                   const std::vector<bool>& host_params)
    : backend_(backend), groups_(groups) {
  matrices_ = muon_matrices(layout, groups);
  plan_ = muon_exchange_plan(layout, rank, matrices_);
  kernels::muon_load(backend_);  // CUDA: no lazy load inside a step (it would wait for running collectives)
  local_.assign(matrices_.size(), -1);
  momentum_at_.assign(matrices_.size(), -1);
  momentum_on_host_.assign(matrices_.size(), false);
  std::int64_t homed = 0, on_device = 0;
  for (std::size_t k = 0; k < matrices_.size(); ++k) {
    const MuonMatrixInfo& mi = matrices_[k];
    if (mi.home != rank) continue;
    local_[k] = homed;
    homed += mi.rows * mi.cols;
    momentum_on_host_[k] = static_cast<std::size_t>(mi.param) < host_params.size() &&
                           host_params[static_cast<std::size_t>(mi.param)];
    std::int64_t& at = momentum_on_host_[k] ? host_momentum_numel_ : on_device;
    momentum_at_[k] = at;
    at += mi.rows * mi.cols;
  }
  const auto floats = [&](std::int64_t n) {
    DeviceBuffer b(backend_, static_cast<std::size_t>(n) * sizeof(float));
    fill_zero_async(backend_, b.data(), b.bytes(), nullptr);
    return b;
  };
  send_ = floats(plan_.slot * layout.world_size());
  recv_ = floats(plan_.slot * layout.world_size());
  momentum_ = floats(on_device);
  matrix_ = floats(homed);
  synchronize(backend_, nullptr);  // the zeroed momentum is in place before any stream's step
  update_dtype_ = muon_update_exchange_dtype(backend_, groups_, matrices_);
}

DType muon_update_exchange_dtype(Backend backend, const std::vector<AdamGroup>& groups,
                                 const std::vector<MuonMatrixInfo>& matrices) noexcept {
  if (backend != Backend::Cuda) return DType::f32;  // the host twin's Newton-Schulz is fp32 whatever the setting
  for (const MuonMatrixInfo& mi : matrices)
    if (groups[static_cast<std::size_t>(mi.group)].muon.gemm != MuonGemm::Bf16) return DType::f32;
  return DType::bf16;
}

void MuonPass::place_host_momentum(float* host) {
  SHARDOPT_REQUIRE(host != nullptr || host_momentum_numel_ == 0, ErrorCode::Internal,
                   "MuonPass: no host memory for the offloaded momentum");
  host_momentum_ = host;
}

void MuonPass::bind(const std::vector<MuonPieceStorage>& pieces, DType grad_dtype) {
  SHARDOPT_REQUIRE(host_momentum_ != nullptr || host_momentum_numel_ == 0, ErrorCode::Internal,
                   "MuonPass::bind before place_host_momentum");
  grad_dtype_ = grad_dtype;
  // Element `pos` of peer `peer`'s slot in an exchange buffer of `dt` elements.
  const auto slot_at = [&](const DeviceBuffer& buf, int peer, std::int64_t pos, DType dt) {
    return buf.as<char>() + static_cast<std::size_t>(peer * plan_.slot + pos) * size_of(dt);
  };
  std::vector<kernels::MuonPack> pack, unpack;
  std::vector<kernels::MuonCopy> send, repack;
  std::vector<kernels::MuonApply> apply;
  // Received pieces: scaled into the matrix at the home; its updates go back the same way.
  for (const MuonRun& r : plan_.receives) {
    float* mat = matrix_.as<float>() + local_[static_cast<std::size_t>(r.matrix)] + r.offset;
    unpack.push_back({slot_at(recv_, r.peer, r.slot_pos, grad_dtype), mat, r.length});
    repack.push_back({mat, DType::f32, slot_at(send_, r.peer, r.slot_pos, update_dtype_), update_dtype_, r.length});
  }
  std::vector<kernels::MuonMatrix> update(matrices_.size());  // by matrix; homed here only
  for (std::size_t k = 0; k < matrices_.size(); ++k) {
    if (local_[k] < 0) continue;
    const MuonMatrixInfo& mi = matrices_[k];
    update[k] = {matrix_.as<float>() + local_[k], momentum(static_cast<int>(k)), mi.rows, mi.cols,
                 groups_[static_cast<std::size_t>(mi.group)].muon};
  }
  // Pieces of matrices homed elsewhere travel raw, in the gradient dtype (the home scales
  // them: the same product as scaling here), and their updates come back in update_dtype_;
  // the home's own pieces are packed straight into its matrix and applied from it (the same
  // values: copies only). A matrix held here whole (one local piece) fuses both: the update
  // reads its gradient and applies its result itself (MuonMatrix::grad / apply).
  const auto add = [&](const MuonRun& r, bool local) {
    const MuonMatrixInfo& mi = matrices_[static_cast<std::size_t>(r.matrix)];
    const MuonPieceStorage& ps = pieces[static_cast<std::size_t>(mi.param)];
    const std::int64_t at = mi.offset + r.offset - ps.param_offset;  // within this rank's piece
    const bool whole = local && r.offset == 0 && r.length == mi.rows * mi.cols;
    const void* const grad = static_cast<const char*>(ps.grad) + static_cast<std::size_t>(at) * size_of(grad_dtype);
    float* const mat = local ? matrix_.as<float>() + local_[static_cast<std::size_t>(r.matrix)] + r.offset : nullptr;
    if (!local) send.push_back({grad, grad_dtype, slot_at(send_, r.peer, r.slot_pos, grad_dtype), grad_dtype, r.length});
    if (local && !whole) pack.push_back({grad, mat, r.length});
    const AdamGroup& g = groups_[static_cast<std::size_t>(mi.group)];
    kernels::MuonApply a;
    a.u = local ? static_cast<const void*>(mat) : slot_at(recv_, r.peer, r.slot_pos, update_dtype_);
    a.u_dtype = local ? DType::f32 : update_dtype_;
    a.master = ps.master + at;
    a.param = ps.param == nullptr ? nullptr : static_cast<char*>(ps.param) + static_cast<std::size_t>(at) * size_of(ps.param_dtype);
    a.param_dtype = ps.param_dtype;
    a.length = r.length;
    a.lr_scale = g.lr_scale;
    a.weight_decay = g.muon.weight_decay;
    a.lr_ratio = muon_lr_ratio(g.muon.adjust_lr, mi.rows, mi.cols);
    if (!whole) {
      apply.push_back(a);
      return;
    }
    kernels::MuonMatrix& u = update[static_cast<std::size_t>(r.matrix)];
    u.grad = grad;
    u.grad_dtype = grad_dtype;
    u.apply = a;
  };
  for (const MuonRun& r : plan_.sends) add(r, false);
  for (const MuonRun& r : plan_.locals) add(r, true);
  std::vector<kernels::MuonMatrix> homed;
  for (std::size_t k = 0; k < matrices_.size(); ++k)
    if (local_[k] >= 0) homed.push_back(update[k]);
  update_ = kernels::MuonUpdate(backend_, std::move(homed));
  send_copy_ = kernels::MuonRuns<kernels::MuonCopy>(backend_, std::move(send));
  pack_ = kernels::MuonRuns<kernels::MuonPack>(backend_, std::move(pack));
  unpack_ = kernels::MuonRuns<kernels::MuonPack>(backend_, std::move(unpack));
  repack_ = kernels::MuonRuns<kernels::MuonCopy>(backend_, std::move(repack));
  apply_ = kernels::MuonRuns<kernels::MuonApply>(backend_, std::move(apply));
  bound_ = true;
}

void MuonPass::step(const Communicator& comm, StepScalars* scalars, Stream stream) const {
  SHARDOPT_REQUIRE(bound_, ErrorCode::Internal, "MuonPass::step before bind");
  // The slot is the same on every rank, so all of them skip the exchange together (at one
  // rank, or when every piece lives at its home).
  const bool exchange = plan_.slot > 0;
  std::optional<OperationLabel> label;  // names the exchange if a host-backend wait times out
  if (backend_ == Backend::Host) label.emplace("Muon gradient exchange (all-to-all)");
  kernels::muon_copy(send_copy_, backend_, stream);
  kernels::muon_pack(pack_, grad_dtype_, scalars, backend_, stream);
  if (exchange) comm.all_to_all(send_.data(), recv_.data(), plan_.slot, grad_dtype_, stream);
  kernels::muon_pack(unpack_, grad_dtype_, scalars, backend_, stream);
  update_.run(scalars, stream);
  kernels::muon_copy(repack_, backend_, stream);
  if (backend_ == Backend::Host) label.emplace("Muon update exchange (all-to-all)");
  if (exchange) comm.all_to_all(send_.data(), recv_.data(), plan_.slot, update_dtype_, stream);
  kernels::muon_apply(apply_, scalars, backend_, stream);
}

float* MuonPass::momentum(int matrix) const {
  SHARDOPT_REQUIRE(matrix >= 0 && matrix < static_cast<int>(matrices_.size()), ErrorCode::OutOfRange,
                   "Muon matrix index out of range");
  const auto k = static_cast<std::size_t>(matrix);
  if (local_[k] < 0) return nullptr;
  return (momentum_on_host_[k] ? host_momentum_ : momentum_.as<float>()) + momentum_at_[k];
}

void MuonPass::add_memory(MemoryReport& r) const {
  r.moments += static_cast<std::int64_t>(momentum_.bytes());
  r.pool += static_cast<std::int64_t>(send_.bytes() + recv_.bytes() + matrix_.bytes() + update_.scratch_bytes());
}

}  // namespace shardopt::detail
