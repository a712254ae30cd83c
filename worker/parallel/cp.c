/*
 * cp.c - context parallelism's attention over the cp group: ring attention
 * (parallel.cp_mode=ring) or all-gathered keys and values (allgather).
 *
 * Each of the P cp ranks holds chunks r and 2P-1-r of every sequence (its T rows: the
 * first T/2 rows chunk r, the rest chunk 2P-1-r), so under a causal mask every rank does
 * the same work. Against the keys of rank j the rows see:
 *   j == r: their own keys causally (the local rows are in position order);
 *   j <  r: the first half of j's keys (chunk j), every row fully; j's second chunk
 *           2P-1-j lies after both of rank r's chunks;
 *   j >  r: with the second half of the rows only (chunk 2P-1-r), all of j's keys fully.
 * Each block returns its rows' log-sum-exp and the blocks merge by it
 * (kernels/attention_block.h), in the order j = r, r-1, ..., r-P+1 (mod P).
 *
 * Ring: at step s a rank computes the block of source j = r - s while it sends that
 * block's keys and values to r+1 and receives j-1's from r-1 (one grouped exchange, so a
 * ring cannot deadlock): P-1 transfers of (B, T, 2 KV hs) elements in the activations'
 * format, only the kv heads (grouped-query attention sends NH/KV times less than q
 * would). Backward passes K/V the same way and, behind them, the fp32 sum of each
 * block's dK/dV: a block's share is computed into scratch while the sum from r-1
 * arrives, added, and sent on, so after P steps every rank holds the gradient of its
 * own keys and values. All-gather: one all-gather of every rank's K/V per layer (again
 * in backward), the same blocks in the same order, and one reduce-scatter of the dK/dV
 * of every rank's keys.
 *
 * The time a rank waits on the ring or the collectives (after its compute ran) is the
 * exposed communication, reported by wf_cp_stats with the bytes moved.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_block.h"
#include "parallel_int.h"
#include "storage.h"

struct wf_cp {
  wf_comm *comm;
  wf_dev *dev;
  const wf_attention_block_op *k;
  wf_cp_mode mode;
  int P, r;
  wf_cp_geo max;  /* the largest call the buffers hold */
  void *kv[2];    /* (B, T, KW) fmt: the block computed and the one arriving (ring); kv[0]
                   * is every rank's (P, B, T, KW) under all-gather */
  float *dacc[2]; /* (B, T, KW) the dK/dV sums travelling the ring; all-gather: dacc[0] is
                   * every rank's (P, B, T, KW) */
  float *dtmp;    /* (B, T, KW) one block's dK/dV */
  float *acc;     /* (B, T, C) the merged output; backward's dq */
  float *blk;     /* (B, T, C) one block's output */
  float *blse;    /* (B, NH, T) one block's lse; backward's D */
  void *mem;
  double wait_s, bytes;
  wf_trace *trace; /* a span per wait while it records; NULL = none */
};

/* ---- sizes ---------------------------------------------------------------------------- */

typedef struct sizes {
  size_t kv, dkv, out, lse; /* bytes of one (B,T,KW) in fmt, in fp32, (B,T,C) fp32, lse */
} sizes;

static sizes sizes_of(const wf_cp_geo *g)
{
  size_t rows = (size_t)g->B * g->T;
  return (sizes){rows * g->KW * wf_storage_size(g->fmt), rows * g->KW * sizeof(float),
                 rows * g->C * sizeof(float), (size_t)g->B * g->NH * g->T * sizeof(float)};
}

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

wf_cp_geo wf_cp_geo_of(const wf_model_dims *dims, int tp, int B, int T, int fmt)
{
  wf_model_dims d = wf_model_dims_resolve(dims);
  int hs = d.C / d.NH;
  return (wf_cp_geo){
      .B = B, .T = T, .C = d.NH / tp * hs, .NH = d.NH / tp, .KW = 2 * (d.KV / tp) * hs, .fmt = fmt};
}

size_t wf_cp_scratch_bytes(wf_cp_mode mode, int P, const wf_cp_geo *g)
{
  if (P <= 1)
    return 0;
  sizes z = sizes_of(g);
  size_t n = up64(z.dkv) + 2 * up64(z.out) + up64(z.lse); /* dtmp, acc, blk, blse */
  if (mode == WF_CP_ALLGATHER)
    return n + up64(z.kv * P) + up64(z.dkv * P) + up64(z.dkv);
  return n + 2 * up64(z.kv) + 2 * up64(z.dkv);
}

/* Carve the buffers from one allocation (mem NULL: just count). */
static size_t carve(wf_cp *c, char *mem)
{
  sizes z = sizes_of(&c->max);
  bool ag = c->mode == WF_CP_ALLGATHER;
  size_t want[8] = {ag ? z.kv * c->P : z.kv,
                    ag ? 0 : z.kv,
                    ag ? z.dkv * c->P : z.dkv,
                    z.dkv,
                    z.dkv,
                    z.out,
                    z.out,
                    z.lse};
  void **where[8] = {
      &c->kv[0],         &c->kv[1],        (void **)&c->dacc[0], (void **)&c->dacc[1],
      (void **)&c->dtmp, (void **)&c->acc, (void **)&c->blk,     (void **)&c->blse};
  size_t off = 0;
  for (int i = 0; i < 8; i++) {
    *where[i] = mem && want[i] ? mem + off : NULL;
    off += up64(want[i]);
  }
  return off;
}

/* ---- set-up ------------------------------------------------------------------------- */

static const wf_cp_ops cp_ops;

wf_status wf_cp_create(wf_cp **out, const wf_cp_opts *o)
{
  wf_status st = WF_OK;
  wf_cp *c = NULL;
  *out = NULL;
  const wf_kset *ks = wf_dev_kernels(o->dev, WF_DT_F32);
  const wf_attention_block_op *k = WF_K(ks, attention_block);
  WF_CHECK(k, WF_EUNSUPPORTED,
           "context parallelism (mesh.cp=%d): device %s has no block attention kernels yet; "
           "train with mesh.cp on the CPU (runtime.device=cpu) or without mesh.cp",
           wf_comm_size(o->comm), wf_dev_name(o->dev));
  WF_CHECK_ALLOC(c = calloc(1, sizeof *c));
  *c = (wf_cp){.comm = o->comm, .dev = o->dev, .k = k, .mode = o->mode, .max = o->max};
  c->P = wf_comm_size(o->comm);
  c->r = wf_comm_rank(o->comm);
  WF_CHECK(wf_cp_scratch_bytes(c->mode, c->P, &c->max) == carve(c, NULL), WF_EINVAL,
           "cp scratch: the carve and wf_cp_scratch_bytes disagree");
  WF_TRY(wf_dev_alloc(c->dev, &c->mem, carve(c, NULL)));
  carve(c, c->mem);
  *out = c;
  return WF_OK;
fail:
  wf_cp_destroy(c);
  return st;
}

void wf_cp_destroy(wf_cp *c)
{
  if (!c)
    return;
  wf_dev_free(c->dev, c->mem);
  free(c);
}

wf_cp_regions wf_cp_regions_of(wf_cp *c)
{
  return c && c->P > 1 ? (wf_cp_regions){&cp_ops, c} : (wf_cp_regions){NULL, NULL};
}

void wf_cp_stats(wf_cp *c, double *seconds, double *bytes)
{
  *seconds = c ? c->wait_s : 0;
  *bytes = c ? c->bytes : 0;
  if (c)
    c->wait_s = c->bytes = 0;
}

/* ---- communication -------------------------------------------------------------------- */

static wf_comm_dtype dtype_of(int fmt)
{
  return fmt == WF_PREC_BF16 ? WF_COMM_BF16 : fmt == WF_PREC_FP16 ? WF_COMM_F16 : WF_COMM_F32;
}

/* Send n elements of `send` to r+1 and receive n into `recv` from r-1, as one group. */
static wf_status ring_post(wf_cp *c, const void *send, void *recv, size_t n, wf_comm_dtype dt,
                           wf_req **req)
{
  wf_status st = WF_OK;
  WF_TRY(wf_comm_group_start(c->comm));
  WF_TRY(wf_comm_send(c->comm, send, n, dt, (c->r + 1) % c->P));
  WF_TRY(wf_comm_recv(c->comm, recv, n, dt, (c->r + c->P - 1) % c->P));
  WF_TRY(wf_comm_group_end_async(c->comm, req));
  c->bytes += (double)n * wf_comm_dtype_size(dt);
fail:
  return st;
}

/* Wait for a request; the time counts as exposed communication (a trace span). */
static wf_status await(wf_cp *c, wf_req **req)
{
  if (!*req) /* nothing in flight (the ring's last step) */
    return WF_OK;
  double t0 = wf_now();
  wf_status st = wf_req_wait(req);
  double t1 = wf_now();
  c->wait_s += t1 - t0;
  if (wf_trace_on(c->trace))
    wf_trace_span(c->trace, "cp wait", "comm", t0, t1, -1, -1);
  return st;
}

void wf_cp_set_trace(wf_cp *c, wf_trace *trace)
{
  if (c)
    c->trace = trace;
}

/* ---- the blocks --------------------------------------------------------------------- */

/* A call's shape: q rows inside qkv (stride C + KW), kv rows (stride KW). */
typedef struct call {
  int B, T, C, NH, NKV, KW, fmt;
} call;

/* The block of this rank's rows against source j's keys (j == r: causal), as a window:
 * *row0 is the first query row, *kv_rows the key rows used. */
static wf_attn_block block_of(const wf_cp *c, const call *a, int j, int *row0)
{
  int T = a->T, h = T / 2;
  size_t ld = (size_t)(a->C + a->KW);
  wf_attn_block g = {.B = a->B,
                     .Tq = j > c->r ? h : T,
                     .Tk = j < c->r ? h : T,
                     .NH = a->NH,
                     .NKV = a->NKV,
                     .hs = a->C / a->NH,
                     .causal = j == c->r,
                     .q_row = ld,
                     .q_batch = (size_t)T * ld,
                     .kv_row = (size_t)a->KW,
                     .kv_batch = (size_t)T * a->KW,
                     .o_row = (size_t)a->C,
                     .o_batch = (size_t)T * a->C,
                     .l_head = (size_t)T,
                     .l_batch = (size_t)a->NH * T,
                     .fmt = a->fmt};
  *row0 = j > c->r ? h : 0;
  return g;
}

static const void *q_at(const call *a, const void *qkv, int row0)
{
  return (const char *)qkv + (size_t)row0 * (a->C + a->KW) * wf_storage_size(a->fmt);
}

/* Forward of source j's block, merged into acc / lse (the first block writes them). */
static void block_forward(wf_cp *c, const call *a, int j, const void *qkv, const void *kv,
                          float *lse, bool first)
{
  int row0;
  wf_attn_block g = block_of(c, a, j, &row0);
  size_t o = (size_t)row0 * a->C;
  if (first) {
    c->k->forward(c->acc, lse, qkv, kv, &g, NULL);
    return;
  }
  c->k->forward(c->blk + o, c->blse + row0, q_at(a, qkv, row0), kv, &g, NULL);
  c->k->merge(c->acc + o, lse + row0, c->blk + o, c->blse + row0, &g, NULL);
}

/* Backward of source j's block: dq (c->acc) and dkv added to. */
static void block_backward(wf_cp *c, const call *a, int j, const void *dout, const void *qkv,
                           const void *kv, const float *lse, float *dkv)
{
  int row0;
  wf_attn_block g = block_of(c, a, j, &row0);
  size_t o = (size_t)row0 * a->C;
  const void *dO = (const char *)dout + o * wf_storage_size(a->fmt);
  c->k->backward(c->acc + (size_t)row0 * a->C, dkv, dO, q_at(a, qkv, row0), kv, lse + row0,
                 c->blse + row0, &g, NULL);
}

/* ---- forward ------------------------------------------------------------------------ */

static wf_status ring_forward(wf_cp *c, const call *a, const void *qkv, float *lse)
{
  wf_status st = WF_OK;
  size_t n = (size_t)a->B * a->T * a->KW;
  wf_req *req = NULL;
  int cur = 0;
  for (int s = 0; s < c->P; s++) {
    if (s < c->P - 1)
      WF_TRY(ring_post(c, c->kv[cur], c->kv[1 - cur], n, dtype_of(a->fmt), &req));
    block_forward(c, a, (c->r - s + c->P) % c->P, qkv, c->kv[cur], lse, s == 0);
    WF_TRY(await(c, &req));
    cur = 1 - cur;
  }
fail:
  if (req)
    wf_req_wait(&req);
  return st;
}

/* Every rank's keys and values into kv[0] (P, B, T, KW), this rank's staged in dtmp
 * (free until backward's reduce-scatter) since a send may not alias the receive. */
static wf_status gather_kv(wf_cp *c, const call *a, const void *qkv)
{
  size_t n = (size_t)a->B * a->T * a->KW, es = wf_storage_size(a->fmt);
  wf_req *req = NULL;
  c->k->kv_extract(c->dtmp, qkv, (size_t)a->B * a->T, a->C, a->KW, a->fmt, NULL);
  wf_status st = wf_comm_iallgather(c->comm, c->dtmp, c->kv[0], n, dtype_of(a->fmt), &req);
  c->bytes += (double)n * es * (c->P - 1);
  return st == WF_OK ? await(c, &req) : st;
}

/* Rank j's keys and values in the all-gathered buffer. */
static void *kv_of(const wf_cp *c, const call *a, int j)
{
  return (char *)c->kv[0] + (size_t)j * a->B * a->T * a->KW * wf_storage_size(a->fmt);
}

static wf_status allgather_forward(wf_cp *c, const call *a, const void *qkv, float *lse)
{
  wf_status st = WF_OK;
  WF_TRY(gather_kv(c, a, qkv));
  for (int s = 0; s < c->P; s++) {
    int j = (c->r - s + c->P) % c->P;
    block_forward(c, a, j, qkv, kv_of(c, a, j), lse, s == 0);
  }
fail:
  return st;
}

static wf_status check_call(const wf_cp *c, const call *a)
{
  wf_status st = WF_OK;
  const wf_cp_geo *m = &c->max;
  WF_CHECK(a->B * a->T <= m->B * m->T && a->T <= m->T && a->T % 2 == 0 && a->C <= m->C &&
               a->NH <= m->NH && a->KW <= m->KW && a->fmt == m->fmt,
           WF_EINVAL,
           "cp attention of %d x %d rows, %d heads, format %d: the buffers hold %d x %d rows, "
           "%d heads, format %d, and each rank needs two equal chunks",
           a->B, a->T, a->NH, a->fmt, m->B, m->T, m->NH, m->fmt);
fail:
  return st;
}

static wf_status cp_forward(void *ctx, void *out, float *lse, const void *qkv, int B, int T, int C,
                            int NH, int NKV, int fmt)
{
  wf_status st = WF_OK;
  wf_cp *c = ctx;
  call a = {B, T, C, NH, NKV, 2 * NKV * (C / NH), fmt};
  WF_TRY(check_call(c, &a));
  if (c->mode == WF_CP_ALLGATHER) {
    WF_TRY(allgather_forward(c, &a, qkv, lse));
  } else {
    c->k->kv_extract(c->kv[0], qkv, (size_t)B * T, C, a.KW, fmt, NULL);
    WF_TRY(ring_forward(c, &a, qkv, lse));
  }
  WF_K(wf_dev_kernels(c->dev, fmt), cast)->store(out, c->acc, (size_t)B * T * C, NULL);
fail:
  return st;
}

/* ---- backward ----------------------------------------------------------------------- */

/* Step s of the ring's backward: source j's block into dtmp, added into the dK/dV sum
 * for j (received from r-1; started here at s = 0), which is sent on to r+1. */
static wf_status ring_step_back(wf_cp *c, const call *a, int s, const void *dout, const void *qkv,
                                const float *lse, const void *kv, wf_req **dreq)
{
  wf_status st = WF_OK;
  size_t n = (size_t)a->B * a->T * a->KW;
  float *sum = c->dacc[s % 2];
  WF_TRY(wf_dev_memset(c->dev, c->dtmp, 0, n * sizeof(float), NULL));
  block_backward(c, a, (c->r - s + c->P) % c->P, dout, qkv, kv, lse, c->dtmp);
  if (s == 0)
    WF_TRY(wf_dev_memset(c->dev, sum, 0, n * sizeof(float), NULL));
  else
    WF_TRY(await(c, dreq)); /* the sum for j, from r-1 (and our previous send done) */
  c->k->grad_add(sum, c->dtmp, n, NULL);
  WF_TRY(ring_post(c, sum, c->dacc[1 - s % 2], n, WF_COMM_F32, dreq));
fail:
  return st;
}

/* After P steps the sum for this rank's own keys arrives: *own points at it. */
static wf_status ring_backward(wf_cp *c, const call *a, const void *dout, const void *qkv,
                               const float *lse, float **own)
{
  wf_status st = WF_OK;
  size_t n = (size_t)a->B * a->T * a->KW;
  wf_req *kreq = NULL, *dreq = NULL;
  int cur = 0;
  for (int s = 0; s < c->P; s++) {
    if (s < c->P - 1)
      WF_TRY(ring_post(c, c->kv[cur], c->kv[1 - cur], n, dtype_of(a->fmt), &kreq));
    WF_TRY(ring_step_back(c, a, s, dout, qkv, lse, c->kv[cur], &dreq));
    WF_TRY(await(c, &kreq));
    cur = 1 - cur;
  }
  WF_TRY(await(c, &dreq));
  *own = c->dacc[c->P % 2];
fail:
  if (kreq)
    wf_req_wait(&kreq);
  if (dreq)
    wf_req_wait(&dreq);
  return st;
}

static wf_status allgather_backward(wf_cp *c, const call *a, const void *dout, const void *qkv,
                                    const float *lse, float **own)
{
  wf_status st = WF_OK;
  size_t n = (size_t)a->B * a->T * a->KW;
  wf_req *req = NULL;
  WF_TRY(gather_kv(c, a, qkv));
  WF_TRY(wf_dev_memset(c->dev, c->dacc[0], 0, n * c->P * sizeof(float), NULL));
  for (int s = 0; s < c->P; s++) {
    int j = (c->r - s + c->P) % c->P;
    block_backward(c, a, j, dout, qkv, kv_of(c, a, j), lse, c->dacc[0] + (size_t)j * n);
  }
  WF_TRY(wf_comm_ireduce_scatter(c->comm, c->dacc[0], c->dtmp, n, WF_COMM_F32, WF_COMM_SUM, &req));
  c->bytes += (double)n * sizeof(float) * (c->P - 1);
  WF_TRY(await(c, &req));
  *own = c->dtmp;
fail:
  return st;
}

static wf_status cp_backward(void *ctx, void *dqkv, const void *dout, const void *qkv,
                             const void *out, const float *lse, int B, int T, int C, int NH,
                             int NKV, int fmt)
{
  wf_status st = WF_OK;
  wf_cp *c = ctx;
  call a = {B, T, C, NH, NKV, 2 * NKV * (C / NH), fmt};
  float *own = NULL;
  WF_TRY(check_call(c, &a));
  wf_attn_block whole = {.B = B,
                         .Tq = T,
                         .NH = NH,
                         .hs = C / NH,
                         .o_row = (size_t)C,
                         .o_batch = (size_t)T * C,
                         .l_head = (size_t)T,
                         .l_batch = (size_t)NH * T,
                         .fmt = fmt};
  c->k->delta(c->blse, dout, out, &whole, NULL); /* D: blse is free in backward */
  WF_TRY(wf_dev_memset(c->dev, c->acc, 0, (size_t)B * T * C * sizeof(float), NULL)); /* dq */
  if (c->mode == WF_CP_ALLGATHER) {
    WF_TRY(allgather_backward(c, &a, dout, qkv, lse, &own));
  } else {
    c->k->kv_extract(c->kv[0], qkv, (size_t)B * T, C, a.KW, fmt, NULL);
    WF_TRY(ring_backward(c, &a, dout, qkv, lse, &own));
  }
  c->k->grad_pack(dqkv, c->acc, own, (size_t)B * T, C, a.KW, fmt, NULL);
fail:
  return st;
}

static const wf_cp_ops cp_ops = {
    .version = WF_CP_OPS_VERSION,
    .forward = cp_forward,
    .backward = cp_backward,
};
