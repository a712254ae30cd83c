/*
 * trace.c - the per-communicator flight recorder.
 *
 * Always on, so it must cost next to nothing: a store of the sequence number, a
 * seqlock write of one slot and two reads of the coarse monotonic clock per
 * operation (about 0.05 us in all; see wf__coll_rec_now).
 * Readers (the watchdog or console thread, while the driving thread may be stuck in
 * MPI) never block the writer: they copy a slot and retry if its version moved.
 * See comm_int.h for the layout.
 */
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "comm_int.h"

#define RLX memory_order_relaxed

/* CLOCK_MONOTONIC_COARSE is the same clock as wf_now_ns (CLOCK_MONOTONIC) read at the
 * last scheduler tick: a few ns instead of ~70 ns in a VM, at a resolution of a few
 * milliseconds, which is what a hang diagnosis needs. WEFT_COMM_TRACE_CLOCK=precise
 * buys full resolution back for those who time single operations with it. */
uint64_t wf__coll_rec_now(const wf_comm *c)
{
  if (c->precise_clock)
    return wf_now_ns();
  struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
  clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static wf__trace_slot *slot_of(wf_comm *c, uint64_t seq)
{
  return &c->ring[seq % WF_COMM_TRACE_LEN];
}

/* Seqlock write side: version odd while writing. Only the driving thread writes. */
static uint64_t write_open(wf__trace_slot *s)
{
  uint64_t v = atomic_load_explicit(&s->version, RLX);
  atomic_store_explicit(&s->version, v + 1, RLX);
  atomic_thread_fence(memory_order_release);
  return v + 2;
}

static void write_close(wf__trace_slot *s, uint64_t v)
{
  atomic_store_explicit(&s->version, v, memory_order_release);
}

uint64_t wf__coll_rec_begin(wf_comm *c, wf_comm_op op, size_t count, wf_comm_dtype dt, size_t bytes,
                            int peer, bool device, wf_comm_state state)
{
  /* Only the driving thread writes next_seq, so a plain load and store suffice (no
   * locked read-modify-write); release publishes it to readers. */
  uint64_t seq = atomic_load_explicit(&c->next_seq, RLX);
  atomic_store_explicit(&c->next_seq, seq + 1, memory_order_release);
  wf__trace_slot *s = slot_of(c, seq);
  uint64_t v = write_open(s);
  atomic_store_explicit(&s->seq, seq, RLX);
  atomic_store_explicit(&s->count, count, RLX);
  atomic_store_explicit(&s->bytes, bytes, RLX);
  /* A queued operation starts when its group is posted; no clock read until then. */
  atomic_store_explicit(&s->start_ns, state == WF_STATE_QUEUED ? 0 : wf__coll_rec_now(c), RLX);
  atomic_store_explicit(&s->end_ns, 0, RLX);
  atomic_store_explicit(&s->op, (unsigned char)op, RLX);
  atomic_store_explicit(&s->state, (unsigned char)state, RLX);
  atomic_store_explicit(&s->dtype, (unsigned char)dt, RLX);
  atomic_store_explicit(&s->peer, peer, RLX);
  atomic_store_explicit(&s->device, device, RLX);
  write_close(s, v);
  return seq;
}

/* The slot may have been reused by a later operation (more than a ring's worth in
 * flight); then there is nothing left to update. */
void wf__coll_rec_set_state(wf_comm *c, uint64_t seq, wf_comm_state state, uint64_t now)
{
  wf__trace_slot *s = slot_of(c, seq);
  if (atomic_load_explicit(&s->seq, RLX) != seq)
    return;
  uint64_t v = write_open(s);
  atomic_store_explicit(&s->state, (unsigned char)state, RLX);
  if (state == WF_STATE_RUNNING)
    atomic_store_explicit(&s->start_ns, now, RLX);
  if (state == WF_STATE_DONE || state == WF_STATE_FAILED)
    atomic_store_explicit(&s->end_ns, now, RLX);
  write_close(s, v);
}

void wf__coll_rec_end(wf_comm *c, uint64_t seq, wf_status st)
{
  wf__coll_rec_set_state(c, seq, st == WF_OK ? WF_STATE_DONE : WF_STATE_FAILED,
                         wf__coll_rec_now(c));
}

/* Seqlock read side: a consistent copy of a slot, or false if it keeps moving. */
static bool read_slot(const wf__trace_slot *s, wf_trace_entry *e)
{
  wf__trace_slot *m = (wf__trace_slot *)s; /* atomics loads need non-const in C11 */
  for (int tries = 0; tries < 1000; tries++) {
    uint64_t v1 = atomic_load_explicit(&m->version, memory_order_acquire);
    if (v1 & 1)
      continue;
    e->seq = atomic_load_explicit(&m->seq, RLX);
    e->count = atomic_load_explicit(&m->count, RLX);
    e->bytes = atomic_load_explicit(&m->bytes, RLX);
    e->start_ns = atomic_load_explicit(&m->start_ns, RLX);
    e->end_ns = atomic_load_explicit(&m->end_ns, RLX);
    e->op = (wf_comm_op)atomic_load_explicit(&m->op, RLX);
    e->state = (wf_comm_state)atomic_load_explicit(&m->state, RLX);
    e->dtype = (wf_comm_dtype)atomic_load_explicit(&m->dtype, RLX);
    e->peer = atomic_load_explicit(&m->peer, RLX);
    e->device = atomic_load_explicit(&m->device, RLX) != 0;
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&m->version, RLX) == v1)
      return true;
  }
  return false;
}

uint64_t wf_comm_next_seq(const wf_comm *c)
{
  return c ? atomic_load_explicit(&((wf_comm *)c)->next_seq, memory_order_acquire) : 0;
}

/* Slots of seq values below next - WF_COMM_TRACE_LEN were overwritten; a slot whose
 * seq is not the one expected is being rewritten right now and is skipped. */
int wf_comm_trace_snapshot(const wf_comm *c, wf_trace_entry *out, int max)
{
  if (!c || !out || max <= 0)
    return 0;
  uint64_t next = wf_comm_next_seq(c);
  uint64_t n = WF_MIN(next, (uint64_t)WF_MIN(max, WF_COMM_TRACE_LEN));
  int got = 0;
  for (uint64_t seq = next - n; seq < next; seq++) {
    const wf__trace_slot *s = &c->ring[seq % WF_COMM_TRACE_LEN];
    if (read_slot(s, &out[got]) && out[got].seq == seq)
      got++;
  }
  return got;
}

bool wf_comm_last_op(const wf_comm *c, wf_trace_entry *out)
{
  if (!c || !out)
    return false;
  for (int tries = 0; tries < 100; tries++) {
    uint64_t next = wf_comm_next_seq(c);
    if (next == 0)
      return false;
    if (read_slot(&c->ring[(next - 1) % WF_COMM_TRACE_LEN], out) && out->seq == next - 1)
      return true;
  }
  return false;
}

const char *wf_comm_op_name(wf_comm_op op)
{
  static const char *names[WF_OP_COUNT_] = {
      "allreduce", "reduce_scatter", "allgather", "bcast", "send", "recv", "barrier", "alltoall",
  };
  return (unsigned)op < WF_OP_COUNT_ ? names[op] : "unknown";
}

const char *wf_comm_state_name(wf_comm_state st)
{
  switch (st) {
  case WF_STATE_QUEUED: return "queued";
  case WF_STATE_RUNNING: return "running";
  case WF_STATE_DONE: return "done";
  case WF_STATE_FAILED: return "failed";
  }
  return "unknown";
}

char *wf_comm_trace_format(const wf_comm *c, const wf_trace_entry *e, char *buf, size_t len)
{
  if (!buf || !len)
    return buf;
  uint64_t end = e->end_ns ? e->end_ns : wf_now_ns();
  double ms = end > e->start_ns ? (double)(end - e->start_ns) * 1e-6 : 0.0;
  char peer[32] = "";
  if (e->peer >= 0)
    snprintf(peer, sizeof peer, " %s %d",
             e->op == WF_OP_BCAST  ? "root"
             : e->op == WF_OP_SEND ? "to"
                                   : "from",
             e->peer);
  snprintf(buf, len, "%s#%" PRIu64 " %s %" PRIu64 " x %s (%" PRIu64 " B)%s%s %s %s %.3f ms",
           c ? wf_comm_name(c) : "?", e->seq, wf_comm_op_name(e->op), e->count,
           wf_comm_dtype_name(e->dtype), e->bytes, peer, e->device ? " nccl" : "",
           wf_comm_state_name(e->state), e->end_ns ? "in" : "for", ms);
  return buf;
}
