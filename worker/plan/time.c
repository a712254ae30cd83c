/*
 * time.c - the step time model.
 *
 * A stage's forward of one micro-batch (one model chunk): the kernels its family's
 * block runs (wf_model_costs_get: GEMMs at the rates of their shapes, attention at the
 * rate of a (T,hs)x(hs,T) GEMM per local head, norms and activations at their measured
 * per-element costs, the rest at memory bandwidth, its tp collectives: all-reduces of
 * (N,C), or their reduce-scatter + all-gather halves under sequence parallelism, the
 * same bytes), the head (N,C)x(C,Vp/tp) and the loss. Backward is twice the forward's
 * arithmetic and the same collectives; activation checkpointing adds one forward of the
 * layers. Each p2p message costs latency plus bytes over bandwidth.
 *
 * The step: the schedule's own action lists run on a clock (wf_schedule_simulate) with
 * the slowest stage's forward and backward costs, then the dp communication's exposed
 * part (dp_time: ZeRO 0-3 and HSDP), the tied embedding's sum
 * over the first and last stages, and AdamW (28 bytes per element of its range, plus
 * zeroing and the norm's pass) at memory bandwidth.
 *
 * Context parallelism (cp > 1): a rank's micro-batch is B x T/cp rows, and its attention
 * covers its T/cp query rows against all T keys under the causal mask, balanced (chunks i
 * and 2cp-1-i): cp times the attention of T/cp rows alone. Ring attention moves a
 * block's keys and values (B x T/cp rows of 2 x kv heads x head size, the activations'
 * format) to the next rank cp-1 times per layer forward, each transfer behind one block's
 * compute (a cp-th of the layer's attention); backward moves them again with the fp32
 * sum of their gradients behind a block's backward, and the last sum's transfer home is
 * exposed. What a transfer takes beyond its block is exposed. All-gather mode gathers the
 * keys and values (again in backward, then reduce-scatters their gradients), all of it
 * exposed. Gradients reduce over dp x cp.
 *
 * Expert parallelism (ep > 1): a rank's experts compute as many token rows as without it
 * on average (ep ranks' tokens for E / ep experts), so compute is unchanged and the
 * parameters (and their AdamW state) are the shard's. Each MoE layer's forward exchanges
 * its tokens' counts (E integers) and then its N K rows of C in the activations' format
 * to the experts' ranks and their outputs back (all-to-alls over the ep group, at the
 * profile's all-to-all rate), and backward the same again; none of it overlaps compute.
 * The experts' gradients reduce over dp / ep ranks, the dense ones' over dp.
 *
 * CPU ranks share the node's cores: a rank computes with cores / ranks threads when
 * there are more cores than ranks, else with one thread and that share of a core (of
 * the cores they deliver when all compute at once, busy_cores, when measured).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_int.h"
#include "storage.h"

typedef struct ctx {
  const wf_model_dims *d;
  const wf_plan_mesh *m;
  const wf_hw *hw;
  int threads;
  double share; /* the part of a core (CPU) a rank gets; 1 on a GPU */
  bool tp_intra, pp_intra, dp_intra, cp_intra, ep_intra;
  int cp;    /* context-parallel ranks (1: none) */
  double Tl; /* a rank's rows of a sequence: T / cp */
} ctx;

/* Seconds of compute a rank sees for `s` seconds of its own work. */
static double busy(const ctx *c, double s) { return s / c->share; }

static double gemm(const ctx *c, double m, double n, double k)
{
  return busy(c, wf_hw_gemm_s(c->hw, m, n, k, c->threads, c->m->prec));
}

static double mem(const ctx *c, double bytes) { return busy(c, bytes / c->hw->mem_bw); }

static double tp_allreduce(const ctx *c, double bytes)
{
  return wf_hw_allreduce_s(c->hw, bytes, c->m->tp, c->tp_intra);
}

static double ops(const ctx *c, int n) { return busy(c, n * c->hw->op_s); }

typedef struct layer_cost {
  double fwd, bwd, tp;   /* seconds: forward, backward (without recompute), tp collectives */
  double ep;             /* expert parallelism's all-to-alls of forward (backward's alike) */
  double core;           /* of fwd: attention's core, which selective recompute runs again */
  double cp, cp_exposed; /* context parallelism's traffic, and the part in fwd and bwd */
} layer_cost;

/* The family's kernels of one block, at this mesh's micro-batch. */
static void block_kernels(const ctx *c, wf_model_costs *k)
{
  const wf_plan_mesh *m = c->m;
  double N = (double)m->B * c->Tl;
  wf_cost_geo g = {.B = m->B,
                   .T = c->Tl,
                   .N = N,
                   .R = m->sp ? N / m->tp : N,
                   .tp = m->tp,
                   .keeps_probs = !c->hw->gpu};
  wf_model_costs_get(c->d, &g, k);
}

/* Elementwise work of a block, forward and backward: measured kernel costs (CPU
 * profiles: the norms and the activation, per element, at the rank's threads) plus the
 * rest (residuals, the CPU's softmax) at memory bandwidth; else all of it at memory
 * bandwidth, a norm's or activation's element read and written (8 bytes). */
static void block_elem(const ctx *c, double norm, double act, double bytes, double *f, double *b)
{
  if (c->hw->ln_s > 0) {
    double k = busy(c, (norm * c->hw->ln_s + act * c->hw->gelu_s) / c->threads);
    double r = mem(c, bytes);
    *f = k / 3 + r, *b = 2 * k / 3 + 2 * r;
    return;
  }
  double e = mem(c, bytes + 8 * norm + 8 * act);
  *f = e, *b = 2 * e;
}

/* A message of `bytes` to a neighbour: half the bandwidth term of a two-rank all-reduce
 * (the bytes it moves each way) and its latency. */
static double p2p_s(const ctx *c, double bytes, bool intra)
{
  double lat2 = wf_hw_allreduce_s(c->hw, 0, 2, intra);
  return (wf_hw_allreduce_s(c->hw, bytes, 2, intra) - lat2) / 2 + lat2;
}

/* Context parallelism's traffic for a layer whose attention takes att (forward) and
 * ab x att (backward) seconds: *all of it, and the exposed part of forward and backward. */
static void cp_traffic(const ctx *c, double att, double ab, double *all, double *xf, double *xb)
{
  const wf_plan_mesh *m = c->m;
  wf_model_dims d = wf_model_dims_resolve(c->d);
  int P = c->cp;
  double kv = (double)m->B * c->Tl * 2 * (d.KV / m->tp) * (d.C / d.NH);
  double kvb = kv * (double)wf_storage_size((int)m->prec), dkvb = kv * 4;
  *all = *xf = *xb = 0;
  if (P < 2)
    return;
  if (m->cp_mode == WF_CP_ALLGATHER) {
    double ag = wf_hw_allgather_s(c->hw, kvb * P, P, c->cp_intra);
    double rs = wf_hw_allgather_s(c->hw, dkvb * P, P, c->cp_intra); /* a reduce-scatter's bytes */
    *all = 2 * ag + rs, *xf = ag, *xb = ag + rs;
    return;
  }
  double xk = p2p_s(c, kvb, c->cp_intra), xd = p2p_s(c, dkvb, c->cp_intra);
  *all = (P - 1) * (2 * xk + xd) + xd;
  *xf = (P - 1) * fmax(0, xk - att / P);
  *xb = (P - 1) * fmax(0, xk + xd - ab * att / P) + xd;
}

/* Expert parallelism's exchanges of one layer's forward (backward makes the same): the
 * counts, the N K token rows to the experts' ranks, their outputs back. */
static double ep_traffic(const ctx *c)
{
  const wf_plan_mesh *m = c->m;
  wf_model_dims d = wf_model_dims_resolve(c->d);
  if (m->ep < 2 || d.E <= 0)
    return 0;
  double rows = (double)m->B * c->Tl * d.K; /* the router sees every row (sp gathers them) */
  double bytes = rows * d.C * (double)wf_storage_size((int)m->prec);
  double counts = wf_hw_alltoall_s(c->hw, (double)d.E * sizeof(int), m->ep, c->ep_intra);
  return counts + 2 * wf_hw_alltoall_s(c->hw, bytes, m->ep, c->ep_intra);
}

/* One transformer block, one micro-batch. */
static layer_cost block(const ctx *c)
{
  const wf_plan_mesh *m = c->m;
  wf_model_costs k;
  double g = 0, att = 0, norm = 0, act = 0, bytes = 0, tpc = 0;
  block_kernels(c, &k);
  for (int i = 0; i < k.n_block; i++) {
    const wf_cost *x = &k.block[i];
    switch (x->kind) {
    case WF_COST_GEMM: g += gemm(c, x->m, x->n, x->k); break;
    case WF_COST_ATTENTION: /* T/cp query rows against T keys: cp x the (T/cp)^2 kernel */
      att += c->cp * busy(c, wf_hw_attention_s(c->hw, x->m, x->n, x->k, c->threads, m->prec));
      break;
    case WF_COST_NORM: norm += x->m; break;
    case WF_COST_ACT: act += x->m; break;
    case WF_COST_BYTES: bytes += x->m; break;
    case WF_COST_TP: tpc += m->tp > 1 ? tp_allreduce(c, x->m) : 0; break;
    }
  }
  double gb = c->hw->matmul_bwd > 0 ? c->hw->matmul_bwd : 2; /* backward over forward */
  double ab = c->hw->attn_bwd > 0 ? c->hw->attn_bwd : 2;
  double ef, eb, cpa, xf, xb;
  block_elem(c, norm, act, bytes, &ef, &eb);
  cp_traffic(c, att, ab, &cpa, &xf, &xb);
  double ep = ep_traffic(c);
  return (layer_cost){g + att + ef + ops(c, k.block_fwd_ops) + tpc + xf + ep,
                      gb * g + ab * att + eb + ops(c, k.block_bwd_ops) + tpc + xb + ep,
                      tpc,
                      ep,
                      att + xf,
                      cpa,
                      xf + xb};
}

/* The embedding (first chunk of the first stage) and the head (last chunk of the last). */
static layer_cost ends(const ctx *c, bool first, bool last)
{
  const wf_plan_mesh *m = c->m;
  double N = (double)m->B * c->Tl, C = c->d->C, Vl = (double)c->d->Vp / m->tp;
  layer_cost r = {0, 0, 0, 0, 0, 0, 0};
  if (first) {
    double e = mem(c, 4 * 3 * N * C) + ops(c, 1);
    double tpc = m->tp > 1 ? tp_allreduce(c, N * C * 4) : 0; /* vocabulary-parallel lookup */
    r.fwd += e + tpc, r.bwd += 2 * e + tpc, r.tp += tpc;
  }
  if (last) {
    wf_model_costs k;
    block_kernels(c, &k);
    double g = gemm(c, N, Vl, C), e = mem(c, 4 * (3 * N * Vl + 4 * N * C)) + ops(c, k.head_ops);
    r.fwd += g + e, r.bwd += 2 * (g + e);
  }
  return r;
}

/* The slowest chunk's forward and backward of one micro-batch over every stage (a
 * stage's [l0, l1) is one of its chunks under interleaving), and its
 * tp and ep seconds; p2p added when there are stages. */
static wf_status stage_costs(const ctx *c, double *F, double *Bk, double *tp_s, double *ep_s,
                             double *p2p, layer_cost *Lc)
{
  wf_status st = WF_OK;
  const wf_plan_mesh *m = c->m;
  layer_cost L = block(c);
  *Lc = L;
  double io = (double)m->B * c->Tl * c->d->C * (double)wf_storage_size((int)m->prec) /
              (m->sp ? m->tp : 1); /* a message, in the activations' format */
  /* a message moves the bytes an all-reduce of two ranks moves each way, half its
   * bandwidth term; its latency is hidden: the engine posts receives ahead */
  double lat2 = wf_hw_allreduce_s(c->hw, 0, 2, c->pp_intra);
  *p2p = m->pp > 1 ? (wf_hw_allreduce_s(c->hw, io, 2, c->pp_intra) - lat2) / 2 : 0;
  *F = *Bk = *tp_s = *ep_s = 0;
  for (int r = 0; r < m->pp; r++) {
    wf_plan_stage_mem sm;
    WF_TRY(wf_plan_stage_mem_get(c->d, m, r, 0, NULL, &sm));
    int lc = sm.l1 - sm.l0;
    layer_cost e = ends(c, r == 0, r == m->pp - 1);
    bool full = m->recompute == WF_RECOMPUTE_FULL;
    double re = full ? L.fwd : m->recompute == WF_RECOMPUTE_SELECTIVE ? L.core : 0;
    double f = lc * L.fwd + e.fwd, b = lc * L.bwd + e.bwd + lc * re;
    double t = lc * L.tp * (full ? 3 : 2) + 2 * e.tp, x = lc * L.ep * (full ? 3 : 2);
    if (f + b > *F + *Bk)
      *F = f, *Bk = b, *tp_s = t, *ep_s = x;
  }
  *F += *p2p, *Bk += *p2p;
fail:
  return st;
}

/* The schedule's span for per-chunk costs F and B, by its own action lists. */
static wf_status pipeline_span(const wf_plan_mesh *m, double F, double B, double *span,
                               double *bubble)
{
  wf_status st = WF_OK;
  char err[256];
  int v = m->kind == WF_SCHED_INTERLEAVED ? m->v : 1, makespan = 0;
  wf_schedule *ranks = NULL;
  if (m->pp == 1) {
    *span = m->M * (F + B), *bubble = 0;
    return WF_OK;
  }
  double unit = (F + B) / 64; /* 64 ticks per forward + backward */
  wf_sched_cost cost = {WF_MAX(1, (int)lround(F / unit)), WF_MAX(1, (int)lround(B / unit))};
  wf_sched_params prm = {m->kind, m->pp, m->M, v};
  WF_CHECK_ALLOC(ranks = calloc((size_t)m->pp, sizeof *ranks));
  WF_CHECK(wf_schedule_init_all(ranks, &prm, err, sizeof err) == WF_OK, WF_EINVAL, "%s", err);
  WF_TRY(wf_schedule_simulate(ranks, cost, &makespan, bubble));
  *span = makespan * unit;
fail:
  if (ranks)
    wf_schedule_fini_all(ranks, m->pp);
  free(ranks);
  return st;
}

static ctx make_ctx(const wf_model_dims *d, const wf_plan_mesh *m, const wf_hw *hw)
{
  int cp = m->cp > 1 ? m->cp : 1;
  int world = m->dp * m->tp * m->pp * cp, node = WF_MAX(1, hw->gpus_per_node);
  ctx c = {d, m, hw, 1, 1, true, true, true, true, true, cp, (double)m->T / cp};
  if (!hw->gpu && hw->cores > 0) {
    int ranks = WF_MIN(world, node);
    c.threads = m->threads > 0 ? m->threads : WF_MAX(1, hw->cores / ranks);
    double cores = hw->busy_cores > 0 ? hw->busy_cores : hw->cores;
    c.share = fmin(1.0, cores / (ranks * c.threads)); /* of a core per thread */
  }
  /* tp is innermost (inside a node), then cp, then pp, then dp */
  c.tp_intra = m->tp <= node;
  c.cp_intra = m->tp * cp <= node;
  c.ep_intra = m->tp * cp * WF_MAX(1, m->ep) <= node; /* ep consecutive dp ranks */
  c.pp_intra = m->tp * cp * m->pp <= node;
  c.dp_intra = world <= node;
  return c;
}

/* The ranks ZeRO's shards span: HSDP's fsdp group, else all of dp. */
static int shard_group(const wf_plan_mesh *m)
{
  return m->fsdp > 0 && m->fsdp < m->dp ? m->fsdp : m->dp;
}

/* dp communication of a step for n parameters in nb buckets (zero.c and fsdp.c's
 * traffic): the gradient reduction, hidden behind backward up to hw->overlap of it
 * (plain dp and ZeRO-1 reduce during the last micro-batch's backward, ZeRO-2/3 during
 * every one's; all of them in-place all-reduces of buckets), ZeRO-3's parameter gathers
 * (all-gathers of the units in place, before each unit's forward and backward, or once
 * per step with reshard_after_forward=false; prefetched behind forward and backward),
 * and what follows the update, exposed: the parameters' all-gather (ZeRO-1/2) and
 * HSDP's sum of the shard over the replicas. All-gathers take the profile's measured
 * rate (wf_hw_allgather_s; half an all-reduce where it has none). The n parameters'
 * shards span f of the dp ranks (HSDP's group, else all of them). */
typedef struct dp_parts {
  double red, gathers, after, hide;
} dp_parts;

static dp_parts dp_class(const ctx *c, double n, int nb, int f, int dp, double F, double B)
{
  const wf_plan_mesh *m = c->m;
  const wf_hw *hw = c->hw;
  int mv = m->M * (m->kind == WF_SCHED_INTERLEAVED ? m->v : 1);
  /* the shard group is f consecutive dp ranks: inside a node when tp x pp x f fit */
  bool intra = c->dp_intra || m->tp * m->pp * f <= WF_MAX(1, hw->gpus_per_node);
  double ar = wf_hw_dp_allreduce_s(hw, n * 4, f, intra);
  double ag = wf_hw_allgather_s(hw, n * 4, f, intra);
  double lat = (nb - 1) * wf_hw_allreduce_s(hw, 0, f, intra);
  dp_parts r = {ar + lat, 0, 0, hw->overlap * B};
  if (f < 2)
    return (dp_parts){0, 0, 0, 0};
  if (m->zero >= 2)
    r.red = mv * (ar + lat), r.hide = hw->overlap * mv * B;
  if (m->zero == 1 || m->zero == 2)
    r.after = ag; /* the updated shards, one broadcast per owner: an all-gather's bytes */
  if (m->zero == 3) {
    r.gathers = (m->keep ? 1 : 2 * mv) * (ag + lat);
    r.hide = hw->overlap * mv * (F + B);
  }
  if (m->zero && f < dp)
    r.after += wf_hw_allreduce_s(hw, n * 4 / f, dp / f, c->dp_intra);
  return r;
}

/* The dense parameters over dp (HSDP's shard groups), the experts' (ne of the n) over
 * their dp / ep ranks, one after the other behind the same backward. */
static void dp_time(const ctx *c, double n, double ne, int nb, double F, double B,
                    wf_plan_time *out)
{
  const wf_plan_mesh *m = c->m;
  int ep = m->ep > 1 ? m->ep : 1;
  if (m->dp < 2)
    return;
  if (ep == 1)
    ne = 0;
  dp_parts d = dp_class(c, n - ne, nb, shard_group(m), m->dp, F, B);
  dp_parts x = ne > 0 ? dp_class(c, ne, nb, m->dp / ep, m->dp / ep, F, B) : (dp_parts){0, 0, 0, 0};
  double red = d.red + x.red, gathers = d.gathers + x.gathers, after = d.after + x.after;
  out->dp_comm = red + gathers + after;
  out->dp_exposed = fmax(0, red + gathers - fmax(d.hide, x.hide)) + after;
}

/* Bytes of a rank's slice of the tied embedding (0: the family's head is untied). */
static double tied_bytes(const wf_model_dims *d, const wf_plan_mesh *m)
{
  wf_model_desc desc;
  wf_model_describe(d, &desc);
  for (int t = 0; t < desc.n; t++)
    if (desc.t[t].place == WF_PLACE_TIED)
      return (double)wf_model_tensor_numel(d, t) / m->tp * 4;
  return 0;
}

wf_status wf_plan_time_get(const wf_model_dims *d, const wf_plan_mesh *m, const wf_hw *hw,
                           wf_plan_time *out)
{
  wf_status st = WF_OK;
  ctx c = make_ctx(d, m, hw);
  double F, B, tp_s, ep_s, p2p, span;
  int v = m->kind == WF_SCHED_INTERLEAVED ? m->v : 1;
  layer_cost L;
  memset(out, 0, sizeof *out);
  WF_TRY(stage_costs(&c, &F, &B, &tp_s, &ep_s, &p2p, &L));
  /* F and B are one chunk's: a shard's [l0, l1) is one chunk of its v */
  WF_TRY(pipeline_span(m, F, B, &span, &out->sim_bubble));
  double work = (double)m->M * v * (F + B);
  out->tp_comm = m->M * v * tp_s;
  out->ep_comm = m->M * v * ep_s;
  out->pp_comm = m->M * v * 2 * p2p;
  out->compute = work - out->tp_comm - out->ep_comm - out->pp_comm;
  out->bubble = fmax(0, span - work);
  wf_plan_stage_mem sm;
  WF_TRY(wf_plan_stage_mem_get(d, m, 0, 0, NULL, &sm));
  /* gradients reduce over dp x cp: the dp model over that many ranks */
  wf_plan_mesh gm = *m;
  gm.dp = m->dp * c.cp;
  ctx gc = make_ctx(d, &gm, hw);
  gc.dp_intra = c.dp_intra;
  dp_time(&gc, (double)sm.params, (double)sm.expert_params, WF_MAX(1, sm.n_buckets), F, B, out);
  int lmax = 0; /* the slowest stage's layers: ring traffic per micro-batch and chunk */
  for (int r = 0; r < m->pp; r++) {
    wf_plan_stage_mem s2;
    WF_TRY(wf_plan_stage_mem_get(d, m, r, 0, NULL, &s2));
    lmax = WF_MAX(lmax, s2.l1 - s2.l0);
  }
  out->cp_comm = m->M * v * lmax * L.cp;
  out->cp_exposed = m->M * v * lmax * L.cp_exposed;
  if (m->pp > 1 && tied_bytes(d, m) > 0) /* the tied embedding over the first and last stages */
    out->pp_comm += wf_hw_allreduce_s(hw, tied_bytes(d, m), 2, c.pp_intra);
  double n = (double)sm.params, ne = m->ep > 1 ? (double)sm.expert_params : 0;
  double range = m->zero ? (n - ne) / shard_group(m) + ne * m->ep / m->dp : n;
  out->optim = mem(&c, 28 * range + 8 * n + (m->prec != WF_PREC_NO ? 8 * n : 0));
  out->compute -= out->cp_exposed; /* inside the layers' times, reported apart */
  out->step =
      span + out->dp_exposed + (m->pp > 1 ? out->pp_comm - m->M * v * 2 * p2p : 0) + out->optim;
  out->tokens_per_s = (double)m->dp * m->M * m->B * m->T / out->step;
fail:
  return st;
}
