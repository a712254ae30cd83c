/*
 * qknorm.c - RMSNorm of the queries' and keys' groups inside packed [q | k | v] rows, in
 * parts a tensor-parallel caller can reduce between (qknorm.h).
 *
 * Legend: N rows of ld elements; a row's first nq elements are queries in groups of gq,
 * the next nk keys in groups of gk; G groups a row. Rows are split over threads; each
 * row's groups are computed in order (float sums in element order). The weights'
 * gradients are summed per thread and then added in thread order, so results depend on
 * the thread count alone, as the other CPU kernels'.
 */
#include <math.h>
#include <string.h>

#include "cpu_int.h"
#include "storage.h"
#include "wf_kernels.h"

typedef struct qkn {
  void *qkv, *raw, *dqkv;
  float *ss, *rstd, *dot, *dwq, *dwk;
  const float *wq, *wk, *sums;
  int N, ld, nq, gq, fq, nk, gk, fk, fmt;
  float eps;
} qkn;

/* Group g of a row: its first element, length, weights and full size. */
typedef struct group {
  int at, len, full;
  const float *w;
  bool key;
} group;

static int groups(const qkn *v) { return v->nq / v->gq + v->nk / v->gk; }

static group group_of(const qkn *v, int g)
{
  int gq = v->nq / v->gq;
  if (g < gq)
    return (group){g * v->gq, v->gq, v->fq, v->wq, false};
  return (group){v->nq + (g - gq) * v->gk, v->gk, v->fk, v->wk, true};
}

static void sumsq_share(void *ctx, int tid, int nt)
{
  const qkn *v = ctx;
  size_t w = (size_t)(v->nq + v->nk), G = (size_t)groups(v), lo, hi;
  float *x = wf__work(0, w);
  if (!x)
    return;
  wf__split((size_t)v->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++) {
    wf__load(x, v->qkv, n * (size_t)v->ld, w, v->fmt);
    for (size_t g = 0; g < G; g++) {
      group q = group_of(v, (int)g);
      float s = 0;
      for (int i = 0; i < q.len; i++)
        s += x[q.at + i] * x[q.at + i];
      v->ss[n * G + g] = s;
    }
  }
}

void wf_qknorm_sumsq(float *ss, const void *qkv, int N, int ld, int nq, int gq, int nk, int gk,
                     int fmt)
{
  qkn v = {.ss = ss,
           .qkv = (void *)qkv,
           .N = N,
           .ld = ld,
           .nq = nq,
           .gq = gq,
           .nk = nk,
           .gk = gk,
           .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)N * (size_t)(nq + nk)), sumsq_share, &v);
}

static void forward_share(void *ctx, int tid, int nt)
{
  const qkn *v = ctx;
  size_t w = (size_t)(v->nq + v->nk), G = (size_t)groups(v), lo, hi;
  float *x = wf__work(0, w);
  if (!x)
    return;
  wf__split((size_t)v->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++) {
    size_t row = n * (size_t)v->ld;
    wf__load(x, v->qkv, row, w, v->fmt);
    wf__store(v->raw, n * w, x, w, v->fmt); /* as it was: backward's x */
    for (size_t g = 0; g < G; g++) {
      group q = group_of(v, (int)g);
      float r = 1.0f / sqrtf(v->ss[n * G + g] / (float)q.full + v->eps);
      v->rstd[n * G + g] = r;
      for (int i = 0; i < q.len; i++)
        x[q.at + i] = q.w[i] * (x[q.at + i] * r);
    }
    wf__store(v->qkv, row, x, w, v->fmt);
  }
}

void wf_qknorm_forward(void *qkv, void *raw, float *rstd, const float *ss, const float *wq,
                       const float *wk, int N, int ld, int nq, int gq, int fq, int nk, int gk,
                       int fk, float eps, int fmt)
{
  qkn v = {.qkv = qkv,
           .raw = raw,
           .rstd = rstd,
           .ss = (float *)ss,
           .wq = wq,
           .wk = wk,
           .N = N,
           .ld = ld,
           .nq = nq,
           .gq = gq,
           .fq = fq,
           .nk = nk,
           .gk = gk,
           .fk = fk,
           .eps = eps,
           .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)N * (size_t)(nq + nk)), forward_share, &v);
}

/* Row n's dy and x_hat (w elements each) into d and x. */
static void load_row(const qkn *v, size_t n, float *d, float *x)
{
  size_t w = (size_t)(v->nq + v->nk), G = (size_t)groups(v);
  wf__load(d, v->dqkv, n * (size_t)v->ld, w, v->fmt);
  wf__load(x, v->raw, n * w, w, v->fmt);
  for (size_t g = 0; g < G; g++) {
    group q = group_of(v, (int)g);
    for (int i = 0; i < q.len; i++)
      x[q.at + i] *= v->rstd[n * G + g];
  }
}

static void dot_share(void *ctx, int tid, int nt)
{
  const qkn *v = ctx;
  size_t w = (size_t)(v->nq + v->nk), G = (size_t)groups(v), lo, hi;
  float *d = wf__work(0, 2 * w), *x = d + w;
  if (!d)
    return;
  wf__split((size_t)v->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++) {
    load_row(v, n, d, x);
    for (size_t g = 0; g < G; g++) {
      group q = group_of(v, (int)g);
      float s = 0;
      for (int i = 0; i < q.len; i++)
        s += q.w[i] * d[q.at + i] * x[q.at + i];
      v->dot[n * G + g] = s;
    }
  }
}

void wf_qknorm_dot(float *dot, const void *dqkv, const void *raw, const float *rstd,
                   const float *wq, const float *wk, int N, int ld, int nq, int gq, int nk, int gk,
                   int fmt)
{
  qkn v = {.dot = dot,
           .dqkv = (void *)dqkv,
           .raw = (void *)raw,
           .rstd = (float *)rstd,
           .wq = wq,
           .wk = wk,
           .N = N,
           .ld = ld,
           .nq = nq,
           .gq = gq,
           .nk = nk,
           .gk = gk,
           .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)N * (size_t)(nq + nk)), dot_share, &v);
}

/* The queries' and keys' input gradients, row by row, in place. */
static void backward_share(void *ctx, int tid, int nt)
{
  const qkn *v = ctx;
  size_t w = (size_t)(v->nq + v->nk), G = (size_t)groups(v), lo, hi;
  float *d = wf__work(0, 2 * w), *x = d ? d + w : NULL;
  if (!d)
    return;
  wf__split((size_t)v->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++) {
    load_row(v, n, d, x);
    for (size_t g = 0; g < G; g++) {
      group q = group_of(v, (int)g);
      float r = v->rstd[n * G + g], m = v->sums[n * G + g] / (float)q.full;
      for (int i = 0; i < q.len; i++)
        d[q.at + i] = r * (q.w[i] * d[q.at + i] - x[q.at + i] * m);
    }
    wf__store(v->dqkv, n * (size_t)v->ld, d, w, v->fmt);
  }
}

/* The weights' gradients, split by weight element (each sums its rows and groups in
 * order, whatever the thread count): dw[i] += sum dy x_hat at element i of every group
 * that element i of the weights scales. */
static void dw_share(void *ctx, int tid, int nt)
{
  const qkn *v = ctx;
  size_t w = (size_t)(v->nq + v->nk), G = (size_t)groups(v), lo, hi;
  wf__split((size_t)(v->gq + v->gk), tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++) {
    bool key = i >= (size_t)v->gq;
    size_t k = key ? i - (size_t)v->gq : i;
    float s = 0;
    for (size_t n = 0; n < (size_t)v->N; n++)
      for (size_t g = 0; g < G; g++) {
        group q = group_of(v, (int)g);
        if (q.key != key || (size_t)q.len <= k)
          continue;
        size_t at = (size_t)q.at + k;
        float dy = wf_storage_get(v->dqkv, n * (size_t)v->ld + at, v->fmt);
        s += dy * wf_storage_get(v->raw, n * w + at, v->fmt) * v->rstd[n * G + g];
      }
    (key ? v->dwk : v->dwq)[k] += s;
  }
}

void wf_qknorm_backward(void *dqkv, float *dwq, float *dwk, const void *raw, const float *rstd,
                        const float *dot, const float *wq, const float *wk, int N, int ld, int nq,
                        int gq, int fq, int nk, int gk, int fk, int fmt)
{
  qkn v = {.dqkv = dqkv,
           .dwq = dwq,
           .dwk = dwk,
           .raw = (void *)raw,
           .rstd = (float *)rstd,
           .sums = dot,
           .wq = wq,
           .wk = wk,
           .N = N,
           .ld = ld,
           .nq = nq,
           .gq = gq,
           .fq = fq,
           .nk = nk,
           .gk = gk,
           .fk = fk,
           .fmt = fmt};
  size_t work = (size_t)N * (size_t)(nq + nk);
  wf__parallel(wf__threads_for(work), dw_share, &v); /* before dy is overwritten */
  wf__parallel(wf__threads_for(work), backward_share, &v);
}

/* ---- the op (wf_kreg.h): the functions above, the stream unused ---------------------- */

static void sumsq(float *ss, const void *qkv, int N, int ld, int nq, int gq, int nk, int gk,
                  int fmt, wf_stream *s)
{
  (void)s;
  wf_qknorm_sumsq(ss, qkv, N, ld, nq, gq, nk, gk, fmt);
}

static void fwd(void *qkv, void *raw, float *rstd, const float *ss, const float *wq,
                const float *wk, int N, int ld, int nq, int gq, int fq, int nk, int gk, int fk,
                float eps, int fmt, wf_stream *s)
{
  (void)s;
  wf_qknorm_forward(qkv, raw, rstd, ss, wq, wk, N, ld, nq, gq, fq, nk, gk, fk, eps, fmt);
}

static void dot(float *d, const void *dqkv, const void *raw, const float *rstd, const float *wq,
                const float *wk, int N, int ld, int nq, int gq, int nk, int gk, int fmt,
                wf_stream *s)
{
  (void)s;
  wf_qknorm_dot(d, dqkv, raw, rstd, wq, wk, N, ld, nq, gq, nk, gk, fmt);
}

static void bwd(void *dqkv, float *dwq, float *dwk, const void *raw, const float *rstd,
                const float *d, const float *wq, const float *wk, int N, int ld, int nq, int gq,
                int fq, int nk, int gk, int fk, int fmt, wf_stream *s)
{
  (void)s;
  wf_qknorm_backward(dqkv, dwq, dwk, raw, rstd, d, wq, wk, N, ld, nq, gq, fq, nk, gk, fk, fmt);
}

static const wf_qknorm_op op = {sumsq, fwd, dot, bwd};
const wf_kvariants wf__cpu_qknorm = WF_KV_ANY(qknorm, WF_OP_VERSION_qknorm, &op);
