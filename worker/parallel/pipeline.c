/*
 * pipeline.c - the pipeline engine and the stage partition (see wf_parallel.h).
 *
 * Buffers. An activation is received in place: into one of the model's spare stage
 * inputs (wf_model_stage_inbox), which its forward then keeps as the slot's input, and
 * the slot's old input becomes the spare. Gradients are received into a pool of their
 * own and sent from another. Each pool holds what the rank's list needs at its peak
 * (wf_schedule_buffers: a receive holds its buffer from its post to its consumer), a
 * number that does not grow with the pipeline depth or the micro-batches for GPipe and
 * 1F1B: a stage's communication memory is a constant number of messages. A free buffer
 * is taken per work item, and the engine refuses (rather than corrupts) a list that
 * would need more. Requests are per work item. The pools are device memory (the
 * model's device); the token batch is host memory, which the model moves in itself.
 *
 * Messages are activations and their gradients in the model's storage format (16 bits
 * under mixed precision: WF_COMM_BF16 or WF_COMM_F16, which NCCL sends as its 16-bit
 * types and MPI as 2-byte words), io bytes each: the model stores a stage's output and
 * the gradient of its input in that format and widens what it receives.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel_int.h"

/* A pool of n message buffers; `at` maps a work item to the buffer it holds. */
typedef struct pool {
  void *mem;
  int n;
  int *owner; /* the work item using buffer i, -1 when free */
  int *at;    /* per work item: its buffer, -1 = none */
} pool;

/* A forward or backward, timed by device events (see spans_close). */
typedef struct timed {
  wf_event *a, *b; /* recorded before and after its launches */
  char name[16];
  int mb;
} timed;

struct wf_pipe {
  wf_comm *pp;
  wf_model *model;
  wf_dev *dev;
  wf_schedule sched;
  wf_trace *trace;
  int p, rank, m, v, B, T; /* work items are (mb, chunk): key = mb * v + chunk */
  size_t io;               /* elements of one stage input/output message */
  size_t io_bytes;         /* ... in the model's format */
  wf_comm_dtype dt;        /* that format's element type */
  pool rf;                 /* activations: indices of the model's spare stage inputs (mem NULL) */
  pool rb, sb;             /* receive gradients, send gradients */
  int sb_next;             /* the send buffer the next gradient takes (round robin) */
  wf_req **req_rf, **req_rb, **req_sf, **req_sb; /* per key */
  int *slot_of;                                  /* per key; -1 = none */
  bool *slot_busy;
  int n_slots;
  int *inputs, *targets, *starts;
  bool docs; /* every stage reads the batch's document starts */
  int step;
  wf_pipe_stats st;
  timed *timed; /* this step's compute spans, at most one per action */
  int n_timed;
  wf_event *end; /* recorded after the step's last action */
};

int wf_pipe_slots(wf_schedule_kind kind, int pp, int rank, int microbatches, int v)
{
  if (pp <= 1)
    return 1;
  if (kind != WF_SCHED_INTERLEAVED)
    return kind == WF_SCHED_GPIPE ? microbatches : WF_MIN(pp - rank, microbatches);
  /* interleaved: what the generated list holds at its peak */
  wf_schedule s = {0};
  wf_sched_params prm = {kind, pp, microbatches, v};
  char err[256];
  int n = wf_schedule_init(&s, &prm, rank, err, sizeof err) == WF_OK ? wf_schedule_peak_inflight(&s)
                                                                     : microbatches * v;
  wf_schedule_fini(&s);
  return n;
}

wf_sched_bufs wf_pipe_buffers(wf_schedule_kind kind, int pp, int rank, int microbatches, int v)
{
  wf_sched_bufs b = {0};
  if (pp <= 1)
    return b; /* one stage: no messages */
  wf_schedule s = {0};
  wf_sched_params prm = {kind, pp, microbatches, kind == WF_SCHED_INTERLEAVED ? v : 1};
  char err[256];
  if (wf_schedule_init(&s, &prm, rank, err, sizeof err) == WF_OK)
    b = wf_schedule_buffers(&s);
  wf_schedule_fini(&s);
  return b;
}

/* Bytes of one gradient buffer: a message and 64 bytes. */
static size_t buf_bytes(size_t io_bytes) { return io_bytes + 64; }

size_t wf_pipe_mem_plan(wf_schedule_kind kind, int pp, int rank, int m, int v, size_t io, int B,
                        int T)
{
  wf_sched_bufs b = wf_pipe_buffers(kind, pp, rank, m, v);
  size_t pools = (size_t)(b.recv_b + b.send_b) * buf_bytes(io);
  return pools + 3 * (size_t)B * (size_t)T * sizeof(int); /* + the token batch */
}

/* n buffers of io_bytes (none when io_bytes is 0: indices only) for m work items. */
static wf_status pool_alloc(wf_dev *dev, pool *r, int n, size_t io_bytes, size_t m)
{
  wf_status st = WF_OK;
  r->n = n;
  if (io_bytes && n)
    WF_TRY(wf_dev_alloc(dev, &r->mem, (size_t)n * buf_bytes(io_bytes)));
  WF_CHECK_ALLOC(r->owner = malloc(((size_t)n + 1) * sizeof *r->owner));
  WF_CHECK_ALLOC(r->at = malloc(m * sizeof *r->at));
  for (int i = 0; i < n; i++)
    r->owner[i] = -1;
  for (size_t k = 0; k < m; k++)
    r->at[k] = -1;
fail:
  return st;
}

static void pool_free(wf_dev *dev, pool *r)
{
  wf_dev_free(dev, r->mem);
  free(r->owner);
  free(r->at);
}

wf_status wf_pipe_create(wf_pipe **out, const wf_pipe_opts *o)
{
  wf_status st = WF_OK;
  char err[512] = "";
  wf_pipe *p = calloc(1, sizeof *p);
  *out = NULL;
  WF_CHECK_ALLOC(p);
  p->pp = o->pp;
  p->model = o->model;
  p->dev = wf_model_dev(o->model);
  p->trace = o->trace;
  p->p = o->pp ? wf_comm_size(o->pp) : 1;
  p->rank = o->pp ? wf_comm_rank(o->pp) : 0;
  p->m = o->microbatches, p->B = o->B, p->T = o->T;
  p->v = o->kind == WF_SCHED_INTERLEAVED && p->p > 1 ? o->virtual_stages : 1;
  wf_sched_params prm = {p->p > 1 ? o->kind : WF_SCHED_1F1B, p->p, p->m, p->v};
  st = wf_schedule_init(&p->sched, &prm, p->rank, err, sizeof err);
  WF_REFUSE(st == WF_OK, st, "%s", err); /* the same parameters on every rank */
  p->io_bytes = wf_model_stage_io_bytes(o->model, o->B, o->T);
  p->dt = wf__comm_dtype_of(wf_model_precision(o->model));
  p->io = p->io_bytes / wf_comm_dtype_size(p->dt); /* a family's side band included */
  p->n_slots = wf_pipe_slots(prm.kind, p->p, p->rank, p->m, p->v);
  wf_sched_bufs b = wf_schedule_buffers(&p->sched);
  WF_REFUSE(b.recv_f <= wf_model_stage_inboxes(o->model), WF_EINVAL,
            "pipeline: the schedule receives %d activations ahead, the model has %d spare "
            "stage inputs (wf_pipe_buffers sizes them)",
            b.recv_f, wf_model_stage_inboxes(o->model));
  size_t m = (size_t)p->m * (size_t)p->v;
  WF_TRY(pool_alloc(p->dev, &p->rf, b.recv_f, 0, m));
  WF_TRY(pool_alloc(p->dev, &p->rb, b.recv_b, p->io_bytes, m));
  WF_TRY(pool_alloc(p->dev, &p->sb, b.send_b, p->io_bytes, m));
  WF_CHECK_ALLOC(p->req_rf = calloc(m, sizeof(wf_req *)));
  WF_CHECK_ALLOC(p->req_rb = calloc(m, sizeof(wf_req *)));
  WF_CHECK_ALLOC(p->req_sf = calloc(m, sizeof(wf_req *)));
  WF_CHECK_ALLOC(p->req_sb = calloc(m, sizeof(wf_req *)));
  WF_CHECK_ALLOC(p->slot_of = malloc(m * sizeof(int)));
  WF_CHECK_ALLOC(p->slot_busy = calloc((size_t)p->n_slots, sizeof(bool)));
  WF_CHECK_ALLOC(p->inputs = wf_mem_alloc((size_t)o->B * o->T * sizeof(int)));
  WF_CHECK_ALLOC(p->targets = wf_mem_alloc((size_t)o->B * o->T * sizeof(int)));
  WF_CHECK_ALLOC(p->starts = wf_mem_alloc((size_t)o->B * o->T * sizeof(int)));
  p->docs = o->docs;
  WF_CHECK_ALLOC(p->timed = calloc((size_t)p->sched.n, sizeof(timed)));
  for (int i = 0; i < p->sched.n; i++) {
    WF_TRY(wf_dev_event_create(p->dev, &p->timed[i].a));
    WF_TRY(wf_dev_event_create(p->dev, &p->timed[i].b));
  }
  WF_TRY(wf_dev_event_create(p->dev, &p->end));
  *out = p;
  return WF_OK;
fail:
  wf_pipe_destroy(p);
  return st;
}

void wf_pipe_destroy(wf_pipe *p)
{
  if (!p)
    return;
  for (int i = 0; p->req_rf && i < p->m * p->v; i++) {
    wf_req_wait(&p->req_rf[i]);
    wf_req_wait(&p->req_rb[i]);
    wf_req_wait(&p->req_sf[i]);
    wf_req_wait(&p->req_sb[i]);
  }
  pool_free(p->dev, &p->rf);
  pool_free(p->dev, &p->rb);
  pool_free(p->dev, &p->sb);
  free(p->req_rf);
  free(p->req_rb);
  free(p->req_sf);
  free(p->req_sb);
  free(p->slot_of);
  free(p->slot_busy);
  wf_mem_free(p->inputs);
  wf_mem_free(p->targets);
  wf_mem_free(p->starts);
  for (int i = 0; p->timed && i < p->sched.n; i++) {
    wf_dev_event_destroy(p->dev, p->timed[i].a);
    wf_dev_event_destroy(p->dev, p->timed[i].b);
  }
  free(p->timed);
  wf_dev_event_destroy(p->dev, p->end);
  wf_schedule_fini(&p->sched);
  free(p);
}

/* ---- buffers and waits ------------------------------------------------------------ */

/* A free buffer of pool r for work item k: its index, or -1 (logged) when all are
 * held, which a list sized by wf_schedule_buffers never meets. */
static int pool_take(pool *r, int k, const char *what)
{
  for (int i = 0; i < r->n; i++)
    if (r->owner[i] < 0) {
      r->owner[i] = k;
      r->at[k] = i;
      return i;
    }
  WF_ERROR("pipeline: no free %s buffer for work item %d (%d buffers): the schedule posts "
           "further ahead than it was sized for",
           what, k, r->n);
  return -1;
}

static void *pool_buf(const wf_pipe *p, const pool *r, int i)
{
  return (char *)r->mem + (size_t)i * buf_bytes(p->io_bytes);
}

static void pool_give(pool *r, int k)
{
  if (r->at[k] >= 0)
    r->owner[r->at[k]] = -1;
  r->at[k] = -1;
}

static wf_status wait(wf_pipe *p, wf_req **req, const char *what, int mb)
{
  if (!*req)
    return WF_OK;
  double t0 = wf_now();
  wf_status st = wf_req_wait(req);
  double t1 = wf_now();
  p->st.wait_s += t1 - t0;
  if (p->trace && t1 - t0 > 1e-5)
    wf_trace_span(p->trace, what, "comm", t0, t1, p->step, mb);
  if (st != WF_OK)
    WF_ERROR("pipeline: %s of micro-batch %d failed (%s)", what, mb, wf_status_str(st));
  return st;
}

static int take_slot(wf_pipe *p, int mb)
{
  for (int s = 0; s < p->n_slots; s++)
    if (!p->slot_busy[s]) {
      p->slot_busy[s] = true;
      p->slot_of[mb] = s;
      return s;
    }
  WF_ERROR("pipeline: no free activation slot for micro-batch %d (%d slots)", mb, p->n_slots);
  return -1;
}

/* ---- actions ------------------------------------------------------------------------ */

/* Compute is timed with device events, not the host clock: on a GPU the host returns
 * from a chunk's launches long before the chunk has run. span_begin and span_end record
 * an event on each side of a forward or backward; spans_close, once the step's work is
 * done, turns them into wall-clock times by their distance to one last event, whose
 * time is the host clock's when the host has waited for it. On the CPU an event is the
 * host clock itself, so the figures are what they were. */
static wf_status span_begin(wf_pipe *p)
{
  return wf_dev_event_record(p->dev, p->timed[p->n_timed].a, NULL);
}

static wf_status span_end(wf_pipe *p, char op, int mb, int chunk)
{
  timed *t = &p->timed[p->n_timed++];
  if (p->v > 1)
    snprintf(t->name, sizeof t->name, "%c%d%c", op, mb, 'a' + chunk % 26);
  else
    snprintf(t->name, sizeof t->name, "%c%d", op, mb);
  t->mb = mb;
  return wf_dev_event_record(p->dev, t->b, NULL);
}

/* The step's compute seconds (busy_s) and its trace spans, once the host has waited
 * for the end event (recorded before the loss was read, which waited for it: the step
 * waits for the device there once, not twice). */
static wf_status spans_close(wf_pipe *p)
{
  wf_status st = WF_OK;
  double t_end = wf_now();
  for (int i = 0; i < p->n_timed; i++) {
    double da = 0, db = 0;
    WF_TRY(wf_dev_event_elapsed(p->dev, p->timed[i].a, p->end, &da));
    WF_TRY(wf_dev_event_elapsed(p->dev, p->timed[i].b, p->end, &db));
    p->st.busy_s += da - db;
    if (p->trace)
      wf_trace_span(p->trace, p->timed[i].name, "compute", t_end - da, t_end - db, p->step,
                    p->timed[i].mb);
  }
fail:
  return st;
}

/* Whether this rank's chunk holds the embeddings (first) or the loss (last). */
static bool is_first(const wf_pipe *p, int chunk)
{
  return wf_model_get_shard(p->model)->first && chunk == 0;
}

static bool is_last(const wf_pipe *p, int chunk)
{
  return wf_model_get_shard(p->model)->last && chunk == p->v - 1;
}

static int key(const wf_pipe *p, int mb, int chunk) { return mb * p->v + chunk; }

static wf_status do_forward(wf_pipe *p, int mb, int chunk, wf_pipe_batch_fn batch, void *user)
{
  wf_status st = WF_OK;
  bool first = is_first(p, chunk), last = is_last(p, chunk);
  int k = key(p, mb, chunk);
  const void *x = NULL;
  if (!first) {
    WF_TRY(wait(p, &p->req_rf[k], "recv activation", mb));
    /* spare input rf.at[k] is the buffer received into: only this forward trades it */
    x = wf_model_stage_inbox(p->model, p->rf.at[k]);
    WF_CHECK(x, WF_EINVAL, "pipeline: forward of work item %d before its receive", k);
  }
  if (first || last || p->docs)
    WF_TRY(batch(user, mb, p->inputs, p->targets, p->docs ? p->starts : NULL));
  int slot = take_slot(p, k);
  WF_CHECK(slot >= 0, WF_EINVAL, "pipeline: no activation slot for micro-batch %d", mb);
  WF_TRY(span_begin(p));
  wf_status ran =
      wf_model_chunk_forward(p->model, slot, chunk, first ? p->inputs : NULL, x,
                             last ? p->targets : NULL, p->docs ? p->starts : NULL, p->B, p->T);
  WF_TRY(span_end(p, 'F', mb, chunk));
  st = ran;
  if (!first) /* the forward kept x as the slot's input; the spare is the slot's old one */
    pool_give(&p->rf, k);
fail:
  return st;
}

static wf_status do_backward(wf_pipe *p, int mb, int chunk)
{
  wf_status st = WF_OK;
  int k = key(p, mb, chunk);
  const void *dy = NULL;
  if (!is_last(p, chunk)) {
    WF_TRY(wait(p, &p->req_rb[k], "recv gradient", mb));
    WF_CHECK(p->rb.at[k] >= 0, WF_EINVAL, "pipeline: backward of work item %d before its receive",
             k);
    dy = pool_buf(p, &p->rb, p->rb.at[k]);
    /* the slot's output must not be in flight when its activations are released */
    WF_TRY(wait(p, &p->req_sf[k], "send activation", mb));
  }
  WF_TRY(span_begin(p));
  wf_status ran = wf_model_stage_backward(p->model, p->slot_of[k], dy, 1.0f / (float)p->m);
  WF_TRY(span_end(p, 'B', mb, chunk));
  st = ran;
  p->slot_busy[p->slot_of[k]] = false;
  p->slot_of[k] = -1;
  if (!is_last(p, chunk))
    pool_give(&p->rb, k);
fail:
  return st;
}

static wf_status do_send_b(wf_pipe *p, int k, int peer)
{
  wf_status st = WF_OK;
  /* Round robin: the next buffer may still be sending an older work item. Waiting for
   * it is safe: the lists run even with blocking sends (schedule.c). */
  int i = p->sb_next++ % p->sb.n, old = p->sb.owner[i];
  if (old >= 0)
    WF_TRY(wait(p, &p->req_sb[old], "send gradient", old / p->v));
  p->sb.owner[i] = k; /* its index is i: the send pool keeps no `at` */
  void *buf = pool_buf(p, &p->sb, i);
  WF_TRY(wf_model_stage_dinput(p->model, buf));
  st = wf_comm_isend(p->pp, buf, p->io, p->dt, peer, &p->req_sb[k]);
fail:
  return st;
}

static wf_status do_action(wf_pipe *p, const wf_sched_action *a, wf_pipe_batch_fn batch, void *user)
{
  int k = key(p, a->mb, a->chunk), i;
  switch (a->op) {
  case WF_ACT_FORWARD: return do_forward(p, a->mb, a->chunk, batch, user);
  case WF_ACT_BACKWARD: return do_backward(p, a->mb, a->chunk);
  case WF_ACT_SEND_F:
    return wf_comm_isend(p->pp, wf_model_stage_output(p->model, p->slot_of[k]), p->io, p->dt,
                         a->peer, &p->req_sf[k]);
  case WF_ACT_RECV_F: /* in place: into a spare input, which the forward keeps */
    if ((i = pool_take(&p->rf, k, "activation")) < 0)
      return WF_EINVAL;
    return wf_comm_irecv(p->pp, wf_model_stage_inbox(p->model, i), p->io, p->dt, a->peer,
                         &p->req_rf[k]);
  case WF_ACT_SEND_B: return do_send_b(p, k, a->peer);
  case WF_ACT_RECV_B:
    if ((i = pool_take(&p->rb, k, "gradient")) < 0)
      return WF_EINVAL;
    return wf_comm_irecv(p->pp, pool_buf(p, &p->rb, i), p->io, p->dt, a->peer, &p->req_rb[k]);
  }
  return WF_EINVAL;
}

static int last_backward(const wf_schedule *s)
{
  for (int i = s->n - 1; i >= 0; i--)
    if (s->actions[i].op == WF_ACT_BACKWARD)
      return i;
  return -1;
}

wf_status wf_pipe_step(wf_pipe *p, int step, wf_pipe_batch_fn batch, wf_pipe_arm_fn arm, void *user,
                       double *loss_sum, wf_pipe_stats *stats)
{
  wf_status st = WF_OK;
  memset(&p->st, 0, sizeof p->st);
  p->step = step;
  p->n_timed = 0;
  *loss_sum = 0;
  for (int i = 0; i < p->m * p->v; i++)
    p->slot_of[i] = -1;
  double t0 = wf_now();
  int lb = last_backward(&p->sched);
  for (int i = 0; i < p->sched.n && st == WF_OK; i++) {
    /* With chunks the last micro-batch's backwards interleave with other micro-batches'
     * (a layer's gradients are not final at its chunk's last backward), so the dp
     * reduction waits for the end of the step instead of overlapping. */
    if (i == lb && arm && p->v == 1)
      arm(user);
    st = do_action(p, &p->sched.actions[i], batch, user);
  }
  for (int k = 0; k < p->m * p->v; k++) { /* sends still in flight */
    wf_status w = wait(p, &p->req_sf[k], "send activation", k / p->v);
    wf_status v = wait(p, &p->req_sb[k], "send gradient", k / p->v);
    st = st != WF_OK ? st : w != WF_OK ? w : v;
  }
  for (int i = 0; i < p->sb.n; i++)
    p->sb.owner[i] = -1;
  p->sb_next = 0;
  if (st == WF_OK)
    st = wf_dev_event_record(p->dev, p->end, NULL);
  if (st == WF_OK)
    st = wf_model_take_loss(p->model, loss_sum);
  if (st == WF_OK)
    st = spans_close(p);
  p->st.wall_s = wf_now() - t0;
  p->st.peak_slots = wf_model_peak_slots(p->model);
  p->st.act_bytes = wf_model_act_bytes(p->model, p->st.peak_slots);
  if (stats)
    *stats = p->st;
  return st;
}

/* One micro-batch forward through every chunk of this rank, in stage order: chunk c
 * waits for stage c*p + r - 1 (the previous rank; rank p-1's chunk c-1 for rank 0) and
 * feeds stage c*p + r + 1. Only one message is in flight at a time, so blocking
 * point-to-point cannot deadlock. */
static wf_status forward_chain(wf_pipe *p, int mb, wf_pipe_batch_fn batch, void *user)
{
  wf_status st = WF_OK;
  void *x = NULL;
  int prev = (p->rank + p->p - 1) % p->p, next = (p->rank + 1) % p->p;
  for (int c = 0; c < p->v; c++) {
    bool first = is_first(p, c), last = is_last(p, c);
    if (!first) { /* in place, as in training: spare input 0 */
      WF_CHECK(wf_model_stage_inboxes(p->model) > 0, WF_EINVAL,
               "pipeline: stage %d receives but its model has no spare input", p->rank);
      x = wf_model_stage_inbox(p->model, 0);
      WF_TRY(wf_comm_recv(p->pp, x, p->io, p->dt, prev));
    }
    if (first || last || p->docs)
      WF_TRY(batch(user, mb, p->inputs, p->targets, p->docs ? p->starts : NULL));
    st = wf_model_chunk_forward(p->model, 0, c, first ? p->inputs : NULL, x,
                                last ? p->targets : NULL, p->docs ? p->starts : NULL, p->B, p->T);
    wf_model_stage_release(p->model, 0);
    WF_TRY(st);
    if (!last)
      WF_TRY(wf_comm_send(p->pp, wf_model_stage_output(p->model, 0), p->io, p->dt, next));
  }
fail:
  return st;
}

wf_status wf_pipe_forward(wf_pipe *p, wf_pipe_batch_fn batch, void *user, double *loss_sum)
{
  wf_status st = WF_OK;
  *loss_sum = 0;
  for (int mb = 0; mb < p->m && st == WF_OK; mb++)
    st = forward_chain(p, mb, batch, user);
  if (st == WF_OK)
    st = wf_model_take_loss(p->model, loss_sum);
  wf_model_peak_slots(p->model); /* evaluation does not count towards training's peak */
  return st;
}
