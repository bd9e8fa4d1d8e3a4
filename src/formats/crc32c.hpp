// crc32c.hpp - CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
// checkpoint files. Uses the SSE4.2 crc32 instruction where the CPU has it, else a
// slicing-by-8 table; both give the same value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardopt {

/// Continues a CRC-32C over `n` more bytes: start with crc = 0, feed the data in any
/// chunks, and the result equals crc32c() over the whole.
std::uint32_t crc32c_update(std::uint32_t crc, const void* data, std::size_t n) noexcept;

/// CRC-32C of one buffer. crc32c("123456789", 9) == 0xE3069283.
inline std::uint32_t crc32c(const void* data, std::size_t n) noexcept {
  return crc32c_update(0, data, n);
}

/// The portable table path alone (what crc32c_update uses without SSE4.2); for tests
/// and benchmarks.
std::uint32_t crc32c_update_portable(std::uint32_t crc, const void* data, std::size_t n) noexcept;

/// Whether crc32c_update uses the hardware instruction on this CPU.
bool crc32c_hardware() noexcept;

}  // namespace shardopt
