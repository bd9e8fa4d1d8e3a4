// communicator_from_mpi: a Communicator over the ranks of an MPI communicator. The
// host backend duplicates the communicator; the CUDA backend picks each rank's device
// (its local rank on the node unless given), lets rank 0 create the NCCL unique id,
// broadcasts it with MPI and initialises NCCL.
#include <string>

#include "comm/comm_impl.hpp"
#include "comm/mpi_comm.hpp"
#include "comm/nccl_comm.hpp"
#include "core/check.hpp"
#include "core/device_guard.hpp"
#include "shardopt/mpi.hpp"

namespace shardopt {
namespace {

// Every rank learns whether every rank succeeded, so that a problem on one rank becomes
// an error on all of them instead of a hang in the next collective.
void agree(MPI_Comm comm, const std::string& problem, ErrorCode code, const char* stage) {
  int ok = problem.empty() ? 1 : 0;
  int all_ok = 0;
  SHARDOPT_MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm));
  if (all_ok == 1) return;
  SHARDOPT_REQUIRE(false, code,
                   std::string("communicator_from_mpi: ") + stage + " failed " +
                       (problem.empty() ? std::string("on another rank (see its error)") : "on this rank: " + problem));
}

// This rank's index among the ranks of `comm` on its node (collective over `comm`).
int node_local_rank(MPI_Comm comm) {
  int rank = 0;
  SHARDOPT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm node = MPI_COMM_NULL;
  SHARDOPT_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int local_rank = 0;
  const int rank_err = MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  SHARDOPT_MPI_CHECK(rank_err);
  return local_rank;
}

}  // namespace

int mpi_device_of_rank(MPI_Comm comm, const MpiBootstrapOptions& options) {
  const int local_rank = node_local_rank(comm);  // collective: every rank takes part
  return options.device >= 0 ? options.device : local_rank;
}

Communicator communicator_from_mpi(MPI_Comm comm, MpiBootstrapOptions options) {
  int initialized = 0;
  SHARDOPT_MPI_CHECK(MPI_Initialized(&initialized));
  SHARDOPT_REQUIRE(initialized != 0, ErrorCode::InvalidState,
                   "communicator_from_mpi: MPI is not initialised; call MPI_Init (or MPI_Init_thread) first");
  SHARDOPT_REQUIRE(comm != MPI_COMM_NULL, ErrorCode::InvalidArgument, "communicator_from_mpi: comm is MPI_COMM_NULL");

  if (options.backend == Backend::Host) {
    MPI_Comm dup = MPI_COMM_NULL;
    SHARDOPT_MPI_CHECK(MPI_Comm_dup(comm, &dup));
    return detail::CommImpl::wrap(detail::make_mpi_comm(dup));
  }

  int rank = 0, size = 0;
  SHARDOPT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  SHARDOPT_MPI_CHECK(MPI_Comm_size(comm, &size));
  const int local_rank = node_local_rank(comm);
  const int device = options.device >= 0 ? options.device : local_rank;

  // 1. Every rank can use its device.
  std::string problem;
  if (!nccl_compiled()) {
    problem = "this build of shardopt has no NCCL; rebuild with CUDA and NCCL or use Backend::Host";
  } else {
    const int devices = cuda_device_count();
    if (device >= devices) {
      problem = "rank " + std::to_string(rank) + " (local rank " + std::to_string(local_rank) + ") needs CUDA device " +
                std::to_string(device) + " but only " + std::to_string(devices) +
                " are visible; start at most one rank per GPU on each node or pass MpiBootstrapOptions::device";
    }
  }
  if (problem.empty()) problem = detail::make_device_current(device);
  agree(comm, problem, nccl_compiled() ? ErrorCode::InvalidArgument : ErrorCode::Unsupported, "device selection");

  // 2. Rank 0's unique id, broadcast.
  UniqueId id;
  problem.clear();
  if (rank == 0) {
    try {
      id = UniqueId::create();
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  agree(comm, problem, ErrorCode::Nccl, "ncclGetUniqueId on rank 0");
  SHARDOPT_MPI_CHECK(MPI_Bcast(id.bytes.data(), static_cast<int>(id.bytes.size()), MPI_BYTE, 0, comm));

  // 3. NCCL (collective over the group; it sets the device again and warms up).
  return detail::CommImpl::wrap(detail::make_nccl_comm(id, rank, size, device));
}

}  // namespace shardopt
