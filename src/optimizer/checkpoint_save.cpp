#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "core/streams.hpp"
#include "core/trace.hpp"
#include "formats/file_io.hpp"
#include "formats/safetensors.hpp"
#include "optimizer/checkpoint.hpp"
#include "optimizer/checkpoint_index.hpp"
#include "shardopt/error.hpp"

// The writer: save (two pinned halves in turn), save_async (a snapshot, then a thread),
// and the index that rank 0 writes once every file is on disk.
namespace shardopt::detail {
using namespace ckpt;
namespace {

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
  return rank_items(*t.layout, param_facts(t), muon_matrices_of(t), t.engine->checkpoint_moment_dtype(),
                    t.shard_rank, /*with_params=*/true);
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
  SHARDOPT_TRACE("shardopt/checkpoint/index");
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

}  // namespace

// ---------------------------------------------------------------- save

StagedMaster::StagedMaster(ShardEngine& engine, Stream stream) : engine_(&engine) {
  if (!engine.has_staged_state()) return;
  engine.stage_master(stream);
  synchronize(engine.backend(), stream);  // readers copy or write it from the host
}

StagedMaster::~StagedMaster() {
  if (engine_ != nullptr) engine_->drop_staged_master();
}

void save_checkpoint(const CheckpointTarget& t, const std::string& dir, Stream stream, const CheckpointUserData& user,
                     std::size_t staging_bytes) {
  SHARDOPT_TRACE("shardopt/checkpoint/save");
  require_not_capturing(t, stream, "save");
  const SavedState st = current_state(t, stream);  // synchronizes `stream`
  begin_save(t, dir);
  std::exception_ptr error;
  FileResult mine;
  if (t.writes_file) {
    try {
      const StagedMaster staged(*t.engine, stream);
      SHARDOPT_TRACE("shardopt/checkpoint/write");
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
    SHARDOPT_TRACE("shardopt/checkpoint/wait");
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
  SHARDOPT_TRACE("shardopt/checkpoint/save_async");
  require_not_capturing(t, stream, "save_async");
  auto job = std::make_shared<SaveJob>(t, dir, user);
  job->state = current_state(t, stream);
  begin_save(t, dir);
  std::exception_ptr error;
  try {
    if (t.writes_file) {
      const StagedMaster staged(*t.engine, stream);  // freed once the snapshot has it
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
        SHARDOPT_TRACE("shardopt/checkpoint/write");
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
