// checkpoint_index.hpp - internal to the checkpoint code: what each rank saves (its
// items, the same list whichever rank computes it), the index.json text, the agreement of
// the ranks after each collective phase, and the small file helpers the writer
// (checkpoint_save.cpp) and the reader (checkpoint_load.cpp) share. Definitions in
// checkpoint_index.cpp; the format is docs/checkpoints.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "optimizer/checkpoint.hpp"
#include "optimizer/muon_plan.hpp"

namespace shardopt::detail::ckpt {

inline constexpr const char* kFormat = "shardopt-checkpoint";
inline constexpr std::int64_t kFormatVersion = 1;
inline constexpr const char* kIndexName = "index.json";

// ---------------------------------------------------------------- what a rank saves

enum class Kind {
  Master, ExpAvg, ExpAvgSq, Param, MxRowData, MxColData, MxRowScale, MxColScale, Nv4Data, Nv4Scale, Nv4Amax,
  MuonMomentum  // a Muon matrix's momentum, whole, written by its home rank (src = the matrix index)
};

/// The kind's part of a file tensor's name ("master", "mxfp8_row_data", ...).
const char* kind_name(Kind k);

/// The file of `rank` among `world` writers: shard-RRRRR-of-WWWWW.safetensors.
std::string file_name(int rank, int world);

/// `dir`/`name`.
std::string join(const std::string& dir, const std::string& name);


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
  bool muon = false;       // in a Muon group: its momentum is saved, not Adam's moments
  DType param_dtype = DType::f32;
  Mxfp8Shape shape;        // MXFP8 parameters
  Nvfp4Shape nv_shape;     // NVFP4 parameters: one member
};

/// The facts of every parameter of the target's layout.
std::vector<ParamFacts> param_facts(const CheckpointTarget& t);

/// The Muon matrices of the target (with their homes), empty without Muon groups.
const std::vector<MuonMatrixInfo>& muon_matrices_of(const CheckpointTarget& t);

/// Rank r's items, in a fixed order (buffers, then its segments in shard order, then the
/// momentum of the Muon matrices homed at r, then the MXFP8 scale shares), the same
/// whichever rank computes them.
std::vector<Item> rank_items(const Layout& L, const std::vector<ParamFacts>& facts,
                             const std::vector<MuonMatrixInfo>& muon, DType moment, int r, bool with_params);

/// The safetensors dtype an item's elements are written as (raw bytes "U8" for e4m3 / e8m0).
const char* file_dtype(DType t);

/// Where own-rank item `it` lives in device (or host-backend) memory.
const char* source_of(const CheckpointTarget& t, const Item& it);

/// The item's bytes in the file.
std::size_t item_bytes(const Item& it);

// ---------------------------------------------------------------- agreement

/// Every rank learns whether every rank succeeded; if one failed, every rank throws: the
/// failing one its own error, the others one that names it and quotes its message.
void agree(const Communicator& all, const std::exception_ptr& mine, const std::string& what);

/// Creates `dir` (one level) unless it is a directory already.
void make_directory(const std::string& dir);

/// True when `path` exists.
bool exists(const std::string& path);

/// Refuses a save or load inside a capture (Error(CaptureRefused) naming `call`).
void require_not_capturing(const CheckpointTarget& t, Stream stream, const char* call);

// ---------------------------------------------------------------- the index

/// The checksum as the index and the file's metadata write it: "crc32c:xxxxxxxx".
std::string checksum_text(std::uint32_t crc);

struct FileResult {
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
};

struct SavedState {
  std::int64_t step = 0;
  float loss_scale = 1.0f;
  float lr = 0.0f;
};

/// The text of index.json: every rank's file, every model tensor, every rank's slices
/// (computed from the layout), the step state, the Adam options and the user's strings.
std::string index_text(const CheckpointTarget& t, const std::vector<FileResult>& files, const SavedState& st,
                       const CheckpointUserData& user);

}  // namespace shardopt::detail::ckpt
