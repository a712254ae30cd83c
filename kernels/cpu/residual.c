/*
 * residual.c - residual connection out = a + b, elementwise over N values.
 * Backward adds dout into both da and db (which may be the same buffer).
 */
#include "cpu_int.h"
#include "wf_kernels.h"

struct res {
  float *x, *y;
  const float *a, *b;
  size_t n;
};

static void forward_share(void *p, int tid, int nt)
{
  const struct res *r = p;
  size_t lo, hi;
  wf__split(r->n, tid, nt, 16, &lo, &hi);
  float *out = r->x;
  const float *a = r->a, *b = r->b;
#pragma omp simd
  for (size_t i = lo; i < hi; i++)
    out[i] = a[i] + b[i];
}

void wf_residual_forward(float *out, const float *a, const float *b, size_t N)
{
  struct res r = {out, NULL, a, b, N};
  wf__parallel(wf__threads_for(N), forward_share, &r);
}

static void backward_share(void *p, int tid, int nt)
{
  const struct res *r = p;
  size_t lo, hi;
  wf__split(r->n, tid, nt, 16, &lo, &hi);
  float *da = r->x, *db = r->y;
  const float *d = r->a;
  for (size_t i = lo; i < hi; i++) {
    da[i] += d[i];
    db[i] += d[i];
  }
}

void wf_residual_backward(float *da, float *db, const float *dout, size_t N)
{
  struct res r = {da, db, dout, NULL, N};
  wf__parallel(wf__threads_for(N), backward_share, &r);
}

/* ---- 16-bit storage: blocks of a task's range through the stack ------------------------- */

#define BLOCK 256

struct res16 {
  void *out;
  const void *a;
  const float *b;
  size_t n;
  int fmt;
};

static void forward16_share(void *p, int tid, int nt)
{
  const struct res16 *r = p;
  size_t lo, hi;
  float x[BLOCK];
  wf__split(r->n, tid, nt, 32, &lo, &hi);
  for (size_t i = lo; i < hi; i += BLOCK) {
    size_t n = hi - i < BLOCK ? hi - i : BLOCK;
    wf__load(x, r->a, i, n, r->fmt);
#pragma omp simd
    for (size_t j = 0; j < n; j++)
      x[j] = x[j] + r->b[i + j];
    wf__store(r->out, i, x, n, r->fmt);
  }
}

void wf_residual_forward16(void *out, const void *a, const float *b, size_t N, int fmt)
{
  struct res16 r = {out, a, b, N, fmt};
  wf__parallel(wf__threads_for(N), forward16_share, &r);
}

void wf__residual_forward_as(void *out, const void *a, const float *b, size_t N, int fmt)
{
  if (fmt == WF_DT_F32)
    wf_residual_forward(out, a, b, N);
  else
    wf_residual_forward16(out, a, b, N, fmt);
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound ----------------- */

static void backward(float *da, float *db, const float *dout, size_t N, wf_stream *s)
{
  wf_residual_backward(da, db, dout, N);
}

#define RESIDUAL_VARIANT(name, fmt)                                                                \
  static void name##_forward(void *out, const void *a, const float *b, size_t N, wf_stream *s)     \
  {                                                                                                \
    wf__residual_forward_as(out, a, b, N, fmt);                                                    \
  }                                                                                                \
  static const wf_residual_op name = {name##_forward, backward}

RESIDUAL_VARIANT(f32, WF_DT_F32);
RESIDUAL_VARIANT(bf16, WF_DT_BF16);
RESIDUAL_VARIANT(f16, WF_DT_F16);
const wf_kvariants wf__cpu_residual = WF_KV(residual, WF_OP_VERSION_residual, &f32, &bf16, &f16);
