// comm_test_support.hpp - what the communicator and bucket-store suites share on both
// backends (test/mpi runs them on the host backend, test/gpu on CUDA + NCCL): streams
// and graphs, uploads and downloads, exact encodings, deterministic data, the error
// tolerance of a reduction, and a watchdog that turns a hang into a failure.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "comm/comm_impl.hpp"
#include "common/device_copy.hpp"
#include "common/error_of.hpp"
#include "common/device_util.hpp"
#include "core/memory.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/mpi.hpp"
#include "shardopt/numerics.hpp"
#include "shardopt_config.h"

namespace shardopt::test {

using Bytes = std::vector<std::uint8_t>;

// ------------------------------------------------------------------ errors

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ------------------------------------------------------------------ groups

/// A fresh Communicator over MPI_COMM_WORLD.
inline Communicator make_world(Backend be) { return communicator_from_mpi(MPI_COMM_WORLD, {be, -1}); }

/// One Communicator per backend, made on first use and destroyed when the tests end
/// (before MPI_Finalize).
class WorldCache : public ::testing::Environment {
 public:
  static WorldCache*& instance() {
    static WorldCache* w = nullptr;
    return w;
  }
  WorldCache() { instance() = this; }
  void TearDown() override { comms_.clear(); }
  Communicator& get(Backend be) {
    auto it = comms_.find(be);
    if (it == comms_.end()) it = comms_.emplace(be, make_world(be)).first;
    return it->second;
  }

 private:
  std::map<Backend, Communicator> comms_;
};

inline ::testing::Environment* const kWorldCache = ::testing::AddGlobalTestEnvironment(new WorldCache);

/// The shared group of the suite (use make_world for one a test may break).
inline Communicator& world(Backend be) { return WorldCache::instance()->get(be); }

// ------------------------------------------------------------------ watchdog

/// Ends the whole process (and so the mpiexec job) if the scope takes longer than
/// `seconds`: a collective that hangs fails the test within a bounded time.
class Watchdog {
 public:
  explicit Watchdog(unsigned seconds) {
    struct sigaction sa {};
    sa.sa_handler = [](int) {
      const char msg[] = "watchdog: a test exceeded its time bound (a collective hangs?)\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(3);
    };
    sigaction(SIGALRM, &sa, nullptr);
    alarm(seconds);
  }
  ~Watchdog() { alarm(0); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
};

// ------------------------------------------------------------------ streams and graphs

// Graph and TestStream: common/device_util.hpp (the same stream as the optimizer cases).

// ------------------------------------------------------------------ memory

inline void upload(Backend be, void* dst, const Bytes& src) { from_host(be, dst, src); }

inline DeviceBuffer to_device(Backend be, const Bytes& src) {
  DeviceBuffer d(be, src.size());
  upload(be, d.data(), src);
  return d;
}

inline Bytes download(Backend be, const void* src, std::size_t bytes) { return to_host<std::uint8_t>(be, src, bytes); }

// ------------------------------------------------------------------ element encodings

/// Value of element i of a float-storage buffer (exact).
inline double element(DType t, const Bytes& b, std::size_t i) {
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, b.data() + 4 * i, 4);
      return f;
    }
    case DType::bf16: {
      std::uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      return num::bf16_to_f32(h);
    }
    case DType::f16: {
      std::uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      return num::f16_to_f32(h);
    }
    default: break;
  }
  throw std::logic_error("element(): not a float storage type");
}

/// Stores `v` (already representable, or rounded to nearest even) as element i.
inline void set_element(DType t, Bytes& b, std::size_t i, float v) {
  if (t == DType::f32) {
    std::memcpy(b.data() + 4 * i, &v, 4);
  } else {
    const std::uint16_t h = t == DType::bf16 ? num::f32_to_bf16(v) : num::f32_to_f16(v);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
}

/// Unit roundoff of the storage type (half the spacing at 1).
inline double unit_roundoff(DType t) {
  return t == DType::f32 ? std::ldexp(1.0, -24) : t == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

/// Bound on |computed - exact| for a sum (or average) over `ranks` inputs whose
/// magnitudes add up to `abs_sum`, computed in ANY order with every partial result
/// rounded to the storage type: ranks - 1 additions each err by at most u times a
/// partial sum (<= abs_sum), an average adds one more rounding (the division or NCCL's
/// multiplication by 1/size), hence (ranks + 1) * u * abs_sum. f16 also gets an
/// absolute floor for partial sums that fall into its subnormal range (spacing 2^-24).
inline double reduction_tolerance(DType t, int ranks, double abs_sum) {
  return (ranks + 1) * unit_roundoff(t) * abs_sum + (t == DType::f16 ? ranks * std::ldexp(1.0, -24) : 0.0);
}

// ------------------------------------------------------------------ deterministic data

inline std::uint64_t seed_of(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0, std::uint64_t d = 0) {
  return ((a * 1000003u + b) * 1000003u + c) * 1000003u + d + 12345u;
}

/// `count` values uniform in [-1, 1), rounded to `t` (every rank can regenerate any
/// rank's data from the seed).
inline Bytes random_floats(DType t, std::size_t count, std::uint64_t seed) {
  Bytes b(count * size_of(t));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (std::size_t i = 0; i < count; ++i) set_element(t, b, i, dist(gen));
  return b;
}

/// `count` multiples of 1/8 in [-1, 1]: every sum of up to 32 of them, and every
/// power-of-two average, is exact in bf16, f16 and f32, so any reduction order gives
/// the same bits.
inline Bytes exact_floats(DType t, std::size_t count, std::uint64_t seed) {
  Bytes b(count * size_of(t));
  std::mt19937_64 gen(seed);
  for (std::size_t i = 0; i < count; ++i) set_element(t, b, i, static_cast<float>(static_cast<int>(gen() % 17) - 8) / 8.0f);
  return b;
}

inline bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace shardopt::test
