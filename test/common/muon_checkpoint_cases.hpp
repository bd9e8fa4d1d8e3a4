// muon_checkpoint_cases.hpp - checkpoints of optimizers with Muon groups (issue 34, part 5;
// docs/checkpoints.md): Muon's momentum is the saved kind `muon_momentum`, whole per
// matrix in model space, written by the matrix's home rank. Written once for a backend;
// the host backend under mpiexec runs them (test/mpi/test_muon_checkpoint.cpp).
//
// The model and gradients are muon_cases.hpp's: rank 0 writes the gradients, the others
// zeros, reduced with Sum, so the reduced gradient is rank 0's on any world size and the
// Muon step is bitwise independent of the world size (MuonHost.BitwiseIndependentOf...):
// a run that saves at one world size and resumes at another equals an uninterrupted
// world-of-one run bitwise, which needs the momentum to have been saved and loaded exactly.
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_cases.hpp"
#include "muon_cases.hpp"

namespace shardopt::test::muon_ckpt {

using muon::dist_step;
using muon::fsdp_step;

/// The AdamW twin of muon::dist_options(): the same groups, every one AdamW.
inline DistributedAdamOptions adamw_options() {
  DistributedAdamOptions o = muon::dist_options();
  o.groups["muon"] = AdamGroup{};
  o.groups["muon_x"] = AdamGroup{};
  return o;
}

/// Every parameter's master piece and parameter (or parameter shard) on this rank, as bytes.
template <class Opt>
std::vector<std::vector<std::uint8_t>> state_of(Opt& opt) {
  std::vector<std::vector<std::uint8_t>> out;
  for (int i = 0; i < opt.num_params(); ++i) {
    out.push_back(read_bytes(opt.backend(), opt.shard_master(i)));
    if constexpr (std::is_same_v<Opt, Fsdp>) {
      out.push_back(read_bytes(opt.backend(), opt.shard_param(i)));
    } else {
      out.push_back(read_bytes(opt.backend(), opt.param(i)));
    }
  }
  return out;
}

/// This rank's master pieces equal the matching parts of a world-of-one optimizer's whole
/// masters, bitwise, for every parameter (and, for DistributedAdam, the whole parameters).
template <class Opt>
void expect_pieces_of_the_whole(Opt& opt, DistributedAdam& one, const std::string& what) {
  for (int i = 0; i < opt.num_params(); ++i) {
    SCOPED_TRACE(what + ": " + opt.layout().specs()[static_cast<std::size_t>(i)].name);
    const ShardView v = opt.shard_master(i);
    EXPECT_TRUE(bytes_match_at(read_bytes(opt.backend(), v), read_bytes(one.backend(), one.shard_master(i)),
                               static_cast<std::size_t>(v.param_offset) * 4));
    if constexpr (std::is_same_v<Opt, DistributedAdam>) {
      EXPECT_EQ(read_bytes(opt.backend(), opt.param(i)), read_bytes(one.backend(), one.param(i)));
    }
  }
}

/// Steps [from, from + steps) of muon_cases' gradients, on either front end.
template <class Opt>
void train(Opt& opt, int from, int steps, Stream s) {
  for (int t = from; t < from + steps; ++t) {
    if constexpr (std::is_same_v<Opt, Fsdp>) {
      fsdp_step(opt, t, s);
    } else {
      dist_step(opt, t, s);
    }
  }
}

/// Hsdp: Fsdp with shard groups of 2 (replicas write no file; each reads its momentum).
enum class MuonFront { DistAdam, Fsdp, Hsdp };

/// Calls `fn` with a fresh optimizer of front end `f` over `comm` (muon_cases' model).
template <class Fn>
void with_front(MuonFront f, const Communicator& comm, const Fn& fn) {
  if (f != MuonFront::DistAdam) {
    FsdpOptions o = muon::fsdp_options();
    if (f == MuonFront::Hsdp) o.shard_group_size = 2;
    Fsdp x(comm, muon::model(), muon::units(), o);
    fn(x);
  } else {
    DistributedAdam x(comm, muon::model(), muon::dist_options());
    fn(x);
  }
}

/// Train 3 steps, save, train 3 more; a fresh optimizer that loads the checkpoint holds
/// the saved masters and parameters, and its 3 steps end bitwise where the uninterrupted
/// run did (the momentum carried through the file: without it the steps differ, see
/// case_momentum_matters). `async` saves with save_async.
inline void case_resume_bitwise(Backend b, MuonFront front, bool async) {
  SharedDir dir("muon-resume");
  Communicator comm = make_comm(b);
  TestStream s(b);
  with_front(front, comm, [&](auto& a) {
    a.set_lr(muon::kLr);
    muon::init(a, s.get());
    train(a, 0, 3, s.get());
    if (async) {
      SaveHandle h = a.save_async(dir.sub("ckpt"), s.get(), {{"data_position", "77"}});
      h.wait();
    } else {
      a.save(dir.sub("ckpt"), s.get(), {{"data_position", "77"}});
    }
    const auto at_save = state_of(a);
    train(a, 3, 3, s.get());
    const auto uninterrupted = state_of(a);
    with_front(front, comm, [&](auto& fresh) {
      const CheckpointInfo info = fresh.load(dir.sub("ckpt"), s.get());
      EXPECT_EQ(info.step, 3);
      EXPECT_EQ(info.user.at("data_position"), "77");
      EXPECT_TRUE(state_of(fresh) == at_save) << "the loaded masters or parameters differ from the saved ones";
      fresh.set_lr(muon::kLr);
      train(fresh, 3, 3, s.get());
      EXPECT_TRUE(state_of(fresh) == uninterrupted) << "resume differs from the uninterrupted run";
    });
  });
}

/// Through a captured StepGraph: train 3 replays, save, 3 more; a fresh optimizer that
/// loads and captures after the load ends where the uninterrupted one did, and the first
/// one, loaded again under its live graph (the momentum rewritten in place), replays the
/// same 3 steps to the same state, bitwise.
inline void case_graph_resume_bitwise(Backend b) {
  SharedDir dir("muon-graph-resume");
  Communicator comm = make_comm(b);
  TestStream s(b);
  auto replays = [&](DistributedAdam& opt, std::optional<StepGraph>& g, int n) {
    // The gradient stream's writer (checkpoint_cases.hpp da_iteration): a kernel on CUDA
    // and host work on the host backend, each reading the device step when it runs.
    graph_steps(opt, g, [&opt](Stream st, bool) { da_iteration(opt, st); }, s.get(), n);
    opt.synchronize(s.get());
  };
  DistributedAdam a(comm, muon::model(), muon::dist_options());
  a.set_lr(muon::kLr);
  muon::init(a, s.get());
  std::optional<StepGraph> ga;
  replays(a, ga, 3);
  a.save(dir.sub("ckpt"), s.get());
  const auto at_save = state_of(a);
  replays(a, ga, 3);
  const auto uninterrupted = state_of(a);
  EXPECT_FALSE(at_save == uninterrupted);
  DistributedAdam fresh(comm, muon::model(), muon::dist_options());
  fresh.load(dir.sub("ckpt"), s.get());
  fresh.set_lr(muon::kLr);
  std::optional<StepGraph> gf;
  replays(fresh, gf, 3);
  EXPECT_TRUE(state_of(fresh) == uninterrupted) << "a fresh graph after the load differs";
  a.load(dir.sub("ckpt"), s.get());
  EXPECT_TRUE(state_of(a) == at_save);
  replays(a, ga, 3);
  EXPECT_TRUE(state_of(a) == uninterrupted) << "replay after an in-place load differs";
}

/// Without its momentum a resumed run would differ, so the resume tests can fail: a run
/// that goes on from the same masters with zero momentum ends elsewhere.
inline void case_momentum_matters(Backend b) {
  Communicator comm = make_comm(b);
  TestStream s(b);
  DistributedAdam a(comm, muon::model(), muon::dist_options());
  DistributedAdam c(comm, muon::model(), muon::dist_options());
  for (DistributedAdam* o : {&a, &c}) {
    o->set_lr(muon::kLr);
    muon::init(*o, s.get());
  }
  for (int t = 0; t < 3; ++t) dist_step(a, t, s.get());
  // c: a's masters after 3 steps, zero momentum.
  for (int i = 0; i < a.num_params(); ++i) {
    const ShardView v = a.shard_master(i), w = c.shard_master(i);
    from_host(b, w.data, to_host<float>(b, v.data, static_cast<std::size_t>(v.numel())));
  }
  c.init_from_master(s.get());
  dist_step(a, 3, s.get());
  dist_step(c, 3, s.get());
  bool differs = false;
  for (int i : {1, 3, 4}) differs = differs || read_bytes(b, a.shard_master(i)) != read_bytes(b, c.shard_master(i));
  int any = differs ? 1 : 0, all = 0;
  MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(all, 1) << "zero momentum gives the same step: the resume tests could not fail";
}

/// Saves after 3 steps from `from` ranks with front end `a`, loads into `to` ranks with
/// front end `c`, trains 3 more: every rank's masters equal an uninterrupted world-of-one
/// DistributedAdam run of 6 steps, bitwise. Needs max(from, to) ranks.
inline void case_reshard(Backend b, int from, MuonFront a, int to, MuonFront c) {
  if (world_size() < std::max(from, to)) GTEST_SKIP() << "needs " << std::max(from, to) << " ranks";
  SharedDir dir("muon-reshard");
  Communicator comm = make_comm(b);
  TestStream s(b);
  DistributedAdam ref(Communicator::self(b), muon::model(), muon::dist_options());
  ref.set_lr(muon::kLr);
  muon::init(ref, s.get());
  for (int t = 0; t < 6; ++t) dist_step(ref, t, s.get(), /*every_rank=*/true);
  save_on_first_ranks(comm, from, [&](const Communicator& g) {
    with_front(a, g, [&](auto& x) {
      x.set_lr(muon::kLr);
      muon::init(x, s.get());
      train(x, 0, 3, s.get());
      x.save(dir.sub("ckpt"), s.get());
    });
  });
  Communicator g = first_ranks(comm, to);
  if (comm.rank() >= to) return;
  with_front(c, g, [&](auto& y) {
    // HSDP saves one file per rank of a shard group (the first replica writes).
    EXPECT_EQ(y.load(dir.sub("ckpt"), s.get()).saved_world_size, a == MuonFront::Hsdp ? 2 : from);
    y.set_lr(muon::kLr);
    train(y, 3, 3, s.get());
    expect_pieces_of_the_whole(y, ref, std::to_string(from) + " -> " + std::to_string(to) + " ranks");
  });
}

/// The Error that load(path) of `opt` throws, or nothing.
inline std::optional<Error> load_error(DistributedAdam& opt, const std::string& path) {
  TestStream s(opt.backend());
  try {
    opt.load(path, s.get());
  } catch (const Error& err) {
    return err;
  }
  return std::nullopt;
}

/// A refused collective load: the ranks that found the problem throw InvalidArgument, the
/// others InvalidState naming the first of them; at least one rank found it.
inline void expect_agreed_codes(const Error& e) {
  EXPECT_TRUE(e.code() == ErrorCode::InvalidArgument || e.code() == ErrorCode::InvalidState) << e.what();
  int found = e.code() == ErrorCode::InvalidArgument ? 1 : 0, finders = 0;
  MPI_Allreduce(&found, &finders, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GE(finders, 1) << "no rank threw InvalidArgument: " << e.what();
}

/// load(dir) of `opt` throws an Error of `code` whose message holds every one of `parts`,
/// on every rank (the failing rank its own, the others InvalidState quoting it), and
/// changes nothing: `opt` and its untouched twin take 2 more steps to the same state
/// (momentum included).
inline void expect_refused_unchanged(DistributedAdam& opt, DistributedAdam& twin, const std::string& path,
                                     const std::vector<std::string>& parts, int& step) {
  SCOPED_TRACE(path);
  TestStream s(opt.backend());
  const std::optional<Error> e = load_error(opt, path);
  ASSERT_TRUE(e.has_value()) << "load did not refuse it";
  expect_agreed_codes(*e);
  for (const std::string& part : parts) EXPECT_NE(std::string(e->what()).find(part), std::string::npos) << e->what();
  EXPECT_TRUE(state_of(opt) == state_of(twin)) << "a refused load changed the masters or parameters";
  for (int k = 0; k < 2; ++k, ++step) {
    dist_step(opt, step, s.get());
    dist_step(twin, step, s.get());
  }
  EXPECT_TRUE(state_of(opt) == state_of(twin)) << "a refused load changed the momentum";
}

/// Rewrites, in rank 0's copy of `dir`, the header entry of the first `muon_momentum`
/// tensor of `file` (`edit` gets the entry: dtype, shape, data_offsets), and sets the
/// file's size in index.json to the new one (so only the edited entry is wrong).
inline void edit_momentum_entry(const std::string& dir, int file, int world, const std::function<void(json::Value&)>& edit) {
  const std::string path = shard_file(dir, file, world);
  const auto bytes = file_bytes(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  json::Value h = json::parse(std::string(bytes.begin() + 8, bytes.begin() + static_cast<std::ptrdiff_t>(8 + n)));
  bool found = false;
  for (auto& [name, t] : json::as_object(h))
    if (!found && name.find("/muon_momentum@") != std::string::npos) {
      edit(t);
      found = true;
    }
  ASSERT_TRUE(found) << path << " holds no muon_momentum tensor";
  const std::string text = json::write(h);
  put_header(path, text.size(), text);
  const auto size = static_cast<std::int64_t>(file_bytes(path).size());
  edit_index(dir, [&](json::Value& index) {
    member_ref(json::as_array(member_ref(index, "files"))[static_cast<std::size_t>(file)], "bytes") = json::Value(size);
  });
}

/// An AdamW checkpoint loaded into a Muon run, and a Muon checkpoint into an AdamW run,
/// are refused on every rank naming the parameter and the other algorithm (the state is
/// not converted, docs/checkpoints.md); hostile momentum entries (another dtype, a 2-D
/// slice, a slice of another length, a tensor of another shape, no momentum slices) are
/// refused too; each refusal leaves the optimizer as it was, momentum included.
inline void case_refusals(Backend b) {
  SharedDir dir("muon-refused");
  Communicator comm = make_comm(b);
  const int w = comm.size();
  TestStream s(b);
  DistributedAdam x(comm, muon::model(), muon::dist_options());
  DistributedAdam twin(comm, muon::model(), muon::dist_options());
  DistributedAdam adamw(comm, muon::model(), adamw_options());
  for (DistributedAdam* o : {&x, &twin, &adamw}) {
    o->set_lr(muon::kLr);
    muon::init(*o, s.get());
    for (int t = 0; t < 2; ++t) dist_step(*o, t, s.get());
  }
  const std::string good = dir.sub("good"), adamw_dir = dir.sub("adamw");
  x.save(good, s.get());
  adamw.save(adamw_dir, s.get());
  int step = 2;
  for (int k = 0; k < 1; ++k, ++step) {  // x moves past the checkpoint, with its twin
    dist_step(x, step, s.get());
    dist_step(twin, step, s.get());
  }
  // The state of the other algorithm: refused, naming a Muon parameter and the algorithm.
  const std::string wq_or_other = "holds the AdamW state of parameter '";
  expect_refused_unchanged(x, twin, adamw_dir, {wq_or_other, "this optimizer updates it with Muon"}, step);
  {
    const std::optional<Error> e = load_error(adamw, good);
    ASSERT_TRUE(e.has_value()) << "an AdamW run loaded a Muon checkpoint";
    expect_agreed_codes(*e);
    const std::string m = e->what();
    EXPECT_NE(m.find("holds the Muon state of parameter '"), std::string::npos) << m;
    const bool names_one = m.find("'wq'") != std::string::npos || m.find("'wo'") != std::string::npos ||
                           m.find("'experts.") != std::string::npos;
    EXPECT_TRUE(names_one) << m;
  }
  // Hostile copies of the good checkpoint (rank 0 damages them).
  auto variant = [&](const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string d = dir.sub(name);
    if (comm.rank() == 0) {
      std::filesystem::copy(good, d, std::filesystem::copy_options::recursive);
      damage(d);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return d;
  };
  // Rank 0 homes the costliest matrix, so its file always holds a momentum.
  expect_refused_unchanged(x, twin, variant("momentum-bf16", [w](const std::string& d) {
                             edit_momentum_entry(d, 0, w, [](json::Value& t) {
                               member_ref(t, "dtype") = json::Value("BF16");
                               auto& shape = json::as_array(member_ref(t, "shape"));
                               shape[0] = json::Value(json::as_int(shape[0]) * 2);  // the same bytes
                             });
                           }),
                           {"Muon's momentum is saved as F32 only"}, step);
  expect_refused_unchanged(x, twin, variant("momentum-2d", [w](const std::string& d) {
                             edit_momentum_entry(d, 0, w, [](json::Value& t) {
                               auto& shape = json::as_array(member_ref(t, "shape"));
                               const std::int64_t n = json::as_int(shape[0]);
                               shape[0] = json::Value(n / 8);  // the same elements, 2-D
                               shape.push_back(json::Value(std::int64_t{8}));
                             });
                           }),
                           {"is not a 1-D slice"}, step);
  expect_refused_unchanged(x, twin, variant("momentum-length", [](const std::string& d) {
                             edit_index(d, [](json::Value& index) {
                               for (auto& [key, list] : json::as_object(member_ref(index, "slices")))
                                 if (key == "wq/muon_momentum") {
                                   auto& sl = json::as_array(list)[0];
                                   member_ref(sl, "length") = json::Value(json::as_int(member_ref(sl, "length")) - 16);
                                 }
                             });
                           }),
                           {"wq/muon_momentum"}, step);
  expect_refused_unchanged(x, twin, variant("momentum-none", [](const std::string& d) {
                             edit_index(d, [](json::Value& index) {
                               json::Value kept = json::Value::object();
                               for (auto& [key, list] : json::as_object(member_ref(index, "slices")))
                                 if (key != "wo/muon_momentum") kept[key] = list;
                               member_ref(index, "slices") = std::move(kept);
                             });
                           }),
                           {"holds no 'wo/muon_momentum' slices"}, step);
  expect_refused_unchanged(x, twin, variant("tensor-shape", [](const std::string& d) {
                             edit_index(d, [](json::Value& index) {
                               auto& shape = json::as_array(member_ref(member_ref(member_ref(index, "tensors"), "wq"), "shape"));
                               std::swap(shape[0], shape[1]);
                             });
                           }),
                           {"tensor 'wq' has shape [16, 24]"}, step);
  // The good one still loads, and resumes where x was when it saved.
  x.load(good, s.get());
  EXPECT_EQ(x.read_scalars(s.get()).step, 2);
}

/// For test/python/run_cpp_checkpoint.sh: a Muon optimizer's checkpoint after one step
/// into $SHARDOPT_CKPT_OUT/ckpt_muon and each matrix's expected momentum as
/// expect_muon/TENSOR__muon_momentum.npy, computed here: after one step from zero it is
/// float(1 - momentum) * g (torch's lerp from 0; the reduced gradient g is rank 0's values,
/// no clipping, loss scale 1), for the Python tool to compare.
inline void case_write_for_python(Backend b) {
  const char* out = std::getenv("SHARDOPT_CKPT_OUT");
  if (out == nullptr) GTEST_SKIP() << "SHARDOPT_CKPT_OUT is not set (test/python/run_cpp_checkpoint.sh sets it)";
  Communicator comm = make_comm(b);
  TestStream s(b);
  DistributedAdam x(comm, muon::model(), muon::dist_options());
  x.set_lr(muon::kLr);
  muon::init(x, s.get());
  dist_step(x, 0, s.get());
  const std::string dir = std::string(out) + "/ckpt_muon", expect = std::string(out) + "/expect_muon";
  x.save(dir, s.get());
  if (comm.rank() != 0) return;
  std::filesystem::create_directories(expect);
  const DistributedAdamOptions o = muon::dist_options();
  for (int i = 0; i < x.num_params(); ++i) {
    const ParamSpec& spec = x.layout().specs()[static_cast<std::size_t>(i)];
    const AdamGroup& g = o.groups.at(spec.group);
    if (g.algorithm != GroupAlgorithm::Muon) continue;
    const std::int64_t n = numel(spec.shape) / spec.members();
    const float w = static_cast<float>(1.0 - g.muon.momentum);
    for (int m = 0; m < spec.members(); ++m) {
      std::vector<float> mom(static_cast<std::size_t>(n));
      for (std::int64_t j = 0; j < n; ++j) mom[static_cast<std::size_t>(j)] = w * muon::value(0, i, m * n + j);
      write_npy(expect + "/" + spec.member_name(m) + "__muon_momentum.npy", "<f4", mom.data(), mom.size(), 4);
    }
  }
}

}  // namespace shardopt::test::muon_ckpt

/// Instantiates the Muon checkpoint cases as tests of suite `Suite` on backend `B`.
#define SHARDOPT_MUON_CHECKPOINT_CASES(Suite, B)                                                               \
  TEST(Suite, ResumeEqualsUninterrupted) { muon_ckpt::case_resume_bitwise(B, muon_ckpt::MuonFront::DistAdam, false); } \
  TEST(Suite, AsyncResumeEqualsUninterrupted) { muon_ckpt::case_resume_bitwise(B, muon_ckpt::MuonFront::DistAdam, true); } \
  TEST(Suite, FsdpResumeEqualsUninterrupted) { muon_ckpt::case_resume_bitwise(B, muon_ckpt::MuonFront::Fsdp, false); } \
  TEST(Suite, HsdpResumeEqualsUninterrupted) {                                                                   \
    if (world_size() != 4) GTEST_SKIP() << "HSDP 2 x 2 needs 4 ranks";                                           \
    muon_ckpt::case_resume_bitwise(B, muon_ckpt::MuonFront::Hsdp, true);                                          \
  }                                                                                                              \
  TEST(Suite, Hsdp4ToDistAdam3) { muon_ckpt::case_reshard(B, 4, muon_ckpt::MuonFront::Hsdp, 3, muon_ckpt::MuonFront::DistAdam); } \
  TEST(Suite, GraphResumeEqualsUninterrupted) { muon_ckpt::case_graph_resume_bitwise(B); }                   \
  TEST(Suite, ZeroMomentumWouldDiffer) { muon_ckpt::case_momentum_matters(B); }                               \
  TEST(Suite, Reshard3To2) { muon_ckpt::case_reshard(B, 3, muon_ckpt::MuonFront::DistAdam, 2, muon_ckpt::MuonFront::DistAdam); } \
  TEST(Suite, Reshard3To1) { muon_ckpt::case_reshard(B, 3, muon_ckpt::MuonFront::DistAdam, 1, muon_ckpt::MuonFront::DistAdam); } \
  TEST(Suite, Reshard1To3Fsdp) { muon_ckpt::case_reshard(B, 1, muon_ckpt::MuonFront::DistAdam, 3, muon_ckpt::MuonFront::Fsdp); } \
  TEST(Suite, DistAdam3ToFsdp2) { muon_ckpt::case_reshard(B, 3, muon_ckpt::MuonFront::DistAdam, 2, muon_ckpt::MuonFront::Fsdp); } \
  TEST(Suite, Fsdp3ToDistAdam1) { muon_ckpt::case_reshard(B, 3, muon_ckpt::MuonFront::Fsdp, 1, muon_ckpt::MuonFront::DistAdam); } \
  TEST(Suite, FsdpToDistAdamSameWorld) {                                                                         \
    muon_ckpt::case_reshard(B, world_size(), muon_ckpt::MuonFront::Fsdp, world_size(), muon_ckpt::MuonFront::DistAdam); \
  }                                                                                                              \
  TEST(Suite, OtherAlgorithmAndHostileMomentumRefused) { muon_ckpt::case_refusals(B); }                     \
  TEST(Suite, WriteMuonForPython) { muon_ckpt::case_write_for_python(B); }
