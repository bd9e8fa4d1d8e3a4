#include "quantized/phase_probe.hpp"

namespace shardopt::detail {

namespace phase_probe_state {
PhaseProbe probe = nullptr;
void* user = nullptr;
}  // namespace phase_probe_state

void set_phase_probe(PhaseProbe probe, void* user) {
  phase_probe_state::probe = probe;
  phase_probe_state::user = user;
}

}  // namespace shardopt::detail
