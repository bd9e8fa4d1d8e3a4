// The JSON parser's promises beyond test_safetensors.cpp's: every error names the exact
// byte of the problem, and nesting beyond kMaxDepth is refused without deep recursion,
// however deep the text goes (the safetensors reader parses untrusted headers).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "../common/error_of.hpp"
#include "formats/json.hpp"

namespace {
using namespace shardopt;

// The message of the Error parse(text) throws ("" when it throws none).
std::string parse_error(const std::string& text) {
  const auto e = test::error_of([&] { (void)json::parse(text); });
  if (!e) return "";
  EXPECT_EQ(e->code(), ErrorCode::InvalidArgument) << e->what();
  return e->what();
}

TEST(JsonErrors, NameTheOffendingByte) {
  struct Case {
    std::string text;
    std::size_t byte;  // counted by hand from the text
    std::string what;
  };
  const std::vector<Case> cases = {
      {"[1,2", 4, "unexpected end of input in an array"},
      {"{\"a\":1", 6, "unexpected end of input in an object"},
      {"{\"a\"", 4, "unexpected end of input in an object"},
      {"[1,]", 3, "unexpected character ']'"},
      {"[1 2]", 3, "expected ',' or ']' in an array"},
      {"{\"a\":1 \"b\":2}", 7, "expected ',' or '}' in an object"},
      {"{\"a\" 1}", 5, "expected ':' after an object key"},
      {"{ 1:2}", 2, "expected a string key in an object"},
      {"  [true] x", 9, "unexpected trailing characters"},
      {"[0, 012]", 4, "leading zero"},
      {"[-012]", 1, "leading zero"},
      {"[1.]", 3, "expected a digit after '.'"},
      {"[1e+]", 4, "expected a digit in the exponent"},
      {"[-x]", 2, "bad number: expected a digit"},
      {"[1, 2e999]", 4, "number out of the double range"},
      {"[\"abc", 5, "unterminated string"},
      {"[\"ab\\q\"]", 4, "invalid escape sequence"},
      {"[\"\\u00G0\"]", 6, "bad hex digit"},
      {"[\"a\x02\"]", 3, "unescaped control character"},
      {"[\"ok\", \"\xc3\x28\"]", 9, "invalid UTF-8"},
      {"[tx]", 2, "unexpected character 'x'"},
      {"[\x7f]", 1, "unexpected character '\\x7F'"},
      {"\xef\xbb\xbf[]", 0, "unexpected character '\\xEF'"},
      {"{\"k\":1, \"x\\\"y\":2, \"x\\\"y\":3}", 18, "duplicate object key \"x\"y\""},
      {"{\"a\\\\\":1,\"a\\\\\":2}", 9, "duplicate object key \"a\\\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const std::string msg = parse_error(c.text);
    EXPECT_NE(msg.find("invalid JSON at byte " + std::to_string(c.byte) + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.what), std::string::npos) << msg;
  }
}

TEST(JsonErrors, NegativeZeroKeepsItsSign) {
  for (const std::string text : {"-0", "[-0]", "{\"z\": -0 }"}) {
    const json::Value v = json::parse(text);
    const json::Value& z = v.is_number() ? v : v.is_array() ? json::as_array(v)[0] : v.at("z");
    EXPECT_FALSE(json::is_integer(z)) << text;
    EXPECT_TRUE(std::signbit(json::as_double(z))) << text;
  }
  EXPECT_TRUE(json::is_integer(json::as_array(json::parse("[0]"))[0]));
  EXPECT_EQ(json::parse("[10,-10]"), json::parse("[10, -10]"));
}

TEST(JsonDepth, ExactlyTheLimitParsesOneMoreIsRefusedAtItsBracket) {
  std::string objects;
  for (int i = 0; i < json::kMaxDepth; ++i) objects += "{\"a\":";
  objects += "1" + std::string(static_cast<std::size_t>(json::kMaxDepth), '}');
  EXPECT_NO_THROW((void)json::parse(objects));
  // One level more, mixing arrays and objects: refused at the byte of the bracket that
  // opens level kMaxDepth + 1.
  std::string mixed;
  for (int i = 0; i < json::kMaxDepth; ++i) mixed += i % 2 == 0 ? "[" : "{\"k\":";
  const std::size_t at = mixed.size();
  mixed += "[]";
  const std::string msg = parse_error(mixed);
  EXPECT_NE(msg.find("byte " + std::to_string(at) + ": nesting deeper than"), std::string::npos) << msg;
}

TEST(JsonDepth, TwoHundredThousandLevelsAreRefusedCleanly) {
  // Deep enough to overflow the stack of any recursive parser or destructor (ASan's
  // larger frames make it sooner); refused at the first bracket beyond the limit.
  constexpr std::size_t kDeep = 200000;
  const std::string arrays = std::string(kDeep, '[') + std::string(kDeep, ']');
  EXPECT_NE(parse_error(arrays).find("byte 64: nesting deeper than 64"), std::string::npos);
  std::string objects;
  objects.reserve(kDeep * 5);
  for (std::size_t i = 0; i < kDeep; ++i) objects += "{\"a\":";
  EXPECT_NE(parse_error(objects).find("byte 320: nesting deeper than 64"), std::string::npos);
}

}  // namespace
