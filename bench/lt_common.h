/*
 * lt_common.h - what bench/'s standalone cuBLASLt programs (gemm_gpu, lt_bias16) share;
 * they link no weft code. Each defines BENCH_NAME before including it.
 *
 * CK(call): a failed CUDA runtime call prints the program, the call and CUDA's reason,
 * and exits 1. lt_descs / lt_make: one GEMM's descriptors as weft's matmul.cu makes
 * them (descs16_make: bf16 operands, fp32 compute, D column-major with ld m), destroyed
 * with the struct.
 */
#ifndef BENCH_LT_COMMON_H
#define BENCH_LT_COMMON_H

#include <cstdio>
#include <cstdlib>

#include <cublasLt.h>
#include <cuda_runtime.h>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, #x, cudaGetErrorString(e_));                     \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

struct lt_descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~lt_descs()
  {
    if (pref)
      cublasLtMatmulPreferenceDestroy(pref);
    if (d)
      cublasLtMatrixLayoutDestroy(d);
    if (b)
      cublasLtMatrixLayoutDestroy(b);
    if (a)
      cublasLtMatrixLayoutDestroy(a);
    if (op)
      cublasLtMatmulDescDestroy(op);
  }
};

/* D (m x n) = op(A) op(B), A and B bf16 (op(A) m x k, op(B) k x n, packed), D of type dt,
 * a workspace of ws bytes allowed; false when cuBLASLt refuses a descriptor. */
static inline bool lt_make(lt_descs &x, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, cudaDataType_t dt, size_t ws)
{
  bool at = ta == CUBLAS_OP_T, bt = tb == CUBLAS_OP_T;
  return cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0 &&
         cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == 0 &&
         cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == 0 &&
         cublasLtMatrixLayoutCreate(&x.a, CUDA_R_16BF, at ? k : m, at ? m : k, at ? k : m) == 0 &&
         cublasLtMatrixLayoutCreate(&x.b, CUDA_R_16BF, bt ? n : k, bt ? k : n, bt ? n : k) == 0 &&
         cublasLtMatrixLayoutCreate(&x.d, dt, m, n, m) == 0 &&
         cublasLtMatmulPreferenceCreate(&x.pref) == 0 &&
         cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                              sizeof ws) == 0;
}

#endif /* BENCH_LT_COMMON_H */
