/*
 * saver.c - the rank's side of checkpoints written in the background: a snapshot of
 * what this rank writes, in host memory shared with its checkpoint writer (writer.c),
 * handed over while training goes on.
 *
 * A checkpoint of step s is taken at a step boundary that every rank agrees on: each
 * rank copies the files it writes (its model shard and its optimizer state, with their
 * headers) from the device into the snapshot (a memfd mapped here and in the writer)
 * and sends the writer their layout and manifest entries; rank 0 adds the manifest and
 * the list of ranks that write. Training goes on at once. The snapshot is one buffer, so
 * a checkpoint that comes due while the previous one is still being written waits (is
 * deferred to a later boundary) rather than overwriting it; a failure anywhere is learned
 * at the next boundary and stops the run.
 *
 * The rescue. When the launcher ends the job it kills the ranks soon after (Open MPI:
 * SIGKILL 2 s after SIGCONT), possibly in the middle of a step that alone takes longer.
 * So a stop request also wakes this rank's service thread, which saves the last step's
 * state at once, while the step runs on, through the writer, whose process the
 * launcher's kill does not reach: where the state is host memory (the CPU) a process
 * that shares the rank's memory streams it to the writer (rescue_live), so nothing needs
 * copying within the grace; a device's state is copied into the snapshot first
 * (rescue_copy). This is consistent because the state only
 * changes in the optimizer's update, and every update is preceded by an agreement over
 * all ranks that carries the stop requests (wf_train_hooks.before_update): the trainer
 * tells the saver where it is (wf_ckpt_saver_phase), and the thread copies only while the
 * state is a step's (COMPUTE, HOLD), waiting out an agreement (whose outcome decides
 * which step) and an update. A rank that saw the request before an agreement makes that
 * agreement say stop, so no rank updates past the state the rescue copies: every rank's
 * snapshot is of the same step. ZeRO-3's model file needs its dp group's collectives,
 * so under ZeRO-3 a stop is written by the main thread at the boundary alone.
 *
 * Threads: the main thread (boundaries, the phase) and the service thread (the writer's
 * answers, the rescue) share the state below under `mu`; only the service thread reads
 * the socket, and sends go under `mu`.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt_int.h"
#include "wf_io.h"

extern char **environ;

/* What this rank writes of every checkpoint, and where it lies in the snapshot. */
typedef struct layout {
  bool model, optim, zero3; /* writes the model file / an optimizer file; streams ZeRO-3 */
  bool data;                /* holds a part of a data.source stream's position */
  size_t model_head, model_n, optim_lo, optim_hi;
  size_t model_off, optim_off, bytes;
} layout;

/* Bytes a rescue streams: a header or a part of the state. */
typedef struct seg {
  const void *p;
  size_t n;
} seg;

struct wf_ckpt_saver {
  const wf_ckpt_target *t;
  wf_comm *world;
  int rank;
  layout lay;
  bool rescue_ok;
  json_t *writers; /* rank 0: the world ranks that write, in order */
  uint64_t nonce;  /* the job's, in staging directory names */
  int memfd;
  char *buf;
  pid_t pid;
  int sock, rescue_fd, quit[2];
  pthread_t thread;
  bool thread_on;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* under mu: */
  wf_ckpt_phase phase;
  int state_step; /* the step whose state the rank holds (COMPUTE, HOLD) */
  int snap_step;  /* the newest snapshot taken (the checkpoint on disk after a resume) */
  bool snapping;  /* a snapshot is being copied */
  int inflight;   /* the step in the writer's hands, 0 = none */
  bool done;      /* the writer finished it (rank 0: published) */
  bool failed;    /* a write failed or the writer died */
  bool quitting;  /* destroy: a rescue waiting for the trainer gives up */
  double t_snap;  /* seconds the last snapshot took */
  double t_sent;  /* when the write in hand was handed to the writer */
  double write_s; /* seconds of writes finished (wf_ckpt_saver_write_s) */
  /* the main thread's: */
  bool deferred, slow_said;
  /* a rescue of host memory (its process shares this address space: see rescue_live) */
  pid_t child;
  void *child_stack;
  char *child_msg; /* the framed request */
  size_t child_len;
  char head[2][WF_LLMC_HEADER_BYTES]; /* the model and optimizer files' headers */
  seg seg[5];
  int nseg;
};

static void nonce_text(const wf_ckpt_saver *s, char *buf, size_t len)
{
  wf__pathf(buf, len, "%016llx", (unsigned long long)s->nonce);
}

/* ---- the layout ----------------------------------------------------------------------------- */

/* Files start at page boundaries in the snapshot: the writer may write them unbuffered
 * (O_DIRECT), which wants aligned memory. */
static size_t round_page(size_t n) { return (n + 4095) & ~(size_t)4095; }

static size_t model_head(const wf_model_dims *d, const wf_model_shard *g)
{
  wf_model_shard s = wf__saved_geo(g);
  return wf__llmc_geo(d, &s) ? WF_LLMC_HEADER_BYTES : WF__SHARD_HEADER;
}

size_t wf_ckpt_snapshot_bytes(const wf_model_dims *d, const wf_model_shard *g, size_t n,
                              bool model_writer, size_t lo, size_t hi, bool optim_writer)
{
  size_t b = model_writer ? round_page(model_head(d, g) + n * sizeof(float)) : 0;
  return b + (optim_writer ? WF__OPT_HEADER + 2 * (hi - lo) * sizeof(float) : 0);
}

static layout plan_layout(const wf_ckpt_target *t)
{
  layout l = {0};
  uint64_t lo, hi;
  bool first = t->replica == 0; /* HSDP: fsdp group 0 writes */
  int dpr = wf__rank_of(t->dp_comm);
  wf__optim_range(t, &lo, &hi);
  l.model = first && dpr == 0;
  l.zero3 = first && t->param_shard;
  l.optim = first && (t->optim_sharded || dpr == 0);
  l.model_head = model_head(wf_model_get_dims(t->model), wf_model_get_shard(t->model));
  l.model_n = wf_model_local_params(t->model);
  l.optim_lo = lo, l.optim_hi = hi;
  l.optim_off = l.model ? round_page(l.model_head + l.model_n * sizeof(float)) : 0;
  l.data = t->data && wf_data_state_len(t->data) > 0 && t->pp_rank == 0 && t->tp_rank == 0;
  l.bytes = wf_ckpt_snapshot_bytes(wf_model_get_dims(t->model), wf_model_get_shard(t->model),
                                   l.model_n, l.model, lo, hi, l.optim);
  return l;
}

/* ---- the snapshot memory and the writer process --------------------------------------------- */

/* The snapshot: a memfd the writer maps too, its pages touched now (so the memory is
 * counted from the start, and a snapshot never waits for page faults). */
static wf_status map_snapshot(wf_ckpt_saver *s)
{
  wf_status st = WF_OK;
  size_t n = s->lay.bytes;
  WF_CHECK_SYS(s->memfd = memfd_create("weft-checkpoint-snapshot", MFD_CLOEXEC));
  if (n == 0)
    return WF_OK;
  WF_CHECK(ftruncate(s->memfd, (off_t)n) == 0, WF_ENOMEM,
           "checkpoint: cannot size the %zu-byte snapshot: %s", n, strerror(errno));
  s->buf = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, s->memfd, 0);
  WF_CHECK(s->buf != MAP_FAILED, WF_ENOMEM,
           "checkpoint: cannot map the %.1f MiB snapshot (host memory): %s", n / 1048576.0,
           strerror(errno));
  wf_mem_account(WF_MEM_HOST, (int64_t)n);
  return WF_OK;
fail:
  s->buf = NULL;
  return st;
}

/* fd at or above 10, close-on-exec, so the child's dup2 to 3 and 4 always copies it
 * (a dup2 onto itself would keep close-on-exec). */
static int high_fd(int fd)
{
  int h = fcntl(fd, F_DUPFD_CLOEXEC, 10);
  close(fd);
  return h;
}

/* The writer: this binary again, in a session of its own (the launcher's kill of the
 * rank's process group does not reach it), with nothing of the rank's open but stderr,
 * the socket (fd 3) and the snapshot (fd 4). */
static wf_status spawn_writer(wf_ckpt_saver *s)
{
  wf_status st = WF_OK;
  int sv[2] = {-1, -1}, shm = -1, rc;
  char rank[16];
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  sigset_t none;
  WF_CHECK_SYS(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
  sv[1] = high_fd(sv[1]), shm = high_fd(dup(s->memfd));
  WF_CHECK(sv[1] >= 0 && shm >= 0, WF_ESYS, "checkpoint: cannot set up the writer's descriptors");
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, sv[1], WF__WRITER_SOCK_FD);
  posix_spawn_file_actions_adddup2(&fa, shm, WF__WRITER_SHM_FD);
  /* stderr stays the rank's (a write's error is said there); stdout is not held open */
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addclosefrom_np(&fa, WF__WRITER_SHM_FD + 1);
  posix_spawnattr_init(&at);
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  snprintf(rank, sizeof rank, "%d", s->rank);
  char *argv[] = {"weft-checkpoint-writer", WF_CKPT_WRITER_ARG, rank, NULL};
  rc = posix_spawn(&s->pid, "/proc/self/exe", &fa, &at, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  WF_CHECK(rc == 0, WF_ESYS, "checkpoint: cannot start the checkpoint writer: %s", strerror(rc));
  s->sock = sv[0], sv[0] = -1;
fail:
  for (int i = 0; i < 2; i++)
    if (sv[i] >= 0)
      close(sv[i]);
  if (shm >= 0)
    close(shm);
  return st;
}

/* ---- the writer's answers (service thread) -------------------------------------------------- */

static void on_answer(wf_ckpt_saver *s, json_t *m)
{
  const char *op = json_string_value(json_object_get(m, "op"));
  int step = (int)json_integer_value(json_object_get(m, "step"));
  bool ok = json_is_true(json_object_get(m, "ok"));
  double secs = json_real_value(json_object_get(m, "secs"));
  bool last = op && (!strcmp(op, "published") || (s->rank != 0 && !strcmp(op, "wrote")));
  pthread_mutex_lock(&s->mu);
  if (!ok)
    s->failed = true; /* the writer logged why */
  if (ok && last && s->rank == 0)
    WF_INFO("checkpoint: step %d saved to %s/step-%06d in %.2f s (snapshot %.2f s, written in "
            "the background)",
            step, s->t->cfg->train.checkpoint_dir, step, secs, s->t_snap);
  if ((last || !ok) && step == s->inflight && !s->done) { /* (a rescue may follow a write) */
    s->done = true;
    s->write_s += wf_now() - s->t_sent;
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* One answer, or the writer's end (a failure: nothing more will be written). */
static void read_answer(wf_ckpt_saver *s)
{
  json_t *m = NULL;
  if (wf__msg_recv(s->sock, &m) > 0) {
    on_answer(s, m);
    json_decref(m);
    return;
  }
  pthread_mutex_lock(&s->mu);
  if (!s->failed)
    WF_ERROR("checkpoint: the checkpoint writer of rank %d (pid %d) has gone", s->rank,
             (int)s->pid);
  s->failed = s->done = true;
  close(s->sock);
  s->sock = -1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* ---- taking a snapshot ---------------------------------------------------------------------- */

/* ZeRO-3: every dp rank's shard, streamed to dp rank 0, into its model file's place. */
typedef struct into_buf {
  char *dst; /* the model file's parameters */
} into_buf;

static wf_status to_buf(void *user, const wf__piece *p, const float *x, uint64_t lo, uint64_t hi)
{
  (void)p;
  memcpy(((into_buf *)user)->dst + lo * sizeof(float), x, (size_t)(hi - lo) * sizeof(float));
  return WF_OK;
}

static wf_status copy_model(wf_ckpt_saver *s)
{
  const wf_ckpt_target *t = s->t;
  wf_dev *dev = wf_model_dev(t->model);
  char *dst = s->lay.model ? s->buf + s->lay.model_off + s->lay.model_head : NULL;
  if (!s->lay.zero3)
    return s->lay.model
               ? wf_dev_read(dev, dst, wf_model_params(t->model), s->lay.model_n * sizeof(float))
               : WF_OK;
  wf__piece mine = {.geo = wf__saved_geo(wf_model_get_shard(t->model))};
  wf__optim_range(t, &mine.lo, &mine.hi);
  into_buf ib = {dst};
  return wf__stream_pieces(t->dp_comm, 0, &mine, dev, t->param_shard, to_buf, &ib);
}

static void put_headers(wf_ckpt_saver *s, int step)
{
  const wf_ckpt_target *t = s->t;
  if (s->lay.model)
    wf__model_header_put(s->buf + s->lay.model_off, wf_model_get_dims(t->model),
                         wf_model_get_shard(t->model), s->lay.model_n);
  if (s->lay.optim)
    wf__optim_header_put(s->buf + s->lay.optim_off, t, step);
}

static wf_status copy_optim(wf_ckpt_saver *s)
{
  size_t lo, hi, n;
  float *m, *v;
  wf_dev *dev = wf_model_dev(s->t->model);
  if (!s->lay.optim)
    return WF_OK;
  wf_optim_state(s->t->optim, &lo, &hi, &m, &v);
  n = (hi - lo) * sizeof(float);
  char *dst = s->buf + s->lay.optim_off + WF__OPT_HEADER;
  wf_status st = wf_dev_read(dev, dst, m, n);
  return st == WF_OK ? wf_dev_read(dev, dst + n, v, n) : st;
}

static json_t *file_msg(const char *name, size_t off, size_t len, json_t *entry)
{
  return json_pack("{s:s, s:I, s:I, s:o}", "name", name, "off", (json_int_t)off, "len",
                   (json_int_t)len, "entry", entry);
}

static json_t *files_msg(const wf_ckpt_saver *s)
{
  const wf_ckpt_target *t = s->t;
  const layout *l = &s->lay;
  json_t *a = json_array();
  char name[64];
  if (l->model) {
    size_t len = l->model_head + l->model_n * sizeof(float);
    wf__model_name(name, sizeof name, t->pp_rank, t->tp_rank);
    json_array_append_new(a, file_msg(name, l->model_off, len, wf__model_entry(t, name, len)));
  }
  if (l->optim) {
    size_t len = WF__OPT_HEADER + 2 * (l->optim_hi - l->optim_lo) * sizeof(float);
    int dp = t->optim_sharded ? wf__rank_of(t->dp_comm) : -1;
    wf__optim_name(name, sizeof name, t->pp_rank, t->tp_rank, dp);
    json_array_append_new(a, file_msg(name, l->optim_off, len, wf__optim_entry(t, name, dp, len)));
  }
  return a;
}

/* The request for step's checkpoint: this rank's files, its part of the data position,
 * and on rank 0 what publishing needs. */
static wf_status write_msg(const wf_ckpt_saver *s, int step, json_t **out)
{
  wf_status st = WF_OK;
  const wf_config *cfg = s->t->cfg;
  char stage[WF__PATH_LEN], nonce[32];
  json_t *m = NULL, *part = NULL;
  nonce_text(s, nonce, sizeof nonce);
  wf__pathf(stage, sizeof stage, "%s/.tmp-step-%06d-%s", cfg->train.checkpoint_dir, step, nonce);
  WF_TRY(wf__data_state_part(s->t, step, &part));
  m = json_pack("{s:s, s:i, s:s, s:s, s:o}", "op", "write", "step", step, "root",
                cfg->train.checkpoint_dir, "stage", stage, "files", files_msg(s));
  WF_CHECK(m, WF_ENOMEM, "checkpoint: out of memory for a request");
  if (part)
    json_object_set(m, "data_stream", part);
  if (s->rank == 0)
    json_object_set_new(m, "publish",
                        json_pack("{s:O, s:o, s:i}", "ranks", s->writers, "manifest",
                                  wf__manifest_json(s->t, step), "keep",
                                  cfg->train.keep_checkpoints));
  *out = m, m = NULL;
fail:
  json_decref(part);
  json_decref(m);
  return st;
}

/* Copy step's state into the snapshot and hand it to the writer. The caller set
 * s->snapping and the state is step's (COMPUTE or HOLD). collective: called by every
 * rank at once (ZeRO-3 streams its shards). */
static wf_status take(wf_ckpt_saver *s, int step)
{
  wf_status st = WF_OK;
  double t0 = wf_now();
  json_t *m = NULL;
  if (s->lay.bytes) {
    put_headers(s, step);
    WF_TRY(copy_model(s));
    WF_TRY(copy_optim(s));
  } else if (s->lay.zero3) {
    WF_TRY(copy_model(s)); /* a dp rank > 0 streams its shard to dp rank 0 */
  }
  if (s->sock >= 0)
    WF_TRY(write_msg(s, step, &m));
fail:
  pthread_mutex_lock(&s->mu);
  s->snapping = false;
  s->t_snap = wf_now() - t0;
  if (st == WF_OK) {
    s->snap_step = step;
    s->inflight = m ? step : 0;
    s->done = !m;
    s->t_sent = wf_now();
    if (m && wf__msg_send(s->sock, m) != WF_OK) {
      WF_ERROR("checkpoint: cannot reach the checkpoint writer of rank %d", s->rank);
      s->failed = s->done = true;
    }
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  json_decref(m);
  return st;
}

/* ---- the rescue (service thread) ------------------------------------------------------------ */

#define CHILD_STACK (64u << 10)

/* The rescue process, on its own stack in the rank's address space: raw system calls
 * only (the rank's other threads hold whatever locks they hold). Out of the rank's
 * session and with nothing open but the socket, it streams the request and the state to
 * the writer; the rank's memory lives as long as this process does, SIGKILL of the rank
 * or not. */
static bool raw_send(int fd, const char *p, size_t n)
{
  while (n > 0) {
    long w = syscall(SYS_sendto, fd, p, n, MSG_NOSIGNAL, NULL, 0);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return false;
    p += w, n -= (size_t)w;
  }
  return true;
}

static int rescue_main(void *arg)
{
  const wf_ckpt_saver *s = arg;
  int fd = s->sock;
  syscall(SYS_setsid);
  if (fd > 0)
    syscall(SYS_close_range, 0, (unsigned)fd - 1, 0);
  syscall(SYS_close_range, (unsigned)fd + 1, ~0u, 0);
  bool ok = raw_send(fd, s->child_msg, s->child_len);
  for (int i = 0; ok && i < s->nseg; i++)
    ok = raw_send(fd, s->seg[i].p, s->seg[i].n);
  syscall(SYS_exit, ok ? 0 : 1);
  return 0;
}

/* The request, framed, and the segments of the files it streams: headers, then the
 * live parameters and optimizer state of host memory. */
static wf_status rescue_request(wf_ckpt_saver *s, int step)
{
  wf_status st = WF_OK;
  const wf_ckpt_target *t = s->t;
  size_t lo, hi;
  float *m, *v;
  json_t *req = NULL;
  char *text = NULL;
  WF_TRY(write_msg(s, step, &req));
  json_object_set_new(req, "inline", json_true());
  WF_CHECK_ALLOC(text = json_dumps(req, JSON_COMPACT));
  size_t n = strlen(text);
  WF_CHECK_ALLOC(s->child_msg = malloc(n + 4));
  for (int i = 0; i < 4; i++)
    s->child_msg[i] = (char)(n >> (8 * i));
  memcpy(s->child_msg + 4, text, n);
  s->child_len = n + 4, s->nseg = 0;
  if (s->lay.model) {
    s->seg[s->nseg++] = (seg){s->head[0], s->lay.model_head};
    wf__model_header_put(s->head[0], wf_model_get_dims(t->model), wf_model_get_shard(t->model),
                         s->lay.model_n);
    s->seg[s->nseg++] = (seg){wf_model_params(t->model), s->lay.model_n * sizeof(float)};
  }
  if (s->lay.optim) {
    wf_optim_state(t->optim, &lo, &hi, &m, &v);
    wf__optim_header_put(s->head[1], t, step);
    s->seg[s->nseg++] = (seg){s->head[1], WF__OPT_HEADER};
    s->seg[s->nseg++] = (seg){m, (hi - lo) * sizeof(float)};
    s->seg[s->nseg++] = (seg){v, (hi - lo) * sizeof(float)};
  }
fail:
  free(text);
  json_decref(req);
  return st;
}

/* Host memory (the CPU device): no copy at all. A process that shares the rank's memory
 * (clone(CLONE_VM), as vfork's child does, without stopping the rank) streams the state
 * to the writer. It cannot change meanwhile: the rank's next agreement says stop, and no
 * update follows (see the top). Called under mu. */
static wf_status rescue_live(wf_ckpt_saver *s, int step)
{
  wf_status st = WF_OK;
  WF_TRY(rescue_request(s, step));
  s->child_stack = mmap(NULL, CHILD_STACK, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  WF_CHECK(s->child_stack != MAP_FAILED, WF_ESYS, "checkpoint: cannot map a stack: %s",
           strerror(errno));
  s->child = clone(rescue_main, (char *)s->child_stack + CHILD_STACK, CLONE_VM | SIGCHLD, s);
  WF_CHECK(s->child > 0, WF_ESYS, "checkpoint: cannot start the rescue process: %s",
           strerror(errno));
  s->snap_step = step, s->inflight = step, s->done = false, s->t_snap = 0;
  s->t_sent = wf_now();
fail:
  if (st != WF_OK && s->child_stack != MAP_FAILED && s->child_stack)
    munmap(s->child_stack, CHILD_STACK);
  if (st != WF_OK)
    s->child_stack = NULL;
  return st;
}

/* Device memory: copied into the snapshot once the writer is done with it (a copy from
 * the device is fast; the launcher's grace need only cover it). Called under mu; returns
 * under mu. */
static void rescue_copy(wf_ckpt_saver *s, int step)
{
  while (s->inflight && !s->done) { /* the snapshot holds a write: let it finish */
    pthread_mutex_unlock(&s->mu);
    read_answer(s);
    pthread_mutex_lock(&s->mu);
  }
  if (s->failed)
    return;
  s->snapping = true;
  pthread_mutex_unlock(&s->mu);
  take(s, step);
  pthread_mutex_lock(&s->mu);
}

static void rescue(wf_ckpt_saver *s)
{
  pthread_mutex_lock(&s->mu);
  while ((s->phase == WF_CKPT_AGREE || s->phase == WF_CKPT_UPDATE || s->snapping) &&
         !s->quitting) /* (a trainer that failed mid-update never leaves it) */
    pthread_cond_wait(&s->cv, &s->mu);
  int step = s->state_step;
  if (s->rescue_ok && step > s->snap_step && !s->failed && !s->quitting && s->sock >= 0) {
    if (s->rank == 0)
      WF_INFO("checkpoint: saving step %d's state now, while the step under way runs on; its "
              "writer completes the checkpoint even if the launcher kills the job",
              step);
    if (wf_dev_host_visible(wf_model_dev(s->t->model)))
      rescue_live(s, step);
    else
      rescue_copy(s, step);
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void *service(void *arg)
{
  wf_ckpt_saver *s = arg;
  for (;;) {
    struct pollfd p[3] = {{s->quit[0], POLLIN, 0}, {s->sock, POLLIN, 0}, {s->rescue_fd, POLLIN, 0}};
    if (poll(p, s->rescue_fd >= 0 ? 3 : 2, -1) < 0 && errno != EINTR)
      break;
    if (p[0].revents)
      break;
    if (p[1].revents)
      read_answer(s);
    if (s->rescue_fd >= 0 && p[2].revents) {
      uint64_t n;
      if (read(s->rescue_fd, &n, sizeof n) < 0 && errno != EAGAIN)
        s->rescue_fd = -1;
      rescue(s);
    }
  }
  return NULL;
}

/* ---- create and destroy --------------------------------------------------------------------- */

/* A device's rescue copies its snapshot to the host within the launcher's grace; this
 * rate is what a PCIe 4 GPU reaches into pageable memory (the snapshot is not pinned).
 * Host memory needs no copy (rescue_live). */
#define DEVICE_TO_HOST_BYTES_S 10e9

/* Rank 0: a rescue that would outlast the launcher's grace, said once. dev[r]: the bytes
 * rank r's rescue copies from its device (0: none, or host memory). */
static void grace_advice(const wf_ckpt_saver *s, const int64_t *dev, int n, double grace)
{
  int64_t most = 0;
  for (int r = 0; r < n; r++)
    most = WF_MAX(most, dev[2 * r + 1]);
  double need = most / DEVICE_TO_HOST_BYTES_S + 0.5;
  if (s->rank != 0 || grace <= 0 || most == 0 || need <= grace)
    return;
  WF_WARN("launcher: a stop under mpirun has %.0f s before SIGKILL, and saving the state of "
          "the step under way copies up to %.1f GB from the GPU (about %.1f s): launch with "
          "OMPI_MCA_odls_base_sigkill_timeout=%.0f or more, or stop the job with `coordinator "
          "stop`",
          grace, most / 1e9, need, ceil(need / 2));
}

/* Whether this rank has a writer: it writes files, or holds a part of the data position
 * (rank 0 always: it publishes). */
static bool writes(const wf_ckpt_saver *s) { return s->lay.bytes > 0 || s->lay.data; }

/* Every rank's {writes, bytes its rescue copies from a device}, so rank 0 knows whose
 * records to wait for; and rank 0's nonce for the staging directories' names. */
static wf_status share_roles(wf_ckpt_saver *s, double grace)
{
  wf_status st = WF_OK;
  int n = wf__size_of(s->world);
  bool host = wf_dev_host_visible(wf_model_dev(s->t->model));
  int64_t mine[2] = {writes(s), host ? 0 : (int64_t)s->lay.bytes}, *all = NULL;
  WF_CHECK_ALLOC(all = calloc(2 * (size_t)n, sizeof *all));
  s->nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)(wf_wall_time() * 1e6);
  if (s->world) {
    WF_TRY(wf_comm_allgather(s->world, mine, all, 2, WF_COMM_I64));
    WF_TRY(wf_comm_bcast(s->world, &s->nonce, 1, WF_COMM_U64, 0));
  } else {
    memcpy(all, mine, sizeof mine);
  }
  WF_CHECK_ALLOC(s->writers = json_array());
  for (int r = 0; r < n; r++)
    if (all[2 * r])
      json_array_append_new(s->writers, json_integer(r));
  grace_advice(s, all, n, grace);
fail:
  free(all);
  return st;
}

static wf_status hello(wf_ckpt_saver *s)
{
  wf_status st = WF_OK;
  char nonce[32];
  json_t *m = NULL;
  nonce_text(s, nonce, sizeof nonce);
  m = json_pack("{s:s, s:s, s:s}", "op", "hello", "root", s->t->cfg->train.checkpoint_dir, "nonce",
                nonce);
  WF_CHECK(m && wf__msg_send(s->sock, m) == WF_OK, WF_EIO,
           "checkpoint: cannot reach the checkpoint writer of rank %d", s->rank);
fail:
  json_decref(m);
  return st;
}

static wf_status start(wf_ckpt_saver *s, const wf_ckpt_saver_opts *o)
{
  wf_status st = WF_OK;
  WF_TRY(share_roles(s, o->kill_grace_s));
  WF_TRY(map_snapshot(s));
  if (writes(s) || s->rank == 0)
    WF_TRY(spawn_writer(s));
  if (s->sock >= 0)
    WF_TRY(hello(s));
  WF_CHECK_SYS(pipe2(s->quit, O_CLOEXEC));
  WF_CHECK(pthread_create(&s->thread, NULL, service, s) == 0, WF_ESYS,
           "checkpoint: cannot start the checkpoint service thread");
  s->thread_on = true;
fail:
  return st;
}

wf_status wf_ckpt_saver_create(wf_ckpt_saver **out, const wf_ckpt_target *t, int step,
                               const wf_ckpt_saver_opts *o)
{
  wf_status st = WF_OK;
  wf_ckpt_saver *s = NULL;
  *out = NULL;
  WF_CHECK_ALLOC(s = calloc(1, sizeof *s));
  *s = (wf_ckpt_saver){.t = t,
                       .world = wf__ckpt_world(t),
                       .memfd = -1,
                       .pid = -1,
                       .sock = -1,
                       .rescue_fd = o->rescue_fd,
                       .quit = {-1, -1},
                       .state_step = step,
                       .snap_step = step};
  s->rank = wf__rank_of(s->world);
  s->lay = plan_layout(t);
  s->rescue_ok = !s->lay.zero3;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  st = wf__ckpt_agree(t, start(s, o), "starting the checkpoint writer");
  if (st != WF_OK)
    wf_ckpt_saver_destroy(s);
  else
    *out = s;
fail:
  return st;
}

/* Close the socket (the writer exits after the work in hand), and reap the writer unless
 * it is still finishing a checkpoint (a job that failed meanwhile): then it completes on
 * its own. */
static void stop_writer(wf_ckpt_saver *s)
{
  if (s->sock >= 0)
    close(s->sock);
  s->sock = -1;
  for (int i = 0; s->pid > 0 && s->done && i < 200; i++) /* idle: it exits at once */
    if (waitpid(s->pid, NULL, WNOHANG) != 0)
      break;
    else
      usleep(5000);
}

void wf_ckpt_saver_destroy(wf_ckpt_saver *s)
{
  if (!s)
    return;
  if (s->thread_on) {
    pthread_mutex_lock(&s->mu);
    s->quitting = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    ssize_t w = write(s->quit[1], "q", 1);
    (void)w;
    pthread_join(s->thread, NULL);
  }
  /* A rescue process reads this rank's state: nothing may be freed before it is done
   * (the trainer frees the model after this) */
  while (s->child > 0 && waitpid(s->child, NULL, 0) < 0 && errno == EINTR)
    ;
  if (s->child_stack)
    munmap(s->child_stack, CHILD_STACK);
  free(s->child_msg);
  s->done = s->done || !s->inflight;
  stop_writer(s);
  for (int i = 0; i < 2; i++)
    if (s->quit[i] >= 0)
      close(s->quit[i]);
  if (s->buf) {
    munmap(s->buf, s->lay.bytes);
    wf_mem_account(WF_MEM_HOST, -(int64_t)s->lay.bytes);
  }
  if (s->memfd >= 0)
    close(s->memfd);
  json_decref(s->writers);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* ---- the main thread ------------------------------------------------------------------------ */

void wf_ckpt_saver_phase(wf_ckpt_saver *s, wf_ckpt_phase phase, int step)
{
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  while (s->snapping && phase == WF_CKPT_UPDATE) /* cannot happen: see the top; but never */
    pthread_cond_wait(&s->cv, &s->mu);
  s->phase = phase;
  if (phase == WF_CKPT_COMPUTE || phase == WF_CKPT_HOLD)
    s->state_step = step;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Every rank's view, maxed: {due, a write in flight, 1 + a failing rank}. */
static wf_status poll_all(wf_ckpt_saver *s, bool due, int32_t v[3])
{
  pthread_mutex_lock(&s->mu);
  v[0] = due, v[1] = s->inflight && !s->done, v[2] = s->failed ? s->rank + 1 : 0;
  pthread_mutex_unlock(&s->mu);
  return s->world ? wf_comm_allreduce(s->world, v, v, 3, WF_COMM_I32, WF_COMM_MAX) : WF_OK;
}

static wf_status failed(const wf_ckpt_saver *s, int bad)
{
  if (s->rank == 0)
    WF_ERROR("the checkpoint could not be written: it failed on rank %d (see above); training "
             "stops here so no progress goes unsaved",
             bad);
  return WF_EIO;
}

/* Snapshot step on every rank (the state is step's everywhere) and agree on it. */
static wf_status take_all(wf_ckpt_saver *s, int step)
{
  pthread_mutex_lock(&s->mu);
  while (s->snapping) /* a rescue of this very state */
    pthread_cond_wait(&s->cv, &s->mu);
  bool todo = s->snap_step < step;
  s->snapping = todo;
  pthread_mutex_unlock(&s->mu);
  wf_status mine = WF_OK;
  if (todo || s->lay.zero3)
    mine = take(s, step);
  return wf__ckpt_agree(s->t, mine, "the checkpoint's snapshot");
}

wf_status wf_ckpt_saver_boundary(wf_ckpt_saver *s, int step, bool due, bool *started)
{
  int32_t v[3];
  *started = false;
  wf_status st = poll_all(s, due || s->deferred, v);
  if (st != WF_OK || v[2])
    return st != WF_OK ? st : failed(s, v[2] - 1);
  if (!v[0])
    return WF_OK;
  if (v[1]) { /* the previous checkpoint is still being written: this one waits */
    if (!s->deferred && !s->slow_said && s->rank == 0)
      WF_WARN("checkpoint: step %d is due but the previous checkpoint is still being written; it "
              "is taken once that one is done (checkpoints come as fast as the disk allows; "
              "train.checkpoint_every or train.checkpoint_minutes asks for more)",
              step);
    s->slow_said = true;
    s->deferred = true;
    return WF_OK;
  }
  s->deferred = false;
  *started = true;
  return take_all(s, step);
}

/* Wait until this rank's writer has finished what it holds. */
static void wait_idle(wf_ckpt_saver *s)
{
  pthread_mutex_lock(&s->mu);
  while ((s->inflight && !s->done) || s->snapping)
    pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

wf_status wf_ckpt_saver_finish(wf_ckpt_saver *s, int step)
{
  wf_status st = WF_OK;
  int32_t v[3];
  for (int round = 0; round < 2; round++) {
    wait_idle(s);
    WF_TRY(poll_all(s, s->snap_step < step, v));
    if (v[2])
      return failed(s, v[2] - 1);
    if (!v[0])
      return WF_OK;
    WF_TRY(take_all(s, step));
  }
  wait_idle(s);
  WF_TRY(poll_all(s, false, v));
  if (v[2])
    st = failed(s, v[2] - 1);
fail:
  return st;
}

double wf_ckpt_saver_snapshot_s(const wf_ckpt_saver *s) { return s ? s->t_snap : 0; }

double wf_ckpt_saver_write_s(wf_ckpt_saver *s)
{
  pthread_mutex_lock(&s->mu);
  double busy = s->write_s + (s->inflight && !s->done ? wf_now() - s->t_sent : 0);
  pthread_mutex_unlock(&s->mu);
  return busy;
}
