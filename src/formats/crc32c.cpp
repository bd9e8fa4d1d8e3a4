#include "formats/crc32c.hpp"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SHARDOPT_CRC32C_X86 1
#include <nmmintrin.h>
#else
#define SHARDOPT_CRC32C_X86 0
#endif

namespace shardopt {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// kTable[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
constexpr std::array<std::array<std::uint32_t, 256>, 8> make_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}
constexpr auto kTable = make_tables();

std::uint32_t update_bytes(std::uint32_t c, const unsigned char* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) c = (c >> 8) ^ kTable[0][(c ^ p[i]) & 0xFFu];
  return c;
}

#if SHARDOPT_CRC32C_X86
__attribute__((target("sse4.2"))) std::uint32_t update_sse42(std::uint32_t c, const unsigned char* p,
                                                             std::size_t n) noexcept {
  std::uint64_t c64 = c;
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<std::uint32_t>(c64);
  while (n > 0) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  return c;
}

bool have_sse42() noexcept {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

std::uint32_t crc32c_update_portable(std::uint32_t crc, const void* data, std::size_t n) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  if constexpr (std::endian::native == std::endian::little) {
    while (n > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
      c = (c >> 8) ^ kTable[0][(c ^ *p++) & 0xFFu];
      --n;
    }
    while (n >= 8) {
      std::uint32_t lo;
      std::uint32_t hi;
      std::memcpy(&lo, p, 4);
      std::memcpy(&hi, p + 4, 4);
      lo ^= c;
      c = kTable[7][lo & 0xFFu] ^ kTable[6][(lo >> 8) & 0xFFu] ^ kTable[5][(lo >> 16) & 0xFFu] ^
          kTable[4][lo >> 24] ^ kTable[3][hi & 0xFFu] ^ kTable[2][(hi >> 8) & 0xFFu] ^
          kTable[1][(hi >> 16) & 0xFFu] ^ kTable[0][hi >> 24];
      p += 8;
      n -= 8;
    }
  }
  return ~update_bytes(c, p, n);
}

std::uint32_t crc32c_update(std::uint32_t crc, const void* data, std::size_t n) noexcept {
#if SHARDOPT_CRC32C_X86
  if (have_sse42()) return ~update_sse42(~crc, static_cast<const unsigned char*>(data), n);
#endif
  return crc32c_update_portable(crc, data, n);
}

bool crc32c_hardware() noexcept {
#if SHARDOPT_CRC32C_X86
  return have_sse42();
#else
  return false;
#endif
}

}  // namespace shardopt
