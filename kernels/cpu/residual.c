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
