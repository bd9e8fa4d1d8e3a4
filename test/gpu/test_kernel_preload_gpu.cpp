// An optimizer loads every kernel it can launch when it is constructed
// (optimizer/kernel_preload.hpp), so that no later launch loads a module behind NCCL
// kernels that wait for a dead peer (docs/faults.md). Each case runs in a fresh process
// under CUDA_MODULE_LOADING=LAZY (the meson entries pass the filter and the variable).
//
// The check is the driver's own view, independent of the list the library loads from:
// the module of every kernel file is found through one kernel of it, every function the
// module holds is enumerated (cuModuleEnumerateFunctions: also the instantiations a list
// could forget) and each must be loaded (cuFuncIsLoaded) right after construction. Before
// construction some of them must still be unloaded, which shows the check can fail.
#include <cuda.h>  // types only: the entry points come from cudaGetDriverEntryPointByVersion
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/fsdp_cases.hpp"
#include "optimizer/kernel_preload.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

struct Driver {
  CUresult (*loading_mode)(CUmoduleLoadingMode*) = nullptr;
  CUresult (*module_of)(CUmodule*, CUfunction) = nullptr;
  CUresult (*function_count)(unsigned int*, CUmodule) = nullptr;
  CUresult (*functions)(CUfunction*, unsigned int, CUmodule) = nullptr;
  CUresult (*is_loaded)(CUfunctionLoadingState*, CUfunction) = nullptr;
  CUresult (*name_of)(const char**, CUfunction) = nullptr;
};

template <class Fn>
void entry(const char* symbol, Fn& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  ASSERT_EQ(cudaGetDriverEntryPointByVersion(symbol, &p, 12040, cudaEnableDefault, &found), cudaSuccess) << symbol;
  ASSERT_EQ(found, cudaDriverEntryPointSuccess) << symbol << " needs a CUDA 12.4 driver or later";
  fn = reinterpret_cast<Fn>(p);
}

Driver driver() {
  Driver d;
  entry("cuModuleGetLoadingMode", d.loading_mode);
  entry("cuFuncGetModule", d.module_of);
  entry("cuModuleGetFunctionCount", d.function_count);
  entry("cuModuleEnumerateFunctions", d.functions);
  entry("cuFuncIsLoaded", d.is_loaded);
  entry("cuFuncGetName", d.name_of);
  return d;
}

struct DeviceKernel {
  std::string name;  // mangled
  bool loaded = false;
};

// Every function of the modules that hold the kernel files' kernels, with its state. Only
// the first kernel of each file is named to the runtime (that loads it); the rest come
// from the driver's enumeration.
std::vector<DeviceKernel> module_kernels(const Driver& d) {
  std::set<CUmodule> modules;
  for (kernels::KernelFile file : kernels::kernel_files_cuda()) {
    const void* first = nullptr;
    file([&](const void* k) {
      if (first == nullptr) first = k;
    });
    EXPECT_NE(first, nullptr);
    if (first == nullptr) continue;
    // Through the library: it links its own copy of the CUDA runtime, which alone knows
    // its kernels.
    const auto f = static_cast<CUfunction>(kernels::kernel_function_cuda(first));
    CUmodule m = nullptr;
    EXPECT_EQ(d.module_of(&m, f), CUDA_SUCCESS);
    modules.insert(m);
  }
  std::vector<DeviceKernel> out;
  for (CUmodule m : modules) {
    unsigned int n = 0;
    EXPECT_EQ(d.function_count(&n, m), CUDA_SUCCESS);
    std::vector<CUfunction> fs(n);
    EXPECT_EQ(d.functions(fs.data(), n, m), CUDA_SUCCESS);
    for (CUfunction f : fs) {
      const char* name = nullptr;
      CUfunctionLoadingState state = CU_FUNCTION_LOADING_STATE_UNLOADED;
      EXPECT_EQ(d.name_of(&name, f), CUDA_SUCCESS);
      EXPECT_EQ(d.is_loaded(&state, f), CUDA_SUCCESS);
      out.push_back({name != nullptr ? name : "?", state == CU_FUNCTION_LOADING_STATE_LOADED});
    }
  }
  return out;
}

// Whether a mangled name holds the identifier (Itanium: <length><identifier>).
bool names(const std::string& mangled, const std::string& id) {
  return mangled.find(std::to_string(id.size()) + id) != std::string::npos;
}

// One kernel of each .cu file the optimizers launch from, by the test's own list: the
// modules enumerated must hold them all (a file missing from the library's list fails).
const char* const kOneKernelPerFile[] = {
    "adam_apply_kernel",        // kernels/adam/adam.cu
    "accumulate_kernel",        // kernels/common/convert.cu
    "grad_sumsq_finish_kernel", // kernels/adam/grad_norm.cu
    "lr_schedule_kernel",       // kernels/adam/step_control.cu
    "piece_sum_vec_kernel",     // kernels/common/piece_sum.cu
    "scales_from_amax_kernel",  // kernels/mxfp8/mxfp8.cu
    "quantize_kernel",          // kernels/mxfp8/mxfp8_batch.cu
    "shard_kernel",             // kernels/mxfp8/mxfp8_shard.cu
    "decode8_kernel",           // kernels/mxfp8/mxfp8_decode.cu
    "tile_kernel",              // kernels/nvfp4/nvfp4.cu
    "shard_tile_kernel",        // kernels/nvfp4/nvfp4_shard.cu
    "decode_list_kernel",       // kernels/nvfp4/nvfp4_decode.cu
    "copy_pieces_kernel",       // kernels/common/byte_copies.cu
};

// Runs `construct` once in this process: lazy loading must be on, some kernel unloaded
// before, every kernel of every module loaded after.
template <class Construct>
void check_preload(Construct construct) {
  static bool ran = false;  // a second case in one process would find everything loaded
  if (ran) GTEST_SKIP() << "needs a fresh process: run one case per process (--gtest_filter)";
  ran = true;
  const Driver d = driver();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  CUmoduleLoadingMode mode{};
  ASSERT_EQ(d.loading_mode(&mode), CUDA_SUCCESS);
  ASSERT_EQ(mode, CU_MODULE_LAZY_LOADING) << "run with CUDA_MODULE_LOADING=LAZY (the meson entry sets it)";
  Communicator comm = make_comm(Backend::Cuda);

  int unloaded_before = 0;
  for (const DeviceKernel& k : module_kernels(d)) unloaded_before += k.loaded ? 0 : 1;
  ASSERT_GT(unloaded_before, 0) << "every kernel was loaded before the optimizer existed: the check cannot "
                                   "tell the preload from lazy loading";

  construct(comm);
  const std::vector<DeviceKernel> after = module_kernels(d);
  for (const DeviceKernel& k : after) EXPECT_TRUE(k.loaded) << k.name << " is not loaded after construction";
  for (const char* id : kOneKernelPerFile) {
    bool found = false;
    for (const DeviceKernel& k : after) found = found || names(k.name, id);
    EXPECT_TRUE(found) << id << " is in no module the optimizers load";
  }
  std::printf("%d of %zu kernels were unloaded before construction; all loaded after\n", unloaded_before,
              after.size());
}

TEST(KernelPreloadGpu, DistributedAdam) {
  check_preload([](const Communicator& comm) { DistributedAdam opt(comm, small_model(), base_options(DType::bf16)); });
}

TEST(KernelPreloadGpu, Fsdp) {
  check_preload([](const Communicator& comm) {
    Fsdp opt(comm, fsdp_model(), small_units(), fsdp_options(base_options(DType::bf16)));
  });
}

// HSDP: shard groups of one rank, replicated over the others (needs 2 ranks or more).
TEST(KernelPreloadGpu, Hsdp) {
  if (world_size() < 2) GTEST_SKIP() << "HSDP needs 2 ranks or more";
  check_preload([](const Communicator& comm) {
    FsdpOptions o = fsdp_options(base_options(DType::bf16));
    o.shard_group_size = world_size() / 2;
    Fsdp opt(comm, fsdp_model(), small_units(), o);
  });
}

}  // namespace
