#include "comm/registration_rule.hpp"

#include <algorithm>

namespace shardopt::detail {

std::vector<bool> registration_plan(const std::vector<BufferUse>& uses) {
  const bool shared = std::find(uses.begin(), uses.end(), BufferUse::Both) != uses.end();
  std::vector<bool> plan;
  plan.reserve(uses.size());
  for (BufferUse u : uses) plan.push_back(u == BufferUse::Collectives || (u == BufferUse::SendRecv && !shared));
  return plan;
}

}  // namespace shardopt::detail
