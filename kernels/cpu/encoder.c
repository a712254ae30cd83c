/*
 * encoder.c - token + position embedding.
 *
 * Legend: B batch, T time, C channels, V vocabulary rows of wte, maxT rows of wpe.
 * Backward scatters into rows chosen by the tokens, so two tokens may hit the same
 * row: threads own disjoint column ranges instead of rows, and every column sums the
 * tokens in (b, t) order, so the result does not depend on the thread count.
 */
#include "cpu_int.h"
#include "wf_kernels.h"

struct enc {
  float *out, *dwte, *dwpe;
  const float *wte, *wpe, *dout;
  const int *inp;
  int BT, T, C;
};

static void forward_share(void *p, int tid, int nt)
{
  const struct enc *e = p;
  size_t lo, hi;
  wf__split((size_t)e->BT, tid, nt, 1, &lo, &hi);
  const int C = e->C;
  for (size_t bt = lo; bt < hi; bt++) {
    float *o = e->out + bt * C;
    const float *we = e->wte + (size_t)e->inp[bt] * C;
    const float *pe = e->wpe + (bt % (size_t)e->T) * C;
#pragma omp simd
    for (int c = 0; c < C; c++)
      o[c] = we[c] + pe[c];
  }
}

void wf_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                        int T, int C)
{
  struct enc e = {.out = out, .wte = wte, .wpe = wpe, .inp = inp, .BT = B * T, .T = T, .C = C};
  wf__parallel(wf__threads_for((size_t)B * T * C), forward_share, &e);
}

static void add_row(float *dst, const float *src, size_t lo, size_t hi)
{
#pragma omp simd
  for (size_t c = lo; c < hi; c++)
    dst[c] += src[c];
}

static void backward_share(void *p, int tid, int nt)
{
  const struct enc *e = p;
  size_t lo, hi;
  wf__split((size_t)e->C, tid, nt, 16, &lo, &hi);
  const size_t C = (size_t)e->C;
  for (int bt = 0; bt < e->BT; bt++) {
    const float *d = e->dout + (size_t)bt * C;
    if (e->dwte)
      add_row(e->dwte + (size_t)e->inp[bt] * C, d, lo, hi);
    if (e->dwpe)
      add_row(e->dwpe + (size_t)(bt % e->T) * C, d, lo, hi);
  }
}

void wf_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                         int C)
{
  struct enc e = {
      .dwte = dwte, .dwpe = dwpe, .dout = dout, .inp = inp, .BT = B * T, .T = T, .C = C};
  wf__parallel(wf__threads_for((size_t)B * T * C), backward_share, &e);
}
