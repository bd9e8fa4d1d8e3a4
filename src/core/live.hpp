// live.hpp - the use-after-move check of the library's move-only handles (pimpl): a
// moved-from object may only be destroyed or assigned to; any other call throws.
#pragma once

#include <memory>
#include <string>

#include "shardopt/error.hpp"

namespace shardopt::detail {

/// `*impl`, or Error(InvalidState) "this <type_name> was moved from; ..." when empty.
template <class Impl>
Impl& live(const std::unique_ptr<Impl>& impl, const char* type_name) {
  if (impl == nullptr)
    throw Error(ErrorCode::InvalidState,
                std::string("this ") + type_name + " was moved from; use the one it was moved to");
  return *impl;
}

}  // namespace shardopt::detail
