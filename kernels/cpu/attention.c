/*
 * attention.c - causal multi-head and grouped-query self-attention.
 *
 * Legend: B batch, T time, C channels of q and out, NH query heads, NKV key/value
 * heads (NKV divides NH; multi-head attention is NKV == NH), hs = C / NH head size,
 * G = NH / NKV query heads per kv head, ld = C + 2 NKV hs the row of qkv.
 * qkv (B,T,ld) holds the q heads, then the k heads, then the v heads; query head h
 * owns columns [h*hs, (h+1)*hs) of q and reads kv head h / G, so a head's Q, K and V
 * are strided (ld) matrices used in place by sgemm. Multi-head attention is the case
 * NKV == NH (ld = 3C): wf_attention_* call the grouped kernels with it, and those then
 * make the same sgemm calls on the same pointers as the multi-head code always did,
 * so its results are unchanged bit for bit.
 *
 * Forward work is split over the B*NH (batch, query head) pairs; backward over the
 * B*NKV (batch, kv head) groups, whose G query heads run one after another in head
 * order because they all add into the group's dK and dV (no two threads write one
 * row, and the order of the additions is fixed). dqkv is written (attention.h): each
 * thread zeroes its groups' columns first, where the caller used to zero the whole. Each runs
 * single-threaded OpenBLAS calls. Causality is exploited by row blocks of BLK queries: block [i0,
 * i1) only needs keys [0, i1), so the GEMMs do about half of the full T x T work at long T. Entries
 * above the diagonal of att are written as 0, so att is a full (T,T) softmax matrix per head, as
 * the CUDA twin and the backward expect.
 *
 * Documents (attention.h's starts): row i of a sequence attends to keys [starts[i], i], so a
 * row block [i0, i1) needs keys [min starts, i1) only: its GEMMs start at that key (the
 * first row's start, starts rising along a sequence), and the probabilities outside each
 * row's range are written as 0 as above the diagonal. Without starts that key is 0 and
 * the calls are the plain causal ones, the same floats in the same order.
 *
 * The 16-bit forms (storage.h) load one (batch, query head) pair's q, k, v into this thread's
 * working memory as a (T, 3 hs) matrix, run the same head functions on it with hs as
 * the width (so every GEMM has the fp32 kernel's shape), and store out and the
 * probabilities rounded; backward, split over kv-head groups like the fp32 one, computes
 * each query head's dq, dk, dv in working memory, stores dq rounded and adds dk and dv
 * into the group's fp32 sums in head order, which it stores rounded after the group.
 */
#include <math.h>

#include "cpu_int.h"
#include "wf_kernels.h"

#define BLK 128

/* The first key row i of a sequence attends to: its document's start (st, the sequence's
 * starts), or 0. */
static int first_key(const int *st, int i) { return st ? st[i] : 0; }

/* The first key any row of [i0, i1) attends to. */
static int block_key(const int *st, int i0, int i1)
{
  int k0 = i0;
  for (int i = i0; i < i1; i++)
    k0 = WF_MIN(k0, first_key(st, i));
  return k0;
}

/* att rows [i0, i1) of one head: scaled scores in (keys [first_key, i]), softmax over
 * them out, 0 at every other key. */
WF__CLONES static void softmax_rows(float *A, const int *st, int T, int i0, int i1)
{
  for (int i = i0; i < i1; i++) {
    float *a = A + (size_t)i * T;
    int lo = first_key(st, i);
    float mx = wf__maxf(a + lo, i + 1 - lo);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = lo; j <= i; j++) {
      a[j] = wf__expf(a[j] - mx);
      s += a[j];
    }
    float inv = 1.0f / s;
#pragma omp simd
    for (int j = lo; j <= i; j++)
      a[j] *= inv;
    memset(a, 0, (size_t)lo * sizeof(float));
    memset(a + i + 1, 0, (size_t)(T - i - 1) * sizeof(float));
  }
}

/* One head; st (T): its sequence's document starts, or NULL. */
static void head_forward(float *out, float *A, const float *q, const float *k, const float *v,
                         const int *st, int T, int C, int ld, int hs)
{
  const float scale = 1.0f / sqrtf((float)hs);
  for (int i0 = 0; i0 < T; i0 += BLK) {
    int i1 = i0 + BLK < T ? i0 + BLK : T, m = i1 - i0, k0 = block_key(st, i0, i1);
    float *Ab = A + (size_t)i0 * T;
    /* scores (m, i1 - k0) = Q[i0:i1] . K[k0:i1]^T * scale */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1 - k0, hs, scale, q + (size_t)i0 * ld,
                ld, k + (size_t)k0 * ld, ld, 0.0f, Ab + k0, T);
    softmax_rows(A, st, T, i0, i1);
    /* out[i0:i1] (m, hs) = att[i0:i1, k0:i1] . V[k0:i1] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, i1 - k0, 1.0f, Ab + k0, T,
                v + (size_t)k0 * ld, ld, 0.0f, out + (size_t)i0 * C, C);
  }
}

struct att {
  float *out, *att, *dqkv, *scratch;
  const float *qkv, *catt, *dout;
  const int *starts; /* (B, T) or NULL */
  int B, T, C, NH, NKV;
};

/* Batch b's document starts, or NULL. */
static const int *starts_of(const int *starts, size_t b, int T)
{
  return starts ? starts + b * (size_t)T : NULL;
}

/* Offsets in a row of qkv of query head h's q, k and v columns. */
struct cols {
  size_t q, k, v;
};

static struct cols cols_of(const struct att *a, size_t h)
{
  size_t hs = (size_t)(a->C / a->NH), kvh = h / (size_t)(a->NH / a->NKV);
  struct cols c = {h * hs, (size_t)a->C + kvh * hs, (size_t)a->C + ((size_t)a->NKV + kvh) * hs};
  return c;
}

static int row_of(const struct att *a) { return a->C + 2 * a->NKV * (a->C / a->NH); }

static void forward_share(void *p, int tid, int nt)
{
  const struct att *a = p;
  const int T = a->T, C = a->C, NH = a->NH, hs = C / NH, ld = row_of(a);
  size_t lo, hi;
  wf__split((size_t)a->B * NH, tid, nt, 1, &lo, &hi);
  for (size_t bh = lo; bh < hi; bh++) {
    size_t b = bh / NH, h = bh % NH;
    const float *base = a->qkv + b * T * ld;
    struct cols c = cols_of(a, h);
    head_forward(a->out + b * T * C + h * hs, a->att + bh * T * T, base + c.q, base + c.k,
                 base + c.v, starts_of(a->starts, b, T), T, C, ld, hs);
  }
}

void wf_attention_gqa_forward(float *out, float *att, const float *qkv, const int *starts, int B,
                              int T, int C, int NH, int NKV)
{
  struct att a = {.out = out,
                  .att = att,
                  .qkv = qkv,
                  .starts = starts,
                  .B = B,
                  .T = T,
                  .C = C,
                  .NH = NH,
                  .NKV = NKV};
  wf__parallel(wf__threads_for((size_t)B * NH * T * T * (C / NH) / 64), forward_share, &a);
}

void wf_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
  wf_attention_gqa_forward(out, att, qkv, NULL, B, T, C, NH, NH);
}

/* Rows [i0, i1) of one head, whose GEMMs computed keys [k0, i1): dS = att * (dA -
 * rowsum(att * dA)) over each row's keys, in place in D, 0 at the masked keys. */
WF__CLONES static void softmax_backward_rows(float *D, const float *A, const int *st, int T, int i0,
                                             int i1, int k0)
{
  for (int i = i0; i < i1; i++) {
    float *d = D + (size_t)i * T;
    const float *a = A + (size_t)i * T;
    int lo = first_key(st, i);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = lo; j <= i; j++)
      s += a[j] * d[j];
#pragma omp simd
    for (int j = lo; j <= i; j++)
      d[j] = a[j] * (d[j] - s);
    /* keys the block GEMM computed but the row does not see: before its document, and
     * i < j < i1 */
    for (int j = k0; j < lo; j++)
      d[j] = 0.0f;
    for (int j = i + 1; j < i1; j++)
      d[j] = 0.0f;
  }
}

struct head_grad {
  float *dq, *dk, *dv;
  const float *q, *k, *v, *dout;
};

static void head_backward(const struct head_grad *g, float *D, const float *A, const int *st, int T,
                          int C, int ld, int hs)
{
  const float scale = 1.0f / sqrtf((float)hs);
  for (int i0 = 0; i0 < T; i0 += BLK) {
    int i1 = i0 + BLK < T ? i0 + BLK : T, m = i1 - i0, k0 = block_key(st, i0, i1), n = i1 - k0;
    const float *Ab = A + (size_t)i0 * T + k0, *dO = g->dout + (size_t)i0 * C;
    float *Db = D + (size_t)i0 * T + k0;
    size_t kr = (size_t)k0 * ld; /* key row k0 */
    /* dV[k0:i1] += att[i0:i1, k0:i1]^T . dout[i0:i1] */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, m, 1.0f, Ab, T, dO, C, 1.0f,
                g->dv + kr, ld);
    /* datt[i0:i1, k0:i1] = dout[i0:i1] . V[k0:i1]^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, hs, 1.0f, dO, C, g->v + kr, ld, 0.0f,
                Db, T);
    softmax_backward_rows(D, A, st, T, i0, i1, k0);
    /* dQ[i0:i1] += scale dS . K[k0:i1];  dK[k0:i1] += scale dS^T . Q[i0:i1] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, n, scale, Db, T, g->k + kr, ld,
                1.0f, g->dq + (size_t)i0 * ld, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, m, scale, Db, T,
                g->q + (size_t)i0 * ld, ld, 1.0f, g->dk + kr, ld);
  }
}

/* Query head h of batch b, whose kv head is in the caller's group. */
static void query_head_backward(const struct att *a, size_t b, size_t h)
{
  const int T = a->T, C = a->C, hs = C / a->NH, ld = row_of(a);
  const size_t row0 = b * T * ld, bh = b * a->NH + h;
  struct cols c = cols_of(a, h);
  struct head_grad g = {
      .dq = a->dqkv + row0 + c.q,
      .dk = a->dqkv + row0 + c.k,
      .dv = a->dqkv + row0 + c.v,
      .q = a->qkv + row0 + c.q,
      .k = a->qkv + row0 + c.k,
      .v = a->qkv + row0 + c.v,
      .dout = a->dout + b * T * C + h * hs,
  };
  head_backward(&g, a->scratch + bh * T * T, a->catt + bh * T * T, starts_of(a->starts, b, T), T, C,
                ld, hs);
}

/* Zero the columns of dqkv (B, T, ld) that group kvh of batch b writes: its G query
 * heads' q columns, its k and its v head. */
static void zero_group(float *dqkv, size_t b, size_t kvh, int T, int C, int NH, int NKV)
{
  size_t hs = (size_t)(C / NH), G = (size_t)(NH / NKV), ld = (size_t)C + 2 * NKV * hs;
  size_t col[3] = {kvh * G * hs, C + kvh * hs, C + (NKV + kvh) * hs}, w[3] = {G * hs, hs, hs};
  for (size_t t = 0; t < (size_t)T; t++)
    for (int part = 0; part < 3; part++)
      memset(dqkv + (b * T + t) * ld + col[part], 0, w[part] * sizeof *dqkv);
}

static void backward_share(void *p, int tid, int nt)
{
  const struct att *a = p;
  const size_t G = (size_t)(a->NH / a->NKV);
  size_t lo, hi;
  wf__split((size_t)a->B * a->NKV, tid, nt, 1, &lo, &hi);
  for (size_t bk = lo; bk < hi; bk++) {
    size_t b = bk / a->NKV, kvh = bk % a->NKV;
    zero_group(a->dqkv, b, kvh, a->T, a->C, a->NH, a->NKV);
    for (size_t h = kvh * G; h < (kvh + 1) * G; h++)
      query_head_backward(a, b, h);
  }
}

void wf_attention_gqa_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, const int *starts, int B, int T, int C, int NH,
                               int NKV)
{
  struct att a = {.dqkv = dqkv,
                  .scratch = scratch,
                  .qkv = qkv,
                  .catt = att,
                  .dout = dout,
                  .starts = starts,
                  .B = B,
                  .T = T,
                  .C = C,
                  .NH = NH,
                  .NKV = NKV};
  wf__parallel(wf__threads_for((size_t)B * NH * T * T * (C / NH) / 32), backward_share, &a);
}

/* ---- 16-bit storage ------------------------------------------------------------------------ */

struct att16 {
  void *out, *att, *dqkv;
  const void *qkv, *catt, *dout;
  const int *starts; /* (B, T) or NULL */
  int B, T, C, NH, NKV, fmt;
};

/* Query head h of batch b's q, k, v rows -> w (T, 3 hs): q at column 0, k at hs, v at
 * 2 hs (k and v those of its kv head). */
static void load_head(float *w, const struct att16 *a, size_t b, size_t h)
{
  size_t T = (size_t)a->T, C = (size_t)a->C, hs = C / (size_t)a->NH, NKV = (size_t)a->NKV;
  size_t ld = C + 2 * NKV * hs, kvh = h / ((size_t)a->NH / NKV);
  size_t col[3] = {h * hs, C + kvh * hs, C + (NKV + kvh) * hs};
  for (size_t t = 0; t < T; t++)
    for (size_t part = 0; part < 3; part++)
      wf__load(w + t * 3 * hs + part * hs, a->qkv, (b * T + t) * ld + col[part], hs, a->fmt);
}

static void forward16_share(void *p, int tid, int nt)
{
  const struct att16 *a = p;
  size_t T = (size_t)a->T, C = (size_t)a->C, hs = C / (size_t)a->NH, lo, hi;
  float *w = wf__work(0, T * 3 * hs), *A = wf__work(1, T * T), *o = wf__work(2, T * hs);
  if (!w || !A || !o)
    return;
  wf__split((size_t)a->B * a->NH, tid, nt, 1, &lo, &hi);
  for (size_t bh = lo; bh < hi; bh++) {
    size_t b = bh / a->NH, h = bh % a->NH;
    load_head(w, a, b, h);
    head_forward(o, A, w, w + hs, w + 2 * hs, starts_of(a->starts, b, (int)T), (int)T, (int)hs,
                 (int)(3 * hs), (int)hs);
    for (size_t t = 0; t < T; t++)
      wf__store(a->out, (b * T + t) * C + h * hs, o + t * hs, hs, a->fmt);
    wf__store(a->att, bh * T * T, A, T * T, a->fmt);
  }
}

void wf_attention_gqa_forward16(void *out, void *att, const void *qkv, const int *starts, int B,
                                int T, int C, int NH, int NKV, int fmt)
{
  struct att16 a = {.out = out,
                    .att = att,
                    .qkv = qkv,
                    .starts = starts,
                    .B = B,
                    .T = T,
                    .C = C,
                    .NH = NH,
                    .NKV = NKV,
                    .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)B * NH * T * T * (C / NH) / 64), forward16_share, &a);
}

void wf_attention_forward16(void *out, void *att, const void *qkv, int B, int T, int C, int NH,
                            int fmt)
{
  wf_attention_gqa_forward16(out, att, qkv, NULL, B, T, C, NH, NH, fmt);
}

/* Query head h of batch b: its gradients in working memory; dq stored rounded into dqkv,
 * dk and dv added into the group's sums dkv (T, 2 hs). */
static void head_backward16(const struct att16 *a, size_t b, size_t h, float *w[6])
{
  size_t T = (size_t)a->T, C = (size_t)a->C, hs = C / (size_t)a->NH, NKV = (size_t)a->NKV;
  size_t ld = C + 2 * NKV * hs, bh = b * (size_t)a->NH + h;
  float *x = w[0], *A = w[1], *D = w[2], *dw = w[3], *dO = w[4], *dkv = w[5];
  load_head(x, a, b, h);
  wf__load(A, a->catt, bh * T * T, T * T, a->fmt);
  for (size_t t = 0; t < T; t++)
    wf__load(dO + t * hs, a->dout, (b * T + t) * C + h * hs, hs, a->fmt);
  memset(dw, 0, T * 3 * hs * sizeof(float));
  struct head_grad g = {dw, dw + hs, dw + 2 * hs, x, x + hs, x + 2 * hs, dO};
  head_backward(&g, D, A, starts_of(a->starts, b, (int)T), (int)T, (int)hs, (int)(3 * hs), (int)hs);
  for (size_t t = 0; t < T; t++) {
    wf__store(a->dqkv, (b * T + t) * ld + h * hs, dw + t * 3 * hs, hs, a->fmt);
    float *dst = dkv + t * 2 * hs;
    const float *src = dw + t * 3 * hs + hs;
    for (size_t j = 0; j < 2 * hs; j++)
      dst[j] += src[j];
  }
}

/* Group kvh of batch b: its query heads in head order, then its dk and dv stored. */
static void group_backward16(const struct att16 *a, size_t b, size_t kvh, float *w[6])
{
  size_t T = (size_t)a->T, C = (size_t)a->C, hs = C / (size_t)a->NH, NKV = (size_t)a->NKV;
  size_t G = (size_t)(a->NH / a->NKV), ld = C + 2 * NKV * hs;
  memset(w[5], 0, T * 2 * hs * sizeof(float));
  for (size_t h = kvh * G; h < (kvh + 1) * G; h++)
    head_backward16(a, b, h, w);
  for (size_t t = 0; t < T; t++) {
    size_t row = (b * T + t) * ld;
    wf__store(a->dqkv, row + C + kvh * hs, w[5] + t * 2 * hs, hs, a->fmt);
    wf__store(a->dqkv, row + C + (NKV + kvh) * hs, w[5] + t * 2 * hs + hs, hs, a->fmt);
  }
}

static void backward16_share(void *p, int tid, int nt)
{
  const struct att16 *a = p;
  size_t T = (size_t)a->T, hs = (size_t)(a->C / a->NH), lo, hi;
  float *w[6] = {wf__work(0, T * 3 * hs), wf__work(1, T * T),  wf__work(2, T * T),
                 wf__work(3, T * 3 * hs), wf__work(4, T * hs), wf__work(5, T * 2 * hs)};
  if (!w[0] || !w[1] || !w[2] || !w[3] || !w[4] || !w[5])
    return;
  wf__split((size_t)a->B * a->NKV, tid, nt, 1, &lo, &hi);
  for (size_t bk = lo; bk < hi; bk++)
    group_backward16(a, bk / a->NKV, bk % a->NKV, w);
}

void wf_attention_gqa_backward16(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                 const void *att, const int *starts, int B, int T, int C, int NH,
                                 int NKV, int fmt)
{
  (void)scratch;
  struct att16 a = {.dqkv = dqkv,
                    .qkv = qkv,
                    .catt = att,
                    .dout = dout,
                    .starts = starts,
                    .B = B,
                    .T = T,
                    .C = C,
                    .NH = NH,
                    .NKV = NKV,
                    .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)B * NH * T * T * (C / NH) / 32), backward16_share, &a);
}

void wf_attention_backward16(void *dqkv, float *scratch, const void *dout, const void *qkv,
                             const void *att, int B, int T, int C, int NH, int fmt)
{
  wf_attention_gqa_backward16(dqkv, scratch, dout, qkv, att, NULL, B, T, C, NH, NH, fmt);
}

void wf_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH)
{
  wf_attention_gqa_backward(dqkv, scratch, dout, qkv, att, NULL, B, T, C, NH, NH);
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound -----------------
 * fp32 keeps the (T, T) probabilities and takes a (T, T) scratch per head; a 16-bit type
 * keeps the probabilities two to a float and computes backward in this thread's working
 * memory (no scratch). The CPU has one implementation. */

static size_t tt(int B, int T, int C, int NH) { return (size_t)B * NH * T * T; }
static size_t tt16(int B, int T, int C, int NH) { return (tt(B, T, C, NH) + 1) / 2; }
static size_t no_scratch(int B, int T, int C, int NH) { return 0; }
static void set_impl(int impl) {}
static int path(int B, int T, int C, int NH, int NKV) { return WF_ATTN_REFERENCE; }

#define ATTENTION_VARIANT(name, fmt, saved, scratch)                                               \
  static void name##_forward(void *out, void *att, const void *qkv, const int *starts, int B,      \
                             int T, int C, int NH, int NKV, wf_stream *s)                          \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_attention_gqa_forward(out, att, qkv, starts, B, T, C, NH, NKV);                           \
    else                                                                                           \
      wf_attention_gqa_forward16(out, att, qkv, starts, B, T, C, NH, NKV, fmt);                    \
  }                                                                                                \
  static void name##_backward(void *dqkv, float *scratch_, const void *dout, const void *qkv,      \
                              const void *att, const int *starts, int B, int T, int C, int NH,     \
                              int NKV, wf_stream *s)                                               \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_attention_gqa_backward(dqkv, scratch_, dout, qkv, att, starts, B, T, C, NH, NKV);         \
    else                                                                                           \
      wf_attention_gqa_backward16(dqkv, scratch_, dout, qkv, att, starts, B, T, C, NH, NKV, fmt);  \
  }                                                                                                \
  static const wf_attention_op name = {saved,           scratch,  name##_forward,                  \
                                       name##_backward, set_impl, path}

ATTENTION_VARIANT(f32, WF_DT_F32, tt, tt);
ATTENTION_VARIANT(bf16, WF_DT_BF16, tt16, no_scratch);
ATTENTION_VARIANT(f16, WF_DT_F16, tt16, no_scratch);
const wf_kvariants wf__cpu_attention = WF_KV(attention, WF_OP_VERSION_attention, &f32, &bf16, &f16);
