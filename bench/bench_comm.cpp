// bench_comm - bus bandwidth of the bucketed reduce-scatter and all-gather of a whole
// bf16 buffer (BucketStore, default bucket size) against one collective call on the
// same bytes, in the same run, on the same buffers.
//
//   mpirun -n 4 bench_comm --results bench/results            (CUDA + NCCL, one GPU per rank)
//   mpiexec -n 2 bench_comm --backend host --sizes-mib 1       (host backend smoke run)
//   mpirun -n 2 bench_comm --f32-accumulate --sizes-mib 16,64,256,1024 --results bench/results
//   mpirun -n 2 bench_comm --f32-accumulate --f32acc-chunks 1,2,4,0 --sizes-mib 256,1024
//
// --f32-accumulate measures only GradReducePrecision::F32Accumulate (issue 31), rows
// "comm_f32acc": the reduce-scatter of one whole bf16 buffer as an all-to-all of bf16
// pieces + the rank-ordered fp32 sum into an fp32 shard, against (a) one bf16
// ncclReduceScatter of the same bytes (busbw fraction = its time / ours) and (b) one fp32
// ncclReduceScatter of the upcast buffer (the FSDP2 reduce_dtype / Megatron way; the
// upcast itself is not timed); and the BucketStore's per-bucket F32Accumulate starts
// against its Native ones, each in every chunk count of --f32acc-chunks (default 1,0: one
// chunk, then the store's automatic choice; config suffix /k<K>, "auto" when chosen;
// docs/grad_reduce.md), after three phase rows that say where the time goes (the
// all-to-all alone; the sum alone, into fp32 and in place into bf16 as the store does; each
// against the bf16 reduce-scatter; the sums' rows also against their byte limit:
// limit_ms = their HBM bytes at the device-to-device copy rate measured at the start of
// the run, fraction_of_limit = limit_ms / ours_ms). Its buffers
// are used as the optimizers use theirs: the F32Accumulate store has parameters (its gradients only ever go through send/recv), the
// all-to-all sends from a buffer of its own, and each collective has its own buffer;
// both sides of the all-to-all registered, or neither (--memory registered,cudamalloc,
// as for the other rows). An earlier version built its F32Accumulate store without
// parameters (its registered gradients then also served in-place all-gathers) and sent
// from the Native store's gradients (also reduce-scattered): it stalled on 2 GPUs where
// the optimizers did not (docs/grad_reduce.md, "The bench_comm stall").
//
// It cannot hang silently: every rank prints a progress line before each step that may
// wait (building a store, each measurement's warm-up and timed loop) on stderr, which is
// unbuffered, with its rank and the milliseconds since the start; every wait for the
// device (the stores' construction warm-up included) goes through
// Communicator::synchronize under the communicator's wait_timeout (--wait-timeout-s,
// default 120; 0 turns it off), which aborts NCCL and throws Error(Timeout) naming the
// wait; and SIGUSR1 makes a rank print its last progress line and its main thread's stack
// (scripts/device_suite.sh sends it to a job past its deadline).
//
// busbw = bytes of the whole buffer / time * (n - 1) / n (nccl-tests' formula for both
// collectives). Two ways of starting the buckets are measured: one start per bucket (as
// grad_ready issues them during backward; config ".../registered") and all buckets in
// one NCCL group (start_grad_reduces / start_param_gathers; config ".../grouped"). Each timed iteration is bracketed by CUDA events on one stream, ours and
// the peer alternating back to back; an iteration's time is the slowest rank's, and the
// reported time is the median over the iterations. Configs: registered buffers
// (ncclMemAlloc + ncclCommRegister, the default) and cudaMalloc ones. Only rank 0 writes.
#include <execinfo.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/device_guard.hpp"
#include "core/memory.hpp"
#include "buffers/piece_reduce.hpp"
#include "kernels/common/kernel_files.hpp"
#include "kernels/common/piece_sum.hpp"
#include "cuda_bench.hpp"
#include "mpi_bench.hpp"
#include "results.hpp"
#include "shardopt/bucket_store.hpp"
#include "shardopt/error.hpp"
#include "shardopt/watchdog.hpp"

namespace {
using namespace shardopt;

struct Options {
  std::string results;
  Backend backend = Backend::Host;
  bool backend_given = false;
  std::vector<int> sizes_mib = {64, 256, 1024};
  int iters = 50;
  int warmup = 5;
  std::vector<bool> registered = {true, false};
  bool f32_accumulate = false;  // --f32-accumulate: only the F32Accumulate rows
  std::vector<int> f32acc_chunks = {1, 0};  // --f32acc-chunks: the chunk counts measured (0: automatic)
  int wait_timeout_s = 120;      // --wait-timeout-s: the communicator's wait_timeout (0: off)
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_comm: %s\n"
               "usage: bench_comm [--results DIR] [--backend cuda|host] [--sizes-mib 64,256,1024]\n"
               "                  [--iters N>=1] [--warmup N] [--memory registered,cudamalloc]\n"
               "                  [--f32-accumulate] [--f32acc-chunks 1,0 (0: automatic, up to 16)]\n"
               "                  [--wait-timeout-s N (0: none)]\n",
               why);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  auto fail = [](const std::string& arg, bench::ArgReader::Problem problem) {
    usage(((problem == bench::ArgReader::Problem::MissingValue ? "missing value after " : "unknown argument ") + arg)
              .c_str());
  };
  for (bench::ArgReader r(argc, argv, fail); r.next();) {
    const std::string& a = r.arg();
    if (a == "--results") {
      o.results = r.value();
    } else if (a == "--backend") {
      const std::string v = r.value();
      if (v != "cuda" && v != "host") usage("--backend must be cuda or host");
      o.backend = v == "cuda" ? Backend::Cuda : Backend::Host;
      o.backend_given = true;
    } else if (a == "--sizes-mib") {
      o.sizes_mib.clear();
      for (const auto& s : split_list(r.value())) o.sizes_mib.push_back(std::atoi(s.c_str()));
      for (int s : o.sizes_mib)
        if (s <= 0) usage("sizes must be positive MiB");
    } else if (a == "--iters") {
      o.iters = std::atoi(r.value().c_str());
      if (o.iters < 1) usage("--iters must be >= 1");
    } else if (a == "--warmup") {
      o.warmup = std::max(0, std::atoi(r.value().c_str()));
    } else if (a == "--f32-accumulate") {
      o.f32_accumulate = true;
    } else if (a == "--f32acc-chunks") {
      o.f32acc_chunks.clear();
      for (const auto& c : split_list(r.value())) o.f32acc_chunks.push_back(std::atoi(c.c_str()));
      if (o.f32acc_chunks.empty()) usage("--f32acc-chunks needs at least one count");
      for (int c : o.f32acc_chunks)
        if (c < 0 || c > 16) usage("--f32acc-chunks takes counts from 0 (automatic) to 16");
    } else if (a == "--wait-timeout-s") {
      o.wait_timeout_s = std::atoi(r.value().c_str());
      if (o.wait_timeout_s < 0) usage("--wait-timeout-s must be >= 0");
    } else if (a == "--memory") {
      o.registered.clear();
      for (const auto& s : split_list(r.value())) {
        if (s != "registered" && s != "cudamalloc") usage("--memory takes registered and/or cudamalloc");
        o.registered.push_back(s == "registered");
      }
    } else {
      r.unknown();
    }
  }
  if (!o.backend_given) o.backend = default_backend();
  if (o.backend == Backend::Host) o.registered = {false};
  return o;
}

// bf16 parameters of 2048 x 2048 (4 Mi elements, a transformer-ish tensor) filling
// `mib` MiB; a smaller last one takes the rest.
std::vector<ParamSpec> specs_for(int mib) {
  const std::int64_t total = static_cast<std::int64_t>(mib) * (1 << 20) / 2;
  const std::int64_t piece = std::min<std::int64_t>(total, 1 << 22);
  std::vector<ParamSpec> specs;
  for (std::int64_t done = 0, i = 0; done < total; ++i) {
    const std::int64_t n = std::min(piece, total - done);
    std::string name = "w";
    name += std::to_string(i);  // (not "w" + ...: GCC 12 warns falsely about that)
    specs.push_back(ParamSpec::tensor(std::move(name), {n}, DType::bf16));
    done += n;
  }
  return specs;
}

// Per-iteration milliseconds of `ours` and `peer`, alternating back to back on `stream`.
struct Times {
  std::vector<double> ours, peer;
};

void progress(int rank, const std::string& what);

// Every wait for the device is the communicator's (bounded by its wait_timeout). A
// non-empty `label` prints a progress line before each wait.
Times measure(const Communicator& comm, Stream stream, int iters, int warmup, const std::function<void()>& ours,
              const std::function<void()>& peer, const std::string& label = "") {
  const Backend be = comm.backend();
  for (int w = 0; w < warmup; ++w) {
    ours();
    peer();
  }
  if (!label.empty()) progress(comm.rank(), label + ": warm-up enqueued, waiting for it");
  comm.synchronize(stream);
  MPI_Barrier(MPI_COMM_WORLD);
  Times t;
  t.ours.resize(static_cast<std::size_t>(iters));
  t.peer.resize(static_cast<std::size_t>(iters));
  if (be == Backend::Host) {
    using clock = std::chrono::steady_clock;
    for (int i = 0; i < iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto a = clock::now();
      ours();
      const auto b = clock::now();
      MPI_Barrier(MPI_COMM_WORLD);
      const auto c = clock::now();
      peer();
      const auto d = clock::now();
      t.ours[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::milli>(b - a).count();
      t.peer[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::milli>(d - c).count();
    }
    if (!label.empty()) progress(comm.rank(), label + ": timed loop done");
  } else {
    bench::EventMarks ev(2 * iters + 1);
    ev.record(0, stream);
    for (int i = 0; i < iters; ++i) {
      ours();
      ev.record(2 * i + 1, stream);
      peer();
      ev.record(2 * i + 2, stream);
    }
    if (!label.empty()) progress(comm.rank(), label + ": timed loop enqueued, waiting for it");
    comm.synchronize(stream);
    for (int i = 0; i < iters; ++i) {
      t.ours[static_cast<std::size_t>(i)] = ev.ms(2 * i, 2 * i + 1);
      t.peer[static_cast<std::size_t>(i)] = ev.ms(2 * i + 1, 2 * i + 2);
    }
  }
  // An iteration lasts as long as its slowest rank.
  MPI_Allreduce(MPI_IN_PLACE, t.ours.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, t.peer.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

// ---------------------------------------------------------------- hang evidence

// What this rank was doing last (progress()), for the SIGUSR1 stack dump.
char g_doing[256] = "starting";
int g_rank = -1;
const auto g_start = std::chrono::steady_clock::now();

// Records what this rank starts now and prints it on stderr (unbuffered: a line is out
// before the next call), with the rank and the milliseconds since the start, so that a
// job that stops shows where each rank is.
void progress(int rank, const std::string& what) {
  std::snprintf(g_doing, sizeof g_doing, "%s", what.c_str());
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - g_start);
  std::fprintf(stderr, "bench_comm: [rank %d +%lld ms] %s\n", rank, static_cast<long long>(ms.count()), what.c_str());
}

// SIGUSR1: this rank's last progress and its main thread's stack, on stderr (the kernel
// hands a process-directed signal to the main thread unless that thread blocks it).
void print_stack(int) {
  char head[384];
  const int len = std::snprintf(head, sizeof head, "---- bench_comm rank %d (SIGUSR1), last: %s\n", g_rank, g_doing);
  if (len > 0) (void)!write(STDERR_FILENO, head, static_cast<std::size_t>(std::min<int>(len, sizeof head - 1)));
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
}

void install_stack_dump() {
  void* warm[1];
  (void)backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  std::signal(SIGUSR1, print_stack);
}

// ---------------------------------------------------------------- F32Accumulate

// One row of the F32Accumulate comparisons; `goal` says what peer_over_ours should reach.
// `chunks` (0: not chunked, a phase row) and `chunks_asked` (0: the automatic choice).
// `limit`: a phase row's byte limit (its HBM bytes at the copy bandwidth), where known.
struct ByteLimit {
  double bytes = 0;       // read + written by the measured phase, per rank
  double copy_gbps = 0;   // device-to-device copy rate of this process (read + write); 0: unknown
};

void write_f32acc_row(const std::string& config, const Times& t, const std::string& peer, const std::string& goal,
                      double bytes, int n, const std::string& device, const std::string& command,
                      const std::string& results, int nb, int chunks, int chunks_asked, const ByteLimit& limit = {}) {
  bench::Result r;
  r.bench = "comm_f32acc";
  r.config = config;
  r.device = device;
  r.ours_ms = bench::median(t.ours);
  r.peer_ms = bench::median(t.peer);
  if (limit.copy_gbps > 0) {  // fraction_of_limit = limit_ms / ours_ms (results.cpp)
    r.limit_ms = limit.bytes / (limit.copy_gbps * 1e6);
    r.numbers["hbm_bytes"] = limit.bytes;
    r.numbers["copy_GBps"] = limit.copy_gbps;
  }
  r.peer = peer;
  const double factor = static_cast<double>(n - 1) / n;
  r.numbers["busbw_GBps"] = bytes / (*r.ours_ms * 1e-3) / 1e9 * factor;  // on the bf16 bytes
  r.numbers["peer_busbw_GBps"] = bytes / (*r.peer_ms * 1e-3) / 1e9 * factor;
  r.numbers["peer_over_ours"] = *r.peer_ms / *r.ours_ms;  // busbw fraction vs bf16; speedup vs f32
  r.numbers["bf16_bytes"] = bytes;
  r.numbers["buckets"] = nb;
  if (chunks > 0) {
    r.numbers["chunks"] = chunks;
    r.notes["chunks_asked"] = chunks_asked > 0 ? std::to_string(chunks_asked) : "auto";
  }
  r.notes["goal"] = goal;
  r.command = command;
  bench::write(r, results);
}

// GradReducePrecision::F32Accumulate against NCCL's bf16 and fp32 reduce-scatters, and
// the store's bucketed F32Accumulate against its bucketed Native (see the top), for one
// size and one kind of memory: first where the time goes (the all-to-all alone and the
// sum alone, each against the bf16 reduce-scatter), then the whole reduce in each chunk
// count of --f32acc-chunks (0: the store's automatic choice for that piece size).
void f32_accumulate_size(const Options& opt, const Communicator& comm, Stream stream, int mib, bool registered,
                         double copy_gbps, const std::string& device, const std::string& command,
                         const std::string& results) {
  const int n = comm.size();
  const int rank = comm.rank();
  const bool cuda = opt.backend == Backend::Cuda;
  const std::string memory = !cuda ? "host" : registered ? "registered" : "cudamalloc";
  const std::string at = std::to_string(mib) + " MiB, " + std::to_string(n) + " ranks, " + memory + ": ";
  const Layout layout(specs_for(mib), n);
  const std::int64_t numel = layout.buffers()[0].numel;
  const std::int64_t per_rank = numel / n;
  const double bytes = static_cast<double>(numel) * 2.0;
  const int nb = static_cast<int>(layout.buckets().size());
  BucketStoreOptions so;
  so.grad_dtype = DType::bf16;
  so.grad_reduce = ReduceOp::Average;
  so.nccl_registered = registered;
  progress(rank, at + "building the Native store");
  so.with_params = false;  // its gradients serve collectives only (the bf16 reduce-scatter)
  BucketStore native(comm, layout, so);
  // The all-to-all's own buffers (used by nothing else), both registered or neither.
  const MemoryKind kind = registered ? MemoryKind::NcclDevice : MemoryKind::Device;
  DeviceBuffer send(opt.backend, static_cast<std::size_t>(numel) * 2, kind);
  DeviceBuffer pieces(opt.backend, static_cast<std::size_t>(numel) * 2, kind);
  BufferRegistration send_registration, pieces_registration;
  if (registered) {
    send_registration = comm.register_buffer(send.data(), send.bytes());
    pieces_registration = comm.register_buffer(pieces.data(), pieces.bytes());
  }
  DeviceBuffer sums(opt.backend, static_cast<std::size_t>(per_rank) * 4);
  DeviceBuffer upcast(opt.backend, static_cast<std::size_t>(numel) * 4);
  for (const DeviceBuffer* b : {&send, &pieces, &sums, &upcast})
    fill_zero_async(opt.backend, b->data(), b->bytes(), stream);
  void* grads = native.grad_buffer(0);
  detail::PieceReduce whole;  // the whole buffer as one bucket, the sum into fp32 (as Fsdp's f32 grads)
  whole.data = send.data();
  whole.pieces = pieces.data();
  whole.count = per_rank;
  whole.dtype = DType::bf16;
  whole.average = true;
  whole.out = sums.data();
  whole.out_dtype = DType::f32;
  const auto bf16_rs = [&] { comm.reduce_scatter(grads, per_rank, DType::bf16, ReduceOp::Average, stream); };
  const std::string nccl = cuda ? "nccl" : "MPI ";
  const std::string base = std::to_string(mib) + "MiB/n" + std::to_string(n) + "/" + memory;
  const std::string vs_bf16_peer = "one " + nccl + "ReduceScatter of the bf16 buffer (Average)";

  // Where the time goes: each phase alone, against the bf16 reduce-scatter.
  const Times move = measure(comm, stream, opt.iters, opt.warmup, [&] {
    comm.all_to_all_peers(send.data(), pieces.data(), per_rank, DType::bf16, stream);
  }, bf16_rs, at + "the all-to-all alone vs one bf16 reduce-scatter");
  kernels::PieceSum sum_all;  // the unchunked sum of the whole buffer
  sum_all.pieces = pieces.data();
  char* own_piece = send.as<char>() + static_cast<std::size_t>(rank * per_rank) * 2;
  sum_all.own = own_piece;
  sum_all.own_index = rank;
  sum_all.piece_dtype = DType::bf16;
  sum_all.n = n;
  sum_all.count = per_rank;
  sum_all.average = true;
  sum_all.out = sums.data();
  sum_all.out_dtype = DType::f32;
  const Times add = measure(comm, stream, opt.iters, opt.warmup, [&] {
    kernels::piece_sum(sum_all, opt.backend, stream);
  }, bf16_rs, at + "the fp32 sum alone vs one bf16 reduce-scatter");
  // The store's sum: bf16 pieces into this rank's own piece, in place (bf16 out).
  kernels::PieceSum sum_in_place = sum_all;
  sum_in_place.out = own_piece;
  sum_in_place.out_dtype = DType::bf16;
  const Times add_in_place = measure(comm, stream, opt.iters, opt.warmup, [&] {
    kernels::piece_sum(sum_in_place, opt.backend, stream);
  }, bf16_rs, at + "the bf16 sum in place alone vs one bf16 reduce-scatter");
  const double sum_read = static_cast<double>(n) * static_cast<double>(per_rank) * 2.0;
  const ByteLimit f32_limit{sum_read + static_cast<double>(per_rank) * 4.0, copy_gbps};
  const ByteLimit bf16_limit{sum_read + static_cast<double>(per_rank) * 2.0, copy_gbps};
  if (rank == 0) {
    write_f32acc_row("phase/alltoall-vs-bf16/" + base, move, vs_bf16_peer,
                     "the all-to-all alone (same network bytes as the reduce-scatter); peer_over_ours near 1 "
                     "means the network part is at the bf16 reduce-scatter's speed",
                     bytes, n, device, command, results, 1, 0, 0);
    write_f32acc_row("phase/sum-vs-bf16/" + base, add, vs_bf16_peer,
                     "the fp32 sum alone (reads n bf16 pieces, writes the fp32 shard: (2n + 4) * count bytes); "
                     "fraction_of_limit = those bytes at the copy rate / its time: near 1 at its byte limit",
                     bytes, n, device, command, results, 1, 0, 0, f32_limit);
    write_f32acc_row("phase/sum-inplace-bf16-vs-bf16/" + base, add_in_place, vs_bf16_peer,
                     "the store's sum alone (n bf16 pieces, the own one where it lies, summed into it: "
                     "(2n + 2) * count bytes); fraction_of_limit near 1 at its byte limit",
                     bytes, n, device, command, results, 1, 0, 0, bf16_limit);
  }

  for (const int asked : opt.f32acc_chunks) {
    const int k = asked > 0 ? asked : detail::auto_piece_chunks(static_cast<std::size_t>(per_rank) * 2);
    const std::string tag = base + "/k" + std::to_string(k) + (asked > 0 ? "" : "auto");
    detail::PieceReducer reducer(opt.backend, k);
    const auto ours = [&] { reducer.run(comm, whole, k, stream); };
    const Times vs_bf16 = measure(comm, stream, opt.iters, opt.warmup, ours, bf16_rs,
                                  at + std::to_string(k) + " chunks: all-to-all + fp32 sum vs one bf16 reduce-scatter");
    const Times vs_f32 = measure(comm, stream, opt.iters, opt.warmup, ours, [&] {
      comm.reduce_scatter(upcast.data(), per_rank, DType::f32, ReduceOp::Average, stream);
    }, at + std::to_string(k) + " chunks: all-to-all + fp32 sum vs one fp32 reduce-scatter of the upcast buffer");
    progress(rank, at + "building the F32Accumulate store, grad_reduce_chunks " + std::to_string(asked));
    BucketStoreOptions fo = so;
    fo.with_params = true;  // as the optimizers: its gradients serve send/recv only
    fo.grad_reduce_precision = GradReducePrecision::F32Accumulate;
    fo.grad_reduce_chunks = asked;
    BucketStore f32(comm, layout, fo);
    const Times stores = measure(
        comm, stream, opt.iters, opt.warmup,
        [&] {
          for (int b = 0; b < nb; ++b) f32.start_grad_reduce(b, stream);
          for (int b = 0; b < nb; ++b) f32.wait_grad_reduce(b, stream);
        },
        [&] {
          for (int b = 0; b < nb; ++b) native.start_grad_reduce(b, stream);
          for (int b = 0; b < nb; ++b) native.wait_grad_reduce(b, stream);
        },
        at + "the stores' per-bucket reduces (" + std::to_string(nb) + " buckets), F32Accumulate vs Native");
    if (rank != 0) continue;
    write_f32acc_row("reduce_scatter/f32acc-vs-bf16/" + tag, vs_bf16, vs_bf16_peer,
                     "peer_over_ours = F32Accumulate's fraction of the bf16 bus bandwidth: >= 0.9 at 256 MiB and up",
                     bytes, n, device, command, results, 1, k, asked);
    write_f32acc_row("reduce_scatter/f32acc-vs-f32/" + tag, vs_f32,
                     "one " + nccl + "ReduceScatter of the fp32 upcast buffer (Average; upcast not timed)",
                     "peer_over_ours = speedup over the fp32 reduce-scatter: >= 1.6", bytes, n, device, command,
                     results, 1, k, asked);
    const int bucket_chunks = nb > 0 ? f32.grad_reduce_chunks(0) : 1;
    write_f32acc_row("bucket_store/f32acc-vs-native/" + base + "/k" + std::to_string(bucket_chunks) +
                         (asked > 0 ? "" : "auto"),
                     stores, "the BucketStore's Native per-bucket reduce-scatters of the same buffer",
                     "peer_over_ours within 5% of 1 makes F32Accumulate the default for bf16 grads (docs/grad_reduce.md)",
                     bytes, n, device, command, results, nb, bucket_chunks, asked);
  }
  progress(rank, at + "done");
}

void f32_accumulate_rows(const Options& opt, const Communicator& comm, Stream stream, const std::string& device,
                         const std::string& command, const std::string& results) {
  detail::DeviceGuard guard(comm.device());  // the sum kernels load into this rank's device
  kernels::load_step_kernels(opt.backend);  // before any collective (kernels/common/kernel_files.hpp)
  // The phases' byte limits: this device's copy rate, measured here (0: host backend, no limit).
  double copy_gbps = 0;
  if (opt.backend == Backend::Cuda) {
    progress(comm.rank(), "measuring the device-to-device copy rate (1 GiB)");
    copy_gbps = bench::measure_copy(std::size_t{1} << 30, stream, opt.iters, opt.warmup).gbps;
    progress(comm.rank(), "copy rate " + std::to_string(copy_gbps) + " GB/s (read + write)");
  }
  for (int mib : opt.sizes_mib)
    for (bool registered : opt.registered)
      f32_accumulate_size(opt, comm, stream, mib, registered, copy_gbps, device, command, results);
}

int run(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  const bench::MpiBench mb(opt.backend);
  const Communicator& comm = mb.comm();
  const Stream stream = mb.stream();
  const int n = comm.size(), rank = mb.rank();
  const std::string device = mb.device();
  const std::string command = bench::command_line(argc, argv);
  const std::string results = rank == 0 ? opt.results : "";
  if (!results.empty()) std::filesystem::create_directories(results);
  g_rank = rank;
  WatchdogOptions watchdog = comm.watchdog();
  watchdog.wait_timeout = std::chrono::seconds(opt.wait_timeout_s);
  comm.set_watchdog(watchdog);

  const bool nccl = opt.backend == Backend::Cuda;
  if (opt.f32_accumulate) {
    f32_accumulate_rows(opt, comm, stream, device, command, results);
    return 0;
  }

  for (int mib : opt.sizes_mib) {
    const Layout layout(specs_for(mib), n);
    SHARDOPT_REQUIRE(layout.buffers().size() == 1, ErrorCode::Internal, "expected one bf16 buffer");
    const std::int64_t numel = layout.buffers()[0].numel;
    const double bytes = static_cast<double>(numel) * 2.0;
    const int nb = static_cast<int>(layout.buckets().size());
    for (bool registered : opt.registered) {
      BucketStoreOptions so;
      so.grad_dtype = DType::bf16;
      so.grad_reduce = ReduceOp::Sum;  // nccl-tests' op
      so.nccl_registered = registered;
      BucketStore store(comm, layout, so);
      void* grads = store.grad_buffer(0);
      void* params = store.param_buffer(0);

      // Per-bucket starts (as grad_ready issues them during backward) and grouped starts
      // (start_grad_reduces / start_param_gathers: one NCCL group), each against the
      // single call, measured in the same loop.
      for (const bool grouped : {false, true}) {
        const Times rs = measure(
            comm, stream, opt.iters, opt.warmup,
            [&] {
              if (grouped) {
                store.start_grad_reduces(0, nb, stream);
              } else {
                for (int b = 0; b < nb; ++b) store.start_grad_reduce(b, stream);
              }
              for (int b = 0; b < nb; ++b) store.wait_grad_reduce(b, stream);
            },
            [&] { comm.reduce_scatter(grads, numel / n, DType::bf16, ReduceOp::Sum, stream); });
        const Times ag = measure(
            comm, stream, opt.iters, opt.warmup,
            [&] {
              if (grouped) {
                store.start_param_gathers(0, nb, stream);
              } else {
                for (int b = 0; b < nb; ++b) store.start_param_gather(b, stream);
              }
              for (int b = 0; b < nb; ++b) store.wait_param_gather(b, stream);
            },
            [&] { comm.all_gather(params, numel / n, DType::bf16, stream); });

        const std::string memory = !nccl ? "host" : registered ? "registered" : "cudamalloc";
        for (const bool is_rs : {true, false}) {
          const Times& t = is_rs ? rs : ag;
          bench::Result r;
          r.bench = "comm_buckets";
          r.config = std::string(is_rs ? "reduce_scatter" : "all_gather") + "/bf16/" + std::to_string(mib) + "MiB/n" +
                     std::to_string(n) + "/" + memory + (grouped ? "/grouped" : "");
          r.device = device;
          r.ours_ms = bench::median(t.ours);
          r.peer_ms = bench::median(t.peer);
          r.peer = std::string("one ") +
                   (nccl ? (is_rs ? "ncclReduceScatter" : "ncclAllGather")
                         : (is_rs ? "MPI_Reduce_scatter_block" : "MPI_Allgather")) +
                   " on the same bytes";
          const double factor = static_cast<double>(n - 1) / n;
          r.numbers["busbw_GBps"] = bytes / (*r.ours_ms * 1e-3) / 1e9 * factor;
          r.numbers["peer_busbw_GBps"] = bytes / (*r.peer_ms * 1e-3) / 1e9 * factor;
          r.numbers["buckets"] = nb;
          r.numbers["bytes"] = bytes;
          r.numbers["iterations"] = opt.iters;
          r.notes["starts"] = grouped ? "one group of all buckets (start_grad_reduces / start_param_gathers)"
                                      : "one start per bucket";
          r.command = command;
          if (rank == 0) bench::write(r, results);
        }
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // result rows leave line by line, even into a pipe
  // Shared machines: never NVLink multicast (NVLS) in our runs.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  install_stack_dump();
  bench::MpiMainOptions mo;
  mo.serialized = true;
  mo.abort_on_error = true;
  return bench::mpi_main(argc, argv, "bench_comm", mo, [&] { return run(argc, argv); });
}
