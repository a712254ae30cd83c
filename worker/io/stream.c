/*
 * stream.c - streaming corpora: JSON Lines sources mixed by weight and packed into rows
 * (data.source, data.mix; docs/data-and-weights.md).
 *
 * Lanes. The global batch has L = train.batch_size rows, and row l of every step comes
 * from lane l: its own endless packed stream of documents. Lanes are the unit of
 * sharding: dp rank r of D owns lanes [r L/D, (r+1) L/D) and reads, parses and
 * tokenizes only their documents. Nothing about a lane depends on D, so every mesh
 * trains on the same global batches, and a checkpoint (each lane's position) resumes
 * on any dp.
 *
 * Documents. A source is its files (a glob's matches, sorted) read in order, over and
 * over: document k (k = 0, 1, ... over every epoch) is line k mod N of the
 * concatenation, N its documents (non-blank lines). Lane l takes the source's
 * documents k = l, l + L, l + 2L, ...: the source is dealt to the lanes like cards, so
 * any L lanes together read it in order, each document once per epoch. A rank reads
 * every line of every source (decompressing and finding newlines is cheap) but parses
 * and tokenizes only its lanes' lines; a lane that lags keeps the documents read ahead
 * for it in a queue.
 *
 * Mixing, by tokens. When a lane needs its next document it takes it from the source
 * whose share of the lane's tokens is furthest below its weight (the largest
 * w_s * total - tokens_s, the lowest s among equals), as Megatron-LM's blended dataset
 * picks by samples: each lane's mix stays within one document of the weights, with no
 * random draw to replay.
 *
 * Packing. A document is the tokenizer's document start (wf_tokenizer_bos: GPT-2's
 * <|endoftext|>, Llama 3's <|begin_of_text|>), then its text's tokens; without a
 * tokenizer, its bytes. A lane's documents follow one another, and row n of the lane
 * is its tokens [nT, nT + T + 1): inputs the first T, targets the last T, so every
 * token is a target once. A document longer than the rest of a row goes on in the next
 * row. starts[t] is where the document of input position t starts in the row (0 for
 * one that began in an earlier row): what keeps attention inside documents needs (keys
 * [starts[t], t] for query t, position t - starts[t]).
 *
 * State. A lane's position is (for each source: documents taken, tokens taken; the
 * source of its current document and how many of its tokens the rows have used), all
 * integers: the documents taken say which document is current (k = l + (taken - 1) L),
 * so a resume reads that document again, tokenizes it and skips what was used. The
 * documents each file holds, once a reader has counted them, let a resume skip whole
 * files. Nothing else (no buffer, no random state) is needed for the next tokens to be
 * the uninterrupted run's, bit for bit.
 *
 * Not thread-safe: one thread (the loader's, loader.c) drives a stream.
 */
#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io_int.h"

/* Consecutive documents without a token one lane may take before the source is called
 * empty (only text-as-bytes has empty documents: a tokenizer's start a document). */
#define MAX_EMPTY_DOCS (1 << 20)

typedef struct doc { /* a document read ahead for a lane */
  int64_t k;
  char *text;
  size_t len;
} doc;

typedef struct docq { /* FIFO ring of documents */
  doc *d;
  size_t head, n, cap;
} docq;

typedef struct src {
  char pattern[WF_PATH_MAX];
  char field[WF_DATA_FIELD_MAX];
  double w; /* weight, normalised to sum 1 */
  char **files;
  int64_t *bytes; /* each file's size at open (a resume refuses changed files) */
  int64_t *docs;  /* documents each file holds; -1 until a reader has counted them */
  int n_files;
  /* the reader: the document with global index pos is next; it is line in_file + 1
   * (non-blank) of files[file], whose reader is `lines` (NULL: not open yet) */
  wf__lines *lines;
  int file;
  int64_t in_file, pos;
} src;

typedef struct lane {
  int l;                /* global lane index */
  uint64_t *took, *tok; /* per source: documents and tokens taken */
  int64_t *next_k;      /* per source: the lowest document index it can still want */
  int cur;              /* source of the current document, -1 none */
  int64_t off;          /* tokens of it the rows have used */
  wf_tokens doc;        /* the current document's tokens */
  docq *q;              /* per source: documents read ahead for this lane */
} lane;

struct wf__stream {
  int L, l0, l1, T, S, vocab;
  const wf_tokenizer *tok; /* NULL: bytes */
  int bos;                 /* document start token, -1: none */
  char key[32];            /* the config key, for errors */
  src *src;
  lane *lanes; /* l1 - l0 */
};

/* ---- queues ----------------------------------------------------------------------- */

static wf_status q_push(docq *q, int64_t k, char *text, size_t len)
{
  if (q->n == q->cap) {
    size_t cap = q->cap ? 2 * q->cap : 8;
    doc *d = malloc(cap * sizeof *d);
    if (!d)
      return WF_ENOMEM;
    for (size_t i = 0; i < q->n; i++)
      d[i] = q->d[(q->head + i) % q->cap];
    free(q->d);
    q->d = d, q->cap = cap, q->head = 0;
  }
  q->d[(q->head + q->n++) % q->cap] = (doc){k, text, len};
  return WF_OK;
}

static doc q_pop(docq *q)
{
  doc d = q->d[q->head];
  q->head = (q->head + 1) % q->cap, q->n--;
  return d;
}

static void q_free(docq *q)
{
  while (q->n)
    free(q_pop(q).text);
  free(q->d);
}

/* ---- sources: files and the reader ----------------------------------------------------- */

static wf_status src_files(src *c, const char *key, char *err, size_t err_len)
{
  glob_t g;
  int rc = glob(c->pattern, 0, NULL, &g);
  if (rc != 0) {
    if (rc != GLOB_NOMATCH)
      globfree(&g);
    return wf__io_failf(err, err_len, WF_ECONFIG,
                        "%s '%s' matches no file (expected JSON Lines, "
                        "plain or zstd-compressed)",
                        key, c->pattern);
  }
  wf_status st = WF_OK;
  c->files = calloc(g.gl_pathc, sizeof *c->files);
  c->bytes = calloc(g.gl_pathc, sizeof *c->bytes);
  c->docs = calloc(g.gl_pathc, sizeof *c->docs);
  if (!c->files || !c->bytes || !c->docs)
    st = WF_ENOMEM;
  for (size_t i = 0; st == WF_OK && i < g.gl_pathc; i++) {
    struct stat sb;
    if (stat(g.gl_pathv[i], &sb) != 0 || !S_ISREG(sb.st_mode))
      st = wf__io_failf(err, err_len, WF_ECONFIG, "%s: '%s' is not a regular file", key,
                        g.gl_pathv[i]);
    else if (!(c->files[i] = strdup(g.gl_pathv[i])))
      st = WF_ENOMEM;
    else
      c->bytes[i] = (int64_t)sb.st_size, c->docs[i] = -1, c->n_files = (int)i + 1;
  }
  globfree(&g);
  return st;
}

/* The source's documents per epoch, or -1 while some file is uncounted. */
static int64_t src_total(const src *c)
{
  int64_t n = 0;
  for (int f = 0; f < c->n_files; f++) {
    if (c->docs[f] < 0)
      return -1;
    n += c->docs[f];
  }
  return n;
}

static wf_status no_docs(const wf__stream *s, const src *c, char *err, size_t err_len)
{
  return wf__io_failf(err, err_len, WF_EFORMAT,
                      "%s '%s' holds no documents (every line is blank); a JSON Lines file has "
                      "one JSON object per line",
                      s->key, c->pattern);
}

/* The reader reached the end of its file: count it, and go on to the next (the first
 * again after the last: another epoch). */
static wf_status src_end_of_file(const wf__stream *s, src *c, char *err, size_t err_len)
{
  if (c->docs[c->file] >= 0 && c->docs[c->file] != c->in_file)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "%s: '%s' changed while it was read: it held %lld documents, now %lld; "
                        "a source's files must not change during a run",
                        s->key, c->files[c->file], (long long)c->docs[c->file],
                        (long long)c->in_file);
  c->docs[c->file] = c->in_file;
  wf__lines_close(c->lines);
  c->lines = NULL, c->in_file = 0;
  if (++c->file == c->n_files) {
    c->file = 0;
    if (src_total(c) == 0)
      return no_docs(s, c, err, err_len);
  }
  return WF_OK;
}

/* The next document's line (pointer valid until the next read), and its index in *k. */
static wf_status src_next(const wf__stream *s, src *c, const char **line, size_t *len, int64_t *k,
                          char *err, size_t err_len)
{
  wf_status st = WF_OK;
  for (bool got = false; st == WF_OK && !got;) {
    if (!c->lines)
      st = wf__lines_open(&c->lines, c->files[c->file], err, err_len);
    if (st == WF_OK)
      st = wf__lines_next(c->lines, line, len, &got, err, err_len);
    if (st == WF_OK && !got)
      st = src_end_of_file(s, c, err, err_len);
  }
  if (st == WF_OK)
    *k = c->pos++, c->in_file++;
  return st;
}

/* Skip n documents of the open file; *left how many are left when it ends first. */
static wf_status skip_in_file(src *c, int64_t n, int64_t *left, char *err, size_t err_len)
{
  const char *line;
  size_t len;
  bool got = true;
  wf_status st = WF_OK;
  for (; st == WF_OK && n > 0; n--) {
    st = wf__lines_next(c->lines, &line, &len, &got, err, err_len);
    if (st != WF_OK || !got)
      break;
    c->in_file++;
  }
  *left = n;
  return st;
}

/* Put the reader at document k: whole files it has counted are skipped unread, a whole
 * epoch once the source's size is known. */
static wf_status src_seek(const wf__stream *s, src *c, int64_t k, char *err, size_t err_len)
{
  wf_status st = WF_OK;
  int64_t rem = k, total = src_total(c);
  wf__lines_close(c->lines);
  c->lines = NULL, c->file = 0, c->in_file = 0;
  if (total == 0)
    return no_docs(s, c, err, err_len);
  if (total > 0)
    rem %= total;
  while (st == WF_OK && rem > 0) {
    int64_t n = c->docs[c->file];
    if (n >= 0 && rem >= n) { /* counted: skipped unread */
      rem -= n;
      if (++c->file == c->n_files)
        c->file = 0, total = src_total(c), rem = total > 0 ? rem % total : rem;
      if (total == 0)
        return no_docs(s, c, err, err_len);
      continue;
    }
    if (!c->lines)
      st = wf__lines_open(&c->lines, c->files[c->file], err, err_len);
    if (st == WF_OK)
      st = skip_in_file(c, rem, &rem, err, err_len);
    if (st == WF_OK && rem > 0) { /* the file ended first: now it is counted */
      st = src_end_of_file(s, c, err, err_len);
      total = src_total(c);
      if (total > 0)
        rem %= total;
    }
  }
  c->pos = k;
  return st;
}

/* ---- lanes ---------------------------------------------------------------------------- */

static lane *local(wf__stream *s, int64_t k)
{
  int l = (int)(k % s->L);
  return l >= s->l0 && l < s->l1 ? &s->lanes[l - s->l0] : NULL;
}

/* Read source si ahead until lane ln's queue holds document k (its next), parsing only
 * this rank's lanes' lines. */
static wf_status fetch(wf__stream *s, lane *ln, int si, int64_t k, doc *out, char *err,
                       size_t err_len)
{
  src *c = &s->src[si];
  docq *q = &ln->q[si];
  wf_status st = WF_OK;
  while (st == WF_OK && q->n == 0) {
    const char *line;
    size_t len;
    int64_t kk;
    if (c->pos > k)
      return wf__io_failf(err, err_len, WF_EINVAL,
                          "%s '%s': lane %d wants document %lld but the reader is past it", s->key,
                          c->pattern, ln->l, (long long)k);
    st = src_next(s, c, &line, &len, &kk, err, err_len);
    lane *owner = st == WF_OK ? local(s, kk) : NULL;
    if (!owner || kk < owner->next_k[si])
      continue; /* another rank's lane, or one this lane has used already */
    char *text;
    size_t tl;
    st = wf__jsonl_text(c->lines, line, len, c->field, &text, &tl, err, err_len);
    if (st == WF_OK && (st = q_push(&owner->q[si], kk, text, tl)) != WF_OK)
      free(text);
  }
  if (st != WF_OK)
    return st;
  *out = q_pop(q);
  if (out->k != k) {
    free(out->text);
    return wf__io_failf(err, err_len, WF_EINVAL, "%s '%s': lane %d got document %lld, not %lld",
                        s->key, c->pattern, ln->l, (long long)out->k, (long long)k);
  }
  ln->next_k[si] = k + s->L;
  return WF_OK;
}

/* Document d's tokens into the lane's buffer: the document start, then the text. */
static wf_status tokenize(wf__stream *s, lane *ln, const doc *d)
{
  ln->doc.n = 0;
  if (!s->tok) {
    for (size_t i = 0; i < d->len; i++)
      if (wf__tokens_push(&ln->doc, (unsigned char)d->text[i]) != WF_OK)
        return WF_ENOMEM;
    return WF_OK;
  }
  if (s->bos >= 0 && wf__tokens_push(&ln->doc, s->bos) != WF_OK)
    return WF_ENOMEM;
  return wf_tokenizer_encode(s->tok, d->text, d->len, &ln->doc);
}

/* The source whose share of the lane's tokens is furthest below its weight. */
static int choose(const wf__stream *s, const lane *ln)
{
  double total = 0, best = -INFINITY;
  int pick = 0;
  for (int i = 0; i < s->S; i++)
    total += (double)ln->tok[i];
  for (int i = 0; i < s->S; i++) {
    double deficit = s->src[i].w * total - (double)ln->tok[i];
    if (deficit > best)
      best = deficit, pick = i;
  }
  return pick;
}

static wf_status take_next(wf__stream *s, lane *ln, char *err, size_t err_len)
{
  int si = choose(s, ln);
  int64_t k = ln->l + (int64_t)ln->took[si] * s->L;
  doc d;
  wf_status st = fetch(s, ln, si, k, &d, err, err_len);
  if (st != WF_OK)
    return st;
  st = tokenize(s, ln, &d);
  free(d.text);
  if (st != WF_OK)
    return wf__io_failf(err, err_len, st, "%s: out of memory tokenizing a document", s->key);
  ln->took[si]++, ln->tok[si] += ln->doc.n;
  ln->cur = si, ln->off = 0;
  return WF_OK;
}

/* The lane's next row: win (T+1) and starts (T); the row's last token stays for the
 * next row's first. */
static wf_status fill_row(wf__stream *s, lane *ln, int *win, int *starts, char *err, size_t err_len)
{
  int T = s->T, seg = 0, empty = 0;
  for (int i = 0; i < T + 1;) {
    if (ln->cur < 0 || ln->off == (int64_t)ln->doc.n) {
      wf_status st = take_next(s, ln, err, err_len);
      if (st != WF_OK)
        return st;
      if (ln->doc.n == 0 && ++empty > MAX_EMPTY_DOCS)
        return wf__io_failf(err, err_len, WF_EFORMAT,
                            "%s: lane %d read %d documents in a row with no text; the sources "
                            "hold (almost) only empty documents",
                            s->key, ln->l, MAX_EMPTY_DOCS);
      seg = i < T ? i : seg;
      continue;
    }
    int n = (int)WF_MIN((int64_t)ln->doc.n - ln->off, (int64_t)(T + 1 - i));
    for (int j = 0; j < n; j++) {
      win[i + j] = ln->doc.ids[ln->off + j];
      if (i + j < T)
        starts[i + j] = seg;
    }
    i += n, ln->off += n;
  }
  ln->off--; /* the last token starts the next row */
  return WF_OK;
}

wf_status wf__stream_rows(wf__stream *s, int *win, int *starts, char *err, size_t err_len)
{
  int T = s->T;
  for (int i = 0; i < s->l1 - s->l0; i++) {
    wf_status st =
        fill_row(s, &s->lanes[i], win + (size_t)i * (T + 1), starts + (size_t)i * T, err, err_len);
    if (st != WF_OK)
      return st;
  }
  return WF_OK;
}

/* ---- state ------------------------------------------------------------------------------- */

size_t wf__stream_lane_rec(const wf__stream *s) { return 2 + 2 * (size_t)s->S; }

size_t wf__stream_n_files(const wf__stream *s)
{
  size_t n = 0;
  for (int i = 0; i < s->S; i++)
    n += (size_t)s->src[i].n_files;
  return n;
}

void wf__stream_lanes_get(const wf__stream *s, uint64_t *rec)
{
  size_t R = wf__stream_lane_rec(s);
  for (int i = 0; i < s->l1 - s->l0; i++) {
    const lane *ln = &s->lanes[i];
    uint64_t *x = rec + (size_t)i * R;
    x[0] = (uint64_t)(ln->cur + 1), x[1] = (uint64_t)ln->off;
    memcpy(x + 2, ln->took, (size_t)s->S * sizeof *x);
    memcpy(x + 2 + s->S, ln->tok, (size_t)s->S * sizeof *x);
  }
}

void wf__stream_docs_get(const wf__stream *s, uint64_t *docs)
{
  for (int i = 0, j = 0; i < s->S; i++)
    for (int f = 0; f < s->src[i].n_files; f++)
      docs[j++] = (uint64_t)(s->src[i].docs[f] + 1);
}

/* A saved lane record, checked. */
static wf_status lane_set(wf__stream *s, lane *ln, const uint64_t *x, char *err, size_t err_len)
{
  if (x[0] > (uint64_t)s->S || (x[0] > 0 && x[2 + x[0] - 1] == 0) || x[1] > (1ull << 40))
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "%s: the checkpoint's position of lane %d is malformed", s->key, ln->l);
  ln->cur = (int)x[0] - 1, ln->off = (int64_t)x[1];
  memcpy(ln->took, x + 2, (size_t)s->S * sizeof *x);
  memcpy(ln->tok, x + 2 + s->S, (size_t)s->S * sizeof *x);
  for (int i = 0; i < s->S; i++)
    ln->next_k[i] = ln->l + (int64_t)(ln->took[i] - (i == ln->cur)) * s->L;
  return WF_OK;
}

/* The current document again, its used tokens skipped. */
static wf_status lane_reload(wf__stream *s, lane *ln, char *err, size_t err_len)
{
  if (ln->cur < 0)
    return WF_OK;
  doc d;
  int64_t off = ln->off;
  wf_status st = fetch(s, ln, ln->cur, ln->next_k[ln->cur], &d, err, err_len);
  if (st != WF_OK)
    return st;
  st = tokenize(s, ln, &d);
  free(d.text);
  if (st == WF_OK && off >= (int64_t)ln->doc.n)
    st = wf__io_failf(err, err_len, WF_EFORMAT,
                      "%s '%s': the checkpoint says lane %d is at token %lld of document %lld, "
                      "which has %zu tokens: the data or the tokenizer changed since it was saved",
                      s->key, s->src[ln->cur].pattern, ln->l, (long long)off,
                      (long long)(ln->next_k[ln->cur] - s->L), ln->doc.n);
  ln->off = off;
  return st;
}

wf_status wf__stream_restore(wf__stream *s, const uint64_t *lanes, const uint64_t *docs, char *err,
                             size_t err_len)
{
  wf_status st = WF_OK;
  size_t R = wf__stream_lane_rec(s);
  for (int i = 0, j = 0; i < s->S; i++)
    for (int f = 0; f < s->src[i].n_files; f++, j++)
      s->src[i].docs[f] = (int64_t)docs[j] - 1;
  for (int i = 0; st == WF_OK && i < s->l1 - s->l0; i++)
    st = lane_set(s, &s->lanes[i], lanes + (size_t)(s->l0 + i) * R, err, err_len);
  for (int i = 0; st == WF_OK && i < s->S; i++) { /* each reader at what a lane wants first */
    int64_t k = INT64_MAX;
    for (int j = 0; j < s->l1 - s->l0; j++)
      k = WF_MIN(k, s->lanes[j].next_k[i]);
    st = src_seek(s, &s->src[i], k, err, err_len);
  }
  for (int i = 0; st == WF_OK && i < s->l1 - s->l0; i++)
    st = lane_reload(s, &s->lanes[i], err, err_len);
  return st;
}

/* ---- description ------------------------------------------------------------------------- */

int wf__stream_n_src(const wf__stream *s) { return s->S; }
int wf__stream_lanes(const wf__stream *s) { return s->L; }
int wf__stream_lane0(const wf__stream *s) { return s->l0; }

void wf__stream_src_info(const wf__stream *s, int i, const char **pattern, const char **field,
                         double *weight, int *n_files)
{
  *pattern = s->src[i].pattern, *field = s->src[i].field;
  *weight = s->src[i].w, *n_files = s->src[i].n_files;
}

void wf__stream_file_info(const wf__stream *s, int i, int f, const char **name, int64_t *bytes)
{
  *name = s->src[i].files[f], *bytes = s->src[i].bytes[f];
}

/* ---- open and close ------------------------------------------------------------------- */

static wf_status check_opts(const wf__stream_opts *o, char *err, size_t err_len)
{
  double sum = 0;
  for (int i = 0; i < o->n_src; i++) {
    if (!(o->src[i].weight > 0) || !isfinite(o->src[i].weight))
      return wf__io_failf(err, err_len, WF_ECONFIG,
                          "data.mix[%d] = %g: a weight must be a "
                          "positive number",
                          i, o->src[i].weight);
    sum += o->src[i].weight;
  }
  if (o->n_src < 1 || o->n_src > WF_DATA_MAX_SOURCES || !isfinite(sum))
    return wf__io_failf(err, err_len, WF_ECONFIG, "%s: %d sources; 1 to %d are allowed", o->key,
                        o->n_src, WF_DATA_MAX_SOURCES);
  if (o->lanes < 1 || o->lane0 < 0 || o->lane1 <= o->lane0 || o->lane1 > o->lanes || o->T < 1)
    return wf__io_failf(err, err_len, WF_EINVAL, "%s: lanes [%d, %d) of %d, seq_len %d", o->key,
                        o->lane0, o->lane1, o->lanes, o->T);
  if (!o->tok && o->vocab < 256)
    return wf__io_failf(err, err_len, WF_ECONFIG,
                        "%s: without data.tokenizer text is read as bytes (ids 0-255), but the "
                        "model's vocabulary is %d; byte-level text needs model.vocab 256",
                        o->key, o->vocab);
  return WF_OK;
}

static wf_status alloc_lanes(wf__stream *s)
{
  int n = s->l1 - s->l0;
  if (!(s->lanes = calloc((size_t)n, sizeof *s->lanes)))
    return WF_ENOMEM;
  for (int i = 0; i < n; i++) {
    lane *ln = &s->lanes[i];
    ln->l = s->l0 + i, ln->cur = -1;
    ln->took = calloc((size_t)s->S, sizeof *ln->took);
    ln->tok = calloc((size_t)s->S, sizeof *ln->tok);
    ln->next_k = calloc((size_t)s->S, sizeof *ln->next_k);
    ln->q = calloc((size_t)s->S, sizeof *ln->q);
    if (!ln->took || !ln->tok || !ln->next_k || !ln->q)
      return WF_ENOMEM;
    for (int j = 0; j < s->S; j++)
      ln->next_k[j] = ln->l;
  }
  return WF_OK;
}

wf_status wf__stream_open(wf__stream **out, const wf__stream_opts *o, char *err, size_t err_len)
{
  *out = NULL;
  wf_status st = check_opts(o, err, err_len);
  wf__stream *s = st == WF_OK ? calloc(1, sizeof *s) : NULL;
  if (!s)
    return st == WF_OK ? WF_ENOMEM : st;
  s->L = o->lanes, s->l0 = o->lane0, s->l1 = o->lane1, s->T = o->T, s->S = o->n_src;
  s->vocab = o->vocab, s->tok = o->tok, s->bos = o->tok ? wf_tokenizer_bos(o->tok) : -1;
  wf_strlcpy(s->key, o->key, sizeof s->key);
  double sum = 0;
  for (int i = 0; i < s->S; i++)
    sum += o->src[i].weight;
  if (!(s->src = calloc((size_t)s->S, sizeof *s->src)))
    st = WF_ENOMEM;
  for (int i = 0; st == WF_OK && i < s->S; i++) {
    src *c = &s->src[i];
    wf_strlcpy(c->pattern, o->src[i].path, sizeof c->pattern);
    wf_strlcpy(c->field, o->src[i].field, sizeof c->field);
    c->w = o->src[i].weight / sum;
    st = src_files(c, o->key, err, err_len);
  }
  if (st == WF_OK)
    st = alloc_lanes(s);
  if (st != WF_OK) {
    wf__stream_destroy(s);
    return st;
  }
  *out = s;
  return WF_OK;
}

void wf__stream_destroy(wf__stream *s)
{
  if (!s)
    return;
  for (int i = 0; s->lanes && i < s->l1 - s->l0; i++) {
    lane *ln = &s->lanes[i];
    for (int j = 0; ln->q && j < s->S; j++)
      q_free(&ln->q[j]);
    free(ln->q);
    free(ln->took);
    free(ln->tok);
    free(ln->next_k);
    wf_tokens_free(&ln->doc);
  }
  for (int i = 0; s->src && i < s->S; i++) {
    src *c = &s->src[i];
    wf__lines_close(c->lines);
    for (int f = 0; f < c->n_files; f++)
      free(c->files[f]);
    free(c->files);
    free(c->bytes);
    free(c->docs);
  }
  free(s->lanes);
  free(s->src);
  free(s);
}
