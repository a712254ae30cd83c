/*
 * matmul.c - the linear layer, out = inp . weight^T + bias, on OpenBLAS sgemm.
 *
 * Legend: N rows (B*T tokens), C input channels, OC output channels.
 * Large GEMMs are split over the thread budget by the output dimension that is
 * larger (wf__sgemm), each share a single-threaded OpenBLAS call, so the split is
 * a pure function of the sizes and the budget (deterministic results).
 */
#include <omp.h>

#include "cpu_int.h"
#include "wf_kernels.h"

/* Offset of row/column `i` of op(X) for row-major X with leading dimension ld. */
static const float *op_rows(const float *X, enum CBLAS_TRANSPOSE t, int ld, int i)
{
  return t == CblasNoTrans ? X + (size_t)i * ld : X + i;
}

static const float *op_cols(const float *X, enum CBLAS_TRANSPOSE t, int ld, int j)
{
  return t == CblasNoTrans ? X + j : X + (size_t)j * ld;
}

void wf__sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
  if (M <= 0 || N <= 0)
    return;
  int nt = wf__threads_for((size_t)M * N * K / 64);
  if (nt == 1) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  int split_n = N >= M;
#pragma omp parallel num_threads(nt)
  {
    size_t lo, hi;
    /* shares of 16 rows/columns: a multiple of OpenBLAS's register blocking */
    wf__split(split_n ? (size_t)N : (size_t)M, omp_get_thread_num(), omp_get_num_threads(), 16, &lo,
              &hi);
    int i = (int)lo, n = (int)(hi - lo);
    if (n > 0 && split_n)
      cblas_sgemm(CblasRowMajor, ta, tb, M, n, K, alpha, A, lda, op_cols(B, tb, ldb, i), ldb, beta,
                  C + i, ldc);
    else if (n > 0)
      cblas_sgemm(CblasRowMajor, ta, tb, n, N, K, alpha, op_rows(A, ta, lda, i), lda, B, ldb, beta,
                  C + (size_t)i * ldc, ldc);
  }
}

/* out (N,OC) = bias broadcast; each thread fills the columns it will multiply into,
 * then accumulates its GEMM share (beta = 1), so the bias costs no extra pass. */
static void forward_bias(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC, int nt)
{
#pragma omp parallel num_threads(nt)
  {
    size_t lo, hi;
    wf__split((size_t)OC, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
    int o0 = (int)lo, n = (int)(hi - lo);
    if (n > 0) {
      for (int r = 0; r < N; r++)
        memcpy(out + (size_t)r * OC + o0, bias + o0, (size_t)n * sizeof(float));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, n, C, 1.0f, inp, C,
                  weight + (size_t)o0 * C, C, 1.0f, out + o0, OC);
    }
  }
}

void wf_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC)
{
  if (N <= 0 || OC <= 0)
    return;
  if (bias) {
    forward_bias(out, inp, weight, bias, N, C, OC, wf__threads_for((size_t)N * C * OC / 64));
    return;
  }
  wf__sgemm(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
}

/* dbias (OC) += sum over rows of dout (N,OC): threads own column ranges, rows are
 * summed in order, so the result does not depend on the thread count. */
static void bias_backward(float *dbias, const float *dout, int N, int OC)
{
  int nt = wf__threads_for((size_t)N * OC);
#pragma omp parallel num_threads(nt)
  {
    size_t lo, hi;
    wf__split((size_t)OC, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
    for (int r = 0; r < N; r++) {
      const float *row = dout + (size_t)r * OC;
#pragma omp simd
      for (size_t o = lo; o < hi; o++)
        dbias[o] += row[o];
    }
  }
}

void wf_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC)
{
  if (N <= 0 || OC <= 0 || C <= 0)
    return;
  /* dinp (N,C) += dout (N,OC) . weight (OC,C) */
  if (dinp)
    wf__sgemm(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
  /* dweight (OC,C) += dout^T (OC,N) . inp (N,C) */
  if (dweight)
    wf__sgemm(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias)
    bias_backward(dbias, dout, N, OC);
}
