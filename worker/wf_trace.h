/*
 * wf_trace.h - a per-rank span recorder that writes one Chrome/Perfetto trace for the job.
 *
 * Each rank records complete spans (name, category, start, end, step, micro-batch) into a
 * buffer sized once at creation; wf_trace_write gathers every rank's spans on rank 0, which
 * writes a single Trace Event Format file with one track (tid) per world rank. Open it in
 * https://ui.perfetto.dev or chrome://tracing.
 *
 * Invariants:
 *  - Recording never allocates: spans past max_spans are dropped and counted, so tracing
 *    cannot change the memory or timing profile of the step it observes beyond a store.
 *  - Spans are recorded by one thread per rank (the trainer's); the recorder has no locks.
 *  - Spans keep the order they were recorded in, on their rank's track in the file.
 *  - Times are wf_now() seconds on the recording rank; the file puts every rank on rank 0's
 *    clock (offset estimated by MPI ping-pong) in microseconds from the earliest span.
 *  - wf_trace_write is collective over the whole job and returns the same status on every
 *    rank, so one rank's error never leaves another waiting.
 */
#ifndef WF_TRACE_H
#define WF_TRACE_H

#include <stdbool.h>
#include <stddef.h>

#include "wf_runtime.h"

typedef struct wf_trace wf_trace;

/* Longest span name and category kept; longer ones are truncated. */
#define WF_TRACE_NAME_MAX 31
#define WF_TRACE_CAT_MAX  15

/* Recorder for this rank; `label` names its track, e.g. "rank 3 (pp 1, dp 0, tp 1)". Spans
 * beyond max_spans (>= 1) are dropped and counted. The recorder starts off. */
wf_status wf_trace_create(wf_trace **out, const char *label, size_t max_spans);
void wf_trace_destroy(wf_trace *t); /* NULL ok */

/* Record only while on (the trainer turns it on for train.trace_steps). NULL: no-op/false,
 * so call sites need no check when tracing is disabled. */
void wf_trace_set_on(wf_trace *t, bool on);
bool wf_trace_on(const wf_trace *t);

/* One complete span while on: t0 <= t1 from wf_now() (t1 < t0 is clamped to t0); name e.g.
 * "F3"; cat "compute" | "comm" | "optim" | "wait"; step and micro-batch go to the event's
 * args (left out when -1). Both strings are copied. */
void wf_trace_span(wf_trace *t, const char *name, const char *cat, double t0, double t1, int step,
                   int mb);

/* Spans kept, and spans dropped because the buffer was full. */
size_t wf_trace_count(const wf_trace *t);
size_t wf_trace_dropped(const wf_trace *t);

/* Collective over MPI_COMM_WORLD (every rank calls it; `t` may be NULL on a rank with nothing
 * to record and `path` is read on rank 0 only). Rank 0 writes the trace to `path` atomically
 * (a temporary file renamed into place). Returns the same status on every rank: WF_EIO when
 * the file cannot be written (logged on rank 0 with the path and the reason). */
wf_status wf_trace_write(wf_trace *t, const char *path);

/* Seconds inside [t0, t1] covered by at least one span of category `cat` (NULL: any), on
 * this rank's clock; overlapping spans count once. For the measured pipeline bubble. */
double wf_trace_busy(const wf_trace *t, const char *cat, double t0, double t1);

#endif /* WF_TRACE_H */
