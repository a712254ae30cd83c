/*
 * matmul.c - the linear layer, out = inp . weight^T + bias, on OpenBLAS sgemm.
 *
 * Legend: N rows (B*T tokens), C input channels, OC output channels.
 * Large GEMMs are split over the thread budget by the output dimension that is
 * larger (wf__sgemm), each share a single-threaded OpenBLAS call, so the split is
 * a pure function of the sizes and the budget (deterministic results).
 */
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

struct gemm {
  enum CBLAS_TRANSPOSE ta, tb;
  int M, N, K;
  float alpha;
  const float *A;
  int lda;
  const float *B;
  int ldb;
  float beta;
  float *C;
  int ldc;
};

/* One thread's share: 16-aligned columns (or rows, whichever output dimension is
 * larger), a multiple of OpenBLAS's register blocking. */
static void gemm_share(void *p, int tid, int nt)
{
  const struct gemm *g = p;
  int split_n = g->N >= g->M;
  size_t lo, hi;
  wf__split(split_n ? (size_t)g->N : (size_t)g->M, tid, nt, 16, &lo, &hi);
  int i = (int)lo, n = (int)(hi - lo);
  if (n <= 0)
    return;
  if (split_n)
    cblas_sgemm(CblasRowMajor, g->ta, g->tb, g->M, n, g->K, g->alpha, g->A, g->lda,
                op_cols(g->B, g->tb, g->ldb, i), g->ldb, g->beta, g->C + i, g->ldc);
  else
    cblas_sgemm(CblasRowMajor, g->ta, g->tb, n, g->N, g->K, g->alpha,
                op_rows(g->A, g->ta, g->lda, i), g->lda, g->B, g->ldb, g->beta,
                g->C + (size_t)i * g->ldc, g->ldc);
}

void wf__sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
  if (M <= 0 || N <= 0)
    return;
  struct gemm g = {ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
  wf__parallel(wf__threads_for((size_t)M * N * K / 64), gemm_share, &g);
}

/* out (N,OC) = bias broadcast; each thread fills the columns it will multiply into,
 * then accumulates its GEMM share (beta = 1), so the bias costs no extra pass. */
struct fwd_bias {
  float *out;
  const float *inp, *weight, *bias;
  int N, C, OC;
};

static void forward_bias_share(void *p, int tid, int nt)
{
  const struct fwd_bias *f = p;
  size_t lo, hi;
  wf__split((size_t)f->OC, tid, nt, 16, &lo, &hi);
  int o0 = (int)lo, n = (int)(hi - lo);
  if (n <= 0)
    return;
  for (int r = 0; r < f->N; r++)
    memcpy(f->out + (size_t)r * f->OC + o0, f->bias + o0, (size_t)n * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, f->N, n, f->C, 1.0f, f->inp, f->C,
              f->weight + (size_t)o0 * f->C, f->C, 1.0f, f->out + o0, f->OC);
}

void wf_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC)
{
  if (N <= 0 || OC <= 0)
    return;
  if (bias) {
    struct fwd_bias f = {out, inp, weight, bias, N, C, OC};
    wf__parallel(wf__threads_for((size_t)N * C * OC / 64), forward_bias_share, &f);
    return;
  }
  wf__sgemm(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
}

/* dbias (OC) += sum over rows of dout (N,OC): threads own column ranges, rows are
 * summed in order, so the result does not depend on the thread count. */
struct bias_bwd {
  float *dbias;
  const float *dout;
  int N, OC;
};

static void bias_backward_share(void *p, int tid, int nt)
{
  const struct bias_bwd *b = p;
  size_t lo, hi;
  wf__split((size_t)b->OC, tid, nt, 16, &lo, &hi);
  float *db = b->dbias;
  for (int r = 0; r < b->N; r++) {
    const float *row = b->dout + (size_t)r * b->OC;
#pragma omp simd
    for (size_t o = lo; o < hi; o++)
      db[o] += row[o];
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
  if (dbias) {
    struct bias_bwd b = {dbias, dout, N, OC};
    wf__parallel(wf__threads_for((size_t)N * OC), bias_backward_share, &b);
  }
}
