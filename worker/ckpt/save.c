/*
 * save.c - writing a checkpoint: a staging directory, every rank's shard files, rank 0's
 * manifest of all of them, then publishing the step and `latest` (see wf_ckpt.h). The
 * steps are shared by the two ways to save: at once (wf_ckpt_save) and from a snapshot
 * written in the background (saver.c).
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

wf_status wf__save_begin(const wf_ckpt_target *t, int step, char *stage, size_t len)
{
  const char *root = t->cfg->train.checkpoint_dir;
  char what[64];
  wf__pathf(stage, len, "%s/.tmp-step-%06d", root, step);
  wf__ckpt_what(what, sizeof what, step);
  bool me0 = wf__rank_of(wf__ckpt_world(t)) == 0;
  return wf__ckpt_agree(t, me0 ? make_stage(root, stage) : WF_OK, what);
}

wf_status wf__write_mine(const wf_ckpt_target *t, int step, const char *stage, wf__shard_rec *rec,
                         wf_afile *keep, int *kept)
{
  wf_status st = WF_OK;
  *rec = (wf__shard_rec){0};
  /* dp rank 0 writes the model file; under ZeRO-3 every dp rank streams its shard to it */
  if (t->replica == 0 && (wf__rank_of(t->dp_comm) == 0 || t->param_shard)) {
    st = wf__write_model(t, stage, step, rec, keep ? &keep[*kept] : NULL);
    *kept += keep && st == WF_OK && rec->has_model;
  }
  if (st == WF_OK && t->replica == 0) { /* HSDP: the other fsdp groups hold the same state */
    st = wf__write_optim(t, stage, step, rec, keep ? &keep[*kept] : NULL);
    *kept += keep && st == WF_OK && rec->has_optim;
  }
  return st;
}

wf_status wf__save_files(const wf_ckpt_target *t, int step, const char *stage, wf__shard_rec *rec,
                         wf_afile *keep, int *kept)
{
  wf_status st = wf__write_mine(t, step, stage, rec, keep, kept);
  char what[64];
  wf__ckpt_what(what, sizeof what, step);
  if ((st = wf__ckpt_agree(t, st, what)) != WF_OK) {
    for (int i = 0; keep && i < *kept; i++)
      wf_afile_abort(&keep[i]);
    if (wf__rank_of(wf__ckpt_world(t)) == 0)
      wf__remove_tree(stage); /* best effort; `latest` still names the previous one */
  }
  return st;
}

wf_status wf__save_manifest(const wf_ckpt_target *t, int step, const wf__shard_rec *rec,
                            char **text)
{
  wf_status st = WF_OK;
  wf_comm *w = wf__ckpt_world(t);
  int n = wf__size_of(w);
  uint64_t mine[WF__REC_LEN], *recs = NULL;
  json_t *stream = NULL;
  *text = NULL;
  WF_TRY(wf__data_state_capture(t, step, &stream));
  wf__pack_rec(mine, t, rec);
  WF_CHECK_ALLOC(recs = malloc((size_t)n * WF__REC_LEN * sizeof *recs));
  if (w)
    WF_TRY(wf_comm_allgather(w, mine, recs, WF__REC_LEN, WF_COMM_U64));
  else
    memcpy(recs, mine, sizeof mine);
  if (wf__rank_of(w) == 0) {
    *text = wf__manifest_text(t, step, recs, n, stream);
    stream = NULL; /* the manifest took it */
    WF_CHECK(*text, WF_ENOMEM, "checkpoint: cannot build the manifest (out of memory)");
  }
fail:
  json_decref(stream);
  free(recs);
  return st;
}

wf_status wf__save_publish(const char *root, int keep, int step, const char *stage,
                           const char *text)
{
  wf_status st = WF_OK;
  char name[32], final[WF__PATH_LEN], path[WF__PATH_LEN];
  wf__pathf(path, sizeof path, "%s/" WF__MANIFEST, stage);
  WF_TRY(wf_file_write_atomic(path, text, strlen(text), 0644));
  wf__step_name(name, sizeof name, step);
  wf__pathf(final, sizeof final, "%s/%s", root, name);
  WF_TRY(wf__publish(root, stage, final));
  wf__prune(root, keep, step);
fail:
  return st;
}

wf_status wf_ckpt_save(const wf_ckpt_target *t, int step)
{
  wf_status st = WF_OK;
  int me = wf__rank_of(wf__ckpt_world(t));
  const char *root = t->cfg->train.checkpoint_dir;
  char stage[WF__PATH_LEN], what[64], *text = NULL;
  wf__shard_rec rec;
  int none = 0;
  double t0 = wf_now();
  wf__ckpt_what(what, sizeof what, step);
  WF_TRY(wf_ckpt_settle(t)); /* a background write still under way ends first */
  WF_TRY(wf__save_begin(t, step, stage, sizeof stage));
  WF_TRY(wf__save_files(t, step, stage, &rec, NULL, &none));
  st = wf__save_manifest(t, step, &rec, &text);
  if (st == WF_OK && me == 0)
    st = wf__save_publish(root, t->cfg->train.keep, step, stage, text);
  WF_TRY(wf__ckpt_agree(t, st, what));
  if (me == 0)
    WF_INFO("checkpoint: step %d saved to %s/step-%06d in %.2f s", step, root, step, wf_now() - t0);
fail:
  free(text);
  return st;
}
