/*
 * test_trace.c - the Chrome trace recorder (runtime/wf_trace.h), run under mpirun (3 ranks).
 *
 * Local checks on every rank: dropped-span counting past max_spans, recording only while
 * on, and wf_trace_busy against hand-computed unions. Then the collective write: rank r
 * records r + 2 compute spans "F<i>", one comm span whose name needs JSON escaping and one
 * optim span whose name is longer than 31 characters; rank 0 reads the file back with
 * jansson and checks every rank's process (pid = rank, named by its label) and its
 * threads (compute, communication, optimizer step). A write to an unwritable
 * path must fail with the same status on every rank, and a rank may pass a NULL trace.
 * Any failed check calls MPI_Abort, so the test fails rather than hangs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include <jansson.h>
#include <mpi.h>

#include "wf_collectives.h"
#include "wf_io.h"

/* A name with a quote, a backslash, a newline and a tab: all must be escaped in JSON. */
#define ODD_NAME "C\"q\\\n\t"
/* Longer than the 31 characters names were once cut at. */
#define LONG_NAME "step end (reduction, norm, AdamW) and more, up to 63"
/* The threads of every process (wf_io.h). */
enum { TID_COMPUTE, TID_COMM, TID_OPTIM };

static int g_rank;
static wf_comm *g_world;

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", g_rank, __FILE__, __LINE__, #cond);    \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                \
    }                                                                                              \
  } while (0)

static bool near(double a, double b) { return fabs(a - b) < 1e-12; }

static void test_dropped(void)
{
  wf_trace *t = NULL;
  CHECK(wf_trace_create(&t, "x", 4) == WF_OK);
  CHECK(!wf_trace_on(t));
  wf_trace_span(t, "off", "compute", 0, 1, -1, -1); /* off: neither kept nor dropped */
  CHECK(wf_trace_count(t) == 0 && wf_trace_dropped(t) == 0);
  wf_trace_set_on(t, true);
  for (int i = 0; i < 6; i++)
    wf_trace_span(t, "F", "compute", i, i + 1, 0, i);
  /* 6 recorded into room for 4: 4 kept, 2 dropped. */
  CHECK(wf_trace_count(t) == 4);
  CHECK(wf_trace_dropped(t) == 2);
  wf_trace_destroy(t);
  wf_trace_destroy(NULL);
  CHECK(wf_trace_create(&t, "x", 0) == WF_EINVAL);
  /* NULL recorder: call sites need no check. */
  wf_trace_span(NULL, "F", "compute", 0, 1, 0, 0);
  CHECK(!wf_trace_on(NULL));
}

static void test_busy(void)
{
  wf_trace *t = NULL;
  CHECK(wf_trace_create(&t, "x", 8) == WF_OK);
  wf_trace_set_on(t, true);
  wf_trace_span(t, "F0", "compute", 0.0, 1.0, 0, 0);
  wf_trace_span(t, "F1", "compute", 0.5, 2.0, 0, 1); /* overlaps F0: union [0, 2] */
  wf_trace_span(t, "S", "comm", 3.0, 4.0, 0, -1);
  wf_trace_span(t, "B0", "compute", 5.0, 6.0, 0, 0);
  wf_trace_span(t, "bad", "compute", 7.0, 6.5, 0, 0); /* t1 < t0: clamped to empty */
  /* compute union: [0, 2] + [5, 6] = 3 s. */
  CHECK(near(wf_trace_busy(t, "compute", 0, 10), 3.0));
  /* clipped to [1.5, 5.5]: [1.5, 2] + [5, 5.5] = 1 s. */
  CHECK(near(wf_trace_busy(t, "compute", 1.5, 5.5), 1.0));
  /* any category: [0, 2] + [3, 4] + [5, 6] = 4 s. */
  CHECK(near(wf_trace_busy(t, NULL, 0, 10), 4.0));
  CHECK(near(wf_trace_busy(t, "comm", 0, 3), 0.0));
  CHECK(near(wf_trace_busy(t, "optim", 0, 10), 0.0));
  CHECK(near(wf_trace_busy(t, "compute", 2, 1), 0.0)); /* empty window */
  wf_trace_destroy(t);
}

static void spin(double seconds)
{
  double end = wf_now() + seconds;
  while (wf_now() < end) {
  }
}

/* Rank r: r + 2 compute spans F0.. then one comm span, each a real (short) interval. */
static wf_trace *record(int rank)
{
  char label[64], name[16];
  wf_trace *t = NULL;
  snprintf(label, sizeof(label), "rank %d (pp %d, \"test\")", rank, rank);
  CHECK(wf_trace_create(&t, label, 64) == WF_OK);
  wf_trace_set_on(t, true);
  for (int i = 0; i < rank + 2; i++) {
    double t0 = wf_now();
    spin(1e-4);
    snprintf(name, sizeof(name), "F%d", i);
    wf_trace_span(t, name, "compute", t0, wf_now(), 7, i);
  }
  double t0 = wf_now();
  spin(1e-4);
  wf_trace_span(t, ODD_NAME, "comm", t0, wf_now(), 7, -1);
  t0 = wf_now();
  spin(1e-4);
  wf_trace_span(t, LONG_NAME, "optim", t0, wf_now(), 7, -1);
  return t;
}

/* The events of process pid with phase ph, in file order: of thread tid, or (tid < 0) the
 * process's own metadata (no tid). */
static size_t events_of(json_t *events, int pid, int tid, const char *ph, json_t **out, size_t cap)
{
  size_t i, k = 0;
  json_t *e;
  json_array_foreach(events, i, e)
  {
    json_t *t = json_object_get(e, "tid");
    if (json_integer_value(json_object_get(e, "pid")) != pid ||
        strcmp(json_string_value(json_object_get(e, "ph")), ph) != 0 ||
        (tid < 0 ? t != NULL : !t || json_integer_value(t) != tid))
      continue;
    if (k < cap)
      out[k] = e;
    k++;
  }
  return k;
}

/* The argument `arg` of metadata event `name` of (pid, tid); "int" for an integer. */
static const char *meta_arg(json_t *events, int pid, int tid, const char *name, const char *arg)
{
  json_t *m[8];
  size_t n = events_of(events, pid, tid, "M", m, 8);
  for (size_t i = 0; i < n && i < 8; i++)
    if (strcmp(json_string_value(json_object_get(m[i], "name")), name) == 0) {
      json_t *v = json_object_get(json_object_get(m[i], "args"), arg);
      return json_is_string(v) ? json_string_value(v) : json_is_integer(v) ? "int" : NULL;
    }
  return NULL;
}

static bool str_is(const char *a, const char *b) { return a && strcmp(a, b) == 0; }

/* Rank r's process: its name and sort index, and its three named threads. */
static void check_process(json_t *events, int r)
{
  char label[64];
  static const char *threads[] = {"compute", "communication", "optimizer step"};
  snprintf(label, sizeof(label), "rank %d (pp %d, \"test\")", r, r);
  CHECK(str_is(meta_arg(events, r, -1, "process_name", "name"), label));
  CHECK(str_is(meta_arg(events, r, -1, "process_sort_index", "sort_index"), "int"));
  for (int k = 0; k < 3; k++) {
    CHECK(str_is(meta_arg(events, r, k, "thread_name", "name"), threads[k]));
    CHECK(str_is(meta_arg(events, r, k, "thread_sort_index", "sort_index"), "int"));
  }
}

/* One span: ts and dur sane, step 7, and mb when given (-1: none in the event). */
static double check_span(json_t *x, const char *name, const char *cat, int mb, double prev_end)
{
  double ts = json_real_value(json_object_get(x, "ts"));
  double dur = json_real_value(json_object_get(x, "dur"));
  json_t *args = json_object_get(x, "args");
  CHECK(ts >= 0 && dur >= 0);
  CHECK(dur >= 90);             /* each span spun for 100 us */
  CHECK(ts >= prev_end - 1e-3); /* recorded back to back, in order */
  CHECK(str_is(json_string_value(json_object_get(x, "name")), name));
  CHECK(str_is(json_string_value(json_object_get(x, "cat")), cat));
  CHECK(json_integer_value(json_object_get(args, "step")) == 7);
  if (mb >= 0)
    CHECK(json_integer_value(json_object_get(args, "mb")) == mb);
  else
    CHECK(json_object_get(args, "mb") == NULL); /* mb = -1 is left out */
  return ts + dur;
}

static void check_track(json_t *events, int r)
{
  json_t *x[64], *c[2], *o[2];
  char name[16];
  check_process(events, r);
  size_t n = events_of(events, r, TID_COMPUTE, "X", x, 64);
  CHECK(n == (size_t)r + 2); /* r + 2 compute spans (record()) */
  CHECK(events_of(events, r, TID_COMM, "X", c, 2) == 1);
  CHECK(events_of(events, r, TID_OPTIM, "X", o, 2) == 1);
  double end = 0;
  for (size_t i = 0; i < n; i++) {
    snprintf(name, sizeof(name), "F%zu", i);
    end = check_span(x[i], name, "compute", (int)i, end);
  }
  end = check_span(c[0], ODD_NAME, "comm", -1, end);
  check_span(o[0], LONG_NAME, "optim", -1, end);
}

/* Same host, one CLOCK_MONOTONIC: the peer's reply lies inside the round trip, so the
 * estimated offset is within half of it. */
static void check_clock(json_t *other, int size)
{
  json_t *off = json_object_get(other, "clock_offset_us");
  json_t *rtt = json_object_get(other, "clock_rtt_us");
  CHECK(json_array_size(off) == (size_t)size && json_array_size(rtt) == (size_t)size);
  CHECK(json_array_size(json_object_get(other, "dropped_spans")) == (size_t)size);
  for (int r = 1; r < size; r++) {
    double o = json_real_value(json_array_get(off, r));
    double t = json_real_value(json_array_get(rtt, r));
    CHECK(t > 0 && fabs(o) <= t / 2 + 1e-3);
  }
}

static void check_file(const char *path, int size)
{
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  if (!root)
    fprintf(stderr, "%s:%d: %s\n", path, err.line, err.text);
  CHECK(root);
  CHECK(strcmp(json_string_value(json_object_get(root, "displayTimeUnit")), "ms") == 0);
  json_t *events = json_object_get(root, "traceEvents");
  CHECK(json_is_array(events));
  for (int r = 0; r < size; r++)
    check_track(events, r);
  check_clock(json_object_get(root, "otherData"), size);
  json_decref(root);
}

/* Only the trace itself is left in dir: the temporary file was renamed into place. */
static void check_no_tmp(const char *dir)
{
  DIR *d = opendir(dir);
  struct dirent *e;
  int files = 0;
  CHECK(d);
  while ((e = readdir(d)))
    files += e->d_name[0] != '.';
  closedir(d);
  CHECK(files == 1);
}

static void test_null_rank(const char *dir, int rank, int size)
{
  char path[256];
  snprintf(path, sizeof(path), "%s/null.json", dir);
  wf_trace *t = rank == size - 1 ? NULL : record(rank);
  CHECK(wf_trace_write(t, g_world, path) == WF_OK);
  if (rank == 0) {
    json_t *root = json_load_file(path, 0, NULL), *x[1];
    CHECK(root);
    json_t *events = json_object_get(root, "traceEvents");
    char label[32];
    snprintf(label, sizeof(label), "rank %d", size - 1);
    for (int k = 0; k < 3; k++)
      CHECK(events_of(events, size - 1, k, "X", x, 1) == 0);
    CHECK(str_is(meta_arg(events, size - 1, -1, "process_name", "name"), label));
    json_decref(root);
    remove(path);
  }
  wf_trace_destroy(t);
}

int main(int argc, char **argv)
{
  int size;
  char dir[256] = "";
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  wf_rt_set_rank(g_rank);
  CHECK(wf_comm_world_create(&g_world) == WF_OK);
  test_dropped();
  test_busy();

  if (g_rank == 0) {
    snprintf(dir, sizeof(dir), "%s/weft_trace_XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    CHECK(mkdtemp(dir));
  }
  MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
  char path[300];
  snprintf(path, sizeof(path), "%s/trace.json", dir);

  wf_trace *t = record(g_rank);
  CHECK(wf_trace_write(t, g_world, path) == WF_OK);
  if (g_rank == 0) {
    check_file(path, size);
    check_no_tmp(dir);
  }
  /* Rank 0 cannot create the file (its folder would be under a regular file; a missing
   * folder is created); every rank must get the same error back. */
  char bad[320];
  snprintf(bad, sizeof(bad), "%s/trace.json/x.json", dir);
  CHECK(wf_trace_write(t, g_world, bad) == WF_EIO);
  wf_trace_destroy(t);
  if (g_rank == 0)
    remove(path);
  test_null_rank(dir, g_rank, size);
  if (g_rank == 0) {
    rmdir(dir);
    printf("trace: %d ranks ok\n", size);
  }
  wf_comm_destroy(g_world);
  MPI_Finalize();
  return 0;
}
