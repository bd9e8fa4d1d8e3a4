// cuda_ops.cu - CudaOps' device, memory and streams: construction (the stream, the cuBLAS
// handle and its workspace), allocation and copies, timing, and cuBLAS's binding to a
// stream. The ops themselves are in the cuda_*.cu file of their family (cuda_ops.cuh).
#include <memory>
#include <stdexcept>

#include "cuda_ops.cuh"

namespace trainer::gpu {

CudaOps::CudaOps() {
  TRAINER_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  TRAINER_CUBLAS(cublasCreate(&handle_));
  TRAINER_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
  TRAINER_CUDA(cudaMalloc(&pointers_, 3 * kMaxExperts * sizeof(void*)));
  TRAINER_CUDA(cudaMalloc(&partials_, kSumsqBlocks * sizeof(double)));
  TRAINER_CUDA(cudaEventCreate(&ev0_));
  TRAINER_CUDA(cudaEventCreate(&ev1_));
  bind(stream_);
}

CudaOps::~CudaOps() {
  (void)cudaStreamSynchronize(stream_);
  (void)cublasDestroy(handle_);
  (void)cudaFree(workspace_);
  (void)cudaFree(pointers_);
  (void)cudaFree(partials_);
  (void)cudaEventDestroy(ev0_);
  (void)cudaEventDestroy(ev1_);
  (void)cudaStreamDestroy(stream_);
}

void CudaOps::synchronize() { TRAINER_CUDA(cudaStreamSynchronize(stream_)); }

double CudaOps::time_ms(const std::function<void()>& enqueue) {
  TRAINER_CUDA(cudaEventRecord(ev0_, stream_));
  enqueue();
  TRAINER_CUDA(cudaEventRecord(ev1_, stream_));
  TRAINER_CUDA(cudaEventSynchronize(ev1_));
  float ms = 0.0f;
  TRAINER_CUDA(cudaEventElapsedTime(&ms, ev0_, ev1_));
  return ms;
}

Buffer CudaOps::alloc(Elem elem, std::int64_t numel) {
  void* p = nullptr;
  const std::size_t bytes = static_cast<std::size_t>(numel) * elem_size(elem);
  TRAINER_CUDA(cudaMalloc(&p, bytes > 0 ? bytes : 256));
  // Zeroed on stream_ and waited for: cudaMemset would run on the legacy default stream,
  // which neither the host nor stream_ (non-blocking) waits for -- a kernel enqueued right
  // after (ArrayWeights' init_param) could run first and have its output zeroed.
  TRAINER_CUDA(cudaMemsetAsync(p, 0, bytes > 0 ? bytes : 256, stream_));
  TRAINER_CUDA(cudaStreamSynchronize(stream_));
  return Buffer(Tensor{p, elem, numel}, [](void* q) { (void)cudaFree(q); });
}

void CudaOps::zero(const Tensor& t, Stream s) {
  TRAINER_CUDA(cudaMemsetAsync(t.data, 0, t.bytes(), cu(s)));
}

void CudaOps::copy(const Tensor& dst, const Tensor& src, Stream s) {
  if (dst.elem != src.elem || dst.numel != src.numel) throw std::invalid_argument("copy: tensors differ in type or length");
  TRAINER_CUDA(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, cu(s)));
}

void CudaOps::upload(const Tensor& dst, const void* src) {
  TRAINER_CUDA(cudaDeviceSynchronize());
  TRAINER_CUDA(cudaMemcpy(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice));
  // A pageable copy may return before its DMA lands; the trainer's streams do not
  // wait for the legacy stream.
  TRAINER_CUDA(cudaDeviceSynchronize());
}

void CudaOps::download(void* dst, const Tensor& src) {
  TRAINER_CUDA(cudaDeviceSynchronize());
  TRAINER_CUDA(cudaMemcpy(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost));
}

std::int64_t CudaOps::memory_in_use() const {
  std::size_t free_b = 0, total_b = 0;
  TRAINER_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<std::int64_t>(total_b - free_b);
}

std::string CudaOps::device_name() const {
  int device = 0;
  TRAINER_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  TRAINER_CUDA(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

void CudaOps::bind(Stream s) {
  if (bound_ && s == bound_stream_) return;
  TRAINER_CUBLAS(cublasSetStream(handle_, cu(s)));
  TRAINER_CUBLAS(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes));
  bound_stream_ = s;
  bound_ = true;
}

}  // namespace trainer::gpu

namespace trainer {

bool cuda_ops_built() noexcept { return true; }

std::unique_ptr<Ops> make_cuda_ops() { return std::make_unique<gpu::CudaOps>(); }

}  // namespace trainer
