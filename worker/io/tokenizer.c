/*
 * tokenizer.c - GPT-2's byte-level BPE behind wf_io.h's wf_tokenizer_*: the tables,
 * encoding and decoding. Reading the files into the tables is tokenizer_load.c's;
 * `worker --tokenize` is tokenize.c's.
 *
 * Design: the vocabulary is a hash map from token strings (in GPT-2's byte alphabet) to
 * ids; the merges are a hash map from an id pair to (rank, merged id), resolved once at
 * load, so encoding never touches strings. Each id also keeps its decoded bytes, so
 * decoding is a copy. Pre-tokenizing is PCRE2 (JIT when available) with GPT-2's
 * pattern; \s is spelled out as Unicode's White_Space set, which is what Python's regex
 * module (GPT-2's encoder.py) and Hugging Face's tokenizers match.
 *
 * Invariants:
 *  - After load, every byte has a token (byte_id[]), every merge's parts and result are
 *    vocabulary ids, and tok_bytes[id] is set for every id in use; encode cannot fail
 *    but for memory.
 *  - Text that is not valid UTF-8 still round-trips: PCRE2 runs with
 *    PCRE2_MATCH_INVALID_UTF, and bytes no match covers become their own pre-tokens.
 *  - Errors at load name the file and, for merges.txt, the line.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "io_int.h"

/* GPT-2's pattern; WS is Unicode's White_Space property (Python regex's \s). */
#define WS_SET                                                                                     \
  "\\t\\n\\x{0B}\\f\\r "                                                                           \
  "\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS_SET
                                   "\\p{L}\\p{N}]+|[" WS_SET "]+(?![^" WS_SET "])|[" WS_SET "]+";

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

/* ---- GPT-2's byte alphabet ------------------------------------------------------------ */

/* bytes_to_unicode() of encoder.py: printable Latin-1 bytes map to themselves, the other
 * 68 to U+0100.. in byte order, so every byte is a visible character. */
static void byte_alphabet(uint32_t cp_of[256], int16_t byte_of[324])
{
  for (int i = 0; i < 324; i++)
    byte_of[i] = -1;
  int n = 0;
  for (int b = 0; b < 256; b++) {
    bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cp_of[b] = keep ? (uint32_t)b : 256u + (uint32_t)n++;
    byte_of[cp_of[b]] = (int16_t)b;
  }
}

static size_t utf8_put(unsigned char *out, uint32_t cp)
{
  if (cp < 0x80) {
    out[0] = (unsigned char)cp;
    return 1;
  }
  out[0] = (unsigned char)(0xC0 | cp >> 6); /* the alphabet stays below U+0800 */
  out[1] = (unsigned char)(0x80 | (cp & 0x3F));
  return 2;
}

/* Next code point of s[*i .. n); -1 on malformed UTF-8. */
static int32_t utf8_next(const unsigned char *s, size_t n, size_t *i)
{
  unsigned char c = s[*i];
  int extra = c < 0x80             ? 0
              : (c & 0xE0) == 0xC0 ? 1
              : (c & 0xF0) == 0xE0 ? 2
              : (c & 0xF8) == 0xF0 ? 3
                                   : -1;
  if (extra < 0 || *i + (size_t)extra >= n)
    return -1;
  int32_t cp = extra == 0 ? c : c & (0x3F >> extra);
  for (int k = 1; k <= extra; k++) {
    if ((s[*i + k] & 0xC0) != 0x80)
      return -1;
    cp = cp << 6 | (s[*i + k] & 0x3F);
  }
  *i += (size_t)extra + 1;
  return cp;
}

/* ---- hash maps --------------------------------------------------------------------------- */

static size_t pow2_at_least(size_t n)
{
  size_t c = 16;
  while (c < n)
    c <<= 1;
  return c;
}

static wf__tok_str *vocab_slot(const wf_tokenizer *t, const char *s, size_t len)
{
  size_t mask = t->vocab_cap - 1, i = (size_t)XXH3_64bits(s, len) & mask;
  while (t->vocab[i].s && (t->vocab[i].len != len || memcmp(t->vocab[i].s, s, len)))
    i = (i + 1) & mask;
  return &t->vocab[i];
}

int32_t wf__tok_vocab_find(const wf_tokenizer *t, const char *s, size_t len)
{
  const wf__tok_str *e = vocab_slot(t, s, len);
  return e->s ? e->id : -1;
}

static wf__tok_pair *pair_slot(const wf_tokenizer *t, uint64_t key)
{
  size_t mask = t->pairs_cap - 1, i = (size_t)XXH3_64bits(&key, sizeof key) & mask;
  while (t->pairs[i].key != UINT64_MAX && t->pairs[i].key != key)
    i = (i + 1) & mask;
  return &t->pairs[i];
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

/* ---- building the tables ---------------------------------------------------------------- */

wf_status wf__tok_tables_init(wf_tokenizer *t, size_t n, size_t n_merges)
{
  t->vocab_cap = pow2_at_least(2 * n + 2 * WF__TOK_MAX_SPECIALS);
  t->vocab = calloc(t->vocab_cap, sizeof *t->vocab);
  t->pairs_cap = pow2_at_least(2 * n_merges + 2);
  t->pairs = malloc(t->pairs_cap * sizeof *t->pairs);
  if (!t->vocab || !t->pairs)
    return WF_ENOMEM;
  for (size_t i = 0; i < t->pairs_cap; i++)
    t->pairs[i].key = UINT64_MAX;
  return WF_OK;
}

wf_status wf__tok_vocab_add(wf_tokenizer *t, const char *s, size_t len, int32_t id,
                            const char *path, char *err, size_t err_len)
{
  if (id < 0 || id >= (1 << 30))
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s': token '%.*s' has id %d, expected 0 .. 2^30", path,
                        (int)WF_MIN(len, 64), s, id);
  if (t->vocab_n + 1 > t->vocab_cap / 2)
    return wf__io_failf(err, err_len, WF_EFORMAT, "tokenizer '%s': more tokens than announced",
                        path);
  wf__tok_str *e = vocab_slot(t, s, len);
  if (e->s)
    return WF_OK; /* the same string twice (an added token also in the vocab): keep the first */
  char *copy = malloc(len + 1);
  if (!copy)
    return WF_ENOMEM;
  memcpy(copy, s, len);
  copy[len] = '\0';
  *e = (wf__tok_str){copy, (uint32_t)len, id};
  t->vocab_n++;
  if (id + 1 > t->n_ids)
    t->n_ids = id + 1;
  return WF_OK;
}

wf_status wf__tok_merge_add(wf_tokenizer *t, const char *a, size_t la, const char *b, size_t lb,
                            const char *path, size_t line, char *err, size_t err_len)
{
  char buf[1024];
  if (la + lb > sizeof buf)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s': merge %zu is longer than %zu bytes", path, line,
                        sizeof buf);
  memcpy(buf, a, la);
  memcpy(buf + la, b, lb);
  int32_t ia = wf__tok_vocab_find(t, a, la), ib = wf__tok_vocab_find(t, b, lb),
          im = wf__tok_vocab_find(t, buf, la + lb);
  if (ia < 0 || ib < 0 || im < 0)
    return wf__io_failf(
        err, err_len, WF_EFORMAT,
        "tokenizer '%s': merge %zu ('%.*s' '%.*s') names a token that is not in the "
        "vocabulary ('%.*s')",
        path, line, (int)WF_MIN(la, 64), a, (int)WF_MIN(lb, 64), b,
        (int)WF_MIN(ia < 0   ? la
                    : ib < 0 ? lb
                             : la + lb,
                    64),
        ia < 0   ? a
        : ib < 0 ? b
                 : buf);
  wf__tok_pair *e = pair_slot(t, pair_key(ia, ib));
  if (e->key == UINT64_MAX) /* a repeated merge keeps its first (lowest) rank */
    *e = (wf__tok_pair){pair_key(ia, ib), (int32_t)t->n_merges, im};
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
  if (len == strlen(WF__TOK_EOT_TEXT) && !memcmp(s, WF__TOK_EOT_TEXT, len))
    t->eot = id;
  return WF_OK;
}

/* Bytes of every id (through the alphabet; specials are their own text), and each byte's
 * single-character token. */
static wf_status finish_tables(wf_tokenizer *t, const char *path, char *err, size_t err_len)
{
  uint32_t cp_of[256];
  int16_t byte_of[324];
  byte_alphabet(cp_of, byte_of);
  t->tok_bytes = calloc((size_t)t->n_ids, sizeof *t->tok_bytes);
  t->tok_len = calloc((size_t)t->n_ids, sizeof *t->tok_len);
  if (!t->tok_bytes || !t->tok_len)
    return WF_ENOMEM;
  for (int i = 0; i < t->n_specials; i++) {
    wf__tok_special *sp = &t->specials[i];
    if (!t->tok_bytes[sp->id] && (t->tok_bytes[sp->id] = malloc(sp->len)))
      memcpy(t->tok_bytes[sp->id], sp->s, sp->len), t->tok_len[sp->id] = (uint32_t)sp->len;
  }
  for (size_t i = 0; i < t->vocab_cap; i++) {
    const wf__tok_str *e = &t->vocab[i];
    if (!e->s || t->tok_bytes[e->id])
      continue;
    unsigned char *b = malloc(e->len + 1);
    if (!b)
      return WF_ENOMEM;
    size_t k = 0, n = 0;
    while (k < e->len) {
      int32_t cp = utf8_next((const unsigned char *)e->s, e->len, &k);
      if (cp < 0 || cp >= 324 || byte_of[cp] < 0) {
        free(b);
        return wf__io_failf(err, err_len, WF_EFORMAT,
                            "tokenizer '%s': token '%s' (id %d) is not written in GPT-2's byte "
                            "alphabet; only byte-level BPE vocabularies are supported",
                            path, e->s, e->id);
      }
      b[n++] = (unsigned char)byte_of[cp];
    }
    t->tok_bytes[e->id] = b, t->tok_len[e->id] = (uint32_t)n;
  }
  for (int b = 0; b < 256; b++) {
    unsigned char u[2];
    t->byte_id[b] = wf__tok_vocab_find(t, (const char *)u, utf8_put(u, cp_of[b]));
    if (t->byte_id[b] < 0)
      return wf__io_failf(
          err, err_len, WF_EFORMAT,
          "tokenizer '%s': the vocabulary has no token for byte 0x%02x, which every "
          "byte-level BPE needs",
          path, b);
  }
  return WF_OK;
}

static wf_status compile_pattern(wf_tokenizer *t)
{
  int code;
  PCRE2_SIZE off;
  t->re = pcre2_compile((PCRE2_SPTR)gpt2_pattern, PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | PCRE2_UCP, &code, &off, NULL);
  if (!t->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    WF_ERROR("tokenizer: PCRE2 refused GPT-2's pattern at %zu: %s", (size_t)off, (char *)msg);
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

void wf_tokenizer_destroy(wf_tokenizer *t)
{
  if (!t)
    return;
  for (size_t i = 0; t->vocab && i < t->vocab_cap; i++)
    free((void *)t->vocab[i].s);
  for (int i = 0; t->tok_bytes && i < t->n_ids; i++)
    free(t->tok_bytes[i]);
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
const char *wf_tokenizer_describe(const wf_tokenizer *t) { return t->desc; }

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

/* The whole pre-token as one vocabulary string, when ignore_merges allows it. */
static int32_t whole_word(const wf_tokenizer *t, const unsigned char *p, size_t n)
{
  static const size_t max = 256;
  unsigned char buf[2 * 256];
  uint32_t cp_of[256];
  int16_t byte_of[324];
  if (n > max)
    return -1;
  byte_alphabet(cp_of, byte_of);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    k += utf8_put(buf + k, cp_of[p[i]]);
  return wf__tok_vocab_find(t, (const char *)buf, k);
}

/* BPE of one pre-token: merge the lowest-ranked adjacent pair (leftmost on a tie) until
 * no pair has a merge. rank[i] caches pair (i, i+1), so a merge costs one scan. */
static wf_status bpe(const wf_tokenizer *t, const unsigned char *p, size_t n, wf_tokens *out)
{
  int32_t whole = t->ignore_merges ? whole_word(t, p, n) : -1;
  if (whole >= 0)
    return wf__tokens_push(out, whole);
  int32_t stack[2 * 64], *sym = n <= 64 ? stack : malloc(2 * n * sizeof *sym), merged = 0;
  if (!sym)
    return WF_ENOMEM;
  int32_t *rank = sym + n;
  size_t m = n;
  for (size_t i = 0; i < n; i++)
    sym[i] = t->byte_id[p[i]];
  for (size_t i = 0; i + 1 < m; i++)
    rank[i] = pair_rank(t, sym[i], sym[i + 1], &merged);
  while (m > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < m; i++)
      if (rank[i] < rank[best])
        best = i;
    if (rank[best] == INT32_MAX)
      break;
    pair_rank(t, sym[best], sym[best + 1], &sym[best]);
    memmove(sym + best + 1, sym + best + 2, (m - best - 2) * sizeof *sym);
    memmove(rank + best + 1, rank + best + 2, (m > best + 2 ? m - best - 3 : 0) * sizeof *rank);
    m--;
    if (best > 0)
      rank[best - 1] = pair_rank(t, sym[best - 1], sym[best], &merged);
    if (best + 1 < m)
      rank[best] = pair_rank(t, sym[best], sym[best + 1], &merged);
  }
  wf_status st = WF_OK;
  for (size_t i = 0; i < m && st == WF_OK; i++)
    st = wf__tokens_push(out, sym[i]);
  if (sym != stack)
    free(sym);
  return st;
}

/* Pre-tokenize text without specials and BPE each piece; bytes no match covers (malformed
 * UTF-8) are pieces of their own. */
static wf_status encode_plain(const wf_tokenizer *t, const unsigned char *s, size_t n,
                              pcre2_match_data *md, wf_tokens *out)
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
      st = bpe(t, s + pos, a - pos, out);
    if (st == WF_OK && b > a)
      st = bpe(t, s + a, b - a, out);
    pos = b > a ? b : n;
  }
  return st;
}

/* HF's ByteLevel add_prefix_space: a segment not starting with a space gets one. */
static wf_status encode_segment(const wf_tokenizer *t, const unsigned char *s, size_t n,
                                pcre2_match_data *md, wf_tokens *out)
{
  if (!t->add_prefix_space || n == 0 || s[0] == ' ')
    return encode_plain(t, s, n, md, out);
  unsigned char *buf = malloc(n + 1);
  if (!buf)
    return WF_ENOMEM;
  buf[0] = ' ';
  memcpy(buf + 1, s, n);
  wf_status st = encode_plain(t, buf, n + 1, md, out);
  free(buf);
  return st;
}

/* The earliest special token at or after pos (the longest one there); -1 when none.
 * next[] caches each special's next occurrence: NOT_YET before the first search,
 * SIZE_MAX when there is none left. */
#define NOT_YET (SIZE_MAX - 1)
static int next_special(const wf_tokenizer *t, const char *s, size_t n, size_t pos, size_t *next)
{
  int best = -1;
  for (int i = 0; i < t->n_specials; i++) {
    const wf__tok_special *sp = &t->specials[i];
    if (next[i] == NOT_YET || (next[i] != SIZE_MAX && next[i] < pos)) {
      const char *hit = pos < n ? memmem(s + pos, n - pos, sp->s, sp->len) : NULL;
      next[i] = hit ? (size_t)(hit - s) : SIZE_MAX;
    }
    if (next[i] != SIZE_MAX && (best < 0 || next[i] < next[best] ||
                                (next[i] == next[best] && sp->len > t->specials[best].len)))
      best = i;
  }
  return best;
}

wf_status wf_tokenizer_encode(const wf_tokenizer *t, const char *text, size_t len, wf_tokens *out)
{
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
  size_t *next = malloc(((size_t)t->n_specials + 1) * sizeof *next);
  wf_status st = md && next ? WF_OK : WF_ENOMEM;
  for (int i = 0; next && i < t->n_specials; i++)
    next[i] = NOT_YET;
  const unsigned char *s = (const unsigned char *)text;
  for (size_t pos = 0; st == WF_OK;) {
    int k = next_special(t, text, len, pos, next);
    size_t end = k < 0 ? len : next[k];
    st = encode_segment(t, s + pos, end - pos, md, out);
    if (st != WF_OK || k < 0)
      break;
    st = wf__tokens_push(out, t->specials[k].id);
    pos = end + t->specials[k].len;
  }
  pcre2_match_data_free(md);
  free(next);
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
