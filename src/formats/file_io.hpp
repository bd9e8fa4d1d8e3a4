// file_io.hpp - POSIX file helpers for checkpoints: an RAII file descriptor with full
// reads and writes, an atomically published file (temp name, fsync, rename, fsync of the
// directory), and small whole-file reads and writes.
//
// Every failing system call throws Error(InvalidState) naming the call, the path, the
// system's message (strerror) and what to do (free disk space, fix permissions, ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace shardopt {

/// Throws Error(InvalidState): "CALL failed on 'PATH': strerror(err) (errno N); ADVICE".
[[noreturn]] void throw_file_error(std::string_view call, const std::string& path, int err);

/// An open file descriptor, closed by the destructor (errors there are ignored: call
/// close() to see them).
class File {
 public:
  File() = default;
  /// Opens an existing file read-only.
  static File open_read(const std::string& path);
  /// Creates (or truncates) a file for writing, mode 0644.
  static File create(const std::string& path);
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  bool is_open() const noexcept { return fd_ >= 0; }
  int fd() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }
  /// Current size in bytes (fstat).
  std::uint64_t size() const;
  /// Writes all `n` bytes at the current position (retries short writes and EINTR).
  void write_all(const void* data, std::size_t n);
  /// Writes all `n` bytes at `offset` without moving the position (pwrite).
  void pwrite_all(const void* data, std::size_t n, std::uint64_t offset);
  /// Reads exactly `n` bytes at `offset` (pread); throws if the file ends first.
  void pread_exact(void* out, std::size_t n, std::uint64_t offset) const;
  /// Starts writing bytes [offset, offset + n) back to the storage now, without waiting
  /// (Linux sync_file_range; nothing elsewhere). A large file written this way keeps the
  /// disk busy from its first bytes instead of from the kernel's dirty threshold, so the
  /// final sync() has little left to do. Errors show at sync().
  void start_writeback(std::uint64_t offset, std::uint64_t n) noexcept;
  /// fsync: the data and the size reach the storage.
  void sync();
  /// Closes now, throwing on failure (a deferred write error shows here).
  void close();

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

/// "PATH.tmp-<pid>": where a file is written before it is renamed to PATH.
std::string temp_path_for(const std::string& path);

/// The directory holding `path` ("." for a bare file name).
std::string parent_directory(const std::string& path);

/// fsyncs a directory, so that renames and creations in it are durable.
void fsync_directory(const std::string& dir);

/// A file written under temp_path_for(path) and published as `path` by commit(). Destroyed
/// without commit() (an error, an exception), it removes the temporary file.
class AtomicFile {
 public:
  /// Creates the temporary file.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// The temporary file being written.
  File& file() noexcept { return file_; }
  const std::string& path() const noexcept { return path_; }
  const std::string& temp_path() const noexcept { return file_.path(); }
  /// fsync, close, rename to path(), fsync the directory.
  void commit();
  bool committed() const noexcept { return committed_; }

 private:
  std::string path_;
  File file_;
  bool committed_ = false;
};

/// Writes `content` to `path` atomically (AtomicFile): readers see the old file or the
/// whole new one, never a part.
void write_file_atomic(const std::string& path, std::string_view content);

/// Reads a whole file; throws Error(InvalidArgument) when it is larger than `max_bytes`.
std::string read_file(const std::string& path, std::size_t max_bytes = std::size_t{1} << 30);

}  // namespace shardopt
