#include "core/json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <system_error>
#include <unordered_set>

#include "shardopt/error.hpp"

namespace shardopt::json {
namespace {

const char* kind_name(Kind k) noexcept {
  switch (k) {
    case Kind::Null: return "null";
    case Kind::Bool: return "a boolean";
    case Kind::Number: return "a number";
    case Kind::String: return "a string";
    case Kind::Array: return "an array";
    case Kind::Object: return "an object";
  }
  return "?";
}

[[noreturn]] void type_error(Kind want, Kind got) {
  SHARDOPT_REQUIRE(false, ErrorCode::InvalidArgument,
                   std::string("JSON value is ") + kind_name(got) + ", expected " + kind_name(want));
}

// Decodes one UTF-8 sequence at s[i]; returns its length (1..4) or 0 when invalid.
std::size_t utf8_sequence(std::string_view s, std::size_t i) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  std::size_t len = 0;
  std::uint32_t cp = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1Fu;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0Fu;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07u;
  } else {
    return 0;  // continuation byte, overlong 2-byte lead (C0, C1) or > U+13FFFF
  }
  if (i + len > s.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    if ((b(k) & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (b(k) & 0x3Fu);
  }
  if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
  if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
  return len;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected trailing characters after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }
  [[noreturn]] void fail_at(std::size_t at, const std::string& what) const {
    SHARDOPT_REQUIRE(false, ErrorCode::InvalidArgument,
                     "invalid JSON at byte " + std::to_string(at) + ": " + what);
  }

  bool at_end() const noexcept { return pos_ >= s_.size(); }
  char peek() const noexcept { return at_end() ? '\0' : s_[pos_]; }

  void skip_ws() noexcept {
    while (!at_end()) {
      const char c = s_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  void expect_word(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) fail("unexpected character (expected a JSON value)");
    pos_ += word.size();
  }

  Value value(int depth) {
    if (at_end()) fail("unexpected end of input (expected a JSON value)");
    switch (peek()) {
      case '{': return object(depth + 1);
      case '[': return array(depth + 1);
      case '"': return Value(string());
      case 't': expect_word("true"); return Value(true);
      case 'f': expect_word("false"); return Value(false);
      case 'n': expect_word("null"); return Value(nullptr);
      default: break;
    }
    if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return number();
    fail(std::string("unexpected character '") + printable(peek()) + "' (expected a JSON value)");
  }

  static std::string printable(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) return std::string(1, c);
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", u);
    return buf;
  }

  void check_depth(int depth) const {
    if (depth > kMaxDepth)
      fail("nesting deeper than " + std::to_string(kMaxDepth) + " arrays/objects");
  }

  Value array(int depth) {
    check_depth(depth);
    ++pos_;  // '['
    Array out;
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return Value(std::move(out));
    }
    for (;;) {
      skip_ws();
      out.push_back(value(depth));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return Value(std::move(out));
      }
      fail(at_end() ? "unexpected end of input in an array" : "expected ',' or ']' in an array");
    }
  }

  Value object(int depth) {
    check_depth(depth);
    ++pos_;  // '{'
    Object out;
    std::unordered_set<std::string> keys;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return Value(std::move(out));
    }
    for (;;) {
      skip_ws();
      if (peek() != '"')
        fail(at_end() ? "unexpected end of input in an object" : "expected a string key in an object");
      const std::size_t key_at = pos_;
      std::string key = string();
      if (!keys.insert(key).second) fail_at(key_at, "duplicate object key \"" + key + "\"");
      skip_ws();
      if (peek() != ':') fail("expected ':' after an object key");
      ++pos_;
      skip_ws();
      Value v = value(depth);
      out.emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return Value(std::move(out));
      }
      fail(at_end() ? "unexpected end of input in an object" : "expected ',' or '}' in an object");
    }
  }

  std::uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[pos_ + k];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
      else fail("bad hex digit in a \\u escape");
    }
    pos_ += 4;
    return v;
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("unescaped control character in a string");
      if (c == '\\') {
        const std::size_t esc_at = pos_;
        ++pos_;
        if (at_end()) fail("unterminated string");
        const char e = s_[pos_++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            std::uint32_t cp = hex4();
            if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(esc_at, "lone low surrogate in a \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (s_.substr(pos_, 2) != "\\u")
                fail_at(esc_at, "high surrogate not followed by a \\u low surrogate");
              pos_ += 2;
              const std::uint32_t lo = hex4();
              if (lo < 0xDC00 || lo > 0xDFFF)
                fail_at(esc_at, "high surrogate not followed by a low surrogate");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            append_utf8(out, cp);
            break;
          }
          default: fail_at(esc_at, "invalid escape sequence in a string");
        }
        continue;
      }
      const std::size_t len = utf8_sequence(s_, pos_);
      if (len == 0) fail("invalid UTF-8 in a string");
      out.append(s_.data() + pos_, len);
      pos_ += len;
    }
  }

  Value number() {
    const std::size_t start = pos_;
    const auto digit = [&] { return !at_end() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    bool integral = true;
    if (peek() == '-') ++pos_;
    if (!digit()) fail("bad number: expected a digit");
    if (s_[pos_] == '0') {
      ++pos_;
      if (digit()) fail_at(start, "bad number: leading zero");
    } else {
      while (digit()) ++pos_;
    }
    if (peek() == '.') {
      integral = false;
      ++pos_;
      if (!digit()) fail("bad number: expected a digit after '.'");
      while (digit()) ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!digit()) fail("bad number: expected a digit in the exponent");
      while (digit()) ++pos_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (integral) {
      std::int64_t i = 0;
      const auto r = std::from_chars(first, last, i);
      if (r.ec == std::errc() && r.ptr == last) {
        if (i == 0 && *first == '-') return Value(-0.0);
        return Value(i);
      }
      // Out of int64 range: fall through to a double.
    }
    double d = 0.0;
    const auto r = std::from_chars(first, last, d);
    if (r.ec == std::errc::result_out_of_range) {
      // Underflow to zero is harmless; overflow to infinity is not representable.
      if (std::fabs(std::strtod(std::string(first, last).c_str(), nullptr)) > 1.0)
        fail_at(start, "number out of the double range");
      return Value(0.0);
    }
    if (r.ec != std::errc() || r.ptr != last) fail_at(start, "bad number");
    return Value(d);
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

void write_number(std::string& out, const Number& n) {
  char buf[64];
  std::to_chars_result r;
  if (n.is_int) {
    r = std::to_chars(buf, buf + sizeof buf, n.integer);
  } else {
    SHARDOPT_REQUIRE(std::isfinite(n.value), ErrorCode::InvalidArgument,
                     "cannot write a NaN or infinite number as JSON");
    r = std::to_chars(buf, buf + sizeof buf, n.value);  // shortest round-trip form
  }
  out.append(buf, r.ptr);
}

void newline(std::string& out, int indent, int level) {
  if (indent < 0) return;
  out += '\n';
  out.append(static_cast<std::size_t>(indent) * static_cast<std::size_t>(level), ' ');
}

void write_value(std::string& out, const Value& v, int indent, int level) {
  switch (v.kind()) {
    case Kind::Null: out += "null"; return;
    case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Kind::Number: {
      Number n;
      n.value = v.as_double();
      n.is_int = v.is_integer();
      if (n.is_int) n.integer = v.as_int();
      write_number(out, n);
      return;
    }
    case Kind::String: write_string(out, v.as_string()); return;
    case Kind::Array: {
      const Array& a = v.as_array();
      out += '[';
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (i > 0) out += ',';
        newline(out, indent, level + 1);
        write_value(out, a[i], indent, level + 1);
      }
      if (!a.empty()) newline(out, indent, level);
      out += ']';
      return;
    }
    case Kind::Object: {
      const Object& o = v.as_object();
      out += '{';
      for (std::size_t i = 0; i < o.size(); ++i) {
        if (i > 0) out += ',';
        newline(out, indent, level + 1);
        write_string(out, o[i].first);
        out += indent < 0 ? ":" : ": ";
        write_value(out, o[i].second, indent, level + 1);
      }
      if (!o.empty()) newline(out, indent, level);
      out += '}';
      return;
    }
  }
}

}  // namespace

Number Value::make_double(double d) noexcept {
  // Integral values in [-2^63, 2^63) also carry their exact integer; -0.0 stays a double.
  if (std::isfinite(d) && d == std::trunc(d) && d >= -9223372036854775808.0 &&
      d < 9223372036854775808.0 && !(d == 0.0 && std::signbit(d)))
    return Number{d, true, static_cast<std::int64_t>(d)};
  return Number{d, false, 0};
}

bool Value::as_bool() const {
  if (!is_bool()) type_error(Kind::Bool, kind());
  return std::get<bool>(v_);
}

double Value::as_double() const {
  if (!is_number()) type_error(Kind::Number, kind());
  return std::get<Number>(v_).value;
}

std::int64_t Value::as_int() const {
  if (!is_number()) type_error(Kind::Number, kind());
  const Number& n = std::get<Number>(v_);
  SHARDOPT_REQUIRE(n.is_int, ErrorCode::InvalidArgument,
                   "JSON number is not an integer in the int64 range");
  return n.integer;
}

const std::string& Value::as_string() const {
  if (!is_string()) type_error(Kind::String, kind());
  return std::get<std::string>(v_);
}

const Array& Value::as_array() const {
  if (!is_array()) type_error(Kind::Array, kind());
  return std::get<Array>(v_);
}

Array& Value::as_array() {
  if (!is_array()) type_error(Kind::Array, kind());
  return std::get<Array>(v_);
}

const Object& Value::as_object() const {
  if (!is_object()) type_error(Kind::Object, kind());
  return std::get<Object>(v_);
}

Object& Value::as_object() {
  if (!is_object()) type_error(Kind::Object, kind());
  return std::get<Object>(v_);
}

const Value* Value::find(std::string_view key) const noexcept {
  if (!is_object()) return nullptr;
  for (const auto& [k, v] : std::get<Object>(v_))
    if (k == key) return &v;
  return nullptr;
}

const Value& Value::at(std::string_view key) const {
  if (!is_object()) type_error(Kind::Object, kind());
  const Value* v = find(key);
  SHARDOPT_REQUIRE(v != nullptr, ErrorCode::InvalidArgument,
                   "JSON object has no member \"" + std::string(key) + "\"");
  return *v;
}

Value& Value::set(std::string key, Value value) {
  if (is_null()) v_ = Object{};
  Object& o = as_object();
  for (auto& [k, v] : o)
    if (k == key) return v = std::move(value);
  o.emplace_back(std::move(key), std::move(value));
  return o.back().second;
}

void Value::push_back(Value value) {
  if (is_null()) v_ = Array{};
  as_array().push_back(std::move(value));
}

std::size_t Value::size() const noexcept {
  if (is_array()) return std::get<Array>(v_).size();
  if (is_object()) return std::get<Object>(v_).size();
  return 0;
}

bool operator==(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  if (a.kind() == Kind::Number) {
    const Number& x = std::get<Number>(a.v_);
    const Number& y = std::get<Number>(b.v_);
    if (x.is_int != y.is_int) return false;
    return x.is_int ? x.integer == y.integer : x.value == y.value;
  }
  return a.v_ == b.v_;
}

Value parse(std::string_view text) { return Parser(text).document(); }

std::string write(const Value& value, int indent) {
  std::string out;
  write_value(out, value, indent, 0);
  return out;
}

void write_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const std::size_t len = utf8_sequence(s, i);
      SHARDOPT_REQUIRE(len != 0, ErrorCode::InvalidArgument,
                       "cannot write a JSON string that is not valid UTF-8 (bad byte at offset " +
                           std::to_string(i) + ")");
      out.append(s.data() + i, len);
      i += len;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
}

bool is_valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = utf8_sequence(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

}  // namespace shardopt::json
