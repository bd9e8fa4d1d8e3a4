// shardopt/views.hpp - persistent views of parameters and gradients: they never move
// or change between steps, which is what makes a graph replay valid.
//
// A view is a pointer with a shape, a dtype and row-major strides. Views handed out by an
// optimizer never move or change between steps: that is what makes a captured graph's
// pointers valid on every replay.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardopt/dtype.hpp"
#include "shardopt/param_spec.hpp"

namespace shardopt {

/// A strided tensor in device (or host-backend) memory.
struct TensorView {
  void* data = nullptr;
  Shape shape;
  std::vector<std::int64_t> strides;  ///< in elements, row-major for every view shardopt makes
  DType dtype = DType::f32;

  /// Elements of the shape, and their bytes in `dtype`.
  std::int64_t numel() const noexcept { return shardopt::numel(shape); }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(numel()) * size_of(dtype); }
  /// True when the strides are the row-major strides of the shape.
  bool contiguous() const noexcept;
  template <class T> T* as() const noexcept { return static_cast<T*>(data); }
};

/// Row-major strides of a shape.
std::vector<std::int64_t> row_major_strides(const Shape& shape);

/// A contiguous row-major view of `shape` elements of `dtype` at `data`.
TensorView contiguous_view(void* data, const Shape& shape, DType dtype);

/// A view of a full model parameter (what the forward reads).
struct ParamView : TensorView {};
/// A view of a parameter's full gradient (what the backward writes or accumulates into).
struct GradView : TensorView {};

/// A rank's piece of one parameter inside its shard: a 1-D view of `length` elements
/// starting at element `param_offset` of the flattened parameter (length 0 when the rank
/// holds none of it).
struct ShardView : TensorView {
  std::int64_t param_offset = 0;
};

}  // namespace shardopt
