/*
 * config_validate.c - the rules a config must satisfy before a job starts.
 *
 * wf_config_validate is a pure function of (config, world size): no I/O, no clock,
 * no environment, so every rank reaches the same verdict and the same message and
 * main() can print it once. Rules run in a fixed order and the first failure wins;
 * each message names the keys, their values, and what to change.
 *
 * Derived values (mesh.dp when 0, model.padded_vocab, train.seq_len when 0) are
 * computed on a copy and written back only when every rule passes. A value
 * derived earlier (source WF_SRC_DERIVED) is derived again, so validating twice,
 * or after changing mesh.tp, gives the same answer as validating once.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "config_int.h"

typedef struct vctx {
  wf_config *c; /* the working copy */
  int world;    /* the real world size, or dist.world_size, or 0 = unknown */
  char *err;
  size_t err_len;
} vctx;

typedef wf_status (*rule_fn)(vctx *v);

/* The model's rules on the model.* keys (worker/model's families), set once at start-up:
 * part of the runtime context, as the runtime sits below the model. */
static wf_config_model_check model_check;

void wf_config_set_model_check(wf_config_model_check fn) { model_check = fn; }

static wf_status fail(vctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static wf_status fail(vctx *v, const char *fmt, ...)
{
  if (v->err && v->err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->err, v->err_len, fmt, ap);
    va_end(ap);
  }
  return WF_ECONFIG;
}

static bool is_derived(const wf_config *c, const char *key)
{
  return c->source[wf_config_key_find(key)] == WF_SRC_DERIVED;
}

/* ---- ranges (the key table's, for configs not built through wf_config_set) ------ */

static wf_status check_number(vctx *v, const wf__cfg_key *k, double x, const char *suffix)
{
  char range[96];
  if (wf__cfg_in_range(k, x))
    return WF_OK;
  wf__cfg_range_str(k, range, sizeof range);
  return fail(v, "%s%s=%.15g is out of range; it must be %s", k->name, suffix, x, range);
}

static wf_status check_key(vctx *v, const wf__cfg_key *k)
{
  const char *p = (const char *)v->c + k->off;
  char names[128], idx[16];
  switch (k->type) {
  case WF__CT_INT: return check_number(v, k, *(const int *)p, "");
  case WF__CT_DOUBLE: return check_number(v, k, *(const double *)p, "");
  case WF__CT_ENUM:
    for (int i = 0; k->enums[i].name; i++)
      if (k->enums[i].value == *(const int *)p)
        return WF_OK;
    wf__cfg_enum_names(k->enums, names, sizeof names);
    return fail(v, "%s=%d is not one of %s", k->name, *(const int *)p, names);
  case WF__CT_INTLIST: {
    int n = (k->flags & WF__KF_FIXED_LEN) ? (int)k->cap
                                          : *(const int *)((const char *)v->c + k->count_off);
    if (n < 0 || n > (int)k->cap)
      return fail(v, "%s has %d entries; at most %zu are allowed", k->name, n, k->cap);
    for (int i = 0; i < n; i++) {
      snprintf(idx, sizeof idx, "[%d]", i);
      if (check_number(v, k, ((const int *)p)[i], idx) != WF_OK)
        return WF_ECONFIG;
    }
    return WF_OK;
  }
  case WF__CT_DBLLIST: {
    int n = *(const int *)((const char *)v->c + k->count_off);
    if (n < 0 || n > (int)k->cap)
      return fail(v, "%s has %d entries; at most %zu are allowed", k->name, n, k->cap);
    for (int i = 0; i < n; i++) {
      snprintf(idx, sizeof idx, "[%d]", i);
      if (check_number(v, k, ((const double *)p)[i], idx) != WF_OK)
        return WF_ECONFIG;
    }
    return WF_OK;
  }
  default: return WF_OK;
  }
}

static wf_status rule_ranges(vctx *v)
{
  for (int i = 0; i < wf__cfg_nkeys; i++)
    if (!(wf__cfg_keys[i].flags & WF__KF_DERIVED) && check_key(v, &wf__cfg_keys[i]) != WF_OK)
      return WF_ECONFIG;
  return WF_OK;
}

/* ---- the distributed job ------------------------------------------------------------- */

static wf_status rule_nodes(vctx *v)
{
  const wf_config *c = v->c;
  int nn = c->dist.num_nodes, ppn = c->dist.procs_per_node;
  if (nn == 0 || ppn == 0)
    return WF_OK;
  if (c->dist.world_size && c->dist.world_size != nn * ppn)
    return fail(v,
                "dist.world_size=%d but dist.num_nodes=%d x dist.procs_per_node=%d = %d; "
                "make them agree, or leave dist.world_size unset (0)",
                c->dist.world_size, nn, ppn, nn * ppn);
  if (v->world && v->world != nn * ppn)
    return fail(v,
                "dist.num_nodes=%d x dist.procs_per_node=%d = %d processes, but the job "
                "has %d ranks; fix the node counts or launch %d ranks",
                nn, ppn, nn * ppn, v->world, nn * ppn);
  if (c->dist.local_rank >= ppn)
    return fail(v,
                "dist.local_rank=%d is not below dist.procs_per_node=%d; local ranks run "
                "from 0 to %d",
                c->dist.local_rank, ppn, ppn - 1);
  return WF_OK;
}

static wf_status rule_world(vctx *v)
{
  const wf_config *c = v->c;
  if (c->dist.world_size && v->world && c->dist.world_size != v->world)
    return fail(v,
                "dist.world_size=%d but the job has %d ranks; launch %d ranks, or set "
                "dist.world_size=%d (or 0 to take it from the launcher)",
                c->dist.world_size, v->world, c->dist.world_size, v->world);
  if (!v->world)
    v->world = c->dist.world_size;
  if (v->world && c->dist.rank >= v->world)
    return fail(v, "dist.rank=%d is not below the world size %d; ranks run from 0 to %d",
                c->dist.rank, v->world, v->world - 1);
  return WF_OK;
}

static wf_status rule_mesh(vctx *v)
{
  wf_config *c = v->c;
  int tp = c->mesh.tp, pp = c->mesh.pp, cp = c->mesh.cp, mp = tp * pp * cp;
  char xcp[32] = ""; /* the cp factor, named only when there is one */
  if (cp > 1)
    snprintf(xcp, sizeof xcp, " x mesh.cp=%d", cp);
  if (is_derived(c, "mesh.dp"))
    c->mesh.dp = 0;
  if (!v->world)
    return WF_OK;
  if (c->mesh.dp == 0) {
    if (v->world % mp != 0)
      return fail(v,
                  "mesh.tp=%d x mesh.pp=%d%s = %d does not divide the world size %d, so "
                  "mesh.dp cannot be derived; choose mesh.tp%s and mesh.pp whose product "
                  "divides %d",
                  tp, pp, xcp, mp, v->world, cp > 1 ? ", mesh.cp" : "", v->world);
    c->mesh.dp = v->world / mp;
    return WF_OK;
  }
  long long prod = (long long)c->mesh.dp * mp;
  if (prod != v->world)
    return fail(v,
                "mesh.dp=%d x mesh.tp=%d x mesh.pp=%d%s = %lld, but the world size is %d; "
                "make the product %d, or leave mesh.dp unset (0) to derive it",
                c->mesh.dp, tp, pp, xcp, prod, v->world, v->world);
  return WF_OK;
}

/* Context parallelism gives each cp rank chunks i and 2cp-1-i of every sequence (the
 * causal work balanced), so a sequence is 2cp equal chunks; what runs on a whole
 * sequence at once on one rank (a printed sample, HSDP's groups that would have to
 * tile dp x cp) is refused rather than run wrong. */
static wf_status rule_cp(vctx *v)
{
  const wf_config *c = v->c;
  int cp = c->mesh.cp, T = c->train.seq_len ? c->train.seq_len : c->model.seq_len;
  if (cp == 1)
    return WF_OK;
  if (T % (2 * cp) != 0)
    return fail(v,
                "mesh.cp=%d splits each sequence into 2 x cp = %d chunks (chunks i and "
                "2cp-1-i per rank), but train.seq_len=%d is not divisible by %d; use a "
                "seq_len that is a multiple of %d",
                cp, 2 * cp, T, 2 * cp, 2 * cp);
  if (c->parallel.sequence && (T / cp) % c->mesh.tp != 0)
    return fail(v,
                "parallel.sequence splits each cp rank's %d tokens (train.seq_len=%d / "
                "mesh.cp=%d) over mesh.tp=%d, which does not divide them; use a seq_len "
                "divisible by cp x tp = %d",
                T / cp, T, cp, c->mesh.tp, cp * c->mesh.tp);
  if (c->mesh.fsdp > 0 || c->mesh.fsdp_axis)
    return fail(v,
                "mesh.cp=%d cannot run with HSDP (mesh.fsdp or an fsdp mesh axis): its "
                "shard groups would have to tile dp x cp; use optim.zero=1, 2 or 3 over "
                "all dp x cp ranks instead",
                cp);
  if (c->train.sample_every > 0)
    return fail(v,
                "train.sample_every=%d generates from whole sequences on one rank, which "
                "mesh.cp=%d splits over ranks; set train.sample_every=0 (or sample from a "
                "saved model with --generate on a mesh without cp)",
                c->train.sample_every, cp);
  return WF_OK;
}

/* Expert parallelism: groups of ep consecutive dp ranks shard the experts (Megatron-Core
 * carves it from the data-parallel ranks), so ep divides dp. */
static wf_status rule_ep(vctx *v)
{
  const wf_config *c = v->c;
  int ep = c->mesh.ep, dp = c->mesh.dp;
  if (ep <= 1)
    return WF_OK;
  if (dp > 0 && dp % ep != 0)
    return fail(v,
                "mesh.ep=%d does not divide mesh.dp=%d; expert parallelism shards the experts over "
                "groups of ep consecutive data-parallel ranks, so choose an ep that divides %d (or "
                "more dp ranks)",
                ep, dp, dp);
  if (c->mesh.fsdp > 0 && c->mesh.fsdp < dp)
    return fail(v,
                "mesh.ep=%d with mesh.fsdp=%d: expert parallelism beside HSDP's replicas is "
                "not supported; remove mesh.fsdp or set mesh.ep=1",
                ep, c->mesh.fsdp);
  if (c->train.checkpoint_dir[0] || c->train.resume[0])
    return fail(v,
                "mesh.ep=%d with train.checkpoint_dir or train.resume: checkpoints of an "
                "expert-parallel mesh are not supported yet (each ep rank holds other experts); "
                "train with mesh.ep=1 to checkpoint, or keep the weights with --save",
                ep);
  if (c->precision == WF_PREC_FP16)
    return fail(v,
                "mesh.ep=%d with precision=fp16: fp16 loss scaling is not supported under "
                "expert parallelism; use precision=bf16 or no",
                ep);
  return WF_OK;
}

/* ZeRO shards over dp ranks; HSDP's fsdp groups tile the dp axis and shard with ZeRO. */
static wf_status rule_fsdp(vctx *v)
{
  wf_config *c = v->c;
  int f = c->mesh.fsdp, dp = c->mesh.dp, zk = wf_config_key_find("optim.zero");
  /* An fsdp axis (or mesh.fsdp) shards the parameters within it, as the seeds and JAX
   * mean it: ZeRO-3, unless optim.zero is given. One dp rank has nothing to shard. */
  bool given = c->source[zk] != WF_SRC_DEFAULT && c->source[zk] != WF_SRC_PRESET &&
               c->source[zk] != WF_SRC_DERIVED;
  if ((c->mesh.fsdp_axis || f > 0) && !given && v->world && dp > 1) {
    c->optim.zero = 3;
    c->source[zk] = WF_SRC_DERIVED;
  }
  if (c->optim.zero > 0 && v->world && dp == 1 && c->mesh.cp == 1)
    return fail(v,
                "optim.zero=%d shards over the data-parallel ranks (dp x cp), but mesh.dp=1 "
                "has one: there is nothing to shard; remove optim.zero or use mesh.dp >= 2",
                c->optim.zero);
  if (f == 0)
    return WF_OK;
  if (c->optim.zero == 0)
    return fail(v,
                "mesh.fsdp=%d shards with ZeRO inside groups of %d dp ranks, but optim.zero=0 "
                "shards nothing; set optim.zero=1, 2 or 3 (3, FSDP, is what an fsdp axis means "
                "when optim.zero is not given), or remove mesh.fsdp",
                f, f);
  if (dp > 0 && dp % f != 0)
    return fail(v,
                "mesh.fsdp=%d does not divide mesh.dp=%d; the fsdp groups must tile the dp "
                "ranks (choose a divisor of %d)",
                f, dp, dp);
  return WF_OK;
}

/* ---- RoPE scaling (shared with worker/model, which resolves and checks model dims) ---- */

wf_rope_scaling wf_rope_scaling_resolve(const wf_rope_scaling *s)
{
  if (s->rope_type == WF_ROPE_NONE) /* nothing to compare or record */
    return (wf_rope_scaling){0};
  wf_rope_scaling r = *s;
  r.factor = r.factor > 0 ? r.factor : 8.0;
  r.low_freq_factor = r.low_freq_factor > 0 ? r.low_freq_factor : 1.0;
  r.high_freq_factor = r.high_freq_factor > 0 ? r.high_freq_factor : 4.0;
  if (r.original_max_position_embeddings <= 0)
    r.original_max_position_embeddings = 8192;
  return r;
}

/* Hugging Face's _validate_llama3_parameters, with its warnings as errors: a scaling
 * outside them is not one a checkpoint was trained with. */
const char *wf_rope_scaling_check(const wf_rope_scaling *s)
{
  if (s->rope_type == WF_ROPE_NONE)
    return NULL;
  if (s->rope_type != WF_ROPE_LLAMA3)
    return "rope_scaling's rope_type is not one weft implements (none, llama3)";
  if (!(s->factor >= 1))
    return "rope_scaling's factor must be at least 1";
  if (!(s->low_freq_factor > 0 && s->high_freq_factor > s->low_freq_factor))
    return "rope_scaling's high_freq_factor must exceed its low_freq_factor (> 0)";
  if (s->original_max_position_embeddings <= 0)
    return "rope_scaling's original_max_position_embeddings must be positive";
  return NULL;
}

static wf_status rule_rope_scaling(vctx *v)
{
  wf_rope_scaling r = wf_rope_scaling_resolve(&v->c->model.rope_scaling);
  const char *bad = wf_rope_scaling_check(&r);
  if (bad)
    return fail(v,
                "model.rope_scaling (factor %g, low_freq_factor %g, high_freq_factor %g, "
                "original_max_position_embeddings %d): %s; 0 leaves a field at Llama 3.1's "
                "value (8, 1, 4, 8192)",
                r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings,
                bad);
  return WF_OK;
}

/* ---- the model and its partition ----------------------------------------------------- */

/* Grouped-query attention and the MLP under tensor parallelism: each rank holds whole
 * kv heads (Megatron's num_query_groups % tp) and an equal part of the hidden units. */
static wf_status rule_gqa(vctx *v)
{
  wf_config *c = v->c;
  int tp = c->mesh.tp, kv = c->model.kv_heads ? c->model.kv_heads : c->model.heads;
  int ffn = c->model.ffn ? c->model.ffn : 4 * c->model.d_model;
  if (c->model.heads % kv != 0)
    return fail(v,
                "model.kv_heads=%d does not divide model.heads=%d; each key/value head serves "
                "an equal group of query heads",
                kv, c->model.heads);
  if (kv % tp != 0)
    return fail(v,
                "mesh.tp=%d does not divide the %d key/value heads (model.kv_heads); tensor "
                "parallelism gives each rank whole kv heads, so choose a tp that divides %d",
                tp, kv, kv);
  if (ffn % tp != 0)
    return fail(v,
                "mesh.tp=%d does not divide the MLP's width %d (model.ffn); choose a tp that "
                "divides it",
                tp, ffn);
  return WF_OK;
}

/* Which families exist and what each one's keys allow are the model's to say
 * (model_check, first: the first failure wins); the rest is what any family needs of
 * its partition. */
static wf_status rule_model(vctx *v)
{
  wf_config *c = v->c;
  int tp = c->mesh.tp, vp = wf__cfg_pad_vocab(c->model.vocab);
  c->model.padded_vocab = vp;
  wf_status st = model_check(c, v->err, v->err_len);
  if (st == WF_OK)
    st = rule_rope_scaling(v);
  if (st != WF_OK)
    return st;
  if (c->model.d_model % c->model.heads != 0)
    return fail(v,
                "model.d_model=%d is not divisible by model.heads=%d; choose d_model as a "
                "multiple of the head count",
                c->model.d_model, c->model.heads);
  if (c->model.heads % tp != 0)
    return fail(v,
                "mesh.tp=%d does not divide model.heads=%d; tensor parallelism gives each "
                "rank whole heads, so choose a tp that divides %d",
                tp, c->model.heads, c->model.heads);
  if (c->model.d_model % tp != 0)
    return fail(v, "mesh.tp=%d does not divide model.d_model=%d; choose a tp that divides %d", tp,
                c->model.d_model, c->model.d_model);
  if (vp % tp != 0)
    return fail(v,
                "mesh.tp=%d does not divide the padded vocabulary %d (model.vocab=%d "
                "rounded up to a multiple of 128); choose a tp that divides %d",
                tp, vp, c->model.vocab, vp);
  return rule_gqa(v);
}

static wf_status rule_pp_layers(vctx *v)
{
  const wf_config *c = v->c;
  int n = c->parallel.n_pp_layers, sum = 0;
  if (n == 0)
    return WF_OK;
  if (n != c->mesh.pp)
    return fail(v,
                "parallel.pp_layers has %d entries but mesh.pp=%d; give one layer count "
                "per pipeline stage, or [] to balance automatically",
                n, c->mesh.pp);
  for (int i = 0; i < n; i++)
    sum += c->parallel.pp_layers[i];
  if (sum != c->model.layers)
    return fail(v,
                "parallel.pp_layers adds up to %d layers but model.layers=%d; the counts "
                "must add up to %d",
                sum, c->model.layers, c->model.layers);
  return WF_OK;
}

static wf_status rule_pipeline(vctx *v)
{
  const wf_config *c = v->c;
  int pp = c->mesh.pp, vs = c->parallel.virtual_stages, L = c->model.layers;
  if (pp > L)
    return fail(v,
                "mesh.pp=%d is more than model.layers=%d; every pipeline stage needs at "
                "least one layer, so use mesh.pp <= %d",
                pp, L, L);
  if (c->train.schedule != WF_SCHED_INTERLEAVED) {
    if (vs != 1)
      return fail(v,
                  "parallel.virtual_stages=%d only applies to train.schedule=interleaved; "
                  "set train.schedule=interleaved or parallel.virtual_stages=1",
                  vs);
    return rule_pp_layers(v);
  }
  if (vs < 2)
    return fail(v,
                "train.schedule=interleaved needs parallel.virtual_stages >= 2 (it is %d); "
                "set parallel.virtual_stages=2 or use train.schedule=1f1b",
                vs);
  if (L % (pp * vs) != 0)
    return fail(v,
                "model.layers=%d is not divisible by mesh.pp=%d x parallel.virtual_stages=%d "
                "= %d; the interleaved schedule gives every model chunk the same number "
                "of layers",
                L, pp, vs, pp * vs);
  if (c->train.microbatches % pp != 0)
    return fail(v,
                "train.microbatches=%d is not a multiple of mesh.pp=%d; the interleaved "
                "schedule needs whole rounds of microbatches",
                c->train.microbatches, pp);
  return rule_pp_layers(v);
}

/* ---- training ------------------------------------------------------------------------- */

static wf_status rule_batch(vctx *v)
{
  const wf_config *c = v->c;
  int B = c->train.batch_size, dp = c->mesh.dp, mb = c->train.microbatches;
  if (dp == 0) /* world unknown: check what does not need dp */
    dp = 1;
  if (B % dp != 0)
    return fail(v, "train.batch_size=%d is not divisible by mesh.dp=%d; use a multiple of %d", B,
                dp, dp);
  if ((B / dp) % mb != 0)
    return fail(v,
                "train.microbatches=%d does not divide the per-dp batch %d "
                "(train.batch_size=%d / mesh.dp=%d); choose microbatches that divide %d",
                mb, B / dp, B, dp, B / dp);
  return WF_OK;
}

static wf_status rule_seq(vctx *v)
{
  wf_config *c = v->c;
  if (c->train.seq_len == 0 || is_derived(c, "train.seq_len"))
    c->train.seq_len = c->model.seq_len;
  if (c->train.seq_len > c->model.seq_len)
    return fail(v,
                "train.seq_len=%d is more than model.seq_len=%d (the context length); lower "
                "train.seq_len or raise model.seq_len",
                c->train.seq_len, c->model.seq_len);
  if (c->parallel.sequence && c->train.seq_len % c->mesh.tp != 0)
    return fail(v,
                "parallel.sequence splits the sequence over mesh.tp=%d, but train.seq_len=%d "
                "is not divisible by it; use a seq_len divisible by %d",
                c->mesh.tp, c->train.seq_len, c->mesh.tp);
  return WF_OK;
}

static wf_status rule_train(vctx *v)
{
  const wf_config *c = v->c;
  if (c->train.min_lr > c->train.lr)
    return fail(v,
                "train.min_lr=%g is above train.lr=%g; the schedule decays from lr down to "
                "min_lr, so use min_lr <= lr",
                c->train.min_lr, c->train.lr);
  if (c->train.trace_steps[0] > c->train.trace_steps[1])
    return fail(v,
                "train.trace_steps=[%d, %d] ends before it starts; write [first, last] "
                "with first <= last",
                c->train.trace_steps[0], c->train.trace_steps[1]);
  if (c->train.eval_every > 0 && c->train.eval_batches == 0)
    return fail(v,
                "train.eval_every=%d but train.eval_batches=0; set eval_batches >= 1, or "
                "train.eval_every=0 to turn evaluation off",
                c->train.eval_every);
  if (c->dist.master_port && c->dist.master_port == c->runtime.metrics_port)
    return fail(v,
                "dist.master_port and runtime.metrics_port are both %d; use two different "
                "ports",
                c->dist.master_port);
  /* the job file's name and the console's argument: no path, no spaces, no prefix of an
   * option */
  const char *name = c->runtime.job_name;
  if (name[0] &&
      (strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
           strlen(name) ||
       name[0] == '-' || name[0] == '.'))
    return fail(v,
                "runtime.job_name='%s': a job name is letters, digits, '.', '_' and '-', and "
                "starts with a letter or a digit (e.g. runtime.job_name=gpt2-run1)",
                name);
  return WF_OK;
}

/* ---- precision ------------------------------------------------------------------------ */

static bool is_set(const wf_config *c, const char *key)
{
  uint8_t src = c->source[wf_config_key_find(key)];
  return src != WF_SRC_DEFAULT && src != WF_SRC_DERIVED;
}

/* Loss scaling belongs to fp16: bf16 has fp32's exponent range and fp32 needs none, so
 * a loss-scaling key set for another precision would silently do nothing; it is
 * refused, as a user who set it expects an effect (Megatron ignores --loss-scale under
 * bf16, which hides a config mistake). Likewise a fixed scale has no start or window. */
static wf_status rule_precision(vctx *v)
{
  const wf_config *c = v->c;
  static const char *const keys[] = {"optim.loss_scale", "optim.loss_scale_init",
                                     "optim.loss_scale_window"};
  for (size_t i = 0; i < WF_ARRAY_LEN(keys) && c->precision != WF_PREC_FP16; i++)
    if (is_set(c, keys[i]))
      return fail(v,
                  "%s is set but precision=%s: loss scaling applies only to precision=fp16 "
                  "(bf16 has fp32's exponent range and needs none); remove %s or set "
                  "precision=fp16",
                  keys[i], c->precision == WF_PREC_BF16 ? "bf16" : "no", keys[i]);
  for (size_t i = 1; i < WF_ARRAY_LEN(keys) && c->optim.loss_scale > 0; i++)
    if (is_set(c, keys[i]))
      return fail(v,
                  "%s is set but optim.loss_scale=%g is a fixed scale; %s only shapes the "
                  "dynamic scale (optim.loss_scale=0): remove one of them",
                  keys[i], c->optim.loss_scale, keys[i]);
  return WF_OK;
}

/* ---- data ----------------------------------------------------------------------------- */

/* Validation data comes from one place: separate files (data.val_path) replace the
 * held-out tail, so a data.val_fraction set beside them would silently do nothing.
 * Whether the files exist and what they hold is I/O, checked by wf_data_check. */
static wf_status rule_data(vctx *v)
{
  const wf_config *c = v->c;
  if (c->data.val_path[0] && is_set(c, "data.val_fraction"))
    return fail(v,
                "data.val_fraction=%g is set but data.val_path='%s' names the validation "
                "data, which replaces the held-out fraction; remove one of them",
                c->data.val_fraction, c->data.val_path);
  if (c->data.val_path[0] && !c->data.path[0] && !c->data.n_source)
    return fail(v,
                "data.val_path='%s' is set but data.path is empty (the synthetic source, "
                "which makes its own validation batches); set data.path too, or remove "
                "data.val_path",
                c->data.val_path);
  return WF_OK;
}

/* Streaming sources (data.source) replace data.path; their weights and text keys pair
 * with them one to one. What the files hold is wf_data_check's. */
static wf_status rule_stream(vctx *v)
{
  const wf_config *c = v->c;
  int n = c->data.n_source;
  if (n > 0 && c->data.path[0])
    return fail(v,
                "data.source (%d JSON Lines source%s) and data.path='%s' both name the training "
                "data; keep one of them",
                n, n == 1 ? "" : "s", c->data.path);
  if (n == 0 && c->data.n_mix > 0)
    return fail(v, "data.mix is set but data.source is empty; data.mix weighs data.source's "
                   "sources, one weight each");
  if (n == 0 && c->data.document_mask)
    return fail(v, "data.document_mask=true needs data.source: documents are packed (and kept "
                   "apart) only from JSON Lines sources");
  if (c->data.document_mask && c->mesh.cp > 1)
    return fail(v,
                "data.document_mask=true with mesh.cp=%d: context parallelism's ring attention "
                "does not keep to documents; use mesh.cp=1 (tensor, pipeline and data "
                "parallelism all take document masks)",
                c->mesh.cp);
  if (c->data.n_mix > 0 && c->data.n_mix != n)
    return fail(v,
                "data.mix has %d weight%s but data.source has %d source%s; give one weight per "
                "source, in the same order (or none, for equal weights)",
                c->data.n_mix, c->data.n_mix == 1 ? "" : "s", n, n == 1 ? "" : "s");
  if (n > 0 && c->data.n_field != 1 && c->data.n_field != n)
    return fail(v,
                "data.field has %d names but data.source has %d sources; give one name for "
                "every source, or one per source",
                c->data.n_field, n);
  if (n > 0 && is_set(c, "data.val_fraction"))
    return fail(v, "data.val_fraction is set but a data.source stream has no end to hold out; "
                   "remove it, and name validation data (JSON Lines) with data.val_path");
  return WF_OK;
}

static const rule_fn rules[] = {rule_ranges, rule_nodes, rule_world,    rule_mesh,      rule_ep,
                                rule_fsdp,   rule_model, rule_pipeline, rule_batch,     rule_seq,
                                rule_cp,     rule_data,  rule_stream,   rule_precision, rule_train};

/* A derived value is marked as such; a key that was derived before but is not now
 * (the world became unknown) goes back to its default's standing. */
static void set_derived(wf_config *cfg, const char *key, bool derived)
{
  uint8_t *s = &cfg->source[wf_config_key_find(key)];
  if (derived)
    *s = WF_SRC_DERIVED;
  else if (*s == WF_SRC_DERIVED)
    *s = WF_SRC_DEFAULT;
}

wf_status wf_config_validate(wf_config *cfg, int world_size, char *err, size_t err_len)
{
  if (!cfg || world_size < 0)
    return WF_EINVAL;
  if (!model_check) { /* a caller bug: the model's rules would be skipped */
    if (err && err_len)
      snprintf(err, err_len,
               "wf_config_validate: no model check; call "
               "wf_config_set_model_check(wf_model_config_check) first");
    return WF_EINVAL;
  }
  wf_config work = *cfg;
  vctx v = {&work, world_size, err, err_len};
  for (size_t i = 0; i < WF_ARRAY_LEN(rules); i++)
    if (rules[i](&v) != WF_OK)
      return WF_ECONFIG;
  bool dp_derived = work.mesh.dp != 0 && (cfg->mesh.dp == 0 || is_derived(cfg, "mesh.dp"));
  bool seq_derived = cfg->train.seq_len == 0 || is_derived(cfg, "train.seq_len");
  *cfg = work;
  set_derived(cfg, "mesh.dp", dp_derived);
  set_derived(cfg, "train.seq_len", seq_derived);
  set_derived(cfg, "model.padded_vocab", true);
  return WF_OK;
}
