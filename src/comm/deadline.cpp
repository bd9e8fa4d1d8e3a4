#include "comm/deadline.hpp"

#include <utility>

namespace shardopt::detail {
namespace {
// The calling thread's operation label and step deadline.
thread_local std::string t_label;
thread_local Deadline t_step_deadline;
thread_local std::string t_step_what;
}  // namespace

OperationLabel::OperationLabel(std::string what) : previous_(std::exchange(t_label, std::move(what))) {}
OperationLabel::~OperationLabel() { t_label = std::move(previous_); }
const std::string& OperationLabel::current() { return t_label; }
std::string OperationLabel::named(const char* call) {
  return t_label.empty() ? std::string(call) : std::string(call) + " (" + t_label + ")";
}

StepDeadlineScope::StepDeadlineScope(std::chrono::milliseconds limit, std::string what)
    : previous_(t_step_deadline), previous_what_(std::exchange(t_step_what, std::move(what))) {
  Deadline d;
  if (limit.count() > 0) {
    d.at = d.start + limit;
    d.limit = limit;
    d.limit_name = "step_timeout";
  }
  // A nested scope never extends the outer deadline.
  if (!previous_.armed() || d.at < previous_.at) {
    t_step_deadline = d;
  }
}

StepDeadlineScope::~StepDeadlineScope() {
  t_step_deadline = previous_;
  t_step_what = std::move(previous_what_);
}

const Deadline& current_step_deadline() { return t_step_deadline; }
const std::string& current_step_what() { return t_step_what; }

}  // namespace shardopt::detail
