/*
 * zero.c - ZeRO-1, 2 and 3 (parallel_int.h): the sharded gradient reduction, ZeRO-3's
 * sharded parameters, HSDP's replicas and the memory formulas. Each dp rank ends
 * the step with the dp average of its shard of the flat gradient vector, elements
 * [rank * shard, rank * shard + shard) with shard = ceil(n / dp), the same contiguous
 * shards ZeRO-1 always had (the optimizer state and the checkpoints' geometry).
 *
 * Overlap. Backward finalises gradients layer by layer (readiness groups 1..nl, see
 * grads.c), but a layer's tensors are scattered over the layout, so a layer's
 * elements belong to several ranks' shards in uneven amounts. A bucket (one or more
 * layers' ranges) has a natural order, its ranges sorted by flat offset, in which each
 * rank's pieces (the ranges cut at the shard boundaries) form one contiguous segment.
 *
 * ZeRO-1 keeps the whole gradient in the model's flat buffer but lays it out bucket by
 * bucket in natural order (the model's gradient tensors are redirected into it), so a
 * finished bucket is one contiguous run, all-reduced in place (AVG) while backward goes
 * on, and this rank then copies its pieces into its gradient shard. That is plain dp's
 * volume and no more: a reduce-scatter would move half of it, but the pieces are uneven
 * (a rank-major packing padded to the longest share cost a staging copy and, at dp 2,
 * up to twice the bytes where one rank owns all of a bucket, as with an embedding), and MPI's
 * non-blocking reduce-scatter is a reduce to one rank followed by a scatter. Each
 * element is the plain dp average of the same values, so dp 2 ZeRO-1 stays
 * bit-identical to plain dp.
 *
 * Late tensors. The unlayered tensors (the embeddings, the final norm, a head) and norms
 * that are partial sums over tp (sequence parallelism) are not in the layer buckets:
 * they are reduced by one last bucket after backward, once grads.c has summed the tied
 * embedding over the embedding group and the partials over tp. They are small, except
 * the embedding, whose gradient is ready only at the end of backward anyway (the embeddings'
 * backward adds into it last). ZeRO-1 all-reduces them in place in the re-laid buffer,
 * ZeRO-2 in `edge`, below.
 *
 * ZeRO-1 reduces once per step: the layer buckets launch as the last micro-batch's
 * backward finishes them (armed before it, as plain dp does).
 *
 * ZeRO-2 never holds the flat gradient: the model's flat buffer is dropped and its
 * gradient tensors are redirected (wf_model_set_grad_tensor) into windows of WF__ZPOOL
 * one-bucket buffers. Every micro-batch's backward fills a window; when its bucket is
 * final the window is all-reduced in place (AVG: no staging copy, no padding, plain dp's
 * volume) and the next bucket opens in a free window, waiting for the oldest reduction
 * when none is (counted as exposed time). A completed window's pieces of this rank's
 * shard are added into the shard, which so accumulates the micro-batches' averages (the
 * loss gradient already carries 1/M). The late tensors live in one persistent buffer
 * `edge`, all-reduced in place once after the step's backward. Gradient memory per rank
 * is then shard + edge + WF__ZPOOL x the largest bucket, instead of the whole vector
 * (wf__zero_grad_bytes; the formulas are in wf_parallel.h).
 *
 * Interleaved schedule (model chunks, `lazy`): a chunk's backward is one call over its
 * layers, but the schedule runs other chunks and micro-batches between a rank's chunks,
 * so 1F1B's "the next bucket is i + 1, then 0 again" does not hold. Buckets therefore
 * end with their chunk (every bucket is finished within one chunk's backward), and a
 * window opens when backward reaches a bucket's first layer (the model's unit hook,
 * called before each layer), is all-reduced when the bucket's last group is final, and
 * the next opening takes a free window or completes the oldest reduction first. Memory
 * is the same formula: WF__ZPOOL windows of the largest bucket (now at most one chunk).
 *
 * ZeRO-3 also drops the flat parameters: see "ZeRO-3" below (fsdp.c).
 *
 * HSDP: `dp` is then the fsdp group the shards span and `rep` the group of ranks holding
 * the same shard in the other fsdp groups; the finished shard is averaged over `rep`.
 *
 * The parameters' all-gather after the update (ZeRO-1/2) is in place in the model's flat
 * vector: one broadcast of each rank's shard from its owner.
 *
 * Expert parallelism: ep ranks hold different experts at the same flat offsets, so the
 * experts' tensors are sharded by a second instance over the expert-data-parallel group
 * (the ranks holding the same experts), the dense ones by the first over dp (grads.c).
 * Each instance shards its class's flat range [base, base + n) alone (the experts' tensors
 * come last in every MoE family's layout), and the instances form a chain whose first
 * runs every instance's unit hook (ZeRO-3's gathers, ZeRO-2's windows over chunks).
 */
#include <stdlib.h>
#include <string.h>

#include "parallel_int.h"

wf_status wf__zero_copy(wf__zero *z, float *dst, const float *src, size_t n)
{
  return wf_dev_copy(z->dev, dst, src, n * sizeof *src, WF_COPY_D2D, NULL);
}

/* ---- planning ------------------------------------------------------------------------ */

/* Whether tensor t is this instance's to shard. */
static bool mine(const wf__zero *z, int t)
{
  return z->cls == WF__Z_ALL || (z->cls == WF__Z_EXPERTS) == wf_model_shard_expert(&z->d, t);
}

/* Reduced by the last bucket: the unlayered tensors and the tp-partial ones. */
static bool is_late(const wf__zero *z, int t)
{
  return !wf_model_tensor_layered(&z->d, t) || wf_model_shard_tp_partial(&z->d, &z->s, t);
}

void wf__zero_class_range(const wf_model_dims *d, const wf_model_shard *s, wf__zclass c,
                          size_t *base, size_t *n)
{
  size_t all = wf_model_shard_params(d, s), first = all;
  for (int t = 0; t < wf_model_num_tensors(d) && c != WF__Z_ALL; t++)
    if (wf_model_shard_expert(d, t)) { /* the experts' tensors are the layout's last */
      first = wf_model_shard_offset(d, s, t);
      break;
    }
  *base = c == WF__Z_EXPERTS ? first : 0;
  *n = c == WF__Z_ALL ? all : c == WF__Z_DENSE ? first : all - first;
}

/* Layer j of tensor k (n elements from its start) into b, from the shard's layout alone:
 * the planner plans a rank without a model. */
static void add_range(wf__zbucket *b, const wf__zero *z, int k, int j, size_t n)
{
  if (n == 0)
    return;
  size_t flat = wf_model_shard_offset(&z->d, &z->s, k) +
                (size_t)j * wf_model_shard_layer_numel(&z->d, &z->s, k);
  b->r[b->nr++] = (wf__zrange){flat, n, b->count, (int)k, j};
  b->count += n;
}

static int by_flat(const void *a, const void *b)
{
  size_t x = ((const wf__zrange *)a)->flat, y = ((const wf__zrange *)b)->flat;
  return x < y ? -1 : x > y;
}

/* b's natural order: its ranges sorted by flat offset. Owners follow the flat offset
 * (rank r holds [r * shard, (r + 1) * shard)), so each rank's pieces of the bucket
 * are then one contiguous segment of it, whatever layers the bucket spans. */
static void sort_ranges(wf__zbucket *b)
{
  qsort(b->r, (size_t)b->nr, sizeof *b->r, by_flat);
  b->count = 0;
  for (int i = 0; i < b->nr; i++)
    b->r[i].pos = b->count, b->count += b->r[i].n;
}

/* Cut b's ranges at the shard boundaries into pieces, and the owners' segments. */
static wf_status cut(wf__zero *z, wf__zbucket *b)
{
  wf_status st = WF_OK;
  sort_ranges(b);
  WF_CHECK_ALLOC(b->p = calloc((size_t)(b->nr + z->size), sizeof *b->p));
  WF_CHECK_ALLOC(b->seg = calloc((size_t)z->size + 1, sizeof *b->seg));
  for (int i = 0; i < b->nr; i++) {
    const wf__zrange *r = &b->r[i];
    for (size_t a = r->flat; a < r->flat + r->n;) {
      int owner = (int)((a - z->base) / z->shard);
      size_t lim = WF_MIN(r->flat + r->n, z->base + (size_t)(owner + 1) * z->shard);
      b->p[b->np++] = (wf__zpiece){a, r->pos + (a - r->flat), lim - a, owner};
      b->seg[owner + 1] += lim - a;
      a = lim;
    }
  }
  for (int r = 0; r < z->size; r++)
    b->seg[r + 1] += b->seg[r];
fail:
  return st;
}

static wf_status new_bucket(wf__zero *z, wf__zbucket *b, int ranges)
{
  wf_status st = WF_OK;
  *b = (wf__zbucket){0};
  WF_CHECK_ALLOC(b->r = calloc((size_t)ranges, sizeof *b->r));
fail:
  return st;
}

/* Layer buckets over groups 1..nl (group gr is local layer nl - gr), closed once they
 * reach bucket_bytes. */
static wf_status plan_layers(wf__zero *z, size_t bucket_bytes)
{
  wf_status st = WF_OK;
  wf__zbucket *b = NULL;
  WF_CHECK_ALLOC(z->b = calloc((size_t)(z->nl > 0 ? z->nl : 1), sizeof *z->b));
  for (int gr = 1; gr <= z->nl; gr++) {
    if (!b) {
      b = &z->b[z->nb++];
      WF_TRY(new_bucket(z, b, z->nl * z->nt));
      b->first_group = gr;
    }
    for (int k = 0; k < z->nt; k++)
      if (mine(z, k) && !is_late(z, k))
        add_range(b, z, k, z->nl - gr, wf_model_shard_layer_numel(&z->d, &z->s, k));
    b->last_group = gr;
    /* over chunks a bucket ends with its chunk: each chunk's backward is a separate
     * call, and the schedule interleaves other chunks between them */
    bool chunk_end = z->lazy && (z->nl - gr) % z->lc == 0;
    if (b->count * sizeof(float) >= bucket_bytes || gr == z->nl || chunk_end) {
      WF_TRY(cut(z, b));
      b = NULL;
    }
  }
fail:
  return st;
}

/* The late bucket: whole tensors, in layout order (each tensor contiguous). */
static wf_status plan_late(wf__zero *z)
{
  wf_status st = WF_OK;
  wf__zbucket *b = &z->late;
  WF_TRY(new_bucket(z, b, z->nt * (z->nl > 0 ? z->nl : 1)));
  for (int k = 0; k < z->nt; k++) {
    if (!mine(z, k) || !is_late(z, k))
      continue;
    if (!wf_model_tensor_layered(&z->d, k))
      add_range(b, z, k, 0, wf_model_shard_numel(&z->d, &z->s, k));
    else
      for (int j = 0; j < z->nl; j++)
        add_range(b, z, k, j, wf_model_shard_layer_numel(&z->d, &z->s, k));
  }
  st = cut(z, b);
fail:
  return st;
}

/* Point the model's gradient tensors of b's ranges into base (natural order). */
static void redirect(wf__zero *z, const wf__zbucket *b, float *base)
{
  for (int i = 0; i < b->nr; i++)
    wf_model_set_grad_tensor(z->m, b->r[i].tensor, b->r[i].j, base + b->r[i].pos);
}

/* The buffers' sizes, from the plan: ZeRO-2's window (the largest layer bucket) and
 * edge, the all-gather's chunk, and where ZeRO-1 lays each bucket out (the layer
 * buckets one after another, then the late one: every element once). */
static void sizes(wf__zero *z)
{
  size_t base = z->base; /* ZeRO-1 re-lays the class's gradients inside its own range */
  for (int i = 0; i < z->nb; i++) {
    z->win_count = WF_MAX(z->win_count, z->b[i].count);
    z->b[i].base = base, base += z->b[i].count;
  }
  z->late.base = base;
  if (z->stage >= 2)
    z->edge_count = z->late.count;
  z->part = WF_MAX(z->win_count, (size_t)1);
  z->npw = z->stage == 3 ? (z->keep ? z->nb : 2) : 0;
}

/* ZeRO-1's gradients stay in the model's flat buffer, re-laid bucket by bucket in
 * their natural order, so a bucket is one contiguous run that is all-reduced in place
 * (no staging copy, no padding) and the late one is as well. */
static void relay_grads(wf__zero *z)
{
  float *flat = wf_model_grads(z->m);
  for (int i = 0; i <= z->nb; i++) {
    const wf__zbucket *b = i < z->nb ? &z->b[i] : &z->late;
    redirect(z, b, flat + b->base);
  }
}

static wf_status alloc_buffers(wf__zero *z)
{
  wf_status st = WF_OK;
  WF_TRY(wf_dev_alloc_floats(z->dev, &z->gshard, z->shard));
  if (z->stage == 1) {
    relay_grads(z);
  } else {
    WF_TRY(wf_dev_alloc_floats(z->dev, &z->edge, WF_MAX(z->edge_count, (size_t)1)));
    for (int i = 0; i < WF__ZPOOL; i++) {
      WF_TRY(wf_dev_alloc_floats(z->dev, &z->win[i], WF_MAX(z->win_count, (size_t)1)));
      z->win_bucket[i] = -1;
    }
    redirect(z, &z->late, z->edge);
    wf_model_drop_grads(z->m);
  }
  if (z->stage == 3)
    WF_TRY(wf__fsdp_alloc(z));
fail:
  return st;
}

/* The shard geometry and the buckets of dp rank `rank` of `size`, from the model's
 * dims and shard alone: wf__zero_create allocates by this plan and wf__zero_mem_plan
 * sizes the same buffers without a model. */
static wf_status plan(wf__zero **out, const wf_model_dims *d, const wf_model_shard *s,
                      wf_precision prec, int size, int rank, int stage, size_t bucket_bytes,
                      bool keep, wf__zclass cls)
{
  wf_status st = WF_OK;
  wf__zero *z = NULL;
  *out = NULL;
  WF_CHECK_ALLOC(z = calloc(1, sizeof *z));
  z->d = *d, z->s = *s, z->prec = prec, z->stage = stage;
  z->rank = rank, z->size = size;
  z->nl = wf_model_shard_layers(s);
  z->nt = wf_model_num_tensors(d);
  z->lc = s->chunks > 1 ? z->nl / s->chunks : z->nl;
  z->lazy = stage >= 2 && s->chunks > 1;
  z->cls = cls, z->post = 1.0f;
  wf__zero_class_range(d, s, cls, &z->base, &z->n);
  z->shard = (z->n + (size_t)z->size - 1) / (size_t)z->size;
  z->s0 = z->base + WF_MIN((size_t)z->rank * z->shard, z->n);
  z->s1 = WF_MIN(z->s0 + z->shard, z->base + z->n);
  z->open = -1, z->pcur = -1;
  z->keep = keep;
  WF_TRY(plan_layers(z, bucket_bytes));
  WF_TRY(plan_late(z));
  sizes(z);
  *out = z;
  return WF_OK;
fail:
  wf__zero_destroy(z);
  return st;
}

void wf__zero_set_hook(wf__zero *z)
{
  wf_model_set_unit_hook(z->m, wf__zero_unit_hook, z->head ? z->head : z);
}

wf_status wf__zero_create(wf__zero **out, wf_model *m, wf_comm *dp, wf_comm *rep, int stage,
                          size_t bucket_bytes, bool keep, wf__zclass cls, float post,
                          wf__zero *head)
{
  wf_status st = WF_OK;
  wf__zero *z = NULL;
  *out = NULL;
  WF_TRY(plan(&z, wf_model_get_dims(m), wf_model_get_shard(m), wf_model_precision(m),
              wf_comm_size(dp), wf_comm_rank(dp), stage, bucket_bytes, keep, cls));
  z->m = m, z->dev = wf_model_dev(m);
  z->dp = dp;
  z->rep = rep;
  z->post = post;
  z->head = head;
  if (head) { /* the chain's first runs this one's unit hook after its own */
    wf__zero *last = head;
    while (last->next)
      last = last->next;
    last->next = z;
  }
  WF_TRY(alloc_buffers(z));
  if (stage == 3 && !wf_model_params(m)) /* created shard-first (wf_model_opts.zero) */
    wf__fsdp_start_sharded(z);
  if (z->lazy && stage == 2) /* ZeRO-3 sets it when sharded (above, or wf__fsdp_reshard) */
    wf__zero_set_hook(z);
  *out = z;
  return WF_OK;
fail:
  wf__zero_destroy(z);
  return st;
}

static void free_bucket(wf__zbucket *b)
{
  wf_req_wait(&b->req);
  free(b->r);
  free(b->p);
  free(b->seg);
}

void wf__zero_destroy(wf__zero *z)
{
  if (!z)
    return;
  if ((z->stage == 3 || z->lazy) && z->dp) /* created (not a memory plan): the hook is ours */
    wf_model_set_unit_hook(z->m, NULL, NULL);
  for (int i = 0; i < z->nb; i++)
    free_bucket(&z->b[i]);
  free_bucket(&z->late);
  free(z->b);
  wf_dev_free(z->dev, z->gshard);
  wf_dev_free(z->dev, z->edge);
  for (int i = 0; i < WF__ZPOOL; i++) {
    wf_req_wait(&z->win_req[i]);
    wf_dev_free(z->dev, z->win[i]);
  }
  wf__fsdp_free(z);
  free(z);
}

/* ---- reduction ----------------------------------------------------------------------- */

/* Where bucket b's gradients lie in natural order: ZeRO-1's re-laid buffer, or (the
 * late bucket under ZeRO-2/3) edge. */
static float *run_of(wf__zero *z, const wf__zbucket *b)
{
  return z->stage == 1 ? wf_model_grads(z->m) + b->base : z->edge;
}

/* The next part of b's in-place all-reduce (AVG): at most z->part elements, the largest
 * layer bucket. Open MPI's non-blocking all-reduce in place stages its whole message in a
 * temporary buffer, and the late bucket holds the embedding (a third of GPT-2 124M):
 * reduced whole, it lifted a ZeRO-2 rank's peak 12% above its steady state. Parts
 * reduce the same elements, equal up to the order of the sums (the same bits at dp 2,
 * where each element is one addition). */
static wf_status launch_part(wf__zero *z, wf__zbucket *b)
{
  float *run = run_of(z, b) + b->sent;
  size_t n = WF_MIN(b->count - b->sent, z->part);
  b->sent += n;
  return wf_comm_iallreduce(z->dp, run, run, n, WF_COMM_F32, WF_COMM_AVG, &b->req);
}

/* ZeRO-1's buckets and the late one: start b's all-reduce, part by part. */
static wf_status launch(wf__zero *z, wf__zbucket *b)
{
  b->launched = true;
  b->sent = 0;
  z->comm_bytes += (double)b->count * sizeof(float);
  wf_status st = launch_part(z, b);
  if (st != WF_OK)
    b->launched = false;
  return st;
}

/* Every part of b's all-reduce done, each launched when the one before has completed. */
static wf_status wait_parts(wf__zero *z, wf__zbucket *b)
{
  wf_status st = wf_req_wait(&b->req);
  while (st == WF_OK && b->launched && b->sent < b->count) {
    st = launch_part(z, b);
    if (st == WF_OK)
      st = wf_req_wait(&b->req);
  }
  return st;
}

/* This rank's pieces of b (natural order from src) into the shard: moved (ZeRO-1, which
 * reduces once per step) or added (ZeRO-2, once per micro-batch). */
static wf_status take_mine(wf__zero *z, const wf__zbucket *b, const float *src)
{
  const wf_kset *k = wf_dev_kernels(z->dev, WF_DT_F32);
  for (int i = 0; i < b->np; i++) {
    const wf__zpiece *p = &b->p[i];
    if (p->owner != z->rank)
      continue;
    float *dst = z->gshard + (p->flat - z->s0);
    if (z->stage == 1) {
      wf_status st = wf__zero_copy(z, dst, src + p->pos, p->n);
      if (st != WF_OK)
        return st;
    } else {
      WF_K(k, residual)->forward(dst, dst, src + p->pos, p->n, NULL);
    }
  }
  return wf_dev_check(z->dev);
}

static wf_status complete(wf__zero *z, wf__zbucket *b)
{
  wf_status st = wait_parts(z, b);
  b->launched = false;
  if (st == WF_OK)
    st = take_mine(z, b, run_of(z, b));
  return st;
}

/* ZeRO-2: window w's reduction waited for, its pieces added, the window freed. */
static wf_status complete_window(wf__zero *z, int w)
{
  wf_status st = wf_req_wait(&z->win_req[w]);
  if (st == WF_OK)
    st = take_mine(z, &z->b[z->win_bucket[w]], z->win[w]);
  z->win_flying[w] = false;
  z->win_bucket[w] = -1;
  return st;
}

/* ZeRO-2: a free window, completing the oldest reduction (exposed time) if none is. */
static wf_status free_window(wf__zero *z, int *w)
{
  for (;;) {
    int old = -1;
    for (int i = 0; i < WF__ZPOOL; i++) {
      if (z->win_bucket[i] < 0) {
        *w = i;
        return WF_OK;
      }
      if (z->win_flying[i] && (old < 0 || z->win_seq[i] < z->win_seq[old]))
        old = i;
    }
    if (old < 0) { /* cannot happen: only one window is open at a time */
      WF_ERROR("ZeRO-2: no gradient window free and none in flight");
      return WF_EINVAL;
    }
    double t0 = wf_now();
    wf_status st = complete_window(z, old);
    z->wait_ms += (wf_now() - t0) * 1e3;
    if (st != WF_OK)
      return st;
  }
}

/* ZeRO-2: bucket i's gradients go to a free window (zeroed; backward adds into it). */
static wf_status open_window(wf__zero *z, int i)
{
  wf_status st = WF_OK;
  int w;
  WF_TRY(free_window(z, &w));
  z->win_bucket[w] = i;
  z->open = w;
  redirect(z, &z->b[i], z->win[w]);
  st = wf_dev_memset(z->dev, z->win[w], 0, z->b[i].count * sizeof(float), NULL);
fail:
  return st;
}

/* ZeRO-2: the open window's bucket is final: all-reduce it in place. */
static wf_status launch_window(wf__zero *z)
{
  int w = z->open;
  const wf__zbucket *b = &z->b[z->win_bucket[w]];
  z->open = -1;
  z->win_flying[w] = true;
  z->win_seq[w] = ++z->seq;
  z->comm_bytes += (double)b->count * sizeof(float);
  wf_status st = wf_comm_iallreduce(z->dp, z->win[w], z->win[w], b->count, WF_COMM_F32, WF_COMM_AVG,
                                    &z->win_req[w]);
  if (st != WF_OK)
    z->win_flying[w] = false, z->win_bucket[w] = -1;
  return st;
}

int wf__zero_bucket_of(const wf__zero *z, int gr)
{
  for (int i = 0; i < z->nb; i++)
    if (gr >= z->b[i].first_group && gr <= z->b[i].last_group)
      return i;
  return -1;
}

int wf__zero_chunk_of(const wf__zero *z, int i) { return (z->nl - z->b[i].first_group) / z->lc; }

/* Over chunks a bucket's window opens when backward reaches the bucket's first layer:
 * each chunk's backward runs its buckets in order and launches each one as it ends
 * (wf__zero_ready), so no other window is open then. Windows are reused as in 1F1B:
 * a free one, else the oldest reduction completed first. */
static wf_status open_lazy(wf__zero *z, int i)
{
  wf_status st = WF_OK;
  if (z->open >= 0 && z->win_bucket[z->open] == i)
    return WF_OK;
  WF_CHECK(z->open < 0, WF_EINVAL,
           "ZeRO-%d: backward reached layer bucket %d while bucket %d's gradients were not "
           "final (a chunk's backward left unfinished?)",
           z->stage, i, z->win_bucket[z->open]);
  st = open_window(z, i);
fail:
  return st;
}

void wf__zero_unit_hook(void *user, int j, bool backward)
{
  wf__zero *z = user;
  if (z->next) /* the chain's others, whose units are the same layers */
    wf__zero_unit_hook(z->next, j, backward);
  if (z->hook_err != WF_OK)
    return;
  int i = wf__zero_bucket_of(z, z->nl - j);
  wf_status st = WF_OK;
  if (i >= 0 && z->stage == 3)
    st = wf__fsdp_unit(z, i, backward);
  if (st == WF_OK && i >= 0 && z->lazy && backward && z->armed)
    st = open_lazy(z, i);
  if (st != WF_OK)
    z->hook_err = st;
}

wf_status wf__zero_begin(wf__zero *z)
{
  wf_status st = WF_OK;
  z->wait_ms = 0, z->comm_bytes = 0, z->launched_early = 0;
  WF_TRY(wf__fsdp_reshard(z));
  WF_TRY(wf_dev_memset(z->dev, z->gshard, 0, z->shard * sizeof(float), NULL));
  if (z->stage >= 2) {
    WF_TRY(wf_dev_memset(z->dev, z->edge, 0, z->edge_count * sizeof(float), NULL));
    if (z->open >= 0) /* the last step's window for a next micro-batch (or a failed one) */
      z->win_bucket[z->open] = -1, z->open = -1;
    if (z->nb > 0 && !z->lazy) /* over chunks the unit hook opens windows */
      WF_TRY(open_window(z, 0));
  }
  z->armed = z->stage >= 2;
  z->final = false;
fail:
  return st;
}

void wf__zero_arm(wf__zero *z) { z->armed = z->final = true; }

/* Drive MPI progress on b's part in flight and start its next part once it is done
 * (errors surface at the wait; a failed launch is kept for finish). */
static void progress_bucket(wf__zero *z, wf__zbucket *b)
{
  bool done = false;
  if (!b->launched || !b->req)
    return;
  if (wf_req_test(&b->req, &done) != WF_OK || !done || b->sent >= b->count)
    return;
  wf_status st = launch_part(z, b);
  if (st != WF_OK && z->hook_err == WF_OK)
    z->hook_err = st;
}

/* Drive MPI progress on the reductions in flight (errors surface at their wait). */
static void progress(wf__zero *z)
{
  bool done;
  for (int i = 0; i < z->nb; i++)
    progress_bucket(z, &z->b[i]);
  for (int w = 0; w < WF__ZPOOL; w++)
    if (z->win_flying[w] && z->win_req[w])
      wf_req_test(&z->win_req[w], &done);
  progress_bucket(z, &z->late);
}

/* Group gr's gradients are final (for this micro-batch). A failure here leaves the
 * bucket unlaunched (ZeRO-1: finish launches it again and reports the error) or is kept
 * for finish (ZeRO-2). */
wf_status wf__zero_ready(wf__zero *z, int gr)
{
  wf_status st = WF_OK;
  if (!z->armed)
    return WF_OK;
  progress(z);
  /* one stage, the last micro-batch's embeddings done: the late tensors are final (the
   * tied and tp sums are linear, so the dp average may come first; launch_layers waits
   * for it before they run) */
  if (gr == z->nl + 1 && z->final && !z->late.launched && z->late.count > 0) {
    if (launch(z, &z->late) == WF_OK)
      z->launched_early++;
    return WF_OK;
  }
  int i = wf__zero_bucket_of(z, gr);
  if (i < 0 || z->b[i].last_group != gr)
    return WF_OK;
  wf__zbucket *b = &z->b[i];
  if (z->stage == 1) {
    if (!b->launched && launch(z, b) == WF_OK)
      z->launched_early++;
    return WF_OK;
  }
  WF_CHECK(z->open >= 0 && z->win_bucket[z->open] == i, WF_EINVAL,
           "ZeRO-2: gradients of layer group %d are final but its window is not open (a "
           "schedule whose backward visits the layers out of order?)",
           gr);
  WF_TRY(launch_window(z));
  z->launched_early++;
  if (z->lazy) /* the schedule decides which chunk's backward comes next */
    return WF_OK;
  /* the next bucket backward writes: the following one, or the first again for the
   * next micro-batch */
  st = open_window(z, i + 1 < z->nb ? i + 1 : 0);
fail:
  return st;
}

/* Before grads.c's tp and tied sums: ZeRO-1's layer buckets that backward's hook did not
 * launch, and the late bucket's reduction, when backward launched it, completed (the
 * sums write the same gradients; its pieces are taken after them, in finish). */
wf_status wf__zero_launch_layers(wf__zero *z)
{
  wf_status st = WF_OK;
  if (z->stage == 1)
    for (int i = 0; i < z->nb; i++)
      if (!z->b[i].launched)
        WF_TRY(launch(z, &z->b[i]));
  if (z->late.launched)
    WF_TRY(wait_parts(z, &z->late));
fail:
  return st;
}

/* After grads.c's tp and tied sums: the late bucket, then every reduction in flight. */
wf_status wf__zero_finish(wf__zero *z)
{
  wf_status st = z->hook_err;
  z->hook_err = WF_OK;
  if (st != WF_OK)
    goto fail;
  if (!z->late.launched && z->late.count > 0) /* not launched by backward */
    WF_TRY(launch(z, &z->late));
  for (int i = 0; i < z->nb; i++)
    if (z->b[i].launched)
      WF_TRY(complete(z, &z->b[i]));
  for (int w = 0; w < WF__ZPOOL; w++)
    if (z->win_flying[w])
      WF_TRY(complete_window(z, w));
  WF_TRY(complete(z, &z->late));
  if (z->rep) { /* HSDP: the fsdp group's average, averaged over the replicas */
    z->comm_bytes += (double)z->shard * sizeof(float);
    WF_TRY(wf_comm_allreduce(z->rep, z->gshard, z->gshard, z->shard, WF_COMM_F32, WF_COMM_AVG));
  }
  if (z->post != 1.0f) /* the experts' average over all dp ranks (grads.c) */
    WF_K(wf_dev_kernels(z->dev, WF_DT_F32), norm)->scale(z->gshard, z->post, z->shard, NULL);
fail:
  z->armed = false;
  return st;
}

/* ---- the parameters --------------------------------------------------------------------- */

/* Every rank's shard of the parameters into the model's flat vector (ZeRO-1/2), where
 * shard r is the contiguous run [r * shard, (r + 1) * shard) cut at n: an all-gather with
 * uneven counts done in place, one broadcast from each owner. No staging buffer, and an
 * all-gather's bytes. */
static wf_status gather_whole(wf__zero *z)
{
  wf_status st = WF_OK;
  float *params = wf_model_params(z->m);
  for (int r = 0; r < z->size; r++) {
    size_t a = WF_MIN((size_t)r * z->shard, z->n), b = WF_MIN(a + z->shard, z->n);
    if (b > a)
      WF_TRY(wf_comm_bcast(z->dp, params + z->base + a, b - a, WF_COMM_F32, r));
  }
fail:
  return st;
}

/* Every rank's updated shard into every rank's parameters (ZeRO-1/2), or ZeRO-3's
 * gathered units forgotten. */
wf_status wf__zero_gather(wf__zero *z)
{
  if (z->stage == 3)
    return wf__fsdp_refresh(z);
  return gather_whole(z);
}

/* ---- accessors --------------------------------------------------------------------------- */

float *wf__zero_shard(wf__zero *z) { return z->gshard; }

void wf__zero_bounds(const wf__zero *z, size_t *s0, size_t *s1) { *s0 = z->s0, *s1 = z->s1; }

void wf__zero_stats(const wf__zero *z, double *wait_ms, double *comm_bytes, int *launched_early,
                    int *buckets)
{
  *wait_ms = z->wait_ms, *comm_bytes = z->comm_bytes;
  *launched_early = z->launched_early, *buckets = z->nb + 1;
}

/* Gradient memory this rank holds beyond the model's flat buffer: the shard, and under
 * ZeRO-2/3 edge and the windows (each at least one float, as allocated: the experts'
 * class has no unlayered tensors, so an empty edge). */
size_t wf__zero_grad_bytes(const wf__zero *z)
{
  size_t f = z->shard;
  if (z->stage >= 2)
    f += WF_MAX(z->edge_count, (size_t)1) + WF__ZPOOL * WF_MAX(z->win_count, (size_t)1);
  return f * sizeof(float);
}

/* Parameter memory beyond the model's flat vector: none below ZeRO-3 (the all-gather
 * is in place), ZeRO-3's shard, edge and windows (with their 16-bit copies). */
size_t wf__zero_param_bytes(const wf__zero *z)
{
  if (z->stage != 3)
    return 0;
  size_t gathered =
      WF_MAX(z->edge_count, (size_t)1) + (size_t)z->npw * WF_MAX(z->win_count, (size_t)1);
  return z->shard * sizeof(float) + gathered * (sizeof(float) + wf_model_low_bytes(z->prec));
}

/* ---- the memory formulas (wf_parallel.h) ---------------------------------------------- */

wf_status wf__zero_mem_plan(const wf_model_dims *d, const wf_model_shard *s, wf_precision prec,
                            int size, int rank, int stage, size_t bucket_bytes, bool keep,
                            wf__zclass cls, wf_grads_mem *out)
{
  wf_status st = WF_OK;
  wf__zero *z = NULL;
  WF_TRY(plan(&z, d, s, prec, size, rank, stage, bucket_bytes, keep, cls));
  out->param = wf__zero_param_bytes(z);
  out->grad = wf__zero_grad_bytes(z);
  out->model_params = stage < 3; /* the trainer's ZeRO-3 model never allocates them */
  out->model_grads = stage < 2;  /* nor its ZeRO-2/3 model these (wf_model_opts.zero) */
  out->lo = z->s0, out->hi = z->s1;
  out->n_buckets = z->nb + 1;
  wf__zero_destroy(z);
fail:
  return st;
}
