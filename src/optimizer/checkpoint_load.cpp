#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "core/streams.hpp"
#include "core/trace.hpp"
#include "formats/crc32c.hpp"
#include "formats/file_io.hpp"
#include "formats/json.hpp"
#include "formats/safetensors.hpp"
#include "kernels/common/convert.hpp"
#include "optimizer/checkpoint.hpp"
#include "optimizer/checkpoint_index.hpp"
#include "shardopt/error.hpp"

// The reader: the index read and checked, then two passes (verify every byte, agree,
// read the slices into the buffers).
namespace shardopt::detail {
using namespace ckpt;

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
  bool f32_only = false;                    // Muon's momentum: F32 in the file, no conversion
};

// Why `slices` has no `it.key()` list, when the checkpoint holds the other algorithm's
// state of the parameter (Adam's moments for one this run updates with Muon, or the
// reverse); empty otherwise. Neither is converted into the other (docs/checkpoints.md).
std::string other_algorithm(const json::Value& slices, const Item& it, const std::string& dir) {
  const bool want_muon = it.kind == Kind::MuonMomentum;
  if (want_muon ? json::find(slices, it.tensor + "/exp_avg") == nullptr : json::find(slices, it.tensor + "/muon_momentum") == nullptr)
    return {};
  const std::string saved = want_muon ? "AdamW" : "Muon", here = want_muon ? "Muon" : "AdamW";
  return "checkpoint '" + dir + "' holds the " + saved + " state of parameter '" + it.tensor + "' (" +
         (want_muon ? "exp_avg and exp_avg_sq" : "muon_momentum") + ") but this optimizer updates it with " + here +
         ", which needs its " + (want_muon ? "muon_momentum" : "exp_avg and exp_avg_sq") +
         "; the optimizer state is not converted between algorithms: put '" + it.tensor + "' in a group of the "
         "saving run's algorithm (" + saved + ") to resume, or start the " + here +
         " run from the weights alone (the checkpoint's master, docs/checkpoints.md)";
}

const json::Value& member(const json::Value& v, std::string_view key, const std::string& where) {
  const json::Value* found = json::find(v, key);
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
  const std::int64_t world = json::as_int(member(index, "world_size", where));
  const json::Array& files = json::as_array(member(index, "files", where));
  if (world < 1 || static_cast<std::uint64_t>(world) != files.size())
    throw Error(ErrorCode::InvalidArgument, where + " gives world_size " + std::to_string(world) + " but lists " +
                                                std::to_string(files.size()) +
                                                " files (one per saving rank); the index is corrupt");
  for (std::size_t f = 0; f < files.size(); ++f) {
    const std::string& name = json::as_string(member(files[f], "file", where));
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
  if (!index.is_object() || json::as_string(member(index, "format", where)) != kFormat)
    throw Error(ErrorCode::InvalidArgument, path + " is not a shardopt checkpoint index (no \"format\": \"" + kFormat + "\")");
  const std::int64_t version = json::as_int(member(index, "format_version", where));
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
  SHARDOPT_TRACE("shardopt/checkpoint/load");
  require_not_capturing(t, stream, "load");
  const Layout& L = *t.layout;
  const DType moment = t.engine->checkpoint_moment_dtype();
  CheckpointInfo info;
  // Pass 1 reads every byte of every file this rank needs and checks it (header, sizes,
  // dtypes, checksum) without writing anything; the ranks agree; pass 2 reads the needed
  // slices again (from the page cache the first pass filled) into the optimizer's buffers.
  // So a bad checkpoint changes nothing, and no host copy of the state is made.
  ShardEngine& e = *t.engine;
  StagedMaster staged(e, stream);  // remainder-kept masters are read into a staged fp32 copy
  std::vector<Item> items;
  std::map<std::int64_t, std::vector<Read>> plan;                 // file -> its reads
  std::map<std::int64_t, std::unique_ptr<SafetensorsReader>> open_files;  // kept open for pass 2
  std::exception_ptr error;
  try {
    SHARDOPT_TRACE("shardopt/checkpoint/verify");
    const json::Value index = read_index(dir);
    const std::string where = join(dir, kIndexName);
    const json::Value& files = member(index, "files", where);
    const json::Value& tensors = member(index, "tensors", where);
    const json::Value& slices = member(index, "slices", where);
    const json::Value& state = member(index, "state", where);
    info.step = json::as_int(member(state, "step", where));
    info.loss_scale = static_cast<float>(json::as_double(member(state, "loss_scale", where)));
    info.lr = static_cast<float>(json::as_double(member(state, "lr", where)));
    info.saved_world_size = static_cast<int>(json::as_int(member(index, "world_size", where)));
    if (const json::Value* u = json::find(index, "user"))
      for (const auto& [k, v] : json::as_object(*u)) info.user[k] = json::as_string(v);
    if (const json::Value* o = json::find(index, "options")) info.options_json = json::write(*o);
    // Every model tensor of this optimizer exists there, with its shape.
    for (const ParamSpec& spec : L.specs()) {
      const Shape shape = spec.member_shapes.empty() ? spec.shape : spec.member_shapes.front();
      for (int m = 0; m < spec.members(); ++m) {
        const std::string name = spec.member_name(m);
        const json::Value* d = json::find(tensors, name);
        if (d == nullptr)
          throw Error(ErrorCode::InvalidArgument, "checkpoint '" + dir + "' has no tensor '" + name +
                                                      "'; it was saved from another model (or with other names)");
        Shape saved;
        for (const json::Value& x : json::as_array(member(*d, "shape", where))) saved.push_back(json::as_int(x));
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
    // What this rank needs: its master and moment items, and the momentum of its Muon matrices.
    items = rank_items(L, param_facts(t), muon_matrices_of(t), moment, t.shard_rank, /*with_params=*/false);
    // Plan the reads, file by file.
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Item& it = items[i];
      const json::Value* list = json::find(slices, it.key());
      if (list == nullptr) {
        const std::string other = other_algorithm(slices, it, dir);
        throw Error(ErrorCode::InvalidArgument,
                    other.empty() ? "checkpoint '" + dir + "' holds no '" + it.key() + "' slices" : other);
      }
      std::int64_t covered = 0;
      for (const json::Value& s : json::as_array(*list)) {
        const std::int64_t so = json::as_int(member(s, "offset", where)), sl = json::as_int(member(s, "length", where));
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
        if (it.kind == Kind::MuonMomentum) {  // whole at the home: src is the matrix index
          r.f32_only = true;
          r.dst = reinterpret_cast<char*>(e.muon()->momentum(static_cast<int>(it.src))) +
                  static_cast<std::size_t>(lo - it.offset) * sizeof(float);
        } else {
          const ShardView v = it.kind == Kind::Master   ? e.master_view(it.param)
                              : it.kind == Kind::ExpAvg ? e.exp_avg_view(it.param)
                                                        : e.exp_avg_sq_view(it.param);
          r.dst = static_cast<char*>(v.data) + static_cast<std::size_t>(it.src + (lo - it.offset)) * size_of(it.dtype);
        }
        plan[json::as_int(member(s, "file", where))].push_back(std::move(r));
      }
      if (covered != it.length)
        throw Error(ErrorCode::InvalidArgument, "checkpoint '" + dir + "': the '" + it.key() + "' slices cover " +
                                                    std::to_string(covered) + " of the " + std::to_string(it.length) +
                                                    " elements [" + std::to_string(it.offset) + ", " +
                                                    std::to_string(it.offset + it.length) +
                                                    ") this rank needs; the index is corrupt");
    }
    // One sequential pass per file: checksum every byte, copy out the parts needed.
    const auto& file_list = json::as_array(files);
    for (auto& [f, reads] : plan) {
      if (f < 0 || f >= static_cast<std::int64_t>(file_list.size()))
        throw Error(ErrorCode::InvalidArgument, where + " names file " + std::to_string(f) + " of " +
                                                    std::to_string(file_list.size()) + "; the index is corrupt");
      const json::Value& fd = file_list[static_cast<std::size_t>(f)];
      const std::string path = join(dir, json::as_string(member(fd, "file", where)));
      if (!exists(path))
        throw Error(ErrorCode::InvalidArgument, "checkpoint file '" + path + "' is missing; the checkpoint is incomplete");
      SafetensorsReader& reader = *(open_files[f] = std::make_unique<SafetensorsReader>(path));  // validates the header
      const std::uint64_t want = static_cast<std::uint64_t>(json::as_int(member(fd, "bytes", where)));
      if (reader.file_bytes() != want)
        throw Error(ErrorCode::InvalidArgument, "checkpoint file '" + path + "' has " + std::to_string(reader.file_bytes()) +
                                                    " bytes but the index says " + std::to_string(want) + "; it is damaged");
      const std::string* recorded = reader.find_metadata(kChecksumKey);
      if (recorded == nullptr || *recorded != json::as_string(member(fd, "checksum", where)))
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
        if (e->shape.size() != 1)
          throw Error(ErrorCode::InvalidArgument, "tensor '" + r.name + "' of '" + path + "' has " +
                                                      std::to_string(e->shape.size()) +
                                                      " dimensions; it is not a 1-D slice, as every tensor of a "
                                                      "shardopt checkpoint is: the checkpoint is corrupt");
        if (r.f32_only && r.from != DType::f32)
          throw Error(ErrorCode::InvalidArgument, "tensor '" + r.name + "' of '" + path + "' has dtype " + e->dtype +
                                                      "; Muon's momentum is saved as F32 only (docs/checkpoints.md), "
                                                      "the checkpoint is corrupt");
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
    SHARDOPT_TRACE("shardopt/checkpoint/read");
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
  staged.keep();  // the front end's publish_master splits it into parameters and remainders
  return info;
}

}  // namespace shardopt::detail
