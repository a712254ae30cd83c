/*
 * adamw.c - AdamW with bias correction, on n contiguous parameters.
 *
 * This streams 7 floats per parameter (read p, m, v, g; write p, m, v), ~3.5 GB for
 * GPT-2 124M, so it is memory-bound: one vectorised pass, split over threads in
 * cache-line-aligned chunks, with every per-step constant hoisted out of the loop.
 * Under mixed precision the same pass stores the updated parameters into the model's
 * 16-bit copy (wf_adamw_update_store), a block at a time while they are in cache.
 */
#include <math.h>

#include "cpu_int.h"
#include "wf_kernels.h"

struct adamw_consts {
  float lr, b1, b2, one_m_b1, one_m_b2, eps, wd, ibc1, ibc2, gs;
};

WF__CLONES static void adamw_range(float *p, float *m, float *v, const float *g, size_t lo,
                                   size_t hi, const struct adamw_consts *k)
{
  const struct adamw_consts c = *k;
#pragma omp simd
  for (size_t i = lo; i < hi; i++) {
    float gi = g[i] * c.gs;
    float mi = c.b1 * m[i] + c.one_m_b1 * gi;
    float vi = c.b2 * v[i] + c.one_m_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= c.lr * (mi * c.ibc1 / (sqrtf(vi * c.ibc2) + c.eps) + c.wd * p[i]);
  }
}

/* Parameters a thread updates, then stores, at a time: 16 KiB of each stream, so the
 * store reads what the update just wrote from L1. */
#define STORE_BLOCK 4096

struct adamw_task {
  float *p, *m, *v;
  const float *g;
  void *low; /* NULL: update only */
  int fmt;
  size_t n;
  const struct adamw_consts *k;
};

static void adamw_share(void *p, int tid, int nt)
{
  const struct adamw_task *a = p;
  size_t lo, hi;
  wf__split(a->n, tid, nt, 16, &lo, &hi);
  if (!a->low) {
    adamw_range(a->p, a->m, a->v, a->g, lo, hi, a->k);
    return;
  }
  for (size_t b = lo; b < hi; b += STORE_BLOCK) {
    size_t e = WF_MIN(hi, b + STORE_BLOCK);
    adamw_range(a->p, a->m, a->v, a->g, b, e, a->k);
    wf__store(a->low, b, a->p + b, e - b, a->fmt);
  }
}

void wf_adamw_update_store(float *params, void *low, float *m, float *v, const float *grads,
                           size_t n, float lr, float beta1, float beta2, float eps,
                           float weight_decay, int t, float grad_scale, int fmt)
{
  if (t < 1)
    t = 1;
  struct adamw_consts k = {
      .lr = lr,
      .b1 = beta1,
      .b2 = beta2,
      .one_m_b1 = 1.0f - beta1,
      .one_m_b2 = 1.0f - beta2,
      .eps = eps,
      .wd = weight_decay,
      .ibc1 = (float)(1.0 / (1.0 - pow(beta1, t))),
      .ibc2 = (float)(1.0 / (1.0 - pow(beta2, t))),
      .gs = grad_scale,
  };
  struct adamw_task a = {params, m, v, grads, low, fmt, n, &k};
  wf__parallel(wf__threads_for(n), adamw_share, &a);
}

void wf_adamw_update(float *params, float *m, float *v, const float *grads, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int t,
                     float grad_scale)
{
  wf_adamw_update_store(params, NULL, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t,
                        grad_scale, WF_PREC_NO);
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound ----------------- */

static void update(float *params, float *m, float *v, const float *grads, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale,
                   wf_stream *s)
{
  wf_adamw_update(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
}

#define ADAMW_VARIANT(name, fmt)                                                                   \
  static void name##_update_store(float *params, void *low, float *m, float *v,                    \
                                  const float *grads, size_t n, float lr, float beta1,             \
                                  float beta2, float eps, float weight_decay, int t,               \
                                  float grad_scale, wf_stream *s)                                  \
  {                                                                                                \
    wf_adamw_update_store(params, low, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t,     \
                          grad_scale, fmt);                                                        \
  }                                                                                                \
  static const wf_adamw_op name = {update, name##_update_store}

ADAMW_VARIANT(f32, WF_DT_F32);
ADAMW_VARIANT(bf16, WF_DT_BF16);
ADAMW_VARIANT(f16, WF_DT_F16);
const wf_kvariants wf__cpu_adamw = WF_KV(adamw, WF_OP_VERSION_adamw, &f32, &bf16, &f16);
