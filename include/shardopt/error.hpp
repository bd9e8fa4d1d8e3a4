// shardopt/error.hpp - the one exception type of the library.
//
// Every failure is a shardopt::Error: a code that a program can branch on and
// a message that says what went wrong and what to change. CUDA, NCCL and MPI
// failures carry the failing call, the file and the line.
#pragma once

#include <stdexcept>
#include <string>

namespace shardopt {

/// What kind of failure an Error reports.
enum class ErrorCode {
  InvalidArgument,  ///< a bad value passed by the caller (empty list, zero dim, ...)
  OutOfRange,       ///< an index (bucket, param, unit) outside its range
  LayoutMismatch,   ///< ranks disagree on the parameter list or options
  InvalidState,     ///< a call in the wrong phase, or an object used after an error
  CaptureRefused,   ///< a configuration that would allocate or free inside a captured step
  Unsupported,      ///< a feature absent from this build or device (e.g. no CUDA)
  Cuda,             ///< a CUDA runtime call failed
  Nccl,             ///< an NCCL call failed
  Mpi,              ///< an MPI call failed
  Timeout,          ///< a collective or a replayed step missed its deadline (shardopt/watchdog.hpp)
  OutOfMemory,      ///< an allocation of device or pinned host memory failed; the message names the bytes
  Internal,         ///< a broken invariant inside shardopt: please report it
};

/// Short stable name of a code, e.g. "invalid_argument".
const char* to_string(ErrorCode code) noexcept;

/// The exception thrown by every shardopt call that fails.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  /// The kind of failure.
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {
/// Throws Error(code, message + " (at file:line)"); used by the check macros.
[[noreturn]] void throw_error(ErrorCode code, const std::string& message, const char* file,
                              int line);
}  // namespace detail

}  // namespace shardopt

/// Throws shardopt::Error with the given code and message when `cond` is false.
#define SHARDOPT_REQUIRE(cond, code, message)                                       \
  do {                                                                              \
    if (!(cond)) ::shardopt::detail::throw_error((code), (message), __FILE__, __LINE__); \
  } while (0)
