#include "formats/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "shardopt/error.hpp"

namespace shardopt {
namespace {

const char* advice(int err) noexcept {
  switch (err) {
    case ENOSPC:
    case EDQUOT: return "the disk is full or over quota: free space or save to another directory";
    case EACCES:
    case EPERM: return "permission denied: fix the permissions of the file or directory, or choose another path";
    case EROFS: return "the file system is read-only: choose a writable directory";
    case ENOENT: return "no such file or directory: check the path and that its directory exists";
    case ENOTDIR: return "a component of the path is not a directory: check the path";
    case EISDIR: return "the path is a directory: give a file name";
    case EMFILE:
    case ENFILE: return "too many open files: raise the limit (ulimit -n) or close files";
    case EIO: return "the storage reported an I/O error: check the disk and the system log";
    case EXDEV: return "the temporary file and the target are on different file systems";
    default: return "check the path and the file system";
  }
}

}  // namespace

void throw_file_error(std::string_view call, const std::string& path, int err) {
  SHARDOPT_REQUIRE(false, ErrorCode::InvalidState,
                   std::string(call) + " failed on '" + path + "': " + std::strerror(err) + " (errno " +
                       std::to_string(err) + "); " + advice(err));
}

File File::open_read(const std::string& path) {
  int fd;
  do fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) throw_file_error("open (read)", path, errno);
  return File(fd, path);
}

File File::create(const std::string& path) {
  int fd;
  do fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) throw_file_error("open (create)", path, errno);
  return File(fd, path);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File::File(File&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

std::uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_file_error("fstat", path_, errno);
  return static_cast<std::uint64_t>(st.st_size);
}

namespace {
// Repeats `io(done, offset)` (a write/pwrite/pread of the bytes after `done`, returning
// what the call returns) until all `n` bytes are through, retrying EINTR. Returns the
// bytes done: less than n only when `io` returned 0 (end of file).
template <typename Io>
std::size_t transfer_all(std::size_t n, std::uint64_t offset, const char* call, const std::string& path, Io io) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = io(done, offset + done);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_file_error(call, path, errno);
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  return done;
}
}  // namespace

void File::write_all(const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  const std::size_t done = transfer_all(n, 0, "write", path_, [&](std::size_t d, std::uint64_t) {
    return ::write(fd_, p + d, n - d);
  });
  if (done < n) throw_file_error("write", path_, ENOSPC);
}

void File::pwrite_all(const void* data, std::size_t n, std::uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  const std::size_t done = transfer_all(n, offset, "pwrite", path_, [&](std::size_t d, std::uint64_t at) {
    return ::pwrite(fd_, p + d, n - d, static_cast<off_t>(at));
  });
  if (done < n) throw_file_error("pwrite", path_, ENOSPC);
}

void File::pread_exact(void* out, std::size_t n, std::uint64_t offset) const {
  auto* p = static_cast<char*>(out);
  const std::size_t done = transfer_all(n, offset, "pread", path_, [&](std::size_t d, std::uint64_t at) {
    return ::pread(fd_, p + d, n - d, static_cast<off_t>(at));
  });
  SHARDOPT_REQUIRE(done == n, ErrorCode::InvalidArgument,
                   "'" + path_ + "' ended at byte " + std::to_string(offset + done) + " while " +
                       std::to_string(n - done) + " more bytes were expected: the file was truncated or "
                       "is being rewritten");
}

void File::start_writeback(std::uint64_t offset, std::uint64_t n) noexcept {
#if defined(__linux__)
  if (fd_ >= 0 && n > 0)
    (void)::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
#else
  (void)offset;
  (void)n;
#endif
}

void File::sync() {
  if (::fsync(fd_) != 0) throw_file_error("fsync", path_, errno);
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = std::exchange(fd_, -1);
  // Linux closes the descriptor even when close() reports an error: never retry.
  if (::close(fd) != 0 && errno != EINTR) throw_file_error("close", path_, errno);
}

std::string temp_path_for(const std::string& path) {
  return path + ".tmp-" + std::to_string(static_cast<long>(::getpid()));
}

std::string parent_directory(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void fsync_directory(const std::string& dir) {
  int fd;
  do fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) throw_file_error("open (directory)", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL): nothing more can be done there.
  if (rc != 0 && err != EINVAL) throw_file_error("fsync (directory)", dir, err);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), file_(File::create(temp_path_for(path_))) {}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    const std::string tmp = file_.path();
    file_ = File();  // close
    if (!tmp.empty()) ::unlink(tmp.c_str());
  }
}

void AtomicFile::commit() {
  SHARDOPT_REQUIRE(!committed_, ErrorCode::InvalidState, "'" + path_ + "' was already committed");
  const std::string tmp = file_.path();
  file_.sync();
  file_.close();
  if (::rename(tmp.c_str(), path_.c_str()) != 0) throw_file_error("rename to '" + path_ + "'", tmp, errno);
  committed_ = true;
  fsync_directory(parent_directory(path_));
}

void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFile f(path);
  f.file().write_all(content.data(), content.size());
  f.commit();
}

std::string read_file(const std::string& path, std::size_t max_bytes) {
  const File f = File::open_read(path);
  const std::uint64_t size = f.size();
  SHARDOPT_REQUIRE(size <= max_bytes, ErrorCode::InvalidArgument,
                   "'" + path + "' has " + std::to_string(size) + " bytes, more than the limit of " +
                       std::to_string(max_bytes) + ": is it the right file?");
  std::string out(static_cast<std::size_t>(size), '\0');
  f.pread_exact(out.data(), out.size(), 0);
  return out;
}

}  // namespace shardopt
