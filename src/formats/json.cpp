#include "formats/json.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

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

// A char iterator that counts the bytes the nlohmann lexer has taken, so that the
// builder below can name byte offsets (nlohmann's SAX events carry none).
class CountingIterator {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator() = default;
  CountingIterator(const char* p, std::size_t* taken) : p_(p), taken_(taken) {}
  reference operator*() const noexcept { return *p_; }
  CountingIterator& operator++() noexcept {
    ++p_;
    ++*taken_;
    return *this;
  }
  CountingIterator operator++(int) noexcept {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator& o) const noexcept { return p_ == o.p_; }

 private:
  const char* p_ = nullptr;
  std::size_t* taken_ = nullptr;
};

[[noreturn]] void fail_at(std::size_t at, const std::string& what) {
  SHARDOPT_REQUIRE(false, ErrorCode::InvalidArgument,
                   "invalid JSON at byte " + std::to_string(at) + ": " + what);
}

std::string printable(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7F) return std::string(1, c);
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02X", u);
  return buf;
}

bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

// Where the string that ends with the quote at `close` opens: the nearest earlier '"' not
// escaped (inside a JSON string every '"' is escaped).
std::size_t string_start(std::string_view s, std::size_t close) noexcept {
  for (std::size_t i = close; i > 0;) {
    --i;
    if (s[i] != '"') continue;
    std::size_t slashes = 0;
    while (slashes < i && s[i - 1 - slashes] == '\\') ++slashes;
    if (slashes % 2 == 0) return i;
  }
  return 0;
}

// Where the number, literal or string token whose last byte is s[last] starts.
std::size_t token_start(std::string_view s, std::size_t last) noexcept {
  if (s[last] == '"') return string_start(s, last);
  std::size_t i = last;
  const auto letter = [](char c) { return c >= 'a' && c <= 'z'; };
  if (letter(s[last])) {
    while (i > 0 && letter(s[i - 1])) --i;
    return i;
  }
  // A number: digits, '.', exponent; a '-' belongs to it only first or after the 'e'.
  while (i > 0) {
    const char c = s[i - 1];
    if (is_digit(c) || c == '.' || c == 'e' || c == 'E' || c == '+') {
      --i;
    } else if (c == '-') {
      --i;
      if (i == 0 || (s[i - 1] != 'e' && s[i - 1] != 'E')) break;
    } else {
      break;
    }
  }
  return i;
}

// Turns one nlohmann parse error into ours: the byte offset of the problem and what it is.
// nlohmann's `position` counts the bytes read up to the end of the offending token (its
// last byte for a lexer error); its messages say which lexer rule failed and, for syntax
// errors, what the parser was reading. We name the byte where the offending token starts.
[[noreturn]] void translate_error(std::string_view s, std::size_t position, const nlohmann::detail::exception& ex) {
  const std::string_view what = ex.what();
  const auto says = [&](std::string_view part) { return what.find(part) != std::string_view::npos; };
  std::size_t at = std::min(position > 0 ? position - 1 : 0, s.size());
  const bool at_end = at >= s.size();
  const bool whole_token = ex.id == 406 || says("unexpected number literal") || says("unexpected string literal") ||
                           says("unexpected true literal") || says("unexpected false literal") ||
                           says("unexpected null literal");
  if (whole_token && !at_end) at = token_start(s, at);
  if (ex.id == 406) fail_at(at, "number out of the double range");
  // "012": the lexer ends a number after a leading '0', so the next digits are a second
  // number, found where the first was complete.
  if (whole_token && !at_end) {
    const std::size_t zero = s[at] == '-' ? at + 1 : at;
    if (zero + 1 < s.size() && s[zero] == '0' && is_digit(s[zero + 1])) fail_at(at, "bad number: leading zero");
  }
  if (says("missing closing quote")) fail_at(at, "unterminated string");
  if (says("forbidden character after backslash")) fail_at(at - 1, "invalid escape sequence in a string");
  if (says("must be followed by 4 hex digits"))
    fail_at(at, at_end ? "truncated \\u escape" : "bad hex digit in a \\u escape");
  if (says("must be followed by U+DC00")) fail_at(at, "high surrogate not followed by a low surrogate");
  if (says("must follow U+D800")) fail_at(at, "lone low surrogate in a \\u escape");
  if (says("control character")) fail_at(at, "unescaped control character in a string");
  if (says("ill-formed UTF-8")) fail_at(at, "invalid UTF-8 in a string");
  if (says("expected digit after '-'")) fail_at(at, "bad number: expected a digit");
  if (says("expected digit after '.'")) fail_at(at, "bad number: expected a digit after '.'");
  if (says("exponent")) fail_at(at, "bad number: expected a digit in the exponent");
  if (says("; expected end of input")) fail_at(at, "unexpected trailing characters after the JSON value");
  if (says("while parsing object key"))
    fail_at(at, at_end ? "unexpected end of input in an object" : "expected a string key in an object");
  if (says("while parsing object separator"))
    fail_at(at, at_end ? "unexpected end of input in an object" : "expected ':' after an object key");
  if (says("while parsing object"))
    fail_at(at, at_end ? "unexpected end of input in an object" : "expected ',' or '}' in an object");
  if (says("while parsing array"))
    fail_at(at, at_end ? "unexpected end of input in an array" : "expected ',' or ']' in an array");
  if (at_end) fail_at(at, "unexpected end of input (expected a JSON value)");
  fail_at(at, "unexpected character '" + printable(s[at]) + "' (expected a JSON value)");
}

using NJson = nlohmann::json;

// Builds a Value from nlohmann's SAX events, without recursion: `open_` holds the arrays
// and objects not yet closed. Refuses duplicate keys and nesting deeper than kMaxDepth.
class Builder final : public nlohmann::json_sax<NJson> {
 public:
  Builder(std::string_view text, const std::size_t& taken) : s_(text), taken_(taken) {}

  Value take() { return std::move(root_); }

  bool null() override { return add(Value(nullptr)); }
  bool boolean(bool b) override { return add(Value(b)); }
  bool number_integer(number_integer_t i) override {
    // The lexer reads "-0" as the integer 0; keep its sign, as a double.
    if (i == 0 && negative_zero()) return add(Value(-0.0));
    return add(Value(static_cast<std::int64_t>(i)));
  }
  bool number_unsigned(number_unsigned_t u) override { return add(Value(static_cast<std::uint64_t>(u))); }
  bool number_float(number_float_t d, const string_t&) override { return add(Value(static_cast<double>(d))); }
  bool string(string_t& str) override { return add(Value(std::move(str))); }
  bool binary(binary_t&) override { return false; }  // JSON text has no binary values
  bool start_object(std::size_t) override { return open(Value::object()); }
  bool key(string_t& k) override {
    Open& top = open_.back();
    if (!top.keys.insert(k).second) fail_at(key_start(), "duplicate object key \"" + k + "\"");
    top.key = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(Value::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    translate_error(s_, position, ex);
  }

 private:
  struct Open {
    Value value;
    std::string key;                          // the member being read, for an object
    std::unordered_set<std::string> keys;     // keys seen so far, for an object
  };

  bool add(Value v) {
    if (open_.empty()) {
      root_ = std::move(v);
    } else if (Open& top = open_.back(); top.value.is_array()) {
      top.value.as_array().push_back(std::move(v));
    } else {
      top.value.as_object().emplace_back(std::move(top.key), std::move(v));
    }
    return true;
  }

  bool open(Value container) {
    // The lexer has just taken the opening bracket.
    if (open_.size() >= static_cast<std::size_t>(kMaxDepth))
      fail_at(taken_ - 1, "nesting deeper than " + std::to_string(kMaxDepth) + " arrays/objects");
    open_.push_back(Open{std::move(container), {}, {}});
    return true;
  }

  bool close() {
    Value done = std::move(open_.back().value);
    open_.pop_back();
    return add(std::move(done));
  }

  // Where the key just read starts: the lexer stopped on its closing quote.
  std::size_t key_start() const noexcept { return string_start(s_, taken_ - 1); }

  // Whether the integer 0 just read was written "-0". The lexer has taken the '0' and, unless
  // the text ends there, one byte more.
  bool negative_zero() const {
    const std::size_t zero = taken_ > 0 && s_[taken_ - 1] == '0' ? taken_ - 1 : taken_ - 2;
    return zero > 0 && s_[zero - 1] == '-';
  }

  std::string_view s_;
  const std::size_t& taken_;
  std::vector<Open> open_;
  Value root_;
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

Value parse(std::string_view text) {
  // nlohmann skips a UTF-8 byte order mark; RFC 8259 parsers may refuse it, and we do.
  if (text.substr(0, 3) == "\xEF\xBB\xBF") fail_at(0, "unexpected character '\\xEF' (expected a JSON value)");
  std::size_t taken = 0;
  Builder builder(text, taken);
  const CountingIterator first(text.data(), &taken);
  const CountingIterator last(text.data() + text.size(), nullptr);
  NJson::sax_parse(first, last, &builder, nlohmann::json::input_format_t::json, /*strict=*/true);
  return builder.take();
}

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
