#include "shardopt/error.hpp"

#include <string>

namespace shardopt {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::InvalidArgument: return "invalid_argument";
    case ErrorCode::OutOfRange: return "out_of_range";
    case ErrorCode::LayoutMismatch: return "layout_mismatch";
    case ErrorCode::InvalidState: return "invalid_state";
    case ErrorCode::CaptureRefused: return "capture_refused";
    case ErrorCode::Unsupported: return "unsupported";
    case ErrorCode::Cuda: return "cuda";
    case ErrorCode::Nccl: return "nccl";
    case ErrorCode::Mpi: return "mpi";
    case ErrorCode::Timeout: return "timeout";
    case ErrorCode::OutOfMemory: return "out_of_memory";
    case ErrorCode::Internal: return "internal";
  }
  return "unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(std::string("shardopt [") + to_string(code) + "]: " + message), code_(code) {}

namespace detail {
void throw_error(ErrorCode code, const std::string& message, const char* file, int line) {
  throw Error(code, message + " (at " + file + ":" + std::to_string(line) + ")");
}
}  // namespace detail

}  // namespace shardopt
