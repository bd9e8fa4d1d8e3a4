// weights.hpp - where the model finds its parameters and writes its gradients.
//
// The model calls these hooks around each FSDP unit (embedding, each block, final) and
// after each parameter's gradient is complete; the implementations map them onto the
// library: DistributedAdam (persistent views; grad_ready per parameter starts the bucket
// reduce-scatters during the last backward), Fsdp (wait_param gathers a unit, grad_slot
// hands out its zeroed gradient views, grad_ready reduce-scatters them), or plain arrays
// (the double-precision model of the gradient checks).
#pragma once

#include <memory>
#include <vector>

#include <shardopt/distributed_adam.hpp>
#include <shardopt/fsdp.hpp>

#include "model_spec.hpp"
#include "ops.hpp"

namespace trainer {

class Weights {
 public:
  virtual ~Weights() = default;
  /// Before the forward of `unit`: its parameters become readable on `stream`.
  virtual void forward_unit(int unit, Stream stream) = 0;
  /// Before the backward of `unit`: its gradients (and, if `need_params`, its
  /// parameters) become usable on `stream`.
  virtual void backward_unit(int unit, bool need_params, Stream stream) = 0;
  /// After the backward of `unit`: its gradients for this microbatch are complete.
  virtual void backward_unit_done(int unit, Stream stream) = 0;
  /// Parameter i's gradient for this microbatch is complete.
  virtual void grad_done(int i, Stream stream) = 0;
  /// After a forward-only pass (evaluation, no backward): FSDP ends it
  /// (Fsdp::end_forward_only); nothing to do for persistent weights.
  virtual void end_forward_only(Stream) {}
  /// Parameter i (member `member` of a grouped tensor; -1: the whole tensor). Refused
  /// (std::logic_error) for an MXFP8 or NVFP4 parameter: read mxfp8(i) / nvfp4(i).
  virtual Tensor param(int i, int member = -1) = 0;
  /// True when parameter i is stored as MXFP8 (DistributedAdam with ParamFormat::Mxfp8:
  /// every parameter of two or more dimensions; 1-D ones stay native f32).
  virtual bool is_mxfp8(int) const { return false; }
  /// Parameter i's MXFP8 rowwise plane, the whole tensor (members through its device
  /// table). std::logic_error for a native parameter.
  virtual Mxfp8Source mxfp8(int i) const;
  /// True when parameter i is stored as NVFP4 (ParamFormat::Nvfp4, 2-D parameters).
  virtual bool is_nvfp4(int) const { return false; }
  /// Parameter i's NVFP4 storage (every member). std::logic_error for another parameter.
  virtual shardopt::Nvfp4View nvfp4(int i) const;
  virtual Tensor grad(int i, int member = -1) = 0;
  /// True when parameter views stay valid and unchanged through all microbatches of a
  /// step (then weights prepared for compute on the first microbatch are reused).
  virtual bool persistent() const noexcept = 0;
  /// What the per-parameter gradient sum of squares measures with these weights.
  virtual SumsqWhen sumsq_when() const noexcept = 0;
};

/// Views of a DistributedAdam (dist-adam mode).
std::unique_ptr<Weights> make_dist_adam_weights(shardopt::DistributedAdam& opt, const ModelSpec& spec);

/// Gathered units and gradient slots of an Fsdp (fsdp mode). Gradients are per
/// microbatch (the library accumulates the reduced shards).
std::unique_ptr<Weights> make_fsdp_weights(shardopt::Fsdp& opt, const ModelSpec& spec);

/// Parameters and gradients in arrays allocated by `ops` (its precision), initialised
/// with ModelSpec::init_value; gradients start at zero. For tests.
class ArrayWeights final : public Weights {
 public:
  ArrayWeights(Ops& ops, const ModelSpec& spec);
  void forward_unit(int, Stream) override {}
  void backward_unit(int, bool, Stream) override {}
  void backward_unit_done(int, Stream) override {}
  void grad_done(int, Stream) override {}
  Tensor param(int i, int member = -1) override;
  Tensor grad(int i, int member = -1) override;
  bool persistent() const noexcept override { return true; }
  SumsqWhen sumsq_when() const noexcept override { return SumsqWhen::LastMicrobatch; }

 private:
  Tensor member_of(const Buffer& b, int i, int member) const;
  const ModelSpec& spec_;
  std::vector<Buffer> params_, grads_;
};

}  // namespace trainer
