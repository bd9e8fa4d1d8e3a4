// cuda_ops.cuh - CudaOps: the model's operations (ops.hpp's Ops) on a CUDA device. bf16
// GEMMs with fp32 accumulation through cuBLAS (cublasGemmEx, cublasGemmStridedBatchedEx for
// the experts' forward and data gradients, cublasGemmBatchedEx with device pointer arrays
// for the experts' weight gradients), and the elementwise, row and MoE kernels. The members
// are defined by op family, one file each (named below); the device, memory and streams
// are cuda_ops.cu's.
//
// Capture rules kept in every file: every launch has fixed shapes; per-step values (step
// counter, microbatch index and flags) are read by the kernels from device memory; cuBLAS
// runs on a workspace of our own (cublasSetWorkspace, rebound after every cublasSetStream),
// so nothing allocates inside a captured graph and graph replay picks the same kernels as
// eager execution. Reductions use fixed launch shapes and fixed orders (no atomics on
// floats), so a replay computes bitwise what an eager run computes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda_common.cuh"

namespace trainer::gpu {

constexpr int kSumsqBlocks = 256;  // partial sums of sumsq

class CudaOps final : public Ops {
 public:
  CudaOps();
  ~CudaOps() override;

  shardopt::Backend backend() const noexcept override { return shardopt::Backend::Cuda; }
  Precision precision() const noexcept override { return Precision::Mixed; }
  Stream stream() const noexcept override { return reinterpret_cast<Stream>(stream_); }
  void synchronize() override;
  double time_ms(const std::function<void()>& enqueue) override;
  Buffer alloc(Elem elem, std::int64_t numel) override;
  void zero(const Tensor& t, Stream s) override;
  void copy(const Tensor& dst, const Tensor& src, Stream s) override;
  void upload(const Tensor& dst, const void* src) override;
  void download(void* dst, const Tensor& src) override;
  std::int64_t memory_in_use() const override;
  std::string device_name() const override;

  // data (cuda_data.cu)
  void init_param(const Tensor& t, const InitArgs& a, Stream s) override;
  void make_batch(const BatchArgs& a, const Tensor& tokens, const Tensor& targets, Stream s) override;
  void text_batch(const TextBatchArgs& a, const Tensor& tokens, const Tensor& targets, Stream s) override;

  // embeddings (cuda_embed.cu)
  void embed_forward(const Tensor& table, const Tensor& tokens, const Tensor& out, std::int64_t T, std::int64_t H,
                     Stream s) override;
  void embed_backward(const Tensor& dout, const Tensor& tokens, const Tensor& links, const Tensor& dtable,
                      std::int64_t T, std::int64_t H, Stream s) override;
  void pos_embed_forward(const Tensor& table, const Tensor& h, std::int64_t T, std::int64_t S, std::int64_t H,
                         Stream s) override;
  void pos_embed_backward(const Tensor& dh, const Tensor& dtable, std::int64_t T, std::int64_t S, std::int64_t H,
                          Stream s) override;

  // RMSNorm (cuda_rmsnorm.cu)
  void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, std::int64_t T,
                       std::int64_t H, float eps, Stream s) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw, const Tensor& partial, std::int64_t T, std::int64_t H, Stream s) override;

  // elementwise activations (cuda_activation.cu)
  void silu_forward(const Tensor& u, const Tensor& a, std::int64_t n, Stream s) override;
  void silu_backward(const Tensor& da, const Tensor& u, const Tensor& du, std::int64_t n, Stream s) override;
  void gelu_forward(const Tensor& u, const Tensor& a, std::int64_t n, Stream s) override;
  void gelu_backward(const Tensor& da, const Tensor& u, const Tensor& du, std::int64_t n, Stream s) override;
  void to_low(const Tensor& x, const Tensor& y, std::int64_t n, Stream s) override;

  // causal softmax (cuda_attention.cu)
  void causal_softmax_forward(const Tensor& scores, const Tensor& probs, const Tensor& probs_low, std::int64_t blocks,
                              std::int64_t S, Stream s) override;
  void causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, const Tensor& dscores, std::int64_t blocks,
                               std::int64_t S, Stream s) override;

  // mixture of experts (cuda_moe.cu)
  void router_forward(const Tensor& logits, const Tensor& probs, const Tensor& expert, const Tensor& gate,
                      std::int64_t T, int G, Stream s) override;
  void router_backward(const Tensor& dgate, const Tensor& probs, const Tensor& expert, const Tensor& dlogits,
                       std::int64_t T, int G, Stream s) override;
  void dispatch(const Tensor& expert, const Tensor& x, const Tensor& slot, const Tensor& row_token, const Tensor& xe,
                std::int64_t T, std::int64_t H, int G, std::int64_t C, Stream s) override;
  void combine_forward(const Tensor& ye, const Tensor& expert, const Tensor& slot, const Tensor& gate, const Tensor& h,
                       std::int64_t T, std::int64_t H, std::int64_t C, Stream s) override;
  void combine_backward(const Tensor& dh, const Tensor& ye, const Tensor& expert, const Tensor& slot,
                        const Tensor& gate, const Tensor& row_token, const Tensor& dye, const Tensor& dgate,
                        std::int64_t T, std::int64_t H, int G, std::int64_t C, Stream s) override;
  void dispatch_backward(const Tensor& dxe, const Tensor& expert, const Tensor& slot, const Tensor& dx,
                         std::int64_t T, std::int64_t H, std::int64_t C, Stream s) override;

  // loss (cuda_loss.cu)
  void cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& dlogits, const Tensor& token_loss,
                     const Tensor& loss_slots, const shardopt::MicrobatchState* mb, float grad_scale, std::int64_t T,
                     std::int64_t V, Stream s) override;

  // weight forms (cuda_weights.cu)
  void pack(const std::vector<Tensor>& src, const Tensor& dst, const shardopt::MicrobatchState* skip,
            Stream s) override;
  void dequantize_mxfp8(const std::vector<Mxfp8Source>& src, const Tensor& dst, const shardopt::MicrobatchState* skip,
                        Stream s) override;

  // gradient norms (cuda_sumsq.cu)
  void sumsq(const Tensor& x, const Tensor& slot, const shardopt::MicrobatchState* mb, SumsqWhen when,
             Stream s) override;

  // GEMMs through cuBLAS (cuda_gemm.cu)
  void gemm(const GemmArgs& g, Stream s) override;
  void grouped_gemm(const GroupedGemmArgs& g, Stream s) override;

 private:
  static constexpr std::size_t kWorkspaceBytes = 32u << 20;

  // cuBLAS on `s` with our workspace. cublasSetStream resets the workspace to cuBLAS's
  // own pool, which could allocate inside a capture: set it again after every switch.
  void bind(Stream s);

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  void* pointers_ = nullptr;  // 3 x kMaxExperts device pointers
  double* partials_ = nullptr;
  cudaEvent_t ev0_ = nullptr, ev1_ = nullptr;
  Stream bound_stream_ = nullptr;
  bool bound_ = false;
};

}  // namespace trainer::gpu
