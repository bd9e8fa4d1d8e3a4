// safetensors.hpp - streaming writer and random-access reader of safetensors files, the
// files of a checkpoint (docs/checkpoints.md).
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header
// {"__metadata__": {"k": "v", ...}, "NAME": {"dtype": "F32", "shape": [..],
// "data_offsets": [begin, end]}, ...} padded with spaces so that the data section starts
// at a multiple of 8 bytes, then the data section (offsets are relative to its start).
// The writer adds the metadata key "checksum" = "crc32c:XXXXXXXX", the CRC-32C of the
// data section, and the reader can verify it.
//
// Errors: a malformed or truncated file, or a bad call, throws Error(InvalidArgument)
// (OutOfRange for a read outside a tensor); a failing system call throws
// Error(InvalidState) (see file_io.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardopt/dtype.hpp"

namespace shardopt {

class AtomicFile;
class File;

/// Bytes per element of a safetensors dtype name ("F32" -> 4, "BF16" -> 2, "U8" -> 1,
/// "F8_E4M3" -> 1, "I64" -> 8, ...); 0 for a name this library does not know.
std::size_t safetensors_dtype_size(std::string_view dtype) noexcept;

/// The safetensors dtype name of a DType: F32, BF16, F16, F8_E4M3, F8_E5M2, F8_E8M0, U32.
const char* safetensors_dtype(DType t) noexcept;

/// The reader refuses a header longer than this (bytes).
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
/// The metadata key holding "crc32c:XXXXXXXX" (8 lower-case hex digits).
inline constexpr std::string_view kChecksumKey = "checksum";

/// One tensor of a file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;                 ///< safetensors name, e.g. "F32"
  std::vector<std::uint64_t> shape;  ///< empty for a scalar
  std::uint64_t begin = 0;           ///< byte range [begin, end) in the data section
  std::uint64_t end = 0;
  std::uint64_t bytes() const noexcept { return end - begin; }
};

/// Writes one safetensors file, streaming the data. Use:
///   SafetensorsWriter w(path);                 // creates PATH.tmp-<pid>
///   w.add_tensor("a", "F32", {4, 8}); ...      // declare every tensor, in data order
///   w.set_metadata("format", "...");           // string metadata ("checksum" is reserved)
///   w.write_header();                          // optional: the first write() does it
///   w.write(0, bytes, n); ...                  // each tensor's bytes in declaration order,
///                                              // in chunks of any size
///   w.finish();                                // patch the checksum, fsync, rename to PATH
/// Destroyed without finish() (an exception, an abandoned save), it removes the temp file.
class SafetensorsWriter {
 public:
  /// Creates the temporary file PATH.tmp-<pid> (the directory must exist).
  explicit SafetensorsWriter(std::string path);
  ~SafetensorsWriter();
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept;

  /// Declares the next tensor (before write_header); returns its index. Its byte size is
  /// product(shape) x the dtype's size. Names are unique and not "__metadata__".
  std::size_t add_tensor(std::string name, std::string dtype, std::vector<std::uint64_t> shape);
  /// Sets a metadata entry (before write_header); a later value for a key replaces it.
  void set_metadata(std::string key, std::string value);
  /// Writes the header. After it no tensor or metadata may be added.
  void write_header();
  /// Appends `n` bytes of tensor `index`. Tensors are filled in declaration order, each
  /// with exactly its declared size (empty tensors may be skipped).
  void write(std::size_t index, const void* data, std::size_t n);
  /// The same, naming the tensor.
  void write(std::string_view name, const void* data, std::size_t n);
  /// Checks every tensor is complete, writes the checksum into the header, fsyncs, closes,
  /// renames to path() and fsyncs the directory. Returns the data section's CRC-32C.
  std::uint32_t finish();

  /// The declared tensors, with their byte ranges.
  const std::vector<SafetensorsEntry>& tensors() const noexcept { return tensors_; }
  /// Index of a declared tensor; throws Error(InvalidArgument) if unknown.
  std::size_t index_of(std::string_view name) const;
  /// Where the data section starts in the file (valid after write_header).
  std::uint64_t data_offset() const noexcept { return data_offset_; }
  /// The size of the finished file (valid after write_header).
  std::uint64_t file_bytes() const noexcept { return data_offset_ + data_bytes_; }
  const std::string& path() const noexcept { return path_; }
  /// PATH.tmp-<pid>, where the data goes until finish().
  const std::string& temp_path() const noexcept { return temp_path_; }

 private:
  void require_usable(const char* what) const;
  void flush_buffer();
  // Appends n data bytes to the file and starts their writeback.
  void write_out(const void* data, std::size_t n);

  std::string path_;
  std::string temp_path_;
  std::unique_ptr<AtomicFile> file_;
  std::vector<SafetensorsEntry> tensors_;
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  bool header_written_ = false;
  bool finished_ = false;
  bool broken_ = false;          // a write failed: the file is unusable
  std::uint64_t data_offset_ = 0;
  std::uint64_t data_bytes_ = 0;
  std::uint64_t checksum_at_ = 0;  // file offset of the 8 hex digits to patch
  std::size_t current_ = 0;        // tensor being filled
  std::uint64_t written_ = 0;      // bytes of the data section written so far
  std::uint64_t in_file_ = 0;      // of those, the ones in the file (the rest wait in buffer_)
  std::uint32_t crc_ = 0;
  std::vector<char> buffer_;       // coalesces small writes
};

/// Opens a safetensors file, validates its header and reads tensor bytes with pread.
class SafetensorsReader {
 public:
  /// Opens and validates: header length <= kSafetensorsMaxHeaderBytes, JSON header,
  /// known dtypes, shape x dtype size == byte size, ranges that tile the data section
  /// without overlap or gap, and a file size that matches (a truncated file names the
  /// expected and the actual size).
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  const std::string& path() const noexcept { return path_; }
  /// Every tensor, in data-section order.
  const std::vector<SafetensorsEntry>& tensors() const noexcept { return tensors_; }
  /// A tensor by name, or nullptr.
  const SafetensorsEntry* find(std::string_view name) const noexcept;
  /// A tensor by name; throws Error(InvalidArgument) if absent.
  const SafetensorsEntry& tensor(std::string_view name) const;
  /// The header's "__metadata__" entries, in header order.
  const std::vector<std::pair<std::string, std::string>>& metadata() const noexcept { return metadata_; }
  /// A metadata value, or nullptr.
  const std::string* find_metadata(std::string_view key) const noexcept;
  /// Where the data section starts, its size, and the file size (their sum).
  std::uint64_t data_offset() const noexcept { return data_offset_; }
  std::uint64_t data_bytes() const noexcept { return data_bytes_; }
  std::uint64_t file_bytes() const noexcept { return data_offset_ + data_bytes_; }

  /// Reads `n` bytes of tensor `name` starting `offset` bytes into it (pread).
  /// Throws Error(OutOfRange) when the range is outside the tensor.
  void read(std::string_view name, std::uint64_t offset, void* out, std::size_t n) const;
  void read(const SafetensorsEntry& entry, std::uint64_t offset, void* out, std::size_t n) const;
  /// CRC-32C of the data section, streamed through a buffer of `chunk_bytes`.
  std::uint32_t compute_checksum(std::size_t chunk_bytes = std::size_t{4} << 20) const;
  /// Compares compute_checksum() with the "checksum" metadata. Throws Error(InvalidArgument)
  /// on a mismatch, a malformed value, or (when `required`) a missing one; returns false
  /// when it is missing and not required, true when it matches.
  bool verify_checksum(bool required = true) const;

 private:
  [[noreturn]] void fail(const std::string& what) const;
  void parse_header(std::string_view header);

  std::string path_;
  std::unique_ptr<File> file_;
  std::vector<SafetensorsEntry> tensors_;
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::uint64_t data_offset_ = 0;
  std::uint64_t data_bytes_ = 0;
};

}  // namespace shardopt
