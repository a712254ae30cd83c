/*
 * embedding.c - rows of a table picked by an index (embedding.h), whole or split over
 * the table's rows.
 *
 * Legend: N rows of the output (B*T), C channels, Vl the rows this rank holds (a slice
 * starting at row v_offset). Forward copies rows (exact), so a lone nonzero term passes
 * through bit for bit, as the sum over a row split needs. Backward scatters into rows
 * chosen by the indices, so two rows may hit the same table row: threads own disjoint
 * column ranges instead of rows, and every column sums the rows in order, so the result
 * does not depend on the thread count.
 */
#include "cpu_int.h"
#include "wf_kernels.h"

struct emb {
  float *out, *dtable;
  const float *table, *dout;
  const int *idx;
  int v_offset, Vl, N, C;
};

/* The local row of index `i`, or -1 when another rank holds it. In 64 bits, so that no
 * index or offset can overflow the subtraction. */
static long long local_row(const struct emb *e, int i)
{
  long long r = (long long)i - e->v_offset;
  return r >= 0 && r < e->Vl ? r : -1;
}

static void forward_share(void *p, int tid, int nt)
{
  const struct emb *e = p;
  size_t lo, hi, C = (size_t)e->C;
  wf__split((size_t)e->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++) {
    long long r = local_row(e, e->idx[n]);
    if (r >= 0)
      memcpy(e->out + n * C, e->table + (size_t)r * C, C * sizeof(float));
    else
      memset(e->out + n * C, 0, C * sizeof(float));
  }
}

void wf_embedding_forward(float *out, const int *idx, const float *table, int v_offset, int Vl,
                          int N, int C)
{
  struct emb e = {
      .out = out, .table = table, .idx = idx, .v_offset = v_offset, .Vl = Vl, .N = N, .C = C};
  wf__parallel(wf__threads_for((size_t)N * C), forward_share, &e);
}

static void backward_share(void *p, int tid, int nt)
{
  const struct emb *e = p;
  size_t lo, hi, C = (size_t)e->C;
  wf__split(C, tid, nt, 16, &lo, &hi);
  for (int n = 0; n < e->N; n++) {
    long long r = local_row(e, e->idx[n]);
    if (r >= 0)
      wf__add_row(e->dtable + (size_t)r * C, e->dout + (size_t)n * C, lo, hi);
  }
}

void wf_embedding_backward(float *dtable, const float *dout, const int *idx, int v_offset, int Vl,
                           int N, int C)
{
  struct emb e = {
      .dtable = dtable, .dout = dout, .idx = idx, .v_offset = v_offset, .Vl = Vl, .N = N, .C = C};
  wf__parallel(wf__threads_for((size_t)N * C), backward_share, &e);
}

/* ---- the op (wf_kreg.h) ---------------------------------------------------------------- */

static void forward(float *out, const int *idx, const float *table, int v_offset, int Vl, int N,
                    int C, wf_stream *s)
{
  wf_embedding_forward(out, idx, table, v_offset, Vl, N, C);
}

static void backward(float *dtable, const float *dout, const int *idx, int v_offset, int Vl, int N,
                     int C, wf_stream *s)
{
  wf_embedding_backward(dtable, dout, idx, v_offset, Vl, N, C);
}

static const wf_embedding_op op = {forward, backward};
const wf_kvariants wf__cpu_embedding = WF_KV_ANY(embedding, WF_OP_VERSION_embedding, &op);
