/*
 * fsdp.c - ZeRO-3's sharded parameters (parallel_int.h; zero.c reduces its gradients as
 * ZeRO-2's). The rank keeps its shard of the parameters (pshard) and no flat vector.
 * Units are the layer buckets and the late tensors (the embeddings, the final norm, a head:
 * `pedge`, gathered once after every update and kept, since a tied embedding is read at both
 * ends of a step). A layer bucket is gathered into a window just before its first
 * layer's forward and again before its backward (the unit hook), the next unit's gather
 * is started before the current one computes (prefetch), and a window is reused by the
 * unit after next: two windows hold the parameters. With
 * parallel.reshard_after_forward=false every bucket has its own window, gathered once
 * per step and kept until the update. A window holds its bucket in the natural order
 * (by flat offset), where each rank's pieces form one contiguous segment (zero.c's cut),
 * so a gather is an all-gather with uneven counts done in place: this rank copies its
 * pieces into its segment and every segment is broadcast from its owner (one broadcast
 * per rank that owns part of the bucket). That moves an all-gather's bytes, with no
 * staging buffer and no padding, exactly. Under the interleaved
 * schedule the units are zero.c's chunk-bounded buckets, gathered in the order the
 * schedule runs them (need() takes any order); the prefetch stays inside the chunk.
 */
#include <stdlib.h>
#include <string.h>

#include "parallel_int.h"

/* Point the model's parameter tensors of b into base (natural order; NULL = back to the
 * flat vector); under mixed precision the GEMM weights are stored in 16 bits into low
 * alongside (the same positions, 2 bytes each). */
static void redirect_params(wf__zero *z, const wf__zbucket *b, float *base, void *low)
{
  size_t lb = wf_model_low_bytes(wf_model_precision(z->m));
  for (int i = 0; i < b->nr; i++)
    wf_model_set_param_tensor(z->m, b->r[i].tensor, b->r[i].j, base ? base + b->r[i].pos : NULL,
                              low ? (char *)low + b->r[i].pos * lb : NULL);
}

/* Start gathering b into win (natural order): my pieces into my segment, then each
 * owner's segment broadcast from it; reqs (size of them) NULL = blocking. */
static wf_status gather_start(wf__zero *z, const wf__zbucket *b, float *win, wf_req **reqs)
{
  wf_status st = WF_OK;
  for (int i = 0; i < b->np; i++)
    if (b->p[i].owner == z->rank)
      WF_TRY(wf__zero_copy(z, win + b->p[i].pos, z->pshard + (b->p[i].flat - z->s0), b->p[i].n));
  z->comm_bytes += (double)b->count * sizeof(float);
  for (int r = 0; r < z->size; r++) {
    size_t len = b->seg[r + 1] - b->seg[r];
    if (len == 0)
      continue;
    if (reqs)
      WF_TRY(wf_comm_ibcast(z->dp, win + b->seg[r], len, WF_COMM_F32, r, &reqs[r]));
    else
      WF_TRY(wf_comm_bcast(z->dp, win + b->seg[r], len, WF_COMM_F32, r));
  }
fail:
  return st;
}

/* Window w's gather in flight (its requests), waited for or none. */
static wf_req **reqs_of(wf__zero *z, int w) { return &z->pwin_req[(size_t)w * (size_t)z->size]; }

static bool gathering(wf__zero *z, int w)
{
  wf_req **r = reqs_of(z, w);
  for (int i = 0; i < z->size; i++)
    if (r[i])
      return true;
  return false;
}

static wf_status gather_wait(wf__zero *z, int w) { return wf_req_waitall(reqs_of(z, w), z->size); }

/* The window for bucket i: its own with keep, else the one not in use. */
static int window_for(const wf__zero *z, int i)
{
  if (z->keep)
    return i;
  return z->pcur == 0 ? 1 : 0;
}

static int window_of(const wf__zero *z, int i)
{
  for (int w = 0; w < z->npw; w++)
    if (z->pwin_bucket[w] == i)
      return w;
  return -1;
}

/* Bucket i's parameters gathered into its window and the model pointed at them. */
static wf_status need(wf__zero *z, int i)
{
  wf_status st = WF_OK;
  int w = window_of(z, i);
  if (w < 0) {
    w = window_for(z, i);
    WF_TRY(gather_wait(z, w)); /* an unneeded prefetch still in flight */
    z->pwin_bucket[w] = i;
    WF_TRY(gather_start(z, &z->b[i], z->pwin[w], reqs_of(z, w)));
  }
  if (gathering(z, w)) {
    double t0 = wf_now();
    WF_TRY(gather_wait(z, w));
    z->wait_ms += (wf_now() - t0) * 1e3;
  }
  redirect_params(z, &z->b[i], z->pwin[w], z->low ? z->plow[w] : NULL);
  z->pcur = w;
fail:
  if (st != WF_OK && w >= 0)
    z->pwin_bucket[w] = -1;
  return st;
}

/* Bucket `from`'s neighbour i gathered ahead. Over chunks only inside from's chunk:
 * which chunk runs next is the schedule's choice. */
static wf_status prefetch(wf__zero *z, int i, int from)
{
  if (i < 0 || i >= z->nb || window_of(z, i) >= 0)
    return WF_OK;
  if (z->lazy && wf__zero_chunk_of(z, i) != wf__zero_chunk_of(z, from))
    return WF_OK;
  int w = window_for(z, i);
  if (gathering(z, w)) /* still gathering something: do not wait for it here */
    return WF_OK;
  z->pwin_bucket[w] = i;
  wf_status st = gather_start(z, &z->b[i], z->pwin[w], reqs_of(z, w));
  if (st != WF_OK)
    z->pwin_bucket[w] = -1;
  return st;
}

/* From the model's unit hook (wf__zero_unit_hook): bucket i computes next (backward: its
 * gradient). Forward walks the buckets from the last index down, backward up. need()
 * gathers whatever bucket comes, in any order, into a window other than the one in use,
 * so an interleaved schedule's chunk order is correct; only the prefetch guesses. */
wf_status wf__fsdp_unit(wf__zero *z, int i, bool backward)
{
  wf_status st = need(z, i);
  if (st == WF_OK)
    st = prefetch(z, backward ? i + 1 : i - 1, i);
  return st;
}

/* After an update the gathered copies are stale: forget the windows, regather edge. */
wf_status wf__fsdp_refresh(wf__zero *z)
{
  wf_status st = WF_OK;
  for (int w = 0; w < z->npw; w++) {
    WF_TRY(gather_wait(z, w));
    z->pwin_bucket[w] = -1;
  }
  z->pcur = -1;
  st = gather_start(z, &z->late, z->pedge, NULL);
  if (st == WF_OK && z->sharded) /* the edge's rounded weights follow the update */
    redirect_params(z, &z->late, z->pedge, z->pedge_low);
  if (st == WF_OK)
    st = z->hook_err;
fail:
  return st;
}

/* Creation: the shard, edge and windows. A model created without flat parameters has its
 * shard filled by the trainer (initialised or resumed into it); one created with them by
 * reshard at the first step. */
wf_status wf__fsdp_alloc(wf__zero *z)
{
  wf_status st = WF_OK;
  WF_TRY(wf_dev_alloc_floats(z->dev, &z->pshard, z->shard));
  WF_TRY(wf_dev_alloc_floats(z->dev, &z->pedge, WF_MAX(z->edge_count, (size_t)1)));
  WF_CHECK_ALLOC(z->pwin = calloc((size_t)WF_MAX(z->npw, 1), sizeof *z->pwin));
  WF_CHECK_ALLOC(z->pwin_bucket = calloc((size_t)WF_MAX(z->npw, 1), sizeof *z->pwin_bucket));
  WF_CHECK_ALLOC(z->pwin_req =
                     calloc((size_t)WF_MAX(z->npw, 1) * (size_t)z->size, sizeof *z->pwin_req));
  WF_CHECK_ALLOC(z->plow = calloc((size_t)WF_MAX(z->npw, 1), sizeof *z->plow));
  size_t lb = wf_model_low_bytes(wf_model_precision(z->m));
  z->low = lb > 0;
  if (z->low)
    WF_TRY(wf_dev_alloc(z->dev, &z->pedge_low, WF_MAX(z->edge_count, (size_t)1) * lb));
  for (int w = 0; w < z->npw; w++) {
    if (z->low)
      WF_TRY(wf_dev_alloc(z->dev, &z->plow[w], WF_MAX(z->win_count, (size_t)1) * lb));
    size_t f = z->win_count; /* with keep too: every window one largest bucket */
    WF_TRY(wf_dev_alloc_floats(z->dev, &z->pwin[w], WF_MAX(f, (size_t)1)));
    z->pwin_bucket[w] = -1;
  }
fail:
  return st;
}

/* From here the model reads its parameters from edge and the windows (the unit hook). */
void wf__fsdp_start_sharded(wf__zero *z)
{
  redirect_params(z, &z->late, z->pedge, z->pedge_low);
  wf__zero_set_hook(z);
  z->sharded = true;
}

/* A model that holds its flat parameters (created with them): the rank's shard taken
 * from them, the edge gathered, then the flat vector
 * freed and the hook set. */
wf_status wf__fsdp_reshard(wf__zero *z)
{
  wf_status st = WF_OK;
  if (z->stage != 3 || z->sharded)
    return WF_OK;
  WF_TRY(wf__zero_copy(z, z->pshard, wf_model_params(z->m) + z->s0, z->s1 - z->s0));
  WF_TRY(wf__fsdp_refresh(z));
  wf__fsdp_start_sharded(z);
  wf_model_drop_params(z->m);
fail:
  return st;
}

float *wf__zero_param_shard(wf__zero *z) { return z->pshard; }

void wf__fsdp_free(wf__zero *z)
{
  for (int i = 0; i < z->npw && z->pwin; i++) {
    if (z->pwin_req)
      gather_wait(z, i);
    wf_dev_free(z->dev, z->pwin[i]);
  }
  for (int i = 0; i < z->npw && z->plow; i++)
    wf_dev_free(z->dev, z->plow[i]);
  free(z->plow);
  wf_dev_free(z->dev, z->pedge_low);
  free(z->pwin);
  free(z->pwin_bucket);
  free(z->pwin_req);
  wf_dev_free(z->dev, z->pshard);
  wf_dev_free(z->dev, z->pedge);
}
