/*
 * wf_trace.h - trace events: a per-rank recorder of complete spans (name, category,
 * start, end, step, micro-batch), which any module records into and worker/io writes
 * out as the job's Chrome/Perfetto trace (wf_trace_write, collective).
 *
 * Invariants:
 *  - Recording never allocates: spans past max_spans are dropped and counted, so tracing
 *    cannot change the memory or timing profile of the step it observes beyond a store.
 *  - Spans are recorded by one thread per rank (the trainer's); the recorder has no locks.
 *  - Spans keep the order they were recorded in.
 *  - Times are wf_now() seconds on the recording rank.
 */
#ifndef WF_TRACE_H
#define WF_TRACE_H

#include <stdbool.h>
#include <stddef.h>

#include "wf_runtime.h"

typedef struct wf_trace wf_trace;

/* Longest span name and category kept; longer ones are truncated. The names the worker
 * records are at most 33 characters ("step end (reduction, norm, AdamW)"). */
#define WF_TRACE_NAME_MAX  63
#define WF_TRACE_CAT_MAX   15
#define WF_TRACE_LABEL_MAX 128

/* One recorded span. The writer ships them between ranks as raw bytes (one build of the
 * worker runs on every host, so the layout is the same). */
typedef struct wf_trace_rec {
  double t0, t1; /* wf_now() seconds on the recording rank */
  int step, mb;  /* -1 when none */
  char name[WF_TRACE_NAME_MAX + 1];
  char cat[WF_TRACE_CAT_MAX + 1];
} wf_trace_rec;

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

/* The spans kept (n of them) and the label, for the writer; t NULL: none, "". */
const wf_trace_rec *wf_trace_records(const wf_trace *t, size_t *n);
const char *wf_trace_label(const wf_trace *t);

/* Seconds inside [t0, t1] covered by at least one span of category `cat` (NULL: any), on
 * this rank's clock; overlapping spans count once. For the measured pipeline bubble. */
double wf_trace_busy(const wf_trace *t, const char *cat, double t0, double t1);

#endif /* WF_TRACE_H */
