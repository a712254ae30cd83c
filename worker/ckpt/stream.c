/*
 * stream.c - parameters passed to one writing rank in bounded chunks, so that under
 * ZeRO-3 neither a checkpoint's model file nor --save's whole model is gathered on the
 * device: each rank's piece (its dp shard's elements [lo, hi) of its (pp, tp) shard's flat
 * vector) goes to the writer WF__CHUNK bytes at a time, in rank order, and the writer
 * hands each chunk to a sink (a model file's hashed write, or --save's whole-model array).
 *
 * Protocol over a communicator c, root `root`: every other rank sends a wf__piece (its
 * range and geometry, or an empty one), then its range in chunks; the root takes its own
 * piece first in rank order, then each rank's. Nothing can stop it halfway: a rank whose
 * device read fails sends zeros in its place and a sink that fails is skipped for the
 * rest, so the root receives every message and no rank waits on one that never comes;
 * the caller agrees on the statuses afterwards.
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt_int.h"

#define CHUNK_FLOATS (WF__CHUNK / sizeof(float))

/* Rank r's piece into the sink, chunk by chunk: from x (device memory) when it is this
 * rank's own, else received from r. */
static wf_status take(wf_comm *c, int r, const wf__piece *p, wf_dev *dev, const float *x,
                      float *buf, wf__sink sink, void *user)
{
  wf_status st = WF_OK, got;
  for (uint64_t a = p->lo; a < p->hi; a += CHUNK_FLOATS) {
    uint64_t b = WF_MIN(p->hi, a + CHUNK_FLOATS);
    size_t n = (size_t)(b - a);
    if (x)
      got = wf_dev_read(dev, buf, x + (a - p->lo), n * sizeof *buf);
    else
      got = wf_comm_recv(c, buf, n, WF_COMM_F32, r);
    if (got != WF_OK && !x)
      return got; /* the communicator itself failed: nothing more will arrive */
    st = st == WF_OK ? got : st;
    if (st == WF_OK)
      st = sink(user, p, buf, a, b);
  }
  return st;
}

/* This rank's piece to the root: a device read that fails sends zeros (the root expects
 * every chunk) and the status says so. */
static wf_status give(wf_comm *c, int root, const wf__piece *p, wf_dev *dev, const float *x,
                      float *buf)
{
  wf_status st = WF_OK;
  WF_TRY(wf_comm_send(c, p, sizeof *p, WF_COMM_U8, root));
  for (uint64_t a = p->lo; a < p->hi; a += CHUNK_FLOATS) {
    size_t n = (size_t)(WF_MIN(p->hi, a + CHUNK_FLOATS) - a);
    wf_status got = wf_dev_read(dev, buf, x + (a - p->lo), n * sizeof *buf);
    if (got != WF_OK)
      memset(buf, 0, n * sizeof *buf);
    st = st == WF_OK ? got : st;
    WF_TRY(wf_comm_send(c, buf, n, WF_COMM_F32, root));
  }
fail:
  return st;
}

wf_status wf__stream_pieces(wf_comm *c, int root, const wf__piece *mine, wf_dev *dev,
                            const float *x, wf__sink sink, void *user)
{
  wf_status st = WF_OK, got;
  int me = wf__rank_of(c), n = wf__size_of(c);
  float *buf = malloc(WF__CHUNK);
  if (!buf)
    WF_ERROR("checkpoint: out of memory for a %u-byte transfer buffer", WF__CHUNK);
  /* every rank holds its buffer before any message, or none sends */
  WF_TRY(wf_comm_agree(c, buf ? WF_OK : WF_ENOMEM, NULL));
  if (me != root) {
    st = give(c, root, mine, dev, x, buf);
    goto fail;
  }
  for (int r = 0; r < n; r++) {
    wf__piece p = *mine;
    if (r != me && (got = wf_comm_recv(c, &p, sizeof p, WF_COMM_U8, r)) != WF_OK) {
      st = got;
      break; /* the communicator failed */
    }
    got = take(c, r, &p, dev, r == me ? x : NULL, buf, sink, user);
    st = st == WF_OK ? got : st;
  }
fail:
  free(buf);
  return st;
}

/* --save's sink: each chunk's counted elements added into the zeroed whole model, as
 * wf_model_export_full adds them (the tied head once, at its first stage). */
typedef struct full_sink {
  const wf_model_dims *d;
  float *full;
} full_sink;

static wf_status to_full(void *user, const wf__piece *p, const float *x, uint64_t lo, uint64_t hi)
{
  full_sink *s = user;
  wf_model_shard_exchange(s->d, &p->geo, (float *)x, (size_t)lo, (size_t)hi, s->full, true);
  return WF_OK;
}

wf_status wf_ckpt_collect_model(const wf_ckpt_target *t, float **full)
{
  wf_status st = WF_OK;
  wf_comm *w = wf__ckpt_world(t);
  const wf_model_dims *d = wf_model_get_dims(t->model);
  wf__piece mine = {.geo = *wf_model_get_shard(t->model)};
  const float *x = t->param_shard;
  *full = NULL;
  if (wf__rank_of(w) == 0 && !(*full = calloc(wf_model_num_params(d), sizeof **full)))
    WF_ERROR("--save: out of memory for the model's %zu parameters", wf_model_num_params(d));
  WF_TRY(wf_comm_agree(w, wf__rank_of(w) != 0 || *full ? WF_OK : WF_ENOMEM, NULL));
  if (t->replica != 0) /* HSDP: fsdp group 0 holds the same parameters */
    x = NULL;
  else if (x)
    wf__optim_range(t, &mine.lo, &mine.hi);
  else if (wf__rank_of(t->edp_comm ? t->edp_comm : t->dp_comm) == 0) /* each ep rank's experts */
    x = wf_model_params(t->model), mine.hi = wf_model_local_params(t->model);
  if (x && t->expert_shard.params) /* every ep rank's dense shard is its own: counted */
    mine.geo.ep_rank = 0;
  full_sink s = {d, *full};
  st = wf__stream_pieces(w, 0, &mine, wf_model_dev(t->model), x, to_full, &s);
  if (st == WF_OK && t->expert_shard.params) { /* ZeRO-3 under ep: the experts' shards */
    wf__piece ex = {
        .geo = *wf_model_get_shard(t->model), .lo = t->expert_shard.lo, .hi = t->expert_shard.hi};
    st = wf__stream_pieces(w, 0, &ex, wf_model_dev(t->model), t->expert_shard.params, to_full, &s);
  }
fail:
  if (st != WF_OK) {
    free(*full);
    *full = NULL;
  }
  return st;
}
