/*
 * attention_block.c - a block of attention that returns and takes the log-sum-exp, its
 * merge, and the layout moves around it (attention_block.h).
 *
 * Legend: B batch, Tq query rows, Tk key/value rows, NH query heads, NKV kv heads, G =
 * NH / NKV query heads per kv head, hs head size, m rows of a query tile.
 *
 * Forward work is split over the B*NH (batch, query head) pairs, backward over the
 * B*NKV (batch, kv head) groups, whose G query heads run in head order because they all
 * add into the group's dk and dv (no two threads write one row). Each pair loads its
 * head's q, k and v widened to fp32 into this thread's working memory (the 16-bit
 * formats are read the same way; fp32 is copied, O(T hs) beside the O(T^2 hs) GEMMs),
 * then walks query tiles of BLK rows: the tile's scores against every key it may see
 * (all of them, or keys up to the tile's last row when causal) are one single-threaded
 * sgemm, so a tile needs BLK x Tk floats and nothing holds a (T, T) matrix: memory grows
 * linearly with the sequence, as flash attention's does. The softmax of a tile row is
 * exact (the whole key range is in the tile), so no online rescaling is needed inside
 * a block; blocks are merged by their log-sum-exp.
 */
#include <math.h>

#include "attention_block.h"
#include "cpu_int.h"
#include "storage.h"

#define BLK 64

static float scale_of(const wf_attn_block *g) { return 1.0f / sqrtf((float)g->hs); }
/* Keys query row i of a tile ending at i1 may see: every key, or (causal) up to i1. */
static int keys_of(const wf_attn_block *g, int i1) { return g->causal ? i1 : g->Tk; }

/* rows x hs of head column col from a strided buffer in fmt -> dst (rows, hs) fp32. */
static void load_head(float *dst, const void *src, size_t first, size_t row, int rows, int hs,
                      int fmt)
{
  for (int i = 0; i < rows; i++)
    wf__load(dst + (size_t)i * hs, src, first + (size_t)i * row, (size_t)hs, fmt);
}

/* Scores of tile rows [i0, i0 + m) against keys [0, n): S (m, n) = scale Q K^T, with the
 * causal mask's excluded keys (j > i) set to -inf. */
static void tile_scores(float *S, const float *Q, const float *K, int i0, int m, int n,
                        const wf_attn_block *g)
{
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, g->hs, scale_of(g),
              Q + (size_t)i0 * g->hs, g->hs, K, g->hs, 0.0f, S, n);
  if (!g->causal)
    return;
  for (int r = 0; r < m; r++)
    for (int j = i0 + r + 1; j < n; j++)
      S[(size_t)r * n + j] = -INFINITY;
}

/* ---- forward -------------------------------------------------------------------------- */

struct fwd {
  float *out, *lse;
  const void *q, *kv;
  const wf_attn_block *g;
};

/* Softmax of S's m rows in place (masked entries exactly 0); lse of each row. */
WF__CLONES static void softmax_lse(float *S, float *lse, int m, int n)
{
  for (int r = 0; r < m; r++) {
    float *s = S + (size_t)r * n;
    float mx = wf__maxf(s, n), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
      s[j] = s[j] == -INFINITY ? 0.0f : wf__expf(s[j] - mx);
      sum += s[j];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < n; j++)
      s[j] *= inv;
    lse[r] = mx + logf(sum);
  }
}

static void pair_forward(const struct fwd *a, size_t b, size_t h, float *w[4])
{
  const wf_attn_block *g = a->g;
  int hs = g->hs;
  size_t kvh = h / (size_t)(g->NH / g->NKV), kv0 = b * g->kv_batch;
  float *Q = w[0], *K = w[1], *V = w[2], *S = w[3];
  load_head(Q, a->q, b * g->q_batch + h * hs, g->q_row, g->Tq, hs, g->fmt);
  load_head(K, a->kv, kv0 + kvh * hs, g->kv_row, g->Tk, hs, g->fmt);
  load_head(V, a->kv, kv0 + ((size_t)g->NKV + kvh) * hs, g->kv_row, g->Tk, hs, g->fmt);
  float *lse = a->lse + b * g->l_batch + h * g->l_head;
  for (int i0 = 0; i0 < g->Tq; i0 += BLK) {
    int i1 = WF_MIN(i0 + BLK, g->Tq), m = i1 - i0, n = keys_of(g, i1);
    tile_scores(S, Q, K, i0, m, n, g);
    softmax_lse(S, lse + i0, m, n);
    float *o = a->out + b * g->o_batch + (size_t)i0 * g->o_row + h * hs;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, n, 1.0f, S, n, V, hs, 0.0f, o,
                (int)g->o_row);
  }
}

static void forward_share(void *p, int tid, int nt)
{
  const struct fwd *a = p;
  const wf_attn_block *g = a->g;
  size_t lo, hi, Tk = (size_t)g->Tk, hs = (size_t)g->hs;
  float *w[4] = {wf__work(0, (size_t)g->Tq * hs), wf__work(1, Tk * hs), wf__work(2, Tk * hs),
                 wf__work(3, BLK * Tk)};
  if (!w[0] || !w[1] || !w[2] || !w[3])
    return;
  wf__split((size_t)g->B * g->NH, tid, nt, 1, &lo, &hi);
  for (size_t bh = lo; bh < hi; bh++)
    pair_forward(a, bh / g->NH, bh % g->NH, w);
}

static size_t work_of(const wf_attn_block *g)
{
  return (size_t)g->B * g->NH * g->Tq * g->Tk * g->hs;
}

void wf_attention_block_forward(float *out, float *lse, const void *q, const void *kv,
                                const wf_attn_block *g)
{
  struct fwd a = {out, lse, q, kv, g};
  wf__parallel(wf__threads_for(work_of(g) / 64), forward_share, &a);
}

/* ---- merge and delta ------------------------------------------------------------------ */

struct rows_task {
  float *acc, *acc_lse;
  const float *out, *lse;
  const void *dout, *o16;
  const wf_attn_block *g;
};

static void merge_pair(const struct rows_task *a, size_t b, size_t h)
{
  const wf_attn_block *g = a->g;
  size_t l0 = b * g->l_batch + h * g->l_head;
  for (int i = 0; i < g->Tq; i++) {
    float la = a->acc_lse[l0 + i], lb = a->lse[l0 + i];
    if (lb == -INFINITY) /* the block saw no key for this row */
      continue;
    float mx = la > lb ? la : lb;
    float l = mx + logf(expf(la - mx) + expf(lb - mx)); /* exp(-inf) = 0 */
    float wa = expf(la - l), wb = expf(lb - l);
    size_t o = b * g->o_batch + (size_t)i * g->o_row + h * (size_t)g->hs;
    for (int d = 0; d < g->hs; d++)
      a->acc[o + d] = wa * a->acc[o + d] + wb * a->out[o + d];
    a->acc_lse[l0 + i] = l;
  }
}

static void merge_share(void *p, int tid, int nt)
{
  const struct rows_task *a = p;
  size_t lo, hi;
  wf__split((size_t)a->g->B * a->g->NH, tid, nt, 1, &lo, &hi);
  for (size_t bh = lo; bh < hi; bh++)
    merge_pair(a, bh / a->g->NH, bh % a->g->NH);
}

void wf_attention_block_merge(float *acc, float *acc_lse, const float *out, const float *lse,
                              const wf_attn_block *g)
{
  struct rows_task a = {.acc = acc, .acc_lse = acc_lse, .out = out, .lse = lse, .g = g};
  wf__parallel(wf__threads_for((size_t)g->B * g->NH * g->Tq * g->hs), merge_share, &a);
}

static void delta_share(void *p, int tid, int nt)
{
  const struct rows_task *a = p;
  const wf_attn_block *g = a->g;
  size_t lo, hi, hs = (size_t)g->hs;
  float *w = wf__work(0, 2 * hs);
  if (!w)
    return;
  wf__split((size_t)g->B * g->NH, tid, nt, 1, &lo, &hi);
  for (size_t bh = lo; bh < hi; bh++) {
    size_t b = bh / g->NH, h = bh % g->NH;
    for (int i = 0; i < g->Tq; i++) {
      size_t o = b * g->o_batch + (size_t)i * g->o_row + h * hs;
      float s = 0.0f;
      wf__load(w, a->dout, o, hs, g->fmt);
      wf__load(w + hs, a->o16, o, hs, g->fmt);
      for (size_t d = 0; d < hs; d++)
        s += w[d] * w[hs + d];
      a->acc_lse[b * g->l_batch + h * g->l_head + (size_t)i] = s;
    }
  }
}

void wf_attention_block_delta(float *D, const void *dout, const void *out, const wf_attn_block *g)
{
  struct rows_task a = {.acc_lse = D, .dout = dout, .o16 = out, .g = g};
  wf__parallel(wf__threads_for((size_t)g->B * g->NH * g->Tq * g->hs), delta_share, &a);
}

/* ---- backward ------------------------------------------------------------------------- */

struct bwd {
  float *dq, *dkv;
  const void *dout, *q, *kv;
  const float *lse, *D;
  const wf_attn_block *g;
};

/* P (m, n) = exp(S - lse) in place (masked entries 0); dP (m, n) becomes dS = P (dP - D). */
WF__CLONES static void probs_grad(float *S, float *dP, const float *lse, const float *D, int m,
                                  int n)
{
  for (int r = 0; r < m; r++) {
    float *s = S + (size_t)r * n, *d = dP + (size_t)r * n, l = lse[r], dr = D[r];
#pragma omp simd
    for (int j = 0; j < n; j++) {
      s[j] = s[j] == -INFINITY ? 0.0f : wf__expf(s[j] - l);
      d[j] = s[j] * (d[j] - dr);
    }
  }
}

/* Query head h of batch b against its group's k, v (w[0], w[1]), adding into the
 * group's dk, dv sums (w[2], w[3]) and into dq in place. */
static void head_backward(const struct bwd *a, size_t b, size_t h, float *w[8])
{
  const wf_attn_block *g = a->g;
  int hs = g->hs;
  float *K = w[0], *V = w[1], *dK = w[2], *dV = w[3], *Q = w[4], *dO = w[5], *S = w[6], *dP = w[7];
  float sc = scale_of(g);
  size_t l0 = b * g->l_batch + h * g->l_head;
  load_head(Q, a->q, b * g->q_batch + h * hs, g->q_row, g->Tq, hs, g->fmt);
  load_head(dO, a->dout, b * g->o_batch + h * hs, g->o_row, g->Tq, hs, g->fmt);
  for (int i0 = 0; i0 < g->Tq; i0 += BLK) {
    int i1 = WF_MIN(i0 + BLK, g->Tq), m = i1 - i0, n = keys_of(g, i1);
    const float *dOt = dO + (size_t)i0 * hs, *Qt = Q + (size_t)i0 * hs;
    tile_scores(S, Q, K, i0, m, n, g);
    /* dP (m, n) = dO_t V^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, hs, 1.0f, dOt, hs, V, hs, 0.0f, dP,
                n);
    probs_grad(S, dP, a->lse + l0 + i0, a->D + l0 + i0, m, n);
    /* dV[0:n] += P^T dO_t;  dK[0:n] += sc dS^T Q_t;  dq_t += sc dS K[0:n] */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, m, 1.0f, S, n, dOt, hs, 1.0f, dV,
                hs);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, m, sc, dP, n, Qt, hs, 1.0f, dK, hs);
    float *dq = a->dq + b * g->o_batch + (size_t)i0 * g->o_row + h * hs;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, n, sc, dP, n, K, hs, 1.0f, dq,
                (int)g->o_row);
  }
}

/* Group kvh of batch b: its query heads in head order, then its dk and dv added into
 * dkv. */
static void group_backward(const struct bwd *a, size_t b, size_t kvh, float *w[8])
{
  const wf_attn_block *g = a->g;
  size_t hs = (size_t)g->hs, Tk = (size_t)g->Tk, G = (size_t)(g->NH / g->NKV);
  size_t k0 = b * g->kv_batch + kvh * hs, v0 = b * g->kv_batch + ((size_t)g->NKV + kvh) * hs;
  load_head(w[0], a->kv, k0, g->kv_row, g->Tk, g->hs, g->fmt);
  load_head(w[1], a->kv, v0, g->kv_row, g->Tk, g->hs, g->fmt);
  memset(w[2], 0, Tk * hs * sizeof(float));
  memset(w[3], 0, Tk * hs * sizeof(float));
  for (size_t h = kvh * G; h < (kvh + 1) * G; h++)
    head_backward(a, b, h, w);
  for (size_t j = 0; j < Tk; j++)
    for (size_t d = 0; d < hs; d++) {
      a->dkv[k0 + j * g->kv_row + d] += w[2][j * hs + d];
      a->dkv[v0 + j * g->kv_row + d] += w[3][j * hs + d];
    }
}

static void backward_share(void *p, int tid, int nt)
{
  const struct bwd *a = p;
  const wf_attn_block *g = a->g;
  size_t lo, hi, hs = (size_t)g->hs, Tk = (size_t)g->Tk, Tq = (size_t)g->Tq;
  float *w[8] = {wf__work(0, Tk * hs),  wf__work(1, Tk * hs), wf__work(2, Tk * hs),
                 wf__work(3, Tk * hs),  wf__work(4, Tq * hs), wf__work(5, Tq * hs),
                 wf__work(6, BLK * Tk), wf__work(7, BLK * Tk)};
  for (int i = 0; i < 8; i++)
    if (!w[i])
      return;
  wf__split((size_t)g->B * g->NKV, tid, nt, 1, &lo, &hi);
  for (size_t bk = lo; bk < hi; bk++)
    group_backward(a, bk / g->NKV, bk % g->NKV, w);
}

void wf_attention_block_backward(float *dq, float *dkv, const void *dout, const void *q,
                                 const void *kv, const float *lse, const float *D,
                                 const wf_attn_block *g)
{
  struct bwd a = {dq, dkv, dout, q, kv, lse, D, g};
  wf__parallel(wf__threads_for(work_of(g) / 32), backward_share, &a);
}

/* ---- layout ---------------------------------------------------------------------------- */

void wf_attention_kv_extract(void *kv, const void *qkv, size_t rows, int C, int KW, int fmt)
{
  size_t es = wf_storage_size(fmt), ld = (size_t)(C + KW);
  for (size_t r = 0; r < rows; r++)
    memcpy((char *)kv + r * KW * es, (const char *)qkv + (r * ld + (size_t)C) * es, KW * es);
}

void wf_attention_grad_pack(void *dqkv, const float *dq, const float *dkv, size_t rows, int C,
                            int KW, int fmt)
{
  size_t ld = (size_t)(C + KW);
  for (size_t r = 0; r < rows; r++) {
    wf__store(dqkv, r * ld, dq + r * (size_t)C, (size_t)C, fmt);
    wf__store(dqkv, r * ld + (size_t)C, dkv + r * (size_t)KW, (size_t)KW, fmt);
  }
}

void wf_attention_grad_add(float *dst, const float *src, size_t n)
{
#pragma omp simd
  for (size_t i = 0; i < n; i++)
    dst[i] += src[i];
}

/* ---- the op (wf_kreg.h): one table for every element type (the format is an argument) -- */

static void fwd(float *out, float *lse, const void *q, const void *kv, const wf_attn_block *g,
                wf_stream *s)
{
  (void)s;
  wf_attention_block_forward(out, lse, q, kv, g);
}

static void merge(float *acc, float *acc_lse, const float *out, const float *lse,
                  const wf_attn_block *g, wf_stream *s)
{
  (void)s;
  wf_attention_block_merge(acc, acc_lse, out, lse, g);
}

static void delta(float *D, const void *dout, const void *out, const wf_attn_block *g, wf_stream *s)
{
  (void)s;
  wf_attention_block_delta(D, dout, out, g);
}

static void bwd(float *dq, float *dkv, const void *dout, const void *q, const void *kv,
                const float *lse, const float *D, const wf_attn_block *g, wf_stream *s)
{
  (void)s;
  wf_attention_block_backward(dq, dkv, dout, q, kv, lse, D, g);
}

static void extract(void *kv, const void *qkv, size_t rows, int C, int KW, int fmt, wf_stream *s)
{
  (void)s;
  wf_attention_kv_extract(kv, qkv, rows, C, KW, fmt);
}

static void pack(void *dqkv, const float *dq, const float *dkv, size_t rows, int C, int KW, int fmt,
                 wf_stream *s)
{
  (void)s;
  wf_attention_grad_pack(dqkv, dq, dkv, rows, C, KW, fmt);
}

static void add(float *dst, const float *src, size_t n, wf_stream *s)
{
  (void)s;
  wf_attention_grad_add(dst, src, n);
}

static const wf_attention_block_op op = {fwd, merge, delta, bwd, extract, pack, add};
const wf_kvariants wf__cpu_attention_block =
    WF_KV_ANY(attention_block, WF_OP_VERSION_attention_block, &op);
