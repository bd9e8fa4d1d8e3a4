// shardopt/shardopt.hpp - everything a trainer includes (all public headers but
// shardopt/mpi.hpp, which needs <mpi.h>: include it where you bootstrap from MPI).
#pragma once

#include "shardopt/adam_options.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/bucket_store.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/error.hpp"
#include "shardopt/fsdp.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/memory_report.hpp"
#include "shardopt/microbatch.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/numerics.hpp"
#include "shardopt/param_spec.hpp"
#include "shardopt/presets.hpp"
#include "shardopt/schedule.hpp"
#include "shardopt/step_graph.hpp"
#include "shardopt/views.hpp"
