// nvfp4_checks.hpp - internal: the pointer checks the NVFP4 entry points share
// (nvfp4.cpp, nvfp4_shard.cpp, nvfp4_batch.cpp).
#pragma once

#include <string>

#include "shardopt/nvfp4.hpp"

namespace shardopt::nvfp4 {

/// Throws Error(InvalidArgument) naming `what` when `p` is null.
void require_ptr(const void* p, const std::string& what);
/// require_ptr of the four outputs, their names prefixed with `prefix`.
void require_planes(const Nvfp4Planes& out, const std::string& prefix);

}  // namespace shardopt::nvfp4
