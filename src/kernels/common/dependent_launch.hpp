// dependent_launch.hpp - internal (not public API): the switch for programmatic dependent
// launches (PDL, Hopper and later) of the whole-tensor MXFP8 / NVFP4 quantize kernels.
// The kernels and their launch helper are in dependent_launch.cuh; this header has no
// CUDA in it, so that benchmarks and tests of any build can flip the switch.
#pragma once

namespace shardopt::kernels {

/// Turns programmatic dependent launches of the quantize kernels on (the default) or
/// off for the whole process, from the next launch on (a graph keeps what it captured).
/// Off, each kernel starts only once the work before it on the stream has finished; on,
/// it may be scheduled while that work runs and waits in the kernel for it. The bytes
/// written are the same either way; benchmarks flip it to time both.
void set_dependent_launch(bool on);

/// Whether the switch above is on.
bool dependent_launch();

/// The switch set to `on` while this object lives, then back to what it was (benchmarks
/// and tests time or check both ways in one process; capture a graph inside the scope,
/// since a graph keeps the launches it captured).
class DependentLaunchScope {
 public:
  explicit DependentLaunchScope(bool on) : was_(dependent_launch()) { set_dependent_launch(on); }
  ~DependentLaunchScope() { set_dependent_launch(was_); }
  DependentLaunchScope(const DependentLaunchScope&) = delete;
  DependentLaunchScope& operator=(const DependentLaunchScope&) = delete;

 private:
  bool was_;
};

}  // namespace shardopt::kernels
