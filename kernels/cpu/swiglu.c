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
