#include "optimizer/options_agreement.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "comm/deadline.hpp"
#include "core/fnv.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {
namespace {

std::string real(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string group_text(const AdamGroup& g) {
  std::string muon;  // AdamW groups read as before
  if (g.algorithm == GroupAlgorithm::Muon) {
    const MuonSettings& m = g.muon;
    muon = ", algorithm=muon(momentum=" + real(m.momentum) + ", nesterov=" + option_text(m.nesterov) +
           ", ns_steps=" + std::to_string(m.ns_steps) + ", ns_coefficients=" + real(m.ns_coefficients[0]) + "/" +
           real(m.ns_coefficients[1]) + "/" + real(m.ns_coefficients[2]) + ", eps=" + real(m.eps) +
           ", weight_decay=" + real(m.weight_decay) + ", adjust_lr=" + to_string(m.adjust_lr) + ", gemm=" + to_string(m.gemm) + ")";
  }
  return "{weight_decay=" + real(g.weight_decay) + ", lr_scale=" + real(g.lr_scale) + muon + "}";
}

// FNV-1a, 64 bit: the same value on every rank for the same text.
std::uint64_t hash_text(const std::string& s) {
  Fnv f;
  f.bytes(s.data(), s.size());
  return f.h;
}

constexpr std::size_t kTextWords = 24;  // up to 191 characters of a value per rank

}  // namespace

const char* option_text(bool value) noexcept { return value ? "true" : "false"; }


std::vector<OptionField> adam_fields(const AdamOptions& a) {
  std::string groups;
  for (const auto& [name, g] : a.groups) groups += (groups.empty() ? "" : "; ") + name + group_text(g);
  const LrSchedule& s = a.lr_schedule;
  const char* kinds[] = {"host", "constant", "warmup_cosine"};
  const std::string schedule = std::string(kinds[static_cast<int>(s.kind)]) + "(peak=" + real(s.peak) +
                               ", min_lr=" + real(s.min_lr) + ", warmup_steps=" + std::to_string(s.warmup_steps) +
                               ", total_steps=" + std::to_string(s.total_steps) + ")";
  return {{"beta1", real(a.beta1)},
          {"beta2", real(a.beta2)},
          {"eps", real(a.eps)},
          {"decoupled_weight_decay", option_text(a.decoupled_weight_decay)},
          {"default_group", group_text(a.default_group)},
          {"groups", "{" + groups + "}"},
          {"clip_max_norm", real(a.clip_max_norm)},
          {"moment_dtype", to_string(a.moment_dtype)},
          {"master_storage", to_string(a.master_storage)},
          {"lr_schedule", schedule},
          {"microbatches", std::to_string(a.microbatches)}};
}

std::vector<OptionField> distributed_adam_fields(const DistributedAdamOptions& o) {
  std::vector<OptionField> fields = adam_fields(o);
  fields.insert(fields.end(),
                {{"grad_dtype", to_string(o.grad_dtype)},
                 {"param_dtype", o.param_dtype ? to_string(*o.param_dtype) : "unset"},
                 {"param_format", to_string(o.param_format)},
                 {"grad_reduce", to_string(o.grad_reduce)},
                 {"grad_reduce_precision", to_string(o.grad_reduce_precision)},
                 {"bucket_numel", o.bucket_numel ? std::to_string(*o.bucket_numel) : "unset"},
                 {"overlap_grad_reduce", option_text(o.overlap_grad_reduce)},
                 {"overlap_param_gather", option_text(o.overlap_param_gather)},
                 {"grouped_collectives", option_text(o.grouped_collectives)},
                 {"gather_pipeline", std::to_string(o.gather_pipeline)},
                 {"nccl_registered", option_text(o.nccl_registered)}});
  return fields;
}

std::vector<OptionField> fsdp_fields(const FsdpOptions& o) {
  std::vector<OptionField> fields = adam_fields(o);
  fields.insert(fields.end(), {{"param_dtype", to_string(o.param_dtype)},
                               {"grad_dtype", to_string(o.grad_dtype)},
                               {"slot_grad_dtype", to_string(o.slot_grad_dtype)},
                               {"grad_reduce", to_string(o.grad_reduce)},
                               {"grad_reduce_precision", to_string(o.grad_reduce_precision)},
                               {"bucket_numel", o.bucket_numel ? std::to_string(*o.bucket_numel) : "unset"},
                               {"keep_last_unit", option_text(o.keep_last_unit)},
                               {"prefetch", option_text(o.prefetch)},
                               {"shard_group_size", std::to_string(o.shard_group_size)},
                               {"param_format", to_string(o.param_format)}});
  return fields;
}

void check_options_agree(const Communicator& comm, const std::string& what, const std::vector<OptionField>& fields) {
  if (comm.size() == 1) return;
  OperationLabel label("the agreement on " + what);  // named if a rank never arrives
  std::vector<std::uint64_t> mine;
  mine.reserve(fields.size() + 1);
  mine.push_back(fields.size());
  for (const auto& f : fields) mine.push_back(hash_text(f.first + "=" + f.second));
  const std::vector<std::uint64_t> all = comm.all_gather_values(mine);
  const std::size_t n = mine.size();
  // The first field (in order) where some rank differs from rank 0; every rank finds the same.
  std::size_t bad = n;
  for (std::size_t k = 0; k < n && bad == n; ++k)
    for (int r = 1; r < comm.size(); ++r)
      if (all[static_cast<std::size_t>(r) * n + k] != all[k]) bad = k;
  if (bad == n) return;
  if (bad == 0)
    throw Error(ErrorCode::LayoutMismatch, what + ": ranks run different shardopt builds (their option lists differ); "
                                                  "use one build on every rank");
  const OptionField& field = fields[bad - 1];
  std::vector<std::uint64_t> text(kTextWords, 0);
  std::memcpy(text.data(), field.second.data(), std::min(field.second.size(), kTextWords * 8 - 1));
  const std::vector<std::uint64_t> texts = comm.all_gather_values(text);
  // "rank 0, 2: X; rank 1: Y", ranks grouped by value in order of first appearance.
  std::vector<std::string> values(static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) {
    const char* c = reinterpret_cast<const char*>(texts.data() + static_cast<std::size_t>(r) * kTextWords);
    values[static_cast<std::size_t>(r)] = std::string(c, strnlen(c, kTextWords * 8));
  }
  std::vector<std::string> order;
  std::map<std::string, std::string> ranks;
  for (int r = 0; r < comm.size(); ++r) {
    const std::string& v = values[static_cast<std::size_t>(r)];
    if (!ranks.count(v)) order.push_back(v);
    ranks[v] += (ranks[v].empty() ? "" : ", ") + std::to_string(r);
  }
  std::string list;
  for (const std::string& v : order) list += (list.empty() ? "" : "; ") + std::string("rank ") + ranks[v] + ": " + v;
  throw Error(ErrorCode::LayoutMismatch, what + ": ranks pass different " + field.first + " (" + list +
                                             "); pass the same options on every rank");
}

}  // namespace shardopt::detail
