// options_agreement.hpp - the construction-time check that every rank passes the same
// options that change the math or the sequence of collectives (betas, eps, groups,
// clipping, schedule, dtypes, microbatches, parameter format, overlap and grouping of the
// collectives). Ranks that differ would train silently apart or issue mismatched
// collectives; instead every rank throws the same Error(LayoutMismatch) naming the first
// differing option and each rank's value. Per-step values set later (set_lr,
// set_loss_scale) are the trainer's business and are not checked.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "shardopt/adam_options.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/fsdp.hpp"

namespace shardopt::detail {

/// One option of the check: its name and its value as text.
using OptionField = std::pair<std::string, std::string>;

/// How a flag reads in an option's value text (a reduction: shardopt::to_string).
const char* option_text(bool value) noexcept;

/// The AdamOptions as fields: beta1, beta2, eps, decoupled_weight_decay, default_group,
/// groups, clip_max_norm, moment_dtype, master_storage, lr_schedule, microbatches.
std::vector<OptionField> adam_fields(const AdamOptions& a);

/// Every DistributedAdamOptions field that ranks must agree on, in the order compared:
/// adam_fields, then the dtypes, format, reduction, bucketing and overlap options. The
/// rank-local ones (persistent_grad_copies, watchdog) are not in it. Tests build their
/// one-field variants from this list, so a field added here needs a variant there.
std::vector<OptionField> distributed_adam_fields(const DistributedAdamOptions& o);

/// The same for FsdpOptions (the watchdog is rank-local and not in it).
std::vector<OptionField> fsdp_fields(const FsdpOptions& o);

/// Collective over `comm` (the same call on every rank, with the same field names in the
/// same order): one all-gather of a hash per field; if a value differs, one more
/// all-gather of the first differing field's text, and every rank throws
/// Error(LayoutMismatch): "`what`: ranks pass different `field`: rank 0: X; rank 1: Y".
void check_options_agree(const Communicator& comm, const std::string& what, const std::vector<OptionField>& fields);

}  // namespace shardopt::detail
