// cuda_gemm.cu - CudaOps' GEMMs through cuBLAS: bf16 operands with fp32 accumulation,
// cublasGemmEx and cublasGemmStridedBatchedEx (gemm), and cublasGemmBatchedEx with device
// pointer arrays written in stream order (grouped_gemm: the experts' weight gradients).
#include <stdexcept>
#include <string>

#include "cuda_ops.cuh"

namespace trainer::gpu {
namespace {

struct PointerArgs {
  const void* a[kMaxExperts];
  const void* b[kMaxExperts];
  void* c[kMaxExperts];
  int count = 0;
};

// The pointer arrays of cublasGemmBatchedEx, written in stream order from by-value
// arguments (what a graph captures), cuBLAS's operand order: B's pointers, then A's.
__global__ void k_set_pointers(PointerArgs p, const void** first, const void** second, void** out) {
  const int i = threadIdx.x;
  if (i >= p.count) return;
  first[i] = p.b[i];
  second[i] = p.a[i];
  out[i] = p.c[i];
}

cudaDataType_t cuda_type(Elem e) {
  switch (e) {
    case Elem::f32: return CUDA_R_32F;
    case Elem::bf16: return CUDA_R_16BF;
    default: throw std::invalid_argument(std::string("cuda ops: no GEMM on ") + to_string(e) + " tensors");
  }
}

}  // namespace

void CudaOps::gemm(const GemmArgs& g, Stream s) {
  bind(s);
  const cublasOperation_t opa = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const float alpha = g.alpha, beta = g.beta;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  if (g.batch == 1) {
    TRAINER_CUBLAS(cublasGemmEx(handle_, opb, opa, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k),
                                &alpha, g.b.data, cuda_type(g.b.elem), static_cast<int>(g.ldb), g.a.data,
                                cuda_type(g.a.elem), static_cast<int>(g.lda), &beta, g.c.data, cuda_type(g.c.elem),
                                static_cast<int>(g.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    TRAINER_CUBLAS(cublasGemmStridedBatchedEx(
        handle_, opb, opa, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), &alpha, g.b.data,
        cuda_type(g.b.elem), static_cast<int>(g.ldb), g.stride_b, g.a.data, cuda_type(g.a.elem),
        static_cast<int>(g.lda), g.stride_a, &beta, g.c.data, cuda_type(g.c.elem), static_cast<int>(g.ldc),
        g.stride_c, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

void CudaOps::grouped_gemm(const GroupedGemmArgs& g, Stream s) {
  const int n = static_cast<int>(g.a.size());
  if (n < 1 || n > kMaxExperts || g.b.size() != g.a.size() || g.c.size() != g.a.size())
    throw std::invalid_argument("grouped_gemm: 1..kMaxExperts operands, the same number of a, b and c");
  PointerArgs p;
  p.count = n;
  for (int i = 0; i < n; ++i) {
    if (g.a[i].elem != g.a[0].elem || g.b[i].elem != g.b[0].elem || g.c[i].elem != g.c[0].elem)
      throw std::invalid_argument("grouped_gemm: every operand of a group has the same element type");
    p.a[i] = g.a[i].data;
    p.b[i] = g.b[i].data;
    p.c[i] = g.c[i].data;
    // cuBLAS cannot inspect pointers that live on the device: keep every operand on a
    // 16-byte boundary (the model's are when hidden and expert widths are multiples of 8).
    for (const void* q : {p.a[i], static_cast<const void*>(p.b[i]), static_cast<const void*>(p.c[i])})
      if (reinterpret_cast<std::uintptr_t>(q) % 16 != 0)
        throw std::invalid_argument("grouped_gemm: operands must start on 16-byte boundaries (use hidden and "
                                    "expert widths that are multiples of 8)");
  }
  const void** first = static_cast<const void**>(pointers_);
  const void** second = first + kMaxExperts;
  void** out = static_cast<void**>(pointers_) + 2 * kMaxExperts;
  k_set_pointers<<<1, kMaxExperts, 0, cu(s)>>>(p, first, second, out);
  TRAINER_LAUNCHED();
  bind(s);
  const cublasOperation_t opa = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const float alpha = g.alpha, beta = g.beta;
  TRAINER_CUBLAS(cublasGemmBatchedEx(handle_, opb, opa, static_cast<int>(g.n), static_cast<int>(g.m),
                                     static_cast<int>(g.k), &alpha, first, cuda_type(g.b[0].elem),
                                     static_cast<int>(g.ldb), second, cuda_type(g.a[0].elem), static_cast<int>(g.lda),
                                     &beta, out, cuda_type(g.c[0].elem), static_cast<int>(g.ldc), n,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace trainer::gpu
