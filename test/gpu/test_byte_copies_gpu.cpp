// The landing copy kernel (src/kernels/common/byte_copies.cu): the same copies as plain
// memcpy, for co-aligned pieces (16-byte vector body) and misaligned ones (bytes).
#include "common/byte_copies_cases.hpp"

namespace {
using namespace shardopt;

TEST(ByteCopiesGpu, KernelMatchesMemcpy) {
  for (std::uint32_t seed : {1u, 2u, 3u}) shardopt::test::case_copy_pieces_match_memcpy(Backend::Cuda, seed);
}

TEST(ByteCopiesGpu, KernelOrsSharedBytes) { shardopt::test::case_or_pieces(Backend::Cuda); }

}  // namespace
