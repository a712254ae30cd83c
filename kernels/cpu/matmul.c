/*
 * matmul.c - the linear layer, out = inp . weight^T + bias, on OpenBLAS sgemm.
 *
 * Legend: N rows (B*T tokens), C input channels, OC output channels.
 * Large GEMMs are split over the thread budget by the output dimension that is
 * larger (wf__sgemm), each share a single-threaded OpenBLAS call, so the split is
 * a pure function of the sizes and the budget (deterministic results).
 *
 * The 16-bit forms (storage.h) load their operands panel by panel into this thread's
 * working memory and run single-threaded sgemm on the widened panels: a panel of at
 * most PANEL rows of the weight (forward), of PANEL columns of dout (dweight, dbias),
 * or PANEL of the reduction (dinp), so no fp32 copy of a whole operand is made. The
 * products of 16-bit values are exact in fp32, so this computes the exact products
 * accumulated in fp32 (in panel order for dinp).
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

bool wf__dinp_has_terms(void *dinp, size_t width, int N, int C, int OC)
{
  if (N <= 0 || C <= 0)
    return false;
  if (OC <= 0 && dinp)
    memset(dinp, 0, (size_t)N * C * width); /* 0 is all zero bits in every format */
  return OC > 0;
}

void wf_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC)
{
  if (!wf__dinp_has_terms(dinp, sizeof *dinp, N, C, OC))
    return;
  /* dinp (N,C) = dout (N,OC) . weight (OC,C), written */
  if (dinp)
    wf__sgemm(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
  /* dweight (OC,C) += dout^T (OC,N) . inp (N,C) */
  if (dweight)
    wf__sgemm(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias) {
    struct bias_bwd b = {dbias, dout, N, OC};
    wf__parallel(wf__threads_for((size_t)N * OC), bias_backward_share, &b);
  }
}

/* ---- 16-bit storage ---------------------------------------------------------------------- */

#define PANEL 256

struct mm16 {
  void *out, *dinp; /* in fmt, unless out32 / dinp32 is given */
  float *out32, *dinp32, *dweight, *dbias;
  const void *inp, *weight, *dout;
  const float *bias;
  int N, C, OC, fmt;
};

/* rows [r0, r0 + nr) of a (R, ld) matrix in format fmt, columns [c0, c0 + nc), into dst
 * (nr, nc) */
static void load_panel(float *dst, const void *src, size_t ld, size_t r0, size_t nr, size_t c0,
                       size_t nc, int fmt)
{
  for (size_t r = 0; r < nr; r++)
    wf__load(dst + r * nc, src, (r0 + r) * ld + c0, nc, fmt);
}

/* Forward: this thread's output columns, PANEL weight rows at a time; out block (N, n) =
 * bias, then += inp . W[panel]^T, then stored. */
static void forward16_share(void *p, int tid, int nt)
{
  const struct mm16 *f = p;
  size_t N = (size_t)f->N, C = (size_t)f->C, OC = (size_t)f->OC, lo, hi;
  wf__split(OC, tid, nt, 16, &lo, &hi);
  if (lo >= hi)
    return;
  float *x = wf__work(0, N * C), *w = wf__work(1, PANEL * C), *o = wf__work(2, N * PANEL);
  if (!x || !w || !o)
    return;
  wf__load(x, f->inp, 0, N * C, f->fmt);
  for (size_t o0 = lo; o0 < hi; o0 += PANEL) {
    size_t n = hi - o0 < PANEL ? hi - o0 : PANEL;
    load_panel(w, f->weight, C, o0, n, 0, C, f->fmt);
    for (size_t r = 0; r < N; r++)
      for (size_t j = 0; j < n; j++)
        o[r * n + j] = f->bias ? f->bias[o0 + j] : 0.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)n, (int)C, 1.0f, x, (int)C, w,
                (int)C, 1.0f, o, (int)n);
    for (size_t r = 0; r < N; r++) {
      if (f->out32)
        memcpy(f->out32 + r * OC + o0, o + r * n, n * sizeof(float));
      else
        wf__store(f->out, r * OC + o0, o + r * n, n, f->fmt);
    }
  }
}

void wf_matmul_forward16(void *out, const void *inp, const void *weight, const float *bias, int N,
                         int C, int OC, int fmt)
{
  struct mm16 f = {
      .out = out, .inp = inp, .weight = weight, .bias = bias, .N = N, .C = C, .OC = OC, .fmt = fmt};
  if (N > 0 && OC > 0)
    wf__parallel(wf__threads_for((size_t)N * C * OC / 64), forward16_share, &f);
}

void wf_matmul_forward16_f32(float *out, const void *inp, const void *weight, const float *bias,
                             int N, int C, int OC, int fmt)
{
  struct mm16 f = {.out32 = out,
                   .inp = inp,
                   .weight = weight,
                   .bias = bias,
                   .N = N,
                   .C = C,
                   .OC = OC,
                   .fmt = fmt};
  if (N > 0 && OC > 0)
    wf__parallel(wf__threads_for((size_t)N * C * OC / 64), forward16_share, &f);
}

/* dinp: this thread's columns of dinp (N, C), PANEL of the OC reduction at a time:
 * dinp[:, cols] = dout[:, first panel] . W[first panel, cols], then += each further
 * panel's product; in fp32 into dinp32, else in fp32 working memory, then stored. */
static void dinp16_share(void *p, int tid, int nt)
{
  const struct mm16 *f = p;
  size_t N = (size_t)f->N, C = (size_t)f->C, OC = (size_t)f->OC, lo, hi;
  wf__split(C, tid, nt, 16, &lo, &hi);
  if (lo >= hi)
    return;
  size_t nc = hi - lo, ldo = f->dinp32 ? C : nc;
  float *d = wf__work(0, N * PANEL), *w = wf__work(1, PANEL * nc);
  float *o = f->dinp32 ? f->dinp32 + lo : wf__work(2, N * nc);
  if (!d || !w || !o)
    return;
  for (size_t k0 = 0; k0 < OC; k0 += PANEL) {
    size_t k = OC - k0 < PANEL ? OC - k0 : PANEL;
    load_panel(d, f->dout, OC, 0, N, k0, k, f->fmt);
    load_panel(w, f->weight, C, k0, k, lo, nc, f->fmt);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)nc, (int)k, 1.0f, d, (int)k,
                w, (int)nc, k0 == 0 ? 0.0f : 1.0f, o, (int)ldo);
  }
  for (size_t r = 0; !f->dinp32 && r < N; r++)
    wf__store(f->dinp, r * C + lo, o + r * nc, nc, f->fmt);
}

/* dweight, dbias: this thread's rows of dweight (OC, C), PANEL at a time:
 * dweight[panel] += dout[:, panel]^T . inp; dbias[panel] += the rows of dout[:, panel],
 * summed in row order. */
static void dweight16_share(void *p, int tid, int nt)
{
  const struct mm16 *f = p;
  size_t N = (size_t)f->N, C = (size_t)f->C, OC = (size_t)f->OC, lo, hi;
  wf__split(OC, tid, nt, 16, &lo, &hi);
  if (lo >= hi)
    return;
  float *x = f->dweight ? wf__work(0, N * C) : NULL, *d = wf__work(1, N * PANEL);
  if ((f->dweight && !x) || !d)
    return;
  if (x)
    wf__load(x, f->inp, 0, N * C, f->fmt);
  for (size_t o0 = lo; o0 < hi; o0 += PANEL) {
    size_t n = hi - o0 < PANEL ? hi - o0 : PANEL;
    load_panel(d, f->dout, OC, 0, N, o0, n, f->fmt);
    if (x)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)C, (int)N, 1.0f, d, (int)n,
                  x, (int)C, 1.0f, f->dweight + o0 * C, (int)C);
    for (size_t r = 0; f->dbias && r < N; r++)
      for (size_t j = 0; j < n; j++)
        f->dbias[o0 + j] += d[r * n + j];
  }
}

static void backward16(const struct mm16 *f)
{
  int nt = wf__threads_for((size_t)f->N * f->C * f->OC / 64);
  void *dinp = f->dinp32 ? (void *)f->dinp32 : f->dinp;
  size_t width = f->dinp32 ? sizeof(float) : wf_storage_size(f->fmt);
  if (!wf__dinp_has_terms(dinp, width, f->N, f->C, f->OC))
    return;
  if (dinp)
    wf__parallel(nt, dinp16_share, (void *)f);
  if (f->dweight || f->dbias)
    wf__parallel(nt, dweight16_share, (void *)f);
}

/* The 16-bit backward with dinp in fmt, or in fp32 when dinp32 is given. */
static void backward16_into(void *dinp, float *dinp32, float *dweight, float *dbias,
                            const void *dout, const void *inp, const void *weight, int N, int C,
                            int OC, int fmt)
{
  backward16(&(struct mm16){.dinp = dinp,
                            .dinp32 = dinp32,
                            .dweight = dweight,
                            .dbias = dbias,
                            .dout = dout,
                            .inp = inp,
                            .weight = weight,
                            .N = N,
                            .C = C,
                            .OC = OC,
                            .fmt = fmt});
}

void wf_matmul_backward16(void *dinp, float *dweight, float *dbias, const void *dout,
                          const void *inp, const void *weight, int N, int C, int OC, int fmt)
{
  backward16_into(dinp, NULL, dweight, dbias, dout, inp, weight, N, C, OC, fmt);
}

void wf_matmul_backward16_f32(float *dinp, float *dweight, float *dbias, const void *dout,
                              const void *inp, const void *weight, int N, int C, int OC, int fmt)
{
  backward16_into(NULL, dinp, dweight, dbias, dout, inp, weight, N, C, OC, fmt);
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound -----------------
 * fp32 is the plain GEMM above whatever `lowp` says (operands already rounded to lowp's
 * format multiply exactly in fp32). A 16-bit type runs bf16 GEMMs through oneDNN where
 * this CPU has it (dnnl.c), else the 16-bit forms above; a 16-bit output adds its bias
 * rounded to the type (matmul.h's op). */

static void forward_as(void *out, float *out32, const void *inp, const void *w, const float *bias,
                       int N, int C, int OC, int fmt)
{
  if (fmt == WF_DT_F32) {
    wf_matmul_forward(out32 ? out32 : out, inp, w, bias, N, C, OC);
    return;
  }
  const float *rb = out32 || OC <= 0 ? bias : wf__bias_rounded(bias, (size_t)OC, fmt);
  if (bias && !rb) /* no memory: reported by last_error */
    return;
  if (fmt == WF_DT_BF16 && wf__dnnl_bf16())
    wf__dnnl_forward(out, out32, inp, w, rb, N, C, OC);
  else if (out32)
    wf_matmul_forward16_f32(out32, inp, w, rb, N, C, OC, fmt);
  else
    wf_matmul_forward16(out, inp, w, rb, N, C, OC, fmt);
}

static void backward_as(void *dinp, float *dinp32, float *dw, float *db, const void *dout,
                        const void *inp, const void *w, int N, int C, int OC, int fmt)
{
  if (fmt == WF_DT_F32)
    wf_matmul_backward(dinp32 ? dinp32 : dinp, dw, db, dout, inp, w, N, C, OC);
  else if (fmt == WF_DT_BF16 && wf__dnnl_bf16())
    wf__dnnl_backward(dinp, dinp32, dw, db, dout, inp, w, N, C, OC);
  else if (dinp32)
    wf_matmul_backward16_f32(dinp32, dw, db, dout, inp, w, N, C, OC, fmt);
  else
    wf_matmul_backward16(dinp, dw, db, dout, inp, w, N, C, OC, fmt);
}

static void set_tf32(int allow) {}

#define MATMUL_VARIANT(name, fmt)                                                                  \
  static void name##_forward(void *out, const void *inp, const void *w, const float *bias, int N,  \
                             int C, int OC, int lowp, wf_stream *s)                                \
  {                                                                                                \
    forward_as(out, NULL, inp, w, bias, N, C, OC, fmt);                                            \
  }                                                                                                \
  static void name##_forward_f32(float *out, const void *inp, const void *w, const float *bias,    \
                                 int N, int C, int OC, int lowp, wf_stream *s)                     \
  {                                                                                                \
    forward_as(NULL, out, inp, w, bias, N, C, OC, fmt);                                            \
  }                                                                                                \
  static void name##_gelu_forward(void *gelu_out, void *pre, const void *inp, const void *w,       \
                                  const float *bias, int N, int C, int OC, int lowp, wf_stream *s) \
  {                                                                                                \
    forward_as(pre, NULL, inp, w, bias, N, C, OC, fmt);                                            \
    wf__gelu_forward_as(gelu_out, pre, (size_t)N *OC, fmt);                                        \
  }                                                                                                \
  static void name##_backward(void *dinp, float *dw, float *db, const void *dout, const void *inp, \
                              const void *w, int N, int C, int OC, int lowp, wf_stream *s)         \
  {                                                                                                \
    backward_as(dinp, NULL, dw, db, dout, inp, w, N, C, OC, fmt);                                  \
  }                                                                                                \
  static void name##_backward_f32(float *dinp, float *dw, float *db, const void *dout,             \
                                  const void *inp, const void *w, int N, int C, int OC, int lowp,  \
                                  wf_stream *s)                                                    \
  {                                                                                                \
    backward_as(NULL, dinp, dw, db, dout, inp, w, N, C, OC, fmt);                                  \
  }                                                                                                \
  static const wf_matmul_op name = {name##_forward,  name##_forward_f32,  name##_gelu_forward,     \
                                    name##_backward, name##_backward_f32, set_tf32}

MATMUL_VARIANT(f32, WF_DT_F32);
MATMUL_VARIANT(bf16, WF_DT_BF16);
MATMUL_VARIANT(f16, WF_DT_F16);
const wf_kvariants wf__cpu_matmul = WF_KV(matmul, WF_OP_VERSION_matmul, &f32, &bf16, &f16);
