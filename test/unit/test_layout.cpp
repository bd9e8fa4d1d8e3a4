// Layout properties over many random parameter sets and world sizes 1..16, plus the
// clear errors for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "shardopt/error.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/presets.hpp"

namespace {
using namespace shardopt;

std::vector<ParamSpec> random_specs(std::mt19937& rng, int n) {
  std::vector<ParamSpec> specs;
  const DType dtypes[] = {DType::bf16, DType::bf16, DType::f32, DType::f16};
  for (int i = 0; i < n; ++i) {
    // Appended rather than "p" + to_string(i): g++ 12 warns falsely (-Wrestrict) on that form.
    std::string name = "p";
    name += std::to_string(i);
    const DType dt = dtypes[rng() % 4];
    const std::string group = (rng() % 3 == 0) ? "no_decay" : "decay";
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {
      specs.push_back(ParamSpec::tensor(name, {1 + static_cast<std::int64_t>(rng() % 300)}, dt, group));
    } else if (kind == 1) {
      const int g = 2 + static_cast<int>(rng() % 5);
      specs.push_back(ParamSpec::grouped(name, g, {1 + static_cast<std::int64_t>(rng() % 40),
                                                   1 + static_cast<std::int64_t>(rng() % 70)},
                                         dt, group));
    } else {
      specs.push_back(ParamSpec::tensor(
          name, {1 + static_cast<std::int64_t>(rng() % 200), 1 + static_cast<std::int64_t>(rng() % 150)}, dt, group));
    }
  }
  return specs;
}

// Checks every property of contract 1 on one layout.
void check_layout(const Layout& L) {
  const int W = L.world_size();
  const auto& specs = L.specs();
  // Params: aligned, placed in their buffer, in reverse registration order per buffer.
  for (std::size_t bi = 0; bi < L.buffers().size(); ++bi) {
    const auto& buf = L.buffers()[bi];
    ASSERT_TRUE(std::is_sorted(buf.params.rbegin(), buf.params.rend())) << "reverse registration order";
    std::int64_t prev_end = 0;
    for (int p : buf.params) {
      const auto& pl = L.params()[static_cast<std::size_t>(p)];
      EXPECT_EQ(pl.buffer, static_cast<int>(bi));
      EXPECT_EQ(specs[static_cast<std::size_t>(p)].dtype, buf.dtype);
      EXPECT_EQ(pl.offset % L.alignment(), 0) << "param start aligned";
      EXPECT_GE(pl.offset, prev_end) << "params do not overlap";
      prev_end = pl.offset + pl.numel;
      EXPECT_EQ(pl.numel, numel(specs[static_cast<std::size_t>(p)].shape));
      // Never split across buckets.
      const auto& bk = L.buckets()[static_cast<std::size_t>(pl.bucket)];
      EXPECT_GE(pl.offset, bk.range.begin);
      EXPECT_LE(pl.offset + pl.numel, bk.range.end);
      // Grouped members contiguous, inside the param.
      EXPECT_EQ(pl.members * pl.member_numel, pl.numel);
      for (int m = 0; m < pl.members; ++m)
        EXPECT_EQ(pl.member_offset(m), pl.offset + m * pl.member_numel);
    }
    // Buckets tile the buffer, each divisible by the world size and padded within bound.
    std::int64_t cursor = 0, shard_cursor = 0;
    for (int b : buf.buckets) {
      const auto& bk = L.buckets()[static_cast<std::size_t>(b)];
      EXPECT_EQ(bk.range.begin, cursor);
      EXPECT_EQ(bk.range.size() % W, 0);
      EXPECT_EQ(bk.range.size() % L.pad_multiple(), 0);
      EXPECT_EQ(bk.shard_offset, shard_cursor);
      cursor = bk.range.end;
      shard_cursor += bk.range.size() / W;
      // Padding bound: tail < pad multiple, plus < alignment per param gap.
      const std::int64_t pad = bk.range.size() - bk.real_numel;
      EXPECT_GE(pad, 0);
      EXPECT_LT(pad, L.pad_multiple() + static_cast<std::int64_t>(bk.params.size()) * L.alignment());
      // Threshold: only a single param may take a bucket past it.
      std::int64_t first = L.params()[static_cast<std::size_t>(bk.params.front())].offset;
      std::int64_t last_end = 0;
      for (int p : bk.params) last_end = L.params()[static_cast<std::size_t>(p)].offset + L.params()[static_cast<std::size_t>(p)].numel;
      if (bk.params.size() > 1) {
        EXPECT_LE(last_end - bk.range.begin, L.bucket_threshold());
      }
      (void)first;
    }
    EXPECT_EQ(cursor, buf.numel);
    EXPECT_EQ(shard_cursor, buf.shard_numel);
    EXPECT_EQ(buf.shard_numel * W, buf.numel) << "equal shard sizes";
  }
  // Ownership: every real element owned by exactly one rank, through the segments.
  for (std::size_t bi = 0; bi < L.buffers().size(); ++bi) {
    std::vector<int> owner_count(static_cast<std::size_t>(L.buffers()[bi].numel), 0);
    for (int r = 0; r < W; ++r) {
      std::int64_t prev = -1;
      for (const auto& s : L.segments(static_cast<int>(bi), r)) {
        EXPECT_GT(s.shard_offset, prev) << "segments ordered";
        prev = s.shard_offset;
        EXPECT_GT(s.length, 0);
        EXPECT_LE(s.shard_offset + s.length, L.buffers()[bi].shard_numel);
        const auto& pl = L.params()[static_cast<std::size_t>(s.param)];
        EXPECT_EQ(s.group, pl.group);
        EXPECT_LE(s.param_offset + s.length, pl.numel);
        // The segment's shard position maps back to the same buffer element.
        int bucket = -1;
        for (int b : L.buffers()[bi].buckets) {
          const auto& bk = L.buckets()[static_cast<std::size_t>(b)];
          if (s.shard_offset >= bk.shard_offset && s.shard_offset < bk.shard_offset + bk.range.size() / W) bucket = b;
        }
        ASSERT_GE(bucket, 0);
        const auto& bk = L.buckets()[static_cast<std::size_t>(bucket)];
        const std::int64_t buf_off = L.shard_range(bucket, r).begin + (s.shard_offset - bk.shard_offset);
        EXPECT_EQ(buf_off, pl.offset + s.param_offset);
        for (std::int64_t e = 0; e < s.length; ++e) owner_count[static_cast<std::size_t>(buf_off + e)]++;
      }
    }
    for (int p : L.buffers()[bi].params) {
      const auto& pl = L.params()[static_cast<std::size_t>(p)];
      for (std::int64_t e = 0; e < pl.numel; ++e) ASSERT_EQ(owner_count[static_cast<std::size_t>(pl.offset + e)], 1);
    }
    std::int64_t owned = std::accumulate(owner_count.begin(), owner_count.end(), std::int64_t{0});
    std::int64_t real = 0;
    for (int p : L.buffers()[bi].params) real += L.params()[static_cast<std::size_t>(p)].numel;
    EXPECT_EQ(owned, real) << "padding is owned by no segment";
  }
}

TEST(Layout, RandomParameterSetsAllWorldSizes) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 60; ++trial) {
    auto specs = random_specs(rng, 1 + static_cast<int>(rng() % 25));
    for (int W = 1; W <= 16; ++W) {
      LayoutOptions opt;
      opt.bucket_numel = 1 + static_cast<std::int64_t>(rng() % 30000);
      if (trial % 3 == 0) opt.alignment = 1 + static_cast<std::int64_t>(rng() % 100);
      Layout L(specs, W, opt);
      SCOPED_TRACE("trial " + std::to_string(trial) + " world " + std::to_string(W));
      check_layout(L);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Layout, DeterministicAndFingerprinted) {
  std::mt19937 rng(5);
  auto specs = random_specs(rng, 30);
  LayoutOptions opt;
  opt.bucket_numel = 5000;
  Layout a(specs, 4, opt), b(specs, 4, opt);
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  ASSERT_EQ(a.buckets().size(), b.buckets().size());
  for (std::size_t i = 0; i < a.params().size(); ++i) {
    EXPECT_EQ(a.params()[i].offset, b.params()[i].offset);
    EXPECT_EQ(a.param_hash(static_cast<int>(i)), b.param_hash(static_cast<int>(i)));
  }
  // Any change of a spec, the options or the world size changes the fingerprint.
  Layout w(specs, 8, opt);
  EXPECT_NE(a.fingerprint(), w.fingerprint());
  LayoutOptions opt2 = opt;
  opt2.bucket_numel = 5001;
  EXPECT_NE(a.fingerprint(), Layout(specs, 4, opt2).fingerprint());
  auto changed = specs;
  int plain = 0;
  while (!changed[static_cast<std::size_t>(plain)].member_shapes.empty()) ++plain;
  changed[static_cast<std::size_t>(plain)].shape.back() += 1;
  Layout c(changed, 4, opt);
  EXPECT_NE(a.fingerprint(), c.fingerprint());
  EXPECT_NE(a.param_hash(plain), c.param_hash(plain));
  EXPECT_EQ(a.param_hash(plain + 1), c.param_hash(plain + 1));
  changed = specs;
  changed[3].group = changed[3].group == "decay" ? "no_decay" : "decay";
  EXPECT_NE(a.fingerprint(), Layout(changed, 4, opt).fingerprint());
}

TEST(Layout, ReverseOrderBucketsAndDefaults) {
  std::vector<ParamSpec> specs = {
      ParamSpec::tensor("a", {100}), ParamSpec::tensor("b", {300}), ParamSpec::tensor("c", {50}),
  };
  LayoutOptions opt;
  opt.bucket_numel = 400;
  Layout L(specs, 2, opt);
  ASSERT_EQ(L.buffers().size(), 1u);
  EXPECT_EQ(L.buffers()[0].params, (std::vector<int>{2, 1, 0}));
  // c at 0 (50), b at 64 (ends 364), a would end at 384+100=484 > 400: new bucket.
  EXPECT_EQ(L.params()[2].offset, 0);
  EXPECT_EQ(L.params()[1].offset, 64);
  ASSERT_EQ(L.buckets().size(), 2u);
  EXPECT_EQ(L.pad_multiple(), 128);
  EXPECT_EQ(L.buckets()[0].range, (Range{0, 384}));
  EXPECT_EQ(L.params()[0].offset, 384);
  EXPECT_EQ(L.buckets()[1].range, (Range{384, 512}));
  EXPECT_EQ(L.shard_range(0, 1), (Range{192, 384}));
  EXPECT_EQ(L.padding_numel(), 512 - 450);
  // Defaults.
  EXPECT_EQ(default_bucket_numel(1), 40'000'000);
  EXPECT_EQ(default_bucket_numel(64), 64'000'000);
  EXPECT_EQ(Layout(specs, 3).pad_multiple(), 384);
  EXPECT_EQ(Layout(specs, 3).bucket_threshold(), 40'000'000);
}

TEST(Layout, BuffersPerDtype) {
  std::vector<ParamSpec> specs = {ParamSpec::tensor("w", {64, 64}, DType::bf16),
                                  ParamSpec::tensor("n", {64}, DType::f32, "no_decay"),
                                  ParamSpec::tensor("v", {10, 10}, DType::bf16)};
  Layout L(specs, 4);
  ASSERT_EQ(L.buffers().size(), 2u);
  EXPECT_EQ(L.buffers()[0].dtype, DType::bf16);  // the last registered param's dtype comes first
  EXPECT_EQ(L.buffers()[0].params, (std::vector<int>{2, 0}));
  EXPECT_EQ(L.buffers()[1].params, (std::vector<int>{1}));
  EXPECT_EQ(L.groups(), (std::vector<std::string>{"decay", "no_decay"}));
  EXPECT_EQ(L.params()[1].group, 1);
  EXPECT_EQ(L.param_index("v"), 2);
  try {
    (void)L.param_index("nope");
    ADD_FAILURE() << "an unknown parameter name must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::OutOfRange) << e.what();
  }
  try {
    (void)L.group_index("nope");
    ADD_FAILURE() << "an unknown group name must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::OutOfRange) << e.what();
  }
}

TEST(Layout, Llama1BShapes) {
  auto specs = presets::transformer(presets::kLlama32_1B);
  EXPECT_EQ(specs.size(), 147u);
  std::int64_t total = 0;
  for (const auto& s : specs) total += numel(s.shape);
  EXPECT_EQ(total, 1'498'482'688);
  for (int W : {1, 2, 4, 8}) {
    Layout L(specs, W);
    EXPECT_EQ(L.param_numel(), total);
    EXPECT_LT(static_cast<double>(L.padding_numel()) / static_cast<double>(L.total_numel()), 1e-3);
  }
}

// ---------------------------------------------------------------- bad input

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::Internal;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LayoutErrors, BadInputIsAClearError) {
  const auto ok = std::vector<ParamSpec>{ParamSpec::tensor("w", {4, 4})};
  EXPECT_EQ(code_of([] { Layout({}, 2); }), ErrorCode::InvalidArgument);
  EXPECT_NE(message_of([] { Layout({}, 2); }).find("empty"), std::string::npos);
  EXPECT_EQ(code_of([&] { Layout(ok, 0); }), ErrorCode::InvalidArgument);
  EXPECT_EQ(code_of([&] { Layout(ok, -3); }), ErrorCode::InvalidArgument);
  EXPECT_NE(message_of([&] { Layout(ok, 0); }).find("world size"), std::string::npos);
  LayoutOptions zero_bucket;
  zero_bucket.bucket_numel = 0;
  EXPECT_EQ(code_of([&] { Layout(ok, 2, zero_bucket); }), ErrorCode::InvalidArgument);
  EXPECT_NE(message_of([&] { Layout(ok, 2, zero_bucket); }).find("bucket size"), std::string::npos);
  LayoutOptions bad_pad;
  bad_pad.pad_multiple = 100;
  EXPECT_EQ(code_of([&] { Layout(ok, 3, bad_pad); }), ErrorCode::InvalidArgument);
  LayoutOptions bad_align;
  bad_align.alignment = 0;
  EXPECT_EQ(code_of([&] { Layout(ok, 1, bad_align); }), ErrorCode::InvalidArgument);

  // Zero or negative dimensions, named.
  const std::string m0 = message_of([] { Layout({ParamSpec::tensor("layer.w", {4, 0})}, 1); });
  EXPECT_NE(m0.find("layer.w"), std::string::npos);
  EXPECT_NE(m0.find("dimension 1"), std::string::npos);
  EXPECT_EQ(code_of([] { Layout({ParamSpec::tensor("w", {-2})}, 1); }), ErrorCode::InvalidArgument);
  EXPECT_EQ(code_of([] { Layout({ParamSpec::tensor("w", {})}, 1); }), ErrorCode::InvalidArgument);
  // Duplicate names.
  const std::string md = message_of([] { Layout({ParamSpec::tensor("w", {4}), ParamSpec::tensor("w", {8})}, 1); });
  EXPECT_NE(md.find("'w' is used twice"), std::string::npos);
  // Empty name, empty group, fp8 parameter dtype.
  EXPECT_EQ(code_of([] { Layout({ParamSpec::tensor("", {4})}, 1); }), ErrorCode::InvalidArgument);
  EXPECT_EQ(code_of([] { Layout({ParamSpec::tensor("w", {4}, DType::bf16, "")}, 1); }), ErrorCode::InvalidArgument);
  EXPECT_EQ(code_of([] { Layout({ParamSpec::tensor("w", {4}, DType::e4m3)}, 1); }), ErrorCode::InvalidArgument);
  // Grouped members of unequal shape.
  ParamSpec g = ParamSpec::grouped("experts", 3, {8, 16});
  g.member_shapes[2] = {8, 32};
  const std::string mg = message_of([&] { Layout({g}, 2); });
  EXPECT_NE(mg.find("member 2"), std::string::npos);
  EXPECT_EQ(code_of([&] { Layout({g}, 2); }), ErrorCode::InvalidArgument);
  ParamSpec g2 = ParamSpec::grouped("experts", 3, {8, 16});
  g2.shape = {3, 8, 17};
  EXPECT_EQ(code_of([&] { Layout({g2}, 2); }), ErrorCode::InvalidArgument);
  EXPECT_EQ(code_of([] { ParamSpec::grouped("e", 0, {4}); }), ErrorCode::InvalidArgument);
  // Out-of-range queries.
  Layout L(ok, 2);
  EXPECT_EQ(code_of([&] { L.shard_range(5, 0); }), ErrorCode::OutOfRange);
  EXPECT_EQ(code_of([&] { L.shard_range(0, 2); }), ErrorCode::OutOfRange);
  EXPECT_EQ(code_of([&] { L.segments(1, 0); }), ErrorCode::OutOfRange);
}

TEST(LayoutErrors, GroupedSpecNormalised) {
  ParamSpec g;
  g.name = "experts";
  g.member_shapes = {{4, 8}, {4, 8}};
  Layout L({g}, 1);
  EXPECT_EQ(L.specs()[0].shape, (Shape{2, 4, 8}));
  EXPECT_EQ(L.params()[0].members, 2);
  EXPECT_EQ(L.params()[0].member_numel, 32);
}

}  // namespace

namespace {
using namespace shardopt;

TEST(LayoutUnits, BucketsNeverSpanUnits) {
  std::vector<ParamSpec> specs;
  std::vector<int> units;
  for (int l = 0; l < 5; ++l)
    for (int k = 0; k < 3; ++k) {
      std::string name = "l";  // appended: see random_specs
      name += std::to_string(l) + "." + std::to_string(k);
      specs.push_back(ParamSpec::tensor(name, {10 + l, 7 + k}));
      units.push_back(l);
    }
  LayoutOptions o;
  o.param_units = units;
  o.bucket_numel = 150;  // also split inside a unit
  Layout L(specs, 3, o);
  ASSERT_EQ(L.bucket_units().size(), L.buckets().size());
  for (std::size_t b = 0; b < L.buckets().size(); ++b)
    for (int p : L.buckets()[b].params) EXPECT_EQ(units[static_cast<std::size_t>(p)], L.bucket_units()[b]);
  // Units appear in backward order and each unit's buckets are adjacent.
  std::vector<int> seen;
  for (int u : L.bucket_units())
    if (seen.empty() || seen.back() != u) seen.push_back(u);
  EXPECT_EQ(seen, (std::vector<int>{4, 3, 2, 1, 0}));
  // Units change the fingerprint; non-contiguous units and wrong sizes are errors.
  EXPECT_NE(L.fingerprint(), Layout(specs, 3, LayoutOptions{o.bucket_numel, 64, {}, {}, {}}).fingerprint());
  LayoutOptions bad = o;
  bad.param_units[4] = 0;  // [0,0,0,1,0,1,...]: unit 0 split
  EXPECT_THROW(Layout(specs, 3, bad), Error);
  bad.param_units = {0, 1};
  EXPECT_THROW(Layout(specs, 3, bad), Error);
}
}  // namespace
