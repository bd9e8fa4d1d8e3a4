// The MPI backend (host backend). Collectives are enqueued with host_enqueue on the
// caller's HostStream, so a HostStream capture records them; the MPI calls themselves
// are blocking inside the recorded operation.
//
// Every collective is started nonblocking and completed by wait(): MPI_Wait when no
// deadline applies, else MPI_Test polled against the deadline (shardopt/watchdog.hpp).
//
// Numerics, chosen to mirror NCCL:
//  * f32 and u32 use MPI's built-in MPI_SUM / MPI_MAX on MPI_FLOAT / MPI_UINT32_T; e8m0
//    (MXFP8 scale bytes, Max only) uses MPI_MAX on MPI_UINT8_T.
//  * bf16 and f16 have no MPI type: they travel as a committed 2-byte contiguous type
//    with user-defined operations that add in fp32 and round to the storage type at
//    every combine (as NCCL does at every hop of its ring). The order of the combines is
//    MPI's algorithm's; results are exact wherever every partial sum is representable.
//  * Average = Sum, then each element of the result divided by the number of ranks in
//    fp32 and rounded to the storage type. NCCL's ncclAvg multiplies every input by
//    1/size before summing; for power-of-two sizes both are exactly (sum) / size.
//  * Max of bf16/f16 returns NaN if either operand is NaN, else the larger one (bits kept).
#include "comm/mpi_comm.hpp"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/numerics.hpp"

namespace shardopt::detail {
namespace {

using Decode = float (*)(std::uint16_t);
using Encode = std::uint16_t (*)(float);

template <Decode dec, Encode enc>
void half_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = enc(dec(a[i]) + dec(b[i]));
}

template <Decode dec>
void half_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = dec(a[i]);
    const float y = dec(b[i]);
    if (y != y) continue;                    // inout already NaN
    if (x != x || x > y) b[i] = a[i];        // NaN wins, then the larger value
  }
}

// The datatypes and operations of the 16-bit float formats, created once per process
// (after MPI_Init) and kept until MPI_Finalize.
struct HalfTypes {
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Datatype f16 = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL, bf16_max = MPI_OP_NULL;
  MPI_Op f16_sum = MPI_OP_NULL, f16_max = MPI_OP_NULL;
};

const HalfTypes& half_types() {
  static const HalfTypes types = [] {
    HalfTypes t;
    SHARDOPT_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.bf16));
    SHARDOPT_MPI_CHECK(MPI_Type_commit(&t.bf16));
    SHARDOPT_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.f16));
    SHARDOPT_MPI_CHECK(MPI_Type_commit(&t.f16));
    SHARDOPT_MPI_CHECK(MPI_Op_create(&half_sum<num::bf16_to_f32, num::f32_to_bf16>, 1, &t.bf16_sum));
    SHARDOPT_MPI_CHECK(MPI_Op_create(&half_max<num::bf16_to_f32>, 1, &t.bf16_max));
    SHARDOPT_MPI_CHECK(MPI_Op_create(&half_sum<num::f16_to_f32, num::f32_to_f16>, 1, &t.f16_sum));
    SHARDOPT_MPI_CHECK(MPI_Op_create(&half_max<num::f16_to_f32>, 1, &t.f16_max));
    return t;
  }();
  return types;
}

MPI_Datatype reduce_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::u32: return MPI_UINT32_T;
    case DType::e8m0: return MPI_UINT8_T;  // Max only (checked by CommImpl)
    case DType::bf16: return half_types().bf16;
    case DType::f16: return half_types().f16;
    default: break;
  }
  throw Error(ErrorCode::Internal, std::string("no MPI reduction type for ") + to_string(t));
}

// Sum for Average too: the division follows the reduction.
MPI_Op reduce_op(DType t, ReduceOp op) {
  const bool max = op == ReduceOp::Max;
  switch (t) {
    case DType::f32:
    case DType::u32:
    case DType::e8m0: return max ? MPI_MAX : MPI_SUM;
    case DType::bf16: return max ? half_types().bf16_max : half_types().bf16_sum;
    case DType::f16: return max ? half_types().f16_max : half_types().f16_sum;
    default: break;
  }
  throw Error(ErrorCode::Internal, std::string("no MPI reduction for ") + to_string(t));
}

// Element-sized raw type for moving bytes (all-gather of any dtype).
MPI_Datatype raw_type(std::size_t element_bytes) {
  switch (element_bytes) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: break;
  }
  throw Error(ErrorCode::Internal, "no raw MPI type of " + std::to_string(element_bytes) + " bytes");
}

// x <- x / n, rounded to the storage type (the Average of a reduced float buffer).
void divide(void* data, std::int64_t count, DType t, int n) {
  const float d = static_cast<float>(n);
  if (t == DType::f32) {
    auto* x = static_cast<float*>(data);
    for (std::int64_t i = 0; i < count; ++i) x[i] = x[i] / d;
  } else if (t == DType::bf16) {
    auto* x = static_cast<std::uint16_t*>(data);
    for (std::int64_t i = 0; i < count; ++i) x[i] = num::f32_to_bf16(num::bf16_to_f32(x[i]) / d);
  } else if (t == DType::f16) {
    auto* x = static_cast<std::uint16_t*>(data);
    for (std::int64_t i = 0; i < count; ++i) x[i] = num::f32_to_f16(num::f16_to_f32(x[i]) / d);
  } else {
    throw Error(ErrorCode::Internal, std::string("Average of ") + to_string(t));
  }
}

// A collective abandoned at a deadline. MPI cannot cancel a collective (nor free its
// request), and a late peer may still complete it inside a later MPI call of this
// process, so its request and the scratch memory it may write stay alive until the
// process exits: kept here, reachable, rather than dropped.
struct Abandoned {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<std::vector<unsigned char>> scratch;
};
std::vector<Abandoned>& abandoned() {
  static auto* kept = new std::vector<Abandoned>();
  return *kept;
}
std::mutex& abandoned_mutex() {
  static std::mutex m;
  return m;
}

class MpiCommImpl final : public CommImpl {
 public:
  MpiCommImpl(MPI_Comm owned, int rank, int size) : CommImpl(Backend::Host, rank, size, -1), comm_(owned) {}

  ~MpiCommImpl() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  MPI_Comm handle() const noexcept { return comm_; }

 protected:
  // With a deadline armed, every collective works on scratch copies of the caller's
  // memory: a collective abandoned at the deadline keeps its scratch (a late peer may
  // still complete it) and never writes into, or reads from, the caller's buffers, which
  // the trainer frees when it rebuilds.
  void do_reduce_scatter(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    enqueue(stream, "reduce_scatter", [data, count, dtype, op](MpiCommImpl& self, const std::string& what) {
      const Deadline deadline = self.wait_deadline();
      const std::size_t bytes = static_cast<std::size_t>(count) * size_of(dtype);
      auto* caller = static_cast<unsigned char*>(data);
      // MPI_IN_PLACE would leave the result in slice 0 and clobber it; reduce into a
      // temporary so that, as with NCCL, only this rank's slice changes.
      std::vector<unsigned char> reduced(bytes);
      std::vector<unsigned char> input;
      if (deadline.armed()) input.assign(caller, caller + bytes * static_cast<std::size_t>(self.size()));
      MPI_Request req = MPI_REQUEST_NULL;
      SHARDOPT_MPI_CHECK(MPI_Ireduce_scatter_block(deadline.armed() ? input.data() : caller, reduced.data(),
                                                   static_cast<int>(count), reduce_type(dtype), reduce_op(dtype, op),
                                                   self.comm_, &req));
      self.wait(req, what, deadline, {&reduced, &input});
      if (op == ReduceOp::Average) divide(reduced.data(), count, dtype, self.size());
      std::memcpy(caller + static_cast<std::size_t>(self.rank()) * bytes, reduced.data(), bytes);
    });
  }

  void do_all_gather(void* data, std::int64_t count, DType dtype, Stream stream) override {
    enqueue(stream, "all_gather", [data, count, dtype](MpiCommImpl& self, const std::string& what) {
      const Deadline deadline = self.wait_deadline();
      const std::size_t total = static_cast<std::size_t>(count) * size_of(dtype) * static_cast<std::size_t>(self.size());
      auto* caller = static_cast<unsigned char*>(data);
      std::vector<unsigned char> io;
      if (deadline.armed()) io.assign(caller, caller + total);
      MPI_Request req = MPI_REQUEST_NULL;
      SHARDOPT_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, deadline.armed() ? io.data() : caller,
                                        static_cast<int>(count), raw_type(size_of(dtype)), self.comm_, &req));
      self.wait(req, what, deadline, {&io});
      if (deadline.armed()) std::memcpy(caller, io.data(), total);
    });
  }

  void do_all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    enqueue(stream, "all_reduce", [data, count, dtype, op](MpiCommImpl& self, const std::string& what) {
      const Deadline deadline = self.wait_deadline();
      const std::size_t bytes = static_cast<std::size_t>(count) * size_of(dtype);
      auto* caller = static_cast<unsigned char*>(data);
      std::vector<unsigned char> io;
      if (deadline.armed()) io.assign(caller, caller + bytes);
      void* buffer = deadline.armed() ? static_cast<void*>(io.data()) : data;
      MPI_Request req = MPI_REQUEST_NULL;
      SHARDOPT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer, static_cast<int>(count), reduce_type(dtype),
                                        reduce_op(dtype, op), self.comm_, &req));
      self.wait(req, what, deadline, {&io});
      if (deadline.armed()) std::memcpy(caller, io.data(), bytes);
      if (op == ReduceOp::Average) divide(data, count, dtype, self.size());
    });
  }

  // Back-to-back pieces with the own piece: MPI_Ialltoall. Otherwise MPI_Ialltoallv in
  // units of g elements (g = gcd of the count and both strides, a contiguous datatype, so
  // that the int displacements reach far), with no piece to or from this rank without
  // `own`; the deadline path's copy back skips that piece. The count and displacement
  // arrays live in `arrays`, which an abandoned request keeps (wait).
  void do_all_to_all(const void* send, void* recv, std::int64_t count, DType dtype, Stream stream, bool own,
                     std::int64_t send_stride, std::int64_t recv_stride) override {
    const std::int64_t unit = std::gcd(count, std::gcd(send_stride, recv_stride));
    SHARDOPT_REQUIRE(std::max(send_stride, recv_stride) / unit * (size() - 1) <= kMaxMpiCount, ErrorCode::InvalidArgument,
                     "all_to_all: piece strides " + std::to_string(send_stride) + " / " + std::to_string(recv_stride) +
                         " put the last piece beyond what one host-backend (MPI) call addresses; use smaller pieces "
                         "or strides that share a larger factor with the count");
    enqueue(stream, "all_to_all", [send, recv, count, dtype, own, send_stride, recv_stride, unit](
                                      MpiCommImpl& self, const std::string& what) {
      const Deadline deadline = self.wait_deadline();
      const int n = self.size(), me = self.rank();
      const std::size_t esize = size_of(dtype);
      const std::size_t piece = static_cast<std::size_t>(count) * esize;
      const auto last = static_cast<std::size_t>(n - 1);
      const std::size_t send_bytes = last * static_cast<std::size_t>(send_stride) * esize + piece;
      const std::size_t recv_bytes = last * static_cast<std::size_t>(recv_stride) * esize + piece;
      const auto* from = static_cast<const unsigned char*>(send);
      auto* to = static_cast<unsigned char*>(recv);
      std::vector<unsigned char> in, out, arrays;
      if (deadline.armed()) {
        in.assign(from, from + send_bytes);
        out.resize(recv_bytes);
      }
      MPI_Request req = MPI_REQUEST_NULL;
      const MPI_Datatype type = raw_type(esize);
      const void* sbuf = deadline.armed() ? static_cast<const void*>(in.data()) : send;
      void* rbuf = deadline.armed() ? static_cast<void*>(out.data()) : recv;
      if (own && send_stride == count && recv_stride == count) {
        SHARDOPT_MPI_CHECK(
            MPI_Ialltoall(sbuf, static_cast<int>(count), type, rbuf, static_cast<int>(count), type, self.comm_, &req));
      } else {
        // counts, send displacements, receive displacements, in units
        std::vector<int> cd(3 * static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) {
          cd[static_cast<std::size_t>(r)] = own || r != me ? static_cast<int>(count / unit) : 0;
          cd[static_cast<std::size_t>(n + r)] = static_cast<int>(r * (send_stride / unit));
          cd[static_cast<std::size_t>(2 * n + r)] = static_cast<int>(r * (recv_stride / unit));
        }
        arrays.resize(cd.size() * sizeof(int));
        std::memcpy(arrays.data(), cd.data(), arrays.size());
        const auto* counts = reinterpret_cast<const int*>(arrays.data());
        MPI_Datatype unit_type = MPI_DATATYPE_NULL;
        SHARDOPT_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(unit), type, &unit_type));
        SHARDOPT_MPI_CHECK(MPI_Type_commit(&unit_type));
        const int started = MPI_Ialltoallv(sbuf, counts, counts + n, unit_type, rbuf, counts, counts + 2 * n,
                                           unit_type, self.comm_, &req);
        MPI_Type_free(&unit_type);  // a started operation keeps what it needs
        SHARDOPT_MPI_CHECK(started);
      }
      self.wait(req, what, deadline, {&in, &out, &arrays});
      if (!deadline.armed()) return;
      for (int r = 0; r < n; ++r) {
        if (!own && r == me) continue;
        const std::size_t at = static_cast<std::size_t>(r) * static_cast<std::size_t>(recv_stride) * esize;
        std::memcpy(to + at, out.data() + at, piece);
      }
    });
  }

  void do_barrier() override {
    const std::string what = OperationLabel::named("barrier");
    if (inject_fault(what)) return;
    MPI_Request req = MPI_REQUEST_NULL;
    SHARDOPT_MPI_CHECK(MPI_Ibarrier(comm_, &req));
    wait(req, what, wait_deadline(), {});
  }

  std::shared_ptr<CommImpl> do_split(int color, int key) override {
    // MPI has no nonblocking split: this wait is not bounded by the deadlines.
    MPI_Comm sub = MPI_COMM_NULL;
    SHARDOPT_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
    return make_mpi_comm(sub);
  }

  std::vector<std::uint64_t> do_all_gather_u64(const std::vector<std::uint64_t>& mine) override {
    const std::string what = OperationLabel::named("all_gather_value");
    const std::size_t n = mine.size();
    std::vector<std::uint64_t> all(n * static_cast<std::size_t>(size()));
    if (inject_fault(what)) return all;
    // One buffer for the send and receive sides, kept if the wait is abandoned.
    std::vector<unsigned char> io((n + all.size()) * sizeof(std::uint64_t));
    std::memcpy(io.data(), mine.data(), n * sizeof(std::uint64_t));
    auto* send = reinterpret_cast<std::uint64_t*>(io.data());
    MPI_Request req = MPI_REQUEST_NULL;
    SHARDOPT_MPI_CHECK(MPI_Iallgather(send, static_cast<int>(n), MPI_UINT64_T, send + n, static_cast<int>(n),
                                      MPI_UINT64_T, comm_, &req));
    wait(req, what, wait_deadline(), {&io});
    std::memcpy(all.data(), send + n, all.size() * sizeof(std::uint64_t));
    return all;
  }

  void do_invalid_call_for_test() override {
    float x = 0.0f;
    SHARDOPT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DATATYPE_NULL, MPI_SUM, comm_));
  }

 private:
  // Completes `req`. Without a deadline: MPI_Wait. With one: MPI_Test polled until the
  // deadline, then the group fails with Error(Timeout); the request stays with MPI (a
  // collective cannot be cancelled) and is kept, with the `scratch` buffers it may still
  // read or write, until the process exits.
  void wait(MPI_Request& req, const std::string& what, const Deadline& deadline,
            std::initializer_list<std::vector<unsigned char>*> scratch) {
    if (!deadline.armed()) {
      SHARDOPT_MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
      return;
    }
    try {
      wait_until(
          [&] {
            int done = 0;
            SHARDOPT_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
            return done != 0;
          },
          what, deadline);
    } catch (...) {
      Abandoned a;
      a.request = req;
      for (std::vector<unsigned char>* buffer : scratch) a.scratch.push_back(std::move(*buffer));
      std::lock_guard<std::mutex> lock(abandoned_mutex());
      abandoned().push_back(std::move(a));
      throw;
    }
  }

  // Enqueues `work` on the HostStream. The recorded operation holds the group alive,
  // re-checks it when it runs (a replay after a failure throws) and names itself with
  // the label of the thread that enqueued it.
  template <class Work>
  void enqueue(Stream stream, const char* call, Work work) {
    auto self = std::static_pointer_cast<MpiCommImpl>(shared_from_this());
    host_enqueue(stream, [self, call, work, what = OperationLabel::named(call)] {
      self->require_usable(call);
      if (self->inject_fault(what)) return;
      self->guarded([&] { work(*self, what); });
    });
  }

  MPI_Comm comm_;
};

}  // namespace

std::shared_ptr<CommImpl> make_mpi_comm(MPI_Comm owned) {
  // Errors come back as codes (SHARDOPT_MPI_CHECK turns them into shardopt::Error).
  int rank = 0, size = 0;
  const int e1 = MPI_Comm_set_errhandler(owned, MPI_ERRORS_RETURN);
  const int e2 = e1 == MPI_SUCCESS ? MPI_Comm_rank(owned, &rank) : e1;
  const int e3 = e2 == MPI_SUCCESS ? MPI_Comm_size(owned, &size) : e2;
  if (e3 != MPI_SUCCESS) {
    MPI_Comm_free(&owned);
    SHARDOPT_MPI_CHECK(e3);
  }
  return std::make_shared<MpiCommImpl>(owned, rank, size);
}

MPI_Comm mpi_handle(const CommImpl& impl) noexcept {
  const auto* mpi = dynamic_cast<const MpiCommImpl*>(&impl);
  return mpi == nullptr ? MPI_COMM_NULL : mpi->handle();
}

}  // namespace shardopt::detail
