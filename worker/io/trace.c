/*
 * trace.c - the Chrome trace writer (wf_io.h): every rank's spans (the runtime's
 * recorder, wf_trace.h) into one file on rank 0.
 *
 * Layout of the file: one process per rank (pid = world rank, named by its label, e.g.
 * "rank 3 (pp 1, dp 0, tp 1)", sorted by rank) and in each a thread per kind of work
 * (THREAD_*: compute, communication, the optimizer step), so Perfetto draws a rank's
 * collectives and p2p waits on their own row under its F and B spans rather than on top
 * of them.
 *
 * Writing (collective). The job duplicates MPI_COMM_WORLD so its messages cannot match
 * anyone else's point-to-point traffic. Rank 0 then serves the other ranks one at a time:
 *  1. clock offset: PINGS round trips; rank 0 sends at t_send, the peer answers with its
 *     clock t_remote, rank 0 receives at t_recv. The round trip with the smallest
 *     t_recv - t_send bounds the error best; offset = t_remote - (t_send + t_recv) / 2 is
 *     the peer's clock minus rank 0's, subtracted from the peer's spans.
 *  2. spans: a fixed-size header, then the span array in chunks of CHUNK spans, so rank 0
 *     needs one fixed buffer however many spans a rank holds and can always drain a peer
 *     even after a local error (it stops building the file but keeps receiving).
 * Ranks are served in order, so at most one peer's messages are in flight. Spans travel as
 * raw bytes: the job runs one build of the worker on every host (same layout).
 *
 * Events are built as jansson objects (names are escaped by jansson) with ts in rank 0's
 * absolute microseconds, then rebased to the earliest span so the file starts near 0.
 * The outcome is agreed with the collectives' wf_comm_agree over the job's world.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <mpi.h>

#include "wf_check.h"
#include "wf_collectives.h"
#include "wf_runtime.h"
#include "wf_file.h"
#include "wf_io.h"

#define PINGS 8
#define CHUNK 4096
enum { TAG_PING = 1, TAG_PONG, TAG_HDR, TAG_SPANS };

/* The threads of a rank's process (tid), by span category. */
enum { THREAD_COMPUTE, THREAD_COMM, THREAD_OPTIM, THREADS };
static const char *const thread_names[THREADS] = {"compute", "communication", "optimizer step"};

typedef wf_trace_rec span;

/* What a rank sends ahead of its spans. */
typedef struct rank_hdr {
  long long n, dropped;
  char label[WF_TRACE_LABEL_MAX];
} rank_hdr;

/* ---- JSON events -------------------------------------------------------------------------- */

/* "comm" (collectives) and "wait" (p2p waits) on the communication thread, "optim" on
 * the optimizer's, the rest ("compute") on the compute thread. */
static int thread_of(const char *cat)
{
  if (!strcmp(cat, "comm") || !strcmp(cat, "wait"))
    return THREAD_COMM;
  return !strcmp(cat, "optim") ? THREAD_OPTIM : THREAD_COMPUTE;
}

static json_t *span_event(const span *s, int rank, double offset)
{
  json_t *args = json_object();
  if (s->step >= 0)
    json_object_set_new(args, "step", json_integer(s->step));
  if (s->mb >= 0)
    json_object_set_new(args, "mb", json_integer(s->mb));
  /* ts stays absolute (rank 0's clock, us) until rebase_events. */
  return json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:o}", "name", s->name, "cat", s->cat, "ph",
                   "X", "ts", (s->t0 - offset) * 1e6, "dur", (s->t1 - s->t0) * 1e6, "pid", rank,
                   "tid", thread_of(s->cat), "args", args);
}

/* One metadata event ("M") of process `pid` (and thread tid, or none when tid < 0) whose
 * args hold key = a string (sval) or an integer. */
static json_t *meta(const char *what, int pid, int tid, const char *key, const char *sval, int ival)
{
  json_t *e = json_pack("{s:s, s:s, s:i, s:{s:o}}", "name", what, "ph", "M", "pid", pid, "args",
                        key, sval ? json_string(sval) : json_integer(ival));
  if (e && tid >= 0)
    json_object_set_new(e, "tid", json_integer(tid));
  return e;
}

/* Rank `rank`'s process: its name (the label, or "rank R"), sorted by rank, and its
 * threads named and in THREAD_* order. */
static wf_status add_process(json_t *events, int rank, const char *label)
{
  char fallback[32];
  if (!label[0]) {
    snprintf(fallback, sizeof(fallback), "rank %d", rank);
    label = fallback;
  }
  json_t *m[2 + 2 * THREADS];
  int n = 0;
  m[n++] = meta("process_name", rank, -1, "name", label, 0);
  m[n++] = meta("process_sort_index", rank, -1, "sort_index", NULL, rank);
  for (int k = 0; k < THREADS; k++) {
    m[n++] = meta("thread_name", rank, k, "name", thread_names[k], 0);
    m[n++] = meta("thread_sort_index", rank, k, "sort_index", NULL, k);
  }
  wf_status st = WF_OK;
  for (int i = 0; i < n; i++) /* append_new takes (or frees) each, NULL included */
    if (json_array_append_new(events, m[i]) != 0)
      st = WF_ENOMEM;
  return st;
}

static wf_status add_spans(json_t *events, const span *s, size_t n, int rank, double offset)
{
  for (size_t i = 0; i < n; i++)
    if (json_array_append_new(events, span_event(&s[i], rank, offset)) != 0)
      return WF_ENOMEM;
  return WF_OK;
}

/* Shift every "X" event so the earliest starts at 0 (Perfetto shows absolute offsets
 * otherwise, and wf_now() counts from boot). */
static void rebase_events(json_t *events)
{
  double base = INFINITY;
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e)
  {
    json_t *ts = json_object_get(e, "ts");
    if (ts && json_real_value(ts) < base)
      base = json_real_value(ts);
  }
  json_array_foreach(events, i, e)
  {
    json_t *ts = json_object_get(e, "ts");
    if (ts)
      json_real_set(ts, json_real_value(ts) - base);
  }
}

/* ---- file ---------------------------------------------------------------------------------- */

/* Write `root` to path with the runtime's atomic writer: readers never see half a trace. */
static wf_status write_atomic(const json_t *root, const char *path)
{
  char *text = json_dumps(root, JSON_COMPACT);
  if (!text) {
    WF_ERROR("trace: %s: out of memory formatting the trace", path);
    return WF_ENOMEM;
  }
  wf_status st = wf_file_write_atomic(path, text, strlen(text), 0644);
  free(text);
  return st;
}

/* ---- gather ---------------------------------------------------------------------------------- */

/* Rank 0's side of the clock exchange with `peer`: the peer's clock minus rank 0's. */
static wf_status measure_offset(MPI_Comm comm, int peer, double *offset, double *rtt)
{
  wf_status st = WF_OK;
  *rtt = INFINITY;
  *offset = 0;
  for (int k = 0; k < PINGS; k++) {
    double remote, t_send = wf_now();
    WF_CHECK_MPI(MPI_Send(NULL, 0, MPI_BYTE, peer, TAG_PING, comm));
    WF_CHECK_MPI(MPI_Recv(&remote, 1, MPI_DOUBLE, peer, TAG_PONG, comm, MPI_STATUS_IGNORE));
    double t_recv = wf_now();
    if (t_recv - t_send < *rtt) {
      *rtt = t_recv - t_send;
      *offset = remote - (t_send + t_recv) / 2;
    }
  }
exit:
  return st;
fail:
  goto exit;
}

/* A peer's side: answer the pings, then send the header and the spans in chunks. */
static wf_status send_to_root(const wf_trace *t, MPI_Comm comm)
{
  wf_status st = WF_OK;
  for (int k = 0; k < PINGS; k++) {
    WF_CHECK_MPI(MPI_Recv(NULL, 0, MPI_BYTE, 0, TAG_PING, comm, MPI_STATUS_IGNORE));
    double now = wf_now();
    WF_CHECK_MPI(MPI_Send(&now, 1, MPI_DOUBLE, 0, TAG_PONG, comm));
  }
  rank_hdr h = {.n = (long long)wf_trace_count(t), .dropped = (long long)wf_trace_dropped(t)};
  size_t n;
  const span *spans = wf_trace_records(t, &n);
  snprintf(h.label, sizeof(h.label), "%s", wf_trace_label(t));
  WF_CHECK_MPI(MPI_Send(&h, (int)sizeof(h), MPI_BYTE, 0, TAG_HDR, comm));
  for (size_t i = 0; i < (size_t)h.n; i += CHUNK) {
    size_t m = (size_t)h.n - i < CHUNK ? (size_t)h.n - i : CHUNK;
    WF_CHECK_MPI(MPI_Send(&spans[i], (int)(m * sizeof(span)), MPI_BYTE, 0, TAG_SPANS, comm));
  }
exit:
  return st;
fail:
  goto exit;
}

/* Rank 0 receives `peer`'s spans into buf (CHUNK spans) and appends them to events, unless
 * events is NULL (an earlier error): then it only drains the messages. */
static wf_status recv_peer(MPI_Comm comm, int peer, json_t *events, span *buf, json_t *info)
{
  wf_status st = WF_OK, build = WF_OK;
  double offset, rtt;
  rank_hdr h;
  WF_TRY(measure_offset(comm, peer, &offset, &rtt));
  WF_CHECK_MPI(MPI_Recv(&h, (int)sizeof(h), MPI_BYTE, peer, TAG_HDR, comm, MPI_STATUS_IGNORE));
  h.label[WF_TRACE_LABEL_MAX - 1] = '\0';
  if (events)
    build = add_process(events, peer, h.label);
  for (long long i = 0; i < h.n; i += CHUNK) {
    int m = h.n - i < CHUNK ? (int)(h.n - i) : CHUNK;
    WF_CHECK_MPI(
        MPI_Recv(buf, (int)(m * sizeof(span)), MPI_BYTE, peer, TAG_SPANS, comm, MPI_STATUS_IGNORE));
    if (events && build == WF_OK)
      build = add_spans(events, buf, (size_t)m, peer, offset);
  }
  json_array_append_new(json_object_get(info, "dropped_spans"), json_integer(h.dropped));
  json_array_append_new(json_object_get(info, "clock_offset_us"), json_real(offset * 1e6));
  json_array_append_new(json_object_get(info, "clock_rtt_us"), json_real(rtt * 1e6));
  st = build;
exit:
  return st;
fail:
  goto exit;
}

/* otherData: per-rank dropped spans and clock estimates, in rank order. */
static json_t *other_data(const wf_trace *t, int size)
{
  return json_pack("{s:s, s:i, s:[I], s:[f], s:[f]}", "generator", "weft wf_trace", "ranks", size,
                   "dropped_spans", (json_int_t)wf_trace_dropped(t), "clock_offset_us", 0.0,
                   "clock_rtt_us", 0.0);
}

/* Say what was written, and warn when any rank's buffer overflowed (the trace has gaps). */
static void log_written(const char *path, const json_t *events, const json_t *info)
{
  long long dropped = 0;
  size_t i;
  json_t *d;
  json_array_foreach(json_object_get(info, "dropped_spans"), i, d) dropped += json_integer_value(d);
  WF_INFO("trace: wrote %s (%zu events)", path, json_array_size(events));
  if (dropped)
    WF_WARN("trace: %lld spans were dropped (buffers full; see otherData.dropped_spans in %s); "
            "raise the span limit or trace fewer steps",
            dropped, path);
}

/* Rank 0: collect every rank's spans (its own first) and write the file. Keeps receiving
 * after a local error so no peer is left blocked in a send. */
static wf_status gather_and_write(const wf_trace *t, MPI_Comm comm, int size, const char *path)
{
  wf_status st = WF_OK, build = WF_OK;
  json_t *info = other_data(t, size);
  json_t *events = json_array();
  json_t *root = json_pack("{s:o, s:s, s:o}", "traceEvents", events, "displayTimeUnit", "ms",
                           "otherData", info);
  span *buf = malloc(CHUNK * sizeof(span));
  if (!root || !buf || !info) {
    WF_ERROR("trace: out of memory building %s", path ? path : "(null)");
    build = WF_ENOMEM, events = NULL, info = NULL;
  }
  if (events) {
    size_t n;
    const span *spans = wf_trace_records(t, &n);
    build = add_process(events, 0, wf_trace_label(t));
    if (build == WF_OK && t)
      build = add_spans(events, spans, n, 0, 0.0);
  }
  for (int peer = 1; peer < size; peer++) {
    wf_status s = recv_peer(comm, peer, build == WF_OK ? events : NULL, buf, info);
    WF_TRY(s == WF_EMPI ? s : WF_OK); /* a transport error ends the exchange */
    build = build == WF_OK ? s : build;
  }
  WF_CHECK(build == WF_OK, build, "trace: could not build %s: %s", path, wf_status_str(build));
  WF_CHECK(path && path[0], WF_EINVAL, "trace: no output path given");
  rebase_events(events);
  WF_TRY(write_atomic(root, path));
  log_written(path, events, info);
exit:
  free(buf);
  json_decref(root);
  return st;
fail:
  goto exit;
}

wf_status wf_trace_write(wf_trace *t, wf_comm *world, const char *path)
{
  wf_status st = WF_OK, mine;
  int rank, size;
  MPI_Comm comm;
  WF_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  mine = rank == 0 ? gather_and_write(t, comm, size, path) : send_to_root(t, comm);
  MPI_Comm_free(&comm);
  /* Every rank returns rank 0's verdict (or the lowest failing rank's); each error was
   * logged where it arose. */
  st = wf_comm_agree(world, mine, NULL);
exit:
  return st;
fail:
  goto exit;
}
