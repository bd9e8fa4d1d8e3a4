#include "core/float_env.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace shardopt::detail {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// MXCSR: DAZ is bit 6, FTZ bit 15.
constexpr std::uint64_t kFlushBits = (1u << 6) | (1u << 15);
std::uint64_t read_mode() noexcept { return _mm_getcsr(); }
void write_mode(std::uint64_t m) noexcept { _mm_setcsr(static_cast<unsigned>(m)); }
#elif defined(__aarch64__)
// FPCR: FZ is bit 24 (flushes both inputs and outputs).
constexpr std::uint64_t kFlushBits = std::uint64_t{1} << 24;
std::uint64_t read_mode() noexcept {
  std::uint64_t m;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(m));
  return m;
}
void write_mode(std::uint64_t m) noexcept { __asm__ __volatile__("msr fpcr, %0" : : "r"(m)); }
#else
constexpr std::uint64_t kFlushBits = 0;
std::uint64_t read_mode() noexcept { return 0; }
void write_mode(std::uint64_t) noexcept {}
#endif

}  // namespace

IeeeSubnormals::IeeeSubnormals() noexcept : saved_(read_mode()) {
  if ((saved_ & kFlushBits) != 0) write_mode(saved_ & ~kFlushBits);
}

IeeeSubnormals::~IeeeSubnormals() {
  if ((saved_ & kFlushBits) != 0) write_mode(saved_);
}

bool subnormals_flushed() noexcept { return (read_mode() & kFlushBits) != 0; }

bool float_modes_supported() noexcept { return kFlushBits != 0; }

void set_subnormals_flushed_for_test(bool on) noexcept {
  write_mode(on ? read_mode() | kFlushBits : read_mode() & ~kFlushBits);
}

}  // namespace shardopt::detail
