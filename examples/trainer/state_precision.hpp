// state_precision.hpp - the choices of --master and --moments: each choice's name on the
// command line, what it sets in the optimizer's AdamOptions, and its line of --help.
//
// Each table is the only list of its option's choices: the parser (cli.cpp), the help text
// and Trainer (apply_state_precision) read it. A new choice -- an 8-bit moment form, say --
// is one more row.
#pragma once

#include <stdexcept>
#include <string>

#include <shardopt/dtype.hpp>
#include <shardopt/fused_adam.hpp>

namespace trainer {

/// One choice of an option: its name, its value in the library, and what it means.
template <class T>
struct Choice {
  const char* name;
  T value;
  const char* help;
};

/// --master: how the optimizer keeps the fp32 master of each parameter (docs/state_precision.md).
inline constexpr Choice<shardopt::MasterStorage> kMasterChoices[] = {
    {"fp32", shardopt::MasterStorage::fp32, "an fp32 copy"},
    {"remainder", shardopt::MasterStorage::bf16_remainder, "the bf16 parameter + a 16-bit remainder (exact, 2 B less)"},
};

/// --moments: the dtype of the Adam moments (AdamOptions::moment_dtype).
inline constexpr Choice<shardopt::DType> kMomentChoices[] = {
    {"fp32", shardopt::DType::f32, "fp32"},
    {"bf16", shardopt::DType::bf16, "bf16"},
    {"q8", shardopt::DType::q8_block, "8-bit codes + an fp32 scale per 256 elements (native parameters only)"},
};

/// The value of the choice named `name` in `table`; throws std::invalid_argument naming
/// `option` for a name the table does not have.
template <class T, std::size_t N>
T choice_value(const Choice<T> (&table)[N], const std::string& option, const std::string& name) {
  for (const Choice<T>& c : table)
    if (name == c.name) return c.value;
  throw std::invalid_argument(option + ": no choice '" + name + "'");
}

}  // namespace trainer
