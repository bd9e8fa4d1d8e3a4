// phase_probe.hpp - internal: named marks at the phase boundaries of an optimizer step
// (Adam, the quantized formats' amax pass, exchange, quantize, gather wait, landing,
// zeroing), for a profiler: bench_dist_adam --phases records a CUDA event at each mark of
// an eager step and sums the time between marks per name. With no probe set (always,
// outside that benchmark) a mark is one test of a null pointer.
#pragma once

#include "shardopt/backend.hpp"

namespace shardopt::detail {

/// Called at each mark with its name (a string literal) and the stream the phase runs on.
using PhaseProbe = void (*)(const char* phase, Stream stream, void* user);

/// Installs `probe` (null: none) for every later mark of the process; not thread-safe.
void set_phase_probe(PhaseProbe probe, void* user);

namespace phase_probe_state {
extern PhaseProbe probe;
extern void* user;
}  // namespace phase_probe_state

/// The phase `phase` starts on `stream` (what came before it on `stream` belongs to the
/// previous mark).
inline void phase_mark(const char* phase, Stream stream) {
  if (phase_probe_state::probe != nullptr) phase_probe_state::probe(phase, stream, phase_probe_state::user);
}

}  // namespace shardopt::detail
