/*
 * experts.c - the sparse MLP of a mixture-of-experts layer: the router, the tokens'
 * dispatch into expert-major order, each expert's SwiGLU as per-expert GEMMs over its
 * rows (cuBLASLt or OpenBLAS through the device's matmul, one call per expert that has
 * rows), the weighted combine, and their backward.
 *
 * Routing (moe_route.h) is dropless unless a capacity factor is set: every token reaches
 * its K experts, so an expert's rows are as many as the tokens that chose it, and the
 * host learns them (E integers a layer, read once in forward and once in backward) to
 * size each GEMM. An expert that no token chose runs no GEMM; its gradient is left as it
 * was (zero for this micro-batch).
 *
 * Tensor parallelism splits every expert as Llama's MLP ([gate | up] by hidden units,
 * down by its input columns), so each rank's expert outputs are partial sums and so is the
 * combined output, which leaves the tp region as a row-parallel output does. The router is
 * replicated: every rank routes alike. Its backward starts from the gradients of the
 * routing weights, which are partial sums too (dot products with partial outputs), and the
 * load-balancing and z-loss terms enter on tp rank 0 only; the router's weight gradient
 * and its input gradient are so partial sums (the input gradient joins the experts' in
 * the tp reduction; the weight's is summed over tp after backward: tp_partial).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe_int.h"
#include "wf_kernels.h"

/* Elements of expert e's copy of layer l's tensor x within the layer's local tensor. */
static size_t expert_numel(wf_model *m, int x)
{
  int t = wf__moe_tensor(m, x);
  return wf_model_local_layer_numel(m, t) / (size_t)(m->d.E / (m->s.ep > 1 ? m->s.ep : 1));
}

static const void *expert_weight(wf_model *m, int x, int l, int e)
{
  const char *w = wf__gemm_weight(m, wf__moe_tensor(m, x), l);
  return w + (size_t)e * expert_numel(m, x) * m->esize;
}

static float *expert_grad(wf_model *m, int x, int l, int e)
{
  return wf_model_param(m, wf__moe_tensor(m, x), l, 1) + (size_t)e * expert_numel(m, x);
}

/* Row r of an activation buffer of rows `width` wide. */
static void *act_row(const void *p, size_t r, size_t width, size_t esize)
{
  return (char *)p + r * width * esize;
}

/* Where a layer's rows go, on the host: the token side's experts in expert-major order
 * (count, off: E each); under expert parallelism the rows each local expert receives from
 * each rank (rc: ep blocks of El) and the rows to and from each rank (send, recv). The
 * expert side is then rank-major (each rank's rows for this rank's experts, expert by
 * expert), else the token side itself. */
typedef struct plan {
  int *count, *off, *rc;
  size_t *send, *recv;
  int E, ep, El, e0;
} plan;

static void plan_free(plan *p)
{
  free(p->count);
  free(p->send);
}

static wf_status plan_alloc(wf_model *m, plan *p)
{
  wf_status st = WF_OK;
  p->E = m->d.E, p->ep = m->s.ep > 1 ? m->s.ep : 1;
  p->El = p->E / p->ep, p->e0 = (m->s.ep > 1 ? m->s.ep_rank : 0) * p->El;
  WF_CHECK_ALLOC(p->count = malloc(3 * (size_t)p->E * sizeof *p->count));
  WF_CHECK_ALLOC(p->send = malloc(2 * (size_t)p->ep * sizeof *p->send));
  p->off = p->count + p->E, p->rc = p->off + p->E, p->recv = p->send + p->ep;
fail:
  return st;
}

/* The per-rank row totals of the counts: to rank q the rows of its experts, from rank q
 * what it sent this rank's experts. */
static void plan_totals(plan *p)
{
  p->off[0] = 0;
  for (int e = 1; e < p->E; e++)
    p->off[e] = p->off[e - 1] + p->count[e - 1];
  for (int q = 0; q < p->ep; q++) {
    p->send[q] = p->recv[q] = 0;
    for (int i = 0; i < p->El; i++)
      p->send[q] += (size_t)p->count[q * p->El + i], p->recv[q] += (size_t)p->rc[q * p->El + i];
  }
}

/* The layer's plan: its counts read back, and under expert parallelism exchanged (forward:
 * fresh = true, the rows each rank sends each expert kept for backward) or read back. */
static wf_status plan_read(wf_model *m, const moe_layer *v, plan *p, bool fresh)
{
  wf_status st = WF_OK;
  size_t E = (size_t)p->E;
  WF_TRY(wf_dev_read(m->dev, p->count, v->counts, E * sizeof *p->count));
  if (p->ep == 1)
    memcpy(p->rc, p->count, E * sizeof *p->rc); /* one rank: everything received is its own */
  else if (fresh) {
    WF_TRY(m->ep.ops->counts(m->ep.ctx, p->count, p->rc, (size_t)p->El));
    WF_TRY(wf_dev_copy(m->dev, v->rc, p->rc, E * sizeof *p->rc, WF_COPY_H2D, NULL));
  } else {
    WF_TRY(wf_dev_read(m->dev, p->rc, v->rc, E * sizeof *p->rc));
  }
  plan_totals(p);
fail:
  return st;
}

/* The expert side's chunks in their order: rank q's rows for local expert i, each calls
 * fn with (local expert, first row, rows) when it has any. */
typedef void (*chunk_fn)(wf_model *m, const void *ctx, int l, int i, int off, int n);

static void each_chunk(wf_model *m, const plan *p, chunk_fn fn, const void *ctx, int l)
{
  int at = 0;
  for (int q = 0; q < p->ep; q++)
    for (int i = 0; i < p->El; i++) {
      int n = p->rc[q * p->El + i];
      if (n > 0)
        fn(m, ctx, l, i, at, n);
      at += n;
    }
}

/* The expert side's buffers of a pass: inputs (xe), outputs (ye, fp32), and in backward
 * the output and input gradients (dye, dxe, fp32). */
typedef struct side {
  const moe_layer *v;
  const moe_scratch *s;
  const void *xe, *dye;
  float *ye, *dxe;
} side;

/* Expert i's SwiGLU over its n rows from row off of the expert side. */
static void expert_forward(wf_model *m, const void *ctx, int l, int i, int off, int n)
{
  const side *x = ctx;
  const wf_kset *k = m->k;
  int C = m->d.C, F = (int)wf__moe_f_local(&m->g);
  size_t o = (size_t)off;
  void *gu = act_row(x->v->gu, o, 2 * (size_t)F, m->esize);
  void *h = act_row(x->v->h, o, (size_t)F, m->esize);
  WF_K(k, matmul)->forward(gu, act_row(x->xe, o, (size_t)C, m->esize),
                           expert_weight(m, MO_GU, l, i), NULL, n, C, 2 * F, m->prec, NULL);
  WF_K(k, swiglu)->forward(h, gu, n, F, NULL);
  WF_K(k, matmul)->forward_f32(x->ye + o * C, h, expert_weight(m, MO_DOWN, l, i), NULL, n, F, C,
                               m->prec, NULL);
}

/* The capacity of each expert for N tokens (0: dropless). */
static int capacity(const wf_model *m, int N)
{
  double c = m->d.capacity;
  return c > 0 ? (int)ceil(c * (double)N * m->d.K / m->d.E) : 0;
}

/* Rows from the token side to the experts' ranks (forward's inputs, backward's output
 * gradients: format fmt), or back (there = false: the reverse counts). */
static wf_status exchange(wf_model *m, const plan *p, const void *from, void *to, int fmt,
                          bool there)
{
  return m->ep.ops->rows(m->ep.ctx, from, there ? p->send : p->recv, to, there ? p->recv : p->send,
                         (size_t)m->d.C, fmt);
}

wf_status wf__moe_mlp_forward(wf_model *m, const moe_layer *v, float *keep, const void *xin,
                              float *out, int l, int N)
{
  wf_status st = WF_OK;
  const wf_kset *k = m->k;
  int C = m->d.C, E = m->d.E, K = m->d.K;
  moe_scratch s = wf__moe_scratch_at(m);
  plan p = {0};
  WF_TRY(plan_alloc(m, &p));
  WF_K(k, matmul)->forward_f32(v->probs, xin, wf__gemm_weight(m, wf__moe_tensor(m, MO_ROUTER), l),
                               NULL, N, C, E, m->prec, NULL);
  WF_K(m->k, moe_route)
      ->forward(v->probs, v->lse, v->idx, v->w, keep, v->probs, N, E, K,
                m->d.norm_topk == WF_SWITCH_ON, NULL);
  WF_K(m->k, moe_dispatch)
      ->dispatch(v->pos, v->counts, keep + 2 * E + 1, v->idx, N, E, K, capacity(m, N), NULL);
  WF_TRY(plan_read(m, v, &p, true));
  WF_K(m->k, moe_dispatch)->permute(v->xp, xin, v->pos, N, K, C, (int)m->prec, NULL);
  side x = {.v = v, .xe = p.ep > 1 ? v->xr : v->xp, .ye = p.ep > 1 ? s.dxr : v->y};
  if (p.ep > 1) /* every rank's tokens to their experts' ranks */
    WF_TRY(exchange(m, &p, v->xp, v->xr, (int)m->prec, true));
  each_chunk(m, &p, expert_forward, &x, l);
  if (p.ep > 1) /* and the outputs back, in the token side's expert-major order */
    WF_TRY(exchange(m, &p, s.dxr, v->y, WF_PREC_NO, false));
  WF_K(m->k, moe_combine)->combine(out, v->y, v->w, v->pos, N, K, C, NULL);
fail:
  plan_free(&p);
  return st;
}

/* Expert i's backward from its output gradients (dye): its weights' gradients added, its
 * inputs' gradient written into dxe. */
static void expert_backward(wf_model *m, const void *ctx, int l, int i, int off, int n)
{
  const side *x = ctx;
  const wf_kset *k = m->k;
  int C = m->d.C, F = (int)wf__moe_f_local(&m->g);
  size_t o = (size_t)off, es = m->esize;
  void *dh = act_row(x->s->db, o, (size_t)F, es), *dgu = act_row(x->s->da, o, 2 * (size_t)F, es);
  WF_K(k, matmul)->backward(dh, expert_grad(m, MO_DOWN, l, i), NULL,
                            act_row(x->dye, o, (size_t)C, es), act_row(x->v->h, o, (size_t)F, es),
                            expert_weight(m, MO_DOWN, l, i), n, F, C, m->prec, NULL);
  WF_K(k, swiglu)->backward(dgu, act_row(x->v->gu, o, 2 * (size_t)F, es), dh, n, F, NULL);
  WF_K(k, matmul)->backward_f32(x->dxe + o * C, expert_grad(m, MO_GU, l, i), NULL, dgu,
                                act_row(x->xe, o, (size_t)C, es), expert_weight(m, MO_GU, l, i), n,
                                C, 2 * F, m->prec, NULL);
}

/* The router's backward into dx (WRITTEN): the routing weights' gradients (dw) with the
 * load-balancing loss's share (the whole model's counts, m->da.side) and the z-loss's, on
 * tp rank 0 alone. R = L N router rows. */
static void router_backward(wf_model *m, const moe_layer *v, const moe_scratch *s, const void *xin,
                            float *dx, int l, int N)
{
  int C = m->d.C, E = m->d.E, K = m->d.K;
  double R = (double)m->d.L * N, one = m->s.tp_rank == 0 ? m->dloss : 0;
  float aux = (float)(one * m->d.aux_coef * E / (R * R)), z = (float)(one * m->d.z_coef * 2 / R);
  WF_K(m->k, moe_route)
      ->backward(s->dlogits, s->dw, v->probs, v->lse, v->idx, v->w, m->da.side, aux, z, N, E, K,
                 m->d.norm_topk == WF_SWITCH_ON, (int)m->prec, NULL);
  int t = wf__moe_tensor(m, MO_ROUTER);
  WF_K(m->k, matmul)
      ->backward_f32(dx, wf_model_param(m, t, l, 1), NULL, s->dlogits, xin,
                     wf__gemm_weight(m, t, l), N, C, E, m->prec, NULL);
}

wf_status wf__moe_mlp_backward(wf_model *m, const moe_layer *v, const moe_scratch *s,
                               const void *n2, const float *dy, float *dx, int l, int N)
{
  wf_status st = WF_OK;
  int C = m->d.C, K = m->d.K;
  const void *xin;
  plan p = {0};
  WF_TRY(plan_alloc(m, &p));
  WF_K(m->k, moe_combine)
      ->backward(s->dyp, s->dw, dy, v->y, v->w, v->pos, N, K, C, (int)m->prec, NULL);
  WF_TRY(plan_read(m, v, &p, false));
  bool ep = p.ep > 1;
  side x = {.v = v,
            .s = s,
            .xe = ep ? v->xr : v->xp,
            .dye = ep ? s->dyr : s->dyp,
            .dxe = ep ? s->dxr : s->dxp};
  if (ep) /* the output gradients to the experts' ranks */
    WF_TRY(exchange(m, &p, s->dyp, s->dyr, (int)m->prec, true));
  each_chunk(m, &p, expert_backward, &x, l);
  if (ep) /* the inputs' gradients back to the tokens' ranks */
    WF_TRY(exchange(m, &p, s->dxr, s->dxp, WF_PREC_NO, false));
  /* dy is read: the tp region's input may now be gathered again where dy was (da.full) */
  WF_TRY(wf__enter_fwd(m, &xin, n2, m->da.full, (size_t)N, (size_t)C));
  router_backward(m, v, s, xin, dx, l, N);
  WF_K(m->k, moe_dispatch)->unpermute(dx, s->dxp, v->pos, N, K, C, NULL);
fail:
  plan_free(&p);
  return st;
}
