// shardopt/shardopt.hpp - everything a trainer includes.
#pragma once

#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/numerics.hpp"
#include "shardopt/param_spec.hpp"
#include "shardopt/presets.hpp"
