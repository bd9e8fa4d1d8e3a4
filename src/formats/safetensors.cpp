#include "formats/safetensors.hpp"

#include <algorithm>
#include <future>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>

#include "formats/crc32c.hpp"
#include "formats/file_io.hpp"
#include "formats/json.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace {

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kChecksumPrefix = "crc32c:";
constexpr std::size_t kWriteBuffer = std::size_t{1} << 20;

struct DtypeSize {
  std::string_view name;
  std::size_t size;
};
constexpr DtypeSize kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},
};

std::string known_dtypes() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// product(shape) * elem, or false on overflow.
bool byte_size(const std::vector<std::uint64_t>& shape, std::size_t elem, std::uint64_t& out) {
  std::uint64_t n = elem;
  for (const std::uint64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return false;
  out = n;
  return true;
}

std::string hex8(std::uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return std::string(buf, 8);
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::size_t safetensors_dtype_size(std::string_view dtype) noexcept {
  for (const auto& d : kDtypes)
    if (d.name == dtype) return d.size;
  return 0;
}

const char* safetensors_dtype(DType t) noexcept {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::e4m3: return "F8_E4M3";
    case DType::e5m2: return "F8_E5M2";
    case DType::e8m0: return "F8_E8M0";
    case DType::u32: return "U32";
    case DType::u16: return "U16";
    case DType::q8_block: return "U8";
  }
  return "?";
}

// ------------------------------------------------------------------ writer

SafetensorsWriter::SafetensorsWriter(std::string path)
    : path_(std::move(path)), file_(std::make_unique<AtomicFile>(path_)) {
  temp_path_ = file_->temp_path();
}

SafetensorsWriter::~SafetensorsWriter() = default;  // AtomicFile removes an uncommitted temp file
SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&&) noexcept = default;

void SafetensorsWriter::require_usable(const char* what) const {
  SHARDOPT_REQUIRE(file_ != nullptr, ErrorCode::InvalidState,
                   std::string("SafetensorsWriter::") + what + " on a moved-from writer");
  SHARDOPT_REQUIRE(!finished_, ErrorCode::InvalidState,
                   std::string("SafetensorsWriter::") + what + " after finish() of '" + path_ + "'");
  SHARDOPT_REQUIRE(!broken_, ErrorCode::InvalidState,
                   std::string("SafetensorsWriter::") + what + " after an earlier write to '" + temp_path_ +
                       "' failed; the file is abandoned: start a new writer");
}

std::size_t SafetensorsWriter::add_tensor(std::string name, std::string dtype, std::vector<std::uint64_t> shape) {
  require_usable("add_tensor");
  SHARDOPT_REQUIRE(!header_written_, ErrorCode::InvalidState,
                   "add_tensor(\"" + name + "\") after the header of '" + path_ + "' was written; declare every tensor first");
  SHARDOPT_REQUIRE(name != kMetadataKey, ErrorCode::InvalidArgument,
                   "a tensor may not be named \"__metadata__\" (reserved by the safetensors format)");
  SHARDOPT_REQUIRE(json::is_valid_utf8(name), ErrorCode::InvalidArgument,
                   "tensor name \"" + name + "\" is not valid UTF-8");
  SHARDOPT_REQUIRE(index_.count(name) == 0, ErrorCode::InvalidArgument,
                   "tensor \"" + name + "\" declared twice for '" + path_ + "'");
  const std::size_t elem = safetensors_dtype_size(dtype);
  SHARDOPT_REQUIRE(elem != 0, ErrorCode::InvalidArgument,
                   "tensor \"" + name + "\": unknown dtype \"" + dtype + "\"; use one of " + known_dtypes());
  std::uint64_t bytes = 0;
  SHARDOPT_REQUIRE(byte_size(shape, elem, bytes), ErrorCode::InvalidArgument,
                   "tensor \"" + name + "\": shape " + shape_text(shape) + " overflows 64-bit byte sizes");
  SafetensorsEntry e;
  e.name = std::move(name);
  e.dtype = std::move(dtype);
  e.shape = std::move(shape);
  e.begin = data_bytes_;
  SHARDOPT_REQUIRE(!__builtin_add_overflow(e.begin, bytes, &e.end), ErrorCode::InvalidArgument,
                   "tensor \"" + e.name + "\": the data section overflows 64-bit sizes");
  data_bytes_ = e.end;
  index_.emplace(e.name, tensors_.size());
  tensors_.push_back(std::move(e));
  return tensors_.size() - 1;
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  require_usable("set_metadata");
  SHARDOPT_REQUIRE(!header_written_, ErrorCode::InvalidState,
                   "set_metadata(\"" + key + "\") after the header of '" + path_ + "' was written");
  SHARDOPT_REQUIRE(key != kChecksumKey, ErrorCode::InvalidArgument,
                   "metadata key \"checksum\" is reserved: the writer fills it in");
  SHARDOPT_REQUIRE(json::is_valid_utf8(key) && json::is_valid_utf8(value), ErrorCode::InvalidArgument,
                   "metadata key or value for \"" + key + "\" is not valid UTF-8");
  for (auto& [k, v] : metadata_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  metadata_.emplace_back(std::move(key), std::move(value));
}

std::size_t SafetensorsWriter::index_of(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  SHARDOPT_REQUIRE(it != index_.end(), ErrorCode::InvalidArgument,
                   "tensor \"" + std::string(name) + "\" was not declared for '" + path_ + "'");
  return it->second;
}

void SafetensorsWriter::write_header() {
  require_usable("write_header");
  SHARDOPT_REQUIRE(!header_written_, ErrorCode::InvalidState,
                   "write_header() called twice for '" + path_ + "'");
  const std::string placeholder = std::string(kChecksumPrefix) + "00000000";
  json::Value meta = json::Value::object();
  for (const auto& [k, v] : metadata_) meta[k] = json::Value(v);
  meta[std::string(kChecksumKey)] = json::Value(placeholder);
  json::Value header = json::Value::object();
  header[std::string(kMetadataKey)] = std::move(meta);
  for (const SafetensorsEntry& e : tensors_) {
    json::Value shape = json::Value::array();
    for (const std::uint64_t d : e.shape) shape.push_back(json::Value(d));
    json::Value t = json::Value::object();
    t["dtype"] = json::Value(e.dtype);
    t["shape"] = std::move(shape);
    json::Value offsets = json::Value::array();
    offsets.push_back(json::Value(e.begin));
    offsets.push_back(json::Value(e.end));
    t["data_offsets"] = std::move(offsets);
    header[e.name] = std::move(t);
  }
  std::string text = json::write(header);
  // Inside a JSON string every '"' is escaped, so this key-value text is found only where
  // the writer put it.
  const std::string needle = "\"" + std::string(kChecksumKey) + "\":\"" + placeholder + "\"";
  const std::size_t at = text.find(needle);
  SHARDOPT_REQUIRE(at != std::string::npos && text.find(needle, at + 1) == std::string::npos,
                   ErrorCode::Internal, "checksum placeholder not found once in the safetensors header");
  text.append((8 - text.size() % 8) % 8, ' ');  // 8 + N is then a multiple of 8
  checksum_at_ = 8 + at + needle.size() - 1 - 8;

  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  header_written_ = true;
  data_offset_ = 8 + text.size();
  buffer_.reserve(kWriteBuffer);
  try {
    file_->file().write_all(len, sizeof len);
    file_->file().write_all(text.data(), text.size());
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void SafetensorsWriter::write(std::string_view name, const void* data, std::size_t n) {
  write(index_of(name), data, n);
}

void SafetensorsWriter::write(std::size_t index, const void* data, std::size_t n) {
  require_usable("write");
  SHARDOPT_REQUIRE(index < tensors_.size(), ErrorCode::OutOfRange,
                   "tensor index " + std::to_string(index) + " out of range: '" + path_ + "' declares " +
                       std::to_string(tensors_.size()) + " tensors");
  if (!header_written_) write_header();
  // Complete tensors are behind us: skip them (empty tensors need no write).
  while (current_ < tensors_.size() && written_ == tensors_[current_].end && current_ < index) ++current_;
  const SafetensorsEntry& e = tensors_[index];
  SHARDOPT_REQUIRE(index == current_, ErrorCode::InvalidState,
                   "tensor \"" + e.name + "\" written out of order in '" + path_ + "': tensor \"" +
                       tensors_[current_].name + "\" has " + std::to_string(tensors_[current_].end - written_) +
                       " bytes still to come; write tensors in declaration order");
  SHARDOPT_REQUIRE(n <= e.end - written_, ErrorCode::InvalidArgument,
                   "tensor \"" + e.name + "\" in '" + path_ + "' receives more than its declared " +
                       std::to_string(e.bytes()) + " bytes (" + std::to_string(written_ - e.begin) +
                       " written, " + std::to_string(n) + " more given)");
  if (n == 0) return;
  written_ += n;
  try {
    if (buffer_.size() + n > kWriteBuffer) flush_buffer();
    if (n >= kWriteBuffer) {
      // A large piece: its checksum is computed on another thread while the file write
      // runs, so the checksum costs no time of its own.
      const std::uint32_t before = crc_;
      auto crc = std::async(std::launch::async, [before, data, n] { return crc32c_update(before, data, n); });
      write_out(data, n);
      crc_ = crc.get();
    } else {
      crc_ = crc32c_update(crc_, data, n);
      const auto* p = static_cast<const char*>(data);
      buffer_.insert(buffer_.end(), p, p + n);
    }
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void SafetensorsWriter::flush_buffer() {
  if (buffer_.empty()) return;
  write_out(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void SafetensorsWriter::write_out(const void* data, std::size_t n) {
  file_->file().write_all(data, n);
  file_->file().start_writeback(data_offset_ + in_file_, n);  // the disk starts now, not at fsync
  in_file_ += n;
}

std::uint32_t SafetensorsWriter::finish() {
  require_usable("finish");
  if (!header_written_) write_header();
  if (written_ != data_bytes_) {
    while (current_ < tensors_.size() && written_ == tensors_[current_].end) ++current_;
    const SafetensorsEntry& e = tensors_[current_];
    SHARDOPT_REQUIRE(false, ErrorCode::InvalidState,
                     "finish() of '" + path_ + "' before every tensor was written: tensor \"" + e.name +
                         "\" has " + std::to_string(written_ - e.begin) + " of its " + std::to_string(e.bytes()) +
                         " bytes");
  }
  try {
    flush_buffer();
    const std::string digits = hex8(crc_);
    file_->file().pwrite_all(digits.data(), digits.size(), checksum_at_);
    file_->commit();
  } catch (...) {
    broken_ = true;
    throw;
  }
  finished_ = true;
  return crc_;
}

// ------------------------------------------------------------------ reader

SafetensorsReader::SafetensorsReader(std::string path)
    : path_(std::move(path)), file_(std::make_unique<File>(File::open_read(path_))) {
  const std::uint64_t size = file_->size();
  if (size < 8)
    fail("it has " + std::to_string(size) + " bytes, fewer than the 8-byte header length: not a safetensors "
         "file, or a file cut short");
  unsigned char len[8];
  file_->pread_exact(len, sizeof len, 0);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > kSafetensorsMaxHeaderBytes)
    fail("header length " + std::to_string(n) + " exceeds the limit of " +
         std::to_string(kSafetensorsMaxHeaderBytes) + " bytes: not a safetensors file, or a corrupt one");
  if (8 + n > size)
    fail("file is truncated: the header needs " + std::to_string(8 + n) + " bytes but the file has " +
         std::to_string(size));
  std::string header(static_cast<std::size_t>(n), '\0');
  file_->pread_exact(header.data(), header.size(), 8);
  data_offset_ = 8 + n;
  parse_header(header);
  const std::uint64_t expected = data_offset_ + data_bytes_;
  if (size < expected)
    fail("file is truncated: its header describes " + std::to_string(expected) + " bytes but the file has " +
         std::to_string(size) + " (an interrupted save or copy?)");
  if (size > expected)
    fail("file has " + std::to_string(size - expected) + " bytes after the data section its header describes (" +
         std::to_string(expected) + " bytes expected, " + std::to_string(size) + " found)");
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

void SafetensorsReader::fail(const std::string& what) const {
  SHARDOPT_REQUIRE(false, ErrorCode::InvalidArgument, "safetensors file '" + path_ + "': " + what);
}

void SafetensorsReader::parse_header(std::string_view text) {
  if (text.empty() || text.front() != '{') fail("the header does not start with '{': not a safetensors file");
  json::Value header;
  try {
    header = json::parse(text);
  } catch (const Error& e) {
    fail(std::string("corrupt header (byte offsets count from the header start, file byte 8): ") + e.what());
  }
  if (!header.is_object()) fail("the header is not a JSON object");
  for (const auto& [name, value] : json::as_object(header)) {
    if (name == kMetadataKey) {
      if (!value.is_object()) fail("\"__metadata__\" is not an object of strings");
      for (const auto& [k, v] : json::as_object(value)) {
        if (!v.is_string()) fail("metadata value of \"" + k + "\" is not a string");
        metadata_.emplace_back(k, json::as_string(v));
      }
      continue;
    }
    const std::string where = "tensor \"" + name + "\": ";
    if (!value.is_object()) fail(where + "its entry is not an object");
    SafetensorsEntry e;
    e.name = name;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    for (const auto& [k, v] : json::as_object(value)) {
      if (k == "dtype") {
        if (!v.is_string()) fail(where + "\"dtype\" is not a string");
        e.dtype = json::as_string(v);
        has_dtype = true;
      } else if (k == "shape") {
        if (!v.is_array()) fail(where + "\"shape\" is not an array");
        for (const json::Value& d : json::as_array(v)) {
          if (!json::is_integer(d) || json::as_int(d) < 0) fail(where + "\"shape\" holds a value that is not a non-negative integer");
          e.shape.push_back(static_cast<std::uint64_t>(json::as_int(d)));
        }
        has_shape = true;
      } else if (k == "data_offsets") {
        if (!v.is_array() || v.size() != 2) fail(where + "\"data_offsets\" is not an array of two integers");
        const json::Value& b = json::as_array(v)[0];
        const json::Value& x = json::as_array(v)[1];
        if (!json::is_integer(b) || !json::is_integer(x) || json::as_int(b) < 0 || json::as_int(x) < json::as_int(b))
          fail(where + "\"data_offsets\" is not [begin, end] with 0 <= begin <= end");
        e.begin = static_cast<std::uint64_t>(json::as_int(b));
        e.end = static_cast<std::uint64_t>(json::as_int(x));
        has_offsets = true;
      } else {
        fail(where + "unknown key \"" + k + "\" (expected dtype, shape, data_offsets)");
      }
    }
    if (!has_dtype || !has_shape || !has_offsets) fail(where + "needs \"dtype\", \"shape\" and \"data_offsets\"");
    const std::size_t elem = safetensors_dtype_size(e.dtype);
    if (elem == 0) fail(where + "unknown dtype \"" + e.dtype + "\" (known: " + known_dtypes() + ")");
    std::uint64_t bytes = 0;
    if (!byte_size(e.shape, elem, bytes) || bytes != e.bytes())
      fail(where + "shape " + shape_text(e.shape) + " of " + e.dtype + " does not match its " +
           std::to_string(e.bytes()) + " bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")");
    tensors_.push_back(std::move(e));
  }
  std::stable_sort(tensors_.begin(), tensors_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t cursor = 0;
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const SafetensorsEntry& e = tensors_[i];
    if (e.begin < cursor)
      fail("tensors \"" + tensors_[i - 1].name + "\" and \"" + e.name + "\" overlap in the data section ([" +
           std::to_string(tensors_[i - 1].begin) + ", " + std::to_string(tensors_[i - 1].end) + ") and [" +
           std::to_string(e.begin) + ", " + std::to_string(e.end) + "))");
    if (e.begin > cursor)
      fail("bytes [" + std::to_string(cursor) + ", " + std::to_string(e.begin) + ") of the data section, before tensor \"" +
           e.name + "\", belong to no tensor");
    cursor = e.end;
    index_.emplace(e.name, i);
  }
  data_bytes_ = cursor;
}

const SafetensorsEntry* SafetensorsReader::find(std::string_view name) const noexcept {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsEntry& SafetensorsReader::tensor(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) fail("no tensor named \"" + std::string(name) + "\"");
  return *e;
}

const std::string* SafetensorsReader::find_metadata(std::string_view key) const noexcept {
  for (const auto& [k, v] : metadata_)
    if (k == key) return &v;
  return nullptr;
}

void SafetensorsReader::read(std::string_view name, std::uint64_t offset, void* out, std::size_t n) const {
  read(tensor(name), offset, out, n);
}

void SafetensorsReader::read(const SafetensorsEntry& entry, std::uint64_t offset, void* out, std::size_t n) const {
  SHARDOPT_REQUIRE(offset <= entry.bytes() && n <= entry.bytes() - offset, ErrorCode::OutOfRange,
                   "read of bytes [" + std::to_string(offset) + ", +" + std::to_string(n) + ") of tensor \"" +
                       entry.name + "\" in '" + path_ + "', which has " + std::to_string(entry.bytes()) + " bytes");
  SHARDOPT_REQUIRE(file_ != nullptr, ErrorCode::InvalidState, "read from a moved-from SafetensorsReader");
  file_->pread_exact(out, n, data_offset_ + entry.begin + offset);
}

std::uint32_t SafetensorsReader::compute_checksum(std::size_t chunk_bytes) const {
  SHARDOPT_REQUIRE(file_ != nullptr, ErrorCode::InvalidState, "compute_checksum on a moved-from SafetensorsReader");
  std::vector<char> buf(std::max<std::size_t>(1, std::min<std::uint64_t>(chunk_bytes, std::max<std::uint64_t>(data_bytes_, 1))));
  std::uint32_t crc = 0;
  for (std::uint64_t at = 0; at < data_bytes_;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), data_bytes_ - at));
    file_->pread_exact(buf.data(), n, data_offset_ + at);
    crc = crc32c_update(crc, buf.data(), n);
    at += n;
  }
  return crc;
}

bool SafetensorsReader::verify_checksum(bool required) const {
  const std::string* value = find_metadata(kChecksumKey);
  if (value == nullptr) {
    if (!required) return false;
    fail("no \"checksum\" metadata: the file was not written by shardopt or was edited; it cannot be verified");
  }
  const auto is_hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  if (value->size() != kChecksumPrefix.size() + 8 || value->compare(0, kChecksumPrefix.size(), kChecksumPrefix) != 0 ||
      !std::all_of(value->begin() + static_cast<std::ptrdiff_t>(kChecksumPrefix.size()), value->end(), is_hex))
    fail("\"checksum\" metadata \"" + *value + "\" is not of the form crc32c:XXXXXXXX (8 lower-case hex digits)");
  const std::uint32_t expected = static_cast<std::uint32_t>(std::stoul(value->substr(kChecksumPrefix.size()), nullptr, 16));
  const std::uint32_t actual = compute_checksum();
  if (actual != expected)
    fail("checksum mismatch: the header says " + *value + " but the " + std::to_string(data_bytes_) +
         "-byte data section has crc32c:" + hex8(actual) +
         ": the file is corrupt (a bad disk or an interrupted copy); restore it or use another checkpoint");
  return true;
}

}  // namespace shardopt
