// bench_checkpoint: checkpoint save, load and save_async stall of a DistributedAdam over
// the Llama-3.2-1B parameter set (bf16 params, f32 master and moments), one rank, each
// against a limit measured in the same process on the same bytes and the same disk:
//   save             vs  write() of the same byte count from pinned memory + fsync
//   load             vs  pread() of the checkpoint's files, from cold (pages evicted)
//   save_async stall vs  one pinned device-to-host copy of the same bytes
// Pages of the files are evicted (posix_fadvise DONTNEED after fsync) before every read.
//   bench_checkpoint [--dir D] [--results DIR] [--reps N] [--small] [--backend cuda|host]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/mpi_bench.hpp"
#include "common/results.hpp"
#include "core/memory.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/error.hpp"
#include "shardopt/presets.hpp"

namespace {
using namespace shardopt;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Drops the file's pages from the page cache so that the next read comes from the disk.
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void evict_dir(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) evict(e.path().string());
}

std::uint64_t dir_bytes(const std::string& dir) {
  std::uint64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.file_size();
  return n;
}

// The limit of a save: `bytes` from pinned memory into one new file, then fsync.
double plain_write_ms(const std::string& path, const DeviceBuffer& src, std::uint64_t bytes) {
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(ErrorCode::InvalidState, "cannot create " + path);
  constexpr std::size_t kChunk = std::size_t{32} << 20;
  for (std::uint64_t at = 0; at < bytes;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>({kChunk, bytes - at, src.bytes()}));
    const ssize_t w = ::write(fd, src.data(), n);
    if (w <= 0) throw Error(ErrorCode::InvalidState, "write failed on " + path);
    at += static_cast<std::uint64_t>(w);
  }
  (void)::fsync(fd);
  ::close(fd);
  return ms_since(t0);
}

// The limit of a load: every file of `dir` read once with pread into host memory.
double plain_read_ms(const std::string& dir, DeviceBuffer& dst) {
  const auto t0 = Clock::now();
  constexpr std::size_t kChunk = std::size_t{32} << 20;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    const std::uint64_t size = e.file_size();
    for (std::uint64_t at = 0; at < size;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size - at));
      const ssize_t r = ::pread(fd, dst.data(), std::min(n, dst.bytes()), static_cast<off_t>(at));
      if (r <= 0) break;
      at += static_cast<std::uint64_t>(r);
    }
    ::close(fd);
  }
  return ms_since(t0);
}

int run(int argc, char** argv) {
  std::string dir = "/tmp/shardopt-bench-ckpt", results, backend_name = "auto";
  int reps = 3;
  bool small = false;
  for (bench::ArgReader r(argc, argv); r.next();) {
    if (r.arg() == "--dir") dir = r.value();
    else if (r.arg() == "--results") results = r.value();
    else if (r.arg() == "--reps") reps = std::stoi(r.value());
    else if (r.arg() == "--small") small = true;
    else if (r.arg() == "--backend") backend_name = r.value();
    else r.unknown();
  }
  const Backend backend = backend_name == "host" ? Backend::Host
                          : backend_name == "cuda" ? Backend::Cuda
                                                   : (cuda_device_count() > 0 ? Backend::Cuda : Backend::Host);
  bench::MpiBench mb(backend);
  presets::TransformerShape shape = presets::kLlama32_1B;
  if (small) shape = presets::TransformerShape{64, 2, 128, 32, 1000};
  DistributedAdamOptions o;
  o.grad_dtype = DType::f32;
  DistributedAdam opt(mb.comm(), presets::transformer(shape), o);
  const Stream s = mb.stream();
  opt.init_master(s);
  std::filesystem::create_directories(dir);
  const std::string ckpt = dir + "/ckpt", ref = dir + "/plain.bin";
  const std::string config = std::string(small ? "small" : "llama-3.2-1b") + "/bf16-params/f32-moments/1-rank";

  // The checkpoint's size, from a first save (also the warm-up).
  opt.save(ckpt, s);
  const std::uint64_t bytes = dir_bytes(ckpt);
  DeviceBuffer pinned(backend, std::size_t{64} << 20, backend == Backend::Cuda ? MemoryKind::Pinned : MemoryKind::Host);
  std::vector<double> save_ms, write_ms, load_ms, read_ms;
  // Odd repetitions run ours before the limit, even ones after: neither side always
  // finds the disk (and the page cache) as the other left it.
  auto plain_write = [&] {
    write_ms.push_back(plain_write_ms(ref, pinned, bytes));
    evict(ref);
    std::filesystem::remove(ref);
  };
  auto our_save = [&] {
    const auto t0 = Clock::now();
    opt.save(ckpt, s);
    save_ms.push_back(ms_since(t0));
    evict_dir(ckpt);
  };
  auto plain_read = [&] {
    read_ms.push_back(plain_read_ms(ckpt, pinned));
    evict_dir(ckpt);
  };
  auto our_load = [&] {
    const auto t0 = Clock::now();
    (void)opt.load(ckpt, s);
    load_ms.push_back(ms_since(t0));
    evict_dir(ckpt);
  };
  for (int i = 0; i < reps; ++i) {
    if (i % 2 == 0) {
      plain_write();
      our_save();
      plain_read();
      our_load();
    } else {
      our_save();
      plain_write();
      our_load();
      plain_read();
    }
  }
  // The stall of save_async: the call returns once the state is in pinned memory.
  std::vector<double> stall_ms, copy_ms;
  if (backend == Backend::Cuda) {
    // The bytes save_async snapshots: master, two f32 moments and the bf16 parameter.
    const std::uint64_t state = static_cast<std::uint64_t>(opt.layout().param_numel()) * (4 + 4 + 4 + 2);
    DeviceBuffer dev(backend, static_cast<std::size_t>(state));
    DeviceBuffer host(backend, static_cast<std::size_t>(state), MemoryKind::Pinned);
    opt.save_async(ckpt, s).wait();  // allocates the snapshot buffer once
    for (int i = 0; i < reps; ++i) {
      auto t0 = Clock::now();
      copy_async(backend, host.data(), dev.data(), host.bytes(), s);
      synchronize(backend, s);
      copy_ms.push_back(ms_since(t0));
      t0 = Clock::now();
      SaveHandle h = opt.save_async(ckpt, s);
      synchronize(backend, s);
      stall_ms.push_back(ms_since(t0));
      h.wait();
    }
  }
  std::filesystem::remove_all(dir);
  if (mb.rank() != 0) return 0;
  const double gb = static_cast<double>(bytes) / 1e9;
  auto emit = [&](const char* what, const std::vector<double>& ours, const std::vector<double>& limit,
                  const char* limit_name) {
    bench::Result r;
    r.bench = "checkpoint";
    r.config = std::string(what) + "/" + config;
    r.device = mb.device();
    r.ours_ms = bench::median(ours);
    r.limit_ms = bench::median(limit);
    r.numbers["bytes"] = static_cast<double>(bytes);
    r.numbers["ours_GBps"] = gb / (*r.ours_ms / 1e3);
    r.numbers["limit_GBps"] = gb / (*r.limit_ms / 1e3);
    r.numbers["reps"] = reps;
    r.notes["limit"] = limit_name;
    r.command = bench::command_line(argc, argv);
    bench::write(r, results);
  };
  emit("save", save_ms, write_ms, "write() + fsync of the same byte count from pinned memory, same disk");
  emit("load", load_ms, read_ms, "pread() of the checkpoint's files from cold pages, same disk");
  if (!stall_ms.empty())
    emit("save_async_stall", stall_ms, copy_ms, "one pinned device-to-host copy of the same bytes");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::mpi_main(argc, argv, "bench_checkpoint", {}, [&] { return run(argc, argv); });
}
