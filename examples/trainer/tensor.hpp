// tensor.hpp - the trainer's untyped tensors: a pointer, an element type and a length.
//
// Shapes are the model's business (model.cpp knows every one); the ops take explicit
// dimensions. Memory is device memory on the CUDA backend and host memory on the host
// backend, exactly like shardopt's views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include <shardopt/dtype.hpp>
#include <shardopt/views.hpp>

namespace trainer {

/// Element types the trainer's ops take.
enum class Elem : std::uint8_t {
  f32,   ///< fp32: activations, fp32 gradients
  bf16,  ///< bfloat16 bits: GEMM inputs, parameters, bf16 gradients
  f64,   ///< double: every tensor of the double-precision model (gradient checks)
  i32,   ///< token ids, expert choices, slots
  u8,    ///< raw bytes (MXFP8 data and scales, for copies and downloads only)
};

constexpr std::size_t elem_size(Elem e) noexcept {
  switch (e) {
    case Elem::f32:
    case Elem::i32: return 4;
    case Elem::bf16: return 2;
    case Elem::f64: return 8;
    case Elem::u8: return 1;
  }
  return 0;
}

const char* to_string(Elem e) noexcept;

/// A flat tensor.
struct Tensor {
  void* data = nullptr;
  Elem elem = Elem::f32;
  std::int64_t numel = 0;

  std::size_t bytes() const noexcept { return static_cast<std::size_t>(numel) * elem_size(elem); }
  template <class T> T* as() const noexcept { return static_cast<T*>(data); }
  /// The `count` elements starting at element `first`.
  Tensor slice(std::int64_t first, std::int64_t count) const noexcept {
    return Tensor{static_cast<char*>(data) + static_cast<std::size_t>(first) * elem_size(elem), elem, count};
  }
};

/// A shardopt view as a tensor (bf16 or f32; anything else throws std::invalid_argument).
Tensor from_view(const shardopt::TensorView& v);

/// An owning tensor: memory released by the deleter the allocating backend gave it.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Tensor t, std::function<void(void*)> release) : t_(t), release_(std::move(release)) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept : t_(std::exchange(o.t_, Tensor{})), release_(std::move(o.release_)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      t_ = std::exchange(o.t_, Tensor{});
      release_ = std::move(o.release_);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const Tensor& get() const noexcept { return t_; }
  operator const Tensor&() const noexcept { return t_; }
  template <class T> T* as() const noexcept { return t_.as<T>(); }

 private:
  void reset() noexcept {
    if (t_.data != nullptr && release_) release_(t_.data);
    t_ = Tensor{};
  }
  Tensor t_;
  std::function<void(void*)> release_;
};

}  // namespace trainer
