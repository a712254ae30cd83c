/*
 * tokenizer.c - the byte-level BPE core behind wf_io.h's wf_tokenizer_*: loading through a
 * kind (io_int.h's wf__tok_kind: GPT-2's files in tokenizer_gpt2.c, Llama 3's tiktoken
 * ranks in tokenizer_llama3.c), the tables, encoding and decoding. `worker --tokenize`
 * is tokenize.c's.
 *
 * Design: the vocabulary is a hash map from each token's raw bytes to its id; merges are
 * a hash map from an id pair to (rank, merged id), resolved once at load, so encoding
 * never touches strings. Each id also keeps its bytes, so decoding is a copy. Encoding
 * cuts special tokens out of the text first, splits each piece between them with the
 * kind's pattern (PCRE2, JIT when available), and turns each pre-token into ids: whole
 * when the kind says so and the pre-token is a token (tiktoken; HF's ignore_merges), else
 * by BPE: the adjacent pair of lowest rank merges first, the leftmost of equal ranks,
 * until no pair has a rank. A heap of (rank, position) makes that O(n log n) in the
 * pre-token's length, so a megabyte-long run of letters or spaces (one pre-token) cannot
 * stall encoding as the quadratic scan of encoder.py and tiktoken would.
 *
 * Invariants:
 *  - After load, every byte has a token (byte_id[]), every pair's parts and result are
 *    ids, and tok_bytes[id] is set for every id in use; encode cannot fail but for memory.
 *  - Any bytes round-trip, valid UTF-8 or not: PCRE2 runs with PCRE2_MATCH_INVALID_UTF,
 *    and bytes no match covers become pre-tokens of their own.
 *  - A loaded tokenizer is immutable: encode keeps its scratch space on the call's stack
 *    and heap, so threads may share one.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "io_int.h"

/* Unicode's White_Space property: what \s means in Python's regex module (GPT-2's
 * encoder.py) and in Rust's regex (tiktoken, hence Llama 3). PCRE2's own \s under UCP
 * differs (it adds U+180E), so the set is spelled out. */
#define WS                                                                                         \
  "\\t\\n\\x{0B}\\f\\r "                                                                           \
  "\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* GPT-2's encoder.py. */
const char wf__tok_gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS
                                    "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";

/* Llama 3's (Meta's tokenizer.py; tiktoken's cl100k_base): contractions in any case, a
 * letter run with at most one leading non-letter-non-digit-non-newline, digits in threes,
 * punctuation runs with their trailing newlines, newline runs with the spaces before them,
 * then spaces (all but the last before a non-space), then any whitespace. */
const char wf__tok_llama3_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WS
    "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";

/* The kinds detection tries, in order (each claims its own files only). */
static const wf__tok_kind *const kinds[] = {&wf__tok_gpt2, &wf__tok_llama3};

/* ---- errors ----------------------------------------------------------------------- */

wf_status wf__io_failf(char *err, size_t len, wf_status st, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  if (err && len)
    vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return st;
}

/* ---- UTF-8 ---------------------------------------------------------------------------- */

size_t wf_utf8_char_len(const void *p, size_t n)
{
  const unsigned char *s = p;
  if (n == 0)
    return 0;
  if (s[0] < 0x80)
    return 1;
  size_t len = s[0] >= 0xC2 && s[0] <= 0xDF   ? 2
               : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
               : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4
                                              : 0;
  if (len == 0 || n < len)
    return 0;
  for (size_t k = 1; k < len; k++)
    if ((s[k] & 0xC0) != 0x80)
      return 0;
  /* overlong three- and four-byte forms, UTF-16 surrogates, above U+10FFFF */
  if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0) ||
      (s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))
    return 0;
  return len;
}

/* ---- hash maps --------------------------------------------------------------------------- */

static size_t pow2_at_least(size_t n)
{
  size_t c = 16;
  while (c < n)
    c <<= 1;
  return c;
}

/* The slot of key s[0 .. len) with hash h: its entry, or the empty slot it would take. */
static wf__tok_str *vocab_slot(const wf_tokenizer *t, const void *s, size_t len, uint64_t h)
{
  size_t mask = t->vocab_cap - 1, i = (size_t)h & mask;
  const wf__tok_str *e;
  while ((e = &t->vocab[i])->s &&
         (e->hash != (uint32_t)(h >> 32) || e->len != len || memcmp(e->s, s, len)))
    i = (i + 1) & mask;
  return &t->vocab[i];
}

int32_t wf__tok_vocab_find(const wf_tokenizer *t, const void *s, size_t len)
{
  const wf__tok_str *e = vocab_slot(t, s, len, XXH3_64bits(s, len));
  return e->s ? e->id : -1;
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static wf__tok_pair *pair_slot(const wf_tokenizer *t, uint64_t key)
{
  size_t mask = t->pairs_cap - 1, i = (size_t)XXH3_64bits(&key, sizeof key) & mask;
  while (t->pairs[i].key != UINT64_MAX && t->pairs[i].key != key)
    i = (i + 1) & mask;
  return &t->pairs[i];
}

/* ---- building the tables ---------------------------------------------------------------- */

wf_status wf__tok_tables_init(wf_tokenizer *t, size_t n, size_t n_pairs)
{
  t->vocab_cap = pow2_at_least(2 * n + 2 * WF__TOK_MAX_SPECIALS);
  t->vocab = calloc(t->vocab_cap, sizeof *t->vocab);
  t->pairs_cap = pow2_at_least(2 * n_pairs + 2);
  t->pairs = malloc(t->pairs_cap * sizeof *t->pairs);
  if (!t->vocab || !t->pairs)
    return WF_ENOMEM;
  for (size_t i = 0; i < t->pairs_cap; i++)
    t->pairs[i].key = UINT64_MAX;
  return WF_OK;
}

wf_status wf__tok_vocab_add(wf_tokenizer *t, const void *s, size_t len, int32_t id, bool *added,
                            const char *path, char *err, size_t err_len)
{
  if (added)
    *added = false;
  if (id < 0 || id >= (1 << 30))
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s': token '%.*s' has id %d, expected 0 .. 2^30", path,
                        (int)WF_MIN(len, 64), (const char *)s, id);
  if (len == 0 || len > UINT32_MAX)
    return wf__io_failf(err, err_len, WF_EFORMAT, "tokenizer '%s': token id %d is %s", path, id,
                        len ? "longer than 4 GiB" : "empty");
  if (t->vocab_n + 1 > t->vocab_cap / 2)
    return wf__io_failf(err, err_len, WF_EFORMAT, "tokenizer '%s': more tokens than announced",
                        path);
  uint64_t h = XXH3_64bits(s, len);
  wf__tok_str *e = vocab_slot(t, s, len, h);
  if (e->s)
    return WF_OK; /* the same bytes twice (an added token also in the vocab): keep the first */
  unsigned char *copy = malloc(len);
  if (!copy)
    return WF_ENOMEM;
  memcpy(copy, s, len);
  *e = (wf__tok_str){copy, (uint32_t)len, (uint32_t)(h >> 32), id};
  t->vocab_n++;
  if (id + 1 > t->n_ids)
    t->n_ids = id + 1;
  if (added)
    *added = true;
  return WF_OK;
}

wf_status wf__tok_pair_add(wf_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
  wf__tok_pair *e = pair_slot(t, pair_key(a, b));
  if (e->key != UINT64_MAX)
    return WF_OK; /* a repeated merge keeps its first (lowest) rank */
  if (t->n_merges + 1 > t->pairs_cap / 2)
    return WF_EINVAL; /* more pairs than tables_init was told: a kind's bug */
  *e = (wf__tok_pair){pair_key(a, b), rank, merged};
  t->n_merges++;
  return WF_OK;
}

wf_status wf__tok_special_add(wf_tokenizer *t, const char *s, size_t len, int32_t id)
{
  if (t->n_specials >= WF__TOK_MAX_SPECIALS || len == 0)
    return WF_OK; /* an empty special can never match; past the cap they stay plain text */
  wf__tok_special *sp = &t->specials[t->n_specials];
  sp->s = malloc(len);
  if (!sp->s)
    return WF_ENOMEM;
  memcpy(sp->s, s, len);
  sp->len = len, sp->id = id;
  t->n_specials++;
  t->special_first[(unsigned char)s[0]] = 1;
  if (id + 1 > t->n_ids)
    t->n_ids = id + 1;
  return WF_OK;
}

/* Bytes of every id (specials are their own text) and each byte's single-byte token. */
static wf_status finish_tables(wf_tokenizer *t, const char *path, char *err, size_t err_len)
{
  t->tok_bytes = calloc((size_t)t->n_ids, sizeof *t->tok_bytes);
  t->tok_len = calloc((size_t)t->n_ids, sizeof *t->tok_len);
  if (!t->tok_bytes || !t->tok_len)
    return WF_ENOMEM;
  for (int i = 0; i < t->n_specials; i++) {
    const wf__tok_special *sp = &t->specials[i];
    if (!t->tok_bytes[sp->id])
      t->tok_bytes[sp->id] = (const unsigned char *)sp->s, t->tok_len[sp->id] = (uint32_t)sp->len;
  }
  for (size_t i = 0; i < t->vocab_cap; i++) {
    const wf__tok_str *e = &t->vocab[i];
    if (e->s && !t->tok_bytes[e->id])
      t->tok_bytes[e->id] = e->s, t->tok_len[e->id] = e->len;
  }
  for (int b = 0; b < 256; b++) {
    unsigned char u = (unsigned char)b;
    t->byte_id[b] = wf__tok_vocab_find(t, &u, 1);
    if (t->byte_id[b] < 0)
      return wf__io_failf(err, err_len, WF_EFORMAT,
                          "tokenizer '%s': the vocabulary has no token for byte 0x%02x, which "
                          "every byte-level BPE needs",
                          path, b);
  }
  return WF_OK;
}

static wf_status compile_pattern(wf_tokenizer *t)
{
  int code;
  PCRE2_SIZE off;
  t->re = pcre2_compile((PCRE2_SPTR)t->pattern, PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | PCRE2_UCP, &code, &off, NULL);
  if (!t->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    WF_ERROR("tokenizer: PCRE2 refused %s's pattern at %zu: %s", t->kind->name, (size_t)off,
             (char *)msg);
    return WF_EINVAL;
  }
  pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
  return WF_OK;
}

wf_status wf__tok_finish(wf_tokenizer *t, const char *path, char *err, size_t err_len)
{
  wf_status st = finish_tables(t, path, err, err_len);
  return st == WF_OK ? compile_pattern(t) : st;
}

/* ---- loading: which kind, then the kind's loader ---------------------------------------- */

/* The kinds' file names, searched in a folder: GPT-2's (tokenizer.json before vocab.json,
 * as before) or Llama 3's tokenizer.model, never both (which one was meant is unknowable). */
static wf_status resolve_folder(const char *path, char *out, size_t len, char *err, size_t err_len)
{
  static const char *const names[] = {"tokenizer.json", "vocab.json", "tokenizer.model"};
  char found[3][WF_PATH_MAX + 32];
  int n = 0;
  struct stat sb;
  for (size_t i = 0; i < WF_ARRAY_LEN(names); i++) {
    snprintf(found[n], sizeof found[n], "%s/%s", path, names[i]);
    if (stat(found[n], &sb) == 0 && S_ISREG(sb.st_mode))
      n++;
  }
  if (n == 0)
    return wf__io_failf(err, err_len, WF_EIO,
                        "data.tokenizer: the folder '%s' holds none of tokenizer.json, vocab.json "
                        "(GPT-2) or tokenizer.model (Llama 3)",
                        path);
  if (strstr(found[n - 1], "/tokenizer.model") && n > 1)
    return wf__io_failf(err, err_len, WF_ECONFIG,
                        "data.tokenizer: the folder '%s' holds both '%s' and '%s'; name the file "
                        "to use",
                        path, found[0], found[n - 1]);
  snprintf(out, len, "%s", found[0]);
  return WF_OK;
}

/* A regular file, or a folder holding one of the kinds' files. */
static wf_status resolve_path(const char *path, char *out, size_t len, char *err, size_t err_len)
{
  struct stat sb;
  if (stat(path, &sb) != 0)
    return wf__io_failf(err, err_len, WF_EIO, "data.tokenizer: cannot open '%s': %s", path,
                        strerror(errno));
  if (S_ISDIR(sb.st_mode))
    return resolve_folder(path, out, len, err, err_len);
  if (!S_ISREG(sb.st_mode))
    return wf__io_failf(err, err_len, WF_EIO,
                        "data.tokenizer: '%s' is not a regular file (a FIFO or a device); name "
                        "tokenizer.json, vocab.json, tokenizer.model or the folder holding them",
                        path);
  snprintf(out, len, "%s", path);
  return WF_OK;
}

/* The kind that claims the file's first bytes. */
static wf_status detect(const wf__tok_kind **kind, const char *file, char *err, size_t err_len)
{
  unsigned char head[256];
  FILE *f = fopen(file, "rb");
  if (!f)
    return wf__io_failf(err, err_len, WF_EIO, "data.tokenizer: cannot open '%s': %s", file,
                        strerror(errno));
  size_t n = fread(head, 1, sizeof head, f);
  fclose(f);
  for (size_t i = 0; i < WF_ARRAY_LEN(kinds); i++) {
    if (kinds[i]->version != WF__TOK_KIND_VERSION) {
      WF_ERROR("tokenizer kind '%s' is version %d, this build's table is version %d",
               kinds[i]->name, kinds[i]->version, WF__TOK_KIND_VERSION);
      return WF_EINVAL;
    }
    if (kinds[i]->claims(file, head, n)) {
      *kind = kinds[i];
      return WF_OK;
    }
  }
  return wf__io_failf(err, err_len, WF_EFORMAT,
                      "data.tokenizer: '%s' is neither %s (%s) nor %s (%s); name one of those "
                      "files",
                      file, wf__tok_gpt2.name, wf__tok_gpt2.files, wf__tok_llama3.name,
                      wf__tok_llama3.files);
}

wf_status wf_tokenizer_load(wf_tokenizer **out, const char *path, char *err, size_t err_len)
{
  *out = NULL;
  char file[WF_PATH_MAX + 32];
  const wf__tok_kind *kind = NULL;
  wf_status st = resolve_path(path, file, sizeof file, err, err_len);
  if (st == WF_OK)
    st = detect(&kind, file, err, err_len);
  if (st != WF_OK)
    return st;
  wf_tokenizer *t = calloc(1, sizeof *t);
  if (!t)
    return wf__io_failf(err, err_len, WF_ENOMEM, "tokenizer '%s': out of memory", file);
  t->kind = kind, t->name = kind->name, t->eot = t->bos = -1;
  st = kind->load(t, file, err, err_len);
  if (st == WF_OK)
    st = wf__tok_finish(t, file, err, err_len);
  if (st == WF_ENOMEM)
    wf__io_failf(err, err_len, st, "tokenizer '%s': out of memory", file);
  if (st != WF_OK) {
    wf_tokenizer_destroy(t);
    return st;
  }
  snprintf(t->desc, sizeof t->desc, "%s '%s': %d tokens (%d special), %zu merges", t->name, file,
           t->n_ids, t->n_specials, t->n_merges);
  *out = t;
  return WF_OK;
}

void wf_tokenizer_destroy(wf_tokenizer *t)
{
  if (!t)
    return;
  for (size_t i = 0; t->vocab && i < t->vocab_cap; i++)
    free((void *)t->vocab[i].s);
  for (int i = 0; i < t->n_specials; i++)
    free(t->specials[i].s);
  free(t->vocab);
  free(t->pairs);
  free(t->tok_bytes);
  free(t->tok_len);
  pcre2_code_free(t->re);
  free(t);
}

int wf_tokenizer_vocab(const wf_tokenizer *t) { return t->n_ids; }
int wf_tokenizer_eot(const wf_tokenizer *t) { return t->eot; }
int wf_tokenizer_bos(const wf_tokenizer *t) { return t->bos; }
bool wf_tokenizer_adds_bos(const wf_tokenizer *t) { return t->adds_bos; }
const char *wf_tokenizer_describe(const wf_tokenizer *t) { return t->desc; }

/* What the model's vocabulary may exceed the tokenizer's by: padding (to a multiple of 64
 * or 128 in the models weft reads, 1024 at most), never a second tokenizer's worth. */
#define VOCAB_PAD 1024

wf_status wf_tokenizer_fits(const wf_tokenizer *t, int vocab, char *err, size_t err_len)
{
  int n = wf_tokenizer_vocab(t), padded = (n + VOCAB_PAD - 1) / VOCAB_PAD * VOCAB_PAD;
  if (vocab <= 0 || (n <= vocab && vocab <= padded))
    return WF_OK;
  snprintf(err, err_len,
           "data.tokenizer: %s, but the model's vocabulary is %d: %s; use the tokenizer the "
           "model was trained with (GPT-2's has 50257 tokens, Llama 3's 128256), or a model "
           "whose model.vocab is the tokenizer's",
           t->desc, vocab,
           n > vocab ? "the tokenizer gives ids past the model's embedding"
                     : "the model was trained with a larger tokenizer, and would sample ids "
                       "this one has no token for");
  return WF_ECONFIG;
}

int wf_tokenizer_special(const wf_tokenizer *t, const char *text)
{
  size_t len = strlen(text);
  for (int i = 0; i < t->n_specials; i++)
    if (t->specials[i].len == len && !memcmp(t->specials[i].s, text, len))
      return t->specials[i].id;
  return -1;
}

/* ---- encoding ---------------------------------------------------------------------------- */

void wf_tokens_free(wf_tokens *t)
{
  free(t->ids);
  *t = (wf_tokens){0};
}

wf_status wf__tokens_push(wf_tokens *o, int32_t id)
{
  if (o->n == o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 1024;
    int32_t *ids = realloc(o->ids, cap * sizeof *ids);
    if (!ids)
      return WF_ENOMEM;
    o->ids = ids, o->cap = cap;
  }
  o->ids[o->n++] = id;
  return WF_OK;
}

static int32_t pair_rank(const wf_tokenizer *t, int32_t a, int32_t b, int32_t *merged)
{
  const wf__tok_pair *e = pair_slot(t, pair_key(a, b));
  if (e->key == UINT64_MAX)
    return INT32_MAX;
  *merged = e->merged;
  return e->rank;
}

/* BPE's scratch space, grown as pre-tokens need and reused across one encode call. A
 * pre-token of n bytes is a list of n nodes (node i starts at byte i; sym -1: merged
 * into its left neighbour) and a min-heap of candidate pairs keyed by (rank, left node),
 * so the lowest rank merges first and the leftmost among equals. */
typedef struct cand {
  int32_t rank, left;
} cand;

typedef struct bpe_ws {
  int32_t *sym, *prev, *next;
  cand *heap;
  size_t cap, h;
} bpe_ws;

static wf_status ws_reserve(bpe_ws *w, size_t n)
{
  if (n <= w->cap)
    return WF_OK;
  size_t cap = WF_MAX(n, 2 * w->cap);
  int32_t *p = realloc(w->sym, 3 * cap * sizeof *p);
  if (!p)
    return WF_ENOMEM;
  w->sym = p, w->prev = p + cap, w->next = p + 2 * cap;
  cand *h = realloc(w->heap, 3 * cap * sizeof *h); /* n - 1 pairs + 2 per merge */
  if (!h)
    return WF_ENOMEM;
  w->heap = h, w->cap = cap;
  return WF_OK;
}

static bool cand_less(cand a, cand b)
{
  return a.rank < b.rank || (a.rank == b.rank && a.left < b.left);
}

static void heap_push(bpe_ws *w, int32_t rank, int32_t left)
{
  if (rank == INT32_MAX)
    return;
  size_t i = w->h++;
  cand c = {rank, left};
  while (i > 0 && cand_less(c, w->heap[(i - 1) / 2])) {
    w->heap[i] = w->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  w->heap[i] = c;
}

static cand heap_pop(bpe_ws *w)
{
  cand top = w->heap[0], last = w->heap[--w->h];
  size_t i = 0;
  for (size_t c; (c = 2 * i + 1) < w->h; i = c) {
    if (c + 1 < w->h && cand_less(w->heap[c + 1], w->heap[c]))
      c++;
    if (!cand_less(w->heap[c], last))
      break;
    w->heap[i] = w->heap[c];
  }
  w->heap[i] = last;
  return top;
}

/* Merge the pair at node i with its right neighbour j into `merged`, and queue the pairs
 * it now forms on both sides. */
static void merge_at(const wf_tokenizer *t, bpe_ws *w, int32_t i, int32_t merged)
{
  int32_t j = w->next[i], m = 0;
  w->sym[i] = merged, w->sym[j] = -1;
  w->next[i] = w->next[j];
  if (w->next[j] >= 0)
    w->prev[w->next[j]] = i;
  if (w->prev[i] >= 0)
    heap_push(w, pair_rank(t, w->sym[w->prev[i]], merged, &m), w->prev[i]);
  if (w->next[i] >= 0)
    heap_push(w, pair_rank(t, merged, w->sym[w->next[i]], &m), i);
}

/* One pre-token p[0 .. n) into ids. A queued pair is stale once either node has changed;
 * its rank, looked up again, then differs (a rank names one merged token, and one token
 * has one split at a given boundary), so stale pairs are recognised and skipped. */
static wf_status bpe(const wf_tokenizer *t, const unsigned char *p, size_t n, bpe_ws *w,
                     wf_tokens *out)
{
  int32_t whole = t->whole_first ? wf__tok_vocab_find(t, p, n) : -1;
  if (whole >= 0 || n == 1)
    return wf__tokens_push(out, whole >= 0 ? whole : t->byte_id[p[0]]);
  if (n > INT32_MAX / 4)
    return WF_ENOMEM;
  if (ws_reserve(w, n) != WF_OK)
    return WF_ENOMEM;
  int32_t merged = 0;
  w->h = 0;
  for (int32_t i = 0; i < (int32_t)n; i++)
    w->sym[i] = t->byte_id[p[i]], w->prev[i] = i - 1, w->next[i] = i + 1 < (int32_t)n ? i + 1 : -1;
  for (int32_t i = 0; i + 1 < (int32_t)n; i++)
    heap_push(w, pair_rank(t, w->sym[i], w->sym[i + 1], &merged), i);
  while (w->h > 0) {
    cand c = heap_pop(w);
    int32_t i = c.left, j = w->next[i];
    if (w->sym[i] < 0 || j < 0 || pair_rank(t, w->sym[i], w->sym[j], &merged) != c.rank)
      continue;
    merge_at(t, w, i, merged);
  }
  wf_status st = WF_OK;
  for (int32_t i = 0; i >= 0 && st == WF_OK; i = w->next[i])
    st = wf__tokens_push(out, w->sym[i]);
  return st;
}

/* Pre-tokenize text without specials and BPE each piece; bytes no match covers (malformed
 * UTF-8) are pieces of their own. */
static wf_status encode_plain(const wf_tokenizer *t, const unsigned char *s, size_t n,
                              pcre2_match_data *md, bpe_ws *w, wf_tokens *out)
{
  size_t pos = 0;
  wf_status st = WF_OK;
  while (pos < n && st == WF_OK) {
    int rc = pcre2_match(t->re, s, n, pos, 0, md, NULL);
    size_t a = n, b = n;
    if (rc > 0) {
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
      a = ov[0], b = ov[1];
    }
    if (a > pos)
      st = bpe(t, s + pos, a - pos, w, out);
    if (st == WF_OK && b > a)
      st = bpe(t, s + a, b - a, w, out);
    pos = b > a ? b : n;
  }
  return st;
}

/* HF's ByteLevel add_prefix_space: a segment not starting with a space gets one. */
static wf_status encode_segment(const wf_tokenizer *t, const unsigned char *s, size_t n,
                                pcre2_match_data *md, bpe_ws *w, wf_tokens *out)
{
  if (!t->add_prefix_space || n == 0 || s[0] == ' ')
    return encode_plain(t, s, n, md, w, out);
  unsigned char *buf = malloc(n + 1);
  if (!buf)
    return WF_ENOMEM;
  buf[0] = ' ';
  memcpy(buf + 1, s, n);
  wf_status st = encode_plain(t, buf, n + 1, md, w, out);
  free(buf);
  return st;
}

/* The first special token at or after pos (the longest one there), or -1; *at is where. A
 * byte that starts no special is passed over with one table look-up. */
static int next_special(const wf_tokenizer *t, const unsigned char *s, size_t n, size_t pos,
                        size_t *at)
{
  for (size_t i = pos; i < n; i++) {
    if (!t->special_first[s[i]])
      continue;
    int best = -1;
    for (int k = 0; k < t->n_specials; k++) {
      const wf__tok_special *sp = &t->specials[k];
      if (sp->len <= n - i && (best < 0 || sp->len > t->specials[best].len) &&
          !memcmp(s + i, sp->s, sp->len))
        best = k;
    }
    if (best >= 0) {
      *at = i;
      return best;
    }
  }
  return -1;
}

wf_status wf_tokenizer_encode(const wf_tokenizer *t, const char *text, size_t len, wf_tokens *out)
{
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
  bpe_ws w = {0};
  wf_status st = md ? WF_OK : WF_ENOMEM;
  const unsigned char *s = (const unsigned char *)text;
  for (size_t pos = 0, at = len; st == WF_OK;) {
    int k = next_special(t, s, len, pos, &at);
    size_t end = k < 0 ? len : at;
    st = encode_segment(t, s + pos, end - pos, md, &w, out);
    if (st != WF_OK || k < 0)
      break;
    st = wf__tokens_push(out, t->specials[k].id);
    pos = end + t->specials[k].len;
  }
  pcre2_match_data_free(md);
  free(w.sym);
  free(w.heap);
  return st;
}

/* ---- decoding ------------------------------------------------------------------------------ */

wf_status wf_tokenizer_decode(const wf_tokenizer *t, const int32_t *ids, size_t n, char *out,
                              size_t cap, size_t *len)
{
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= t->n_ids || !t->tok_bytes[id]) {
      *len = k;
      return WF_EINVAL;
    }
    uint32_t l = t->tok_len[id];
    if (k < cap)
      memcpy(out + k, t->tok_bytes[id], WF_MIN((size_t)l, cap - k));
    k += l;
  }
  *len = k;
  return WF_OK;
}
