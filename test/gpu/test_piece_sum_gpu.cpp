// The CUDA piece sum at its byte limit (issue 31, src/kernels/common/piece_sum.cu): its
// vector kernel (16-byte loads of every piece, vector stores, a grid of one resident
// wave) and its element-wise fallback give, bit for bit, what a plain loop written here
// gives: acc = 0.0f, then the pieces in rank order in fp32, then / n for Average, then
// (accumulating) out + that in fp32, rounded once to the output dtype. The roundings to
// bf16 and f16 are written here too (bf16 by hand, f16 by the compiler's _Float16), so
// the oracle shares no code with the kernel.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/device_copy.hpp"
#include "core/memory.hpp"
#include "kernels/common/piece_sum.hpp"
#include "shardopt/backend.hpp"

namespace {
using namespace shardopt;

// ------------------------------------------------------------------ the oracle's numbers

std::size_t width(DType t) { return t == DType::f32 ? 4 : 2; }

// bf16 -> f32: the high half of the f32 bits.
float from_bf16(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

// f32 -> bf16, round to nearest even (finite values: all the test makes).
std::uint16_t to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float from_f16(std::uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
std::uint16_t to_f16(float f) { return std::bit_cast<std::uint16_t>(static_cast<_Float16>(f)); }

float get(DType t, const std::vector<std::uint8_t>& b, std::size_t i) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, b.data() + 4 * i, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return t == DType::bf16 ? from_bf16(h) : from_f16(h);
}

void put(DType t, std::vector<std::uint8_t>& b, std::size_t i, float v) {
  if (t == DType::f32) {
    std::memcpy(b.data() + 4 * i, &v, 4);
    return;
  }
  const std::uint16_t h = t == DType::bf16 ? to_bf16(v) : to_f16(v);
  std::memcpy(b.data() + 2 * i, &h, 2);
}

// `count` values of dtype t: random signs, mantissas and exponents from 2^-6 to 2^5, so
// that the sums round (fp32 and the narrow outputs) and no two pieces are alike.
std::vector<std::uint8_t> random_values(DType t, std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-6, 5), sign(0, 1);
  std::vector<std::uint8_t> b(count * width(t));
  for (std::size_t i = 0; i < count; ++i) {
    const float v = std::ldexp(mant(rng), expo(rng));
    put(t, b, i, sign(rng) ? -v : v);
  }
  return b;
}

// ------------------------------------------------------------------ one case

struct Case {
  DType in = DType::bf16;
  DType out = DType::f32;
  int n = 2;
  std::int64_t count = 0;
  bool average = false;
  bool accumulate = false;
  int own = -1;                // the own piece's index (read from its own buffer), or -1
  bool in_place = false;       // the own piece's buffer is the output (out dtype = in dtype)
  std::size_t pieces_skew = 0; // bytes the pieces' base lies past a 256-byte boundary
  std::size_t out_skew = 0;    // the same for the output (and the own piece, in place)
  bool share_sms = false;
  std::uint32_t seed = 1;

  std::string name() const {
    return std::string("in=") + to_string(in) + " out=" + to_string(out) + " n=" + std::to_string(n) +
           " count=" + std::to_string(count) + " average=" + std::to_string(average) +
           " accumulate=" + std::to_string(accumulate) + " own=" + std::to_string(own) +
           (in_place ? " in place" : "") + " pieces_skew=" + std::to_string(pieces_skew) +
           " out_skew=" + std::to_string(out_skew) + (share_sms ? " share_sms" : "");
  }
};

// Runs the CUDA sum of one case and returns the bytes of elements that differ from the
// oracle (0: bitwise equal).
std::int64_t run_case(const Case& c) {
  const std::size_t count = static_cast<std::size_t>(c.count), ip = width(c.in);
  const DType out = c.in_place ? c.in : c.out;
  const std::vector<std::uint8_t> pieces = random_values(c.in, count * static_cast<std::size_t>(c.n), c.seed);
  const std::vector<std::uint8_t> before = random_values(out, count, c.seed + 7777);
  // The oracle: the plain rank-order loop over the true pieces.
  std::vector<std::uint8_t> want(count * width(out));
  for (std::size_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (int r = 0; r < c.n; ++r) acc += get(c.in, pieces, static_cast<std::size_t>(r) * count + i);
    if (c.average) acc = acc / static_cast<float>(c.n);
    if (c.in_place) {  // the output starts as the own piece
      const float mine = get(c.in, pieces, static_cast<std::size_t>(c.own) * count + i);
      put(out, want, i, c.accumulate ? mine + acc : acc);
    } else {
      put(out, want, i, c.accumulate ? get(out, before, i) + acc : acc);
    }
  }
  // The device buffers: the received pieces (the own slot poisoned with NaN when the own
  // piece is read elsewhere), the own piece, the output.
  std::vector<std::uint8_t> received = pieces;
  if (c.own >= 0)
    for (std::size_t i = 0; i < count; ++i) put(c.in, received, static_cast<std::size_t>(c.own) * count + i, NAN);
  DeviceBuffer dp(Backend::Cuda, received.size() + 256), dout(Backend::Cuda, count * width(out) + 256),
      down(Backend::Cuda, count * ip + 256);
  char* p = dp.as<char>() + c.pieces_skew;
  char* o = dout.as<char>() + c.out_skew;
  char* own = c.in_place ? o : down.as<char>();
  test::bytes_to_device(Backend::Cuda, p, received.data(), received.size());
  if (c.in_place) {
    test::bytes_to_device(Backend::Cuda, o, pieces.data() + static_cast<std::size_t>(c.own) * count * ip, count * ip);
  } else {
    test::bytes_to_device(Backend::Cuda, o, before.data(), before.size());
    if (c.own >= 0)
      test::bytes_to_device(Backend::Cuda, own, pieces.data() + static_cast<std::size_t>(c.own) * count * ip,
                            count * ip);
  }
  kernels::PieceSum a;
  a.pieces = p;
  a.piece_dtype = c.in;
  a.n = c.n;
  a.count = c.count;
  a.average = c.average;
  a.out = o;
  a.out_dtype = out;
  a.accumulate = c.accumulate;
  if (c.own >= 0) {
    a.own = own;
    a.own_index = c.own;
  }
  a.share_sms = c.share_sms;
  kernels::piece_sum(a, Backend::Cuda, nullptr);
  std::vector<std::uint8_t> got(want.size());
  test::bytes_to_host(Backend::Cuda, got.data(), o, got.size());  // waits for the sum
  std::int64_t differ = 0;
  const std::size_t w = width(out);
  for (std::size_t i = 0; i < count; ++i) differ += std::memcmp(got.data() + i * w, want.data() + i * w, w) != 0;
  return differ;
}

void expect_oracle(const Case& c) { EXPECT_EQ(run_case(c), 0) << c.name(); }

constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

// Every input and output dtype, Average and Sum, accumulate on and off, 1 to 8 pieces,
// for one length and layout.
void every_combination(Case c) {
  for (int n = 1; n <= 8; ++n)
    for (DType in : kDtypes)
      for (DType out : kDtypes)
        for (int flags = 0; flags < 4; ++flags) {
          c.n = n;
          c.in = in;
          c.out = out;
          c.average = flags & 1;
          c.accumulate = flags & 2;
          c.seed = static_cast<std::uint32_t>(n * 1000 + static_cast<int>(in) * 100 + static_cast<int>(out) * 10 + flags);
          expect_oracle(c);
        }
}

// ------------------------------------------------------------------ the cases

// The vector kernel: lengths that are multiples of 8 (16 bytes of a 16-bit piece, 32 of
// an fp32 one), bases aligned. 8: a single vector; 1000 and 4104: not a multiple of a
// thread's 16 elements (two vectors) nor of a block's step (4096 elements of a 16-bit
// piece); 4096: exactly one step.
TEST(PieceSumGpu, VectorKernelIsTheRankOrderLoop) {
  for (const std::int64_t count : {8, 1000, 4096, 4104}) {
    Case c;
    c.count = count;
    every_combination(c);
  }
}

// fp32 pieces take 4-element vectors: a length that is a multiple of 4 but not of 8.
TEST(PieceSumGpu, Fp32VectorsOfFour) {
  for (DType out : kDtypes)
    for (int n : {1, 2, 3, 5, 8}) {
      Case c;
      c.in = DType::f32;
      c.out = out;
      c.n = n;
      c.count = 1004;
      c.average = true;
      expect_oracle(c);
      c.accumulate = true;
      expect_oracle(c);
      c.count = (std::int64_t{3} << 20) + 7;  // the fallback's loop
      expect_oracle(c);
    }
}

// The fallback: an odd length, and lengths the vector kernel could take but bases it
// cannot (the pieces, or the output, one element past a 16-byte boundary).
TEST(PieceSumGpu, FallbackIsTheRankOrderLoop) {
  Case odd;
  odd.count = 1031;
  every_combination(odd);
  for (DType in : kDtypes) {
    for (DType out : kDtypes) {
      for (int n : {1, 2, 3, 8}) {
        Case c;
        c.in = in;
        c.out = out;
        c.n = n;
        c.count = 1024;
        c.average = n % 2 == 1;
        c.accumulate = n > 2;
        c.pieces_skew = width(in);
        expect_oracle(c);
        c.pieces_skew = 0;
        c.out_skew = width(out);
        expect_oracle(c);
      }
    }
  }
}

// The own piece read where it lies (its slot of the received pieces holds NaNs): into a
// separate output, and in place (the output is the own piece: each thread reads all of
// its elements' pieces before it writes them), on both kernels (an aligned multiple of 8,
// an odd length, a misaligned own piece), at the first, a middle and the last index.
TEST(PieceSumGpu, OwnPieceInPlaceAndApart) {
  for (const std::int64_t count : {4104, 1031})
    for (DType in : kDtypes)
      for (int n : {1, 2, 3, 8})
        for (const int own : {0, n / 2, n - 1})
          for (const bool in_place : {true, false})
            for (const bool accumulate : {false, true}) {
              Case c;
              c.in = in;
              c.out = in_place ? in : DType::f32;
              c.n = n;
              c.count = count;
              c.average = true;
              c.accumulate = accumulate;
              c.own = own;
              c.in_place = in_place;
              expect_oracle(c);
              if (in_place && count % 8 == 0) {
                c.out_skew = width(in);  // the own piece (= the output) misaligned: the fallback
                expect_oracle(c);
              }
            }
}

// Lengths of many resident waves (every thread loops), with and without share_sms (fewer
// blocks, more steps each): the store's shape (bf16 in place, bf16 out) and the
// benchmark's (bf16 pieces, fp32 out), 2 and 3 pieces, with a tail of one vector; and an
// odd length of as many elements (the fallback's loop).
TEST(PieceSumGpu, ManyWavesAndShareSms) {
  for (const bool share : {false, true})
    for (int n : {2, 3}) {
      Case c;
      c.n = n;
      c.count = (std::int64_t{3} << 20) + 8;
      c.average = true;
      c.share_sms = share;
      c.own = n - 1;
      c.out = DType::f32;
      expect_oracle(c);
      c.in_place = true;
      c.own = 0;
      expect_oracle(c);
      c.in_place = false;
      c.own = -1;
      c.in = DType::f16;
      c.out = DType::bf16;
      c.accumulate = true;
      expect_oracle(c);
      c.count = (std::int64_t{3} << 20) + 7;  // the fallback's loop
      expect_oracle(c);
    }
}

}  // namespace
