// json.hpp - JSON for safetensors headers and checkpoint index files: nlohmann/json's DOM
// (objects in insertion order), plus what it lacks.
//
// Added here: a strict parse() whose every error is Error(InvalidArgument) naming what is
// wrong and the byte offset where, that refuses duplicate keys and nesting deeper than
// kMaxDepth (without recursion, however deep the text), and keeps "-0" a negative zero;
// a deterministic write() whose number forms are the checkpoint format (docs/checkpoints.md:
// integral values as integers, others in the shortest form that reads back to the same
// double; nlohmann's dump() differs); and typed access that throws Error, not
// nlohmann's exceptions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace shardopt::json {

/// A JSON value: nlohmann's DOM, objects keeping insertion order. Numbers are int64,
/// uint64 or double, as nlohmann holds them.
using Value = nlohmann::ordered_json;
/// A JSON array's elements.
using Array = Value::array_t;
/// A JSON object's (key, value) pairs, in insertion order.
using Object = Value::object_t;

/// Nesting deeper than this (arrays and objects) is refused by parse().
inline constexpr int kMaxDepth = 64;

/// Parses one JSON text (RFC 8259, strict: UTF-8 only, no trailing garbage, no duplicate
/// keys, no NaN/Infinity, depth <= kMaxDepth). Surrounding whitespace is allowed.
/// Throws Error(InvalidArgument) with the byte offset of the problem.
Value parse(std::string_view text);

/// Writes `value` deterministically. indent < 0: compact, no spaces; indent >= 0: one member
/// per line indented by `indent` spaces a level. Integers (and doubles with an integral
/// value in the int64 range, but -0) are written exactly, other numbers in the shortest form
/// that reads back to the same double. Throws Error(InvalidArgument) for NaN/Inf or a
/// string that is not valid UTF-8.
std::string write(const Value& value, int indent = -1);

/// Appends `s` as a quoted, escaped JSON string. Throws Error(InvalidArgument) for invalid
/// UTF-8, naming the offset of the bad byte.
void write_string(std::string& out, std::string_view s);

/// Whether `s` is valid UTF-8 (no overlong forms, no surrogates, <= U+10FFFF).
bool is_valid_utf8(std::string_view s);

/// A number whose exact int64 value is known: an integer in the int64 range, or a double
/// with an integral value in it (not -0).
bool is_integer(const Value& v) noexcept;

/// Typed access; each throws Error(InvalidArgument) naming the expected and actual type.
bool as_bool(const Value& v);
double as_double(const Value& v);
/// The exact integer; throws unless is_integer(v).
std::int64_t as_int(const Value& v);
const std::string& as_string(const Value& v);
const Array& as_array(const Value& v);
Array& as_array(Value& v);
const Object& as_object(const Value& v);
Object& as_object(Value& v);

/// Object member `key`, or nullptr when absent (or when `v` is not an object).
const Value* find(const Value& v, std::string_view key) noexcept;
/// Object member `key`; throws Error(InvalidArgument) when absent or not an object.
const Value& at(const Value& v, std::string_view key);

}  // namespace shardopt::json
