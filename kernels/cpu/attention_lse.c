/*
 * attention_lse.c - causal (grouped-query) attention over bf16 tensors: the CPU twin of
 * the tensor-core paths (kernels/cuda/flash_bf16.cu, cudnn_sdpa.cu). attention_lse.h
 * defines the numerics; this file is their plainest statement, so it favours clarity
 * over speed: a row at a time, scores recomputed rather than kept, fp32 sums in key
 * order. It is the reference the GPU paths are tested against, not a training path.
 *
 * Legend: B batch, T time, C = NH hs (query width), NKV kv heads, g = NH / NKV query
 * heads per kv head, ld = C + 2 NKV hs the row stride of qkv.
 *
 * Work is split over (b, kv head) pairs: the backward's dk and dv of a kv head sum over
 * its g query heads, so one thread owns them (and those heads' dq), and no two threads
 * write the same element. The forward splits over the same pairs for symmetry.
 */
#include <math.h>
#include <stdbool.h>

#include "cpu_int.h"
#include "wf_kernels.h"
#include "wf_runtime.h" /* WF_MIN */

#define DCHUNK 64 /* output dims accumulated per pass over a row (a fixed stack array) */

typedef struct geo16 {
  int B, T, C, NH, NKV, hs, g;
  size_t ld;
  float scale;
} geo16;

static geo16 geo_of(int B, int T, int C, int NH, int NKV)
{
  geo16 z = {B, T, C, NH, NKV, C / NH, NH / NKV, 0, 0};
  z.ld = (size_t)C + 2 * (size_t)NKV * z.hs;
  z.scale = 1.0f / sqrtf((float)z.hs);
  return z;
}

/* Row t of batch b: query head h, key head j, value head j. */
static const wf_bf16 *q_at(const geo16 *z, const wf_bf16 *qkv, int b, int t, int h)
{
  return qkv + ((size_t)b * z->T + t) * z->ld + (size_t)h * z->hs;
}

static const wf_bf16 *k_at(const geo16 *z, const wf_bf16 *qkv, int b, int t, int j)
{
  return q_at(z, qkv, b, t, 0) + z->C + (size_t)j * z->hs;
}

static const wf_bf16 *v_at(const geo16 *z, const wf_bf16 *qkv, int b, int t, int j)
{
  return k_at(z, qkv, b, t, z->NKV) + (size_t)j * z->hs;
}

static float dot16(const wf_bf16 *a, const wf_bf16 *b, int n)
{
  float s = 0.0f;
  for (int d = 0; d < n; d++)
    s += wf_bf16_to_float(a[d]) * wf_bf16_to_float(b[d]);
  return s;
}

/* ---- forward ------------------------------------------------------------------------ */

struct att16 {
  wf_bf16 *out, *dqkv;
  float *lse, *scratch;
  const wf_bf16 *qkv, *dout, *cout;
  const float *clse;
  geo16 z;
};

/* Row i of query head h (kv head j): out and lse. */
static void forward_row(const struct att16 *a, int b, int h, int i)
{
  const geo16 *z = &a->z;
  const int j = h / z->g;
  const wf_bf16 *q = q_at(z, a->qkv, b, i, h);
  float m = -INFINITY, l = 0.0f;
  for (int t = 0; t <= i; t++)
    m = fmaxf(m, dot16(q, k_at(z, a->qkv, b, t, j), z->hs) * z->scale);
  for (int t = 0; t <= i; t++)
    l += expf(dot16(q, k_at(z, a->qkv, b, t, j), z->hs) * z->scale - m);
  wf_bf16 *o = a->out + ((size_t)b * z->T + i) * z->C + (size_t)h * z->hs;
  for (int d0 = 0; d0 < z->hs; d0 += DCHUNK) {
    int nd = WF_MIN(DCHUNK, z->hs - d0);
    float acc[DCHUNK] = {0};
    for (int t = 0; t <= i; t++) {
      float p = wf_bf16_round(expf(dot16(q, k_at(z, a->qkv, b, t, j), z->hs) * z->scale - m));
      const wf_bf16 *v = v_at(z, a->qkv, b, t, j) + d0;
      for (int d = 0; d < nd; d++)
        acc[d] += p * wf_bf16_to_float(v[d]);
    }
    for (int d = 0; d < nd; d++)
      o[d0 + d] = wf_bf16_from_float(acc[d] / l);
  }
  a->lse[((size_t)b * z->NH + h) * z->T + i] = m + logf(l);
}

static void forward_share(void *p, int tid, int nt)
{
  const struct att16 *a = p;
  const geo16 *z = &a->z;
  size_t lo, hi;
  wf__split((size_t)z->B * z->NKV, tid, nt, 1, &lo, &hi);
  for (size_t bj = lo; bj < hi; bj++) {
    int b = (int)(bj / (size_t)z->NKV), j = (int)(bj % (size_t)z->NKV);
    for (int h = j * z->g; h < (j + 1) * z->g; h++)
      for (int i = 0; i < z->T; i++)
        forward_row(a, b, h, i);
  }
}

static bool shape_ok(int B, int T, int C, int NH, int NKV)
{
  return B > 0 && T > 0 && C > 0 && NH > 0 && NKV > 0 && C % NH == 0 && NH % NKV == 0;
}

void wf_attention_bf16_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, int B, int T, int C,
                               int NH, int NKV)
{
  if (!shape_ok(B, T, C, NH, NKV))
    return;
  struct att16 a = {.out = out, .lse = lse, .qkv = qkv, .z = geo_of(B, T, C, NH, NKV)};
  wf__parallel(wf__threads_for((size_t)B * NH * T * T * (C / NH) / 64), forward_share, &a);
}

/* ---- backward ----------------------------------------------------------------------- */

size_t wf_attention_bf16_scratch(int B, int T, int C, int NH, int NKV)
{
  if (!shape_ok(B, T, C, NH, NKV))
    return 0;
  geo16 z = geo_of(B, T, C, NH, NKV);
  return (size_t)B * NH * T + (size_t)B * T * z.ld;
}

/* fp32 accumulators of one (b, kv head j): dk (T,hs), dv (T,hs), then dq (g,T,hs) of
 * its query heads; they follow D (B,NH,T) in the scratch. */
typedef struct acc16 {
  float *dk, *dv, *dq;
} acc16;

static acc16 acc_of(const struct att16 *a, int b, int j)
{
  const geo16 *z = &a->z;
  size_t th = (size_t)z->T * z->hs;
  float *base =
      a->scratch + (size_t)z->B * z->NH * z->T + ((size_t)b * z->NKV + j) * (2 + z->g) * th;
  return (acc16){base, base + th, base + 2 * th};
}

/* Query row i of head h: D_i, then its terms of dq_i, dk_t, dv_t for keys t <= i. */
static void backward_row(const struct att16 *a, const acc16 *g, int b, int h, int i)
{
  const geo16 *z = &a->z;
  const int j = h / z->g, hs = z->hs;
  const size_t row = ((size_t)b * z->T + i) * z->C + (size_t)h * hs;
  const wf_bf16 *q = q_at(z, a->qkv, b, i, h), *dy = a->dout + row;
  const float L = a->clse[((size_t)b * z->NH + h) * z->T + i];
  const float D = dot16(dy, a->cout + row, hs);
  float *dq = g->dq + ((size_t)(h - j * z->g) * z->T + i) * hs;
  a->scratch[((size_t)b * z->NH + h) * z->T + i] = D;
  for (int t = 0; t <= i; t++) {
    const wf_bf16 *k = k_at(z, a->qkv, b, t, j), *v = v_at(z, a->qkv, b, t, j);
    float p = expf(dot16(q, k, hs) * z->scale - L);
    float ds = wf_bf16_round(p * (dot16(dy, v, hs) - D));
    float pb = wf_bf16_round(p);
    float *dk = g->dk + (size_t)t * hs, *dv = g->dv + (size_t)t * hs;
    for (int d = 0; d < hs; d++) {
      dv[d] += pb * wf_bf16_to_float(dy[d]);
      dq[d] += ds * wf_bf16_to_float(k[d]);
      dk[d] += ds * wf_bf16_to_float(q[d]);
    }
  }
}

/* acc (n) times f, rounded into dst (n, bf16). */
static void store_scaled(wf_bf16 *dst, const float *acc, int n, float f)
{
  for (int d = 0; d < n; d++)
    dst[d] = wf_bf16_from_float(acc[d] * f);
}

static void backward_pair(const struct att16 *a, int b, int j)
{
  const geo16 *z = &a->z;
  const int hs = z->hs;
  acc16 g = acc_of(a, b, j);
  memset(g.dk, 0, (size_t)(2 + z->g) * z->T * hs * sizeof(float));
  for (int h = j * z->g; h < (j + 1) * z->g; h++)
    for (int i = 0; i < z->T; i++)
      backward_row(a, &g, b, h, i);
  for (int t = 0; t < z->T; t++) {
    wf_bf16 *r = a->dqkv + ((size_t)b * z->T + t) * z->ld;
    for (int h = j * z->g; h < (j + 1) * z->g; h++)
      store_scaled(r + (size_t)h * hs, g.dq + ((size_t)(h - j * z->g) * z->T + t) * hs, hs,
                   z->scale);
    store_scaled(r + z->C + (size_t)j * hs, g.dk + (size_t)t * hs, hs, z->scale);
    store_scaled(r + z->C + (size_t)(z->NKV + j) * hs, g.dv + (size_t)t * hs, hs, 1.0f);
  }
}

static void backward_share(void *p, int tid, int nt)
{
  const struct att16 *a = p;
  size_t lo, hi;
  wf__split((size_t)a->z.B * a->z.NKV, tid, nt, 1, &lo, &hi);
  for (size_t bj = lo; bj < hi; bj++)
    backward_pair(a, (int)(bj / (size_t)a->z.NKV), (int)(bj % (size_t)a->z.NKV));
}

void wf_attention_bf16_backward(wf_bf16 *dqkv, float *scratch, const wf_bf16 *dout,
                                const wf_bf16 *qkv, const wf_bf16 *out, const float *lse, int B,
                                int T, int C, int NH, int NKV)
{
  if (!shape_ok(B, T, C, NH, NKV))
    return;
  struct att16 a = {.dqkv = dqkv,
                    .scratch = scratch,
                    .qkv = qkv,
                    .dout = dout,
                    .cout = out,
                    .clse = lse,
                    .z = geo_of(B, T, C, NH, NKV)};
  wf__parallel(wf__threads_for((size_t)B * NH * T * T * (C / NH) / 32), backward_share, &a);
}

/* ---- the op (wf_kreg.h): bf16 only ---------------------------------------------------- */

static void forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int NKV,
                    wf_stream *s)
{
  wf_attention_bf16_forward(out, lse, qkv, B, T, C, NH, NKV);
}

static void backward(void *dqkv, float *scratch, const void *dout, const void *qkv, const void *out,
                     const float *lse, int B, int T, int C, int NH, int NKV, wf_stream *s)
{
  wf_attention_bf16_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV);
}

static const wf_attention_lse_op bf16 = {forward, backward, wf_attention_bf16_scratch};
const wf_kvariants wf__cpu_attention_lse =
    WF_KV(attention_lse, WF_OP_VERSION_attention_lse, NULL, &bf16, NULL);
