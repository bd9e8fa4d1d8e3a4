#include "optimizer/checkpoint.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "core/crc32c.hpp"
#include "core/file_io.hpp"
#include "core/json.hpp"
#include "core/memory.hpp"
#include "core/safetensors.hpp"
#include "core/streams.hpp"
#include "kernels/convert.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {
namespace {

constexpr const char* kFormat = "shardopt-checkpoint";
constexpr std::int64_t kFormatVersion = 1;
constexpr const char* kIndexName = "index.json";

// ---------------------------------------------------------------- what a rank saves

enum class Kind { Master, ExpAvg, ExpAvgSq, Param, MxRowData, MxColData, MxRowScale, MxColScale, Nv4Data, Nv4Scale, Nv4Amax };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Master: return "master";
    case Kind::ExpAvg: return "exp_avg";
    case Kind::ExpAvgSq: return "exp_avg_sq";
    case Kind::Param: return "param";
    case Kind::MxRowData: return "mxfp8_row_data";
    case Kind::MxColData: return "mxfp8_col_data";
    case Kind::MxRowScale: return "mxfp8_row_scale";
    case Kind::MxColScale: return "mxfp8_col_scale";
    case Kind::Nv4Data: return "nvfp4_data";
    case Kind::Nv4Scale: return "nvfp4_scale";
    case Kind::Nv4Amax: return "nvfp4_amax";
  }
  return "?";
}

std::string file_name(int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d-of-%05d.safetensors", rank, world);
  return buf;
}

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

// One slice of one model tensor that a rank saves.
struct Item {
  std::string tensor;      // model tensor name
  Kind kind = Kind::Master;
  int param = 0;
  std::int64_t offset = 0;  // first element in the model tensor
  std::int64_t length = 0;  // elements
  std::int64_t src = 0;     // element index in the source array (see source_of)
  DType dtype = DType::f32; // element type in the file
  std::string key() const { return tensor + "/" + kind_name(kind); }
  std::string name() const { return key() + "@" + std::to_string(offset); }
};

// The facts about each parameter that decide what is saved of it.
struct ParamFacts {
  bool mxfp8 = false;
  bool nvfp4 = false;
  bool has_param = false;  // a native parameter storage exists (the `param` kind)
  DType param_dtype = DType::f32;
  Mxfp8Shape shape;        // MXFP8 parameters
  Nvfp4Shape nv_shape;     // NVFP4 parameters: one member
};

std::vector<ParamFacts> param_facts(const CheckpointTarget& t) {
  const Layout& L = *t.layout;
  std::vector<ParamFacts> out(L.params().size());
  for (std::size_t p = 0; p < out.size(); ++p) {
    ParamFacts& f = out[p];
    const std::optional<Mxfp8CheckpointSource> mx = t.mxfp8 ? t.mxfp8(static_cast<int>(p)) : std::nullopt;
    const std::optional<Nvfp4View> nv = t.nvfp4 ? t.nvfp4(static_cast<int>(p)) : std::nullopt;
    f.param_dtype = L.buffers()[static_cast<std::size_t>(L.params()[p].buffer)].dtype;
    if (mx) {
      f.mxfp8 = true;
      f.shape = mx->shape;
    } else if (nv) {
      f.nvfp4 = true;
      f.nv_shape = nv->shape;
    } else {
      // A native parameter: its storage is bound in the engine (the param view of a piece
      // is null only for an empty piece or MXFP8 storage).
      f.has_param = true;
    }
  }
  return out;
}

// Rank r's items, in a fixed order (buffers, then its segments in shard order, then the
// MXFP8 scale shares), the same whichever rank computes them.
std::vector<Item> rank_items(const Layout& L, const std::vector<ParamFacts>& facts, DType moment, int r,
                             bool with_params) {
  std::vector<Item> out;
  const int world = L.world_size();
  for (int b = 0; b < static_cast<int>(L.buffers().size()); ++b) {
    for (const Segment& seg : L.segments(b, r)) {
      const ParamSpec& spec = L.specs()[static_cast<std::size_t>(seg.param)];
      const ParamFacts& f = facts[static_cast<std::size_t>(seg.param)];
      const int members = spec.members();
      const std::int64_t M = numel(spec.shape) / members;
      for (int m = 0; m < members; ++m) {
        const std::int64_t lo = std::max(seg.param_offset, m * M);
        const std::int64_t hi = std::min(seg.param_offset + seg.length, (m + 1) * M);
        if (lo >= hi) continue;
        Item it;
        it.tensor = spec.member_name(m);
        it.param = seg.param;
        it.offset = lo - m * M;
        it.length = hi - lo;
        it.src = lo - seg.param_offset;  // within this rank's piece
        auto add = [&](Kind k, DType dt, std::int64_t src) {
          Item x = it;
          x.kind = k;
          x.dtype = dt;
          x.src = src;
          out.push_back(std::move(x));
        };
        add(Kind::Master, DType::f32, it.src);
        add(Kind::ExpAvg, moment, it.src);
        add(Kind::ExpAvgSq, moment, it.src);
        if (!with_params) continue;
        if (f.has_param) add(Kind::Param, f.param_dtype, it.src);
        if (f.mxfp8) {
          add(Kind::MxRowData, DType::e4m3, it.src);  // the sources give this rank's piece
          add(Kind::MxColData, DType::e4m3, it.src);
        }
        if (f.nvfp4) {
          // Byte k of a member's data (its elements 2k and 2k + 1) is written by the rank
          // that owns element 2k: bytes [ceil(lo / 2), ceil(hi / 2)) of the member, whole
          // bytes from the gathered storage, so that the slices never overlap.
          const std::int64_t k0 = (it.offset + 1) / 2, k1 = (it.offset + it.length + 1) / 2;
          if (k1 > k0) {
            Item x = it;
            x.kind = Kind::Nv4Data;
            x.dtype = DType::e4m3;  // raw bytes (U8): E2M1 pairs
            x.offset = k0;
            x.length = k1 - k0;
            x.src = m * f.nv_shape.data_bytes() + k0;
            out.push_back(std::move(x));
          }
        }
      }
    }
  }
  if (!with_params) return out;
  // Replicated pieces: rank r writes entries [r n / W, (r + 1) n / W) of each member's n.
  auto share = [&](int p, int m, Kind k, std::int64_t n, DType dt) {
    const std::int64_t lo = n * r / world, hi = n * (r + 1) / world;
    if (lo >= hi) return;
    Item it;
    it.tensor = L.specs()[static_cast<std::size_t>(p)].member_name(m);
    it.kind = k;
    it.param = p;
    it.offset = lo;
    it.length = hi - lo;
    it.src = m * n + lo;
    it.dtype = dt;
    out.push_back(std::move(it));
  };
  // Scales (and NVFP4's global amaxes) are replicated.
  for (std::size_t p = 0; p < facts.size(); ++p) {
    const ParamFacts& f = facts[p];
    const int members = L.specs()[p].members();
    for (int m = 0; m < members && f.mxfp8; ++m) {
      share(static_cast<int>(p), m, Kind::MxRowScale, f.shape.rows * f.shape.row_blocks(), DType::e8m0);
      share(static_cast<int>(p), m, Kind::MxColScale, f.shape.col_blocks() * f.shape.cols, DType::e8m0);
    }
    for (int m = 0; m < members && f.nvfp4; ++m) {
      share(static_cast<int>(p), m, Kind::Nv4Scale, f.nv_shape.scale_numel(), DType::e4m3);
      share(static_cast<int>(p), m, Kind::Nv4Amax, 1, DType::f32);
    }
  }
  return out;
}

const char* file_dtype(DType t) {
  switch (t) {
    case DType::e4m3:
    case DType::e8m0: return "U8";  // raw bytes: numpy reads them everywhere
    default: return safetensors_dtype(t);
  }
}

// Where own-rank item `it` lives in device (or host-backend) memory.
const char* source_of(const CheckpointTarget& t, const Item& it) {
  ShardEngine& e = *t.engine;
  switch (it.kind) {
    case Kind::Master: return static_cast<const char*>(e.master_view(it.param).data) + it.src * 4;
    case Kind::ExpAvg:
      return static_cast<const char*>(e.exp_avg_view(it.param).data) + it.src * static_cast<std::int64_t>(size_of(it.dtype));
    case Kind::ExpAvgSq:
      return static_cast<const char*>(e.exp_avg_sq_view(it.param).data) +
             it.src * static_cast<std::int64_t>(size_of(it.dtype));
    case Kind::Param:
      return static_cast<const char*>(e.param_view(it.param).data) + it.src * static_cast<std::int64_t>(size_of(it.dtype));
    case Kind::MxRowData: return reinterpret_cast<const char*>(t.mxfp8(it.param)->row_piece) + it.src;
    case Kind::MxColData: return reinterpret_cast<const char*>(t.mxfp8(it.param)->col_piece) + it.src;
    case Kind::MxRowScale: return reinterpret_cast<const char*>(t.mxfp8(it.param)->scale_row) + it.src;
    case Kind::MxColScale: return reinterpret_cast<const char*>(t.mxfp8(it.param)->scale_col) + it.src;
    case Kind::Nv4Data: return reinterpret_cast<const char*>(t.nvfp4(it.param)->planes.data) + it.src;
    case Kind::Nv4Scale: return reinterpret_cast<const char*>(t.nvfp4(it.param)->planes.scale) + it.src;
    case Kind::Nv4Amax: return reinterpret_cast<const char*>(t.nvfp4(it.param)->planes.amax + it.src);
  }
  return nullptr;
}

std::size_t item_bytes(const Item& it) { return static_cast<std::size_t>(it.length) * size_of(it.dtype); }

// ---------------------------------------------------------------- agreement

// Every rank learns whether every rank succeeded; if one failed, every rank throws: the
// failing one its own error, the others one that names it and quotes its message.
void agree(const Communicator& all, const std::exception_ptr& mine, const std::string& what) {
  std::string text;
  if (mine) {
    try {
      std::rethrow_exception(mine);
    } catch (const std::exception& e) {
      text = e.what();
    } catch (...) {
      text = "unknown error";
    }
  }
  const auto flags = all.all_gather_value(mine ? 1 : 0);
  int first = -1;
  for (std::size_t r = 0; r < flags.size(); ++r)
    if (flags[r] != 0 && first < 0) first = static_cast<int>(r);
  if (first < 0) return;
  // The first failing rank's message, 8 bytes per round (the same rounds on every rank).
  constexpr std::size_t kWords = 40;
  std::string quoted;
  for (std::size_t w = 0; w < kWords; ++w) {
    std::uint64_t word = 0;
    if (all.rank() == first && w * 8 < text.size())
      std::memcpy(&word, text.data() + w * 8, std::min<std::size_t>(8, text.size() - w * 8));
    const auto words = all.all_gather_value(word);
    const std::uint64_t got = words[static_cast<std::size_t>(first)];
    for (int k = 0; k < 8; ++k) {
      const char c = static_cast<char>((got >> (8 * k)) & 0xFF);
      if (c != '\0') quoted.push_back(c);
    }
  }
  if (mine) std::rethrow_exception(mine);
  throw Error(ErrorCode::InvalidState, what + " failed on rank " + std::to_string(first) + ": " + quoted +
                                           (text.size() > kWords * 8 ? "..." : ""));
}

void make_directory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return;
    throw Error(ErrorCode::InvalidArgument, "checkpoint path '" + dir + "' exists and is not a directory");
  }
  throw_file_error("mkdir", dir, errno);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// ---------------------------------------------------------------- the index

json::Value options_json(const AdamOptions& a) {
  json::Value o = json::Value::object();
  o.set("beta1", a.beta1);
  o.set("beta2", a.beta2);
  o.set("eps", a.eps);
  o.set("decoupled_weight_decay", a.decoupled_weight_decay);
  o.set("clip_max_norm", static_cast<double>(a.clip_max_norm));
  o.set("moment_dtype", to_string(a.moment_dtype));
  o.set("microbatches", static_cast<std::int64_t>(a.microbatches));
  auto group = [](const AdamGroup& g) {
    json::Value v = json::Value::object();
    v.set("weight_decay", g.weight_decay);
    v.set("lr_scale", g.lr_scale);
    return v;
  };
  o.set("default_group", group(a.default_group));
  json::Value groups = json::Value::object();
  for (const auto& [name, g] : a.groups) groups.set(name, group(g));
  o.set("groups", std::move(groups));
  json::Value s = json::Value::object();
  const char* kinds[] = {"host", "constant", "warmup_cosine"};
  s.set("kind", kinds[static_cast<int>(a.lr_schedule.kind)]);
  s.set("peak", static_cast<double>(a.lr_schedule.peak));
  s.set("min_lr", static_cast<double>(a.lr_schedule.min_lr));
  s.set("warmup_steps", a.lr_schedule.warmup_steps);
  s.set("total_steps", a.lr_schedule.total_steps);
  o.set("lr_schedule", std::move(s));
  return o;
}

std::string checksum_text(std::uint32_t crc) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "crc32c:%08x", crc);
  return buf;
}

struct FileResult {
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
};

struct SavedState {
  std::int64_t step = 0;
  float loss_scale = 1.0f;
  float lr = 0.0f;
};

std::string index_text(const CheckpointTarget& t, const std::vector<FileResult>& files, const SavedState& st,
                       const CheckpointUserData& user) {
  const Layout& L = *t.layout;
  const std::vector<ParamFacts> facts = param_facts(t);
  const DType moment = t.engine->settings().adam.moment_dtype;
  const int world = L.world_size();
  json::Value root = json::Value::object();
  root.set("format", kFormat);
  root.set("format_version", kFormatVersion);
  root.set("world_size", static_cast<std::int64_t>(world));
  json::Value jf = json::Value::array();
  for (int r = 0; r < world; ++r) {
    json::Value f = json::Value::object();
    f.set("file", file_name(r, world));
    f.set("rank", static_cast<std::int64_t>(r));
    f.set("bytes", static_cast<std::int64_t>(files[static_cast<std::size_t>(r)].bytes));
    f.set("checksum", checksum_text(files[static_cast<std::size_t>(r)].crc));
    jf.push_back(std::move(f));
  }
  root.set("files", std::move(jf));
  json::Value tensors = json::Value::object();
  for (std::size_t p = 0; p < L.specs().size(); ++p) {
    const ParamSpec& spec = L.specs()[p];
    Shape member = spec.member_shapes.empty() ? spec.shape : spec.member_shapes.front();
    for (int m = 0; m < spec.members(); ++m) {
      json::Value d = json::Value::object();
      json::Value shape = json::Value::array();
      for (std::int64_t x : member) shape.push_back(x);
      d.set("shape", std::move(shape));
      const bool quantized = facts[p].mxfp8 || facts[p].nvfp4;
      d.set("param_dtype", quantized ? "bf16" : to_string(facts[p].param_dtype));
      d.set("format", facts[p].mxfp8 ? "mxfp8" : facts[p].nvfp4 ? "nvfp4" : "native");
      d.set("group", spec.group);
      tensors.set(spec.member_name(m), std::move(d));
    }
  }
  root.set("tensors", std::move(tensors));
  // Slices of every kind, from every rank's items (computed here from the layout).
  std::map<std::string, json::Value> slices;
  std::vector<std::string> order;
  for (int r = 0; r < world; ++r) {
    for (const Item& it : rank_items(L, facts, moment, r, /*with_params=*/true)) {
      const std::string key = it.key();
      auto found = slices.find(key);
      if (found == slices.end()) {
        found = slices.emplace(key, json::Value::array()).first;
        order.push_back(key);
      }
      json::Value s = json::Value::object();
      s.set("file", static_cast<std::int64_t>(r));
      s.set("offset", it.offset);
      s.set("length", it.length);
      found->second.push_back(std::move(s));
    }
  }
  json::Value js = json::Value::object();
  for (const std::string& k : order) js.set(k, std::move(slices[k]));
  root.set("slices", std::move(js));
  json::Value state = json::Value::object();
  state.set("step", st.step);
  state.set("loss_scale", static_cast<double>(st.loss_scale));
  state.set("lr", static_cast<double>(st.lr));
  root.set("state", std::move(state));
  root.set("options", options_json(t.engine->settings().adam));
  json::Value u = json::Value::object();
  for (const auto& [k, v] : user) u.set(k, v);
  root.set("user", std::move(u));
  return json::write(root, 1) + "\n";
}

// ---------------------------------------------------------------- writing one file

// Declares this rank's items in a writer (the same header whatever the data source).
SafetensorsWriter open_writer(const CheckpointTarget& t, const std::string& dir, const std::vector<Item>& items) {
  const int world = t.layout->world_size();
  SafetensorsWriter w(join(dir, file_name(t.shard_rank, world)));
  for (const Item& it : items)
    w.add_tensor(it.name(), file_dtype(it.dtype), {static_cast<std::uint64_t>(it.length)});
  w.set_metadata("format", kFormat);
  w.set_metadata("format_version", std::to_string(kFormatVersion));
  w.set_metadata("rank", std::to_string(t.shard_rank));
  w.set_metadata("world_size", std::to_string(world));
  w.write_header();
  return w;
}

std::vector<Item> own_items(const CheckpointTarget& t) {
  return rank_items(*t.layout, param_facts(t), t.engine->settings().adam.moment_dtype, t.shard_rank,
                    /*with_params=*/true);
}

// Removes a previous index first, so that a directory being overwritten is never taken
// for a complete checkpoint (collective: rank 0 removes, every rank waits for it).
void begin_save(const CheckpointTarget& t, const std::string& dir) {
  std::exception_ptr error;
  try {
    make_directory(dir);
    if (t.all->rank() == 0) {
      const std::string index = join(dir, kIndexName);
      if (exists(index)) {
        if (std::remove(index.c_str()) != 0) throw_file_error("remove", index, errno);
        fsync_directory(dir);
      }
    }
  } catch (...) {
    error = std::current_exception();
  }
  agree(*t.all, error, "saving the checkpoint to '" + dir + "'");
}

// Gathers every writing rank's file size and checksum; rank 0 writes the index; every
// rank returns once it exists (or throws with the others).
void finish_save(const CheckpointTarget& t, const std::string& dir, const std::exception_ptr& write_error,
                 FileResult mine, const SavedState& st, const CheckpointUserData& user) {
  agree(*t.all, write_error, "saving the checkpoint to '" + dir + "'");
  const auto bytes = t.all->all_gather_value(t.writes_file ? mine.bytes : 0);
  const auto crcs = t.all->all_gather_value(t.writes_file ? mine.crc : 0);
  std::exception_ptr error;
  if (t.all->rank() == 0) {
    try {
      // The writers are world ranks 0 .. W-1 (the first replica of a hybrid group).
      std::vector<FileResult> files(static_cast<std::size_t>(t.layout->world_size()));
      for (std::size_t r = 0; r < files.size(); ++r) files[r] = {bytes[r], static_cast<std::uint32_t>(crcs[r])};
      write_file_atomic(join(dir, kIndexName), index_text(t, files, st, user));
    } catch (...) {
      error = std::current_exception();
    }
  }
  agree(*t.all, error, "writing the checkpoint index of '" + dir + "'");
}

SavedState current_state(const CheckpointTarget& t, Stream stream) {
  SavedState st;
  st.step = t.engine->read_scalars(*t.all, stream).step;
  st.loss_scale = t.engine->loss_scale();
  st.lr = t.engine->lr_slot();
  return st;
}

void require_not_capturing(const CheckpointTarget& t, Stream stream, const char* call) {
  SHARDOPT_REQUIRE(t.engine->muon() == nullptr, ErrorCode::Unsupported,
                   std::string(call) + ": checkpoints of optimizers with Muon groups are not written yet (their "
                                       "momentum is not a saved kind; issue 34, part 5)");
  SHARDOPT_REQUIRE(!is_capturing(t.backend, stream), ErrorCode::CaptureRefused,
                   std::string(call) + " reads and writes files and cannot run inside a capture; call it between "
                                       "graph replays");
}

}  // namespace

// ---------------------------------------------------------------- save

void save_checkpoint(const CheckpointTarget& t, const std::string& dir, Stream stream, const CheckpointUserData& user,
                     std::size_t staging_bytes) {
  require_not_capturing(t, stream, "save");
  const SavedState st = current_state(t, stream);  // synchronizes `stream`
  begin_save(t, dir);
  std::exception_ptr error;
  FileResult mine;
  if (t.writes_file) {
    try {
      const std::vector<Item> items = own_items(t);
      SafetensorsWriter w = open_writer(t, dir, items);
      if (t.backend == Backend::Host) {
        for (std::size_t i = 0; i < items.size(); ++i) w.write(i, source_of(t, items[i]), item_bytes(items[i]));
      } else {
        // Two pinned halves in turn: the copy of the next chunk runs while this one is
        // written to the file.
        struct Chunk {
          std::size_t item;
          const char* src;
          std::size_t bytes;
        };
        const std::size_t half = std::max<std::size_t>(staging_bytes / 2, 1);
        std::vector<Chunk> chunks;
        for (std::size_t i = 0; i < items.size(); ++i)
          for (std::size_t done = 0, n = item_bytes(items[i]); done < n; done += half)
            chunks.push_back({i, source_of(t, items[i]) + done, std::min(half, n - done)});
        DeviceBuffer staging(t.backend, 2 * half, MemoryKind::Pinned);
        auto fetch = [&](std::size_t k) {
          copy_async(t.backend, staging.as<char>() + (k % 2) * half, chunks[k].src, chunks[k].bytes, stream);
        };
        if (!chunks.empty()) fetch(0);
        for (std::size_t k = 0; k < chunks.size(); ++k) {
          synchronize(t.backend, stream);  // chunk k has landed
          if (k + 1 < chunks.size()) fetch(k + 1);
          w.write(chunks[k].item, staging.as<char>() + (k % 2) * half, chunks[k].bytes);
        }
        synchronize(t.backend, stream);
      }
      mine.crc = w.finish();
      mine.bytes = w.file_bytes();
    } catch (...) {
      error = std::current_exception();
    }
  }
  finish_save(t, dir, error, mine, st, user);
}

// ---------------------------------------------------------------- async save

class SaveJob {
 public:
  SaveJob(CheckpointTarget t, std::string dir, CheckpointUserData user)
      : target(std::move(t)), dir(std::move(dir)), user(std::move(user)) {}
  ~SaveJob() {
    if (thread.joinable()) thread.join();
  }

  void wait() {
    if (waited) return;
    SHARDOPT_REQUIRE(!orphaned, ErrorCode::InvalidState,
                     "SaveHandle::wait(): the optimizer that started this save was destroyed first, so the index "
                     "of '" + dir + "' cannot be written; wait for a save before destroying its optimizer");
    waited = true;
    if (thread.joinable()) thread.join();
    finish_save(target, dir, error, result, state, user);
  }

  void orphan() noexcept {
    if (thread.joinable()) thread.join();
    orphaned = true;
  }

  CheckpointTarget target;
  std::string dir;
  CheckpointUserData user;
  SavedState state;
  std::vector<Item> items;
  std::shared_ptr<DeviceBuffer> snapshot;  // pinned (CUDA) or host copy of every item, in order
  std::thread thread;
  std::exception_ptr error;
  FileResult result;
  bool waited = false;
  bool orphaned = false;
};

std::shared_ptr<SaveJob> save_checkpoint_async(const CheckpointTarget& t, const std::string& dir, Stream stream,
                                               const CheckpointUserData& user, std::shared_ptr<DeviceBuffer>& pool) {
  require_not_capturing(t, stream, "save_async");
  auto job = std::make_shared<SaveJob>(t, dir, user);
  job->state = current_state(t, stream);
  begin_save(t, dir);
  std::exception_ptr error;
  try {
    if (t.writes_file) {
      job->items = own_items(t);
      std::size_t total = 0;
      for (const Item& it : job->items) total += item_bytes(it);
      // The pinned snapshot is kept for the next save (allocating it costs more than the copy).
      if (pool == nullptr || pool->bytes() < total)
        pool = std::make_shared<DeviceBuffer>(t.backend, total,
                                              t.backend == Backend::Cuda ? MemoryKind::Pinned : MemoryKind::Host);
      job->snapshot = pool;
      // The snapshot: one copy per item on a side stream ordered after `stream`; `stream`
      // then waits for it, so that the next step cannot change the state being copied.
      SideStream side(t.backend);
      const Stream s = side.on(stream);
      order_after(t.backend, stream, s);
      std::size_t at = 0;
      for (const Item& it : job->items) {
        copy_async(t.backend, job->snapshot->as<char>() + at, source_of(t, it), item_bytes(it), s);
        at += item_bytes(it);
      }
      order_after(t.backend, s, stream);
      synchronize(t.backend, s);  // the snapshot is in host memory before the thread starts
    }
  } catch (...) {
    error = std::current_exception();
  }
  agree(*t.all, error, "snapshotting the checkpoint state for '" + dir + "'");
  if (t.writes_file) {
    SaveJob* j = job.get();
    j->thread = std::thread([j] {
      try {
        SafetensorsWriter w = open_writer(j->target, j->dir, j->items);
        std::size_t at = 0;
        for (std::size_t i = 0; i < j->items.size(); ++i) {
          const std::size_t n = item_bytes(j->items[i]);
          w.write(i, j->snapshot->as<char>() + at, n);
          at += n;
        }
        j->result.crc = w.finish();
        j->result.bytes = w.file_bytes();
      } catch (...) {
        j->error = std::current_exception();
      }
    });
  }
  return job;
}

void wait_save(const std::shared_ptr<SaveJob>& job) {
  if (job) job->wait();
}

void orphan_save(const std::shared_ptr<SaveJob>& job) noexcept {
  if (job) job->orphan();
}

// ---------------------------------------------------------------- load

namespace {

DType dtype_of_file(const std::string& name, const std::string& where) {
  if (name == "F32") return DType::f32;
  if (name == "BF16") return DType::bf16;
  if (name == "F16") return DType::f16;
  if (name == "U8") return DType::e4m3;
  throw Error(ErrorCode::InvalidArgument, where + " has dtype " + name + ", which a shardopt checkpoint never holds "
                                                  "(F32, BF16, F16 or U8)");
}

// A part of a saved slice that this rank needs: bytes [begin, begin + bytes) of the file's
// tensor `name`, converted from `from` into elements of `to` at `dst` (the optimizer's
// buffer, written only in the second pass).
struct Read {
  std::string name;
  std::uint64_t begin = 0;
  std::uint64_t bytes = 0;
  DType from = DType::f32, to = DType::f32;
  char* dst = nullptr;
  const SafetensorsEntry* entry = nullptr;  // in the file's reader (set in pass 1)
  std::uint64_t slice_elems = 0;            // the slice's length the index gives
};

const json::Value& member(const json::Value& v, std::string_view key, const std::string& where) {
  const json::Value* found = v.find(key);
  if (found == nullptr)
    throw Error(ErrorCode::InvalidArgument, where + " has no \"" + std::string(key) + "\"; it is not a shardopt checkpoint index");
  return *found;
}

// A file name the index gives is input like any other: it must name a file inside the
// checkpoint directory, never one elsewhere (no separator, no "." or "..", not empty, no
// NUL). Returns why `name` is not such a name, or an empty string.
std::string not_plain_name(const std::string& name) {
  if (name.empty()) return "is empty";
  if (name == "." || name == "..") return "names a directory";
  if (name.find('\0') != std::string::npos) return "holds a NUL character";
  if (name.front() == '/') return "is an absolute path";
  if (name.find_first_of("/\\") != std::string::npos) return "holds a path separator";
  return {};
}

// The index's file list: one file per saving rank (world_size of them), each a plain
// file name inside `dir`.
void check_file_list(const json::Value& index, const std::string& dir, const std::string& where) {
  const std::int64_t world = member(index, "world_size", where).as_int();
  const json::Array& files = member(index, "files", where).as_array();
  if (world < 1 || static_cast<std::uint64_t>(world) != files.size())
    throw Error(ErrorCode::InvalidArgument, where + " gives world_size " + std::to_string(world) + " but lists " +
                                                std::to_string(files.size()) +
                                                " files (one per saving rank); the index is corrupt");
  for (std::size_t f = 0; f < files.size(); ++f) {
    const std::string& name = member(files[f], "file", where).as_string();
    const std::string why = not_plain_name(name);
    if (!why.empty()) {
      std::string shown;  // printable: a hostile name may hold control characters
      for (const char c : name) shown += static_cast<unsigned char>(c) < 0x20 ? '?' : c;
      throw Error(ErrorCode::InvalidArgument, where + ": file " + std::to_string(f) + " is named '" + shown + "', which " +
                                                  why + "; a checkpoint names only plain files inside its directory '" +
                                                  dir + "' (a hostile or hand-edited index?)");
    }
  }
}

json::Value read_index(const std::string& dir) {
  const std::string path = join(dir, kIndexName);
  if (!exists(path)) {
    if (!exists(dir)) throw Error(ErrorCode::InvalidArgument, "checkpoint directory '" + dir + "' does not exist");
    bool shards = false;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      shards = shards || (name.rfind("shard-", 0) == 0 && name.find(".safetensors") != std::string::npos);
    }
    if (shards)
      throw Error(ErrorCode::InvalidState, "'" + dir + "' is an incomplete checkpoint: it has shard files but no " +
                                               kIndexName + " (a save did not finish); load an earlier checkpoint");
    throw Error(ErrorCode::InvalidArgument, "'" + dir + "' is not a shardopt checkpoint (no " + kIndexName + ")");
  }
  json::Value index;
  try {
    index = json::parse(read_file(path, std::size_t{1} << 30));
  } catch (const Error& e) {
    throw Error(ErrorCode::InvalidArgument, path + " is not valid JSON (" + e.what() + "); the checkpoint is corrupt");
  }
  const std::string where = path;
  if (!index.is_object() || member(index, "format", where).as_string() != kFormat)
    throw Error(ErrorCode::InvalidArgument, path + " is not a shardopt checkpoint index (no \"format\": \"" + kFormat + "\")");
  const std::int64_t version = member(index, "format_version", where).as_int();
  if (version > kFormatVersion)
    throw Error(ErrorCode::Unsupported, "'" + dir + "' was written in checkpoint format version " + std::to_string(version) +
                                            ", newer than this shardopt reads (" + std::to_string(kFormatVersion) +
                                            "); load it with a newer shardopt");
  check_file_list(index, dir, where);
  return index;
}

// Pass 2 of a load: every read of `plan` (files already checked, readers open) into the
// optimizer's buffers, in chunks through a pinned ring: a few chunks are read by their own
// threads at once (the bytes are normally in the page cache: several readers go faster
// than one), converted on the host where the dtype changes, and copied to the device in
// order on `stream`; a slot is reused once its copy is done.
void read_into_buffers(Backend backend, const std::map<std::int64_t, std::vector<Read>>& plan,
                       const std::map<std::int64_t, std::unique_ptr<SafetensorsReader>>& files, Stream stream) {
  constexpr std::size_t kSlotElems = std::size_t{4} << 20;
  constexpr std::size_t kSlotBytes = kSlotElems * 4;  // the widest dtype: f32
  constexpr std::size_t kSlots = 6;
  struct Chunk {
    const SafetensorsReader* reader;
    const Read* read;
    std::uint64_t first, count;  // elements of the read
  };
  std::vector<Chunk> chunks;
  for (const auto& [f, reads] : plan)
    for (const Read& r : reads) {
      const std::uint64_t n = r.bytes / size_of(r.from);
      for (std::uint64_t first = 0; first < n; first += kSlotElems)
        chunks.push_back({files.at(f).get(), &r, first, std::min<std::uint64_t>(kSlotElems, n - first)});
    }
  if (chunks.empty()) return;
  // Per slot: the file's bytes, then (dtype changes only) the converted elements.
  DeviceBuffer ring(backend, kSlots * 2 * kSlotBytes, backend == Backend::Cuda ? MemoryKind::Pinned : MemoryKind::Host);
  auto raw = [&](std::size_t k) { return ring.as<char>() + (k % kSlots) * 2 * kSlotBytes; };
  struct Drain {  // on every exit, no copy from the ring is left in flight when it goes
    Backend backend;
    Stream stream;
    ~Drain() {
      try {
        synchronize(backend, stream);
      } catch (...) {  // the device's own error: the caller's next call reports it
      }
    }
  } drain{backend, stream};
  std::vector<Event> copied;
  for (std::size_t i = 0; i < kSlots; ++i) copied.emplace_back(backend);
  std::vector<std::future<void>> reading(kSlots);  // after `ring`: a throw waits for them before it goes
  auto start = [&](std::size_t k) {
    copied[k % kSlots].synchronize();  // the slot's previous chunk has reached the device
    const Chunk c = chunks[k];
    const std::size_t es = size_of(c.read->from);
    reading[k % kSlots] = std::async(std::launch::async, [c, es, dst = raw(k)] {
      c.reader->read(*c.read->entry, c.read->begin + c.first * es, dst, static_cast<std::size_t>(c.count * es));
    });
  };
  for (std::size_t k = 0; k < std::min(kSlots - 1, chunks.size()); ++k) start(k);
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    reading[k % kSlots].get();
    const Chunk& c = chunks[k];
    const Read& r = *c.read;
    const char* src = raw(k);
    if (r.from != r.to) {
      char* converted = raw(k) + kSlotBytes;
      kernels::convert(src, r.from, converted, r.to, static_cast<std::int64_t>(c.count), Backend::Host, nullptr);
      src = converted;
    }
    copy_async(backend, r.dst + c.first * size_of(r.to), src, static_cast<std::size_t>(c.count * size_of(r.to)),
               stream);
    copied[k % kSlots].record(stream);
    // Keep kSlots - 1 reads in flight; the slot of chunk k - 1 holds its copy, so the
    // next chunk goes to the slot after it.
    if (k + kSlots - 1 < chunks.size()) start(k + kSlots - 1);
  }
  synchronize(backend, stream);  // errors of the copies surface here, not in drain
}

}  // namespace

CheckpointInfo load_checkpoint(const CheckpointTarget& t, const std::string& dir, Stream stream) {
  require_not_capturing(t, stream, "load");
  const Layout& L = *t.layout;
  const DType moment = t.engine->settings().adam.moment_dtype;
  CheckpointInfo info;
  // Pass 1 reads every byte of every file this rank needs and checks it (header, sizes,
  // dtypes, checksum) without writing anything; the ranks agree; pass 2 reads the needed
  // slices again (from the page cache the first pass filled) into the optimizer's buffers.
  // So a bad checkpoint changes nothing, and no host copy of the state is made.
  ShardEngine& e = *t.engine;
  std::vector<Item> items;
  std::map<std::int64_t, std::vector<Read>> plan;                 // file -> its reads
  std::map<std::int64_t, std::unique_ptr<SafetensorsReader>> open_files;  // kept open for pass 2
  std::exception_ptr error;
  try {
    const json::Value index = read_index(dir);
    const std::string where = join(dir, kIndexName);
    const json::Value& files = member(index, "files", where);
    const json::Value& tensors = member(index, "tensors", where);
    const json::Value& slices = member(index, "slices", where);
    const json::Value& state = member(index, "state", where);
    info.step = member(state, "step", where).as_int();
    info.loss_scale = static_cast<float>(member(state, "loss_scale", where).as_double());
    info.lr = static_cast<float>(member(state, "lr", where).as_double());
    info.saved_world_size = static_cast<int>(member(index, "world_size", where).as_int());
    if (const json::Value* u = index.find("user"))
      for (const auto& [k, v] : u->as_object()) info.user[k] = v.as_string();
    if (const json::Value* o = index.find("options")) info.options_json = json::write(*o);
    // Every model tensor of this optimizer exists there, with its shape.
    for (const ParamSpec& spec : L.specs()) {
      const Shape shape = spec.member_shapes.empty() ? spec.shape : spec.member_shapes.front();
      for (int m = 0; m < spec.members(); ++m) {
        const std::string name = spec.member_name(m);
        const json::Value* d = tensors.find(name);
        if (d == nullptr)
          throw Error(ErrorCode::InvalidArgument, "checkpoint '" + dir + "' has no tensor '" + name +
                                                      "'; it was saved from another model (or with other names)");
        Shape saved;
        for (const json::Value& x : member(*d, "shape", where).as_array()) saved.push_back(x.as_int());
        if (saved != shape) {
          auto str = [](const Shape& s) {
            std::string out = "[";
            for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
            return out + "]";
          };
          throw Error(ErrorCode::InvalidArgument, "tensor '" + name + "' has shape " + str(saved) + " in checkpoint '" +
                                                      dir + "' but " + str(shape) + " here");
        }
      }
    }
    // What this rank needs: its master and moment items.
    items = rank_items(L, param_facts(t), moment, t.shard_rank, /*with_params=*/false);
    // Plan the reads, file by file.
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Item& it = items[i];
      const json::Value* list = slices.find(it.key());
      if (list == nullptr)
        throw Error(ErrorCode::InvalidArgument, "checkpoint '" + dir + "' holds no '" + it.key() + "' slices");
      std::int64_t covered = 0;
      for (const json::Value& s : list->as_array()) {
        const std::int64_t so = member(s, "offset", where).as_int(), sl = member(s, "length", where).as_int();
        if (so < 0 || sl < 0 || sl > INT64_MAX - so)
          throw Error(ErrorCode::InvalidArgument, where + ": a '" + it.key() + "' slice has offset " +
                                                      std::to_string(so) + " and length " + std::to_string(sl) +
                                                      ", which is no range of elements; the index is corrupt");
        const std::int64_t lo = std::max(so, it.offset), hi = std::min(so + sl, it.offset + it.length);
        if (lo >= hi) continue;
        covered += hi - lo;
        Read r;
        r.name = it.key() + "@" + std::to_string(so);
        r.to = it.dtype;
        r.begin = static_cast<std::uint64_t>(lo - so);  // elements for now: bytes once the file's dtype is known
        r.bytes = static_cast<std::uint64_t>(hi - lo);
        r.slice_elems = static_cast<std::uint64_t>(sl);
        const ShardView v = it.kind == Kind::Master   ? e.master_view(it.param)
                            : it.kind == Kind::ExpAvg ? e.exp_avg_view(it.param)
                                                      : e.exp_avg_sq_view(it.param);
        r.dst = static_cast<char*>(v.data) + static_cast<std::size_t>(it.src + (lo - it.offset)) * size_of(it.dtype);
        plan[member(s, "file", where).as_int()].push_back(std::move(r));
      }
      if (covered != it.length)
        throw Error(ErrorCode::InvalidArgument, "checkpoint '" + dir + "': the '" + it.key() + "' slices cover " +
                                                    std::to_string(covered) + " of the " + std::to_string(it.length) +
                                                    " elements [" + std::to_string(it.offset) + ", " +
                                                    std::to_string(it.offset + it.length) +
                                                    ") this rank needs; the index is corrupt");
    }
    // One sequential pass per file: checksum every byte, copy out the parts needed.
    const auto& file_list = files.as_array();
    for (auto& [f, reads] : plan) {
      if (f < 0 || f >= static_cast<std::int64_t>(file_list.size()))
        throw Error(ErrorCode::InvalidArgument, where + " names file " + std::to_string(f) + " of " +
                                                    std::to_string(file_list.size()) + "; the index is corrupt");
      const json::Value& fd = file_list[static_cast<std::size_t>(f)];
      const std::string path = join(dir, member(fd, "file", where).as_string());
      if (!exists(path))
        throw Error(ErrorCode::InvalidArgument, "checkpoint file '" + path + "' is missing; the checkpoint is incomplete");
      SafetensorsReader& reader = *(open_files[f] = std::make_unique<SafetensorsReader>(path));  // validates the header
      const std::uint64_t want = static_cast<std::uint64_t>(member(fd, "bytes", where).as_int());
      if (reader.file_bytes() != want)
        throw Error(ErrorCode::InvalidArgument, "checkpoint file '" + path + "' has " + std::to_string(reader.file_bytes()) +
                                                    " bytes but the index says " + std::to_string(want) + "; it is damaged");
      const std::string* recorded = reader.find_metadata(kChecksumKey);
      if (recorded == nullptr || *recorded != member(fd, "checksum", where).as_string())
        throw Error(ErrorCode::InvalidArgument, "checkpoint file '" + path + "' does not carry the checksum the index "
                                                    "names; it belongs to another save");
      for (Read& r : reads) {
        const SafetensorsEntry* e = reader.find(r.name);
        if (e == nullptr)
          throw Error(ErrorCode::InvalidArgument, "checkpoint file '" + path + "' has no tensor '" + r.name +
                                                      "' although the index lists it; the checkpoint is corrupt");
        r.from = dtype_of_file(e->dtype, "tensor '" + r.name + "' of '" + path + "'");
        if (r.from == DType::e4m3 || (r.from != DType::f32 && r.from != DType::bf16 && r.from != DType::f16))
          throw Error(ErrorCode::InvalidArgument, "tensor '" + r.name + "' of '" + path + "' has dtype " + e->dtype +
                                                      ", not a master or moment dtype");
        if (e->bytes() % size_of(r.from) != 0 || e->bytes() / size_of(r.from) != r.slice_elems)
          throw Error(ErrorCode::InvalidArgument, "tensor '" + r.name + "' of '" + path + "' holds " +
                                                      std::to_string(e->bytes() / size_of(r.from)) +
                                                      " elements but the index gives its slice " +
                                                      std::to_string(r.slice_elems) + "; the checkpoint is corrupt");
        r.begin *= size_of(r.from);
        r.bytes *= size_of(r.from);
        r.entry = e;
      }
      // Chunks of the data section in file order; the next one is read by a second thread
      // while this one is checksummed and copied out, so the disk never waits for us.
      struct Piece {
        const SafetensorsEntry* entry;
        std::uint64_t at;
        std::size_t n;
      };
      constexpr std::size_t kChunk = std::size_t{16} << 20;
      std::vector<Piece> pieces;
      for (const SafetensorsEntry& e : reader.tensors())
        for (std::uint64_t at = 0; at < e.bytes(); at += kChunk)
          pieces.push_back({&e, at, static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, e.bytes() - at))});
      std::vector<char> bufs[2] = {std::vector<char>(kChunk), std::vector<char>(kChunk)};
      auto fetch = [&](std::size_t k) {
        const Piece& p = pieces[k];
        return std::async(std::launch::async,
                          [&reader, &p, dst = bufs[k % 2].data()] { reader.read(*p.entry, p.at, dst, p.n); });
      };
      std::future<void> ahead;  // declared after the buffers: a throw waits for it before they go
      if (!pieces.empty()) ahead = fetch(0);
      std::uint32_t crc = 0;
      for (std::size_t k = 0; k < pieces.size(); ++k) {
        ahead.get();
        if (k + 1 < pieces.size()) ahead = fetch(k + 1);
        crc = crc32c_update(crc, bufs[k % 2].data(), pieces[k].n);
      }
      if (checksum_text(crc) != *recorded)
        throw Error(ErrorCode::InvalidArgument, "checkpoint file '" + path + "' fails its checksum (recorded " +
                                                    *recorded + ", computed " + checksum_text(crc) +
                                                    "): the file is corrupt; load another checkpoint");
    }
  } catch (...) {
    error = std::current_exception();
  }
  agree(*t.all, error, "loading the checkpoint '" + dir + "'");
  // Pass 2: every rank's files passed; read the slices into the buffers in place.
  try {
    read_into_buffers(t.backend, plan, open_files, stream);
  } catch (...) {
    error = std::current_exception();
  }
  agree(*t.all, error,
        "loading the checkpoint '" + dir + "' (its files had passed every check, and reading them a second time "
        "failed: the optimizer's state is now partly loaded; load a checkpoint again before training)");
  e.set_step(info.step, stream);
  e.set_lr(info.lr);
  e.set_loss_scale(info.loss_scale);
  return info;
}

}  // namespace shardopt::detail

// ---------------------------------------------------------------- the public handle

namespace shardopt {

SaveHandle::SaveHandle() = default;
SaveHandle::SaveHandle(std::shared_ptr<detail::SaveJob> job) : job_(std::move(job)) {}
SaveHandle::~SaveHandle() = default;
SaveHandle::SaveHandle(SaveHandle&&) noexcept = default;
SaveHandle& SaveHandle::operator=(SaveHandle&&) noexcept = default;

void SaveHandle::wait() {
  if (job_) job_->wait();
}

bool SaveHandle::done() const noexcept { return job_ == nullptr || job_->waited; }

}  // namespace shardopt
