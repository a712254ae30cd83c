/*
 * detached.c - the checkpoint of a stop, written by processes that outlive the job (see
 * wf_ckpt.h, "a stop's writer").
 *
 * Each rank's writer is a copy of the rank made by fork() when the launcher began ending
 * the job, so it holds the rank's memory as it was at a completed step and no MPI: the
 * ranks agree through the staging directory instead of a collective. Every writer puts
 * its files there as wf_ckpt_save's ranks do, then a record of them (".rank-NNNNN":
 * what the save's all-gather would carry, and its share of the data position). World
 * rank 0's writer waits for every record, checks they are of one step, builds the
 * manifest from them, and publishes exactly as wf_ckpt_save does. A writer that fails,
 * or a rank that never wrote its record, leaves `latest` on the previous checkpoint.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt_int.h"
#include "wf_io.h"

#define REC_MAGIC 0x52535357u /* "WSSR" little-endian */
#define POLL_MS   50
#define START_S   20  /* for every rank's writer to start: a rank that died has none */
#define WAIT_S    300 /* for the other ranks' records: their writes go on meanwhile */
#define WRITERS_S 600 /* a new job waits this long for the writers of the last one */

typedef struct rec_head {
  uint32_t magic;
  int32_t status; /* WF_OK, or this rank's failure */
  int32_t step;
  uint32_t npos;
  uint64_t rec[WF__REC_LEN];
} rec_head;

static void rec_name(char *buf, size_t len, const char *stage, int rank)
{
  wf__pathf(buf, len, "%s/.rank-%05d", stage, rank);
}

/* The mark a writer leaves as it starts: rank 0 tells a slow writer from none. */
static void start_name(char *buf, size_t len, const char *stage, int rank)
{
  wf__pathf(buf, len, "%s/.rank-%05d.started", stage, rank);
}

/* This rank's record, written whole (atomically) so rank 0 never reads half of one. */
static wf_status put_rec(const char *stage, int rank, const rec_head *h, const uint64_t *pos)
{
  size_t bytes = sizeof *h + h->npos * sizeof *pos;
  char path[WF__PATH_LEN], *buf = malloc(bytes);
  if (!buf)
    return WF_ENOMEM;
  memcpy(buf, h, sizeof *h);
  if (h->npos)
    memcpy(buf + sizeof *h, pos, h->npos * sizeof *pos);
  rec_name(path, sizeof path, stage, rank);
  wf_status st = wf_file_write_atomic(path, buf, bytes, 0644);
  free(buf);
  return st;
}

/* Rank r's record, once it is there: 1 read, 0 not yet, -1 unreadable. pos: max'ed in. */
static int get_rec(const char *stage, int r, size_t npos, rec_head *h, uint64_t *pos)
{
  char path[WF__PATH_LEN];
  rec_name(path, sizeof path, stage, r);
  FILE *f = fopen(path, "rb");
  if (!f)
    return errno == ENOENT ? 0 : -1;
  int ok = fread(h, sizeof *h, 1, f) == 1 && h->magic == REC_MAGIC && h->npos == npos;
  for (size_t i = 0; ok && i < npos; i++) {
    uint64_t x;
    ok = fread(&x, sizeof x, 1, f) == 1;
    pos[i] = x > pos[i] ? x : pos[i];
  }
  fclose(f);
  return ok ? 1 : -1;
}

static void sleep_ms(int ms)
{
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Rank 0: every rank's record into recs (WF__REC_LEN each) and the data position into
 * pos; an error when one failed, is of another step, or does not come. */
static wf_status gather(const char *stage, int n, int step, size_t npos, uint64_t *recs,
                        uint64_t *pos)
{
  double until = wf_now() + START_S;
  for (int r = 0; r < n; r++) {
    char path[WF__PATH_LEN];
    start_name(path, sizeof path, stage, r);
    while (!wf__is_file(path) && wf_now() < until)
      sleep_ms(POLL_MS);
    if (!wf__is_file(path)) {
      WF_ERROR("checkpoint: rank %d's writer never started (the rank had died, or failed to "
               "fork; its log is above)",
               r);
      return WF_EIO;
    }
  }
  until = wf_now() + WAIT_S;
  for (int r = 0; r < n; r++) {
    rec_head h;
    int got;
    while ((got = get_rec(stage, r, npos, &h, pos)) == 0 && wf_now() < until)
      sleep_ms(POLL_MS);
    if (got <= 0) {
      WF_ERROR("checkpoint: rank %d's writer %s", r,
               got < 0 ? "left an unreadable record" : "never finished (it was killed?)");
      return WF_EIO;
    }
    if (h.status != WF_OK) {
      WF_ERROR("checkpoint: rank %d's writer failed (see its lines above)", r);
      return (wf_status)h.status;
    }
    if (h.step != step) {
      WF_ERROR("checkpoint: rank %d's writer holds step %d, this one step %d: the ranks were "
               "stopped at different steps, and no checkpoint mixes them",
               r, h.step, step);
      return WF_EINVAL;
    }
    memcpy(recs + (size_t)r * WF__REC_LEN, h.rec, sizeof h.rec);
  }
  return WF_OK;
}

/* Rank 0: the manifest from the records, the records removed (they are not the
 * checkpoint's), then published. */
static wf_status publish(const wf_ckpt_target *t, int step, const char *stage, int n,
                         const uint64_t *recs, const uint64_t *pos)
{
  wf_status st = WF_OK;
  json_t *stream = NULL;
  char *text = NULL, *js = NULL;
  if (t->data && wf_data_state_len(t->data) > 0) {
    WF_CHECK_ALLOC(js = wf_data_state_json(t->data, step, pos));
    WF_CHECK_ALLOC(stream = json_loads(js, 0, NULL));
  }
  text = wf__manifest_text(t, step, recs, n, stream);
  stream = NULL; /* the manifest took it */
  WF_CHECK(text, WF_ENOMEM, "checkpoint: cannot build the manifest (out of memory)");
  for (int r = 0; r < n; r++) {
    char path[WF__PATH_LEN];
    rec_name(path, sizeof path, stage, r);
    unlink(path);
    start_name(path, sizeof path, stage, r);
    unlink(path);
  }
  st = wf__save_publish(t->cfg->train.checkpoint_dir, t->cfg->train.keep, step, stage, text);
fail:
  json_decref(stream);
  free(js);
  free(text);
  return st;
}

wf_status wf_ckpt_write_detached(const wf_ckpt_target *t, int step, uint64_t tag,
                                 const uint64_t *pos, size_t npos)
{
  wf_status st = WF_OK;
  const char *root = t->cfg->train.checkpoint_dir;
  int me = wf__rank_of(wf__ckpt_world(t)), n = wf__size_of(wf__ckpt_world(t));
  char stage[WF__PATH_LEN];
  wf__shard_rec rec = {0};
  int none = 0;
  uint64_t *recs = NULL, *all = NULL;
  double t0 = wf_now();
  /* the job's tag: no writer of another job's stop shares it */
  wf__pathf(stage, sizeof stage, "%s/.tmp-step-%06d" WF__STOP_STAGE "%016" PRIx64, root, step, tag);
  char mark[WF__PATH_LEN];
  start_name(mark, sizeof mark, stage, me);
  if (mkdir(stage, 0755) != 0 && errno != EEXIST) {
    WF_ERROR("%s: cannot create: %s", stage, strerror(errno));
    st = WF_EIO;
  }
  if (st == WF_OK)
    st = wf_file_write_atomic(mark, "", 0, 0644);
  if (st == WF_OK) /* no ZeRO-3 here (rescue.c): nothing collective */
    st = wf__write_mine(t, step, stage, &rec, NULL, &none);
  rec_head h = {REC_MAGIC, (int32_t)st, step, (uint32_t)npos, {0}};
  wf__pack_rec(h.rec, t, &rec);
  wf_status put = put_rec(stage, me, &h, pos);
  if (me != 0 || st != WF_OK || put != WF_OK)
    return st != WF_OK ? st : put;
  WF_CHECK_ALLOC(recs = calloc((size_t)n * WF__REC_LEN, sizeof *recs));
  WF_CHECK_ALLOC(all = calloc(npos ? npos : 1, sizeof *all));
  WF_TRY(gather(stage, n, step, npos, recs, all));
  WF_TRY(publish(t, step, stage, n, recs, all));
  WF_INFO("checkpoint: step %d saved to %s/step-%06d in %.2f s, by the stop's writers", step, root,
          step, wf_now() - t0);
fail:
  if (st != WF_OK && me == 0) {
    wf__remove_tree(stage);
    WF_ERROR("checkpoint: the stop's checkpoint of step %d was not written; `latest` still names "
             "the previous one",
             step);
  }
  free(recs);
  free(all);
  return st;
}

/* The lock the writers hold shared (wf_ckpt_writers_lock) and a new job takes alone. */
static void lock_path(char *buf, size_t len, const char *root)
{
  wf__pathf(buf, len, "%s/.stop-writers.lock", root);
}

int wf_ckpt_writers_lock(const char *root)
{
  char path[WF__PATH_LEN];
  lock_path(path, sizeof path, root);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0 && flock(fd, LOCK_SH) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

wf_status wf__wait_for_writers(const char *root)
{
  char path[WF__PATH_LEN];
  lock_path(path, sizeof path, root);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return WF_OK; /* no stop ever wrote here */
  double t0 = wf_now();
  bool said = false;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (!said)
      WF_INFO("checkpoint: waiting for the writers of the last job's stop to finish (their log: "
              "%s/" WF_CKPT_WRITERS_LOG ")",
              root);
    said = true;
    if (wf_now() - t0 > WRITERS_S) {
      close(fd);
      WF_ERROR("checkpoint: the writers of the last job's stop still hold %s after %d s; see "
               "%s/" WF_CKPT_WRITERS_LOG
               ", and end them (`fuser -k %s`) to go on from the checkpoint before",
               path, WRITERS_S, root, path);
      return WF_EIO;
    }
    sleep_ms(100);
  }
  if (said)
    WF_INFO("checkpoint: the last job's writers are done (%.1f s)", wf_now() - t0);
  wf__remove_stop_stages(root); /* of writers that failed or were killed */
  close(fd);                    /* unlocks */
  return WF_OK;
}
