// shardopt/param_spec.hpp - what a trainer registers: one entry per parameter tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardopt/dtype.hpp"

namespace shardopt {

/// A tensor shape; every dimension must be positive.
using Shape = std::vector<std::int64_t>;

/// Number of elements of a shape (1 for an empty shape).
std::int64_t numel(const Shape& shape) noexcept;

/// One parameter as the trainer registers it, in registration (forward) order.
///
/// A grouped parameter (e.g. G MoE experts) lists its members' shapes in
/// `member_shapes`; all must be equal. It is stored as one contiguous tensor of shape
/// [G, member...] (then `shape` may be left empty or must equal that) and every
/// member also gets its own view.
struct ParamSpec {
  std::string name;                 ///< unique, non-empty
  Shape shape;                      ///< full shape of the stored tensor
  DType dtype = DType::bf16;        ///< model-parameter dtype: f32, bf16 or f16
  std::string group = "decay";      ///< optimizer group, e.g. "decay" / "no_decay"
  std::vector<Shape> member_shapes; ///< non-empty only for grouped parameters
  /// Grouped parameters: the names of the members in checkpoints (docs/checkpoints.md),
  /// the names the same tensors would have if registered one by one, so that the two
  /// registrations load each other's checkpoints. Empty: "NAME.0", "NAME.1", ...
  std::vector<std::string> member_names;

  /// A plain parameter.
  static ParamSpec tensor(std::string name, Shape shape, DType dtype = DType::bf16,
                          std::string group = "decay");
  /// A grouped parameter of `members` equal members of `member_shape`.
  static ParamSpec grouped(std::string name, int members, Shape member_shape,
                           DType dtype = DType::bf16, std::string group = "decay");

  /// Number of members: 1 for a plain parameter.
  int members() const noexcept {
    return member_shapes.empty() ? 1 : static_cast<int>(member_shapes.size());
  }
  /// The checkpoint name of member m: member_names[m], or "NAME.m"; the name itself for a
  /// plain parameter (m = 0).
  std::string member_name(int m) const;
};

/// Checks one spec (name, dims, dtype, group, members) and returns it normalised
/// (a grouped spec's empty shape filled in as [G, member...]). Throws
/// Error(InvalidArgument) naming the parameter and what to change.
ParamSpec validated(const ParamSpec& spec);

/// One-line description, e.g. "'layers.0.mlp.up' [8192, 2048] bf16 group=decay".
std::string describe(const ParamSpec& spec);

}  // namespace shardopt
