// nccl_comm.hpp - the NCCL backend of CommImpl (CUDA devices).
#pragma once

#include <memory>

#include "comm/comm_impl.hpp"

namespace shardopt::detail {

/// An NCCL group over the `size` ranks that share `id` (collective over them). Sets the
/// calling thread's device to `device`, initialises NCCL and runs a small warm-up
/// all-reduce so that the first real collective may be a captured one.
/// Throws Error(Unsupported) in a build without NCCL.
std::shared_ptr<CommImpl> make_nccl_comm(const UniqueId& id, int rank, int size, int device);

}  // namespace shardopt::detail
