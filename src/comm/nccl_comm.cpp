// The NCCL backend: every collective is enqueued on the caller's stream (so it can be
// captured into a CUDA graph); the host-blocking helpers (barrier, all_gather_value)
// run on a private stream and wait for it by polling, against the group's deadline and
// NCCL's asynchronous errors (a missed deadline aborts the communicator, which ends the
// NCCL kernels still waiting for a peer).
#include "comm/nccl_comm.hpp"

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/check.hpp"
#include "core/device_guard.hpp"
#include "core/memory.hpp"
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
    if (abort_thread_.joinable()) abort_thread_.join();
    release(/*abort=*/false);
  }

  ncclComm_t handle() const noexcept { return comm_.load(std::memory_order_acquire); }

 protected:
  void do_reduce_scatter(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    if (fault_armed() && inject_fault(labelled("reduce_scatter"))) return;
    DeviceGuard guard(device());
    char* base = static_cast<char*>(data);
    void* mine = base + static_cast<std::size_t>(rank()) * static_cast<std::size_t>(count) * size_of(dtype);
    SHARDOPT_NCCL_CHECK(ncclReduceScatter(base, mine, static_cast<std::size_t>(count), reduce_type(dtype),
                                          nccl_op(op), live(), cuda(stream)));
    check_async();
  }

  void do_all_gather(void* data, std::int64_t count, DType dtype, Stream stream) override {
    if (fault_armed() && inject_fault(labelled("all_gather"))) return;
    DeviceGuard guard(device());
    // An all-gather only moves bytes: gather every dtype (fp8 and e8m0 scales included) as bytes.
    const std::size_t bytes = static_cast<std::size_t>(count) * size_of(dtype);
    char* base = static_cast<char*>(data);
    SHARDOPT_NCCL_CHECK(ncclAllGather(base + static_cast<std::size_t>(rank()) * bytes, base, bytes, ncclUint8,
                                      live(), cuda(stream)));
    check_async();
  }

  void do_all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    if (fault_armed() && inject_fault(labelled("all_reduce"))) return;
    DeviceGuard guard(device());
    SHARDOPT_NCCL_CHECK(ncclAllReduce(data, data, static_cast<std::size_t>(count), reduce_type(dtype), nccl_op(op),
                                      live(), cuda(stream)));
    check_async();
  }

  void do_barrier() override {
    if (fault_armed() && inject_fault(labelled("barrier"))) return;
    DeviceGuard guard(device());
    SHARDOPT_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, live(), aux_));
    wait_aux("barrier");
  }

  std::shared_ptr<CommImpl> do_split(int color, int key) override {
    DeviceGuard guard(device());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    ncclComm_t sub = nullptr;
    SHARDOPT_NCCL_CHECK(ncclCommSplit(live(), color, key, &sub, &config));
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
    if (fault_armed() && inject_fault(labelled("all_gather_value"))) return std::vector<std::uint64_t>(mine.size() * static_cast<std::size_t>(size()));
    DeviceGuard guard(device());
    const std::size_t slot = mine.size() * sizeof(std::uint64_t);
    std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(size()));
    if (slot == 0) return all;
    DeviceBuffer buffer(Backend::Cuda, slot * static_cast<std::size_t>(size()));
    char* base = buffer.as<char>();
    char* own = base + static_cast<std::size_t>(rank()) * slot;
    SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(own, mine.data(), slot, cudaMemcpyHostToDevice, aux_));
    SHARDOPT_NCCL_CHECK(ncclAllGather(own, base, slot, ncclUint8, live(), aux_));
    SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(all.data(), base, buffer.bytes(), cudaMemcpyDeviceToHost, aux_));
    wait_aux("all_gather_value");
    return all;
  }

  void do_invalid_call_for_test() override {
    DeviceGuard guard(device());
    SHARDOPT_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, static_cast<ncclDataType_t>(ncclNumTypes), ncclSum,
                                      live(), aux_));
  }

  void do_group_start() override { SHARDOPT_NCCL_CHECK(ncclGroupStart()); }

  void do_group_end() override {
    SHARDOPT_NCCL_CHECK(ncclGroupEnd());
    check_async();
  }

  void poll_async_error() override {
    if (handle() == nullptr) return;  // aborted: the failure is already recorded
    try {
      check_async();
    } catch (const Error& e) {
      mark_failed(e.what());
      throw;
    }
  }

  bool backend_released() const noexcept override { return aborted_.load(std::memory_order_acquire); }

  // Aborts on a thread of its own: the failing call (or the step watchdog) returns at
  // once even if the abort has to wait for the device, and no later NCCL call is made
  // on the communicator (live() sees null from here on).
  void on_failure() noexcept override {
    ncclComm_t c = comm_.exchange(nullptr, std::memory_order_acq_rel);
    if (c == nullptr) return;
    auto abort = [this, c] {
      on_device([c] { (void)ncclCommAbort(c); });
      aborted_.store(true, std::memory_order_release);
    };
    try {
      abort_thread_ = std::thread(abort);
    } catch (...) {
      abort();
    }
  }

  void* register_buffer(void* data, std::size_t bytes) override {
    ncclComm_t c = handle();
    if (c == nullptr) return nullptr;  // aborted after an error
    DeviceGuard guard(device());
    void* registration = nullptr;
    SHARDOPT_NCCL_CHECK(ncclCommRegister(c, data, bytes, &registration));
    return registration;
  }

  void deregister_buffer(void* registration) noexcept override {
    ncclComm_t c = handle();
    if (c == nullptr) return;  // aborted after an error: NCCL released the registration with it
    on_device([c, registration] { (void)ncclCommDeregister(c, registration); });
  }

 private:
  static cudaStream_t cuda(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

  // "all_reduce (bucket 3 ...)": the call and the caller's label (fault messages).
  static std::string labelled(const char* call) {
    const std::string& label = OperationLabel::current();
    return label.empty() ? std::string(call) : std::string(call) + " (" + label + ")";
  }

  ncclComm_t live() const {
    ncclComm_t c = handle();
    SHARDOPT_REQUIRE(c != nullptr, ErrorCode::InvalidState,
                     "the NCCL communicator was aborted after an error; create a new Communicator");
    return c;
  }

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
    check_async();
  }

  // Errors NCCL found while running earlier work (a peer died, a network failure).
  void check_async() const {
    ncclResult_t state = ncclSuccess;
    SHARDOPT_NCCL_CHECK(ncclCommGetAsyncError(live(), &state));
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
      if (scratch_ != nullptr) (void)cudaFree(scratch_);
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
  std::thread abort_thread_;  // the one abort after a failure (on_failure)
  std::atomic<bool> aborted_{false};
  cudaStream_t aux_ = nullptr;
  void* scratch_ = nullptr;
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
