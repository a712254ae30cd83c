/*
 * datastream.c - data.source behind wf_data: the training stream on its loader thread,
 * the validation stream (data.val_path), the rows a batch copies out, and the loader's
 * position as JSON for a checkpoint's manifest.
 *
 * This rank's lanes are the rows its dp rank trains on: [r B/D, (r+1) B/D) of the
 * global batch of B rows (wf_io.h's wf_data slicing). Validation (data.val_path, JSON Lines)
 * is a second stream over the same lanes, read from its start once, synchronously,
 * and kept: evaluation i is always the same rows, so the curve is comparable.
 *
 * The position in a checkpoint is one JSON object (wf_data_state_json): every lane's
 * record, and what each file is (name, size, its documents once counted), so a resume
 * refuses data that changed instead of reading other tokens silently.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "io_int.h"

#define LOADER_DEPTH  4 /* steps made ahead */
#define STATE_VERSION 1

struct wf__dstream {
  int L, l0, l1, T;
  wf_tokenizer *tok; /* owned; NULL: bytes */
  wf__stream *train;
  wf__loader *loader;
  wf__stream *val;           /* NULL: no validation */
  int *val_win, *val_starts; /* evaluation batches 0 .. n_val - 1, kept */
  int n_val;
  int64_t traced; /* the last step written to the test trace */
  char key[32];
};

size_t wf_data_loader_bytes(int lanes, int T) { return wf__loader_bytes(lanes, T, LOADER_DEPTH); }

/* ---- opening ---------------------------------------------------------------------------- */

static void sources_of(const wf_data_opts *o, wf__stream_src *src)
{
  for (int i = 0; i < o->n_source; i++)
    src[i] = (wf__stream_src){.path = o->source[i],
                              .field = o->field[i] ? o->field[i] : "text",
                              .weight = o->n_mix > 0 ? o->mix[i] : 1.0};
}

static wf_status open_streams(wf__dstream *ds, const wf_data_opts *o, char *err, size_t err_len)
{
  wf__stream_src src[WF_DATA_MAX_SOURCES];
  sources_of(o, src);
  wf__stream_opts so = {.src = src,
                        .n_src = o->n_source,
                        .lanes = ds->L,
                        .lane0 = ds->l0,
                        .lane1 = ds->l1,
                        .T = ds->T,
                        .tok = ds->tok,
                        .vocab = o->vocab,
                        .key = "data.source"};
  wf_status st = wf__stream_open(&ds->train, &so, err, err_len);
  if (st == WF_OK)
    st = wf__loader_create(&ds->loader, ds->train, ds->l1 - ds->l0, ds->T, LOADER_DEPTH);
  if (st != WF_OK || !o->val_path || !o->val_path[0])
    return st;
  wf__stream_src vs = {.path = o->val_path, .field = src[0].field, .weight = 1.0};
  so.src = &vs, so.n_src = 1, so.key = "data.val_path";
  return wf__stream_open(&ds->val, &so, err, err_len);
}

static void describe(const wf__dstream *ds, char *desc, size_t len)
{
  size_t n = (size_t)snprintf(desc, len, "JSON Lines stream%s:",
                              wf__stream_n_src(ds->train) > 1 ? "s mixed by tokens" : "");
  for (int i = 0; i < wf__stream_n_src(ds->train) && n < len; i++) {
    const char *pat, *field;
    double w;
    int nf;
    wf__stream_src_info(ds->train, i, &pat, &field, &w, &nf);
    n += (size_t)snprintf(desc + n, len - n, "%s '%s' (%d file%s, key \"%s\", %.3g)", i ? "," : "",
                          pat, nf, nf == 1 ? "" : "s", field, w);
  }
  if (n < len)
    n += (size_t)snprintf(desc + n, len - n, ", %s, packed into %d lanes (this rank: %d-%d)",
                          ds->tok ? wf_tokenizer_describe(ds->tok) : "text read as bytes", ds->L,
                          ds->l0, ds->l1 - 1);
  if (n < len)
    snprintf(desc + n, len - n, "; validation: %s",
             ds->val ? "data.val_path, its first batches" : "none (data.val_path is not set)");
}

wf_status wf__dstream_open(wf__dstream **out, const wf_data_opts *o, wf_tokenizer *tok, char *desc,
                           size_t desc_len, char *err, size_t err_len)
{
  *out = NULL;
  int D = o->dp_size > 0 ? o->dp_size : 1, r = o->dp_size > 0 ? o->dp_rank : 0;
  if (o->batch_size % D || r < 0 || r >= D) {
    wf_tokenizer_destroy(tok);
    return wf__io_failf(err, err_len, WF_EINVAL, "data.source: batch %d over dp rank %d of %d",
                        o->batch_size, r, D);
  }
  wf__dstream *ds = calloc(1, sizeof *ds);
  if (!ds) {
    wf_tokenizer_destroy(tok);
    return WF_ENOMEM;
  }
  ds->tok = tok, ds->L = o->batch_size, ds->T = o->seq_len, ds->traced = -1;
  ds->l0 = r * (ds->L / D), ds->l1 = ds->l0 + ds->L / D;
  wf_status st = open_streams(ds, o, err, err_len);
  if (st != WF_OK) {
    wf__dstream_destroy(ds);
    return st;
  }
  describe(ds, desc, desc_len);
  *out = ds;
  return WF_OK;
}

void wf__dstream_destroy(wf__dstream *ds)
{
  if (!ds)
    return;
  wf__loader_destroy(ds->loader); /* its thread first: it reads the stream */
  wf__stream_destroy(ds->train);
  wf__stream_destroy(ds->val);
  free(ds->val_win);
  free(ds->val_starts);
  wf_tokenizer_destroy(ds->tok);
  free(ds);
}

bool wf__dstream_has_val(const wf__dstream *ds) { return ds->val != NULL; }

/* ---- batches -------------------------------------------------------------------------------- */

/* Evaluation batch `index`'s rows, made in order on first use and kept. */
static wf_status val_rows(wf__dstream *ds, int64_t index, const int **win, const int **starts,
                          char *err, size_t err_len)
{
  size_t nl = (size_t)(ds->l1 - ds->l0), W = nl * (ds->T + 1), S = nl * ds->T;
  if (index < 0 || index > 1 << 20)
    return WF_EINVAL;
  while (ds->n_val <= index) {
    int *w = realloc(ds->val_win, (ds->n_val + 1) * W * sizeof *w);
    if (w)
      ds->val_win = w;
    int *s = w ? realloc(ds->val_starts, (ds->n_val + 1) * S * sizeof *s) : NULL;
    if (!s)
      return WF_ENOMEM;
    ds->val_starts = s;
    wf_status st = wf__stream_rows(ds->val, ds->val_win + ds->n_val * W,
                                   ds->val_starts + ds->n_val * S, err, err_len);
    if (st != WF_OK)
      return st;
    ds->n_val++;
  }
  *win = ds->val_win + (size_t)index * W, *starts = ds->val_starts + (size_t)index * S;
  return WF_OK;
}

/* WEFT_TEST_DATA_TRACE=DIR (read once): every training step's rows this rank made,
 * appended to DIR/rank-R.txt as "step lane: tokens | starts", so a test can compare the
 * tokens of two runs (a resumed one, another dp) row by row. */
static void trace_rows(wf__dstream *ds, int64_t index, const int *win, const int *starts)
{
  static const char *dir = (const char *)1;
  if (dir == (const char *)1)
    dir = getenv("WEFT_TEST_DATA_TRACE");
  if (!dir || !dir[0] || index <= ds->traced)
    return;
  ds->traced = index;
  char path[WF_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/rank-%d.txt", dir, wf_rt_rank() < 0 ? 0 : wf_rt_rank());
  FILE *f = fopen(path, "a");
  for (int i = 0; f && i < ds->l1 - ds->l0; i++) {
    fprintf(f, "%lld %d:", (long long)index + 1, ds->l0 + i);
    for (int t = 0; t <= ds->T; t++)
      fprintf(f, " %d", win[(size_t)i * (ds->T + 1) + t]);
    fprintf(f, " |");
    for (int t = 0; t < ds->T; t++)
      fprintf(f, " %d", starts[(size_t)i * ds->T + t]);
    fputc('\n', f);
  }
  if (f)
    fclose(f);
}

wf_status wf__dstream_rows(wf__dstream *ds, wf_data_split split, int64_t index, const int **win,
                           const int **starts, char *err, size_t err_len)
{
  if (split == WF_DATA_VAL)
    return ds->val ? val_rows(ds, index, win, starts, err, err_len) : WF_EINVAL;
  wf_status st = wf__loader_get(ds->loader, index, win, starts, err, err_len);
  if (st == WF_OK)
    trace_rows(ds, index, *win, *starts);
  return st;
}

wf_status wf__dstream_batch(wf__dstream *ds, int *inputs, int *targets, int *starts,
                            wf_data_split split, int64_t index, int64_t first, int rows, char *err,
                            size_t err_len)
{
  const int *win, *st0;
  int T = ds->T;
  if (first < ds->l0 || first + rows > ds->l1)
    return wf__io_failf(err, err_len, WF_EINVAL,
                        "data.source: rows %lld-%lld are not this rank's lanes %d-%d",
                        (long long)first, (long long)(first + rows - 1), ds->l0, ds->l1 - 1);
  wf_status st = wf__dstream_rows(ds, split, index, &win, &st0, err, err_len);
  for (int b = 0; st == WF_OK && b < rows; b++) {
    size_t i = (size_t)(first - ds->l0 + b);
    memcpy(inputs + (size_t)b * T, win + i * (T + 1), (size_t)T * sizeof *inputs);
    memcpy(targets + (size_t)b * T, win + i * (T + 1) + 1, (size_t)T * sizeof *targets);
    if (starts)
      memcpy(starts + (size_t)b * T, st0 + i * T, (size_t)T * sizeof *starts);
  }
  return st;
}

/* ---- the position in a checkpoint -------------------------------------------------------------
 */

size_t wf__dstream_state_len(const wf__dstream *ds)
{
  return (size_t)ds->L * wf__stream_lane_rec(ds->train) + wf__stream_n_files(ds->train);
}

wf_status wf__dstream_state_get(wf__dstream *ds, int64_t index, uint64_t *v, char *err,
                                size_t err_len)
{
  size_t R = wf__stream_lane_rec(ds->train);
  memset(v, 0, wf__dstream_state_len(ds) * sizeof *v);
  return wf__loader_state(ds->loader, index, v + (size_t)ds->l0 * R, v + (size_t)ds->L * R, err,
                          err_len);
}

/* What identifies the tokenizer: its description without its file's name. */
static void tok_identity(const wf_tokenizer *tok, char *buf, size_t len)
{
  const char *d = tok ? wf_tokenizer_describe(tok) : "bytes";
  const char *q1 = strchr(d, '\''), *q2 = q1 ? strchr(q1 + 1, '\'') : NULL;
  if (q1 && q2) /* "GPT-2 BPE 'vocab.json': 50257 tokens" -> "GPT-2 BPE: 50257 tokens" */
    snprintf(buf, len, "%.*s%s", (int)(q1 - d - (q1 > d && q1[-1] == ' ')), d, q2 + 1);
  else
    snprintf(buf, len, "%s", d);
}

static json_t *sources_json(const wf__stream *s, const uint64_t *docs)
{
  json_t *a = json_array();
  for (int i = 0, j = 0; a && i < wf__stream_n_src(s); i++) {
    const char *pat, *field, *name;
    double w;
    int nf;
    int64_t bytes;
    wf__stream_src_info(s, i, &pat, &field, &w, &nf);
    json_t *files = json_array();
    for (int f = 0; files && f < nf; f++, j++) {
      wf__stream_file_info(s, i, f, &name, &bytes);
      json_array_append_new(
          files, json_pack("{s:s, s:I, s:o}", "name", name, "bytes", (json_int_t)bytes, "docs",
                           docs[j] ? json_integer((json_int_t)docs[j] - 1) : json_null()));
    }
    json_array_append_new(a, json_pack("{s:s, s:s, s:f, s:o}", "path", pat, "field", field,
                                       "weight", w, "files", files));
  }
  return a;
}

char *wf__dstream_state_json(const wf__dstream *ds, int64_t index, const uint64_t *v)
{
  size_t R = wf__stream_lane_rec(ds->train);
  char tid[256];
  tok_identity(ds->tok, tid, sizeof tid);
  json_t *lanes = json_array();
  for (int l = 0; lanes && l < ds->L; l++) {
    json_t *x = json_array();
    for (size_t j = 0; x && j < R; j++)
      json_array_append_new(x, json_integer((json_int_t)v[(size_t)l * R + j]));
    json_array_append_new(lanes, x);
  }
  json_t *o = json_pack("{s:i, s:I, s:i, s:s, s:o, s:s, s:o}", "version", STATE_VERSION, "step",
                        (json_int_t)index, "lanes", ds->L, "tokenizer", tid, "sources",
                        sources_json(ds->train, v + (size_t)ds->L * R), "lane_record",
                        "[source + 1, tokens of its current document used, documents taken per "
                        "source..., tokens taken per source...]",
                        "lane_state", lanes);
  char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  return text;
}

/* ---- resuming from it ---------------------------------------------------------------------- */

static wf_status stale(char *err, size_t err_len, const char *fmt, const char *a, const char *b)
{
  char what[2 * WF_PATH_MAX + 128];
  snprintf(what, sizeof what, fmt, a, b);
  return wf__io_failf(err, err_len, WF_ECONFIG,
                      "the checkpoint's data position does not fit this run's data: %s; resume "
                      "with the data it was saved with (or start the data over with "
                      "train.resume=never)",
                      what);
}

/* One saved file against this run's file f of source s: the same name and size. */
static wf_status check_file(const wf__stream *s, int i, int f, json_t *o, uint64_t *docs, char *err,
                            size_t err_len)
{
  const char *name, *mine;
  json_int_t bytes, n = -1;
  json_t *jd = NULL;
  int64_t my_bytes;
  wf__stream_file_info(s, i, f, &mine, &my_bytes);
  if (json_unpack(o, "{s:s, s:I, s:o}", "name", &name, "bytes", &bytes, "docs", &jd) != 0)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "the checkpoint's data position is malformed "
                        "(a file entry)");
  if (strcmp(name, mine))
    return stale(err, err_len, "it read '%s' where this run has '%s'", name, mine);
  if (bytes != my_bytes) {
    char sz[64];
    snprintf(sz, sizeof sz, "%lld bytes, now %lld", (long long)bytes, (long long)my_bytes);
    return stale(err, err_len, "'%s' was %s", name, sz);
  }
  if (json_is_integer(jd))
    n = json_integer_value(jd);
  *docs = n >= 0 ? (uint64_t)n + 1 : 0;
  return WF_OK;
}

static wf_status check_sources(const wf__stream *s, json_t *a, uint64_t *docs, char *err,
                               size_t err_len)
{
  wf_status st = WF_OK;
  char n_was[32], n_now[32];
  snprintf(n_was, sizeof n_was, "%zu", json_array_size(a));
  snprintf(n_now, sizeof n_now, "%d", wf__stream_n_src(s));
  if (!json_is_array(a) || (int)json_array_size(a) != wf__stream_n_src(s))
    return stale(err, err_len, "it had %s data.source entries, this run has %s", n_was, n_now);
  for (int i = 0, j = 0; st == WF_OK && i < wf__stream_n_src(s); i++) {
    const char *path, *field, *pat, *fld;
    json_t *files;
    double w;
    int nf;
    wf__stream_src_info(s, i, &pat, &fld, &w, &nf);
    if (json_unpack(json_array_get(a, (size_t)i), "{s:s, s:s, s:o}", "path", &path, "field", &field,
                    "files", &files) != 0 ||
        !json_is_array(files))
      return wf__io_failf(err, err_len, WF_EFORMAT,
                          "the checkpoint's data position is "
                          "malformed (data.source entry %d)",
                          i);
    if (strcmp(path, pat))
      return stale(err, err_len, "its data.source was '%s' where this run has '%s'", path, pat);
    if (strcmp(field, fld))
      return stale(err, err_len, "its data.field was '%s' where this run has '%s'", field, fld);
    if ((int)json_array_size(files) != nf)
      return stale(err, err_len, "'%s' matched other files then (%s)", pat, "their count differs");
    for (int f = 0; st == WF_OK && f < nf; f++, j++)
      st = check_file(s, i, f, json_array_get(files, (size_t)f), &docs[j], err, err_len);
  }
  return st;
}

static wf_status lanes_of(json_t *a, int L, size_t R, uint64_t *v, char *err, size_t err_len)
{
  if (!json_is_array(a) || (int)json_array_size(a) != L)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "the checkpoint's data position is malformed "
                        "(lane_state)");
  for (int l = 0; l < L; l++) {
    json_t *x = json_array_get(a, (size_t)l);
    if (!json_is_array(x) || json_array_size(x) != R)
      return wf__io_failf(err, err_len, WF_EFORMAT,
                          "the checkpoint's data position is malformed "
                          "(lane %d)",
                          l);
    for (size_t j = 0; j < R; j++) {
      json_t *e = json_array_get(x, j);
      if (!json_is_integer(e) || json_integer_value(e) < 0)
        return wf__io_failf(err, err_len, WF_EFORMAT,
                            "the checkpoint's data position is "
                            "malformed (lane %d)",
                            l);
      v[(size_t)l * R + j] = (uint64_t)json_integer_value(e);
    }
  }
  return WF_OK;
}

static wf_status restore(wf__dstream *ds, json_t *o, uint64_t *v, char *err, size_t err_len)
{
  int version = 0, L = 0;
  json_int_t step = -1;
  const char *tid;
  json_t *sources, *lanes;
  char mine[256], was[16], now[16];
  if (json_unpack(o, "{s:i, s:I, s:i, s:s, s:o, s:o}", "version", &version, "step", &step, "lanes",
                  &L, "tokenizer", &tid, "sources", &sources, "lane_state", &lanes) ||
      version != STATE_VERSION || step < 0)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "the checkpoint's data position is malformed "
                        "or of another version (this weft reads version %d)",
                        STATE_VERSION);
  snprintf(was, sizeof was, "%d", L);
  snprintf(now, sizeof now, "%d", ds->L);
  if (L != ds->L)
    return stale(err, err_len, "it packed %s lanes (its train.batch_size), this run has %s", was,
                 now);
  tok_identity(ds->tok, mine, sizeof mine);
  if (strcmp(tid, mine))
    return stale(err, err_len, "it was tokenized by %s, this run by %s", tid, mine);
  size_t R = wf__stream_lane_rec(ds->train);
  wf_status st = check_sources(ds->train, sources, v + (size_t)ds->L * R, err, err_len);
  if (st == WF_OK)
    st = lanes_of(lanes, ds->L, R, v, err, err_len);
  if (st == WF_OK)
    st = wf__loader_restore(ds->loader, (int64_t)step, v, v + (size_t)ds->L * R, err, err_len);
  return st;
}

wf_status wf__dstream_state_set(wf__dstream *ds, const char *text, char *err, size_t err_len)
{
  json_error_t je;
  json_t *o = json_loads(text, 0, &je);
  uint64_t *v = calloc(wf__dstream_state_len(ds) + 1, sizeof *v);
  wf_status st = !v   ? WF_ENOMEM
                 : !o ? wf__io_failf(err, err_len, WF_EFORMAT,
                                     "the checkpoint's data position is not JSON (%s)", je.text)
                      : restore(ds, o, v, err, err_len);
  json_decref(o);
  free(v);
  return st;
}
