/*
 * position.c - learned absolute positions added to the embedded tokens (position.h).
 *
 * Legend: B batch, T time, C channels. Forward adds a row of wpe to each output row.
 * Backward scatters into the rows the positions pick, so threads own disjoint column
 * ranges and every column sums the rows in (b, t) order: the result does not depend on
 * the thread count.
 */
#include "cpu_int.h"
#include "wf_kernels.h"

struct pe {
  float *out, *dwpe;
  const float *wpe, *dout;
  const int *pos;
  int T, C;
  size_t rows;
};

/* Row r's position. */
static size_t at(const struct pe *e, size_t r) { return e->pos ? (size_t)e->pos[r] : r % e->T; }

static void forward_share(void *p, int tid, int nt)
{
  const struct pe *e = p;
  size_t lo, hi, C = (size_t)e->C;
  wf__split(e->rows, tid, nt, 1, &lo, &hi);
  for (size_t r = lo; r < hi; r++)
    wf__add_row(e->out + r * C, e->wpe + at(e, r) * C, 0, C);
}

void wf_position_forward(float *out, const float *wpe, const int *pos, int B, int T, int C)
{
  struct pe e = {.out = out, .wpe = wpe, .pos = pos, .T = T, .C = C, .rows = (size_t)B * T};
  wf__parallel(wf__threads_for(e.rows * C), forward_share, &e);
}

static void backward_share(void *p, int tid, int nt)
{
  const struct pe *e = p;
  size_t lo, hi, C = (size_t)e->C;
  wf__split(C, tid, nt, 16, &lo, &hi);
  for (size_t r = 0; r < e->rows; r++)
    wf__add_row(e->dwpe + at(e, r) * C, e->dout + r * C, lo, hi);
}

void wf_position_backward(float *dwpe, const float *dout, const int *pos, int B, int T, int C)
{
  struct pe e = {.dwpe = dwpe, .dout = dout, .pos = pos, .T = T, .C = C, .rows = (size_t)B * T};
  wf__parallel(wf__threads_for(e.rows * C), backward_share, &e);
}

/* ---- the op (wf_kreg.h) ---------------------------------------------------------------- */

static void forward(float *out, const float *wpe, const int *pos, int B, int T, int C, wf_stream *s)
{
  wf_position_forward(out, wpe, pos, B, T, C);
}

static void backward(float *dwpe, const float *dout, const int *pos, int B, int T, int C,
                     wf_stream *s)
{
  wf_position_backward(dwpe, dout, pos, B, T, C);
}

static const wf_position_op op = {forward, backward};
const wf_kvariants wf__cpu_position = WF_KV_ANY(position, WF_OP_VERSION_position, &op);
