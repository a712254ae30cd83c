/*
 * loader.c - a stream's rows made ahead on a background thread.
 *
 * The thread fills a ring of `depth` slots, one training step each (every local lane's
 * row), while the trainer uses the one it holds: reading JSON, tokenizing and packing
 * never sit on the step's critical path unless the loader is slower than training.
 *
 * Steps are consumed in order: the trainer holds step n's slot (asked for as often as
 * it likes: every micro-batch, every pipeline stage on this rank), and asking for n + 1
 * releases n's slot to the thread. Each slot keeps the lanes' state after its rows, so
 * the position a checkpoint saves after step n (the state before step n + 1's rows) is
 * the held slot's, whatever the thread has read ahead since.
 *
 * A failure of the thread (a bad line, a missing file) is kept with the step it hit
 * and reported by the call that asks for that step, never before: the rows before it
 * are good.
 *
 * Invariants: the thread alone touches the stream after start; the consumer reads a
 * slot only while it holds it; mu guards the indices, the error and the start.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "io_int.h"

typedef struct slot {
  int *win, *starts;      /* (lanes, T+1), (lanes, T) */
  uint64_t *lanes, *docs; /* the stream's state after these rows */
} slot;

struct wf__loader {
  wf__stream *s;
  int n_lanes, T, depth;
  size_t n_rec, n_docs;               /* uint64 of the local lanes' records, of the files' counts */
  slot *slots;                        /* index i lives in slots[i % depth] */
  uint64_t *base_lanes, *base_docs;   /* the state before index `base` */
  uint64_t *saved_lanes, *saved_docs; /* a restore not done yet (every lane), else NULL */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool started, quit, based;
  int64_t base;     /* the first index */
  int64_t held;     /* the index the consumer holds; base - 1 before it holds one */
  int64_t produced; /* the next index the thread fills */
  wf_status fail;   /* the thread's failure, at index fail_at */
  int64_t fail_at;
  char err[1024];
};

static slot *slot_of(wf__loader *ld, int64_t i) { return &ld->slots[i % ld->depth]; }

static void *produce(void *arg)
{
  wf__loader *ld = arg;
  char err[sizeof ld->err] = "";
  pthread_mutex_lock(&ld->mu);
  while (!ld->quit) {
    if (ld->produced - WF_MAX(ld->held, ld->base) >= ld->depth) { /* every slot is full */
      pthread_cond_wait(&ld->cv, &ld->mu);
      continue;
    }
    slot *sl = slot_of(ld, ld->produced);
    pthread_mutex_unlock(&ld->mu);
    wf_status st = wf__stream_rows(ld->s, sl->win, sl->starts, err, sizeof err);
    if (st == WF_OK) {
      wf__stream_lanes_get(ld->s, sl->lanes);
      wf__stream_docs_get(ld->s, sl->docs);
    }
    pthread_mutex_lock(&ld->mu);
    if (st != WF_OK) {
      ld->fail = st, ld->fail_at = ld->produced;
      wf_strlcpy(ld->err, err[0] ? err : wf_status_str(st), sizeof ld->err);
      pthread_cond_broadcast(&ld->cv);
      break;
    }
    ld->produced++;
    pthread_cond_broadcast(&ld->cv);
  }
  pthread_mutex_unlock(&ld->mu);
  return NULL;
}

size_t wf__loader_bytes(int n_lanes, int T, int depth)
{
  return (size_t)depth * n_lanes * ((size_t)(T + 1) + (size_t)T) * sizeof(int);
}

wf_status wf__loader_create(wf__loader **out, wf__stream *s, int n_lanes, int T, int depth)
{
  wf__loader *ld = calloc(1, sizeof *ld);
  *out = NULL;
  if (!ld)
    return WF_ENOMEM;
  ld->s = s, ld->n_lanes = n_lanes, ld->T = T, ld->depth = depth;
  ld->n_rec = (size_t)n_lanes * wf__stream_lane_rec(s), ld->n_docs = wf__stream_n_files(s);
  pthread_mutex_init(&ld->mu, NULL);
  pthread_cond_init(&ld->cv, NULL);
  bool ok = (ld->slots = calloc((size_t)depth, sizeof *ld->slots)) &&
            (ld->base_lanes = calloc(ld->n_rec, sizeof(uint64_t))) &&
            (ld->base_docs = calloc(ld->n_docs + 1, sizeof(uint64_t)));
  for (int i = 0; ok && i < depth; i++) {
    slot *sl = &ld->slots[i];
    ok = (sl->win = wf_mem_alloc((size_t)n_lanes * (T + 1) * sizeof(int))) &&
         (sl->starts = wf_mem_alloc((size_t)n_lanes * T * sizeof(int))) &&
         (sl->lanes = calloc(ld->n_rec, sizeof(uint64_t))) &&
         (sl->docs = calloc(ld->n_docs + 1, sizeof(uint64_t)));
  }
  if (!ok) {
    wf__loader_destroy(ld);
    return WF_ENOMEM;
  }
  *out = ld;
  return WF_OK;
}

void wf__loader_destroy(wf__loader *ld)
{
  if (!ld)
    return;
  pthread_mutex_lock(&ld->mu);
  ld->quit = true;
  pthread_cond_broadcast(&ld->cv);
  pthread_mutex_unlock(&ld->mu);
  if (ld->started)
    pthread_join(ld->thread, NULL);
  for (int i = 0; ld->slots && i < ld->depth; i++) {
    wf_mem_free(ld->slots[i].win);
    wf_mem_free(ld->slots[i].starts);
    free(ld->slots[i].lanes);
    free(ld->slots[i].docs);
  }
  free(ld->slots);
  free(ld->base_lanes);
  free(ld->base_docs);
  free(ld->saved_lanes);
  free(ld->saved_docs);
  pthread_cond_destroy(&ld->cv);
  pthread_mutex_destroy(&ld->mu);
  free(ld);
}

/* The first index, and the state before it: the stream's own (fresh), or the saved one
 * a restore will put it at. */
static void set_base(wf__loader *ld, int64_t index)
{
  ld->base = index, ld->held = index - 1, ld->produced = index, ld->based = true;
  if (ld->saved_lanes) {
    size_t R = wf__stream_lane_rec(ld->s);
    memcpy(ld->base_lanes, ld->saved_lanes + (size_t)wf__stream_lane0(ld->s) * R,
           ld->n_rec * sizeof(uint64_t));
    memcpy(ld->base_docs, ld->saved_docs, ld->n_docs * sizeof(uint64_t));
  } else {
    wf__stream_lanes_get(ld->s, ld->base_lanes);
    wf__stream_docs_get(ld->s, ld->base_docs);
  }
}

/* The restore is done when the stream is first read: a rank that never reads data (a
 * middle pipeline stage) never reads its files up to the position. */
wf_status wf__loader_restore(wf__loader *ld, int64_t index, const uint64_t *lanes,
                             const uint64_t *docs, char *err, size_t err_len)
{
  size_t nl = (size_t)wf__stream_lanes(ld->s) * wf__stream_lane_rec(ld->s);
  if (ld->started || ld->based)
    return wf__io_failf(err, err_len, WF_EINVAL,
                        "the data stream is already in use; restore it "
                        "before the first batch");
  if (!(ld->saved_lanes = malloc(nl * sizeof *lanes)) ||
      !(ld->saved_docs = malloc((ld->n_docs + 1) * sizeof *docs)))
    return WF_ENOMEM;
  memcpy(ld->saved_lanes, lanes, nl * sizeof *lanes);
  memcpy(ld->saved_docs, docs, ld->n_docs * sizeof *docs);
  set_base(ld, index);
  return WF_OK;
}

static wf_status start(wf__loader *ld, int64_t index, char *err, size_t err_len)
{
  if (!ld->based)
    set_base(ld, index);
  if (ld->saved_lanes) {
    wf_status st = wf__stream_restore(ld->s, ld->saved_lanes, ld->saved_docs, err, err_len);
    if (st != WF_OK)
      return st;
  }
  if (pthread_create(&ld->thread, NULL, produce, ld) != 0)
    return wf__io_failf(err, err_len, WF_EIO, "cannot start the data loader's thread");
  ld->started = true;
  return WF_OK;
}

static wf_status out_of_order(const wf__loader *ld, int64_t index, char *err, size_t err_len)
{
  return wf__io_failf(err, err_len, WF_EINVAL,
                      "a data.source stream gives steps in order: step %lld was asked for after "
                      "step %lld",
                      (long long)index + 1, (long long)ld->held + 1);
}

wf_status wf__loader_get(wf__loader *ld, int64_t index, const int **win, const int **starts,
                         char *err, size_t err_len)
{
  wf_status st = WF_OK;
  pthread_mutex_lock(&ld->mu);
  if (!ld->started && ld->fail) { /* the restore failed before: say so again */
    st = ld->fail;
    wf_strlcpy(err, ld->err, err_len);
  } else if (!ld->started && (st = start(ld, index, err, err_len)) != WF_OK) {
    ld->fail = st, ld->fail_at = index;
    wf_strlcpy(ld->err, err, sizeof ld->err);
  }
  if (st == WF_OK && index == ld->held + 1) {
    ld->held = index; /* the previous slot goes back to the thread */
    pthread_cond_broadcast(&ld->cv);
  } else if (st == WF_OK && index != ld->held) {
    st = out_of_order(ld, index, err, err_len);
  }
  while (st == WF_OK && ld->produced <= index && !(ld->fail && ld->fail_at <= index))
    pthread_cond_wait(&ld->cv, &ld->mu);
  if (st == WF_OK && ld->produced <= index) {
    st = ld->fail;
    wf_strlcpy(err, ld->err, err_len);
  }
  if (st == WF_OK)
    *win = slot_of(ld, index)->win, *starts = slot_of(ld, index)->starts;
  pthread_mutex_unlock(&ld->mu);
  return st;
}

wf_status wf__loader_state(wf__loader *ld, int64_t index, uint64_t *lanes, uint64_t *docs,
                           char *err, size_t err_len)
{
  wf_status st = WF_OK;
  pthread_mutex_lock(&ld->mu);
  if (!ld->based) /* nothing read yet: the state is the stream's, as it stands */
    set_base(ld, index);
  const uint64_t *l = NULL, *d = NULL;
  if (index == ld->base && ld->held < ld->base)
    l = ld->base_lanes, d = ld->base_docs;
  else if (index == ld->held + 1)
    l = slot_of(ld, ld->held)->lanes, d = slot_of(ld, ld->held)->docs;
  else
    st = wf__io_failf(err, err_len, WF_EINVAL,
                      "the data stream's position before step %lld is gone (it holds step %lld)",
                      (long long)index + 1, (long long)ld->held + 1);
  if (st == WF_OK) {
    memcpy(lanes, l, ld->n_rec * sizeof *lanes);
    memcpy(docs, d, ld->n_docs * sizeof *docs);
  }
  pthread_mutex_unlock(&ld->mu);
  return st;
}
