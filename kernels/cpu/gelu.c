/*
 * gelu.c - GELU, tanh approximation:
 *   gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2/pi).
 *
 * Elementwise over N values, split over threads in chunks of whole cache lines.
 * tanh comes from wf__tanhf (vectorisable; glibc's tanhf costs ~35 ns per call here
 * and was the single largest non-GEMM cost of a gpt2-small step).
 */
#include "cpu_int.h"
#include "wf_kernels.h"

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

WF__CLONES static void forward_range(float *out, const float *inp, size_t lo, size_t hi)
{
#pragma omp simd
  for (size_t i = lo; i < hi; i++) {
    float x = inp[i];
    float t = wf__tanhf(GELU_K * (x + GELU_A * x * x * x));
    out[i] = 0.5f * x * (1.0f + t);
  }
}

struct ew {
  float *out;
  const float *a, *b;
  size_t n;
};

static void forward_share(void *p, int tid, int nt)
{
  const struct ew *e = p;
  size_t lo, hi;
  wf__split(e->n, tid, nt, 16, &lo, &hi);
  forward_range(e->out, e->a, lo, hi);
}

void wf_gelu_forward(float *out, const float *inp, size_t N)
{
  struct ew e = {out, inp, NULL, N};
  wf__parallel(wf__threads_for(N), forward_share, &e);
}

/* d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2) */
WF__CLONES static void backward_range(float *dinp, const float *inp, const float *dout, size_t lo,
                                      size_t hi)
{
#pragma omp simd
  for (size_t i = lo; i < hi; i++) {
    float x = inp[i];
    float t = wf__tanhf(GELU_K * (x + GELU_A * x * x * x));
    float g =
        0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    dinp[i] = g * dout[i];
  }
}

static void backward_share(void *p, int tid, int nt)
{
  const struct ew *e = p;
  size_t lo, hi;
  wf__split(e->n, tid, nt, 16, &lo, &hi);
  backward_range(e->out, e->a, e->b, lo, hi);
}

void wf_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
  struct ew e = {dinp, inp, dout, N};
  wf__parallel(wf__threads_for(N), backward_share, &e);
}

/* ---- 16-bit storage: blocks of a task's range through the stack ------------------------- */

#define BLOCK 256

struct ew16 {
  void *out; /* the output, forward's or backward's dinp, in fmt */
  const void *inp;
  const void *dout; /* backward: in fmt */
  size_t n;
  int fmt;
};

static void forward16_share(void *p, int tid, int nt)
{
  const struct ew16 *e = p;
  size_t lo, hi;
  float x[BLOCK], y[BLOCK];
  wf__split(e->n, tid, nt, 32, &lo, &hi);
  for (size_t i = lo; i < hi; i += BLOCK) {
    size_t n = hi - i < BLOCK ? hi - i : BLOCK;
    wf__load(x, e->inp, i, n, e->fmt);
    forward_range(y, x, 0, n);
    wf__store(e->out, i, y, n, e->fmt);
  }
}

void wf_gelu_forward16(void *out, const void *inp, size_t N, int fmt)
{
  struct ew16 e = {.out = out, .inp = inp, .n = N, .fmt = fmt};
  wf__parallel(wf__threads_for(N), forward16_share, &e);
}

static void backward16_share(void *p, int tid, int nt)
{
  const struct ew16 *e = p;
  size_t lo, hi;
  float x[BLOCK], dy[BLOCK], d[BLOCK];
  wf__split(e->n, tid, nt, 32, &lo, &hi);
  for (size_t i = lo; i < hi; i += BLOCK) {
    size_t n = hi - i < BLOCK ? hi - i : BLOCK;
    wf__load(x, e->inp, i, n, e->fmt);
    wf__load(dy, e->dout, i, n, e->fmt);
    backward_range(d, x, dy, 0, n);
    wf__store(e->out, i, d, n, e->fmt);
  }
}

void wf_gelu_backward16(void *dinp, const void *inp, const void *dout, size_t N, int fmt)
{
  struct ew16 e = {.out = dinp, .inp = inp, .dout = dout, .n = N, .fmt = fmt};
  wf__parallel(wf__threads_for(N), backward16_share, &e);
}

void wf__gelu_forward_as(void *out, const void *inp, size_t N, int fmt)
{
  if (fmt == WF_DT_F32)
    wf_gelu_forward(out, inp, N);
  else
    wf_gelu_forward16(out, inp, N, fmt);
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound ----------------- */

#define GELU_VARIANT(name, fmt)                                                                    \
  static void name##_forward(void *out, const void *inp, size_t N, wf_stream *s)                   \
  {                                                                                                \
    wf__gelu_forward_as(out, inp, N, fmt);                                                         \
  }                                                                                                \
  static void name##_backward(void *dinp, const void *inp, const void *dout, size_t N,             \
                              wf_stream *s)                                                        \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_gelu_backward(dinp, inp, dout, N);                                                        \
    else                                                                                           \
      wf_gelu_backward16(dinp, inp, dout, N, fmt);                                                 \
  }                                                                                                \
  static const wf_gelu_op name = {name##_forward, name##_backward}

GELU_VARIANT(f32, WF_DT_F32);
GELU_VARIANT(bf16, WF_DT_BF16);
GELU_VARIANT(f16, WF_DT_F16);
const wf_kvariants wf__cpu_gelu = WF_KV(gelu, WF_OP_VERSION_gelu, &f32, &bf16, &f16);
