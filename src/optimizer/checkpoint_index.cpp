#include "optimizer/checkpoint_index.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "core/check.hpp"
#include "formats/file_io.hpp"
#include "formats/json.hpp"
#include "formats/safetensors.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail::ckpt {

// ---------------------------------------------------------------- what a rank saves

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
    case Kind::MuonMomentum: return "muon_momentum";
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

const std::vector<MuonMatrixInfo>& muon_matrices_of(const CheckpointTarget& t) {
  static const std::vector<MuonMatrixInfo> none;
  return t.engine->muon() == nullptr ? none : t.engine->muon()->matrices();
}

std::vector<ParamFacts> param_facts(const CheckpointTarget& t) {
  const Layout& L = *t.layout;
  std::vector<ParamFacts> out(L.params().size());
  for (const MuonMatrixInfo& mi : muon_matrices_of(t)) out[static_cast<std::size_t>(mi.param)].muon = true;
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
// momentum of the Muon matrices homed at r, then the MXFP8 scale shares), the same
// whichever rank computes them.
std::vector<Item> rank_items(const Layout& L, const std::vector<ParamFacts>& facts,
                             const std::vector<MuonMatrixInfo>& muon, DType moment, int r, bool with_params) {
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
        if (!f.muon) {  // a Muon parameter has no Adam moments to save (its momentum follows)
          add(Kind::ExpAvg, moment, it.src);
          add(Kind::ExpAvgSq, moment, it.src);
        }
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
  // Muon's momentum lives whole at each matrix's home: the home writes it as one slice
  // covering the member (model space, like the master).
  for (std::size_t k = 0; k < muon.size(); ++k) {
    const MuonMatrixInfo& mi = muon[k];
    if (mi.home != r) continue;
    Item it;
    it.tensor = L.specs()[static_cast<std::size_t>(mi.param)].member_name(mi.member);
    it.kind = Kind::MuonMomentum;
    it.param = mi.param;
    it.offset = 0;
    it.length = mi.rows * mi.cols;
    it.src = static_cast<std::int64_t>(k);
    it.dtype = DType::f32;
    out.push_back(std::move(it));
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
    case Kind::MuonMomentum: return reinterpret_cast<const char*>(e.muon()->momentum(static_cast<int>(it.src)));
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

namespace {

json::Value options_json(const AdamOptions& a) {
  json::Value o = json::Value::object();
  o["beta1"] = a.beta1;
  o["beta2"] = a.beta2;
  o["eps"] = a.eps;
  o["decoupled_weight_decay"] = a.decoupled_weight_decay;
  o["clip_max_norm"] = static_cast<double>(a.clip_max_norm);
  o["moment_dtype"] = to_string(a.moment_dtype);
  o["master_storage"] = to_string(a.master_storage);
  o["microbatches"] = static_cast<std::int64_t>(a.microbatches);
  auto group = [](const AdamGroup& g) {
    json::Value v = json::Value::object();
    v["weight_decay"] = g.weight_decay;
    v["lr_scale"] = g.lr_scale;
    if (g.algorithm == GroupAlgorithm::Muon) {  // AdamW groups read as before
      const MuonSettings& m = g.muon;
      v["algorithm"] = to_string(g.algorithm);
      json::Value mv = json::Value::object();
      mv["momentum"] = m.momentum;
      mv["nesterov"] = m.nesterov;
      mv["ns_steps"] = static_cast<std::int64_t>(m.ns_steps);
      json::Value c = json::Value::array();
      for (const double x : m.ns_coefficients) c.push_back(x);
      mv["ns_coefficients"] = std::move(c);
      mv["eps"] = m.eps;
      mv["weight_decay"] = m.weight_decay;
      mv["adjust_lr"] = to_string(m.adjust_lr);
      v["muon"] = std::move(mv);
    }
    return v;
  };
  o["default_group"] = group(a.default_group);
  json::Value groups = json::Value::object();
  for (const auto& [name, g] : a.groups) groups[name] = group(g);
  o["groups"] = std::move(groups);
  json::Value s = json::Value::object();
  const char* kinds[] = {"host", "constant", "warmup_cosine"};
  s["kind"] = kinds[static_cast<int>(a.lr_schedule.kind)];
  s["peak"] = static_cast<double>(a.lr_schedule.peak);
  s["min_lr"] = static_cast<double>(a.lr_schedule.min_lr);
  s["warmup_steps"] = a.lr_schedule.warmup_steps;
  s["total_steps"] = a.lr_schedule.total_steps;
  o["lr_schedule"] = std::move(s);
  return o;
}

}  // namespace

std::string checksum_text(std::uint32_t crc) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "crc32c:%08x", crc);
  return buf;
}

std::string index_text(const CheckpointTarget& t, const std::vector<FileResult>& files, const SavedState& st,
                       const CheckpointUserData& user) {
  const Layout& L = *t.layout;
  const std::vector<ParamFacts> facts = param_facts(t);
  const DType moment = t.engine->checkpoint_moment_dtype();
  const int world = L.world_size();
  json::Value root = json::Value::object();
  root["format"] = kFormat;
  root["format_version"] = kFormatVersion;
  root["world_size"] = static_cast<std::int64_t>(world);
  json::Value jf = json::Value::array();
  for (int r = 0; r < world; ++r) {
    json::Value f = json::Value::object();
    f["file"] = file_name(r, world);
    f["rank"] = static_cast<std::int64_t>(r);
    f["bytes"] = static_cast<std::int64_t>(files[static_cast<std::size_t>(r)].bytes);
    f["checksum"] = checksum_text(files[static_cast<std::size_t>(r)].crc);
    jf.push_back(std::move(f));
  }
  root["files"] = std::move(jf);
  json::Value tensors = json::Value::object();
  for (std::size_t p = 0; p < L.specs().size(); ++p) {
    const ParamSpec& spec = L.specs()[p];
    Shape member = spec.member_shapes.empty() ? spec.shape : spec.member_shapes.front();
    for (int m = 0; m < spec.members(); ++m) {
      json::Value d = json::Value::object();
      json::Value shape = json::Value::array();
      for (std::int64_t x : member) shape.push_back(x);
      d["shape"] = std::move(shape);
      const bool quantized = facts[p].mxfp8 || facts[p].nvfp4;
      d["param_dtype"] = quantized ? "bf16" : to_string(facts[p].param_dtype);
      d["format"] = facts[p].mxfp8 ? "mxfp8" : facts[p].nvfp4 ? "nvfp4" : "native";
      d["group"] = spec.group;
      d["algorithm"] = facts[p].muon ? "muon" : "adamw";
      tensors[spec.member_name(m)] = std::move(d);
    }
  }
  root["tensors"] = std::move(tensors);
  // Slices of every kind, from every rank's items (computed here from the layout).
  std::map<std::string, json::Value> slices;
  std::vector<std::string> order;
  for (int r = 0; r < world; ++r) {
    for (const Item& it : rank_items(L, facts, muon_matrices_of(t), moment, r, /*with_params=*/true)) {
      const std::string key = it.key();
      auto found = slices.find(key);
      if (found == slices.end()) {
        found = slices.emplace(key, json::Value::array()).first;
        order.push_back(key);
      }
      json::Value s = json::Value::object();
      s["file"] = static_cast<std::int64_t>(r);
      s["offset"] = it.offset;
      s["length"] = it.length;
      found->second.push_back(std::move(s));
    }
  }
  json::Value js = json::Value::object();
  for (const std::string& k : order) js[k] = std::move(slices[k]);
  root["slices"] = std::move(js);
  json::Value state = json::Value::object();
  state["step"] = st.step;
  state["loss_scale"] = static_cast<double>(st.loss_scale);
  state["lr"] = static_cast<double>(st.lr);
  root["state"] = std::move(state);
  root["options"] = options_json(t.engine->settings().adam);
  json::Value u = json::Value::object();
  for (const auto& [k, v] : user) u[k] = v;
  root["user"] = std::move(u);
  return json::write(root, 1) + "\n";
}

void require_not_capturing(const CheckpointTarget& t, Stream stream, const char* call) {
  SHARDOPT_REQUIRE(!is_capturing(t.backend, stream), ErrorCode::CaptureRefused,
                   std::string(call) + " reads and writes files and cannot run inside a capture; call it between "
                                       "graph replays");
}

}  // namespace shardopt::detail::ckpt
