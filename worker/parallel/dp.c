/*
 * dp.c - data-parallel gradient reduction and ZeRO-1 (see wf_dp.h).
 *
 * Buckets. The llm.c layout keeps all layers of one kind together, so the gradients
 * that become final together (one layer's) are not contiguous. A bucket is therefore
 * a list of (offset, count) ranges in the flat gradient buffer, gathered in the
 * order backward finalises them: the final layernorm, then layer L-1 down to 0, then
 * the embeddings. It is packed into its own staging buffer, all-reduced in place with
 * MPI_Iallreduce (averaging), and unpacked in wf_dp_finish(). Packing costs one copy of
 * the gradients, small next to the GEMMs that produce them.
 *
 * Open MPI progresses non-blocking collectives only inside MPI calls, so every
 * readiness event also tests the buckets already in flight.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wf_check.h"
#include "wf_parallel.h"
#include "wf_kernels.h"

typedef struct range {
  size_t off, n;
} range;

typedef struct bucket {
  range *ranges;
  int n_ranges, last_group; /* launched once readiness group last_group is final */
  size_t count;
  float *stage;
  wf_req *req;
  bool launched;
} bucket;

struct wf_dp {
  wf_comm *comm;
  wf_gpt *model;
  int rank, size, zero, n_groups;
  bucket *buckets;
  int n_buckets;
  bool armed;
  wf_dp_stats stats;
  /* ZeRO-1 */
  size_t n, shard;        /* parameters, shard length ceil(n / size) */
  float *gshard, *pshard; /* (shard) averaged gradient, parameter shard to send */
  float *m, *v;           /* (shard) AdamW state */
  float *stage;           /* (size * shard) padded full vector */
};

/* The ranges that become final with readiness group g: 0 = final layernorm,
 * 1..n = this stage's local layer n-g, n+1 = embeddings (n = layers on this stage).
 * Kinds this stage does not hold are empty ranges. Returns how many were written. */
static int group_ranges(const wf_gpt *m, int g, range *out)
{
  int n = 0, nl = wf_gpt_local_layers(m);
  static const wf_param_kind head[] = {WF_P_LNFW, WF_P_LNFB}, emb[] = {WF_P_WTE, WF_P_WPE};
  if (g == 0 || g == nl + 1) {
    const wf_param_kind *k = g == 0 ? head : emb;
    for (int i = 0; i < 2; i++)
      out[n++] = (range){wf_gpt_local_offset(m, k[i]), wf_gpt_local_numel(m, k[i])};
    return n;
  }
  int j = nl - g;
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    if (!wf_gpt_kind_is_layered((wf_param_kind)k))
      continue;
    size_t ln = wf_gpt_local_layer_numel(m, (wf_param_kind)k);
    out[n++] = (range){wf_gpt_local_offset(m, (wf_param_kind)k) + (size_t)j * ln, ln};
  }
  return n;
}

static wf_status plan_buckets(wf_dp *dp, size_t bucket_bytes)
{
  wf_status st = WF_OK;
  dp->n_groups = wf_gpt_local_layers(dp->model) + 2;
  WF_CHECK_ALLOC(dp->buckets = calloc((size_t)dp->n_groups, sizeof *dp->buckets));
  bucket *b = NULL;
  for (int g = 0; g < dp->n_groups; g++) {
    if (!b) {
      b = &dp->buckets[dp->n_buckets++];
      WF_CHECK_ALLOC(b->ranges =
                         calloc((size_t)dp->n_groups * WF_GPT_NUM_KINDS, sizeof *b->ranges));
    }
    int k = group_ranges(dp->model, g, b->ranges + b->n_ranges);
    for (int i = 0; i < k; i++)
      b->count += b->ranges[b->n_ranges + i].n;
    b->n_ranges += k;
    b->last_group = g;
    if (b->count * sizeof(float) >= bucket_bytes || g == dp->n_groups - 1) {
      WF_CHECK_ALLOC(b->stage = wf_mem_alloc((b->count + 1) * sizeof(float)));
      b = NULL;
    }
  }
fail:
  return st;
}

static wf_status launch(wf_dp *dp, bucket *b)
{
  float *grads = wf_gpt_grads(dp->model), *p = b->stage;
  for (int i = 0; i < b->n_ranges; i++) {
    memcpy(p, grads + b->ranges[i].off, b->ranges[i].n * sizeof(float));
    p += b->ranges[i].n;
  }
  b->launched = true;
  dp->stats.comm_bytes += (double)b->count * sizeof(float);
  return wf_comm_iallreduce(dp->comm, b->stage, b->stage, b->count, WF_COMM_F32, WF_COMM_AVG,
                            &b->req);
}

/* The model's hook: gradients of readiness group g are final. */
static void on_grads_ready(void *user, int g)
{
  wf_dp *dp = user;
  if (!dp->armed)
    return;
  for (int i = 0; i < dp->n_buckets; i++) {
    bucket *b = &dp->buckets[i];
    bool done;
    if (b->launched && b->req)
      wf_req_test(&b->req, &done); /* drive MPI progress */
    if (!b->launched && b->last_group == g && launch(dp, b) == WF_OK)
      dp->stats.launched_early++;
  }
}

static wf_status zero_alloc(wf_dp *dp)
{
  wf_status st = WF_OK;
  dp->n = wf_gpt_local_params(dp->model);
  dp->shard = (dp->n + (size_t)dp->size - 1) / (size_t)dp->size;
  size_t sb = dp->shard * sizeof(float);
  WF_CHECK_ALLOC(dp->gshard = wf_mem_alloc(sb));
  WF_CHECK_ALLOC(dp->pshard = wf_mem_alloc(sb));
  WF_CHECK_ALLOC(dp->m = wf_mem_alloc(sb));
  WF_CHECK_ALLOC(dp->v = wf_mem_alloc(sb));
  WF_CHECK_ALLOC(dp->stage = wf_mem_alloc(sb * (size_t)dp->size));
  dp->stats.optimizer_bytes = 2 * sb;
fail:
  return st;
}

wf_status wf_dp_create(wf_dp **out, const wf_dp_opts *o)
{
  wf_status st = WF_OK;
  wf_dp *dp = calloc(1, sizeof *dp);
  WF_CHECK_ALLOC(dp);
  dp->comm = o->comm;
  dp->model = o->model;
  dp->zero = o->zero;
  dp->rank = wf_comm_rank(o->comm);
  dp->size = wf_comm_size(o->comm);
  if (dp->zero)
    WF_TRY(zero_alloc(dp));
  else {
    WF_TRY(plan_buckets(dp, o->bucket_bytes));
    dp->stats.optimizer_bytes = 2 * wf_gpt_local_params(dp->model) * sizeof(float);
  }
  dp->stats.buckets = dp->n_buckets;
  *out = dp;
  return WF_OK;
fail:
  wf_dp_destroy(dp);
  *out = NULL;
  return st;
}

void wf_dp_destroy(wf_dp *dp)
{
  if (!dp)
    return;
  wf_gpt_set_grad_hook(dp->model, NULL, NULL);
  for (int i = 0; i < dp->n_buckets; i++) {
    wf_req_wait(&dp->buckets[i].req);
    free(dp->buckets[i].ranges);
    wf_mem_free(dp->buckets[i].stage);
  }
  free(dp->buckets);
  wf_mem_free(dp->gshard);
  wf_mem_free(dp->pshard);
  wf_mem_free(dp->m);
  wf_mem_free(dp->v);
  wf_mem_free(dp->stage);
  free(dp);
}

void wf_dp_arm(wf_dp *dp)
{
  /* The per-step counters start over: arm is called once per step. */
  dp->stats.comm_bytes = 0;
  dp->stats.launched_early = 0;
  dp->armed = !dp->zero && dp->size > 1;
  wf_gpt_set_grad_hook(dp->model, dp->armed ? on_grads_ready : NULL, dp);
}

static wf_status finish_buckets(wf_dp *dp)
{
  wf_status st = WF_OK;
  float *grads = wf_gpt_grads(dp->model);
  for (int i = 0; i < dp->n_buckets; i++) {
    bucket *b = &dp->buckets[i];
    if (!b->launched)
      WF_TRY(launch(dp, b));
  }
  for (int i = 0; i < dp->n_buckets; i++) {
    bucket *b = &dp->buckets[i];
    WF_TRY(wf_req_wait(&b->req));
    const float *p = b->stage;
    for (int r = 0; r < b->n_ranges; r++) {
      memcpy(grads + b->ranges[r].off, p, b->ranges[r].n * sizeof(float));
      p += b->ranges[r].n;
    }
    b->launched = false;
  }
fail:
  return st;
}

static wf_status finish_zero(wf_dp *dp)
{
  /* Pad the flat gradients to size * shard, then each rank receives the average of
   * its shard. */
  memcpy(dp->stage, wf_gpt_grads(dp->model), dp->n * sizeof(float));
  memset(dp->stage + dp->n, 0, (dp->shard * (size_t)dp->size - dp->n) * sizeof(float));
  dp->stats.comm_bytes = (double)dp->shard * dp->size * sizeof(float);
  return wf_comm_reduce_scatter(dp->comm, dp->stage, dp->gshard, dp->shard, WF_COMM_F32,
                                WF_COMM_AVG);
}

wf_status wf_dp_finish(wf_dp *dp)
{
  double t0 = wf_now();
  wf_status st = WF_OK;
  if (dp->zero)
    st = finish_zero(dp);
  else if (dp->size > 1)
    st = finish_buckets(dp);
  dp->armed = false;
  wf_gpt_set_grad_hook(dp->model, NULL, NULL);
  dp->stats.exposed_ms = (wf_now() - t0) * 1e3;
  return st;
}

wf_status wf_dp_grad_sumsq(wf_dp *dp, double *ss)
{
  if (!dp->zero) { /* every dp rank holds the same averaged gradients */
    *ss = wf_gpt_grad_sumsq(dp->model);
    return WF_OK;
  }
  /* This rank's shard [s0, s1), kind by kind: only the kinds this rank counts. */
  size_t s0 = (size_t)dp->rank * dp->shard, s1 = WF_MIN(s0 + dp->shard, dp->n);
  double mine = 0;
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    size_t off = wf_gpt_local_offset(dp->model, (wf_param_kind)k);
    size_t lo = WF_MAX(s0, off),
           hi = WF_MIN(s1, off + wf_gpt_local_numel(dp->model, (wf_param_kind)k));
    if (lo < hi && wf_gpt_kind_counted(dp->model, (wf_param_kind)k))
      mine += wf_sumsq(dp->gshard + (lo - s0), hi - lo);
  }
  float x = (float)mine;
  wf_status st = wf_comm_allreduce(dp->comm, &x, &x, 1, WF_COMM_F32, WF_COMM_SUM);
  *ss = x;
  return st;
}

wf_status wf_dp_update(wf_dp *dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int t)
{
  if (!dp->zero) {
    wf_gpt_update(dp->model, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
    return WF_OK;
  }
  float *params = wf_gpt_params(dp->model);
  size_t s0 = (size_t)dp->rank * dp->shard, s1 = WF_MIN(s0 + dp->shard, dp->n);
  /* AdamW kind by kind over this shard, so weight decay follows each tensor's kind. */
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    size_t off = wf_gpt_local_offset(dp->model, (wf_param_kind)k);
    size_t lo = WF_MAX(s0, off);
    size_t hi = WF_MIN(s1, off + wf_gpt_local_numel(dp->model, (wf_param_kind)k));
    if (lo >= hi)
      continue;
    float wd = wf_gpt_kind_decays((wf_param_kind)k) ? weight_decay : 0.0f;
    wf_adamw_update(params + lo, dp->m + (lo - s0), dp->v + (lo - s0), dp->gshard + (lo - s0),
                    hi - lo, lr, beta1, beta2, eps, wd, t, grad_scale);
  }
  memset(dp->pshard, 0, dp->shard * sizeof(float));
  if (s1 > s0)
    memcpy(dp->pshard, params + s0, (s1 - s0) * sizeof(float));
  wf_status st = wf_comm_allgather(dp->comm, dp->pshard, dp->stage, dp->shard, WF_COMM_F32);
  if (st == WF_OK) {
    memcpy(params, dp->stage, dp->n * sizeof(float));
    wf_gpt_params_changed(dp->model); /* mixed precision's rounded weights follow */
  }
  return st;
}

void wf_dp_get_stats(const wf_dp *dp, wf_dp_stats *out) { *out = dp->stats; }

void wf_dp_shard_range(const wf_dp *dp, size_t *lo, size_t *hi)
{
  size_t n = wf_gpt_local_params(dp->model);
  *lo = 0, *hi = n;
  if (dp->zero) {
    *lo = WF_MIN((size_t)dp->rank * dp->shard, n);
    *hi = WF_MIN(*lo + dp->shard, n);
  }
}

void wf_dp_adam_shard(wf_dp *dp, float **m, float **v)
{
  *m = dp->zero ? dp->m : NULL;
  *v = dp->zero ? dp->v : NULL;
}
