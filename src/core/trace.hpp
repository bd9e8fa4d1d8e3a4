// trace.hpp - internal: NVTX ranges named "shardopt/...", so that a profiler's timeline
// (Nsight Systems) shows the library's work: the step, each bucket's or unit's collectives,
// Adam, quantize, landing and the checkpoint phases (docs/profiling.md lists them).
//
// A range marks host time: from the enqueue of the first piece of work inside it to the
// end of the scope. Built without NVTX (the host-only build, or -Dnvtx=disabled) the
// macros compile to nothing. Built with it and no tool attached, a range costs three
// tests (the call site's and the domain's one-time initialization, the null domain):
// the `shardopt` domain is null, and nothing is registered or pushed.
// Names are registered strings, made once per call site (indexed names once per index),
// so the hot path formats no strings.
#pragma once

#include "shardopt_trace_config.h"

#if SHARDOPT_HAVE_NVTX
#include <atomic>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#include <nvtx3/nvToolsExt.h>
#pragma GCC diagnostic pop

namespace shardopt::detail {

/// The `shardopt` NVTX domain, created at the first call; null when no tool is attached.
inline nvtxDomainHandle_t trace_domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("shardopt");
  return domain;
}

/// A range name ("shardopt/adam"), registered once; for an indexed name also the names
/// "shardopt/reduce_scatter bucket 0", "... 1", ..., each registered at its first use.
///
/// Trivially destructible on purpose: the statics of the call sites stay usable while
/// other statics are destroyed at exit (the indexed table is never freed; it exists only
/// while a tool is attached).
class TraceName {
 public:
  explicit TraceName(const char* name);
  TraceName(const TraceName&) = delete;
  TraceName& operator=(const TraceName&) = delete;

  /// The registered name (index < 0) or "name index"; indexes past kIndexed share the
  /// plain name (the range's payload still carries the index).
  nvtxStringHandle_t handle(int index) const;

  static constexpr int kIndexed = 4096;

 private:
  const char* name_;
  nvtxStringHandle_t plain_ = nullptr;
  std::atomic<nvtxStringHandle_t>* indexed_ = nullptr;  // kIndexed slots, only while a tool is attached
};

/// An open range of the `shardopt` domain, closed by the destructor (RAII).
class TraceRange {
 public:
  explicit TraceRange(const TraceName& name, int index = -1) {
    if (nvtxDomainHandle_t d = trace_domain(); d != nullptr) open(d, name, index);
  }
  ~TraceRange() {
    if (domain_ != nullptr) nvtxDomainRangePop(domain_);
  }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;

 private:
  void open(nvtxDomainHandle_t domain, const TraceName& name, int index);
  nvtxDomainHandle_t domain_ = nullptr;
};

}  // namespace shardopt::detail

#define SHARDOPT_TRACE_CAT2(a, b) a##b
#define SHARDOPT_TRACE_CAT(a, b) SHARDOPT_TRACE_CAT2(a, b)
/// Opens the range `name` (a string literal, "shardopt/...") until the end of the scope.
#define SHARDOPT_TRACE(name)                                                               \
  static const ::shardopt::detail::TraceName SHARDOPT_TRACE_CAT(shardopt_trace_name_, __LINE__){name}; \
  const ::shardopt::detail::TraceRange SHARDOPT_TRACE_CAT(shardopt_trace_range_, __LINE__) {     \
    SHARDOPT_TRACE_CAT(shardopt_trace_name_, __LINE__)                                           \
  }
/// Opens the range "name index" (e.g. "shardopt/all_gather bucket 3") until the end of the scope.
#define SHARDOPT_TRACE_INDEXED(name, index)                                                \
  static const ::shardopt::detail::TraceName SHARDOPT_TRACE_CAT(shardopt_trace_name_, __LINE__){name}; \
  const ::shardopt::detail::TraceRange SHARDOPT_TRACE_CAT(shardopt_trace_range_, __LINE__) {     \
    SHARDOPT_TRACE_CAT(shardopt_trace_name_, __LINE__), static_cast<int>(index)                 \
  }
/// SHARDOPT_TRACE_INDEXED with `name_if` when `cond` holds, else `name_else` (one call site, two names).
#define SHARDOPT_TRACE_EITHER(cond, name_if, name_else, index)                             \
  static const ::shardopt::detail::TraceName SHARDOPT_TRACE_CAT(shardopt_trace_if_, __LINE__){name_if};   \
  static const ::shardopt::detail::TraceName SHARDOPT_TRACE_CAT(shardopt_trace_else_, __LINE__){name_else}; \
  const ::shardopt::detail::TraceRange SHARDOPT_TRACE_CAT(shardopt_trace_range_, __LINE__) {              \
    (cond) ? SHARDOPT_TRACE_CAT(shardopt_trace_if_, __LINE__) : SHARDOPT_TRACE_CAT(shardopt_trace_else_, __LINE__), \
        static_cast<int>(index)                                                                         \
  }

#else  // no NVTX: nothing at all (the index expression is not evaluated)

#define SHARDOPT_TRACE(name) static_cast<void>(0)
#define SHARDOPT_TRACE_INDEXED(name, index) static_cast<void>(sizeof(index))
#define SHARDOPT_TRACE_EITHER(cond, name_if, name_else, index) static_cast<void>(sizeof((cond) ? 0 : (index)))

#endif
