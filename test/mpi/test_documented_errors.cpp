// test_documented_errors.cpp - errors the public headers promise that no other test
// triggers with its code, run on the host backend under mpiexec (2 and 3 ranks): each is
// made to happen and its code checked on every rank, for the collective calls on every
// rank at once (docs/errors.md lists every promise and the test that proves it;
// test/tools/test_errors_table.py keeps the two in step).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm_impl.hpp"
#include "common/checkpoint_cases.hpp"
#include "common/error_of.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/host_stream.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
using std::chrono::milliseconds;

bool has(const Error& e, const std::string& part) { return std::string(e.what()).find(part) != std::string::npos; }

/// Expects `f` to throw Error(code) with `part` in its message, on this rank.
template <class F>
void expect_code(F&& f, ErrorCode code, const std::string& part) {
  const std::optional<Error> e = error_of(f);
  ASSERT_TRUE(e.has_value()) << "no error on rank " << world_rank() << "; expected " << to_string(code);
  EXPECT_EQ(e->code(), code) << e->what();
  EXPECT_TRUE(has(*e, part)) << "'" << part << "' not in: " << e->what();
}

/// A failure one rank found, agreed by every rank: the rank that found it throws its own
/// error (`found`), the others Error(InvalidState) naming that rank.
template <class F>
void expect_agreed(F&& f, bool finder, int finder_rank, ErrorCode found, const std::string& part) {
  if (finder) {
    expect_code(f, found, part);
  } else {
    expect_code(f, ErrorCode::InvalidState, "failed on rank " + std::to_string(finder_rank));
  }
}

bool index_exists(const std::string& dir) { return std::filesystem::exists(dir + "/index.json"); }

// mpi.hpp: "a rank that cannot use its device makes every rank throw". The last rank asks
// for a device no machine has; without NCCL (the host-only build) every rank is refused
// before that, with Error(Unsupported).
TEST(DocumentedErrorsHost, CommunicatorFromMpiThrowsOnEveryRankWhenOneCannotUseItsDevice) {
  const int n = world_size(), me = world_rank();
  MpiBootstrapOptions o;
  o.backend = Backend::Cuda;
  if (me == n - 1) o.device = 999;
  const ErrorCode want = nccl_compiled() ? ErrorCode::InvalidArgument : ErrorCode::Unsupported;
  const std::optional<Error> e = error_of([&] { (void)communicator_from_mpi(MPI_COMM_WORLD, o); });  // once: collective
  ASSERT_TRUE(e.has_value()) << "rank " << me << " got a communicator";
  EXPECT_EQ(e->code(), want) << e->what();
  EXPECT_TRUE(has(*e, "communicator_from_mpi: device selection failed")) << e->what();
  if (nccl_compiled() && me == n - 1) {
    EXPECT_TRUE(has(*e, "needs CUDA device 999")) << e->what();
  }
}

// communicator.hpp, require_usable: nothing while usable; Error(Timeout) quoting the call
// after a missed deadline (and synchronize then throws that timeout); Error(InvalidState)
// after any other failure.
TEST(DocumentedErrorsHost, RequireUsableTellsATimeoutFromOtherFailures) {
  const int me = world_rank();
  Communicator comm = make_comm(Backend::Host);
  EXPECT_NO_THROW(comm.require_usable("first_call"));
  comm.set_watchdog(WatchdogOptions{milliseconds(200), milliseconds(0)});
  if (me == 0) {  // the others are not in the barrier yet: rank 0 misses the deadline
    expect_code([&] { comm.barrier(); }, ErrorCode::Timeout, "wait_timeout");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (me != 0) comm.barrier();  // completes rank 0's abandoned barrier
  if (me == 0) {
    expect_code([&] { comm.require_usable("late_call"); }, ErrorCode::Timeout, "late_call");
    // Communicator::synchronize: "the error of a failed group", here the timeout.
    HostStream hs;
    expect_code([&] { comm.synchronize(hs.handle()); }, ErrorCode::Timeout, "wait_timeout");
  } else {
    EXPECT_NO_THROW(comm.require_usable("late_call"));
  }
  MPI_Barrier(MPI_COMM_WORLD);

  Communicator other = make_comm(Backend::Host);
  (void)error_of([&] { shardopt::detail::provoke_backend_error_for_test(other); });
  expect_code([&] { other.require_usable("after_an_mpi_error"); }, ErrorCode::InvalidState, "after_an_mpi_error");
}

// distributed_adam.hpp / fsdp.hpp, synchronize: once the communicator missed a deadline,
// "every later call that needs it throws Error(Timeout) too" - synchronize included (the
// host backend has nothing in flight to wait for, so the deadline is missed in a barrier
// that rank 0 enters alone; the other ranks complete it afterwards).
TEST(DocumentedErrorsHost, OptimizerSynchronizeAfterAMissedDeadlineIsTimeout) {
  const int me = world_rank();
  Communicator comm = make_comm(Backend::Host);
  HostStream hs;
  const Stream s = hs.handle();
  DistributedAdamOptions o = base_options(DType::f32);
  o.watchdog = WatchdogOptions{milliseconds(200), milliseconds(0)};
  DistributedAdam opt(comm, small_model(), o);
  init_params(opt, s);
  FsdpOptions fo = fsdp_options(o);
  fo.watchdog = o.watchdog;
  Fsdp f(comm, fsdp_model(), small_units(), fo);
  init_fsdp(f, s);
  EXPECT_NO_THROW(opt.synchronize(s));
  EXPECT_NO_THROW(f.synchronize(s));
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) expect_code([&] { comm.barrier(); }, ErrorCode::Timeout, "wait_timeout");
  MPI_Barrier(MPI_COMM_WORLD);
  if (me != 0) comm.barrier();  // completes rank 0's abandoned barrier
  if (me == 0) {
    expect_code([&] { opt.synchronize(s); }, ErrorCode::Timeout, "wait_timeout");
    expect_code([&] { f.synchronize(s); }, ErrorCode::Timeout, "wait_timeout");
  } else {
    EXPECT_NO_THROW(opt.synchronize(s));
    EXPECT_NO_THROW(f.synchronize(s));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// distributed_adam.hpp param_index: an unknown name is Error(OutOfRange); fsdp.hpp
// unit_of: a parameter index outside [0, number of parameters) is Error(OutOfRange).
TEST(DocumentedErrorsHost, UnknownParameterNameAndIndexAreOutOfRange) {
  Communicator comm = make_comm(Backend::Host);
  DistributedAdam opt(comm, small_model(), base_options(DType::f32));
  EXPECT_EQ(opt.param_index(small_model()[1].name), 1);
  expect_code([&] { (void)opt.param_index("no such parameter"); }, ErrorCode::OutOfRange, "no such parameter");
  Fsdp f(comm, fsdp_model(), small_units(), fsdp_options(base_options(DType::bf16)));
  EXPECT_EQ(f.unit_of(0), 0);
  const int n = static_cast<int>(fsdp_model().size());
  expect_code([&] { (void)f.unit_of(n); }, ErrorCode::OutOfRange, std::to_string(n));
  expect_code([&] { (void)f.unit_of(-1); }, ErrorCode::OutOfRange, "-1");
}

// bucket_store.hpp, start_grad_reduce: a stream the backend cannot use (on the host
// backend, a handle that is not a live HostStream) is Error(InvalidArgument), and the
// bucket is not left pending.
TEST(DocumentedErrorsHost, StoreStartOnAForeignStreamIsInvalidArgument) {
  Communicator comm = make_comm(Backend::Host);
  const int n = comm.size();
  BucketStore st(comm, Layout({ParamSpec::tensor("w", {4 * n, 3}, DType::bf16)}, n));
  int not_a_stream = 0;
  expect_code([&] { st.start_grad_reduce(0, reinterpret_cast<Stream>(&not_a_stream)); }, ErrorCode::InvalidArgument,
              "HostStream");
  EXPECT_FALSE(st.grad_reduce_pending(0));
}

// fsdp.hpp, mxfp8_param: a unit not gathered yet is Error(InvalidState).
TEST(DocumentedErrorsHost, FsdpMxfp8ParamOfAUnitNotGatheredIsInvalidState) {
  Communicator comm = make_comm(Backend::Host);
  TestStream s(Backend::Host);
  Fsdp f(comm, mx_model(), mx_units(), fsdp_mx_options(mx_options(DType::bf16)));
  fsdp_mx_init(f, s.get());
  const int w1 = f.layout().param_index("w1");
  ASSERT_TRUE(f.is_mxfp8(w1));
  expect_code([&] { (void)f.mxfp8_param(w1, FsdpPass::Forward); }, ErrorCode::InvalidState, "");
  (void)f.wait_param(f.unit_of(w1), FsdpPass::Forward, s.get());
  EXPECT_NE(f.mxfp8_param(w1, FsdpPass::Forward).data, nullptr);  // gathered, it is there
}

// distributed_adam.hpp / fsdp.hpp, save: "Error on every rank if any rank fails (the
// directory then has no index)". The last rank is given a path that is a file.
TEST(DocumentedErrorsHost, SaveFailingOnOneRankThrowsOnEveryRank) {
  SharedDir dir("doc-errors-save");
  Communicator comm = make_comm(Backend::Host);
  const int n = comm.size(), me = comm.rank();
  const bool last = me == n - 1;
  const std::string blocker = dir.sub("a-file");
  if (me == 0) write_bytes(blocker, {1, 2, 3});
  MPI_Barrier(MPI_COMM_WORLD);
  TestStream s(Backend::Host);
  {
    DistributedAdam x(comm, small_model(), ckpt_options());
    init_params(x, s.get());
    const std::string target = last ? blocker : dir.sub("dist-adam");
    expect_agreed([&] { x.save(target, s.get()); }, last, n - 1, ErrorCode::InvalidArgument, "is not a directory");
  }
  {
    Fsdp f(comm, fsdp_model(), small_units(), fsdp_options(base_options(DType::bf16)));
    init_fsdp(f, s.get());
    const std::string target = last ? blocker : dir.sub("fsdp");
    expect_agreed([&] { f.save(target, s.get()); }, last, n - 1, ErrorCode::InvalidArgument, "is not a directory");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(index_exists(dir.sub("dist-adam")));
  EXPECT_FALSE(index_exists(dir.sub("fsdp")));
}

// checkpoint.hpp, SaveHandle::wait: "Rethrows an error of the background write, on every
// rank". The last rank's file cannot be written (its path is a non-empty directory).
TEST(DocumentedErrorsHost, AsyncSaveWaitRethrowsABackgroundErrorOnEveryRank) {
  SharedDir dir("doc-errors-async");
  Communicator comm = make_comm(Backend::Host);
  const int n = comm.size(), me = comm.rank();
  const bool last = me == n - 1;
  const std::string own = dir.sub("last-rank"), shared = dir.sub("ckpt");
  if (last) std::filesystem::create_directories(shard_file(own, me, n) + "/occupied");
  MPI_Barrier(MPI_COMM_WORLD);
  TestStream s(Backend::Host);
  DistributedAdam x(comm, small_model(), ckpt_options());
  init_params(x, s.get());
  SaveHandle h = x.save_async(last ? own : shared, s.get());
  expect_agreed([&] { h.wait(); }, last, n - 1, ErrorCode::InvalidState, shard_file(own, me, n));
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(index_exists(shared));
}

// distributed_adam.hpp / fsdp.hpp, load: "Any bad input ... is an Error on every rank";
// checkpoint.hpp: an unwaited save is finished by its optimizer's next load, or, when the
// optimizer is destroyed first, left "an incomplete checkpoint, which load refuses" (and
// the handle's wait() is Error(InvalidState)). The code of each: a missing directory and a damaged file are
// Error(InvalidArgument), a newer format Error(Unsupported), an incomplete checkpoint
// Error(InvalidState); a damage only some ranks read is agreed (the others:
// Error(InvalidState) naming the rank).
TEST(DocumentedErrorsHost, LoadRefusesBadCheckpointsOnEveryRankWithTheirCodes) {
  SharedDir dir("doc-errors-load");
  Communicator comm = make_comm(Backend::Host);
  const int n = comm.size(), me = comm.rank();
  TestStream s(Backend::Host);
  DistributedAdam x(comm, small_model(), ckpt_options());
  init_params(x, s.get());
  const std::string good = dir.sub("good");
  x.save(good, s.get());
  Fsdp f(comm, fsdp_model(), small_units(), fsdp_options(base_options(DType::bf16)));
  init_fsdp(f, s.get());

  expect_code([&] { (void)x.load(dir.sub("missing"), s.get()); }, ErrorCode::InvalidArgument, "does not exist");
  expect_code([&] { (void)f.load(dir.sub("missing"), s.get()); }, ErrorCode::InvalidArgument, "does not exist");

  // An unwaited save is finished by its optimizer's next load (index included) ...
  { SaveHandle unwaited = x.save_async(dir.sub("finished-by-load"), s.get()); }
  x.load(good, s.get());
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(index_exists(dir.sub("finished-by-load")));
  // ... while one whose optimizer is destroyed first stays incomplete, and load refuses it.
  {
    auto y = std::make_unique<DistributedAdam>(comm, small_model(), ckpt_options());
    init_params(*y, s.get());
    SaveHandle h = y->save_async(dir.sub("partial"), s.get());
    y.reset();
    expect_code([&] { h.wait(); }, ErrorCode::InvalidState, "destroyed first");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(index_exists(dir.sub("partial")));
  EXPECT_TRUE(std::filesystem::exists(shard_file(dir.sub("partial"), me, n))) << "this rank's file was not written";
  expect_code([&] { (void)x.load(dir.sub("partial"), s.get()); }, ErrorCode::InvalidState, "incomplete checkpoint");
  expect_code([&] { (void)f.load(dir.sub("partial"), s.get()); }, ErrorCode::InvalidState, "incomplete checkpoint");

  const std::string newer = dir.sub("newer");
  if (me == 0) {
    std::filesystem::copy(good, newer, std::filesystem::copy_options::recursive);
    edit_index(newer, [](json::Value& index) { member_ref(index, "format_version") = json::Value(999); });
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_code([&] { (void)x.load(newer, s.get()); }, ErrorCode::Unsupported, "format version 999");
  expect_code([&] { (void)f.load(newer, s.get()); }, ErrorCode::Unsupported, "format version 999");

  // The last rank's file loses its last byte: the ranks that read it find it.
  const std::string truncated = dir.sub("truncated");
  if (me == 0) {
    std::filesystem::copy(good, truncated, std::filesystem::copy_options::recursive);
    const std::string file = shard_file(truncated, n - 1, n);
    std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::optional<Error> e = error_of([&] { (void)x.load(truncated, s.get()); });
  ASSERT_TRUE(e.has_value()) << "rank " << me << " loaded a truncated checkpoint";
  const bool found = e->code() == ErrorCode::InvalidArgument && has(*e, shard_file(truncated, n - 1, n));
  EXPECT_TRUE(found || (e->code() == ErrorCode::InvalidState && has(*e, "failed on rank"))) << e->what();
  int finders = found ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &finders, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GE(finders, 1) << "no rank reported the truncated file itself";
  if (me == n - 1) {
    EXPECT_TRUE(found) << "the rank that reads its own file did not find it: " << e->what();
  }
  x.load(good, s.get());  // the optimizer still loads a good one
}

}  // namespace
