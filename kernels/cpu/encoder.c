/*
 * encoder.c - token + position embedding.
 *
 * Legend: B batch, T time, C channels, V vocabulary rows of wte, maxT rows of wpe.
 * Backward scatters into rows chosen by the tokens, so two tokens may hit the same
 * row: threads own disjoint column ranges instead of rows, and every column sums the
 * tokens in (b, t) order, so the result does not depend on the thread count.
 */
#include <omp.h>

#include "cpu_int.h"
#include "wf_kernels.h"

void wf_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                        int T, int C)
{
  int nt = wf__threads_for((size_t)B * T * C);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    float *o = out + (size_t)bt * C;
    const float *we = wte + (size_t)inp[bt] * C;
    const float *pe = wpe + (size_t)(bt % T) * C;
#pragma omp simd
    for (int c = 0; c < C; c++)
      o[c] = we[c] + pe[c];
  }
}

void wf_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                         int C)
{
  int nt = wf__threads_for((size_t)B * T * C);
#pragma omp parallel num_threads(nt)
  {
    size_t lo, hi;
    wf__split((size_t)C, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
    for (int bt = 0; bt < B * T; bt++) {
      const float *d = dout + (size_t)bt * C;
      float *we = dwte ? dwte + (size_t)inp[bt] * C : NULL;
      float *pe = dwpe ? dwpe + (size_t)(bt % T) * C : NULL;
      if (we) {
#pragma omp simd
        for (size_t c = lo; c < hi; c++)
          we[c] += d[c];
      }
      if (pe) {
#pragma omp simd
        for (size_t c = lo; c < hi; c++)
          pe[c] += d[c];
      }
    }
  }
}
