/*
 * writer.c - the checkpoint writer: a process beside each rank that writes the files of
 * the checkpoints its rank snapshots, so that training goes on while they are written and
 * a checkpoint whose snapshot was taken is completed even when the launcher kills the
 * rank (Open MPI's SIGKILL to the rank's process group, 2 s after a Ctrl-C by default).
 *
 * It is the worker binary started again by its rank (`worker --checkpoint-writer RANK`,
 * saver.c), with fd 3 the socket to the rank and fd 4 the snapshot memory, in a session
 * of its own, so that neither the launcher's kill nor a terminal's signals reach it. It
 * does one thing at a time, in the order asked (ckpt_int.h has the messages):
 *  - "write": the files the snapshot holds, each through the atomic writer (hashed as
 *    written), then its record `.rec-RANK.json` in the staging directory (the files' manifest
 *    entries, or the error); answers "wrote". World rank 0's writer then publishes: it
 *    waits for the record of every rank that writes, writes the manifest, moves the
 *    staging directory into place, points `latest` at it and prunes; answers
 *    "published". A record with an error, "abandon" from the rank, or a rank whose record
 *    does not come within the bound below ends the publication: the staging directory is
 *    removed and `latest` stays where it was.
 *  - "hello": the checkpoint directory and the job's nonce. From then on the writer
 *    holds its life lock (writer_alive).
 * It exits when its rank closes the socket, after the work in hand.
 *
 * Invariants: `latest` names only a directory whose every file was committed (fsync,
 * rename) and listed with its size and checksum in a manifest written after them; while
 * it writes under DIR, a writer holds a shared lock on DIR/.writers.lock, so a job
 * starting there (wf_ckpt_prepare) waits for the writers of one that died before it
 * reads `latest` or cleans up.
 *
 * Test hooks (read once): WEFT_TEST_CKPT_DELAY_MS sleeps after each file's first piece
 * (its header and up to 4 MiB), so a test can kill a process mid-write;
 * WEFT_TEST_CKPT_FAIL=R:S makes world rank R's writer fail its first file of step S
 * there, as a full disk would.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt_int.h"

/* How long the publisher waits for the other ranks' records beyond its own write's
 * duration: their shares are at most the size of rank 0's (the model file and an
 * optimizer file), so 4 times its time and two minutes of slack cover a slower disk;
 * a record that never comes means that writer died (its node went down). */
#define PUBLISH_SLACK_S 120.0
#define PUBLISH_FACTOR  4.0
#define RECORD_POLL_MS  50

typedef struct writer {
  int sock;
  const char *shm; /* the rank's snapshot (read-only) */
  size_t shm_bytes;
  int rank;
  bool rank_gone;              /* the socket closed: replies go nowhere */
  bool abandon;                /* the rank gave the publication up */
  char root[WF_FILE_PATH_MAX]; /* train.checkpoint_dir */
  char nonce[32];              /* the job's (staging directory names) */
  char life[WF__PATH_LEN];     /* this writer's life lock (see writer_alive) */
  int life_fd;
} writer;

/* ---- test hooks ---------------------------------------------------------------------- */

static void test_delay(void)
{
  static int ms = -1; /* environment parameters are read once */
  if (ms < 0) {
    const char *s = getenv("WEFT_TEST_CKPT_DELAY_MS");
    ms = s && atoi(s) > 0 ? atoi(s) : 0;
  }
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (ms > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static bool test_fail(int rank, int step)
{
  static int r = -2, s = -1;
  if (r == -2) {
    const char *e = getenv("WEFT_TEST_CKPT_FAIL");
    if (!e || sscanf(e, "%d:%d", &r, &s) != 2)
      r = -1;
  }
  return r == rank && s == step;
}

/* ---- messages ------------------------------------------------------------------------ */

static const char *str_of(json_t *o, const char *k)
{
  const char *s = json_string_value(json_object_get(o, k));
  return s ? s : "";
}

static void reply(writer *w, const char *op, int step, const char *err, double secs)
{
  if (w->rank_gone)
    return;
  json_t *m = json_pack("{s:s, s:i, s:b, s:s, s:f}", "op", op, "step", step, "ok", !err[0], "error",
                        err, "secs", secs);
  if (!m || wf__msg_send(w->sock, m) != WF_OK)
    w->rank_gone = true; /* nobody to tell: the work goes on all the same */
  json_decref(m);
}

/* A message that arrives while the publisher waits: "abandon", or the end. */
static void take_message(writer *w)
{
  json_t *m = NULL;
  int r = wf__msg_recv(w->sock, &m);
  if (r <= 0) {
    w->rank_gone = true;
    return;
  }
  if (!strcmp(str_of(m, "op"), "abandon"))
    w->abandon = true;
  json_decref(m);
}

/* Sleep up to ms, or less when the rank says something. */
static void wait_a_little(writer *w, int ms)
{
  struct pollfd p = {w->sock, POLLIN, 0};
  if (w->rank_gone) {
    poll(NULL, 0, ms);
    return;
  }
  if (poll(&p, 1, ms) > 0)
    take_message(w);
}

/* ---- the files ----------------------------------------------------------------------- */

/* The piece [at, at + n) of a file: in the snapshot, or (inline) read from the socket
 * into buf, where a rescue streams the rank's live state; NULL when the stream ends. */
static const char *piece(writer *w, uint64_t off, uint64_t at, size_t n, bool in_line, char *buf)
{
  if (!in_line)
    return w->shm + off + at;
  return wf__recv_exact(w->sock, buf, n) == 1 ? buf : NULL;
}

/* The test hooks, after a file's first piece (its header is out, its data is not). */
static wf_status after_first_piece(writer *w, const char *path, int step, bool first, size_t n)
{
  test_delay();
  if (!first || !test_fail(w->rank, step))
    return WF_OK;
  WF_ERROR("%s: write failed after %zu bytes: %s (injected by WEFT_TEST_CKPT_FAIL)", path, n,
           strerror(ENOSPC));
  return WF_EIO;
}

/* `len` bytes of a file from the snapshot at `off` or inline, in WF__CHUNK pieces
 * written past the page cache where the file system allows (wf_afile_write_direct: the
 * snapshot's files and buf start at page boundaries, and every piece but the last is
 * whole pages), so the writer costs the ranks' cores little more than the checksum. */
static wf_status write_pieces(writer *w, wf_afile *af, int step, bool first, uint64_t off,
                              uint64_t len, bool in_line)
{
  wf_status st = WF_OK;
  void *buf = NULL;
  size_t n = 0;
  if (in_line)
    WF_CHECK(posix_memalign(&buf, WF_AFILE_DIRECT_ALIGN, WF__CHUNK) == 0, WF_ENOMEM,
             "%s: out of memory for a %u-byte buffer", af->path, WF__CHUNK);
  for (uint64_t at = 0; at < len; at += n) {
    n = (size_t)WF_MIN((uint64_t)WF__CHUNK, len - at);
    const char *p = piece(w, off, at, n, in_line, buf);
    WF_CHECK(p, WF_EIO,
             "%s: the rank's state stopped coming after %llu of %llu bytes (its rescue process "
             "ended)",
             af->path, (unsigned long long)at, (unsigned long long)len);
    WF_TRY(wf_afile_write_direct(af, p, n));
    if (at == 0)
      WF_TRY(after_first_piece(w, af->path, step, first, n));
  }
fail:
  free(buf);
  return st;
}

/* One file: `len` bytes, its header first, from the snapshot at `off` or inline. Its
 * manifest entry gets the size and checksum. */
static wf_status write_one(writer *w, const char *stage, int step, json_t *f, bool first,
                           bool in_line, char *err, size_t err_len)
{
  wf_status st = WF_OK;
  char path[WF__PATH_LEN], hex[17];
  uint64_t off = (uint64_t)json_integer_value(json_object_get(f, "off"));
  uint64_t len = (uint64_t)json_integer_value(json_object_get(f, "len"));
  uint64_t bytes = 0, hash = 0;
  wf_afile af;
  wf__pathf(path, sizeof path, "%s/%s", stage, str_of(f, "name"));
  WF_CHECK(in_line || off + len <= w->shm_bytes, WF_EINVAL,
           "%s: bytes [%llu, %llu) lie outside the %zu-byte snapshot", path,
           (unsigned long long)off, (unsigned long long)(off + len), w->shm_bytes);
  WF_TRY(wf_afile_open(&af, path, 0644, WF_AFILE_HASH));
  st = write_pieces(w, &af, step, first, off, len, in_line);
  if (st != WF_OK) {
    wf_afile_abort(&af);
    goto fail;
  }
  WF_TRY(wf_afile_commit(&af, &bytes, &hash));
  json_t *e = json_object_get(f, "entry");
  wf__pathf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
  json_object_set_new(e, "bytes", json_integer((json_int_t)bytes));
  json_object_set_new(e, "xxh3_64", json_string(hex));
  return WF_OK;
fail:
  wf__pathf(err, err_len, "writing %s failed (see the log)", path);
  return st;
}

static wf_status write_files(writer *w, const char *stage, int step, json_t *files, bool in_line,
                             json_t *entries, char *err, size_t err_len)
{
  wf_status st = WF_OK;
  size_t i;
  json_t *f;
  if (mkdir(stage, 0755) != 0 && errno != EEXIST) {
    WF_ERROR("%s: cannot create the staging directory: %s", stage, strerror(errno));
    wf__pathf(err, err_len, "cannot create %s: %s", stage, strerror(errno));
    return WF_EIO;
  }
  json_array_foreach(files, i, f)
  {
    WF_TRY(write_one(w, stage, step, f, i == 0, in_line, err, err_len));
    json_array_append(entries, json_object_get(f, "entry"));
  }
fail:
  return st;
}

/* The record: this rank's manifest entries, or the error. Not synced: it is read by
 * the publisher and removed; the manifest is what lasts. */
static void write_record(writer *w, const char *stage, int step, json_t *entries, json_t *data,
                         const char *err)
{
  char path[WF__PATH_LEN], tmp[WF__PATH_LEN];
  json_t *r = json_pack("{s:i, s:i}", "rank", w->rank, "step", step);
  if (err[0])
    json_object_set_new(r, "error", json_string(err));
  else
    json_object_set(r, "files", entries);
  if (data && !err[0]) /* this rank's part of a data.source stream's position */
    json_object_set(r, "data_stream", data);
  wf__record_path(path, sizeof path, stage, w->rank);
  wf__pathf(tmp, sizeof tmp, "%s.tmp", path);
  if (!r || json_dump_file(r, tmp, JSON_COMPACT) != 0 || rename(tmp, path) != 0)
    WF_ERROR("%s: cannot write this rank's record: %s", path, strerror(errno));
  json_decref(r);
}

/* ---- publishing (world rank 0) --------------------------------------------------------- */

/* Whether rank r's writer is still there: each holds an exclusive lock on its life
 * lock file as long as it runs (the kernel drops it when the process dies, however it
 * dies) and removes the file when it exits. A writer that is gone without a record will
 * never write one: its rank ended before handing it a snapshot, or it was killed. */
static bool writer_alive(const writer *w, int r)
{
  char path[WF__PATH_LEN];
  wf__life_path(path, sizeof path, w->root, w->nonce, r);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  bool held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);
  return held;
}

/* Rank r's record, once it exists; NULL with err set when it says it failed, the rank
 * gave the checkpoint up, rank r's writer is gone without one, or the deadline passed. */
static json_t *await_record(writer *w, const char *stage, int r, double deadline, char *err,
                            size_t err_len)
{
  char path[WF__PATH_LEN];
  wf__record_path(path, sizeof path, stage, r);
  for (bool gone = false;; gone = !writer_alive(w, r)) {
    json_t *rec = wf__is_file(path) ? json_load_file(path, 0, NULL) : NULL;
    if (rec && json_object_get(rec, "error")) {
      wf__pathf(err, err_len, "rank %d: %s", r, str_of(rec, "error"));
      json_decref(rec);
      return NULL;
    }
    if (rec)
      return rec;
    if (w->abandon) {
      wf__pathf(err, err_len, "the job gave it up (a rank's writer failed)");
      return NULL;
    }
    if (gone) {
      wf__pathf(err, err_len,
                "rank %d's writer ended without writing its files (the job was "
                "killed before rank %d's snapshot, or its node went down)",
                r, r);
      return NULL;
    }
    if (wf_now() > deadline) {
      wf__pathf(err, err_len,
                "rank %d's writer never finished its files (its process or node "
                "died?)",
                r);
      return NULL;
    }
    wait_a_little(w, RECORD_POLL_MS);
  }
}

/* Every writing rank's entries, in rank order, as the manifest lists them, and the data
 * position merged from their parts (*data; NULL: none). */
static json_t *gather_entries(writer *w, const char *stage, json_t *ranks, double deadline,
                              json_t **data, char *err, size_t err_len)
{
  json_t *all = json_array(), *v;
  size_t i;
  *data = NULL;
  json_array_foreach(ranks, i, v)
  {
    json_t *rec = await_record(w, stage, (int)json_integer_value(v), deadline, err, err_len);
    if (!rec) {
      json_decref(all);
      json_decref(*data);
      *data = NULL;
      return NULL;
    }
    json_array_extend(all, json_object_get(rec, "files"));
    wf__data_state_merge(data, json_object_get(rec, "data_stream"));
    json_decref(rec);
  }
  return all;
}

static void remove_records(const char *stage, json_t *ranks)
{
  json_t *v;
  size_t i;
  char path[WF__PATH_LEN];
  json_array_foreach(ranks, i, v)
  {
    wf__record_path(path, sizeof path, stage, (int)json_integer_value(v));
    unlink(path);
  }
}

static wf_status publish(writer *w, const char *root, const char *stage, int step, json_t *pub,
                         double own_s, char *err, size_t err_len)
{
  wf_status st = WF_OK;
  char path[WF__PATH_LEN], name[32], final[WF__PATH_LEN];
  json_t *ranks = json_object_get(pub, "ranks"), *man = json_object_get(pub, "manifest");
  double deadline = wf_now() + PUBLISH_SLACK_S + PUBLISH_FACTOR * own_s;
  char *text = NULL;
  json_t *data = NULL, *files = gather_entries(w, stage, ranks, deadline, &data, err, err_len);
  WF_CHECK(files, WF_EIO, "checkpoint: step %d not published: %s", step, err);
  json_object_set_new(man, "written_at", json_real(wf_wall_time()));
  if (data) /* a data.source stream's position (datastate.c) */
    json_object_set_new(json_object_get(man, "data"), "stream", data);
  json_object_set_new(man, "files", files);
  WF_CHECK_ALLOC(text = json_dumps(man, JSON_INDENT(2) | JSON_PRESERVE_ORDER));
  wf__pathf(path, sizeof path, "%s/" WF__MANIFEST, stage);
  WF_TRY(wf_file_write_atomic(path, text, strlen(text), 0644));
  remove_records(stage, ranks);
  wf__step_name(name, sizeof name, step);
  wf__pathf(final, sizeof final, "%s/%s", root, name);
  WF_TRY(wf__publish(root, stage, final));
  wf__prune(root, (int)json_integer_value(json_object_get(pub, "keep")), step, w->nonce);
exit:
  free(text);
  return st;
fail:
  if (!err[0])
    wf__pathf(err, err_len, "publishing %s failed (see the log)", stage);
  wf__remove_tree(stage); /* best effort; `latest` still names the previous one */
  goto exit;
}

/* ---- one write ------------------------------------------------------------------------ */

/* A shared lock on root's writers' lock file, held while writing there (-1: none). */
static int lock_root(const char *root)
{
  char path[WF__PATH_LEN];
  wf__pathf(path, sizeof path, "%s/" WF__WRITERS_LOCK, root);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  while (fd >= 0 && flock(fd, LOCK_SH) != 0 && errno == EINTR)
    ;
  return fd;
}

static void do_write(writer *w, json_t *req)
{
  char err[768] = "";
  int step = (int)json_integer_value(json_object_get(req, "step"));
  const char *root = str_of(req, "root"), *stage = str_of(req, "stage");
  json_t *pub = json_object_get(req, "publish"), *entries = json_array();
  double t0 = wf_now();
  int lock = lock_root(root);
  bool in_line = json_is_true(json_object_get(req, "inline"));
  wf_status st =
      write_files(w, stage, step, json_object_get(req, "files"), in_line, entries, err, sizeof err);
  if (st != WF_OK && in_line)
    w->rank_gone = true; /* the stream is cut short: nothing more can be read from it */
  write_record(w, stage, step, entries, json_object_get(req, "data_stream"), err);
  double own = wf_now() - t0;
  reply(w, "wrote", step, err, own);
  if (pub) {
    if (st == WF_OK)
      st = publish(w, root, stage, step, pub, own, err, sizeof err);
    else
      wf__remove_tree(stage); /* this rank's own files failed: nothing to publish */
    if (st == WF_OK && w->rank_gone)
      WF_INFO("checkpoint: step %d saved to %s/step-%06d by the checkpoint writer, %.2f s after "
              "its snapshot (the job had ended)",
              step, root, step, wf_now() - t0);
    reply(w, "published", step, err, wf_now() - t0);
  }
  w->abandon = false;
  json_decref(entries);
  if (lock >= 0)
    close(lock);
}

/* The job's facts: where it writes and its nonce. From here on the writer holds its
 * life lock. */
static void hello(writer *w, json_t *req)
{
  wf_strlcpy(w->root, str_of(req, "root"), sizeof w->root);
  wf_strlcpy(w->nonce, str_of(req, "nonce"), sizeof w->nonce);
  wf__life_path(w->life, sizeof w->life, w->root, w->nonce, w->rank);
  w->life_fd = open(w->life, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (w->life_fd < 0 || flock(w->life_fd, LOCK_EX) != 0)
    WF_WARN("checkpoint writer of rank %d: %s: %s (rank 0's writer cannot tell when this one "
            "has ended)",
            w->rank, w->life, strerror(errno));
}

static void serve(writer *w)
{
  json_t *m = NULL;
  while (!w->rank_gone && wf__msg_recv(w->sock, &m) > 0) {
    const char *op = str_of(m, "op");
    if (!strcmp(op, "write"))
      do_write(w, m);
    else if (!strcmp(op, "hello"))
      hello(w, m);
    json_decref(m);
    m = NULL;
  }
}

/* Training first: the writer runs at the lowest CPU priority and the lowest best-effort
 * I/O priority, so that it takes the time the ranks leave (their waits, the cores they
 * do not use) instead of theirs; a rank that waits for its checkpoint (the last one, a
 * stop) leaves it everything. Failing to lower them is harmless. */
static void yield_to_training(void)
{
  enum { IOPRIO_CLASS_BE = 2, IOPRIO_WHO_PROCESS = 1, IOPRIO_CLASS_SHIFT = 13 };
  setpriority(PRIO_PROCESS, 0, 19);
  syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT | 7);
}

int wf_ckpt_writer_main(int argc, char **argv)
{
  writer w = {.sock = WF__WRITER_SOCK_FD, .rank = argc > 2 ? atoi(argv[2]) : -1, .life_fd = -1};
  struct stat sb;
  signal(SIGPIPE, SIG_IGN);              /* a launcher gone: its pipes say EPIPE, nothing more */
  prctl(PR_SET_NAME, "weft-ckpt-write"); /* not "exe" (the rank started /proc/self/exe) */
  yield_to_training();
  wf_rt_set_rank(w.rank);
  if (fstat(WF__WRITER_SHM_FD, &sb) == 0 && sb.st_size > 0) {
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, WF__WRITER_SHM_FD, 0);
    if (p == MAP_FAILED) {
      WF_ERROR("checkpoint writer of rank %d: cannot map the snapshot: %s", w.rank,
               strerror(errno));
      return 1;
    }
    w.shm = p, w.shm_bytes = (size_t)sb.st_size;
  }
  serve(&w);
  if (w.life_fd >= 0) {
    unlink(w.life);
    close(w.life_fd);
  }
  return 0;
}
