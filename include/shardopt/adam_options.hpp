// shardopt/adam_options.hpp - the settings of the sharded Adam/AdamW step, shared by
// both optimizers: DistributedAdamOptions and FsdpOptions inherit them, so a trainer
// names them the same way (o.beta2, o.groups, o.lr_schedule, ...) whichever it uses.
//
// beta1, beta2 and eps are doubles, as PyTorch's Python floats: 0.999 is 0.999 and
// 1 - beta2 is formed in double (0.001, not the 0.00099998713 of 1 - 0.999f) before the
// kernels round it to fp32 once (docs/fused_adam.md).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "shardopt/dtype.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/schedule.hpp"
#include "shardopt/watchdog.hpp"

namespace shardopt {

/// The math of the step: what changes the numbers an optimizer computes.
struct AdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// true: AdamW (decoupled decay); false: Adam with L2 added to the gradient.
  bool decoupled_weight_decay = true;
  /// Hyper-parameters of groups not listed in `groups`.
  AdamGroup default_group{};
  /// Per optimizer-group hyper-parameters, by ParamSpec::group name.
  std::map<std::string, AdamGroup> groups;
  /// Global-norm clipping threshold; 0 disables clipping (the norm is still computed).
  float clip_max_norm = 0.0f;
  /// Dtype of the Adam moments: f32; bf16 (half the memory); or q8_block, one byte per
  /// element plus an fp32 scale per kMomentBlock (256) elements of a parameter (a quarter;
  /// docs/state_precision.md). With q8_block the layout aligns parameters and shard slices
  /// to the blocks. 8-bit moments serve native parameters only: with param_format Mxfp8 or
  /// Nvfp4 the constructor throws Error(Unsupported).
  DType moment_dtype = DType::f32;
  /// How the fp32 master is kept (fused_adam.hpp, docs/state_precision.md): fp32 (4 bytes
  /// per element of the shard), or bf16_remainder, where a native bf16 parameter and a
  /// 16-bit remainder rebuild it exactly (2 bytes). With bf16_remainder, shard_master(i) of
  /// such a parameter is Error(Unsupported): write the bf16 parameter and call init_master.
  /// Other parameters (f32, f16, MXFP8, NVFP4, Muon groups) keep fp32; if none is a native
  /// bf16 tensor the constructor throws Error(InvalidArgument).
  MasterStorage master_storage = MasterStorage::fp32;
  /// Share of this rank's optimizer state kept in pinned host memory instead of on the
  /// GPU, in [0, 1] (docs/offload.md). The last buckets in step order, whole, as many as it
  /// takes to reach this share of the rank's shard elements, keep their master (or
  /// remainders), both moments and the 8-bit moments' scales on the host; each step
  /// streams them through a fixed ring of device staging slots, through the same Adam
  /// pass, inside the step (captured with it in graph mode): the numbers are bitwise those
  /// of the on-GPU step. 0 keeps everything on the GPU. Views of an offloaded piece
  /// (shard_master, shard_exp_avg, ...) point into pinned host memory. Rank-local: not
  /// compared across ranks (it changes where the state lives, not the math).
  /// Muon groups' parameters in those buckets keep their fp32 masters, and their home
  /// ranks Muon's momentum, in pinned host memory too: Muon's pass reads and writes them
  /// there in place (mapped into the GPU's address space), not through the ring.
  /// A fraction outside [0, 1] is Error(InvalidArgument).
  /// With MXFP8 / NVFP4 parameters a fraction above 0 is Error(Unsupported).
  /// Pinned memory the host refuses is Error(OutOfMemory) on every rank, naming the bytes.
  double offload_fraction = 0.0;
  /// Elements of one stage of the offload ring (four slots on the device, each as wide as
  /// the widest stage). Larger stages make fewer, longer copies; the default (4 Mi
  /// elements: 48 MiB of fp32 state per slot) keeps every copy near the link's full speed
  /// (docs/offload.md).
  /// Anything but a positive multiple of kMomentBlock (256) is Error(InvalidArgument).
  std::int64_t offload_stage_numel = std::int64_t{1} << 22;
  /// Where each step's learning rate comes from.
  LrSchedule lr_schedule = LrSchedule::host();
  /// Microbatches per step (the size of the device microbatch counter).
  int microbatches = 1;
  /// Deadlines of the optimizer's collectives, blocking waits and replayed steps
  /// (shardopt/watchdog.hpp). When set, the constructor sets them on its communicator
  /// (Communicator::set_watchdog: every user of that group gets them); unset keeps the
  /// communicator's (its defaults, or an earlier set_watchdog). Rank-local: not compared
  /// across ranks (they change when an error is raised, not the math).
  std::optional<WatchdogOptions> watchdog;
};

}  // namespace shardopt
