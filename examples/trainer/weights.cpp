#include "weights.hpp"

#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>


namespace trainer {
namespace {

std::int64_t member_numel(const ParamInfo& p) { return shardopt::numel(p.shape); }

/// A member's tensor inside a whole grouped tensor (or the whole tensor for member -1).
Tensor member_tensor(const Tensor& whole, const ParamInfo& p, int member) {
  if (member < 0) return whole;
  if (member >= p.members)
    throw std::out_of_range("member " + std::to_string(member) + " of '" + p.name + "' (" +
                            std::to_string(p.members) + " members)");
  return whole.slice(member * member_numel(p), member_numel(p));
}

class DistAdamWeights final : public Weights {
 public:
  DistAdamWeights(shardopt::DistributedAdam& opt, const ModelSpec& spec) : opt_(opt), spec_(spec) {
    if (opt.num_params() != spec.num_params())
      throw std::invalid_argument("the optimizer was built from another parameter list");
    for (int i = 0; i < spec.num_params(); ++i) {
      const bool mx = opt.is_mxfp8(i);
      mxfp8_.push_back(mx);
      nvfp4_.push_back(opt.is_nvfp4(i) ? std::optional<shardopt::Nvfp4View>(opt.nvfp4_param(i)) : std::nullopt);
      params_.push_back(mx || nvfp4_.back() ? Tensor{} : from_view(opt.param(i)));
      Mxfp8Source src;
      if (mx) {
        const shardopt::Mxfp8View v = opt.mxfp8_param(i);
        src.shape = v.shape;
        src.data = v.planes.data_row;
        src.scale = v.planes.scale_row;
        src.members = v.members;
      }
      sources_.push_back(src);
      grads_.push_back(from_view(opt.grad(i)));
    }
  }
  void forward_unit(int, Stream) override {}
  void backward_unit(int, bool, Stream) override {}
  void backward_unit_done(int, Stream) override {}
  void grad_done(int i, Stream s) override { opt_.grad_ready(i, s); }
  Tensor param(int i, int m) override {
    if (is_mxfp8(i) || is_nvfp4(i))
      throw std::logic_error("'" + info(i).name + "' is an " + (is_mxfp8(i) ? "MXFP8" : "NVFP4") +
                             " parameter: the model reads it through " + (is_mxfp8(i) ? "mxfp8()" : "nvfp4()") +
                             " into a bf16 compute buffer");
    return member_tensor(params_.at(static_cast<std::size_t>(i)), info(i), m);
  }
  Tensor grad(int i, int m) override { return member_tensor(grads_.at(static_cast<std::size_t>(i)), info(i), m); }
  bool is_mxfp8(int i) const override { return mxfp8_.at(static_cast<std::size_t>(i)); }
  Mxfp8Source mxfp8(int i) const override {
    if (!is_mxfp8(i)) return Weights::mxfp8(i);  // the error
    return sources_[static_cast<std::size_t>(i)];
  }
  bool is_nvfp4(int i) const override { return nvfp4_.at(static_cast<std::size_t>(i)).has_value(); }
  shardopt::Nvfp4View nvfp4(int i) const override {
    if (!is_nvfp4(i)) return Weights::nvfp4(i);  // the error
    return *nvfp4_[static_cast<std::size_t>(i)];
  }
  bool persistent() const noexcept override { return true; }
  SumsqWhen sumsq_when() const noexcept override { return SumsqWhen::LastMicrobatch; }

 private:
  const ParamInfo& info(int i) const { return spec_.params()[static_cast<std::size_t>(i)]; }
  shardopt::DistributedAdam& opt_;
  const ModelSpec& spec_;
  std::vector<Tensor> params_, grads_;
  std::vector<bool> mxfp8_;
  std::vector<Mxfp8Source> sources_;
  std::vector<std::optional<shardopt::Nvfp4View>> nvfp4_;
};

class FsdpWeights final : public Weights {
 public:
  FsdpWeights(shardopt::Fsdp& opt, const ModelSpec& spec)
      : opt_(opt), spec_(spec), units_(spec.units()),
        params_(static_cast<std::size_t>(spec.num_params())), grads_(params_.size()) {
    if (opt.num_params() != spec.num_params() || opt.num_units() != spec.num_units())
      throw std::invalid_argument("the FSDP optimizer was built from another parameter list");
  }
  void forward_unit(int unit, Stream s) override { take_params(unit, shardopt::FsdpPass::Forward, s); }
  void end_forward_only(Stream s) override { opt_.end_forward_only(s); }
  void backward_unit(int unit, bool need_params, Stream s) override {
    if (need_params) take_params(unit, shardopt::FsdpPass::Backward, s);
    const auto views = opt_.grad_slot(unit, s);
    const auto& u = units_[static_cast<std::size_t>(unit)];
    for (int k = 0; k < u.count; ++k)
      grads_[static_cast<std::size_t>(u.first + k)] = from_view(views[static_cast<std::size_t>(k)]);
  }
  void backward_unit_done(int unit, Stream s) override {
    opt_.grad_ready(unit, s);
    const auto& u = units_[static_cast<std::size_t>(unit)];
    for (int k = 0; k < u.count; ++k) grads_[static_cast<std::size_t>(u.first + k)] = Tensor{};
  }
  void grad_done(int, Stream) override {}
  Tensor param(int i, int m) override { return member_tensor(checked(params_, i, "parameter"), info(i), m); }
  Tensor grad(int i, int m) override { return member_tensor(checked(grads_, i, "gradient"), info(i), m); }
  bool is_mxfp8(int i) const override { return opt_.is_mxfp8(i); }
  /// The plane the unit's last wait_param gathered: rowwise in forward, columnwise in
  /// backward (the data-gradient GEMM's).
  Mxfp8Source mxfp8(int i) const override {
    if (!is_mxfp8(i)) return Weights::mxfp8(i);  // the error
    const Mxfp8Source& x = sources_.at(static_cast<std::size_t>(i));
    if (x.data == nullptr)
      throw std::logic_error("FSDP: the MXFP8 parameter '" + info(i).name + "' is used outside its unit's passes");
    return x;
  }
  bool persistent() const noexcept override { return false; }
  SumsqWhen sumsq_when() const noexcept override { return SumsqWhen::SumOverMicrobatches; }

 private:
  void take_params(int unit, shardopt::FsdpPass pass, Stream s) {
    const auto views = opt_.wait_param(unit, pass, s);
    const auto& u = units_[static_cast<std::size_t>(unit)];
    for (int k = 0; k < u.count; ++k) {
      const auto p = static_cast<std::size_t>(u.first + k);
      if (!opt_.is_mxfp8(u.first + k)) {
        params_[p] = from_view(views[static_cast<std::size_t>(k)]);
        continue;
      }
      const shardopt::Mxfp8PassView v = opt_.mxfp8_param(u.first + k, pass);
      sources_[p] = Mxfp8Source{v.shape, v.data, v.scales, v.members, v.plane};
    }
  }
  const Tensor& checked(const std::vector<Tensor>& v, int i, const char* what) const {
    const Tensor& t = v.at(static_cast<std::size_t>(i));
    if (t.data == nullptr)
      throw std::logic_error(std::string("FSDP: the ") + what + " of '" + info(i).name +
                             "' is used outside its unit's forward/backward");
    return t;
  }
  const ParamInfo& info(int i) const { return spec_.params()[static_cast<std::size_t>(i)]; }
  shardopt::Fsdp& opt_;
  const ModelSpec& spec_;
  std::vector<shardopt::FsdpUnit> units_;
  std::vector<Tensor> params_, grads_;
  std::vector<Mxfp8Source> sources_ = std::vector<Mxfp8Source>(params_.size());
};

}  // namespace

Mxfp8Source Weights::mxfp8(int i) const {
  throw std::logic_error("parameter " + std::to_string(i) + " is not an MXFP8 parameter: read param()");
}

shardopt::Nvfp4View Weights::nvfp4(int i) const {
  throw std::logic_error("parameter " + std::to_string(i) + " is not an NVFP4 parameter: read param()");
}

std::unique_ptr<Weights> make_dist_adam_weights(shardopt::DistributedAdam& opt, const ModelSpec& spec) {
  return std::make_unique<DistAdamWeights>(opt, spec);
}

std::unique_ptr<Weights> make_fsdp_weights(shardopt::Fsdp& opt, const ModelSpec& spec) {
  return std::make_unique<FsdpWeights>(opt, spec);
}

ArrayWeights::ArrayWeights(Ops& ops, const ModelSpec& spec) : spec_(spec) {
  const bool dbl = ops.precision() == Precision::Double;
  for (int i = 0; i < spec.num_params(); ++i) {
    const ParamInfo& p = spec.params()[static_cast<std::size_t>(i)];
    const std::int64_t total = member_numel(p) * p.members;
    params_.push_back(ops.alloc(dbl ? Elem::f64 : Elem::bf16, total));
    grads_.push_back(ops.alloc(dbl ? Elem::f64 : Elem::f32, total));
    ops.init_param(params_.back(), spec.init_args(i), ops.stream());
  }
  ops.synchronize();
}

Tensor ArrayWeights::member_of(const Buffer& b, int i, int member) const {
  return member_tensor(b.get(), spec_.params()[static_cast<std::size_t>(i)], member);
}
Tensor ArrayWeights::param(int i, int member) { return member_of(params_.at(static_cast<std::size_t>(i)), i, member); }
Tensor ArrayWeights::grad(int i, int member) { return member_of(grads_.at(static_cast<std::size_t>(i)), i, member); }

}  // namespace trainer
