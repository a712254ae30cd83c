/*
 * datastate.c - a data.source stream's position in the manifest, and back.
 *
 * A stream is not a function of the step (the other sources are: their position is the
 * step alone): its position is each lane's (wf_io.h's wf_data_state_*). Each dp rank
 * knows its own lanes; the ranks of the first pipeline stage's first tensor shard hand
 * theirs to their checkpoint writers with their files (saver.c), as the JSON of the
 * position with every other lane zero, and world rank 0's writer merges the parts into
 * the whole, element by element by their maximum (the lanes are disjoint and every field
 * is a non-negative count, so that is the JSON of the merged counts), into the manifest
 * as "data": {"stream": ...}. A resume hands every rank the whole position; each takes
 * its own lanes, whatever the dp that saved it.
 */
#include <stdlib.h>

#include <jansson.h>

#include "ckpt_int.h"
#include "wf_io.h"

/* The ranks whose lanes count: one copy of each dp rank's (the others read the same
 * rows, or none). */
static bool contributes(const wf_ckpt_target *t) { return t->pp_rank == 0 && t->tp_rank == 0; }

wf_status wf__data_state_part(const wf_ckpt_target *t, int step, json_t **part)
{
  wf_status st = WF_OK;
  size_t n = t->data ? wf_data_state_len(t->data) : 0; /* alike on every rank */
  uint64_t *v = NULL;
  char err[1024] = "", *text = NULL;
  *part = NULL;
  if (n == 0 || !contributes(t))
    return WF_OK;
  WF_CHECK_ALLOC(v = calloc(n, sizeof *v));
  st = wf_data_state_get(t->data, step, v, err, sizeof err);
  WF_CHECK(st == WF_OK, st, "checkpoint: the data position: %s", err);
  WF_CHECK_ALLOC(text = wf_data_state_json(t->data, step, v));
  WF_CHECK_ALLOC(*part = json_loads(text, 0, NULL));
fail:
  free(text);
  free(v);
  return st;
}

/* b into a, field by field (a and b of one shape: the same run's parts). */
static json_t *max_of(json_t *a, json_t *b)
{
  size_t i;
  const char *k;
  json_t *x;
  if (json_is_null(a))
    return json_incref(b);
  if (json_is_integer(a) && json_is_integer(b))
    return json_integer(WF_MAX(json_integer_value(a), json_integer_value(b)));
  if (json_is_array(a) && json_is_array(b))
    json_array_foreach(a, i, x) json_array_set_new(a, i, max_of(x, json_array_get(b, i)));
  else if (json_is_object(a) && json_is_object(b))
    json_object_foreach(a, k, x) json_object_set_new(a, k, max_of(x, json_object_get(b, k)));
  return json_incref(a); /* a string, a real: the same on every rank */
}

void wf__data_state_merge(json_t **whole, json_t *part)
{
  if (!part)
    return;
  if (!*whole) {
    *whole = json_incref(part);
    return;
  }
  json_t *m = max_of(*whole, part);
  json_decref(*whole);
  *whole = m;
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
