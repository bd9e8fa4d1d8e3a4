// The checkpoint file layer: JSON values, CRC-32C, the safetensors writer and reader,
// and atomic whole-file writes. Every malformed file must be a clear Error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/crc32c.hpp"
#include "formats/file_io.hpp"
#include "formats/json.hpp"
#include "formats/safetensors.hpp"
#include "shardopt/error.hpp"

namespace {
using namespace shardopt;
namespace fs = std::filesystem;

// Runs `f`, expects Error(code) whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, ErrorCode code, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << *parts.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

// ------------------------------------------------------------------ JSON

TEST(Json, RoundTripsEveryKind) {
  json::Value v = json::Value::object();
  v["null"] = nullptr;
  v["t"] = true;
  v["f"] = false;
  v["int"] = 42;
  v["neg"] = -7;
  v["big"] = std::int64_t{9007199254740993};  // 2^53 + 1: not a double
  v["min"] = std::numeric_limits<std::int64_t>::min();
  v["max"] = std::numeric_limits<std::int64_t>::max();
  v["dbl"] = 0.1;
  v["str"] = "a \"quoted\" \\ / \b\f\n\r\t \x01\x1f\x7f é 名 😀";
  json::Value arr = json::Value::array();
  arr.push_back(1);
  arr.push_back("two");
  arr.push_back(json::Value::array());
  arr.push_back(json::Value::object());
  v["arr"] = arr;
  v["z_last"] = 1;
  v["a_after_z"] = 2;  // insertion order, not sorted
  for (const int indent : {-1, 0, 2}) {
    const std::string text = json::write(v, indent);
    const json::Value back = json::parse(text);
    EXPECT_EQ(back, v) << text;
    EXPECT_EQ(json::write(back, indent), text) << "writing is deterministic";
  }
  const std::string compact = json::write(v);
  EXPECT_LT(compact.find("\"z_last\""), compact.find("\"a_after_z\""));
  EXPECT_NE(compact.find("\\u0001"), std::string::npos);
  EXPECT_NE(compact.find("\\u007f"), std::string::npos);
  EXPECT_EQ(json::as_int(json::parse(compact).at("big")), 9007199254740993);
  EXPECT_EQ(json::write(json::parse("[1,2]"), 2), "[\n  1,\n  2\n]");
}

TEST(Json, NumbersRoundTripExactly) {
  std::mt19937_64 rng(7);
  std::vector<double> values = {0.1, 1.0 / 3.0, -2.5, 1e-300, 5e-324, 1.7976931348623157e308,
                                3e-4, 1e8, 1e20, 123456789.123456789, -0.0};
  for (int i = 0; i < 2000; ++i) {
    std::uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    if (std::isfinite(d)) values.push_back(d);
  }
  for (const double d : values) {
    const json::Value back = json::parse(json::write(json::Value(d)));
    ASSERT_TRUE(back.is_number());
    const double r = json::as_double(back);
    EXPECT_EQ(std::memcmp(&r, &d, sizeof d), 0) << json::write(json::Value(d));
  }
  EXPECT_TRUE(json::is_integer(json::Value(3.0)));
  EXPECT_EQ(json::write(json::Value(3.0)), "3");
  EXPECT_EQ(json::write(json::Value(-0.0)), "-0");
  EXPECT_FALSE(json::is_integer(json::Value(0.5)));
  EXPECT_TRUE(json::is_integer(json::parse("1e3")));
  EXPECT_EQ(json::as_int(json::parse("1e3")), 1000);
  EXPECT_EQ(json::as_int(json::parse("-9223372036854775808")), std::numeric_limits<std::int64_t>::min());
  const json::Value huge = json::parse("18446744073709551615");  // beyond int64: a double
  EXPECT_FALSE(json::is_integer(huge));
  EXPECT_DOUBLE_EQ(json::as_double(huge), 18446744073709551615.0);
  EXPECT_FALSE(json::is_integer(json::Value(std::numeric_limits<std::uint64_t>::max())));
  EXPECT_EQ(json::as_double(json::parse("1e-400")), 0.0);  // underflow is harmless
  expect_error([] { json::write(json::Value(std::nan(""))); }, ErrorCode::InvalidArgument, {"NaN"});
  expect_error([] { json::write(json::Value(INFINITY)); }, ErrorCode::InvalidArgument, {"infinite"});
}

TEST(Json, StringsAndEscapes) {
  EXPECT_EQ(json::as_string(json::parse(R"("\u00e9\u540d")")), "é名");
  EXPECT_EQ(json::as_string(json::parse(R"("\ud83d\ude00")")), "\xF0\x9F\x98\x80");
  EXPECT_EQ(json::as_string(json::parse(R"("\"\\\/\b\f\n\r\t")")), "\"\\/\b\f\n\r\t");
  EXPECT_EQ(json::as_string(json::parse("\"raw é 😀\"")), "raw é 😀");
  EXPECT_EQ(json::parse(" \t\r\n{ \"a\" : [ ] } \n").at("a").size(), 0u);
  std::string out;
  expect_error([&] { json::write_string(out, "bad \xff byte"); }, ErrorCode::InvalidArgument, {"UTF-8", "offset 4"});
  EXPECT_TRUE(json::is_valid_utf8("é名😀"));
  EXPECT_FALSE(json::is_valid_utf8("\xed\xa0\x80"));
}

TEST(Json, AccessorsNameTheTypes) {
  const json::Value v = json::parse(R"({"a": "x", "n": 1.5})");
  expect_error([&] { (void)json::as_int(v.at("a")); }, ErrorCode::InvalidArgument, {"a string", "expected a number"});
  expect_error([&] { (void)json::as_int(v.at("n")); }, ErrorCode::InvalidArgument, {"not an integer"});
  expect_error([&] { (void)json::at(v, "missing"); }, ErrorCode::InvalidArgument, {"no member \"missing\""});
  EXPECT_EQ(json::find(v, "missing"), nullptr);
  json::Value o;
  o["k"] = 1;
  o["k"] = 2;
  EXPECT_EQ(o.size(), 1u);
  EXPECT_EQ(json::as_int(o.at("k")), 2);
}

TEST(Json, RejectsMalformedText) {
  struct Case {
    std::string text;
    std::string what;
  };
  const std::vector<Case> cases = {
      {"", "byte 0: unexpected end"},
      {"   ", "byte 3: unexpected end"},
      {"[1,]", "byte 3"},
      {"[1 2]", "expected ',' or ']'"},
      {"{\"a\":1,}", "expected a string key"},
      {"{1:2}", "expected a string key"},
      {"{\"a\" 1}", "expected ':'"},
      {"{\"a\":1,\"a\":2}", "byte 7: duplicate object key \"a\""},
      {"[1] x", "byte 4: unexpected trailing"},
      {"{} {}", "trailing"},
      {"01", "leading zero"},
      {"-01", "leading zero"},
      {"1.", "digit after '.'"},
      {".5", "unexpected character '.'"},
      {"-", "expected a digit"},
      {"1e", "exponent"},
      {"1e+", "exponent"},
      {"+1", "unexpected character '+'"},
      {"NaN", "unexpected character 'N'"},
      {"Infinity", "unexpected character 'I'"},
      {"-Infinity", "expected a digit"},
      {"1e400", "double range"},
      {"tru", "expected a JSON value"},
      {"nul", "expected a JSON value"},
      {"\"abc", "unterminated string"},
      {"\"a\\x\"", "invalid escape"},
      {"\"\\u12x4\"", "bad hex digit"},
      {"\"\\u12", "truncated \\u escape"},
      {"\"\\ud800\"", "high surrogate"},
      {"\"\\ud800\\u0041\"", "low surrogate"},
      {"\"\\udc00\"", "lone low surrogate"},
      {"\"a\x01\"", "byte 2: unescaped control character"},
      {"\"a\nb\"", "unescaped control character"},
      {"\"\xff\"", "byte 1: invalid UTF-8"},
      {"\"\xc0\xaf\"", "invalid UTF-8"},          // overlong '/'
      {"\"\xe0\x80\xaf\"", "invalid UTF-8"},      // overlong 3-byte
      {"\"\xed\xa0\x80\"", "invalid UTF-8"},      // an encoded surrogate
      {"\"\xf4\x90\x80\x80\"", "invalid UTF-8"},  // above U+10FFFF
      {"\"\xe4\xb8\"", "invalid UTF-8"},          // cut short
      {"\xef\xbb\xbf{}", "unexpected character"},  // BOM
      {"[\x0c]", "unexpected character"},        // form feed is not JSON whitespace
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    expect_error([&] { json::parse(c.text); }, ErrorCode::InvalidArgument, {"invalid JSON at byte", c.what});
  }
}

TEST(Json, DepthLimit) {
  const auto nested = [](int depth) { return std::string(static_cast<std::size_t>(depth), '[') + std::string(static_cast<std::size_t>(depth), ']'); };
  EXPECT_NO_THROW(json::parse(nested(json::kMaxDepth)));
  expect_error([&] { json::parse(nested(json::kMaxDepth + 1)); }, ErrorCode::InvalidArgument, {"byte 64", "nesting deeper than 64"});
  expect_error([&] { json::parse(std::string(100000, '[')); }, ErrorCode::InvalidArgument, {"nesting"});
  std::string objects;
  for (int i = 0; i <= json::kMaxDepth; ++i) objects += "{\"a\":";
  expect_error([&] { json::parse(objects); }, ErrorCode::InvalidArgument, {"nesting"});
}

// ------------------------------------------------------------------ CRC-32C

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_update_portable(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720 (iSCSI) B.4.
  std::vector<unsigned char> b(32, 0);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x8A9136AAu);
  std::fill(b.begin(), b.end(), 0xFF);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) b[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c_update_portable(0, b.data(), b.size()), 0x46DD794Eu);
}

TEST(Crc32c, ChunkedEqualsOneShotAndPathsAgree) {
  std::mt19937 rng(3);
  std::vector<unsigned char> data(100003);
  for (auto& x : data) x = static_cast<unsigned char>(rng());
  const std::uint32_t whole = crc32c(data.data(), data.size());
  EXPECT_EQ(crc32c_update_portable(0, data.data(), data.size()), whole);
  for (const std::size_t chunk : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{64}, std::size_t{4097}}) {
    std::uint32_t c = 0;
    std::uint32_t p = 0;
    for (std::size_t at = 0; at < data.size(); at += chunk) {
      const std::size_t n = std::min(chunk, data.size() - at);
      c = crc32c_update(c, data.data() + at, n);
      p = crc32c_update_portable(p, data.data() + at, n);
    }
    EXPECT_EQ(c, whole) << chunk;
    EXPECT_EQ(p, whole) << chunk;
  }
  // Every alignment and short length of both paths.
  for (std::size_t off = 0; off < 16; ++off)
    for (std::size_t n = 0; n < 40; ++n)
      ASSERT_EQ(crc32c_update(5, data.data() + off, n), crc32c_update_portable(5, data.data() + off, n));
}

TEST(Crc32c, Throughput) {
  std::vector<unsigned char> data(std::size_t{64} << 20, 0x5A);
  const auto gbps = [&](auto fn) {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      volatile std::uint32_t sink = fn(0u, data.data(), data.size());
      (void)sink;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, static_cast<double>(data.size()) / s / 1e9);
    }
    return best;
  };
  const double hw = gbps(crc32c_update);
  const double table = gbps(crc32c_update_portable);
  std::printf("crc32c over 64 MiB, best of 3: crc32c_update %.2f GB/s (%s), slicing-by-8 table %.2f GB/s\n", hw,
              crc32c_hardware() ? "SSE4.2" : "table", table);
  EXPECT_GT(table, 0.0);
}

// ------------------------------------------------------------------ safetensors

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "shardopt-st-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string slurp(const std::string& p) { return read_file(p); }
  static void spit(const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // A file with this exact header text (padded to 8) and data.
  static void make_file(const std::string& p, std::string header, const std::string& data,
                        std::uint64_t length_override = 0) {
    header.append((8 - header.size() % 8) % 8, ' ');
    std::uint64_t n = length_override ? length_override : header.size();
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
    spit(p, bytes + header + data);
  }

  fs::path dir_;
};

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST_F(Safetensors, RoundTripOfSeveralDtypesWithChunkedWrites) {
  std::vector<float> f32(12);
  for (std::size_t i = 0; i < f32.size(); ++i) f32[i] = 0.5f * static_cast<float>(i);
  std::vector<std::uint16_t> bf16 = {0x3F80, 0x4000, 0xC040, 0x0000, 0x7F80};
  std::vector<std::uint16_t> f16 = {0x3C00, 0x4000, 0x4200, 0x4400, 0x4500, 0x0000};
  std::vector<std::uint8_t> big(3'000'017);  // larger than the writer's buffer
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>(i * 31 + 7);
  std::vector<std::int64_t> i64 = {-1, std::int64_t{1} << 40, 9007199254740993};
  std::vector<double> f64 = {3.25};

  const std::string p = path("rt.safetensors");
  std::uint32_t crc = 0;
  {
    SafetensorsWriter w(p);
    EXPECT_TRUE(fs::exists(w.temp_path()));
    EXPECT_NE(w.temp_path().find(".tmp-" + std::to_string(::getpid())), std::string::npos);
    w.add_tensor("w/f32", "F32", {3, 4});
    w.add_tensor("w/bf16", "BF16", {5});
    w.add_tensor("empty", "F32", {2, 0});
    w.add_tensor("w/f16", "F16", {2, 3});
    w.add_tensor("big/u8", "U8", {big.size()});
    w.add_tensor("i64", "I64", {3});
    w.add_tensor("scalar", "F64", {});
    w.set_metadata("format", "shardopt-checkpoint");
    w.set_metadata("rank", "0");
    w.set_metadata("rank", "1");  // replaces
    EXPECT_EQ(w.tensors()[4].bytes(), big.size());
    const std::vector<std::string> datas = {bytes_of(f32), bytes_of(bf16), "", bytes_of(f16), bytes_of(big), bytes_of(i64), bytes_of(f64)};
    std::string all;
    std::size_t chunk = 1;
    for (std::size_t t = 0; t < datas.size(); ++t) {
      if (t == 2) continue;  // empty tensors need no write
      for (std::size_t at = 0; at < datas[t].size(); at += chunk, chunk = chunk * 3 % 2'000'003 + 1) {
        const std::size_t n = std::min(chunk, datas[t].size() - at);
        if (t == 3) w.write("w/f16", datas[t].data() + at, n);
        else w.write(t, datas[t].data() + at, n);
      }
      all += datas[t];
    }
    EXPECT_FALSE(fs::exists(p)) << "nothing at the final name before finish()";
    crc = w.finish();
    EXPECT_EQ(crc, crc32c(all.data(), all.size()));
    EXPECT_FALSE(fs::exists(w.temp_path()));
    EXPECT_EQ(fs::file_size(p), w.file_bytes());
    expect_error([&] { w.finish(); }, ErrorCode::InvalidState, {"after finish()"});
  }

  const SafetensorsReader r(p);
  ASSERT_EQ(r.tensors().size(), 7u);
  EXPECT_EQ(r.data_offset() % 8, 0u);
  EXPECT_TRUE(r.verify_checksum());
  EXPECT_EQ(r.compute_checksum(4096), crc);
  ASSERT_NE(r.find_metadata("format"), nullptr);
  EXPECT_EQ(*r.find_metadata("format"), "shardopt-checkpoint");
  EXPECT_EQ(*r.find_metadata("rank"), "1");
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  EXPECT_EQ(*r.find_metadata("checksum"), std::string("crc32c:") + hex);
  const SafetensorsEntry& e = r.tensor("w/f32");
  EXPECT_EQ(e.dtype, "F32");
  EXPECT_EQ(e.shape, (std::vector<std::uint64_t>{3, 4}));
  EXPECT_EQ(r.tensor("scalar").shape.size(), 0u);
  EXPECT_EQ(r.tensor("empty").bytes(), 0u);

  std::vector<float> f32b(12);
  r.read("w/f32", 0, f32b.data(), 48);
  EXPECT_EQ(f32b, f32);
  float two[2];
  r.read("w/f32", 20, two, 8);  // elements 5, 6
  EXPECT_EQ(two[0], 2.5f);
  EXPECT_EQ(two[1], 3.0f);
  std::vector<std::uint16_t> bf16b(5), f16b(6);
  r.read("w/bf16", 0, bf16b.data(), 10);
  r.read("w/f16", 0, f16b.data(), 12);
  EXPECT_EQ(bf16b, bf16);
  EXPECT_EQ(f16b, f16);
  std::vector<std::uint8_t> bigb(big.size());
  r.read(r.tensor("big/u8"), 0, bigb.data(), bigb.size());
  EXPECT_EQ(bigb, big);
  std::vector<std::int64_t> i64b(3);
  r.read("i64", 0, i64b.data(), 24);
  EXPECT_EQ(i64b, i64);
  double d = 0;
  r.read("scalar", 0, &d, 8);
  EXPECT_EQ(d, 3.25);
  r.read("empty", 0, nullptr, 0);
  expect_error([&] { r.read("w/f32", 40, two, 9); }, ErrorCode::OutOfRange, {"w/f32", "48 bytes"});
  expect_error([&] { r.read("nope", 0, two, 1); }, ErrorCode::InvalidArgument, {"no tensor named \"nope\""});
}

TEST_F(Safetensors, HeaderIsPaddedToAlignTheData) {
  for (std::size_t extra = 0; extra < 16; ++extra) {
    const std::string p = path("align" + std::to_string(extra));
    SafetensorsWriter w(p);
    w.add_tensor(std::string(extra + 1, 'n'), "U8", {3});
    w.set_metadata("k", std::string(extra, 'v'));
    w.write_header();
    EXPECT_EQ(w.data_offset() % 8, 0u);
    w.write(0, "abc", 3);
    w.finish();
    const std::string raw = slurp(p);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[static_cast<std::size_t>(i)]);
    EXPECT_EQ((8 + n) % 8, 0u);
    EXPECT_EQ(8 + n, w.data_offset());
    EXPECT_EQ(raw.substr(8 + n), "abc");
    const std::string header = raw.substr(8, n);
    EXPECT_EQ(header.front(), '{');
    const std::size_t close = header.find_last_of('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "padding is spaces";
    EXPECT_NO_THROW(json::parse(header));
    EXPECT_TRUE(SafetensorsReader(p).verify_checksum());
  }
}

TEST_F(Safetensors, ChecksumIsPatchedInPlace) {
  const std::string p = path("crc.safetensors");
  SafetensorsWriter w(p);
  w.add_tensor("a", "U8", {9});
  w.write_header();
  const std::uint64_t header_end = w.data_offset();
  const std::string before = slurp(w.temp_path());
  EXPECT_NE(before.find("\"checksum\":\"crc32c:00000000\""), std::string::npos) << "fixed-width placeholder";
  w.write(0, "123456789", 9);
  EXPECT_EQ(w.finish(), 0xE3069283u);
  const std::string after = slurp(p);
  EXPECT_EQ(after.size(), header_end + 9);
  EXPECT_NE(after.find("\"checksum\":\"crc32c:e3069283\""), std::string::npos);
  // Only the 8 digits changed.
  const std::size_t digits = before.find("crc32c:00000000") + 7;
  for (std::size_t i = 0; i < before.size(); ++i) {
    if (i < digits || i >= digits + 8) {
      EXPECT_EQ(before[i], after[i]) << "byte " << i;
    }
  }
}

TEST_F(Safetensors, WriterRefusesMisuse) {
  SafetensorsWriter w(path("misuse.safetensors"));
  expect_error([&] { w.add_tensor("x", "F8", {1}); }, ErrorCode::InvalidArgument, {"unknown dtype \"F8\"", "F32"});
  expect_error([&] { w.add_tensor("__metadata__", "F32", {1}); }, ErrorCode::InvalidArgument, {"reserved"});
  expect_error([&] { w.add_tensor("x", "F32", {1ull << 62, 8}); }, ErrorCode::InvalidArgument, {"overflows"});
  expect_error([&] { w.set_metadata("checksum", "x"); }, ErrorCode::InvalidArgument, {"reserved"});
  w.add_tensor("a", "F32", {2});
  w.add_tensor("b", "U8", {3});
  expect_error([&] { w.add_tensor("a", "U8", {1}); }, ErrorCode::InvalidArgument, {"declared twice"});
  expect_error([&] { w.write("c", "x", 1); }, ErrorCode::InvalidArgument, {"\"c\" was not declared"});
  expect_error([&] { w.write(2, "x", 1); }, ErrorCode::OutOfRange, {"index 2"});
  expect_error([&] { w.write("b", "xyz", 3); }, ErrorCode::InvalidState, {"out of order", "\"a\" has 8 bytes still to come"});
  expect_error([&] { w.add_tensor("late", "U8", {1}); }, ErrorCode::InvalidState, {"declare every tensor first"});
  w.write("a", "1234", 4);
  expect_error([&] { w.write("a", "12345", 5); }, ErrorCode::InvalidArgument, {"more than its declared 8 bytes", "4 written, 5 more"});
  expect_error([&] { w.finish(); }, ErrorCode::InvalidState, {"before every tensor", "\"a\" has 4 of its 8"});
  w.write("a", "5678", 4);
  w.write("b", "x", 1);
  expect_error([&] { w.write("a", "1", 1); }, ErrorCode::InvalidState, {"out of order"});
  w.write("b", "yz", 2);
  EXPECT_NO_THROW(w.finish());
  EXPECT_TRUE(SafetensorsReader(w.path()).verify_checksum());
}

TEST_F(Safetensors, AbortedWriterLeavesNoFile) {
  const std::string p = path("aborted.safetensors");
  std::string tmp;
  try {
    SafetensorsWriter w(p);
    tmp = w.temp_path();
    w.add_tensor("a", "U8", {100});
    w.write(0, std::string(50, 'x').data(), 50);
    EXPECT_TRUE(fs::exists(tmp));
    throw std::runtime_error("the save was interrupted");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(p));
  // A previous complete file survives an aborted rewrite.
  write_file_atomic(p, "old");
  {
    SafetensorsWriter w(p);
    w.add_tensor("a", "U8", {1});
  }
  EXPECT_EQ(slurp(p), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1) << "no temp file left";
}

TEST_F(Safetensors, SystemCallFailuresNameThePathAndWhatToDo) {
  const std::string missing = path("no-such-dir/x.safetensors");
  expect_error([&] { SafetensorsWriter w(missing); }, ErrorCode::InvalidState,
               {"open (create)", missing + ".tmp-", "No such file", "directory exists"});
  expect_error([&] { SafetensorsReader r(missing); }, ErrorCode::InvalidState, {"open (read)", missing, "No such file"});
  expect_error([&] { write_file_atomic(missing, "x"); }, ErrorCode::InvalidState, {"open (create)"});
  expect_error([&] { fsync_directory(path("nodir")); }, ErrorCode::InvalidState, {"open (directory)"});
  if (::geteuid() != 0) {  // root ignores permissions
    const std::string ro = path("ro");
    fs::create_directory(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    expect_error([&] { SafetensorsWriter w(ro + "/x.safetensors"); }, ErrorCode::InvalidState, {"Permission denied", "permissions"});
    fs::permissions(ro, fs::perms::owner_all);
  }
}

TEST_F(Safetensors, AtomicSmallFiles) {
  const std::string p = path("index.json");
  write_file_atomic(p, "{\"a\": 1}");
  EXPECT_EQ(slurp(p), "{\"a\": 1}");
  write_file_atomic(p, "{}");
  EXPECT_EQ(slurp(p), "{}");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  expect_error([&] { read_file(p, 1); }, ErrorCode::InvalidArgument, {"2 bytes", "limit of 1"});
  EXPECT_EQ(parent_directory("a/b/c"), "a/b");
  EXPECT_EQ(parent_directory("c"), ".");
  EXPECT_EQ(parent_directory("/c"), "/");
}

class SafetensorsCorrupt : public Safetensors {
 protected:
  // A valid file of two tensors; returns its path.
  std::string good() {
    const std::string p = path("good.safetensors");
    SafetensorsWriter w(p);
    w.add_tensor("a", "F32", {4});
    w.add_tensor("b", "U8", {5});
    w.write(0, "0123456789abcdef", 16);
    w.write(1, "ABCDE", 5);
    w.finish();
    return p;
  }
  void expect_bad(const std::string& p, std::initializer_list<std::string> parts) {
    expect_error([&] { SafetensorsReader r(p); }, ErrorCode::InvalidArgument, parts);
  }
};

TEST_F(SafetensorsCorrupt, TruncatedFile) {
  const std::string p = good();
  const std::uint64_t size = fs::file_size(p);
  fs::resize_file(p, size - 1);
  expect_bad(p, {p, "truncated", std::to_string(size) + " bytes but the file has " + std::to_string(size - 1)});
  fs::resize_file(p, 20);
  expect_bad(p, {"truncated: the header needs"});
  fs::resize_file(p, 5);
  expect_bad(p, {"5 bytes, fewer than the 8-byte header length"});
  fs::resize_file(p, 0);
  expect_bad(p, {"0 bytes"});
}

TEST_F(SafetensorsCorrupt, TrailingBytes) {
  const std::string p = good();
  spit(p, slurp(p) + "xx");
  expect_bad(p, {"2 bytes after the data section"});
}

TEST_F(SafetensorsCorrupt, FlippedDataByteFailsTheChecksum) {
  const std::string p = good();
  std::string raw = slurp(p);
  raw[raw.size() - 3] ^= 0x01;
  spit(p, raw);
  const SafetensorsReader r(p);  // the header is fine
  expect_error([&] { r.verify_checksum(); }, ErrorCode::InvalidArgument, {p, "checksum mismatch", "corrupt"});
}

TEST_F(SafetensorsCorrupt, CorruptHeader) {
  const std::string p = good();
  std::string raw = slurp(p);
  const std::size_t q = raw.find("\"dtype\"");
  raw[q] = 'x';
  spit(p, raw);
  expect_bad(p, {p, "corrupt header", "invalid JSON at byte"});
  raw = slurp(p);
  raw[8] = '[';
  spit(p, raw);
  expect_bad(p, {"does not start with '{'"});
}

TEST_F(SafetensorsCorrupt, OverlongHeaderLength) {
  const std::string p = path("long.safetensors");
  make_file(p, "{}", "", std::uint64_t{1} << 40);
  expect_bad(p, {"header length 1099511627776 exceeds the limit of 100000000"});
  make_file(p, "{}", "", 100'000'000);
  expect_bad(p, {"truncated"});
}

TEST_F(SafetensorsCorrupt, BadTensorEntries) {
  const std::string p = path("bad.safetensors");
  const std::string d12(12, 'x');
  struct Case {
    std::string header;
    std::string data;
    std::string what;
  };
  const std::vector<Case> cases = {
      {R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", d12,
       "tensors \"a\" and \"b\" overlap"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})", d12,
       "bytes [4, 8) of the data section"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", d12, "bytes [0, 4)"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", d12, "shape [2] of F32 does not match its 12 bytes"},
      {R"({"a":{"dtype":"Q7","shape":[12],"data_offsets":[0,12]}})", d12, "unknown dtype \"Q7\""},
      {R"({"a":{"dtype":"U8","shape":[-12],"data_offsets":[0,12]}})", d12, "non-negative integer"},
      {R"({"a":{"dtype":"U8","shape":[12],"data_offsets":[12,0]}})", d12, "0 <= begin <= end"},
      {R"({"a":{"dtype":"U8","shape":[12],"data_offsets":[0]}})", d12, "array of two integers"},
      {R"({"a":{"dtype":"U8","shape":[12]}})", d12, "needs \"dtype\", \"shape\" and \"data_offsets\""},
      {R"({"a":{"dtype":"U8","shape":[12],"data_offsets":[0,12],"x":1}})", d12, "unknown key \"x\""},
      {R"({"a":[1]})", d12, "tensor \"a\": its entry is not an object"},
      {R"({"__metadata__":{"k":1}})", "", "metadata value of \"k\" is not a string"},
      {R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,12]}})", d12, "does not match"},
      {R"({"a":{"dtype":"U8","shape":[12],"data_offsets":[0,12]},"a":{"dtype":"U8","shape":[12],"data_offsets":[0,12]}})", d12,
       "duplicate object key \"a\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    make_file(p, c.header, c.data);
    expect_bad(p, {p, c.what});
  }
  // Valid but written elsewhere: no checksum.
  make_file(p, R"({"a":{"dtype":"U8","shape":[3,4],"data_offsets":[0,12]}})", d12);
  const SafetensorsReader r(p);
  EXPECT_FALSE(r.verify_checksum(false));
  expect_error([&] { r.verify_checksum(); }, ErrorCode::InvalidArgument, {"no \"checksum\" metadata"});
  make_file(p, R"({"__metadata__":{"checksum":"crc32c:XYZ"}})", "");
  expect_error([&] { SafetensorsReader(p).verify_checksum(); }, ErrorCode::InvalidArgument, {"not of the form crc32c:XXXXXXXX"});
}

// ------------------------------------------------------------------ interop with Python

// The file test/python/check_safetensors_interop.py reads back with Python's safetensors.
// Keep the two in step.
void write_interop_file(const std::string& p) {
  SafetensorsWriter w(p);
  std::vector<float> f32(12);
  for (std::size_t i = 0; i < 12; ++i) f32[i] = 0.5f * static_cast<float>(i);  // arange(12) * 0.5, [3, 4]
  std::vector<std::uint16_t> bf16(8);  // arange(8) - 3 in bfloat16
  for (std::size_t i = 0; i < 8; ++i) {
    const float v = static_cast<float>(i) - 3.0f;
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bf16[i] = static_cast<std::uint16_t>(bits >> 16);
  }
  const std::vector<std::uint16_t> f16 = {0x0000, 0x3C00, 0x4000, 0x4200, 0x4400, 0x4500};  // arange(6), [2, 3]
  std::vector<std::uint8_t> u8(256);  // (7 * i + 3) % 256, [16, 16]
  for (std::size_t i = 0; i < 256; ++i) u8[i] = static_cast<std::uint8_t>(7 * i + 3);
  const std::vector<std::int64_t> i64 = {-1, std::int64_t{1} << 40, 9007199254740993};
  const std::vector<double> f64 = {3.25};
  std::vector<float> slice(5);  // 4096 + arange(5)
  for (std::size_t i = 0; i < 5; ++i) slice[i] = 4096.0f + static_cast<float>(i);
  const std::vector<std::uint8_t> uni = {1, 2, 3};

  w.add_tensor("f32", "F32", {3, 4});
  w.add_tensor("bf16", "BF16", {8});
  w.add_tensor("f16", "F16", {2, 3});
  w.add_tensor("u8", "U8", {16, 16});
  w.add_tensor("i64", "I64", {3});
  w.add_tensor("f64_scalar", "F64", {});
  w.add_tensor("f32_empty", "F32", {2, 0});
  w.add_tensor("layers.0.mlp.up/master@4096", "F32", {5});
  w.add_tensor("ünï/名前", "U8", {3});
  w.set_metadata("format", "shardopt-checkpoint");
  w.set_metadata("format_version", "1");
  w.set_metadata("rank", "0");
  w.set_metadata("world_size", "1");
  w.set_metadata("note", "quote \" backslash \\ newline \n é");
  const std::vector<std::string> datas = {bytes_of(f32), bytes_of(bf16), bytes_of(f16), bytes_of(u8), bytes_of(i64),
                                          bytes_of(f64), "", bytes_of(slice), bytes_of(uni)};
  for (std::size_t t = 0; t < datas.size(); ++t)
    for (std::size_t at = 0; at < datas[t].size(); at += 3)
      w.write(t, datas[t].data() + at, std::min<std::size_t>(3, datas[t].size() - at));
  w.finish();
}

TEST_F(Safetensors, InteropFileForPython) {
  const char* out = std::getenv("SHARDOPT_INTEROP_OUT");
  const std::string p = out != nullptr && *out != '\0' ? std::string(out) : path("interop.safetensors");
  write_interop_file(p);
  const SafetensorsReader r(p);
  EXPECT_TRUE(r.verify_checksum());
  EXPECT_EQ(r.tensors().size(), 9u);
  EXPECT_EQ(*r.find_metadata("note"), "quote \" backslash \\ newline \n é");
  std::uint8_t uni[3];
  r.read("ünï/名前", 0, uni, 3);
  EXPECT_EQ(uni[2], 3);
}

}  // namespace
