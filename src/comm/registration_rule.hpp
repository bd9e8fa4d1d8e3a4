// registration_rule.hpp - which of a set of buffers that work together a communicator
// registers with its backend (Communicator::register_buffers), decided from what each
// buffer serves; a pure function, so that the rule is tested without a GPU.
//
// Why (issue 31, docs/decisions.md): NCCL 2.28.3 stalled on 2 H200s when one registered
// buffer served an all-to-all (send/recv, IPC-registered for that peer) and then
// in-place all-gathers; and NCCL leaves a send/recv undefined whose one side is
// registered and the other not (registered_ranges.hpp).
#pragma once

#include <vector>

#include "shardopt/communicator.hpp"

namespace shardopt::detail {

/// One flag per use, true where the buffer is registered:
/// - Both: never (send/recv and collectives must not share a registered buffer);
/// - SendRecv: the send/recv buffers of the set are partners of one another, so all of
///   them, or none when any of them cannot be (a Both buffer also serves send/recv);
/// - Collectives: always.
std::vector<bool> registration_plan(const std::vector<BufferUse>& uses);

}  // namespace shardopt::detail
