#include "shardopt/param_spec.hpp"

#include <limits>
#include <sstream>

#include "shardopt/error.hpp"

namespace shardopt {

std::int64_t numel(const Shape& shape) noexcept {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

ParamSpec ParamSpec::tensor(std::string name, Shape shape, DType dtype, std::string group) {
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.dtype = dtype;
  s.group = std::move(group);
  return s;
}

ParamSpec ParamSpec::grouped(std::string name, int members, Shape member_shape, DType dtype,
                             std::string group) {
  SHARDOPT_REQUIRE(members >= 1, ErrorCode::InvalidArgument,
                   "grouped parameter '" + name + "': member count " + std::to_string(members) +
                       " must be >= 1");
  ParamSpec s;
  s.name = std::move(name);
  s.dtype = dtype;
  s.group = std::move(group);
  s.member_shapes.assign(static_cast<std::size_t>(members), member_shape);
  s.shape.push_back(members);
  s.shape.insert(s.shape.end(), member_shape.begin(), member_shape.end());
  return s;
}

namespace {
std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

void check_dims(const std::string& what, const Shape& shape) {
  SHARDOPT_REQUIRE(!shape.empty(), ErrorCode::InvalidArgument,
                   what + " has an empty shape; give at least one dimension (use [1] for a scalar)");
  std::int64_t n = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    SHARDOPT_REQUIRE(shape[d] > 0, ErrorCode::InvalidArgument,
                     what + " has dimension " + std::to_string(d) + " = " + std::to_string(shape[d]) +
                         " in shape " + shape_str(shape) + "; every dimension must be positive");
    SHARDOPT_REQUIRE(n <= std::numeric_limits<std::int64_t>::max() / 4 / shape[d],
                     ErrorCode::InvalidArgument, what + " has too many elements");
    n *= shape[d];
  }
}
}  // namespace

ParamSpec validated(const ParamSpec& spec) {
  SHARDOPT_REQUIRE(!spec.name.empty(), ErrorCode::InvalidArgument,
                   "a ParamSpec has an empty name; give every parameter a unique name");
  const std::string what = "parameter '" + spec.name + "'";
  SHARDOPT_REQUIRE(is_float_storage(spec.dtype), ErrorCode::InvalidArgument,
                   what + " has dtype " + to_string(spec.dtype) +
                       "; parameters are registered as f32, bf16 or f16 (MXFP8 is an optimizer option)");
  SHARDOPT_REQUIRE(!spec.group.empty(), ErrorCode::InvalidArgument,
                   what + " has an empty optimizer group; use e.g. \"decay\" or \"no_decay\"");
  ParamSpec out = spec;
  if (!spec.member_shapes.empty()) {
    const Shape& first = spec.member_shapes.front();
    check_dims(what + " member 0", first);
    for (std::size_t m = 1; m < spec.member_shapes.size(); ++m) {
      SHARDOPT_REQUIRE(spec.member_shapes[m] == first, ErrorCode::InvalidArgument,
                       what + ": grouped members must have one shape, but member " + std::to_string(m) +
                           " is " + shape_str(spec.member_shapes[m]) + " and member 0 is " +
                           shape_str(first) + "; register unequal members as separate parameters");
    }
    Shape full;
    full.push_back(static_cast<std::int64_t>(spec.member_shapes.size()));
    full.insert(full.end(), first.begin(), first.end());
    if (spec.shape.empty()) {
      out.shape = full;
    } else {
      SHARDOPT_REQUIRE(spec.shape == full, ErrorCode::InvalidArgument,
                       what + " has shape " + shape_str(spec.shape) + " but its members make " +
                           shape_str(full) + "; leave shape empty or make it [G, member...]");
    }
  }
  check_dims(what, out.shape);
  if (!spec.member_names.empty()) {
    SHARDOPT_REQUIRE(spec.member_names.size() == spec.member_shapes.size(), ErrorCode::InvalidArgument,
                     what + " has " + std::to_string(spec.member_names.size()) + " member_names for " +
                         std::to_string(spec.members()) +
                         " members; give one name per member (or none, for NAME.0, NAME.1, ...)");
    for (std::size_t m = 0; m < spec.member_names.size(); ++m) {
      SHARDOPT_REQUIRE(!spec.member_names[m].empty(), ErrorCode::InvalidArgument,
                       what + ": member_names[" + std::to_string(m) + "] is empty");
      for (std::size_t k = 0; k < m; ++k)
        SHARDOPT_REQUIRE(spec.member_names[k] != spec.member_names[m], ErrorCode::InvalidArgument,
                         what + ": members " + std::to_string(k) + " and " + std::to_string(m) +
                             " are both named '" + spec.member_names[m] + "'");
    }
  }
  return out;
}

std::string ParamSpec::member_name(int m) const {
  SHARDOPT_REQUIRE(m >= 0 && m < members(), ErrorCode::OutOfRange,
                   "member " + std::to_string(m) + " of '" + name + "' is out of range [0, " +
                       std::to_string(members()) + ")");
  if (member_shapes.empty()) return name;
  if (!member_names.empty()) return member_names[static_cast<std::size_t>(m)];
  return name + "." + std::to_string(m);
}

std::string describe(const ParamSpec& spec) {
  std::ostringstream os;
  os << '\'' << spec.name << "' " << shape_str(spec.shape) << ' ' << to_string(spec.dtype)
     << " group=" << spec.group;
  if (!spec.member_shapes.empty()) os << " members=" << spec.member_shapes.size();
  return os.str();
}

}  // namespace shardopt
