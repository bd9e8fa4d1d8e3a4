// shardopt/nvfp4_param.hpp - what a trainer sees of an NVFP4 parameter kept by an
// optimizer (DistributedAdamOptions::param_format = ParamFormat::Nvfp4): its persistent
// storage (docs/nvfp4.md, "Parameters of a DistributedAdam").
#pragma once

#include <cstdint>

#include "shardopt/nvfp4.hpp"

namespace shardopt {

/// An NVFP4 parameter's persistent storage (never moves; valid for the optimizer's life).
/// Each member of a grouped parameter is its own NVFP4 tensor (its own 16 x 16 block grid
/// and global amax), so a grouped weight equals its members registered one by one. Only
/// the rowwise data is stored: the columnwise form has the same scales (the grid read
/// transposed) and the same codes, reordered (docs/nvfp4.md).
struct Nvfp4View {
  Nvfp4Shape shape;           ///< one member: [rows, cols], the member's leading dims folded into rows
  std::int64_t members = 1;   ///< G (1 for a plain parameter)
  /// Member 0's planes, in the backend's device memory; members follow one another
  /// (member(g)).
  Nvfp4Planes planes;

  /// Member g's planes: data + g * data_bytes(), scale + g * scale_numel(), amax + g,
  /// decode_scale + g.
  Nvfp4Planes member(std::int64_t g) const {
    return Nvfp4Planes{planes.data + g * shape.data_bytes(), planes.scale + g * shape.scale_numel(), planes.amax + g,
                       planes.decode_scale + g};
  }
};

}  // namespace shardopt
