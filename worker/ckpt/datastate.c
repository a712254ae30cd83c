/*
 * datastate.c - a data.source stream's position in the manifest, and back.
 *
 * A stream is not a function of the step (the other sources are: their position is the
 * step alone): its position is each lane's (wf_io.h's wf_data_state_*). Each dp rank
 * knows its own lanes; the ranks of the first pipeline stage's first tensor shard pass
 * theirs, every other rank zeros, and one element-wise maximum over the job is the whole
 * position (the lanes are disjoint and every field is a non-negative count). Rank 0
 * writes it into the manifest as "data": {"stream": ...}. A resume hands every rank the
 * whole position; each takes its own lanes, whatever the dp that saved it.
 */
#include <stdlib.h>

#include <jansson.h>

#include "ckpt_int.h"
#include "wf_io.h"

/* The ranks whose lanes count: one copy of each dp rank's (the others read the same
 * rows, or none). */
static bool contributes(const wf_ckpt_target *t) { return t->pp_rank == 0 && t->tp_rank == 0; }

wf_status wf__data_state_capture(const wf_ckpt_target *t, int step, json_t **stream)
{
  wf_status st = WF_OK, mine = WF_OK;
  size_t n = t->data ? wf_data_state_len(t->data) : 0; /* alike on every rank */
  wf_comm *w = wf__ckpt_world(t);
  uint64_t *v = NULL;
  char err[1024] = "", *text = NULL;
  *stream = NULL;
  if (n == 0)
    return WF_OK;
  WF_CHECK_ALLOC(v = calloc(n, sizeof *v));
  if (contributes(t))
    mine = wf_data_state_get(t->data, step, v, err, sizeof err);
  if (mine != WF_OK)
    WF_ERROR("checkpoint: the data position: %s", err);
  WF_TRY(wf__ckpt_agree(t, mine, "saving the data position"));
  if (w)
    WF_TRY(wf_comm_allreduce(w, v, v, n, WF_COMM_U64, WF_COMM_MAX));
  if (wf__rank_of(w) == 0) {
    WF_CHECK_ALLOC(text = wf_data_state_json(t->data, step, v));
    WF_CHECK_ALLOC(*stream = json_loads(text, 0, NULL));
  }
fail:
  free(text);
  free(v);
  return st;
}

wf_status wf__data_state_restore(const wf_ckpt_target *t, const char *text, const char *dir)
{
  wf_status st = WF_OK;
  char err[2048] = "", *pos = NULL;
  json_t *o = NULL, *s = NULL;
  if (!t->data || wf_data_state_len(t->data) == 0)
    return WF_OK;
  o = json_loads(text, 0, NULL); /* rank 0 read these bytes already */
  s = o ? json_object_get(json_object_get(o, "data"), "stream") : NULL;
  if (!s) {
    if (wf__rank_of(wf__ckpt_world(t)) == 0)
      WF_INFO("checkpoint %s holds no data.source position (another kind of data trained it): "
              "the streams start from their beginning",
              dir);
    goto fail;
  }
  WF_CHECK_ALLOC(pos = json_dumps(s, JSON_COMPACT));
  st = wf_data_state_set(t->data, pos, err, sizeof err);
  /* every rank checks the same JSON against the same files: rank 0 says it for all */
  if (st != WF_OK && wf__rank_of(wf__ckpt_world(t)) == 0)
    WF_ERROR("checkpoint %s: %s", dir, err);
  st = wf__ckpt_agree(t, st, "restoring the data position");
fail:
  free(pos);
  json_decref(o);
  return st;
}
