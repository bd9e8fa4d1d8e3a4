// json.hpp - a small JSON value with a strict parser and a deterministic writer, for
// safetensors headers and checkpoint index files.
//
// Numbers are kept as a double, and also as an exact int64 when the value is integral
// and fits (so 2^53 + 1 written as an integer reads back exactly). Objects keep their
// insertion order and refuse duplicate keys when parsed. Every parse error is
// Error(InvalidArgument) naming what is wrong and the byte offset where.
// Parsing is nlohmann/json's SAX parser (no recursion: any depth of text is refused
// cleanly past kMaxDepth); writing is ours, because its number and escape forms are the
// checkpoint format (docs/decisions.md, issue 32).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace shardopt::json {

class Value;
/// A JSON array.
using Array = std::vector<Value>;
/// A JSON object: (key, value) pairs in insertion order, keys unique.
using Object = std::vector<std::pair<std::string, Value>>;

/// The type of a Value.
enum class Kind { Null, Bool, Number, String, Array, Object };

/// A JSON number: a double, plus the exact integer when the value is integral and fits int64.
struct Number {
  double value = 0.0;
  bool is_int = false;  ///< `integer` holds the exact value
  std::int64_t integer = 0;
  friend bool operator==(const Number&, const Number&) = default;
};

/// One JSON value. Default-constructed it is null.
class Value {
 public:
  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool b) : v_(b) {}
  /// Any integer type (not bool): exact when it fits int64, else a double.
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  Value(T i) : v_(make_integer(i)) {}
  /// A double. NaN and infinities are refused by the writer (JSON has none).
  template <std::floating_point T>
  Value(T d) : v_(make_double(static_cast<double>(d))) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::move(a)) {}
  Value(Object o) : v_(std::move(o)) {}

  /// An empty array / object (spelled out because `{}` is ambiguous).
  static Value array() { return Value(Array{}); }
  static Value object() { return Value(Object{}); }

  Kind kind() const noexcept { return static_cast<Kind>(v_.index()); }
  bool is_null() const noexcept { return kind() == Kind::Null; }
  bool is_bool() const noexcept { return kind() == Kind::Bool; }
  bool is_number() const noexcept { return kind() == Kind::Number; }
  /// A number whose exact int64 value is known.
  bool is_integer() const noexcept { return is_number() && std::get<Number>(v_).is_int; }
  bool is_string() const noexcept { return kind() == Kind::String; }
  bool is_array() const noexcept { return kind() == Kind::Array; }
  bool is_object() const noexcept { return kind() == Kind::Object; }

  /// Typed access; each throws Error(InvalidArgument) naming the expected and actual type.
  bool as_bool() const;
  double as_double() const;
  /// The exact integer; throws unless is_integer().
  std::int64_t as_int() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  /// Object member `key`, or nullptr when absent (or when this is not an object). Linear.
  const Value* find(std::string_view key) const noexcept;
  /// Object member `key`; throws Error(InvalidArgument) when absent or not an object.
  const Value& at(std::string_view key) const;
  /// Sets object member `key` (replacing it in place, or appending); returns it.
  /// A null value becomes an empty object first.
  Value& set(std::string key, Value value);
  /// Appends to an array (a null value becomes an empty array first).
  void push_back(Value value);
  /// Elements of an array or members of an object; 0 for other kinds.
  std::size_t size() const noexcept;

  /// Structural equality (objects compare in order; numbers by value, and int-ness).
  friend bool operator==(const Value& a, const Value& b);

 private:
  template <typename T>
  static Number make_integer(T i) {
    if constexpr (std::is_signed_v<T>) {
      return Number{static_cast<double>(i), true, static_cast<std::int64_t>(i)};
    } else {
      if (static_cast<std::uint64_t>(i) <= static_cast<std::uint64_t>(INT64_MAX))
        return Number{static_cast<double>(i), true, static_cast<std::int64_t>(i)};
      return Number{static_cast<double>(i), false, 0};
    }
  }
  static Number make_double(double d) noexcept;

  std::variant<std::nullptr_t, bool, Number, std::string, Array, Object> v_{nullptr};
};

/// Nesting deeper than this (arrays and objects) is refused by parse().
inline constexpr int kMaxDepth = 64;

/// Parses one JSON text (RFC 8259, strict: UTF-8 only, no trailing garbage, no duplicate
/// keys, no NaN/Infinity, depth <= kMaxDepth). Surrounding whitespace is allowed.
/// Throws Error(InvalidArgument) with the byte offset of the problem.
Value parse(std::string_view text);

/// Writes `value` deterministically. indent < 0: compact, no spaces; indent >= 0: one member
/// per line indented by `indent` spaces a level. Integers are written exactly, other numbers
/// in the shortest form that reads back to the same double. Throws Error(InvalidArgument)
/// for NaN/Inf or a string that is not valid UTF-8.
std::string write(const Value& value, int indent = -1);

/// Appends `s` as a quoted, escaped JSON string. Throws for invalid UTF-8.
void write_string(std::string& out, std::string_view s);

/// Whether `s` is valid UTF-8 (no overlong forms, no surrogates, <= U+10FFFF).
bool is_valid_utf8(std::string_view s) noexcept;

}  // namespace shardopt::json
