// mpi_comm.hpp - the MPI backend of CommImpl (host backend). Compiled only with MPI.
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/comm_impl.hpp"

namespace shardopt::detail {

/// A host-backend group that owns `owned` (an MPI communicator the caller duplicated
/// for it; freed with the group). Errors of calls on it are returned, not fatal.
std::shared_ptr<CommImpl> make_mpi_comm(MPI_Comm owned);

/// The MPI communicator of `impl`; MPI_COMM_NULL when `impl` is not an MPI group.
MPI_Comm mpi_handle(const CommImpl& impl) noexcept;

}  // namespace shardopt::detail
