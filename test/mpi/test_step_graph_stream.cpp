// StepGraph's stream contract on the host backend under mpiexec (1 and 2 ranks): the
// microbatch function runs on the trainer's stream in warm-up and capture alike.
#include "common/step_graph_stream_cases.hpp"

SHARDOPT_STEP_GRAPH_STREAM_CASES(StepGraphStreamHost, shardopt::Backend::Host)
