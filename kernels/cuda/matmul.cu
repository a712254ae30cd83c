/*
 * matmul.cu - out = inp . weight^T + bias on the GPU with cuBLAS (twin of
 * wf_matmul_*). Legend: N rows (B*T), C input channels, OC output channels.
 *
 * cuBLAS is column-major, weft row-major. A row-major (R, K) matrix is, byte for
 * byte, the column-major (K, R) matrix: its transpose. So each row-major product
 * is computed as its transpose, with the operands' roles swapped:
 *
 *   forward   out (N,OC) = inp (N,C) . W^T        out^T (OC,N) = W (OC,C) . inp^T (C,N)
 *             col-major: W is (C,OC), ld C, so op T; inp is (C,N), ld C, op N
 *             -> sgemm(T, N, m=OC, n=N, k=C, W, C, inp, C, out, OC)
 *   dinp      dinp (N,C) += dout (N,OC) . W (OC,C)  dinp^T (C,N) = W^T (C,OC) . dout^T (OC,N)
 *             W col-major (C,OC) op N; dout col-major (OC,N), ld OC, op N
 *             -> sgemm(N, N, m=C, n=N, k=OC, W, C, dout, OC, beta 1, dinp, C)
 *   dweight   dW (OC,C) += dout^T (OC,N) . inp (N,C) dW^T (C,OC) = inp^T (C,N) . dout (N,OC)
 *             inp col-major (C,N) op N; dout col-major (OC,N) op T
 *             -> sgemm(N, T, m=C, n=OC, k=N, inp, C, dout, OC, beta 1, dW, C)
 *
 * The bias is a separate epilogue kernel over out (plain cublasSgemm has no bias
 * epilogue; cublasLt's would add a library). dbias is a column sum of dout done
 * like layernorm's parameter gradients: 32 columns per block, 8 thread rows over
 * N, combined in shared memory; deterministic. cuBLAS runs in its default math
 * mode, so these are true FP32 GEMMs (no TF32), matching the CPU twin closely.
 */
#include "cuda_int.h"

#define COL_TILE  32
#define ROW_LANES 8

/* out (N,OC) += bias (OC) broadcast over rows */
__global__ static void add_bias_kernel(float *out, const float *bias, int OC, size_t n)
{
  WF_GRID_STRIDE(i, n) { out[i] += bias[i % (size_t)OC]; }
}

/* dbias (OC) += sum over rows of dout (N,OC). Block (32, 8). */
__global__ static void bias_backward_kernel(float *dbias, const float *dout, int N, int OC)
{
  __shared__ float part[ROW_LANES][COL_TILE + 1];
  int c = blockIdx.x * COL_TILE + threadIdx.x;
  float acc = 0.0f;
  if (c < OC)
    for (int n = threadIdx.y; n < N; n += ROW_LANES)
      acc += dout[(size_t)n * OC + c];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= OC)
    return;
  for (int r = 1; r < ROW_LANES; r++)
    acc += part[r][threadIdx.x];
  dbias[c] += acc;
}

extern "C" void wf_cuda_matmul_forward(float *out, const float *inp, const float *weight,
                                       const float *bias, int N, int C, int OC, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  const float one = 1.0f, zero = 0.0f;
  size_t n = (size_t)N * OC;
  if (N <= 0 || OC <= 0 || C < 0)
    return;
  if (C == 0) { /* an empty sum: out = bias (or 0) */
    if (!WF_CUDA_OK(cudaMemsetAsync(out, 0, n * sizeof(float), s)))
      return;
  } else {
    cublasHandle_t h = wf__cublas_begin(s, __FILE__, __LINE__);
    if (!h)
      return;
    cublasStatus_t st =
        cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, weight, C, inp, C, &zero, out, OC);
    wf__cublas_end(st, __FILE__, __LINE__, "cublasSgemm (matmul forward)");
    if (st != CUBLAS_STATUS_SUCCESS)
      return;
  }
  if (!bias)
    return;
  add_bias_kernel<<<wf__grid_1d(n, 256), 256, 0, s>>>(out, bias, OC, n);
  WF_CUDA_LAUNCHED("add_bias_kernel");
}

/* The two GEMMs of the backward pass, under one hold of the cuBLAS lock. */
static bool matmul_backward_gemms(float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, int N, int C, int OC, cudaStream_t s)
{
  const float one = 1.0f;
  cublasHandle_t h = wf__cublas_begin(s, __FILE__, __LINE__);
  if (!h)
    return false;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (dinp)
    st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C, dout, OC, &one, dinp,
                     C);
  if (st == CUBLAS_STATUS_SUCCESS && dweight)
    st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC, &one, dweight,
                     C);
  wf__cublas_end(st, __FILE__, __LINE__, "cublasSgemm (matmul backward)");
  return st == CUBLAS_STATUS_SUCCESS;
}

extern "C" void wf_cuda_matmul_backward(float *dinp, float *dweight, float *dbias,
                                        const float *dout, const float *inp, const float *weight,
                                        int N, int C, int OC, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (N <= 0 || OC <= 0 || C < 0)
    return;
  if (C > 0 && (dinp || dweight) &&
      !matmul_backward_gemms(dinp, dweight, dout, inp, weight, N, C, OC, s))
    return;
  if (!dbias)
    return;
  unsigned grid = (unsigned)((OC + COL_TILE - 1) / COL_TILE);
  bias_backward_kernel<<<grid, dim3(COL_TILE, ROW_LANES), 0, s>>>(dbias, dout, N, OC);
  WF_CUDA_LAUNCHED("bias_backward_kernel");
}
