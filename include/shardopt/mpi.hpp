// shardopt/mpi.hpp - bootstrap of a Communicator from an MPI communicator.
// Include this only in programs that use MPI; the rest of the API does not need mpi.h.
#pragma once

#include <mpi.h>

#include "shardopt/communicator.hpp"

namespace shardopt {

/// Options of the MPI bootstrap.
struct MpiBootstrapOptions {
  /// Backend of the new group; Backend::Cuda builds an NCCL communicator.
  Backend backend = Backend::Cuda;
  /// CUDA device of this rank; -1 = the local rank within the node
  /// (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)).
  int device = -1;
};

/// A Communicator over the ranks of `comm` (collective over `comm`; MPI must be
/// initialised). For the CUDA backend it sets the calling thread's device (left set),
/// lets rank 0 create the NCCL unique id, broadcasts it with MPI and initialises NCCL;
/// a rank that cannot use its device makes every rank throw. For the host backend it
/// duplicates `comm` (errors on the duplicate are returned, not fatal).
Communicator communicator_from_mpi(MPI_Comm comm, MpiBootstrapOptions options = {});

/// The CUDA device communicator_from_mpi picks for this rank: `options.device` when it is
/// >= 0, else the rank's index among the ranks of `comm` on its node (collective over
/// `comm`; the same answer on the host backend, which uses no device).
int mpi_device_of_rank(MPI_Comm comm, const MpiBootstrapOptions& options = {});

}  // namespace shardopt
