// streams.hpp - RAII for the library's own CUDA streams and events, and the questions
// asked of a caller's stream (its capture, its device). On the host backend there are
// no streams of the library's own: work meant for a side stream runs, in order, on the
// caller's stream (so a HostStream capture records it), and events are no-ops.
#pragma once

#include <cstdint>

#include "shardopt/backend.hpp"

namespace shardopt {

/// A non-blocking CUDA stream owned by the library (none on the host backend).
class SideStream {
 public:
  explicit SideStream(Backend backend);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  /// The stream to run side work on: this stream on CUDA, `caller` on the host backend.
  Stream on(Stream caller) const noexcept { return stream_ != nullptr ? stream_ : caller; }
  Stream get() const noexcept { return stream_; }

 private:
  Stream stream_ = nullptr;
};

/// An event that orders one stream after another (no-op on the host backend).
class Event {
 public:
  explicit Event(Backend backend);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  /// Marks the work queued so far on `stream`.
  void record(Stream stream);
  /// Makes `stream` wait for the last record (legal inside a capture).
  void wait(Stream stream) const;
  /// True once the work before the last record has finished (always on the host
  /// backend, whose work runs when it is enqueued). Throws Error(Cuda) for an error the
  /// device reported.
  bool done() const;
  /// Blocks the calling thread until done() (host backend: returns at once).
  void synchronize() const;

 private:
  void* event_ = nullptr;  // cudaEvent_t
};

/// True when every piece of work queued on `stream` has finished (host backend: always;
/// its work runs when it is enqueued). Error(InvalidState) while the stream is being
/// captured; Error(Cuda) for an error the device reported.
bool stream_done(Backend backend, Stream stream);

/// `to` waits for everything queued so far on `from` (a temporary event).
void order_after(Backend backend, Stream from, Stream to);

/// The capture `stream` is recording into (0: none): CUDA's capture sequence id + 1, or
/// the address of the capturing HostStream. Work waited for must lie in the capture
/// that started it.
std::uint64_t capture_id(Backend backend, Stream stream);

namespace detail {
/// Throws Error(InvalidArgument) unless `stream` belongs to CUDA device `device`
/// (Backend::Cuda), or is a live HostStream / nullptr (Backend::Host). Capture-safe: a
/// stream being captured is checked against the device an eager call on it found
/// (CUDA refuses the query during capture); one never used eagerly is not checked.
void check_stream_device(Backend backend, int device, Stream stream);
}  // namespace detail

}  // namespace shardopt
