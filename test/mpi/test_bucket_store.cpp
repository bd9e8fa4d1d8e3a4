// The BucketStore on the host backend (MPI), run under mpiexec with 2 and 4 ranks: the
// cases shared with the GPU suite (bucket_store_cases.hpp).
#include "mpi/bucket_store_cases.hpp"

namespace {
SHARDOPT_BUCKET_STORE_CASES(BucketStoreHost, ::shardopt::Backend::Host, false)
}  // namespace
