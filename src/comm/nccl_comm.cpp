// The NCCL backend: every collective is enqueued on the caller's stream (so it can be
// captured into a CUDA graph); the host-blocking helpers (barrier, all_gather_value)
// run on a private stream and wait for it by polling, against the group's deadline and
// NCCL's asynchronous errors (a missed deadline aborts the communicator, which ends the
// NCCL kernels still waiting for a peer).
#include "comm/nccl_comm.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/abort_wait.hpp"
#include "comm/registered_ranges.hpp"
#include "core/check.hpp"
#include "core/device_guard.hpp"
#include "core/streams.hpp"

namespace shardopt {

#if SHARDOPT_HAVE_NCCL
static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId::bytes), "UniqueId must hold an ncclUniqueId");
#endif

UniqueId UniqueId::create() {
#if SHARDOPT_HAVE_NCCL
  ncclUniqueId nid;
  SHARDOPT_NCCL_CHECK(ncclGetUniqueId(&nid));
  UniqueId id;
  std::memcpy(id.bytes.data(), &nid, sizeof nid);
  return id;
#else
  SHARDOPT_REQUIRE(false, ErrorCode::Unsupported,
                   "UniqueId::create(): this build of shardopt has no NCCL; rebuild with CUDA and NCCL");
#endif
}

namespace detail {

#if SHARDOPT_HAVE_NCCL
namespace {

ncclDataType_t reduce_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::u32: return ncclUint32;
    case DType::e8m0: return ncclUint8;  // Max only (checked by CommImpl): MXFP8 scale bytes
    default: break;
  }
  throw Error(ErrorCode::Internal, std::string("no NCCL reduction type for ") + to_string(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Average: return ncclAvg;  // floats: each input pre-multiplied by 1/size, then summed
    case ReduceOp::Max: return ncclMax;
  }
  throw Error(ErrorCode::Internal, "unknown ReduceOp");
}

// Device scratch of the barrier (one float is all-reduced).
constexpr std::size_t kScratchBytes = 256;
// all_gather_value's first staging size (an options agreement on up to a few hundred ranks).
constexpr std::size_t kValueStagingBytes = 64 * 1024;

class NcclCommImpl final : public CommImpl {
 public:
  // Takes ownership of `comm`; aborts it if the rest of the setup fails.
  NcclCommImpl(ncclComm_t comm, int rank, int size, int device)
      : CommImpl(Backend::Cuda, rank, size, device), comm_(comm) {
    try {
      DeviceGuard guard(device);
      SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&aux_, cudaStreamNonBlocking));
      SHARDOPT_CUDA_CHECK(cudaMalloc(&scratch_, kScratchBytes));
      SHARDOPT_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, kScratchBytes, aux_));
      reserve_value_staging(kValueStagingBytes);
      // NCCL connects peers lazily, at the first collective that needs them; run one
      // eagerly here so that no captured collective is ever the first.
      SHARDOPT_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, aux_));
      SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(aux_));
    } catch (...) {
      release(/*abort=*/true);
      throw;
    }
  }

  ~NcclCommImpl() override {
    if (abort_thread_.joinable()) {
      // Not joined: ncclCommAbort may wait for the CUDA graphs that still hold this
      // communicator, which the trainer may destroy later. Past abort_issued_ the thread
      // no longer touches this object.
      while (!abort_issued_.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
      abort_thread_.detach();
    }
    release(/*abort=*/false);
  }

  ncclComm_t handle() const noexcept { return comm_.load(std::memory_order_acquire); }

 protected:
  void do_reduce_scatter(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    if (fault_armed() && inject_fault(OperationLabel::named("reduce_scatter"))) return;
    DeviceGuard guard(device());
    const Use use(*this);
    char* base = static_cast<char*>(data);
    void* mine = base + static_cast<std::size_t>(rank()) * static_cast<std::size_t>(count) * size_of(dtype);
    SHARDOPT_NCCL_CHECK(ncclReduceScatter(base, mine, static_cast<std::size_t>(count), reduce_type(dtype),
                                          nccl_op(op), use.get(), cuda(stream)));
    check_async(use.get());
  }

  void do_all_gather(void* data, std::int64_t count, DType dtype, Stream stream) override {
    if (fault_armed() && inject_fault(OperationLabel::named("all_gather"))) return;
    DeviceGuard guard(device());
    // An all-gather only moves bytes: gather every dtype (fp8 and e8m0 scales included) as bytes.
    const std::size_t bytes = static_cast<std::size_t>(count) * size_of(dtype);
    char* base = static_cast<char*>(data);
    const Use use(*this);
    SHARDOPT_NCCL_CHECK(ncclAllGather(base + static_cast<std::size_t>(rank()) * bytes, base, bytes, ncclUint8,
                                      use.get(), cuda(stream)));
    check_async(use.get());
  }

  // One NCCL group of a send and a receive per peer (a nested group when the caller
  // groups): piece r of `send` to rank r, rank r's piece into piece r of `recv` (pieces
  // at their strides). The own piece goes through NCCL too (a self send/recv), so the
  // call is one launch; without `own` the group has no self send/recv. Both buffers
  // registered or neither (registered_ranges.hpp says why).
  void do_all_to_all(const void* send, void* recv, std::int64_t count, DType dtype, Stream stream, bool own,
                     std::int64_t send_stride, std::int64_t recv_stride) override {
    const std::size_t esize = size_of(dtype);
    const std::size_t bytes = static_cast<std::size_t>(count) * esize;
    const auto last = static_cast<std::size_t>(size() - 1);
    const bool send_registered = registered_.covers(send, last * static_cast<std::size_t>(send_stride) * esize + bytes);
    const bool recv_registered = registered_.covers(recv, last * static_cast<std::size_t>(recv_stride) * esize + bytes);
    SHARDOPT_REQUIRE(send_registered == recv_registered, ErrorCode::InvalidArgument,
                     std::string("all_to_all: the ") + (send_registered ? "send" : "receive") +
                         " buffer is registered with this communicator (Communicator::register_buffer) but the " +
                         (send_registered ? "receive" : "send") +
                         " buffer is not; NCCL needs both buffers of a send/recv registered, or neither (it "
                         "leaves a mix undefined): register the other buffer too, or neither");
    if (fault_armed() && inject_fault(OperationLabel::named("all_to_all"))) return;
    DeviceGuard guard(device());
    const auto* from = static_cast<const char*>(send);
    auto* to = static_cast<char*>(recv);
    const Use use(*this);
    SHARDOPT_NCCL_CHECK(ncclGroupStart());
    ncclResult_t first = ncclSuccess;
    for (int r = 0; r < size() && first == ncclSuccess; ++r) {
      if (r == rank() && !own) continue;
      const auto at = static_cast<std::size_t>(r) * esize;
      first = ncclSend(from + at * static_cast<std::size_t>(send_stride), bytes, ncclUint8, r, use.get(), cuda(stream));
      if (first == ncclSuccess)
        first = ncclRecv(to + at * static_cast<std::size_t>(recv_stride), bytes, ncclUint8, r, use.get(), cuda(stream));
    }
    const ncclResult_t end = ncclGroupEnd();  // the group is closed whatever happened inside
    SHARDOPT_NCCL_CHECK(first);
    SHARDOPT_NCCL_CHECK(end);
    check_async(use.get());
  }

  void do_all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    if (fault_armed() && inject_fault(OperationLabel::named("all_reduce"))) return;
    DeviceGuard guard(device());
    const Use use(*this);
    SHARDOPT_NCCL_CHECK(ncclAllReduce(data, data, static_cast<std::size_t>(count), reduce_type(dtype), nccl_op(op),
                                      use.get(), cuda(stream)));
    check_async(use.get());
  }

  void do_barrier() override {
    if (fault_armed() && inject_fault(OperationLabel::named("barrier"))) return;
    DeviceGuard guard(device());
    {
      const Use use(*this);
      SHARDOPT_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, use.get(), aux_));
    }
    wait_aux("barrier");
  }

  std::shared_ptr<CommImpl> do_split(int color, int key) override {
    DeviceGuard guard(device());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    ncclComm_t sub = nullptr;
    {
      const Use use(*this);
      SHARDOPT_NCCL_CHECK(ncclCommSplit(use.get(), color, key, &sub, &config));
    }
    SHARDOPT_REQUIRE(sub != nullptr, ErrorCode::Internal, "ncclCommSplit returned no communicator for a color >= 0");
    int sub_rank = 0, sub_size = 0;
    const ncclResult_t r1 = ncclCommUserRank(sub, &sub_rank);
    const ncclResult_t r2 = ncclCommCount(sub, &sub_size);
    if (r1 != ncclSuccess || r2 != ncclSuccess) {
      (void)ncclCommAbort(sub);
      SHARDOPT_NCCL_CHECK(r1 != ncclSuccess ? r1 : r2);
    }
    return std::make_shared<NcclCommImpl>(sub, sub_rank, sub_size, device());
  }

  std::vector<std::uint64_t> do_all_gather_u64(const std::vector<std::uint64_t>& mine) override {
    if (fault_armed() && inject_fault(OperationLabel::named("all_gather_value"))) return std::vector<std::uint64_t>(mine.size() * static_cast<std::size_t>(size()));
    DeviceGuard guard(device());
    const std::size_t slot = mine.size() * sizeof(std::uint64_t);
    std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(size()));
    if (slot == 0) return all;
    // Staged through pinned memory both ways: a copy from or into pageable memory would
    // block this thread until the all-gather ends, so a missing peer would hang it past
    // the deadline that wait_aux enforces.
    const std::size_t total = slot * static_cast<std::size_t>(size());
    reserve_value_staging(total);
    char* base = static_cast<char*>(value_device_);
    char* host = static_cast<char*>(value_host_);
    const std::size_t own = static_cast<std::size_t>(rank()) * slot;
    std::memcpy(host + own, mine.data(), slot);
    SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(base + own, host + own, slot, cudaMemcpyHostToDevice, aux_));
    {
      const Use use(*this);
      SHARDOPT_NCCL_CHECK(ncclAllGather(base + own, base, slot, ncclUint8, use.get(), aux_));
    }
    SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(host, base, total, cudaMemcpyDeviceToHost, aux_));
    wait_aux("all_gather_value");
    std::memcpy(all.data(), host, total);
    return all;
  }

  void do_invalid_call_for_test() override {
    DeviceGuard guard(device());
    const Use use(*this);
    SHARDOPT_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, static_cast<ncclDataType_t>(ncclNumTypes), ncclSum,
                                      use.get(), aux_));
  }

  // A group counts as one use from start to end: an abort waits until NCCL has launched
  // (or dropped) what the group recorded.
  void do_group_start() override {
    group_use_.emplace(*this);
    try {
      SHARDOPT_NCCL_CHECK(ncclGroupStart());
    } catch (...) {
      group_use_.reset();
      throw;
    }
  }

  void do_group_end() override {
    struct Release {
      std::optional<Use>& use;
      ~Release() { use.reset(); }
    } release{group_use_};
    SHARDOPT_NCCL_CHECK(ncclGroupEnd());
    if (group_use_) check_async(group_use_->get());
  }

  void poll_async_error() override {
    if (handle() == nullptr) return;  // aborted: the failure is already recorded
    std::optional<Use> use;
    try {
      use.emplace(*this);
    } catch (const Error&) {
      return;  // aborted meanwhile
    }
    try {
      check_async(use->get());
    } catch (const Error& e) {
      use.reset();
      mark_failed(e.what());
      throw;
    }
  }

  bool backend_released() const noexcept override { return abort_issued_.load(); }

  // Aborts on a thread of its own, so that the failing call (or the step watchdog)
  // returns at once even when the abort has to wait for the device or for CUDA graphs
  // that hold the communicator. New uses are refused from the exchange on; the thread
  // first waits for the uses in flight (NCCL allows one thread per communicator at a
  // time), then aborts, and past abort_issued_ touches nothing of this object.
  void on_failure() noexcept override {
    ncclComm_t c = comm_.exchange(nullptr);
    if (c == nullptr) return;
    std::shared_ptr<std::atomic<bool>> done = abort_done_;
    const int dev = device();
    // Counted from now until the abort has returned, so that an exit waits for it
    // (abort_wait.hpp); the count ends with the lambda, on the abort's thread.
    auto running = std::make_shared<RunningAbort>();
    auto abort = [this, c, done, dev, running] {
      while (in_flight_.load() != 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      abort_issued_.store(true);  // the last access to this object
      int previous = -1;
      const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
      (void)cudaSetDevice(dev);
      (void)ncclCommAbort(c);
      if (have_previous) (void)cudaSetDevice(previous);
      done->store(true);
    };
    try {
      abort_thread_ = std::thread(abort);
    } catch (...) {
      abort();
    }
  }

  void* register_buffer(void* data, std::size_t bytes) override {
    if (handle() == nullptr) return nullptr;  // aborted after an error
    DeviceGuard guard(device());
    const Use use(*this);
    void* registration = nullptr;
    SHARDOPT_NCCL_CHECK(ncclCommRegister(use.get(), data, bytes, &registration));
    if (registration == nullptr) return nullptr;
    try {
      registered_.add(registration, data, bytes);
    } catch (...) {
      (void)ncclCommDeregister(use.get(), registration);
      throw;
    }
    return registration;
  }

  void deregister_buffer(void* registration) noexcept override {
    registered_.remove(registration);
    in_flight_.fetch_add(1);
    ncclComm_t c = handle();
    // Aborted after an error: NCCL released the registration with the communicator.
    if (c != nullptr) on_device([c, registration] { (void)ncclCommDeregister(c, registration); });
    in_flight_.fetch_sub(1);
  }

 private:
  static cudaStream_t cuda(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

  // all_gather_value's staging (device bytes and their pinned host mirror), kept for the
  // communicator's life: a cudaFree per call would wait for the whole device, NCCL
  // kernels of other streams included. Grown (rarely: the first agreements) only while
  // aux_ is idle, which every wait_aux leaves it.
  void reserve_value_staging(std::size_t bytes) {
    if (bytes <= value_bytes_) return;
    const std::size_t want = std::max(bytes, 2 * value_bytes_);
    free_value_staging();
    SHARDOPT_CUDA_CHECK(cudaMalloc(&value_device_, want));
    SHARDOPT_CUDA_CHECK(cudaMallocHost(&value_host_, want));
    value_bytes_ = want;
  }
  void free_value_staging() noexcept {
    if (value_device_ != nullptr) (void)cudaFree(value_device_);
    if (value_host_ != nullptr) (void)cudaFreeHost(value_host_);
    value_device_ = value_host_ = nullptr;
    value_bytes_ = 0;
  }


  // One use of the NCCL handle by a caller, counted while it lives (see on_failure).
  // Throws Error(InvalidState) once the communicator was given up.
  class Use {
   public:
    explicit Use(const NcclCommImpl& comm) : comm_(comm) {
      comm_.in_flight_.fetch_add(1);
      handle_ = comm_.handle();
      if (handle_ == nullptr) {
        comm_.in_flight_.fetch_sub(1);
        throw Error(ErrorCode::InvalidState,
                    "the NCCL communicator was aborted after an error; create a new Communicator");
      }
    }
    ~Use() { comm_.in_flight_.fetch_sub(1); }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    ncclComm_t get() const noexcept { return handle_; }

   private:
    const NcclCommImpl& comm_;
    ncclComm_t handle_ = nullptr;
  };

  // Waits for the private stream within the group's deadline (CommImpl::wait_until). On
  // a missed deadline the communicator is aborted, and the stream is drained before the
  // error leaves (its NCCL kernel ends with the abort; the copies behind it must not land
  // in host memory this call has already released).
  void wait_aux(const char* call) {
    const Deadline deadline = wait_deadline();
    try {
      wait_until([&] { return stream_done(Backend::Cuda, aux_); }, call, deadline);
    } catch (...) {
      (void)cudaStreamSynchronize(aux_);
      throw;
    }
    const Use use(*this);
    check_async(use.get());
  }

  // Errors NCCL found while running earlier work (a peer died, a network failure); the
  // caller holds a Use of `c`.
  static void check_async(ncclComm_t c) {
    ncclResult_t state = ncclSuccess;
    SHARDOPT_NCCL_CHECK(ncclCommGetAsyncError(c, &state));
    if (state != ncclSuccess && state != ncclInProgress) SHARDOPT_NCCL_CHECK(state);
  }

  // Tears down: finalize + destroy (clean), or abort (error paths).
  void release(bool abort) noexcept {
    on_device([&] {
      if (ncclComm_t c = comm_.exchange(nullptr, std::memory_order_acq_rel); c != nullptr) {
        if (abort || ncclCommFinalize(c) != ncclSuccess) {
          (void)ncclCommAbort(c);
        } else {
          (void)ncclCommDestroy(c);
        }
      }
      // While an abort is still running (waiting for the device) the scratch and the
      // stream stay: NCCL kernels on aux_ may still touch the scratch, and freeing
      // would wait for the device. They are left to the process's exit.
      const bool abort_running = abort_issued_.load() && !abort_done_->load();
      if (abort_running) return;
      if (scratch_ != nullptr) (void)cudaFree(scratch_);
      free_value_staging();
      if (aux_ != nullptr) (void)cudaStreamDestroy(aux_);
      scratch_ = nullptr;
      aux_ = nullptr;
    });
  }

  // Runs `f` (which must not throw) with this group's device current, restoring the
  // previous device; for teardown paths that cannot throw (DeviceGuard can).
  template <class F>
  void on_device(F&& f) const noexcept {
    int previous = -1;
    const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
    (void)cudaSetDevice(device());
    f();
    if (have_previous) (void)cudaSetDevice(previous);
  }

  std::atomic<ncclComm_t> comm_;
  RegisteredRanges registered_;            // what register_buffer registered (all_to_all's check)
  mutable std::atomic<int> in_flight_{0};  // Uses of the handle (see Use)
  std::optional<Use> group_use_;           // held across an open group
  std::thread abort_thread_;               // the one abort after a failure (on_failure)
  std::atomic<bool> abort_issued_{false};  // the abort thread is past its wait
  std::shared_ptr<std::atomic<bool>> abort_done_ = std::make_shared<std::atomic<bool>>(false);
  cudaStream_t aux_ = nullptr;
  void* scratch_ = nullptr;
  void* value_device_ = nullptr;  // all_gather_value's staging (reserve_value_staging)
  void* value_host_ = nullptr;    // pinned
  std::size_t value_bytes_ = 0;
};

}  // namespace

#endif  // SHARDOPT_HAVE_NCCL

std::shared_ptr<CommImpl> make_nccl_comm(const UniqueId& id, int rank, int size, int device) {
#if SHARDOPT_HAVE_NCCL
  SHARDOPT_REQUIRE(size >= 1, ErrorCode::InvalidArgument,
                   "from_unique_id: group size " + std::to_string(size) + " must be >= 1");
  SHARDOPT_REQUIRE(rank >= 0 && rank < size, ErrorCode::InvalidArgument,
                   "from_unique_id: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(size) + ")");
  bool empty = true;
  for (char c : id.bytes) empty = empty && c == 0;
  SHARDOPT_REQUIRE(!empty, ErrorCode::InvalidArgument,
                   "from_unique_id: the UniqueId is empty; create it with UniqueId::create() on rank 0 and "
                   "send its bytes to every rank");
  const int devices = cuda_device_count();
  SHARDOPT_REQUIRE(devices > 0, ErrorCode::Unsupported, "from_unique_id: no CUDA device is visible");
  SHARDOPT_REQUIRE(device >= 0 && device < devices, ErrorCode::InvalidArgument,
                   "from_unique_id: device " + std::to_string(device) + " does not exist (" +
                       std::to_string(devices) + " visible); give one device per rank");
  SHARDOPT_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId nid;
  std::memcpy(&nid, id.bytes.data(), sizeof nid);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  const ncclResult_t res = ncclCommInitRankConfig(&comm, size, nid, rank, &config);
  if (res != ncclSuccess) {
    if (comm != nullptr) (void)ncclCommAbort(comm);
    SHARDOPT_NCCL_CHECK(res);
  }
  return std::make_shared<NcclCommImpl>(comm, rank, size, device);
#else
  (void)id;
  (void)rank;
  (void)size;
  (void)device;
  SHARDOPT_REQUIRE(false, ErrorCode::Unsupported,
                   "an NCCL communicator was requested but this build of shardopt has no NCCL; rebuild with "
                   "CUDA and NCCL, or use Backend::Host");
#endif
}

}  // namespace detail
}  // namespace shardopt
