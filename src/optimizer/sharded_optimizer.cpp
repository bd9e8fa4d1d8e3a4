// ShardedOptimizer: the calls DistributedAdam and Fsdp share, written once over the
// front end's state (optimizer/front_end.hpp).
#include "shardopt/sharded_optimizer.hpp"

#include <string>
#include <utility>

#include "comm/comm_impl.hpp"
#include "core/live.hpp"
#include "optimizer/front_end.hpp"

namespace shardopt {

ShardedOptimizer::ShardedOptimizer(std::unique_ptr<detail::FrontEnd> front, const char* type_name)
    : front_(std::move(front)), type_name_(type_name) {}
ShardedOptimizer::~ShardedOptimizer() = default;
ShardedOptimizer::ShardedOptimizer(ShardedOptimizer&&) noexcept = default;
ShardedOptimizer& ShardedOptimizer::operator=(ShardedOptimizer&&) noexcept = default;

detail::FrontEnd& ShardedOptimizer::front() const { return detail::live(front_, type_name_); }

detail::StepTarget& ShardedOptimizer::step_target() { return front(); }

const Layout& ShardedOptimizer::layout() const { return front().model_layout(); }
Backend ShardedOptimizer::backend() const { return front().step_backend(); }
int ShardedOptimizer::num_params() const { return static_cast<int>(layout().params().size()); }
bool ShardedOptimizer::is_mxfp8(int i) const { return front().stored_mxfp8(i); }

ShardView ShardedOptimizer::shard_param(int i) const { return front().param_shard(i); }
ShardView ShardedOptimizer::shard_master(int i) const { return front().engine().master_view(i); }
ShardView ShardedOptimizer::shard_remainder(int i) const { return front().engine().remainder_view(i); }
ShardView ShardedOptimizer::shard_exp_avg(int i) const { return front().engine().exp_avg_view(i); }
ShardView ShardedOptimizer::shard_exp_avg_sq(int i) const { return front().engine().exp_avg_sq_view(i); }
ShardView ShardedOptimizer::shard_grad(int i, DType dtype, Stream stream) {
  return front().grad_shard(i, dtype, stream);
}

void ShardedOptimizer::set_lr(float lr) { front().engine().set_lr(lr); }
void ShardedOptimizer::set_loss_scale(float scale) { front().engine().set_loss_scale(scale); }
StepScalars* ShardedOptimizer::device_scalars() const { return front().engine().scalars(); }
StepScalars ShardedOptimizer::read_scalars(Stream stream) const {
  return front().engine().read_scalars(front().step_comm(), stream);
}
void ShardedOptimizer::synchronize(Stream stream) const {
  detail::CommAccess::require(front().step_comm()).synchronize(stream, std::string(type_name_) + "::synchronize");
}
MicrobatchState* ShardedOptimizer::device_microbatch() const { return front().engine().microbatch(); }
void ShardedOptimizer::advance_microbatch(Stream stream) { front().engine().advance_microbatch(stream); }

void ShardedOptimizer::save(const std::string& dir, Stream stream, const CheckpointUserData& user) {
  detail::FrontEnd& m = front();
  detail::wait_save(m.last_save);
  m.settle_all(stream);  // every parameter current (quantized storage landed)
  detail::save_checkpoint(m.checkpoint_target(), dir, stream, user);
}

SaveHandle ShardedOptimizer::save_async(const std::string& dir, Stream stream, const CheckpointUserData& user) {
  detail::FrontEnd& m = front();
  detail::wait_save(m.last_save);
  m.settle_all(stream);
  m.last_save = detail::save_checkpoint_async(m.checkpoint_target(), dir, stream, user, m.snapshot_pool);
  return SaveHandle(m.last_save);
}

CheckpointInfo ShardedOptimizer::load(const std::string& dir, Stream stream) {
  detail::FrontEnd& m = front();
  detail::wait_save(m.last_save);
  m.settle_all(stream);
  m.require_publishable("load");
  CheckpointInfo info = detail::load_checkpoint(m.checkpoint_target(), dir, stream);
  // The parameters from the loaded master: native ones converted (and gathered), quantized
  // ones quantized afresh (bitwise what the saving run held).
  m.publish_master(stream);
  return info;
}

MemoryReport ShardedOptimizer::memory() const { return front().memory_report(); }
void ShardedOptimizer::check_capturable() const { front().check_step_capturable(); }

}  // namespace shardopt
