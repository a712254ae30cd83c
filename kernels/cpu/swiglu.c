/*
 * swiglu.c - the SwiGLU gate of Llama's MLP: out = silu(gate) * up from a packed
 * (N, 2F) input whose rows are [gate | up] (swiglu.h).
 *
 * Legend: N rows (B*T), F the MLP's width (local under tensor parallelism).
 * silu(x) = x / (1 + exp(-x)), as torch computes it; exp is wf__expf (vectorisable,
 * ~1 ulp). Rows are independent and split over threads.
 */
#include "cpu_int.h"
#include "wf_kernels.h"

struct glu {
  float *out;
  const float *inp, *dout;
  int N, F;
};

WF__CLONES static void swiglu_forward_row(float *o, const float *gate, const float *up, int F)
{
#pragma omp simd
  for (int i = 0; i < F; i++) {
    float g = gate[i];
    o[i] = g / (1.0f + wf__expf(-g)) * up[i];
  }
}

/* d silu / dx = s (1 + x (1 - s)), s = sigmoid(x) */
WF__CLONES static void swiglu_backward_row(float *dgate, float *dup, const float *gate,
                                           const float *up, const float *dy, int F)
{
#pragma omp simd
  for (int i = 0; i < F; i++) {
    float g = gate[i], s = 1.0f / (1.0f + wf__expf(-g));
    dgate[i] = dy[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
    dup[i] = dy[i] * (g * s);
  }
}

static void forward_share(void *p, int tid, int nt)
{
  const struct glu *e = p;
  const size_t F = (size_t)e->F;
  size_t lo, hi;
  wf__split((size_t)e->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++)
    swiglu_forward_row(e->out + n * F, e->inp + n * 2 * F, e->inp + n * 2 * F + F, e->F);
}

void wf_swiglu_forward(float *out, const float *inp, int N, int F)
{
  struct glu e = {.out = out, .inp = inp, .N = N, .F = F};
  wf__parallel(wf__threads_for((size_t)N * F), forward_share, &e);
}

static void backward_share(void *p, int tid, int nt)
{
  const struct glu *e = p;
  const size_t F = (size_t)e->F;
  size_t lo, hi;
  wf__split((size_t)e->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++) {
    float *d = e->out + n * 2 * F;
    const float *x = e->inp + n * 2 * F;
    swiglu_backward_row(d, d + F, x, x + F, e->dout + n * F, e->F);
  }
}

void wf_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F)
{
  struct glu e = {.out = dinp, .inp = inp, .dout = dout, .N = N, .F = F};
  wf__parallel(wf__threads_for((size_t)N * F), backward_share, &e);
}

/* ---- 16-bit storage: row blocks through this thread's working memory (cpu_int.h) --------- */

void wf_swiglu_forward16(void *out, const void *inp, int N, int F, int fmt)
{
  size_t blk = wf__block_rows(2 * (size_t)F);
  for (size_t r0 = 0; r0 < (size_t)N; r0 += blk) {
    size_t n = WF_MIN(blk, (size_t)N - r0);
    float *x = wf__widened(WF__W_IN, inp, r0, n, 2 * (size_t)F, fmt),
          *y = wf__work(WF__W_OUT, n * F);
    if (!x || !y)
      return;
    wf_swiglu_forward(y, x, (int)n, F);
    wf__store(out, r0 * F, y, n * F, fmt);
  }
}

void wf_swiglu_backward16(void *dinp, const void *inp, const void *dout, int N, int F, int fmt)
{
  size_t blk = wf__block_rows(2 * (size_t)F);
  for (size_t r0 = 0; r0 < (size_t)N; r0 += blk) {
    size_t n = WF_MIN(blk, (size_t)N - r0);
    float *x = wf__widened(WF__W_IN, inp, r0, n, 2 * (size_t)F, fmt),
          *d = wf__work(WF__W_OUT, n * 2 * F);
    float *dy = wf__widened(WF__W_DY, dout, r0, n, (size_t)F, fmt);
    if (!x || !d || !dy)
      return;
    wf_swiglu_backward(d, x, dy, (int)n, F);
    wf__store(dinp, r0 * 2 * F, d, n * 2 * F, fmt);
  }
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound ----------------- */

#define SWIGLU_VARIANT(name, fmt)                                                                  \
  static void name##_forward(void *out, const void *inp, int N, int F, wf_stream *s)               \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_swiglu_forward(out, inp, N, F);                                                           \
    else                                                                                           \
      wf_swiglu_forward16(out, inp, N, F, fmt);                                                    \
  }                                                                                                \
  static void name##_backward(void *dinp, const void *inp, const void *dout, int N, int F,         \
                              wf_stream *s)                                                        \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_swiglu_backward(dinp, inp, dout, N, F);                                                   \
    else                                                                                           \
      wf_swiglu_backward16(dinp, inp, dout, N, F, fmt);                                            \
  }                                                                                                \
  static const wf_swiglu_op name = {name##_forward, name##_backward}

SWIGLU_VARIANT(f32, WF_DT_F32);
SWIGLU_VARIANT(bf16, WF_DT_BF16);
SWIGLU_VARIANT(f16, WF_DT_F16);
const wf_kvariants wf__cpu_swiglu = WF_KV(swiglu, WF_OP_VERSION_swiglu, &f32, &bf16, &f16);
