// A two-"node" job on one machine (run_two_nodes.sh starts one OpenMPI daemon per node
// name of a hostfile, 4 slots each, so MPI sees two nodes that talk over TCP): the device
// each rank gets is its index on its node, and HSDP with a shard group of one node's size
// shards inside the node and replicates across nodes, bitwise equal to unsharded training.
#include <cstdlib>
#include <string>
#include <vector>

#include "common/fsdp_cases.hpp"
#include "shardopt/mpi.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

// Ranks per node, from the launcher (the hostfile's slots).
int ranks_per_node() {
  const char* v = std::getenv("SHARDOPT_TEST_RANKS_PER_NODE");
  return v ? std::atoi(v) : 0;
}

// The node of every rank, by an independent test: who shares memory with whom.
std::vector<int> node_of_every_rank() {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int leader = world_rank();
  MPI_Bcast(&leader, 1, MPI_INT, 0, node);  // the node's lowest world rank names it
  MPI_Comm_free(&node);
  std::vector<int> all(static_cast<std::size_t>(world_size()));
  MPI_Allgather(&leader, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  return all;
}

TEST(TwoNodes, TheLauncherMadeTwoNodesOfConsecutiveRanks) {
  const int per_node = ranks_per_node();
  ASSERT_GT(per_node, 0) << "run through test/mpi/run_two_nodes.sh";
  ASSERT_EQ(world_size(), 2 * per_node);
  const auto nodes = node_of_every_rank();
  for (int r = 0; r < world_size(); ++r) EXPECT_EQ(nodes[static_cast<std::size_t>(r)], r / per_node * per_node) << r;
}

TEST(TwoNodes, DeviceIsTheIndexOnTheNode) {
  const int per_node = ranks_per_node();
  ASSERT_GT(per_node, 0);
  EXPECT_EQ(mpi_device_of_rank(MPI_COMM_WORLD), world_rank() % per_node);
  MpiBootstrapOptions o;
  o.device = 3;  // an explicit device wins
  EXPECT_EQ(mpi_device_of_rank(MPI_COMM_WORLD, o), 3);
}

TEST(TwoNodes, HsdpShardsInsideTheNodeAndReplicatesAcross) {
  const int per_node = ranks_per_node();
  ASSERT_GT(per_node, 0);
  DistributedAdamOptions d = base_options(DType::bf16);
  FsdpOptions fo = fsdp_options(d);
  fo.shard_group_size = per_node;
  Fsdp f(make_comm(Backend::Host), fsdp_model(), small_units(), fo);
  EXPECT_EQ(f.shard_size(), per_node);
  EXPECT_EQ(f.replicas(), 2);
  // The shard rank is the index on the node, i.e. the rank's device: the shard group is
  // the node's GPUs (NVLink) and only the replica all-reduce crosses nodes.
  EXPECT_EQ(f.shard_rank(), mpi_device_of_rank(MPI_COMM_WORLD));
  // And the numbers: HSDP across the two nodes equals unsharded training, bitwise.
  case_fsdp_equals_dist_adam(Backend::Host, per_node, 2, 3);
}

}  // namespace
