/*
 * encoder.c - token + position embedding, whole or split over the vocabulary.
 *
 * Legend: B batch, T time, C channels, V vocabulary rows of wte, Vl the rows one
 * rank holds (a vocabulary-parallel slice starting at row v_offset), maxT rows of wpe.
 * The whole-vocabulary functions are the split ones with v_offset = 0 and every
 * token in range, so there is one code path and they agree bit for bit.
 * Backward scatters into rows chosen by the tokens, so two tokens may hit the same
 * row: threads own disjoint column ranges instead of rows, and every column sums the
 * tokens in (b, t) order, so the result does not depend on the thread count.
 */
#include <limits.h>

#include "cpu_int.h"
#include "wf_kernels.h"

struct enc {
  float *out, *dwte, *dwpe;
  const float *wte, *wpe, *dout;
  const int *inp;
  int v_offset, Vl;
  int BT, T, C;
};

/* The local row of token `tok`, or -1 when another rank holds it. In 64 bits, so
 * that no token or offset can overflow the subtraction. */
static long long local_row(const struct enc *e, int tok)
{
  long long r = (long long)tok - e->v_offset;
  return r >= 0 && r < e->Vl ? r : -1;
}

/* o (C) = we + pe, where a NULL term is zero. Copies are exact, so a lone term is
 * passed through bit for bit, as the sum over ranks needs. */
static void embed_row(float *o, const float *we, const float *pe, int C)
{
  if (we && pe) {
#pragma omp simd
    for (int c = 0; c < C; c++)
      o[c] = we[c] + pe[c];
  } else if (we || pe) {
    memcpy(o, we ? we : pe, (size_t)C * sizeof *o);
  } else {
    memset(o, 0, (size_t)C * sizeof *o);
  }
}

static void forward_share(void *p, int tid, int nt)
{
  const struct enc *e = p;
  size_t lo, hi;
  wf__split((size_t)e->BT, tid, nt, 1, &lo, &hi);
  const size_t C = (size_t)e->C;
  for (size_t bt = lo; bt < hi; bt++) {
    long long r = local_row(e, e->inp[bt]);
    const float *we = r >= 0 ? e->wte + (size_t)r * C : NULL;
    const float *pe = e->wpe ? e->wpe + (bt % (size_t)e->T) * C : NULL;
    embed_row(e->out + bt * C, we, pe, e->C);
  }
}

void wf_encoder_forward_vp(float *out, const int *inp, const float *wte, int v_offset, int Vl,
                           const float *wpe, int B, int T, int C)
{
  struct enc e = {.out = out,
                  .wte = wte,
                  .wpe = wpe,
                  .inp = inp,
                  .v_offset = v_offset,
                  .Vl = Vl,
                  .BT = B * T,
                  .T = T,
                  .C = C};
  wf__parallel(wf__threads_for((size_t)B * T * C), forward_share, &e);
}

void wf_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                        int T, int C)
{
  wf_encoder_forward_vp(out, inp, wte, 0, INT_MAX, wpe, B, T, C);
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
    long long r = e->dwte ? local_row(e, e->inp[bt]) : -1;
    if (r >= 0)
      add_row(e->dwte + (size_t)r * C, d, lo, hi);
    if (e->dwpe)
      add_row(e->dwpe + (size_t)(bt % e->T) * C, d, lo, hi);
  }
}

void wf_encoder_backward_vp(float *dwte, float *dwpe, const float *dout, const int *inp,
                            int v_offset, int Vl, int B, int T, int C)
{
  struct enc e = {.dwte = dwte,
                  .dwpe = dwpe,
                  .dout = dout,
                  .inp = inp,
                  .v_offset = v_offset,
                  .Vl = Vl,
                  .BT = B * T,
                  .T = T,
                  .C = C};
  wf__parallel(wf__threads_for((size_t)B * T * C), backward_share, &e);
}

void wf_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                         int C)
{
  wf_encoder_backward_vp(dwte, dwpe, dout, inp, 0, INT_MAX, B, T, C);
}
