/*
 * prenorm.c - the pre-norm residual sublayer every family's block is two of, and the
 * normalised head every family ends with, written once for LayerNorm (GPT-2) and RMSNorm
 * (Llama, the mixture-of-experts families): the family's wf__family_ops.norm says which.
 *
 * A sublayer: n = norm(x) (the block's second one fused with the first one's residual
 * add: res = x + da.ysum, n = norm(res)) -> enter the tp region (wf__prenorm_forward) ->
 * the family's column-parallel product and what follows it -> the row-parallel product
 * -> leave, its sum in da.ysum (wf__row_parallel) -> the residual add. Backward walks it
 * back: leave's backward and the row-parallel product's (wf__row_parallel_backward), the
 * family's middle, then the column-parallel product's from the re-gathered n and the
 * norm's, which adds into the residual stream's gradient da.dres (wf__prenorm_backward).
 * Each helper calls the kernels in the order the families did by hand, so their results
 * are the same bytes.
 */
#include "model_int.h"

static float *P(wf_model *m, int t, int l) { return t >= 0 ? wf_model_param(m, t, l, 0) : NULL; }
static float *G(wf_model *m, int t, int l) { return t >= 0 ? wf_model_param(m, t, l, 1) : NULL; }

/* n->out = norm(x), or with res: res = x + da.ysum and n->out = norm(res), one op. */
static void norm_forward(wf_model *m, const wf__norm *n, void *res, const void *x, int l, int R)
{
  int C = m->d.C;
  const float *w = P(m, n->w, l), *b = P(m, n->b, l), *ys = m->da.ysum;
  float eps = m->d.norm_eps;
  if (m->ops->norm == WF__LAYERNORM && res)
    WF_K(m->k, layernorm)->residual_forward(res, n->out, n->mean, n->rstd, x, ys, w, b, R, C, NULL);
  else if (m->ops->norm == WF__LAYERNORM)
    WF_K(m->k, layernorm)->forward(n->out, n->mean, n->rstd, x, w, b, R, C, NULL);
  else if (res)
    WF_K(m->k, rmsnorm)->residual_forward(res, n->out, n->rstd, x, ys, w, eps, R, C, NULL);
  else
    WF_K(m->k, rmsnorm)->forward(n->out, n->rstd, x, w, eps, R, C, NULL);
}

void wf__norm_backward(wf_model *m, const wf__norm *n, const void *x, int l, int R)
{
  int C = m->d.C;
  float *dres = m->da.dres, *dl = m->da.dl;
  if (m->ops->norm == WF__LAYERNORM)
    WF_K(m->k, layernorm)
        ->backward(dres, G(m, n->w, l), G(m, n->b, l), dl, x, P(m, n->w, l), n->mean, n->rstd, R, C,
                   NULL);
  else
    WF_K(m->k, rmsnorm)->backward(dres, G(m, n->w, l), dl, x, P(m, n->w, l), n->rstd, R, C, NULL);
}

/* ---- the sublayer --------------------------------------------------------------------- */

wf_status wf__prenorm_forward(wf_model *m, const wf__norm *n, const void **xin, void *res,
                              const void *x, int l, int N)
{
  norm_forward(m, n, res, x, l, (int)wf__rows(m, (size_t)N));
  return wf__enter_fwd(m, xin, n->out, m->da.full, (size_t)N, (size_t)m->d.C);
}

wf_status wf__row_parallel_backward(wf_model *m, void *dx, const void *x, int w, int b, int l,
                                    int N, int IC)
{
  wf_status st = WF_OK;
  int C = m->d.C;
  const float *dy;
  WF_TRY(wf__leave_bwd(m, &dy, m->da.dres, m->da.full, (size_t)N, (size_t)C));
  WF_K(m->k, matmul)
      ->backward(dx, G(m, w, l), G(m, b, l), wf__res_grad(m, dy, (size_t)N), x,
                 wf__gemm_weight(m, w, l), N, IC, C, m->prec, NULL);
fail:
  return st;
}

wf_status wf__prenorm_backward(wf_model *m, const wf__norm *n, const void *dout, int w, int b,
                               int OC, const void *x, int l, int N)
{
  wf_status st = WF_OK;
  const void *xin;
  WF_TRY(wf__enter_fwd(m, &xin, n->out, m->da.full, (size_t)N, (size_t)m->d.C)); /* re-gathered */
  WF_TRY(wf__column_backward(m, dout, xin, w, b, l, N, OC));
  wf__norm_backward(m, n, x, l, (int)wf__rows(m, (size_t)N));
fail:
  return st;
}

/* ---- the head --------------------------------------------------------------------------- */

/* The final norm's saved state: its output (R,C), LayerNorm's means (R), the rstds (R). */
static size_t carve_head(wf__norm *h, void *mem, const wf__geo *z)
{
  wf__carve_to to = {mem, NULL, z->fmt};
  wf__carve_item ln[] = {WF__ACT(&h->out, z->R * z->C), WF__F32(&h->mean, z->R),
                         WF__F32(&h->rstd, z->R)};
  wf__carve_item rms[] = {WF__ACT(&h->out, z->R * z->C), WF__F32(&h->rstd, z->R)};
  if (z->d.fam->ops->norm == WF__LAYERNORM)
    return wf__carve(ln, WF_ARRAY_LEN(ln), &to, NULL);
  return wf__carve(rms, WF_ARRAY_LEN(rms), &to, NULL);
}

size_t wf__head_floats(const wf__geo *z) { return carve_head(&(wf__norm){0}, NULL, z); }

/* The slot's final norm, with its tensors w and b. */
static wf__norm head_at(wf_model *m, wf__slot *a, int w, int b)
{
  wf__norm h = {0};
  carve_head(&h, a->head, &m->g);
  h.w = w, h.b = b;
  return h;
}

wf_status wf__head_forward(wf_model *m, wf__slot *a, const void *x, int w, int b, int head)
{
  wf__norm h = head_at(m, a, w, b);
  norm_forward(m, &h, NULL, x, 0, (int)wf__rows(m, (size_t)a->B * a->T));
  return wf__head_loss_forward(m, a, h.out, head);
}

wf_status wf__head_backward(wf_model *m, wf__slot *a, const void *x, int w, int b, int head,
                            float dloss)
{
  wf_status st = WF_OK;
  wf__norm h = head_at(m, a, w, b);
  int R = (int)wf__rows(m, (size_t)a->B * a->T);
  WF_TRY(wf__head_loss_backward(m, a, h.out, head, dloss));
  WF_TRY(wf__zero(m, m->da.dres, (size_t)R * m->d.C));
  wf__norm_backward(m, &h, x, 0, R);
fail:
  return st;
}
