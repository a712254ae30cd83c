/*
 * saver.c - checkpoints written in the background (see wf_ckpt.h, "background writes").
 *
 * At the step boundary (wf_ckpt_save_async, collective) each rank gathers the one or two
 * files it writes into memory (wf__save_files with a snapshot), hashing them as they are
 * copied, so every rank's record, and rank 0's manifest, are complete before training
 * goes on. The saver's thread then writes them into the staging directory, each with the
 * atomic writer (temp, fsync, rename). Rank 0's thread waits until every file the
 * manifest lists is in the stage at its size (each one renamed there whole by its rank),
 * then publishes exactly as wf_ckpt_save does. Publishing needs no collective, so no
 * rank's training waits for another's disk; what needs agreeing (a failed write) is
 * agreed at the next checkpoint, where the ranks meet anyway.
 *
 * Threads: the trainer's thread owns the saver; the writer thread reads only the snapshot
 * and the values copied into the saver. `local_done`, `failed` and `cancel` cross between
 * them under `lock`.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ckpt_int.h"

#define MAX_FILES  2  /* a rank's model file and its optimizer file */
#define POLL_MS    20 /* rank 0 looks for the other ranks' files this often */
#define WRITE_FAIL 1

struct wf_ckpt_saver {
  pthread_t thread;
  bool running;  /* a write was started and its thread not joined */
  bool threaded; /* it has a thread (else it ran on the caller's) */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool local_done; /* this rank's files are written (or failed) */
  bool failed;     /* this rank's part failed (its files, or rank 0's publishing) */
  bool cancel;     /* give up: the job ends without this checkpoint */
  /* the write under way (the thread's own copy) */
  wf_afile files[MAX_FILES];
  int n_files;
  bool lead; /* world rank 0: publishes */
  char *manifest;
  char root[WF__PATH_LEN], stage[WF__PATH_LEN];
  int step, keep;
  double t0, paused_s; /* when the snapshot began; what it cost the step */
};

wf_status wf_ckpt_saver_new(wf_ckpt_saver **out)
{
  wf_ckpt_saver *s = calloc(1, sizeof *s);
  if (!s)
    return WF_ENOMEM;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  *out = s;
  return WF_OK;
}

/* Give the write under way up: wakes rank 0's thread if it is waiting for files. */
static void cancel(wf_ckpt_saver *s)
{
  pthread_mutex_lock(&s->lock);
  s->cancel = true;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

/* Wait up to ms for a cancel; whether there was one. */
static bool cancelled_within(wf_ckpt_saver *s, int ms)
{
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += (long)ms * 1000000L;
  until.tv_sec += until.tv_nsec / 1000000000L;
  until.tv_nsec %= 1000000000L;
  pthread_mutex_lock(&s->lock);
  while (!s->cancel && pthread_cond_timedwait(&s->cond, &s->lock, &until) == 0)
    ;
  bool c = s->cancel;
  pthread_mutex_unlock(&s->lock);
  return c;
}

/* This rank's files into the stage. */
static wf_status write_mine(wf_ckpt_saver *s)
{
  wf_status st = WF_OK;
  for (int i = 0; i < s->n_files; i++) {
    if (st == WF_OK && (st = wf_afile_spill(&s->files[i])) == WF_OK) {
      wf__ckpt_test_delay(s->step);
      st = wf_afile_commit(&s->files[i], NULL, NULL);
    }
    wf_afile_abort(&s->files[i]); /* frees what a failure left */
  }
  s->n_files = 0;
  return st;
}

/* Rank 0: whether every file the manifest lists is in the stage, at its size. */
static bool all_in(const wf_ckpt_saver *s, const wf__manifest *m)
{
  for (int i = 0; i < m->n_files; i++) {
    char path[WF__PATH_LEN];
    struct stat sb;
    wf__pathf(path, sizeof path, "%s/%s", s->stage, m->files[i].name);
    if (stat(path, &sb) != 0 || (uint64_t)sb.st_size != m->files[i].bytes)
      return false;
  }
  return true;
}

/* Rank 0: wait for the other ranks' files, then publish; WF_EABORTED when cancelled. */
static wf_status publish(wf_ckpt_saver *s)
{
  wf_status st = WF_OK;
  wf__manifest m;
  memset(&m, 0, sizeof m);
  WF_TRY(wf__manifest_parse(s->manifest, s->stage, &m));
  while (!all_in(s, &m)) {
    if (cancelled_within(s, POLL_MS)) {
      st = WF_EABORTED;
      goto fail;
    }
  }
  WF_TRY(wf__save_publish(s->root, s->keep, s->step, s->stage, s->manifest));
  WF_INFO("checkpoint: step %d saved to %s/step-%06d in %.2f s (in the background; the step "
          "paused %.2f s for its snapshot)",
          s->step, s->root, s->step, wf_now() - s->t0, s->paused_s);
fail:
  free(m.files);
  return st;
}

static void set_done(wf_ckpt_saver *s, bool failed)
{
  pthread_mutex_lock(&s->lock);
  s->local_done = true;
  s->failed = s->failed || failed;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

static void *saver_main(void *arg)
{
  wf_ckpt_saver *s = arg;
  wf_status st = write_mine(s);
  set_done(s, st != WF_OK);
  if (s->lead && st == WF_OK)
    st = publish(s);
  if (s->lead && st != WF_OK) {
    wf__remove_tree(s->stage); /* `latest` still names the previous checkpoint */
    set_done(s, st != WF_EABORTED);
  }
  return NULL;
}

/* Join the thread; whether this rank's part failed. */
static bool join(wf_ckpt_saver *s)
{
  if (s->running && s->threaded)
    pthread_join(s->thread, NULL);
  s->running = false;
  free(s->manifest);
  s->manifest = NULL;
  return s->failed;
}

/* Whether this rank's files are still being written; *failed: its part failed. */
static bool busy(wf_ckpt_saver *s, bool *failed)
{
  pthread_mutex_lock(&s->lock);
  bool b = s->running && !s->local_done;
  *failed = s->failed;
  pthread_mutex_unlock(&s->lock);
  return b;
}

/* Every rank's [busy, failed], the largest. */
static wf_status agree_state(const wf_ckpt_target *t, int32_t v[2])
{
  bool failed;
  v[0] = busy(t->saver, &failed);
  v[1] = failed ? WRITE_FAIL : 0;
  wf_comm *w = wf__ckpt_world(t);
  return w ? wf_comm_allreduce(w, v, v, 2, WF_COMM_I32, WF_COMM_MAX) : WF_OK;
}

/* A write failed somewhere (each rank logged its own): end it here, agreed. */
static wf_status give_up(const wf_ckpt_target *t)
{
  wf_ckpt_saver *s = t->saver;
  cancel(s);
  join(s);
  if (wf__rank_of(wf__ckpt_world(t)) == 0)
    WF_ERROR("checkpoint: the background write of step %d failed (see above)", s->step);
  s->failed = false, s->cancel = false;
  return WF_EIO;
}

wf_status wf_ckpt_settle(const wf_ckpt_target *t)
{
  wf_ckpt_saver *s = t->saver;
  int32_t v[2];
  if (!s || !s->running) /* the same on every rank: saves are started together */
    return WF_OK;
  pthread_mutex_lock(&s->lock); /* this rank's files first */
  while (!s->local_done)
    pthread_cond_wait(&s->cond, &s->lock);
  pthread_mutex_unlock(&s->lock);
  wf_status st = agree_state(t, v);
  if (st != WF_OK)
    return st;
  if (v[1])
    return give_up(t);
  /* every file is in: rank 0 publishes now, and says if that failed */
  char what[64];
  wf__ckpt_what(what, sizeof what, s->step);
  return wf__ckpt_agree(t, join(s) ? WF_EIO : WF_OK, what);
}

/* The snapshot: this rank's files in memory, the manifest on rank 0. */
static wf_status snapshot(const wf_ckpt_target *t, int step)
{
  wf_status st = WF_OK;
  wf_ckpt_saver *s = t->saver;
  wf__shard_rec rec;
  s->t0 = wf_now();
  s->n_files = 0;
  WF_TRY(wf__save_begin(t, step, s->stage, sizeof s->stage));
  WF_TRY(wf__save_files(t, step, s->stage, &rec, s->files, &s->n_files));
  st = wf__save_manifest(t, step, &rec, &s->manifest);
  char what[64];
  wf__ckpt_what(what, sizeof what, step);
  if ((st = wf__ckpt_agree(t, st, what)) != WF_OK) {
    for (int i = 0; i < s->n_files; i++)
      wf_afile_abort(&s->files[i]);
    s->n_files = 0;
    free(s->manifest);
    s->manifest = NULL;
  }
fail:
  return st;
}

wf_status wf_ckpt_save_async(const wf_ckpt_target *t, int step, bool *deferred)
{
  wf_status st = WF_OK;
  wf_ckpt_saver *s = t->saver;
  int32_t v[2] = {0, 0};
  *deferred = false;
  if (s->running) {
    WF_TRY(agree_state(t, v));
    if (v[1])
      return give_up(t);
    if (v[0]) { /* still writing somewhere: never over it */
      *deferred = true;
      return WF_OK;
    }
    WF_TRY(wf_ckpt_settle(t)); /* rank 0's publishing, at most a poll away */
  }
  WF_TRY(snapshot(t, step));
  wf__pathf(s->root, sizeof s->root, "%s", t->cfg->train.checkpoint_dir);
  s->step = step, s->keep = t->cfg->train.keep;
  s->lead = wf__rank_of(wf__ckpt_world(t)) == 0;
  s->local_done = s->failed = s->cancel = false;
  s->paused_s = wf_now() - s->t0;
  s->running = true;
  s->threaded = pthread_create(&s->thread, NULL, saver_main, s) == 0;
  if (!s->threaded) { /* no thread to be had: written now, as wf_ckpt_save would */
    saver_main(s);
    return wf_ckpt_settle(t);
  }
fail:
  return st;
}

void wf_ckpt_saver_free(wf_ckpt_saver *s)
{
  if (!s)
    return;
  cancel(s);
  join(s);
  for (int i = 0; i < s->n_files; i++)
    wf_afile_abort(&s->files[i]);
  pthread_cond_destroy(&s->cond);
  pthread_mutex_destroy(&s->lock);
  free(s);
}
