/*
 * trace.c - the span recorder (wf_trace.h): a bounds check and a store into an array
 * allocated at creation. Writing the job's trace file is worker/io's (it gathers every
 * rank's spans over MPI); recording is here so that any module may record.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_trace.h"

struct wf_trace {
  wf_trace_rec *spans; /* (cap) */
  size_t cap, n, dropped;
  bool on;
  char label[WF_TRACE_LABEL_MAX];
};

/* ---- recording -------------------------------------------------------------------------- */

wf_status wf_trace_create(wf_trace **out, const char *label, size_t max_spans)
{
  if (!out || max_spans == 0 || max_spans > SIZE_MAX / sizeof(wf_trace_rec)) {
    WF_ERROR("wf_trace_create: need an output pointer and 1 <= max_spans (got %zu)", max_spans);
    return WF_EINVAL;
  }
  *out = NULL;
  wf_trace *t = calloc(1, sizeof(*t));
  if (!t)
    return WF_ENOMEM;
  /* Through the memory layer: a long trace buffer is a large host allocation. */
  t->spans = wf_mem_alloc(max_spans * sizeof(wf_trace_rec));
  if (!t->spans) {
    WF_ERROR("wf_trace_create: cannot allocate %zu spans", max_spans);
    free(t);
    return WF_ENOMEM;
  }
  t->cap = max_spans;
  snprintf(t->label, sizeof(t->label), "%s", label ? label : "");
  *out = t;
  return WF_OK;
}

void wf_trace_destroy(wf_trace *t)
{
  if (!t)
    return;
  wf_mem_free(t->spans);
  free(t);
}

void wf_trace_set_on(wf_trace *t, bool on)
{
  if (t)
    t->on = on;
}

bool wf_trace_on(const wf_trace *t) { return t && t->on; }
size_t wf_trace_count(const wf_trace *t) { return t ? t->n : 0; }
size_t wf_trace_dropped(const wf_trace *t) { return t ? t->dropped : 0; }

void wf_trace_span(wf_trace *t, const char *name, const char *cat, double t0, double t1, int step,
                   int mb)
{
  if (!t || !t->on)
    return;
  if (t->n == t->cap) {
    t->dropped++;
    return;
  }
  wf_trace_rec *s = &t->spans[t->n++];
  s->t0 = t0;
  s->t1 = t1 < t0 ? t0 : t1;
  s->step = step;
  s->mb = mb;
  snprintf(s->name, sizeof(s->name), "%s", name ? name : "");
  snprintf(s->cat, sizeof(s->cat), "%s", cat ? cat : "");
}

/* ---- busy time -------------------------------------------------------------------------- */

typedef struct ival {
  double a, b;
} ival;

static int ival_cmp(const void *x, const void *y)
{
  const ival *p = x, *q = y;
  return (p->a > q->a) - (p->a < q->a);
}

/* Length of the union of iv[0..n), sorted here by start. */
static double union_length(ival *iv, size_t n)
{
  qsort(iv, n, sizeof(*iv), ival_cmp);
  double total = 0, end = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    double a = iv[i].a > end ? iv[i].a : end; /* skip the part already counted */
    if (iv[i].b > a)
      total += iv[i].b - a;
    if (iv[i].b > end)
      end = iv[i].b;
  }
  return total;
}

double wf_trace_busy(const wf_trace *t, const char *cat, double t0, double t1)
{
  if (!t || t->n == 0 || t1 <= t0)
    return 0;
  /* Spans of one category may overlap (nested or on several streams), so take the union;
   * this runs once per step, not per span, so a temporary array is fine. */
  ival *iv = malloc(t->n * sizeof(*iv));
  if (!iv) {
    WF_WARN("wf_trace_busy: out of memory, reporting 0");
    return 0;
  }
  size_t k = 0;
  for (size_t i = 0; i < t->n; i++) {
    const wf_trace_rec *s = &t->spans[i];
    if (cat && strcmp(s->cat, cat) != 0)
      continue;
    double a = s->t0 > t0 ? s->t0 : t0, b = s->t1 < t1 ? s->t1 : t1;
    if (b > a)
      iv[k++] = (ival){a, b};
  }
  double busy = union_length(iv, k);
  free(iv);
  return busy;
}

const wf_trace_rec *wf_trace_records(const wf_trace *t, size_t *n)
{
  *n = t ? t->n : 0;
  return t ? t->spans : NULL;
}

const char *wf_trace_label(const wf_trace *t) { return t ? t->label : ""; }
