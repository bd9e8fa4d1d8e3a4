// error_of.hpp - the one helper every suite uses to look at an expected shardopt::Error.
#pragma once

#include <optional>

#include "shardopt/error.hpp"

namespace shardopt::test {

/// The shardopt::Error `f` throws, or nothing.
template <class F>
std::optional<Error> error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace shardopt::test
