/*
 * save.c - writing a checkpoint: a staging directory, every rank's shard files, rank 0's
 * manifest of all of them, then publishing the step and `latest` (see wf_ckpt.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "ckpt_int.h"

/* Rank 0: a fresh, empty staging directory. */
static wf_status make_stage(const char *root, const char *stage)
{
  wf_status st = WF_OK;
  WF_CHECK(wf__remove_tree(stage) == 0, WF_EIO,
           "%s: cannot remove the leftover of an interrupted checkpoint: %s", stage,
           strerror(errno));
  WF_CHECK(mkdir(stage, 0755) == 0, WF_EIO, "%s: cannot create: %s", stage, strerror(errno));
  st = wf_file_sync_dir(root);
fail:
  return st;
}

/* Rank 0: the manifest into the staging directory, then publish it and prune. */
static wf_status finalize(const wf_ckpt_target *t, int step, const char *stage,
                          const uint64_t *recs, json_t *stream)
{
  wf_status st = WF_OK;
  const char *root = t->cfg->train.checkpoint_dir;
  char name[32], final[WF__PATH_LEN], path[WF__PATH_LEN];
  char *text = wf__manifest_text(t, step, recs, wf__size_of(wf__ckpt_world(t)), stream);
  WF_CHECK(text, WF_ENOMEM, "checkpoint: cannot build the manifest (out of memory)");
  wf__pathf(path, sizeof path, "%s/" WF__MANIFEST, stage);
  WF_TRY(wf_file_write_atomic(path, text, strlen(text), 0644));
  wf__step_name(name, sizeof name, step);
  wf__pathf(final, sizeof final, "%s/%s", root, name);
  WF_TRY(wf__publish(root, stage, final));
  wf__prune(root, t->cfg->train.keep, step);
fail:
  free(text);
  return st;
}

/* Every rank's record of what it wrote, gathered on every rank, and the data position;
 * rank 0 finalizes. */
static wf_status gather_and_finalize(const wf_ckpt_target *t, int step, const char *stage,
                                     const wf__shard_rec *rec)
{
  wf_status st = WF_OK;
  wf_comm *w = wf__ckpt_world(t);
  int n = wf__size_of(w);
  uint64_t mine[WF__REC_LEN], *recs = NULL;
  json_t *stream = NULL;
  WF_TRY(wf__data_state_capture(t, step, &stream));
  wf__pack_rec(mine, t, rec);
  WF_CHECK_ALLOC(recs = malloc((size_t)n * WF__REC_LEN * sizeof *recs));
  if (w)
    WF_TRY(wf_comm_allgather(w, mine, recs, WF__REC_LEN, WF_COMM_U64));
  else
    memcpy(recs, mine, sizeof mine);
  if (wf__rank_of(w) == 0) {
    st = finalize(t, step, stage, recs, stream);
    stream = NULL; /* the manifest took it */
  }
fail:
  json_decref(stream);
  free(recs);
  return st;
}

wf_status wf_ckpt_save(const wf_ckpt_target *t, int step)
{
  wf_status st = WF_OK;
  int me = wf__rank_of(wf__ckpt_world(t));
  const char *root = t->cfg->train.checkpoint_dir;
  char stage[WF__PATH_LEN], what[64];
  wf__shard_rec rec = {0};
  double t0 = wf_now();
  wf__pathf(stage, sizeof stage, "%s/.tmp-step-%06d", root, step);
  wf__pathf(what, sizeof what, "the checkpoint of step %d", step);
  WF_TRY(wf__ckpt_agree(t, me == 0 ? make_stage(root, stage) : WF_OK, what));
  /* dp rank 0 writes the model file; under ZeRO-3 every dp rank streams its shard to it */
  if (t->replica == 0 && (wf__rank_of(t->dp_comm) == 0 || t->param_shard))
    st = wf__write_model(t, stage, step, &rec);
  if (st == WF_OK && t->replica == 0) /* HSDP: the other fsdp groups hold the same state */
    st = wf__write_optim(t, stage, step, &rec);
  if ((st = wf__ckpt_agree(t, st, what)) != WF_OK) {
    if (me == 0)
      wf__remove_tree(stage); /* best effort; `latest` still names the previous one */
    return st;
  }
  WF_TRY(wf__ckpt_agree(t, gather_and_finalize(t, step, stage, &rec), what));
  if (me == 0)
    WF_INFO("checkpoint: step %d saved to %s/step-%06d in %.2f s", step, root, step, wf_now() - t0);
fail:
  return st;
}
