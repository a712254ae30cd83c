/*
 * search.c - worker --plan: every mesh of the world ranked by predicted tokens/s.
 *
 * Enumerated: tp (dividing the world, inside a node), pp, dp = world / (tp pp); the
 * micro-batch count (every divisor of the per-dp batch up to 64); the schedule (1F1B,
 * GPipe, interleaved with 2 or 4 virtual stages); with dp > 1 ZeRO 1, 2 and 3 (3 also
 * with reshard_after_forward=false), each over all of dp or, as HSDP, over fsdp groups
 * of every proper divisor of dp; sequence parallelism (tp > 1); recompute; the
 * precision (fp32 and bf16 on a GPU; on a CPU, the config's); and, when sequences are long
 * (CP_MIN_T tokens and more) on hardware with block attention kernels (the CPU), context
 * parallelism: every cp dividing the world whose 2 x cp chunks divide the sequence, ring
 * and all-gather; for a mixture of experts, expert parallelism: every ep dividing dp and
 * the experts. Each candidate goes through the
 * config's own validation (which refuses ZeRO with one dp rank; ZeRO-2/3 with the interleaved
 * schedule and HSDP with checkpoints are ranked like any other), the model's shard rules, then
 * memory against the limit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "plan_int.h"

#define GIB      (1024.0 * 1024.0 * 1024.0)
#define MAX_M    64
#define MAX_PLAN 200000
/* Sequences from which --plan also tries context parallelism: at 4096 tokens a block's
 * attention (4 T^2 hs per head, forward) passes its GEMMs (24 T C^2 / heads) at the
 * head sizes and widths of the presets, so splitting the sequence starts to pay;
 * Megatron-Core's and torchtitan's long-context recipes start there or later. */
#define CP_MIN_T 4096

typedef struct search {
  const wf_config *cfg;
  wf_model_dims d;
  const wf_hw *hw;
  const wf_kset *k;
  int world;
  double limit;
  wf__plan *plans;
  int n, cap;
} search;

void wf_plan_reset_mesh(wf_config *cfg)
{
  cfg->mesh.dp = 0, cfg->mesh.tp = 1, cfg->mesh.pp = 1, cfg->mesh.fsdp = 0, cfg->mesh.cp = 1;
  cfg->train.microbatches = 1;
  cfg->train.schedule = WF_SCHED_1F1B;
  cfg->parallel.virtual_stages = 1;
  cfg->parallel.n_pp_layers = 0;
  cfg->dist.world_size = 0, cfg->dist.num_nodes = 0, cfg->dist.procs_per_node = 0;
}

/* The config of candidate m, validated as a launch would be; NULL reason = valid. */
static bool valid(const search *s, const wf_plan_mesh *m, char *reason, size_t len)
{
  wf_config c = *s->cfg;
  c.mesh.dp = m->dp, c.mesh.tp = m->tp, c.mesh.pp = m->pp;
  c.mesh.cp = m->cp > 1 ? m->cp : 1;
  c.mesh.ep = m->ep > 1 ? m->ep : 1;
  c.parallel.cp_mode = m->cp_mode;
  c.train.microbatches = m->M;
  c.train.schedule = m->kind;
  c.parallel.virtual_stages = m->v;
  c.optim.zero = m->zero;
  c.mesh.fsdp = m->fsdp;
  c.parallel.reshard_after_forward = !m->keep;
  c.parallel.sequence = m->sp;
  c.parallel.activation_checkpointing = m->recompute;
  c.precision = m->prec;
  c.dist.world_size = 0, c.dist.num_nodes = 0, c.dist.procs_per_node = 0;
  if (s->d.NH % m->tp || s->d.KV % m->tp || s->d.C % m->tp || s->d.F % m->tp || s->d.Vp % m->tp) {
    snprintf(reason, len,
             "tp %d does not divide the %d heads (%d kv), d_model %d, the MLP's %d and padded "
             "vocab %d",
             m->tp, s->d.NH, s->d.KV, s->d.C, s->d.F, s->d.Vp);
    return false;
  }
  if (m->sp && ((size_t)m->B * m->T / (size_t)(m->cp > 1 ? m->cp : 1)) % (size_t)m->tp) {
    snprintf(reason, len, "sequence parallelism needs B*T = %d x %d divisible by tp %d", m->B, m->T,
             m->tp);
    return false;
  }
  return wf_config_validate(&c, s->world, reason, len) == WF_OK;
}

/* Memory (the largest stage; dp rank 0 holds the largest ZeRO shard) and time of a
 * valid candidate; over the limit it is left out, saying where. */
static wf_status evaluate(const search *s, wf__plan *p)
{
  wf_status st = WF_OK;
  p->peak = 0, p->peak_stage = 0;
  for (int r = 0; r < p->m.pp; r++) {
    wf_plan_stage_mem sm;
    WF_TRY(wf_plan_stage_mem_get(&s->d, &p->m, r, 0, s->k, &sm));
    if (sm.total > p->peak)
      p->peak = sm.total, p->peak_stage = r;
  }
  if ((double)p->peak > s->limit) {
    snprintf(p->reason, sizeof p->reason, "%.2f GiB > %.2f GiB on stage %d", p->peak / GIB,
             s->limit / GIB, p->peak_stage);
    return WF_OK;
  }
  st = wf_plan_time_get(&s->d, &p->m, s->hw, &p->t);
fail:
  return st;
}

static wf_status add(search *s, const wf_plan_mesh *m)
{
  wf_status st = WF_OK;
  if (s->n >= MAX_PLAN)
    return WF_OK;
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 1024;
    wf__plan *p = realloc(s->plans, (size_t)cap * sizeof *p);
    WF_CHECK_ALLOC(p);
    s->plans = p, s->cap = cap;
  }
  wf__plan *p = &s->plans[s->n++];
  memset(p, 0, sizeof *p);
  p->m = *m;
  if (valid(s, m, p->reason, sizeof p->reason))
    st = evaluate(s, p);
fail:
  return st;
}

/* The dp sharding of one candidate: ZeRO 0; ZeRO 1, 2, 3 and 3 kept gathered (dp > 1),
 * over all of dp (fsdp 0) or over fsdp groups of each proper divisor of dp (HSDP). */
static wf_status add_sharding(search *s, wf_plan_mesh m)
{
  wf_status st = WF_OK;
  static const struct {
    int zero;
    bool keep;
  } zs[] = {{0, false}, {1, false}, {2, false}, {3, false}, {3, true}};
  for (int zi = 0; zi < (m.dp * (m.cp > 1 ? m.cp : 1) > 1 ? 5 : 1); zi++)
    for (int f = 0; f < (m.cp > 1 || m.ep > 1 ? 1 : m.dp); f++) { /* HSDP: neither cp nor ep */
      if (f == 1 || (f > 1 && (zs[zi].zero == 0 || m.dp % f)))
        continue;
      m.zero = zs[zi].zero, m.keep = zs[zi].keep, m.fsdp = f;
      WF_TRY(add(s, &m));
      if (m.zero == 0)
        break;
    }
fail:
  return st;
}

/* The options of one (dp, tp, pp, M): schedule and virtual stages, the dp sharding,
 * sequence parallelism, recompute, precision. */
static wf_status add_options(search *s, wf_plan_mesh m)
{
  wf_status st = WF_OK;
  static const struct {
    wf_schedule_kind kind;
    int v;
  } scheds[] = {{WF_SCHED_1F1B, 1},
                {WF_SCHED_GPIPE, 1},
                {WF_SCHED_INTERLEAVED, 2},
                {WF_SCHED_INTERLEAVED, 4}};
  wf_precision precs[2] = {s->cfg->precision, WF_PREC_BF16};
  int n_prec = s->hw->gpu && s->cfg->precision != WF_PREC_BF16 ? 2 : 1;
  for (int si = 0; si < (m.pp > 1 ? 4 : 1); si++)
    for (int sp = 0; sp <= (m.tp > 1); sp++)
      for (int rc = WF_RECOMPUTE_NONE; rc <= WF_RECOMPUTE_FULL; rc++)
        for (int pi = 0; pi < n_prec; pi++) {
          m.kind = scheds[si].kind, m.v = scheds[si].v;
          m.sp = sp, m.recompute = (wf_recompute)rc, m.prec = precs[pi];
          WF_TRY(add_sharding(s, m));
        }
fail:
  return st;
}

/* The micro-batch counts of one (tp, cp, pp), each with its options; cp modes when
 * cp > 1. */
static wf_status add_batches(search *s, wf_plan_mesh m)
{
  wf_status st = WF_OK;
  int GB = s->cfg->train.batch_size, dp = m.dp;
  for (int M = 1; M <= GB / dp && M <= MAX_M; M++) {
    if ((GB / dp) % M)
      continue;
    m.M = M, m.B = GB / (dp * M);
    for (int mode = 0; mode < (m.cp > 1 ? 2 : 1); mode++) {
      m.cp_mode = mode ? WF_CP_ALLGATHER : WF_CP_RING;
      WF_TRY(add_options(s, m));
    }
  }
fail:
  return st;
}

static wf_status enumerate(search *s, const wf_plan_mesh *base)
{
  wf_status st = WF_OK;
  int W = s->world, GB = s->cfg->train.batch_size;
  /* cp only where its block attention kernels exist (the CPU's; GPU set-up refuses cp),
   * and not with document masks (its ring attention does not keep to documents) */
  bool cp_ok = base->T >= CP_MIN_T && !s->hw->gpu && !base->docs;
  int E = wf_model_dims_resolve(&s->d).E; /* 0: dense, no ep */
  int node = WF_MAX(1, s->hw->gpus_per_node), cpmax = cp_ok ? W : 1;
  for (int tp = 1; tp <= W && tp <= node; tp++) {
    if (W % tp)
      continue;
    for (int cp = 1; cp <= cpmax / tp; cp *= 2) {
      if ((W / tp) % cp || base->T % (2 * cp))
        continue;
      for (int pp = 1; pp <= W / (tp * cp) && pp <= WF_MAX_STAGES; pp++) {
        if ((W / (tp * cp)) % pp)
          continue;
        int dp = W / (tp * cp * pp);
        if (GB % dp)
          continue;
        wf_plan_mesh m = *base;
        m.dp = dp, m.tp = tp, m.pp = pp, m.cp = cp;
        m.pp_layers = NULL, m.n_pp_layers = 0;
        for (m.ep = 1; m.ep <= (E > 0 && cp == 1 ? dp : 1); m.ep++)
          if (dp % m.ep == 0 && (m.ep == 1 || E % m.ep == 0))
            WF_TRY(add_batches(s, m));
      }
    }
  }
fail:
  return st;
}

/* Kept plans by predicted tokens/s; then plans too large for memory, smallest first;
 * then invalid ones (peak 0), in enumeration order as qsort leaves them. */
static int rank_of(const wf__plan *p) { return !p->reason[0] ? 0 : p->peak > 0 ? 1 : 2; }

static int by_speed(const void *a, const void *b)
{
  const wf__plan *x = a, *y = b;
  int rx = rank_of(x), ry = rank_of(y);
  if (rx != ry)
    return rx < ry ? -1 : 1;
  if (rx == 0 && x->t.tokens_per_s != y->t.tokens_per_s)
    return x->t.tokens_per_s > y->t.tokens_per_s ? -1 : 1;
  return x->peak < y->peak ? -1 : x->peak > y->peak;
}

/* ---- output ----------------------------------------------------------------------------- */

static json_t *plan_json(const wf__plan *p)
{
  char keys[512], desc[256];
  wf__plan_keys(&p->m, keys, sizeof keys);
  wf__plan_describe(&p->m, desc, sizeof desc);
  json_t *o = json_pack("{s:s, s:s, s:I, s:i}", "plan", desc, "keys", keys, "peak_bytes",
                        (json_int_t)p->peak, "peak_stage", p->peak_stage);
  if (p->reason[0]) {
    json_object_set_new(o, "left_out", json_string(p->reason));
    return o;
  }
  json_object_set_new(o, "tokens_per_s", json_real(p->t.tokens_per_s));
  json_object_set_new(o, "step_ms", json_real(p->t.step * 1e3));
  json_object_set_new(o, "compute_ms", json_real(p->t.compute * 1e3));
  json_object_set_new(o, "tp_comm_ms", json_real(p->t.tp_comm * 1e3));
  json_object_set_new(o, "ep_comm_ms", json_real(p->t.ep_comm * 1e3));
  json_object_set_new(o, "pp_comm_ms", json_real(p->t.pp_comm * 1e3));
  json_object_set_new(o, "bubble_ms", json_real(p->t.bubble * 1e3));
  json_object_set_new(o, "dp_exposed_ms", json_real(p->t.dp_exposed * 1e3));
  json_object_set_new(o, "optim_ms", json_real(p->t.optim * 1e3));
  return o;
}

static void print_json(const search *s, int kept, FILE *out)
{
  json_t *ranked = json_array(), *left = json_array();
  for (int i = 0; i < s->n; i++)
    json_array_append_new(i < kept ? ranked : left, plan_json(&s->plans[i]));
  json_t *o = json_pack("{s:s, s:i, s:f, s:i, s:o, s:o}", "hw", s->hw->name, "world", s->world,
                        "mem_limit_bytes", s->limit, "global_batch", s->cfg->train.batch_size,
                        "plans", ranked, "left_out", left);
  if (kept > 0) {
    char keys[512];
    wf__plan_keys(&s->plans[0].m, keys, sizeof keys);
    json_object_set_new(o, "best", json_string(keys));
  }
  char *text = json_dumps(o, JSON_INDENT(2));
  if (text)
    fprintf(out, "%s\n", text);
  free(text);
  json_decref(o);
}

static void print_table(const search *s, int kept, int top, FILE *out)
{
  char desc[256];
  fprintf(out,
          "plans for %d ranks of %s (%d per node), %.1f GiB per rank, global batch %d x %d "
          "tokens, model L=%d C=%d NH=%d V=%d (%.1fM parameters): %d ranked, %d left out\n",
          s->world, s->hw->name, WF_MIN(s->world, s->hw->gpus_per_node), s->limit / GIB,
          s->cfg->train.batch_size, s->plans ? s->plans[0].m.T : 0, s->d.L, s->d.C, s->d.NH, s->d.V,
          wf_model_num_params(&s->d) * 1e-6, kept, s->n - kept);
  fprintf(out, "   # tokens/s   step_ms  peak_GiB  bubble_ms  dp_exp_ms  tp_ms  plan\n");
  for (int i = 0; i < kept && i < top; i++) {
    const wf__plan *p = &s->plans[i];
    wf__plan_describe(&p->m, desc, sizeof desc);
    fprintf(out, "%4d %9.0f %9.1f %9.2f %10.1f %10.1f %6.1f  %s\n", i + 1, p->t.tokens_per_s,
            p->t.step * 1e3, p->peak / GIB, p->t.bubble * 1e3, p->t.dp_exposed * 1e3,
            p->t.tp_comm * 1e3, desc);
  }
  int shown = 0;
  fprintf(out, "left out (%d):\n", s->n - kept);
  for (int i = kept; i < s->n && shown < top; i++, shown++) {
    wf__plan_describe(&s->plans[i].m, desc, sizeof desc);
    fprintf(out, "  %s: %s\n", desc, s->plans[i].reason);
  }
  if (s->n - kept > shown)
    fprintf(out, "  ... and %d more (--json lists every one with its reason)\n",
            s->n - kept - shown);
}

/* Why a search found nothing: the world itself, or memory. */
static void say_none(const search *s)
{
  int mem = 0; /* sorted: the plans too large come first, smallest first */
  for (int i = 0; i < s->n; i++)
    mem += s->plans[i].peak > 0;
  if (s->n == 0 || mem == 0)
    fprintf(stderr,
            "weft: error: no mesh of world size %d works for this model and batch: every "
            "dp x tp x pp = %d needs dp to divide train.batch_size %d and tp to divide the "
            "%d heads (%d candidates, all invalid; the first: %s)\n",
            s->world, s->world, s->cfg->train.batch_size, s->d.NH, s->n,
            s->n ? s->plans[0].reason : "none");
  else
    fprintf(stderr,
            "weft: error: the model fits no plan on %d ranks of %.1f GiB (%s): the smallest "
            "needs %.1f GiB per rank; add ranks or memory, or shrink the model or the batch\n",
            s->world, s->limit / GIB, s->hw->name, s->plans[0].peak / GIB);
}

int wf_plan_search(const wf_config *cfg, const wf_plan_cli *cli, FILE *out)
{
  search s = {.cfg = cfg, .d = wf_model_dims_from_config(cfg)};
  wf_hw hw;
  wf_plan_mesh base;
  char err[1024] = "";
  int rc = 1, kept = 0;
  s.world = cli->world > 0 ? cli->world : wf_plan_world(cfg);
  if (s.world < 1) {
    fprintf(stderr,
            "weft: error: world size %d is impossible: set dist.world_size (or "
            "dist.num_nodes and dist.procs_per_node) to the ranks to plan for\n",
            s.world);
    return 1;
  }
  if (wf__plan_hw(cfg, cli, s.world, &hw, err, sizeof err) != WF_OK) {
    fprintf(stderr, "weft: error: %s\n", err);
    return 1;
  }
  s.hw = &hw, s.k = wf__plan_kernels(&hw);
  s.limit = wf__plan_mem_limit(&hw, cli, s.world);
  base = (wf_plan_mesh){.T = cfg->train.seq_len > 0 ? cfg->train.seq_len : cfg->model.seq_len,
                        .threads = cfg->runtime.threads,
                        .bucket_bytes = (size_t)cfg->optim.bucket_mb << 20};
  if (enumerate(&s, &base) != WF_OK)
    goto exit;
  qsort(s.plans, (size_t)s.n, sizeof *s.plans, by_speed);
  while (kept < s.n && !s.plans[kept].reason[0])
    kept++;
  if (kept == 0) {
    say_none(&s);
    goto exit;
  }
  if (cli->json)
    print_json(&s, kept, out);
  else
    print_table(&s, kept, cli->top > 0 ? cli->top : 10, out);
  if (!cli->json) {
    char keys[512];
    wf__plan_keys(&s.plans[0].m, keys, sizeof keys);
    fprintf(out, "best: %s\n", keys);
  }
  rc = 0;
exit:
  free(s.plans);
  return rc;
}
