// StepGraph's stream contract on GPUs under mpirun (1 and 2 ranks, NCCL): a trainer that
// enqueues each microbatch on the stream it passed to capture() (its stream sleeps ~2 ms
// first), not on the stream it is handed, trains bitwise as eagerly: a warm-up on any
// other stream would race with it.
#include "common/step_graph_stream_cases.hpp"

SHARDOPT_STEP_GRAPH_STREAM_CASES(StepGraphStreamGpu, shardopt::Backend::Cuda)
