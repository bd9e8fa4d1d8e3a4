// The typed access and the writer of json.hpp (the parser: json_parse.cpp).
#include "formats/json.hpp"

#include <charconv>
#include <cmath>
#include <string>

#include "shardopt/error.hpp"

namespace shardopt::json {
namespace {

using nlohmann::detail::value_t;

const char* kind_name(const Value& v) noexcept {
  switch (v.type()) {
    case value_t::null: return "null";
    case value_t::boolean: return "a boolean";
    case value_t::number_integer:
    case value_t::number_unsigned:
    case value_t::number_float: return "a number";
    case value_t::string: return "a string";
    case value_t::array: return "an array";
    case value_t::object: return "an object";
    default: return "not JSON text";  // binary or discarded: parse() makes neither
  }
}

void require_kind(const Value& v, bool ok, const char* want) {
  SHARDOPT_REQUIRE(ok, ErrorCode::InvalidArgument,
                   std::string("JSON value is ") + kind_name(v) + ", expected " + want);
}

// A double with an integral value in [-2^63, 2^63), not -0: written, and read, as an integer.
bool integral_double(double d) noexcept {
  return std::isfinite(d) && d == std::trunc(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0 &&
         !(d == 0.0 && std::signbit(d));
}

template <typename T>
void append_number(std::string& out, T x) {
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, x);  // double: shortest round trip
  out.append(buf, r.ptr);
}

void write_number(std::string& out, const Value& v) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return append_number(out, v.get<std::int64_t>());
  if (v.is_number_unsigned()) return append_number(out, v.get<std::uint64_t>());
  const double d = v.get<double>();
  SHARDOPT_REQUIRE(std::isfinite(d), ErrorCode::InvalidArgument, "cannot write a NaN or infinite number as JSON");
  if (integral_double(d)) return append_number(out, static_cast<std::int64_t>(d));
  append_number(out, d);
}

void newline(std::string& out, int indent, int level) {
  if (indent < 0) return;
  out += '\n';
  out.append(static_cast<std::size_t>(indent) * static_cast<std::size_t>(level), ' ');
}

// Recursive: values written here are built by the library or parsed (depth <= kMaxDepth).
void write_value(std::string& out, const Value& v, int indent, int level) {
  if (v.is_object() || v.is_array()) {
    out += v.is_object() ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it, first = false) {
      if (!first) out += ',';
      newline(out, indent, level + 1);
      if (v.is_object()) {
        write_string(out, it.key());
        out += indent < 0 ? ":" : ": ";
      }
      write_value(out, *it, indent, level + 1);
    }
    if (!v.empty()) newline(out, indent, level);
    out += v.is_object() ? '}' : ']';
  } else if (v.is_string()) {
    write_string(out, v.get_ref<const std::string&>());
  } else if (v.is_number()) {
    write_number(out, v);
  } else {
    require_kind(v, v.is_null() || v.is_boolean(), "a value JSON text can hold");
    out += v.dump();  // null, true, false
  }
}

}  // namespace

bool is_integer(const Value& v) noexcept {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX);
  if (v.is_number_integer()) return true;
  return v.is_number_float() && integral_double(v.get<double>());
}

bool as_bool(const Value& v) {
  require_kind(v, v.is_boolean(), "a boolean");
  return v.get<bool>();
}

double as_double(const Value& v) {
  require_kind(v, v.is_number(), "a number");
  return v.get<double>();
}

std::int64_t as_int(const Value& v) {
  require_kind(v, v.is_number(), "a number");
  SHARDOPT_REQUIRE(is_integer(v), ErrorCode::InvalidArgument, "JSON number is not an integer in the int64 range");
  return v.is_number_float() ? static_cast<std::int64_t>(v.get<double>()) : v.get<std::int64_t>();
}

const std::string& as_string(const Value& v) {
  require_kind(v, v.is_string(), "a string");
  return v.get_ref<const std::string&>();
}

const Array& as_array(const Value& v) {
  require_kind(v, v.is_array(), "an array");
  return v.get_ref<const Array&>();
}

Array& as_array(Value& v) {
  require_kind(v, v.is_array(), "an array");
  return v.get_ref<Array&>();
}

const Object& as_object(const Value& v) {
  require_kind(v, v.is_object(), "an object");
  return v.get_ref<const Object&>();
}

Object& as_object(Value& v) {
  require_kind(v, v.is_object(), "an object");
  return v.get_ref<Object&>();
}

const Value* find(const Value& v, std::string_view key) noexcept {
  if (!v.is_object()) return nullptr;
  for (const auto& [k, x] : v.get_ref<const Object&>())
    if (k == key) return &x;
  return nullptr;
}

const Value& at(const Value& v, std::string_view key) {
  require_kind(v, v.is_object(), "an object");
  const Value* x = find(v, key);
  SHARDOPT_REQUIRE(x != nullptr, ErrorCode::InvalidArgument, "JSON object has no member \"" + std::string(key) + "\"");
  return *x;
}

std::string write(const Value& value, int indent) {
  std::string out;
  write_value(out, value, indent, 0);
  return out;
}

void write_string(std::string& out, std::string_view s) {
  std::string quoted;
  try {
    quoted = Value(std::string(s)).dump();  // escapes '"', '\\' and U+0000..U+001F; checks UTF-8
  } catch (const nlohmann::json::type_error& e) {
    // nlohmann says "invalid UTF-8 byte at index N: 0xXX"; N is the offset in `s`.
    const std::string_view what = e.what();
    const std::size_t at = what.find("at index ");
    const std::string offset = at == std::string_view::npos
                                   ? "?"
                                   : std::string(what.substr(at + 9, what.find(':', at) - (at + 9)));
    SHARDOPT_REQUIRE(false, ErrorCode::InvalidArgument,
                     "cannot write a JSON string that is not valid UTF-8 (bad byte at offset " + offset + ")");
  }
  // The format also escapes DEL (U+007F), which nlohmann writes raw; no byte of a
  // multi-byte UTF-8 sequence is 0x7F.
  for (const char c : quoted) {
    if (c == '\x7f') out += "\\u007f";
    else out += c;
  }
}

bool is_valid_utf8(std::string_view s) {
  try {
    (void)Value(std::string(s)).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

}  // namespace shardopt::json
