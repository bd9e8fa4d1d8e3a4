// json.hpp's parse(): nlohmann/json's SAX parser building its DOM, with the library's
// error wording (the byte offset and what is wrong, translated from nlohmann's messages),
// duplicate keys and nesting deeper than kMaxDepth refused, and "-0" kept negative.
#include "formats/json.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>
#include <unordered_set>
#include <vector>

#include "shardopt/error.hpp"

namespace shardopt::json {
namespace {

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

// Builds nlohmann's DOM from its SAX events, without recursion: `open_` holds the arrays
// and objects not yet closed (each the last element of its parent, so the pointer stays
// valid while it is open). Refuses duplicate keys and nesting deeper than kMaxDepth.
class Builder final : public nlohmann::json_sax<Value> {
 public:
  Builder(std::string_view text, const std::size_t& taken) : s_(text), taken_(taken) {}

  Value take() { return std::move(root_); }

  bool null() override { return add(nullptr); }
  bool boolean(bool b) override { return add(b); }
  bool number_integer(number_integer_t i) override {
    // The lexer reads "-0" as the integer 0; keep its sign, as a double.
    if (i == 0 && negative_zero()) return add(-0.0);
    return add(i);
  }
  bool number_unsigned(number_unsigned_t u) override { return add(u); }
  bool number_float(number_float_t d, const string_t&) override { return add(d); }
  bool string(string_t& str) override { return add(std::move(str)); }
  bool binary(binary_t&) override { return false; }  // JSON text has no binary values
  bool start_object(std::size_t) override { return open(Value::object()); }
  bool key(string_t& k) override {
    Open& top = open_.back();
    if (!top.keys.insert(k).second) fail_at(key_start(), "duplicate object key \"" + k + "\"");
    key_ = std::move(k);
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
    Value* value;
    std::unordered_set<std::string> keys;  // keys seen so far, for an object
  };

  // Places `v` in the innermost open container (or as the root); returns where it is.
  Value* place(Value v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Value& top = *open_.back().value;
    if (top.is_array()) {
      top.get_ref<Array&>().push_back(std::move(v));
      return &top.get_ref<Array&>().back();
    }
    // Appended without the object's own (linear) search: key() refused duplicates.
    Object& o = top.get_ref<Object&>();
    o.emplace_back(std::move(key_), std::move(v));
    return &o.back().second;
  }

  bool add(Value v) {
    (void)place(std::move(v));
    return true;
  }

  bool open(Value container) {
    // The lexer has just taken the opening bracket.
    if (open_.size() >= static_cast<std::size_t>(kMaxDepth))
      fail_at(taken_ - 1, "nesting deeper than " + std::to_string(kMaxDepth) + " arrays/objects");
    open_.push_back(Open{place(std::move(container)), {}});
    return true;
  }

  bool close() {
    open_.pop_back();
    return true;
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
  std::string key_;  // the member being read, in the innermost object
  Value root_;
};

}  // namespace

Value parse(std::string_view text) {
  // nlohmann skips a UTF-8 byte order mark; RFC 8259 parsers may refuse it, and we do.
  if (text.substr(0, 3) == "\xEF\xBB\xBF") fail_at(0, "unexpected character '\\xEF' (expected a JSON value)");
  std::size_t taken = 0;
  Builder builder(text, taken);
  const CountingIterator first(text.data(), &taken);
  const CountingIterator last(text.data() + text.size(), nullptr);
  Value::sax_parse(first, last, &builder, nlohmann::json::input_format_t::json, /*strict=*/true);
  return builder.take();
}

}  // namespace shardopt::json
