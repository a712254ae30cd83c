/*
 * grads.c - the gradient path (wf_parallel.h): zero, dp reduction (bucketed and
 * overlapped, or ZeRO's, zero.c), tp and tied-embedding sums, the global norm, and the
 * parameter sync after a sharded update.
 *
 * Buckets. The layout keeps all layers of one tensor together, so the gradients
 * that become final together (one layer's) are not contiguous. A bucket is a list of
 * (offset, count) ranges in the flat gradient buffer, gathered in the order backward
 * finalises them: the last stage's tensors (the final norm, an untied head), then layer
 * L-1 down to 0, then the embeddings (the model's description places each tensor).
 * It is packed into its own staging buffer on the device, all-reduced in place
 * (averaging), and unpacked in finish(). Packing costs one copy of the gradients,
 * small next to the GEMMs that produce them. Open MPI progresses non-blocking
 * collectives only inside MPI calls, so every readiness event also tests the buckets
 * already in flight.
 *
 * Scalars (the sum of squares) are accumulated on the device and read back once. The
 * tied embedding's check rides on that read: after each update, a checksum of each
 * stage's copy (one negated) is summed over the embedding group into the word beside
 * the norm's accumulator, on the device, and the next norm (or wf_grads_check_tied_end)
 * reads both at once; a non-zero word means the copies differ. So a step waits for the
 * device once for the norm, never for the check.
 *
 * Test hook (read once, at creation): WEFT_TEST_TIED_UNSUMMED=1 halves the last stage's
 * summed tied gradient, so its copy drifts from the first stage's and the check must
 * catch it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel_int.h"

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
  wf_comm *comm; /* the dp group, or for the experts' tensors the edp group */
  float post;    /* multiplied in after the average: the experts' 1 / ep, else 1 */
} bucket;

struct wf_grads {
  wf_model *model;
  wf_dev *dev;
  wf_comm *dp, *pp, *emb, *tp;
  wf_comm *ep, *edp; /* expert parallelism's groups (NULL: none) */
  wf_tp *tpr;        /* the tp group's operators (the partial sums' all-reduce) */
  int rank, size, zero, n_groups;
  bucket *buckets;
  int n_buckets;
  bool armed;
  wf_grads_stats stats;
  double *acc;                    /* (2) device: a sum of squares, then the tied check's word */
  int tied_step;                  /* the step whose tied check awaits its read; 0: none */
  bool tied_unsummed;             /* WEFT_TEST_TIED_UNSUMMED: the test hook above */
  size_t n;                       /* parameters */
  wf__zero *z;                    /* ZeRO-1 and 2's sharded reduction (zero.c); NULL without ZeRO */
  wf__zero *zx;                   /* under expert parallelism the experts' (over edp), z the
                                   * dense tensors'; NULL otherwise */
  wf_comm *shard_comm, *rep_comm; /* ZeRO's: the dp group, or HSDP's fsdp and replica groups */
  bool own_comms;
  wf_status hook_err; /* the first failure inside the grad hook (ZeRO-2), for finish */
  double fin_ms;      /* exposed time of finish's dp reduction */
};

static wf_status copy(wf_grads *g, float *dst, const float *src, size_t n)
{
  return wf_dev_copy(g->dev, dst, src, n * sizeof *src, WF_COPY_D2D, NULL);
}

/* ---- buckets ---------------------------------------------------------------------------- */

/* Which tensors a set of buckets reduces: all of them, or with expert parallelism the
 * dense ones (over dp) and the experts' (over edp) apart. */
typedef enum which { ALL = 0, DENSE, EXPERTS } which;

static bool in_class(const wf_tensor_desc *t, which w)
{
  return w == ALL || (w == EXPERTS) == t->experts;
}

/* The ranges that become final with readiness group gr: 0 = the last stage's tensors
 * (final norm, an untied head), 1..n = this stage's local layer n-gr, n+1 = the first
 * stage's and the tied embedding (n = layers on this stage), of class w. Tensors this
 * stage does not hold are empty ranges. Returns how many were written. A pure function of
 * the shard, so the planner sizes buckets without a model. */
static int group_ranges(const wf_model_dims *d, const wf_model_shard *s, int gr, which w,
                        range *out)
{
  wf_model_desc desc;
  int n = 0, nl = wf_model_shard_layers(s);
  wf_model_describe(d, &desc);
  for (int t = 0; t < desc.n; t++) {
    wf_place p = desc.t[t].place;
    if (!in_class(&desc.t[t], w))
      continue;
    bool layer = p == WF_PLACE_LAYER;
    bool in = gr == 0        ? p == WF_PLACE_LAST
              : gr == nl + 1 ? p == WF_PLACE_FIRST || p == WF_PLACE_TIED
                             : layer;
    if (!in)
      continue;
    size_t ln = wf_model_shard_layer_numel(d, s, t); /* not layered: the tensor */
    size_t at = layer ? (size_t)(nl - gr) * ln : 0;
    out[n++] = (range){wf_model_shard_offset(d, s, t) + at, ln};
  }
  return n;
}

/* Readiness groups go into the open bucket, in order, until it holds bucket_bytes or
 * the groups run out. Writes each bucket's last group (last may be NULL) and returns
 * how many buckets there are. The groups cover the shard once, so the buckets' staging
 * holds its parameters plus one float per bucket. */
static int bucket_plan(const wf_model_dims *d, const wf_model_shard *s, size_t bucket_bytes,
                       which w, int *last)
{
  int n_groups = wf_model_shard_layers(s) + 2, nb = 0;
  range r[WF_MAX_TENSORS];
  size_t count = 0;
  for (int gr = 0; gr < n_groups; gr++) {
    int k = group_ranges(d, s, gr, w, r);
    for (int i = 0; i < k; i++)
      count += r[i].n;
    if (count * sizeof(float) >= bucket_bytes || gr == n_groups - 1) {
      if (last)
        last[nb] = gr;
      nb++;
      count = 0;
    }
  }
  return nb;
}

/* The buckets of class w, reduced over comm and multiplied by post, after those planned. */
static wf_status plan_class(wf_grads *g, size_t bucket_bytes, which w, wf_comm *comm, float post)
{
  wf_status st = WF_OK;
  const wf_model_dims *d = wf_model_get_dims(g->model);
  const wf_model_shard *s = wf_model_get_shard(g->model);
  int *last = NULL, first = g->n_buckets;
  WF_CHECK_ALLOC(last = calloc((size_t)g->n_groups, sizeof *last));
  g->n_buckets += bucket_plan(d, s, bucket_bytes, w, last);
  for (int i = first, gr = 0; i < g->n_buckets; i++) {
    bucket *b = &g->buckets[i];
    WF_CHECK_ALLOC(b->ranges = calloc((size_t)g->n_groups * WF_MAX_TENSORS, sizeof *b->ranges));
    for (; gr <= last[i - first]; gr++)
      b->n_ranges += group_ranges(d, s, gr, w, b->ranges + b->n_ranges);
    for (int r = 0; r < b->n_ranges; r++)
      b->count += b->ranges[r].n;
    b->last_group = last[i - first];
    b->comm = comm, b->post = post;
    WF_TRY(wf_dev_alloc_floats(g->dev, &b->stage, b->count + 1));
  }
fail:
  free(last);
  return st;
}

/* Plain dp's buckets: every tensor's over dp; with expert parallelism the dense tensors'
 * over dp and the experts' over edp, times 1 / ep: each expert's gradient holds every ep
 * rank's tokens' share (their dispatch gathered them), so its average over the edp ranks,
 * divided by ep, is the average over all dp ranks that a dense gradient gets (Megatron-
 * Core scales its expert gradients by 1 / dp before summing them over edp, likewise). */
static wf_status plan_buckets(wf_grads *g, size_t bucket_bytes)
{
  wf_status st = WF_OK;
  g->n_groups = wf_model_shard_layers(wf_model_get_shard(g->model)) + 2;
  WF_CHECK_ALLOC(g->buckets = calloc(2 * (size_t)g->n_groups, sizeof *g->buckets));
  if (!g->ep)
    return plan_class(g, bucket_bytes, ALL, g->dp, 1.0f);
  WF_TRY(plan_class(g, bucket_bytes, DENSE, g->dp, 1.0f));
  st = plan_class(g, bucket_bytes, EXPERTS, g->edp, 1.0f / (float)wf_comm_size(g->ep));
fail:
  return st;
}

static wf_status launch(wf_grads *g, bucket *b)
{
  wf_status st = WF_OK;
  float *grads = wf_model_grads(g->model), *p = b->stage;
  for (int i = 0; i < b->n_ranges; i++) {
    WF_TRY(copy(g, p, grads + b->ranges[i].off, b->ranges[i].n));
    p += b->ranges[i].n;
  }
  b->launched = true;
  g->stats.comm_bytes += (double)b->count * sizeof(float);
  st = wf_comm_iallreduce(b->comm, b->stage, b->stage, b->count, WF_COMM_F32, WF_COMM_AVG, &b->req);
fail:
  return st;
}

/* The model's hook: gradients of readiness group gr are final. A bucket whose launch
 * fails here is launched again (and its error returned) by finish. */
static void on_grads_ready(void *user, int gr)
{
  wf_grads *g = user;
  if (!g->armed)
    return;
  if (g->z) {
    wf_status st = wf__zero_ready(g->z, gr);
    if (st == WF_OK && g->zx)
      st = wf__zero_ready(g->zx, gr);
    if (st != WF_OK && g->hook_err == WF_OK)
      g->hook_err = st;
    return;
  }
  for (int i = 0; i < g->n_buckets; i++) {
    bucket *b = &g->buckets[i];
    bool done;
    if (b->launched && b->req)
      wf_req_test(&b->req, &done); /* drive MPI progress; errors surface at the wait */
    if (!b->launched && b->last_group == gr) {
      if (launch(g, b) == WF_OK)
        g->stats.launched_early++;
      else
        b->launched = false;
    }
  }
}

static wf_status finish_buckets(wf_grads *g)
{
  wf_status st = WF_OK;
  float *grads = wf_model_grads(g->model);
  for (int i = 0; i < g->n_buckets; i++)
    if (!g->buckets[i].launched)
      WF_TRY(launch(g, &g->buckets[i]));
  for (int i = 0; i < g->n_buckets; i++) {
    bucket *b = &g->buckets[i];
    WF_TRY(wf_req_wait(&b->req));
    if (b->post != 1.0f)
      WF_K(wf_dev_kernels(g->dev, WF_DT_F32), norm)->scale(b->stage, b->post, b->count, NULL);
    const float *p = b->stage;
    for (int r = 0; r < b->n_ranges; r++) {
      WF_TRY(copy(g, grads + b->ranges[r].off, p, b->ranges[r].n));
      p += b->ranges[r].n;
    }
    b->launched = false;
  }
fail:
  return st;
}

/* ---- the planner's figures ------------------------------------------------------------ */

/* HSDP's group: the fsdp ranks the shards span (all of dp when fsdp is 0 or dp). */
static int shard_group(int dp, int fsdp) { return fsdp > 0 && fsdp < dp ? fsdp : dp; }

wf_status wf_grads_mem_plan(const wf_model_dims *d, const wf_model_shard *s, wf_precision prec,
                            int dp_size, int dp_rank, int zero, int fsdp, size_t bucket_bytes,
                            bool keep, wf_grads_mem *out)
{
  wf_status st = WF_OK;
  size_t n = wf_model_shard_params(d, s);
  bool ep = s->ep > 1 && dp_size >= s->ep; /* wf_grads_create's two classes */
  *out = (wf_grads_mem){.model_params = true, .model_grads = true, .lo = 0, .hi = n};
  if (dp_size >= 1 && zero) { /* zero.c's plan, over the group the shards span */
    int f = shard_group(dp_size, fsdp);
    WF_TRY(wf__zero_mem_plan(d, s, prec, f, dp_rank % f, zero, bucket_bytes, keep,
                             ep ? WF__Z_DENSE : WF__Z_ALL, out));
    if (ep) { /* the experts over edp: dp rank d is edp rank d / ep */
      wf_grads_mem x;
      WF_TRY(wf__zero_mem_plan(d, s, prec, dp_size / s->ep, dp_rank / s->ep, zero, bucket_bytes,
                               keep, WF__Z_EXPERTS, &x));
      out->param += x.param, out->grad += x.grad, out->n_buckets += x.n_buckets;
      out->lo2 = x.lo, out->hi2 = x.hi;
    }
  } else if (dp_size > 1) { /* one dp rank reduces nothing: no staging (wf_grads_create) */
    out->n_buckets = ep ? bucket_plan(d, s, bucket_bytes, DENSE, NULL) +
                              bucket_plan(d, s, bucket_bytes, EXPERTS, NULL)
                        : bucket_plan(d, s, bucket_bytes, ALL, NULL);
    out->grad = (n + (size_t)out->n_buckets) * sizeof(float); /* each bucket count + 1 */
  }
fail:
  out->scalar = 2 * sizeof(double); /* the device's sum of squares and tied-check word */
  out->total = out->param + out->grad + out->scalar;
  return st;
}

wf_status wf_zero_mem_plan(const wf_model_dims *d, const wf_model_shard *s, wf_precision prec,
                           int dp, int rank, int zero, size_t bucket_bytes, bool keep,
                           wf_mem_kinds *out)
{
  wf_status st = WF_OK;
  wf_grads_mem g;
  size_t nb = wf_model_shard_params(d, s) * sizeof(float);
  WF_TRY(wf_grads_mem_plan(d, s, prec, dp, rank, zero, 0, bucket_bytes, keep, &g));
  *out =
      (wf_mem_kinds){.param = (g.model_params ? (prec != WF_PREC_NO ? 2 : 1) * nb : 0) + g.param,
                     .grad = (g.model_grads ? nb : 0) + g.grad,
                     .optim = 2 * (g.hi - g.lo) * sizeof(float)}; /* AdamW's m and v of the range */
fail:
  return st;
}

wf_status wf_zero_mem(wf_model *m, int dp, int rank, int zero, size_t bucket_bytes, bool keep,
                      wf_mem_kinds *out)
{
  return wf_zero_mem_plan(wf_model_get_dims(m), wf_model_get_shard(m), wf_model_precision(m), dp,
                          rank, zero, bucket_bytes, keep, out);
}

/* ---- life cycle ------------------------------------------------------------------------- */

/* HSDP: dp rank d shards within fsdp group d / f (its rank d % f) and all-reduces its
 * shard with the same shard of the other groups (replica group d % f). */
static wf_status split_hsdp(wf_grads *g, int f)
{
  wf_status st = WF_OK;
  g->shard_comm = g->dp;
  if (f <= 0 || f >= g->size)
    return WF_OK;
  WF_CHECK(g->size % f == 0, WF_EINVAL, "mesh.fsdp=%d does not divide the dp size %d", f, g->size);
  g->own_comms = true;
  WF_TRY(wf_comm_split(g->dp, g->rank / f, g->rank % f, "fsdp", &g->shard_comm));
  WF_TRY(wf_comm_split(g->dp, g->rank % f, g->rank / f, "replica", &g->rep_comm));
fail:
  return st;
}

wf_status wf_grads_create(wf_grads **out, const wf_grads_opts *o)
{
  wf_status st = WF_OK;
  wf_grads *g = NULL;
  *out = NULL;
  WF_CHECK_ALLOC(g = calloc(1, sizeof *g));
  g->model = o->model;
  g->dev = wf_model_dev(o->model);
  g->dp = o->dp, g->pp = o->pp, g->emb = o->emb, g->tp = o->tp, g->tpr = o->tp_regions;
  g->ep = o->ep && wf_comm_size(o->ep) > 1 ? o->ep : NULL, g->edp = g->ep ? o->edp : NULL;
  g->zero = o->dp ? o->zero : 0;
  g->rank = o->dp ? wf_comm_rank(o->dp) : 0;
  g->size = o->dp ? wf_comm_size(o->dp) : 1;
  g->n = wf_model_local_params(o->model);
  const char *hook = getenv("WEFT_TEST_TIED_UNSUMMED");
  g->tied_unsummed = hook && !strcmp(hook, "1");
  WF_TRY(wf_dev_alloc(g->dev, (void **)&g->acc, 2 * sizeof *g->acc));
  if (g->zero) {
    WF_TRY(split_hsdp(g, o->fsdp));
    wf__zclass dense = g->ep ? WF__Z_DENSE : WF__Z_ALL;
    WF_TRY(wf__zero_create(&g->z, g->model, g->shard_comm, g->rep_comm, g->zero, o->bucket_bytes,
                           o->keep_gathered, dense, 1.0f, NULL));
    if (g->ep) /* the experts over edp, times 1 / ep (plan_buckets says why) */
      WF_TRY(wf__zero_create(&g->zx, g->model, g->edp, NULL, g->zero, o->bucket_bytes,
                             o->keep_gathered, WF__Z_EXPERTS, 1.0f / (float)wf_comm_size(g->ep),
                             g->z));
  } else if (g->dp && (g->size > 1 || g->ep)) /* one dp rank reduces nothing: no staging */
    WF_TRY(plan_buckets(g, o->bucket_bytes));
  g->stats.buckets = g->n_buckets;
  *out = g;
  return WF_OK;
fail:
  wf_grads_destroy(g);
  return st;
}

void wf_grads_destroy(wf_grads *g)
{
  if (!g)
    return;
  wf_model_set_grad_hook(g->model, NULL, NULL);
  for (int i = 0; i < g->n_buckets; i++) {
    wf_req_wait(&g->buckets[i].req);
    free(g->buckets[i].ranges);
    wf_dev_free(g->dev, g->buckets[i].stage);
  }
  free(g->buckets);
  wf_dev_free(g->dev, g->acc);
  wf__zero_destroy(g->zx);
  wf__zero_destroy(g->z);
  if (g->own_comms) {
    if (g->shard_comm != g->dp)
      wf_comm_destroy(g->shard_comm);
    wf_comm_destroy(g->rep_comm);
  }
  free(g);
}

/* The step starts: the per-step counters start over, and ZeRO-2 listens to every
 * micro-batch's backward (it reduces each one as it goes). */
wf_status wf_grads_zero(wf_grads *g)
{
  wf_status st = WF_OK;
  g->stats.comm_bytes = 0;
  g->stats.launched_early = 0;
  g->hook_err = WF_OK;
  g->fin_ms = 0;
  WF_TRY(wf_model_zero_grad(g->model));
  if (g->z) {
    WF_TRY(wf__zero_begin(g->z));
    if (g->zx)
      WF_TRY(wf__zero_begin(g->zx));
    g->armed = g->zero >= 2;
    wf_model_set_grad_hook(g->model, g->armed ? on_grads_ready : NULL, g);
  }
fail:
  return st;
}

void wf_grads_arm(wf_grads *g)
{
  g->armed = g->dp && g->size > 1;
  if (g->z)
    wf__zero_arm(g->z);
  if (g->zx)
    wf__zero_arm(g->zx);
  wf_model_set_grad_hook(g->model, g->armed ? on_grads_ready : NULL, g);
}

static void disarm(wf_grads *g)
{
  g->armed = false;
  wf_model_set_grad_hook(g->model, NULL, NULL);
}

/* The dp reduction; the time it takes is what backward did not hide. */
static wf_status finish_dp(wf_grads *g)
{
  double t0 = wf_now();
  wf_status st = WF_OK;
  if (g->size > 1)
    st = finish_buckets(g);
  disarm(g);
  g->stats.exposed_ms = (wf_now() - t0) * 1e3;
  return st;
}

/* ZeRO: the layer buckets not yet launched (ZeRO-1's, when backward's hook could not),
 * then after the tp and tied sums the late bucket and every completion. The exposed
 * time is these two parts plus what ZeRO-2's hook waited for a staging buffer. */
static wf_status finish_zero(wf_grads *g, bool late)
{
  double t0 = wf_now();
  wf_status st = g->hook_err;
  for (wf__zero *z = g->z; st == WF_OK && z; z = z == g->z ? g->zx : NULL)
    st = late ? wf__zero_finish(z) : wf__zero_launch_layers(z);
  if (late) {
    disarm(g);
    double wait_ms, wx = 0, bx = 0;
    int ex = 0, nx = 0;
    wf__zero_stats(g->z, &wait_ms, &g->stats.comm_bytes, &g->stats.launched_early,
                   &g->stats.buckets);
    if (g->zx)
      wf__zero_stats(g->zx, &wx, &bx, &ex, &nx);
    g->stats.comm_bytes += bx, g->stats.launched_early += ex, g->stats.buckets += nx;
    g->stats.exposed_ms = g->fin_ms + (wf_now() - t0) * 1e3 + wait_ms + wx;
  } else {
    g->fin_ms = (wf_now() - t0) * 1e3;
  }
  return st;
}

/* Sequence-parallel norms: each tp rank saw its own token rows. */
static wf_status sum_tp_partials(wf_grads *g)
{
  wf_status st = WF_OK;
  for (int t = 0; t < wf_model_get_desc(g->model)->n; t++)
    if (wf_model_tp_partial(g->model, t))
      WF_TRY(wf_tp_allreduce(g->tpr, wf_model_grad_tensor(g->model, t),
                             wf_model_local_numel(g->model, t)));
fail:
  return st;
}

/* The tied embedding (the tensor placed TIED), or -1 when the model has none. */
static int tied_tensor(const wf_grads *g)
{
  const wf_model_desc *desc = wf_model_get_desc(g->model);
  for (int t = 0; t < desc->n; t++)
    if (desc->t[t].place == WF_PLACE_TIED)
      return t;
  return -1;
}

/* The tied embedding: the first and the last stage each hold it (their tp slice); its
 * gradient is the sum of both stages' contributions. */
static wf_status sum_tied_embedding(wf_grads *g)
{
  int t = tied_tensor(g);
  if (!g->pp || wf_comm_size(g->pp) == 1 || !g->emb || t < 0)
    return WF_OK;
  wf_status st = WF_OK;
  float *w = wf_model_grad_tensor(g->model, t);
  size_t n = wf_model_local_numel(g->model, t);
  WF_TRY(wf_comm_allreduce(g->emb, w, w, n, WF_COMM_F32, WF_COMM_SUM));
  if (g->tied_unsummed && wf_comm_rank(g->emb) == 1) /* the test hook */
    WF_K(wf_dev_kernels(g->dev, WF_DT_F32), norm)->scale(w, 0.5f, n, NULL);
fail:
  return st;
}

wf_status wf_grads_finish(wf_grads *g)
{
  wf_status st = WF_OK;
  if (g->z)
    WF_TRY(finish_zero(g, false));
  else if (g->dp)
    WF_TRY(finish_dp(g));
  WF_TRY(sum_tp_partials(g));
  WF_TRY(sum_tied_embedding(g));
  if (g->z)
    WF_TRY(finish_zero(g, true));
fail:
  return st;
}

/* ---- the norm --------------------------------------------------------------------------- */

/* The tied check of step g->tied_step, from its word as read (see the top of the file). */
static wf_status tied_verdict(wf_grads *g, uint64_t word)
{
  wf_status st = WF_OK;
  int step = g->tied_step;
  if (!step)
    return WF_OK;
  g->tied_step = 0;
  WF_CHECK(word == 0, WF_EINVAL,
           "step %d: the tied embedding's copies on the first and last pipeline stage differ "
           "after the update; their gradients were not summed over the embedding group",
           step);
  g->stats.tied_checks++;
fail:
  return st;
}

/* Sum of squares of the gradients this rank counts (wf_model_counted; sharded: whatever
 * its ep rank, each shard being its own), tensor by tensor over [lo, hi) of the flat
 * vector, whose gradient starts at `grads`; the pending tied check's word comes back with
 * it. */
static wf_status counted_sumsq(wf_grads *g, const float *grads, size_t lo, size_t hi, bool sharded,
                               double *ss)
{
  wf_status st = WF_OK;
  const wf_kset *k = wf_dev_kernels(g->dev, WF_DT_F32);
  double both[2];
  WF_TRY(wf_dev_memset(g->dev, g->acc, 0, sizeof *g->acc, NULL));
  for (int t = 0; t < wf_model_get_desc(g->model)->n; t++) {
    size_t off = wf_model_local_offset(g->model, t);
    size_t a = WF_MAX(lo, off);
    size_t b = WF_MIN(hi, off + wf_model_local_numel(g->model, t));
    bool counted = sharded ? wf_model_counted_any_ep(g->model, t) : wf_model_counted(g->model, t);
    if (a < b && counted)
      WF_K(k, norm)->sumsq_acc(g->acc, grads + (a - lo), b - a, NULL);
  }
  WF_TRY(wf_dev_check(g->dev));
  WF_TRY(wf_dev_read(g->dev, both, g->acc, sizeof both));
  *ss = both[0];
  uint64_t word;
  memcpy(&word, &both[1], sizeof word);
  st = tied_verdict(g, word);
fail:
  return st;
}

/* Each rank's counted sum of squares, summed over dp (ZeRO shards: every dp rank holds
 * the same averaged gradients otherwise), tp and pp. */
wf_status wf_grads_norm(wf_grads *g, double scale, float *norm)
{
  wf_status st = WF_OK;
  double ss = 0;
  if (g->z) { /* the experts' shards, over edp on each ep rank, tile them over dp too */
    double part = 0;
    for (wf__zero *z = g->z; z; z = z == g->z ? g->zx : NULL) {
      size_t s0, s1;
      wf__zero_bounds(z, &s0, &s1);
      WF_TRY(counted_sumsq(g, wf__zero_shard(z), s0, s1, g->zx != NULL, &part));
      ss += part;
    }
    float x = (float)ss; /* HSDP: every replica group holds the same shards */
    WF_TRY(wf_comm_allreduce(g->shard_comm, &x, &x, 1, WF_COMM_F32, WF_COMM_SUM));
    ss = x;
  } else {
    WF_TRY(counted_sumsq(g, wf_model_grads(g->model), 0, g->n, false, &ss));
  }
  if (scale != 1.0)
    ss /= scale * scale;
  float x = (float)ss;
  if (g->ep && !g->z) /* each ep rank counts its own experts (and rank 0 the rest) */
    WF_TRY(wf_comm_allreduce(g->ep, &x, &x, 1, WF_COMM_F32, WF_COMM_SUM));
  if (g->tp && wf_comm_size(g->tp) > 1)
    WF_TRY(wf_comm_allreduce(g->tp, &x, &x, 1, WF_COMM_F32, WF_COMM_SUM));
  if (g->pp && wf_comm_size(g->pp) > 1)
    WF_TRY(wf_comm_allreduce(g->pp, &x, &x, 1, WF_COMM_F32, WF_COMM_SUM));
  *norm = sqrtf(x);
fail:
  return st;
}

/* ---- the update's side ------------------------------------------------------------------ */

void wf_grads_range(const wf_grads *g, size_t *lo, size_t *hi)
{
  *lo = 0, *hi = g->n;
  if (g->z)
    wf__zero_bounds(g->z, lo, hi);
}

const float *wf_grads_for_update(wf_grads *g)
{
  return g->z ? wf__zero_shard(g->z) : wf_model_grads(g->model);
}

/* The two copies of the tied embedding must stay bit-identical: the first stage's
 * checksum plus the last's negated, summed over the embedding group (its two ranks)
 * into the word beside the norm's accumulator, all on the device; the next read of
 * the accumulator tells (see the top of the file). First and last stage only. */
wf_status wf_grads_check_tied(wf_grads *g, int step)
{
  wf_status st = WF_OK;
  uint64_t *word = (uint64_t *)(g->acc + 1);
  int t = tied_tensor(g);
  if (!g->pp || wf_comm_size(g->pp) == 1 || !g->emb || t < 0)
    return WF_OK;
  size_t n = wf_model_local_numel(g->model, t);
  WF_CHECK(wf_comm_size(g->emb) == 2, WF_EINVAL,
           "the embedding group has %d ranks; the tied check compares the first and last stage",
           wf_comm_size(g->emb));
  WF_TRY(wf_grads_check_tied_end(g)); /* not read by a norm since (a failed step): now */
  WF_K(wf_dev_kernels(g->dev, WF_DT_F32), checksum)
      ->sum(word, wf_model_param(g->model, t, 0, 0), n, wf_comm_rank(g->emb) == 1, NULL);
  WF_TRY(wf_dev_check(g->dev));
  WF_TRY(wf_comm_allreduce(g->emb, word, word, 1, WF_COMM_U64, WF_COMM_SUM));
  g->tied_step = step;
fail:
  return st;
}

wf_status wf_grads_check_tied_end(wf_grads *g)
{
  wf_status st = WF_OK;
  double both[2];
  uint64_t word;
  if (!g->tied_step)
    return WF_OK;
  WF_TRY(wf_dev_read(g->dev, both, g->acc, sizeof both));
  memcpy(&word, &both[1], sizeof word);
  st = tied_verdict(g, word);
fail:
  return st;
}

wf_status wf_grads_sync_params(wf_grads *g, bool low_written)
{
  wf_status st = WF_OK;
  if (g->z)
    WF_TRY(wf__zero_gather(g->z));
  if (g->zx)
    WF_TRY(wf__zero_gather(g->zx));
  if (g->z || !low_written)
    st = wf_model_params_changed(g->model);
fail:
  return st;
}

void wf_grads_get_stats(const wf_grads *g, wf_grads_stats *out) { *out = g->stats; }

/* Gradient memory: the model's flat buffer (dropped under ZeRO-2), plus plain dp's
 * bucket stages or ZeRO's buffers (zero.c). */
size_t wf_grads_bytes(const wf_grads *g)
{
  size_t b = wf_model_grad_bytes(g->model);
  if (g->z)
    return b + wf__zero_grad_bytes(g->z) + (g->zx ? wf__zero_grad_bytes(g->zx) : 0);
  for (int i = 0; i < g->n_buckets; i++)
    b += (g->buckets[i].count + 1) * sizeof(float);
  return b;
}

float *wf_grads_param_shard(wf_grads *g) { return g->z ? wf__zero_param_shard(g->z) : NULL; }

wf_comm *wf_grads_hsdp_group(const wf_grads *g, int *replica)
{
  *replica = g->rep_comm ? wf_comm_rank(g->rep_comm) : 0;
  return g->rep_comm ? g->shard_comm : NULL;
}

/* Parameter memory: the model's own (wf_model_param_bytes) and ZeRO-3's shard and units. */
size_t wf_grads_param_bytes(const wf_grads *g)
{
  return (g->z ? wf__zero_param_bytes(g->z) : 0) + (g->zx ? wf__zero_param_bytes(g->zx) : 0);
}

int wf_grads_parts(wf_grads *g, wf_grads_part parts[WF_GRADS_PARTS])
{
  if (!g->z) {
    parts[0] = (wf_grads_part){0, g->n, wf_model_grads(g->model), NULL};
    return 1;
  }
  int n = 0;
  for (wf__zero *z = g->z; z; z = z == g->z ? g->zx : NULL) {
    wf_grads_part *p = &parts[n++];
    wf__zero_bounds(z, &p->lo, &p->hi);
    p->grads = wf__zero_shard(z), p->params = wf__zero_param_shard(z);
  }
  return n;
}
