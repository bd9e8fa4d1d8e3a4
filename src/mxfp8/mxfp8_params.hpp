// mxfp8_params.hpp - the MXFP8 parameters of a DistributedAdam: their persistent
// storage, the per-bucket quantize -> all-gather (through the gradient buffer) -> land
// -> zero pipeline, and the per-bucket gather state machine (docs/mxfp8.md).
//
// Storage: one allocation. First, per MXFP8 parameter, its rowwise then its columnwise
// e4m3 data ([G, rows, cols] each); then the scales, bucket by bucket in bucket order,
// and inside a bucket parameter by parameter (rowwise then columnwise scale tensor), so
// that the scale bytes of any run of consecutive buckets are one contiguous span: one
// e8m0 Max all-reduce exchanges them (scheme A of shardopt/mxfp8.hpp). Every piece
// starts on a 16-byte boundary; the gaps stay zero (and zero is neutral for Max).
//
// Staging: bucket b's gradient region (S = bucket elements / world) holds, for rank r,
// [S rowwise bytes | S columnwise bytes] at byte r * 2S; rank r's phase 2 writes its
// segments there (where its own reduced gradients were, which Adam has consumed), then
// one in-place all-gather of 2S bytes per rank (BucketStoreOptions::staged_gather_bytes
// = 2) moves both planes. Landing copies each rank piece of each parameter into the
// storage with one launch (a precomputed device table of byte copies) and zeroes the
// region with one memset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "core/streams.hpp"
#include "mxfp8/byte_copies.hpp"
#include "shardopt/bucket_store.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/mxfp8_param.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/mxfp8.hpp"

namespace shardopt::detail {

/// The layout storage class of MXFP8 parameters (LayoutOptions::param_storage).
inline constexpr int kMxfp8Storage = 1;

/// Bytes per element the staged all-gather moves: one rowwise + one columnwise e4m3 byte.
inline constexpr int kMxfp8StagedBytes = 2;

/// This rank's piece of one parameter in the fp32 master (length 0: none; master null).
struct MasterPiece {
  float* master = nullptr;         ///< the piece's first element
  std::int64_t param_offset = 0;   ///< its first element within the parameter
  std::int64_t shard_offset = 0;   ///< its offset within the layout buffer's shard
  std::int64_t length = 0;
};

/// True when a (validated) spec is an MXFP8 parameter: two or more dims per member.
bool is_mxfp8_spec(const ParamSpec& spec);

class Mxfp8Params {
 public:
  /// `mx_buffer[b]`: layout buffer b holds MXFP8 parameters (the store has no param
  /// buffer for it and stages its gathers through the gradient buffer).
  /// `masters[p]`: this rank's piece of parameter p in the fp32 master (the optimizer's).
  /// Its collectives (the scale all-reduces) go through `store` (BucketStore::all_reduce),
  /// the one owner of the step's collectives, which must outlive this object.
  Mxfp8Params(Backend backend, const Layout& layout, BucketStore& store, const std::vector<MasterPiece>& masters,
              const std::vector<bool>& mx_buffer);

  bool is_param(int param) const { return param_[static_cast<std::size_t>(param)].mx; }
  bool is_bucket(int bucket) const { return bucket_[static_cast<std::size_t>(bucket)].mx; }
  bool any() const noexcept { return any_; }
  Mxfp8View view(int param) const;
  GatherState state(int bucket) const { return bucket_[static_cast<std::size_t>(bucket)].state; }
  /// The first MXFP8 bucket that is not Idle, or -1.
  int first_pending() const;
  /// Bytes of the storage (data + scales + alignment gaps).
  std::size_t storage_bytes() const noexcept { return storage_.bytes(); }

  /// Phase 1 (partial scales of this rank's segments), the scale all-reduce (one call
  /// for the MXFP8 buckets of [first, last)) and phase 2 (data bytes into the staging)
  /// of every MXFP8 bucket of [first, last), after the work queued on `stream` (Adam).
  /// Every such bucket must be Idle. Does not start the all-gathers.
  void quantize(int first, int last, Stream stream);
  /// The caller started the all-gathers of [first, last): MXFP8 buckets -> InFlight.
  void dispatched(int first, int last);
  /// Lands and consumes every MXFP8 bucket of [first, last) that is in flight: `stream`
  /// waits for its all-gather (InFlight -> Landed), the bytes are copied into the
  /// storage and the gradient region zeroed on `stream` (-> Consumed -> Idle). Runs of
  /// consecutive buckets share one copy launch and one memset.
  void consume(BucketStore& store, int first, int last, Stream stream);

 private:
  struct ParamInfo {
    bool mx = false;
    Mxfp8Shape shape;
    std::size_t data_row = 0, data_col = 0, scale_row = 0, scale_col = 0;  // byte offsets in storage_
    std::size_t members = 0;  // entry offset in members_
    // This rank's piece and where phase 2 writes it.
    Range range;                        // elements of the param this rank owns
    const float* master = nullptr;      // their fp32 master
    std::uintptr_t staged_row = 0;      // data_row pointer for phase 2: element i at staged_row + i
    std::uintptr_t staged_col = 0;
  };
  struct BucketInfo {
    bool mx = false;
    GatherState state = GatherState::Idle;
    std::size_t scale_begin = 0, scale_end = 0;  // byte span of its scales in storage_
    std::int64_t pieces_begin = 0, pieces_end = 0;  // its byte copies in pieces_
    std::uint8_t* region = nullptr;   // its gradient region
    std::size_t region_bytes = 0;
    int batch = -1;                   // its params' ranges in batches_ (phase 1 and 2)
  };

  void warm_up();
  void advance(int bucket, GatherState to);
  void reduce_scales(std::size_t begin, std::size_t end, Stream stream);
  std::uint8_t* at(std::size_t offset) const { return storage_.as<std::uint8_t>() + offset; }

  Backend backend_;
  const Layout& layout_;
  BucketStore& store_;
  bool any_ = false;
  std::vector<ParamInfo> param_;
  std::vector<BucketInfo> bucket_;
  DeviceBuffer storage_;
  DeviceBuffer members_;  // Mxfp8Member tables of every MXFP8 param
  DeviceBuffer pieces_;   // BytePiece table of every MXFP8 bucket's landing
  std::vector<Mxfp8ShardBatch> batches_;  // per MXFP8 bucket: this rank's ranges of its params
};

}  // namespace shardopt::detail
