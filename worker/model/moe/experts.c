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

/* The experts' rows on the host: counts (E) and their offsets. */
typedef struct rows {
  int *count, *off, E;
} rows;

static wf_status rows_read(wf_model *m, const moe_layer *v, rows *r)
{
  wf_status st = WF_OK;
  r->E = m->d.E;
  WF_CHECK_ALLOC(r->count = malloc(2 * (size_t)r->E * sizeof *r->count));
  r->off = r->count + r->E;
  WF_TRY(wf_dev_read(m->dev, r->count, v->counts, (size_t)r->E * sizeof *r->count));
  r->off[0] = 0;
  for (int e = 1; e < r->E; e++)
    r->off[e] = r->off[e - 1] + r->count[e - 1];
fail:
  return st;
}

/* Expert e's SwiGLU over its rows of xp: gu, h, and its output y (fp32). */
static void expert_forward(wf_model *m, const moe_layer *v, int l, int e, int off, int n)
{
  const wf_ktable *k = m->k;
  int C = m->d.C, F = (int)wf__moe_f_local(&m->g);
  void *gu = act_row(v->gu, (size_t)off, 2 * (size_t)F, m->esize);
  void *h = act_row(v->h, (size_t)off, (size_t)F, m->esize);
  k->matmul_forward(gu, act_row(v->xp, (size_t)off, (size_t)C, m->esize),
                    expert_weight(m, MO_GU, l, e), NULL, n, C, 2 * F, m->prec, NULL);
  k->swiglu_forward(h, gu, n, F, NULL);
  k->matmul_forward_f32(v->y + (size_t)off * C, h, expert_weight(m, MO_DOWN, l, e), NULL, n, F, C,
                        m->prec, NULL);
}

/* The capacity of each expert for N tokens (0: dropless). */
static int capacity(const wf_model *m, int N)
{
  double c = m->d.capacity;
  return c > 0 ? (int)ceil(c * (double)N * m->d.K / m->d.E) : 0;
}

wf_status wf__moe_mlp_forward(wf_model *m, const moe_layer *v, float *keep, const void *xin,
                              float *out, int l, int N)
{
  wf_status st = WF_OK;
  const wf_ktable *k = m->k;
  int C = m->d.C, E = m->d.E, K = m->d.K;
  rows r = {0};
  k->matmul_forward_f32(v->probs, xin, wf__gemm_weight(m, wf__moe_tensor(m, MO_ROUTER), l), NULL,
                        N, C, E, m->prec, NULL);
  wf_moe_route_forward(v->probs, v->lse, v->idx, v->w, keep, v->probs, N, E, K,
                       m->d.norm_topk == WF_SWITCH_ON);
  wf_moe_dispatch(v->pos, v->counts, keep + 2 * E + 1, v->idx, N, E, K, capacity(m, N));
  WF_TRY(rows_read(m, v, &r));
  wf_moe_permute(v->xp, xin, v->pos, N, K, C, (int)m->prec);
  for (int e = 0; e < E; e++)
    if (r.count[e] > 0)
      expert_forward(m, v, l, e, r.off[e], r.count[e]);
  wf_moe_combine(out, v->y, v->w, v->pos, N, K, C);
fail:
  free(r.count);
  return st;
}

/* Expert e's backward from its output gradients (dyp): its weights' gradients added, its
 * inputs' gradient written into dxp. */
static void expert_backward(wf_model *m, const moe_layer *v, const moe_scratch *s, int l, int e,
                            int off, int n)
{
  const wf_ktable *k = m->k;
  int C = m->d.C, F = (int)wf__moe_f_local(&m->g);
  size_t o = (size_t)off;
  void *dh = act_row(s->db, o, (size_t)F, m->esize), *dgu = act_row(s->da, o, 2 * (size_t)F, m->esize);
  k->matmul_backward(dh, expert_grad(m, MO_DOWN, l, e), NULL, act_row(s->dyp, o, (size_t)C, m->esize),
                     act_row(v->h, o, (size_t)F, m->esize), expert_weight(m, MO_DOWN, l, e), n, F, C,
                     m->prec, NULL);
  k->swiglu_backward(dgu, act_row(v->gu, o, 2 * (size_t)F, m->esize), dh, n, F, NULL);
  k->matmul_backward_f32(s->dxp + o * C, expert_grad(m, MO_GU, l, e), NULL, dgu,
                         act_row(v->xp, o, (size_t)C, m->esize), expert_weight(m, MO_GU, l, e), n,
                         C, 2 * F, m->prec, NULL);
}

/* The router's backward into dx (WRITTEN): the routing weights' gradients (dw) with the
 * load-balancing loss's share (the whole model's counts, m->da.side) and the z-loss's, on
 * tp rank 0 alone. R = L N router rows. */
static void router_backward(wf_model *m, const moe_layer *v, const moe_scratch *s,
                            const void *xin, float *dx, int l, int N)
{
  int C = m->d.C, E = m->d.E, K = m->d.K;
  double R = (double)m->d.L * N, one = m->s.tp_rank == 0 ? m->dloss : 0;
  float aux = (float)(one * m->d.aux_coef * E / (R * R)), z = (float)(one * m->d.z_coef * 2 / R);
  wf_moe_route_backward(s->dlogits, s->dw, v->probs, v->lse, v->idx, v->w, m->da.side, aux, z, N,
                        E, K, m->d.norm_topk == WF_SWITCH_ON, (int)m->prec);
  int t = wf__moe_tensor(m, MO_ROUTER);
  m->k->matmul_backward_f32(dx, wf_model_param(m, t, l, 1), NULL, s->dlogits, xin,
                            wf__gemm_weight(m, t, l), N, C, E, m->prec, NULL);
}

wf_status wf__moe_mlp_backward(wf_model *m, const moe_layer *v, const moe_scratch *s,
                               const void *n2, const float *dy, float *dx, int l, int N)
{
  wf_status st = WF_OK;
  int C = m->d.C, E = m->d.E, K = m->d.K;
  const void *xin;
  rows r = {0};
  wf_moe_combine_backward(s->dyp, s->dw, dy, v->y, v->w, v->pos, N, K, C, (int)m->prec);
  WF_TRY(rows_read(m, v, &r));
  for (int e = 0; e < E; e++)
    if (r.count[e] > 0)
      expert_backward(m, v, s, l, e, r.off[e], r.count[e]);
  /* dy is read: the tp region's input may now be gathered again where dy was (da.full) */
  WF_TRY(wf__enter_fwd(m, &xin, n2, m->da.full, (size_t)N, (size_t)C));
  router_backward(m, v, s, xin, dx, l, N);
  wf_moe_unpermute(dx, s->dxp, v->pos, N, K, C);
fail:
  free(r.count);
  return st;
}
