// The landing copy table on the host backend (the host twin of the CUDA kernel).
#include "common/byte_copies_cases.hpp"

namespace {
using namespace shardopt;

TEST(ByteCopies, SplitCoversEveryByteInBoundedPieces) {
  std::vector<kernels::BytePiece> t;
  std::vector<std::uint8_t> a(300000), c(300000);
  kernels::split_copy(t, a.data(), c.data(), 0);
  EXPECT_TRUE(t.empty());
  kernels::split_copy(t, a.data() + 3, c.data() + 5, 200001);
  ASSERT_EQ(t.size(), 4u);
  std::int64_t total = 0;
  for (std::size_t k = 0; k < t.size(); ++k) {
    EXPECT_EQ(t[k].src, a.data() + 3 + total);
    EXPECT_EQ(t[k].dst, c.data() + 5 + total);
    total += t[k].bytes;
  }
  EXPECT_EQ(total, 200001);
}

TEST(ByteCopies, HostTwinMatchesMemcpy) {
  for (std::uint32_t seed : {1u, 2u, 3u}) shardopt::test::case_copy_pieces_match_memcpy(Backend::Host, seed);
}

TEST(ByteCopies, HostTwinOrsSharedBytes) { shardopt::test::case_or_pieces(Backend::Host); }

}  // namespace
