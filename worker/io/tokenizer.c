/*
 * tokenizer.c - GPT-2's byte-level BPE behind wf_io.h's wf_tokenizer_*.
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
#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "wf_file.h"
#include "wf_io.h"

#define MAX_SPECIALS  1024
#define SHARD_MAGIC   20240520
#define SHARD_VERSION 1
#define SHARD_TOKENS  100000000LL /* llm.c's fineweb.py: 10^8 tokens per shard */
#define EOT_TEXT      "<|endoftext|>"

/* GPT-2's pattern; WS is Unicode's White_Space property (Python regex's \s). */
#define WS_SET                                                                                     \
  "\\t\\n\\x{0B}\\f\\r "                                                                           \
  "\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS_SET
                                   "\\p{L}\\p{N}]+|[" WS_SET "]+(?![^" WS_SET "])|[" WS_SET "]+";

typedef struct str_entry {
  const char *s; /* NULL: empty slot */
  uint32_t len;
  int32_t id;
} str_entry;

typedef struct pair_entry {
  uint64_t key; /* a << 32 | b; UINT64_MAX: empty */
  int32_t rank, merged;
} pair_entry;

typedef struct special {
  char *s;
  size_t len;
  int32_t id;
} special;

struct wf_tokenizer {
  str_entry *vocab;
  size_t vocab_cap, vocab_n;
  pair_entry *pairs;
  size_t pairs_cap, n_merges;
  int32_t n_ids;             /* largest id + 1 */
  unsigned char **tok_bytes; /* per id: its bytes (NULL: unused id) */
  uint32_t *tok_len;
  int32_t byte_id[256];
  special specials[MAX_SPECIALS];
  int n_specials;
  int32_t eot;
  bool add_prefix_space, ignore_merges;
  pcre2_code *re;
  char desc[WF_PATH_MAX + 128];
};

/* ---- errors ----------------------------------------------------------------------- */

static wf_status failf(char *err, size_t len, wf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static wf_status failf(char *err, size_t len, wf_status st, const char *fmt, ...)
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

static str_entry *vocab_slot(const wf_tokenizer *t, const char *s, size_t len)
{
  size_t mask = t->vocab_cap - 1, i = (size_t)XXH3_64bits(s, len) & mask;
  while (t->vocab[i].s && (t->vocab[i].len != len || memcmp(t->vocab[i].s, s, len)))
    i = (i + 1) & mask;
  return &t->vocab[i];
}

static int32_t vocab_find(const wf_tokenizer *t, const char *s, size_t len)
{
  const str_entry *e = vocab_slot(t, s, len);
  return e->s ? e->id : -1;
}

static pair_entry *pair_slot(const wf_tokenizer *t, uint64_t key)
{
  size_t mask = t->pairs_cap - 1, i = (size_t)XXH3_64bits(&key, sizeof key) & mask;
  while (t->pairs[i].key != UINT64_MAX && t->pairs[i].key != key)
    i = (i + 1) & mask;
  return &t->pairs[i];
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

/* ---- building the tables ---------------------------------------------------------------- */

static wf_status vocab_init(wf_tokenizer *t, size_t n, size_t n_merges)
{
  t->vocab_cap = pow2_at_least(2 * n + 2 * MAX_SPECIALS);
  t->vocab = calloc(t->vocab_cap, sizeof *t->vocab);
  t->pairs_cap = pow2_at_least(2 * n_merges + 2);
  t->pairs = malloc(t->pairs_cap * sizeof *t->pairs);
  if (!t->vocab || !t->pairs)
    return WF_ENOMEM;
  for (size_t i = 0; i < t->pairs_cap; i++)
    t->pairs[i].key = UINT64_MAX;
  return WF_OK;
}

static wf_status vocab_add(wf_tokenizer *t, const char *s, size_t len, int32_t id, const char *path,
                           char *err, size_t err_len)
{
  if (id < 0 || id >= (1 << 30))
    return failf(err, err_len, WF_EFORMAT,
                 "tokenizer '%s': token '%.*s' has id %d, expected 0 .. 2^30", path,
                 (int)WF_MIN(len, 64), s, id);
  if (t->vocab_n + 1 > t->vocab_cap / 2)
    return failf(err, err_len, WF_EFORMAT, "tokenizer '%s': more tokens than announced", path);
  str_entry *e = vocab_slot(t, s, len);
  if (e->s)
    return WF_OK; /* the same string twice (an added token also in the vocab): keep the first */
  char *copy = malloc(len + 1);
  if (!copy)
    return WF_ENOMEM;
  memcpy(copy, s, len);
  copy[len] = '\0';
  *e = (str_entry){copy, (uint32_t)len, id};
  t->vocab_n++;
  if (id + 1 > t->n_ids)
    t->n_ids = id + 1;
  return WF_OK;
}

static wf_status merge_add(wf_tokenizer *t, const char *a, size_t la, const char *b, size_t lb,
                           const char *path, size_t line, char *err, size_t err_len)
{
  char buf[1024];
  if (la + lb > sizeof buf)
    return failf(err, err_len, WF_EFORMAT, "tokenizer '%s': merge %zu is longer than %zu bytes",
                 path, line, sizeof buf);
  memcpy(buf, a, la);
  memcpy(buf + la, b, lb);
  int32_t ia = vocab_find(t, a, la), ib = vocab_find(t, b, lb), im = vocab_find(t, buf, la + lb);
  if (ia < 0 || ib < 0 || im < 0)
    return failf(err, err_len, WF_EFORMAT,
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
  pair_entry *e = pair_slot(t, pair_key(ia, ib));
  if (e->key == UINT64_MAX) /* a repeated merge keeps its first (lowest) rank */
    *e = (pair_entry){pair_key(ia, ib), (int32_t)t->n_merges, im};
  t->n_merges++;
  return WF_OK;
}

static wf_status special_add(wf_tokenizer *t, const char *s, size_t len, int32_t id)
{
  if (t->n_specials >= MAX_SPECIALS || len == 0)
    return WF_OK; /* an empty special can never match; past the cap they stay plain text */
  special *sp = &t->specials[t->n_specials];
  sp->s = malloc(len);
  if (!sp->s)
    return WF_ENOMEM;
  memcpy(sp->s, s, len);
  sp->len = len, sp->id = id;
  t->n_specials++;
  if (len == strlen(EOT_TEXT) && !memcmp(s, EOT_TEXT, len))
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
    special *sp = &t->specials[i];
    if (!t->tok_bytes[sp->id] && (t->tok_bytes[sp->id] = malloc(sp->len)))
      memcpy(t->tok_bytes[sp->id], sp->s, sp->len), t->tok_len[sp->id] = (uint32_t)sp->len;
  }
  for (size_t i = 0; i < t->vocab_cap; i++) {
    const str_entry *e = &t->vocab[i];
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
        return failf(err, err_len, WF_EFORMAT,
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
    t->byte_id[b] = vocab_find(t, (const char *)u, utf8_put(u, cp_of[b]));
    if (t->byte_id[b] < 0)
      return failf(err, err_len, WF_EFORMAT,
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

/* ---- loading ------------------------------------------------------------------------------ */

static wf_status load_vocab_object(wf_tokenizer *t, json_t *vocab, size_t n_merges,
                                   const char *path, char *err, size_t err_len)
{
  wf_status st = vocab_init(t, json_object_size(vocab), n_merges);
  const char *key;
  json_t *val;
  json_object_foreach(vocab, key, val)
  {
    if (st != WF_OK)
      break;
    if (!json_is_integer(val))
      return failf(err, err_len, WF_EFORMAT,
                   "tokenizer '%s': vocabulary entry '%s' is not an integer id", path, key);
    st = vocab_add(t, key, strlen(key), (int32_t)json_integer_value(val), path, err, err_len);
  }
  return st;
}

/* merges as "a b" strings (tokenizers < 0.20, GPT-2's merges.txt) or ["a", "b"] pairs. */
static wf_status load_merges_json(wf_tokenizer *t, json_t *merges, const char *path, char *err,
                                  size_t err_len)
{
  size_t i;
  json_t *m;
  json_array_foreach(merges, i, m)
  {
    wf_status st = WF_OK;
    if (json_is_string(m)) {
      const char *s = json_string_value(m), *sp = strchr(s, ' ');
      if (!sp || strchr(sp + 1, ' '))
        return failf(err, err_len, WF_EFORMAT,
                     "tokenizer '%s': merge %zu ('%s') is not two tokens separated by one space",
                     path, i + 1, s);
      st = merge_add(t, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), path, i + 1, err, err_len);
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
      const char *a = json_string_value(json_array_get(m, 0));
      const char *b = json_string_value(json_array_get(m, 1));
      st = merge_add(t, a, strlen(a), b, strlen(b), path, i + 1, err, err_len);
    } else {
      return failf(err, err_len, WF_EFORMAT,
                   "tokenizer '%s': merge %zu is neither \"a b\" nor [\"a\", \"b\"]", path, i + 1);
    }
    if (st != WF_OK)
      return st;
  }
  return WF_OK;
}

/* The pre-tokenizer must be GPT-2's: ByteLevel with its regex, alone or in a Sequence. */
static wf_status check_pre_tokenizer(wf_tokenizer *t, json_t *pre, const char *path, char *err,
                                     size_t err_len)
{
  const char *type = json_string_value(json_object_get(pre, "type"));
  if (type && !strcmp(type, "Sequence") &&
      json_array_size(json_object_get(pre, "pretokenizers")) == 1)
    return check_pre_tokenizer(t, json_array_get(json_object_get(pre, "pretokenizers"), 0), path,
                               err, err_len);
  json_t *use_regex = json_object_get(pre, "use_regex");
  if (!type || strcmp(type, "ByteLevel") || (use_regex && !json_is_true(use_regex)))
    return failf(err, err_len, WF_EUNSUPPORTED,
                 "tokenizer '%s': pre_tokenizer is %s, but weft implements GPT-2's byte-level "
                 "BPE only (pre_tokenizer ByteLevel with use_regex true)",
                 path, type ? type : "missing");
  t->add_prefix_space = json_is_true(json_object_get(pre, "add_prefix_space"));
  return WF_OK;
}

static bool nonempty_string(json_t *j) { return json_is_string(j) && json_string_length(j) > 0; }

static wf_status check_model(json_t *root, json_t *model, const char *path, char *err,
                             size_t err_len)
{
  const char *type = json_string_value(json_object_get(model, "type"));
  json_t *dropout = json_object_get(model, "dropout");
  if (type && strcmp(type, "BPE"))
    return failf(err, err_len, WF_EUNSUPPORTED,
                 "tokenizer '%s': model.type is '%s'; weft implements BPE (GPT-2) only", path,
                 type);
  if (!json_is_object(json_object_get(model, "vocab")) ||
      !json_is_array(json_object_get(model, "merges")))
    return failf(err, err_len, WF_EFORMAT,
                 "tokenizer '%s': model needs a \"vocab\" object and a \"merges\" array", path);
  if (nonempty_string(json_object_get(model, "continuing_subword_prefix")) ||
      nonempty_string(json_object_get(model, "end_of_word_suffix")) ||
      (json_is_number(dropout) && json_number_value(dropout) > 0))
    return failf(err, err_len, WF_EUNSUPPORTED,
                 "tokenizer '%s': subword prefixes, word suffixes and BPE dropout are not "
                 "GPT-2's; weft does not implement them",
                 path);
  json_t *norm = json_object_get(root, "normalizer");
  if (norm && !json_is_null(norm))
    return failf(err, err_len, WF_EUNSUPPORTED,
                 "tokenizer '%s': a normalizer (%s) is set; GPT-2's BPE has none and weft "
                 "implements none",
                 path,
                 json_string_value(json_object_get(norm, "type"))
                     ? json_string_value(json_object_get(norm, "type"))
                     : "?");
  return WF_OK;
}

static wf_status load_added_tokens(wf_tokenizer *t, json_t *added, const char *path, char *err,
                                   size_t err_len)
{
  size_t i;
  json_t *a;
  json_array_foreach(added, i, a)
  {
    json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
    if (!json_is_integer(id) || !json_is_string(content))
      return failf(err, err_len, WF_EFORMAT,
                   "tokenizer '%s': added_tokens[%zu] needs an integer \"id\" and a string "
                   "\"content\"",
                   path, i);
    const char *s = json_string_value(content);
    wf_status st = vocab_add(t, s, strlen(s), (int32_t)json_integer_value(id), path, err, err_len);
    if (st == WF_OK)
      st = special_add(t, s, strlen(s), (int32_t)json_integer_value(id));
    if (st != WF_OK)
      return st;
  }
  return WF_OK;
}

static wf_status load_hf(wf_tokenizer *t, json_t *root, const char *path, char *err, size_t err_len)
{
  json_t *model = json_object_get(root, "model");
  wf_status st = check_model(root, model, path, err, err_len);
  if (st == WF_OK)
    st = check_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), path, err, err_len);
  json_t *merges = json_object_get(model, "merges");
  if (st == WF_OK)
    st = load_vocab_object(t, json_object_get(model, "vocab"), json_array_size(merges), path, err,
                           err_len);
  json_t *added = json_object_get(root, "added_tokens");
  if (st == WF_OK && added && !json_is_array(added))
    st = failf(err, err_len, WF_EFORMAT, "tokenizer '%s': added_tokens is not an array", path);
  if (st == WF_OK && added)
    st = load_added_tokens(t, added, path, err, err_len);
  if (st == WF_OK)
    st = load_merges_json(t, merges, path, err, err_len);
  t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
  return st;
}

/* GPT-2's merges.txt: an optional "#version" line, then "a b" per line. */
static wf_status load_merges_txt(wf_tokenizer *t, const char *path, char *err, size_t err_len)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return failf(err, err_len, WF_EIO, "tokenizer: cannot open '%s': %s", path, strerror(errno));
  char line[2048];
  size_t lineno = 0;
  wf_status st = WF_OK;
  while (st == WF_OK && fgets(line, sizeof line, f)) {
    lineno++;
    size_t n = strcspn(line, "\r\n");
    line[n] = '\0';
    if (n == 0 || (lineno == 1 && !strncmp(line, "#version", 8)))
      continue;
    char *sp = strchr(line, ' ');
    if (!sp || strchr(sp + 1, ' '))
      st = failf(err, err_len, WF_EFORMAT,
                 "tokenizer '%s': line %zu ('%.64s') is not two tokens separated by one space",
                 path, lineno, line);
    else
      st = merge_add(t, line, (size_t)(sp - line), sp + 1, strlen(sp + 1), path, lineno, err,
                     err_len);
  }
  fclose(f);
  return st;
}

static size_t count_lines(const char *path)
{
  FILE *f = fopen(path, "rb");
  size_t n = 0;
  for (int c; f && (c = fgetc(f)) != EOF;)
    n += c == '\n';
  if (f)
    fclose(f);
  return n + 1;
}

static wf_status load_gpt2(wf_tokenizer *t, json_t *vocab, const char *vocab_path, char *err,
                           size_t err_len)
{
  char merges[WF_PATH_MAX + 16];
  const char *slash = strrchr(vocab_path, '/');
  snprintf(merges, sizeof merges, "%.*smerges.txt", slash ? (int)(slash - vocab_path + 1) : 0,
           vocab_path);
  struct stat sb;
  if (stat(merges, &sb) != 0 || !S_ISREG(sb.st_mode))
    return failf(err, err_len, WF_EIO,
                 "tokenizer '%s' is a vocab.json, but there is no merges.txt beside it ('%s')",
                 vocab_path, merges);
  wf_status st = load_vocab_object(t, vocab, count_lines(merges), vocab_path, err, err_len);
  int32_t eot = st == WF_OK ? vocab_find(t, EOT_TEXT, strlen(EOT_TEXT)) : -1;
  if (eot >= 0)
    st = special_add(t, EOT_TEXT, strlen(EOT_TEXT), eot);
  return st == WF_OK ? load_merges_txt(t, merges, err, err_len) : st;
}

/* A folder holds tokenizer.json, or vocab.json with merges.txt. */
static wf_status resolve_path(const char *path, char *out, size_t len, char *err, size_t err_len)
{
  struct stat sb;
  if (stat(path, &sb) != 0)
    return failf(err, err_len, WF_EIO, "data.tokenizer: cannot open '%s': %s", path,
                 strerror(errno));
  if (S_ISREG(sb.st_mode)) {
    snprintf(out, len, "%s", path);
    return WF_OK;
  }
  if (!S_ISDIR(sb.st_mode))
    return failf(err, err_len, WF_EIO,
                 "data.tokenizer: '%s' is not a regular file (a FIFO or a device); name "
                 "tokenizer.json, vocab.json or the folder holding them",
                 path);
  static const char *const names[] = {"tokenizer.json", "vocab.json"};
  for (size_t i = 0; i < WF_ARRAY_LEN(names); i++) {
    snprintf(out, len, "%s/%s", path, names[i]);
    if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode))
      return WF_OK;
  }
  return failf(err, err_len, WF_EIO,
               "data.tokenizer: the folder '%s' holds neither tokenizer.json nor vocab.json", path);
}

wf_status wf_tokenizer_load(wf_tokenizer **out, const char *path, char *err, size_t err_len)
{
  *out = NULL;
  char file[WF_PATH_MAX + 32];
  wf_status st = resolve_path(path, file, sizeof file, err, err_len);
  if (st != WF_OK)
    return st;
  json_error_t jerr;
  json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return failf(err, err_len, WF_EFORMAT,
                 "tokenizer '%s' is not valid JSON: line %d column %d: %s", file, jerr.line,
                 jerr.column, jerr.text);
  wf_tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    json_decref(root);
    return WF_ENOMEM;
  }
  t->eot = -1;
  if (!json_is_object(root))
    st = failf(err, err_len, WF_EFORMAT,
               "tokenizer '%s': expected a JSON object (tokenizer.json or vocab.json)", file);
  else if (json_is_object(json_object_get(root, "model")))
    st = load_hf(t, root, file, err, err_len);
  else
    st = load_gpt2(t, root, file, err, err_len);
  json_decref(root);
  if (st == WF_OK)
    st = finish_tables(t, file, err, err_len);
  if (st == WF_OK)
    st = compile_pattern(t);
  if (st == WF_ENOMEM)
    failf(err, err_len, st, "tokenizer '%s': out of memory", file);
  if (st != WF_OK) {
    wf_tokenizer_destroy(t);
    return st;
  }
  snprintf(t->desc, sizeof t->desc, "GPT-2 BPE '%s': %d tokens, %zu merges", file, t->n_ids,
           t->n_merges);
  *out = t;
  return WF_OK;
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

static wf_status push(wf_tokens *o, int32_t id)
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
  const pair_entry *e = pair_slot(t, pair_key(a, b));
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
  return vocab_find(t, (const char *)buf, k);
}

/* BPE of one pre-token: merge the lowest-ranked adjacent pair (leftmost on a tie) until
 * no pair has a merge. rank[i] caches pair (i, i+1), so a merge costs one scan. */
static wf_status bpe(const wf_tokenizer *t, const unsigned char *p, size_t n, wf_tokens *out)
{
  int32_t whole = t->ignore_merges ? whole_word(t, p, n) : -1;
  if (whole >= 0)
    return push(out, whole);
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
    st = push(out, sym[i]);
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
    const special *sp = &t->specials[i];
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
    st = push(out, t->specials[k].id);
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

/* ---- worker --tokenize ------------------------------------------------------------------------
 */

/* One llm.c token shard, atomically. */
static wf_status write_shard(const char *path, const int32_t *ids, size_t n)
{
  int32_t header[256] = {SHARD_MAGIC, SHARD_VERSION, (int32_t)n};
  wf_afile f;
  wf_status st = wf_afile_open(&f, path, 0644, 0);
  if (st != WF_OK)
    return st;
  st = wf_afile_write(&f, header, sizeof header);
  uint16_t buf[4096];
  for (size_t i = 0; st == WF_OK && i < n; i += WF_ARRAY_LEN(buf)) {
    size_t m = WF_MIN(n - i, WF_ARRAY_LEN(buf));
    for (size_t j = 0; j < m; j++)
      buf[j] = (uint16_t)ids[i + j];
    st = wf_afile_write(&f, buf, m * sizeof *buf);
  }
  if (st != WF_OK) {
    wf_afile_abort(&f);
    return st;
  }
  return wf_afile_commit(&f, NULL, NULL);
}

static wf_status read_text(const char *in, wf_tokenizer const *t, wf_tokens *out, char *err,
                           size_t err_len)
{
  struct stat sb;
  if (stat(in, &sb) != 0)
    return failf(err, err_len, WF_EIO, "--tokenize: cannot open '%s': %s", in, strerror(errno));
  if (!S_ISREG(sb.st_mode))
    return failf(err, err_len, WF_EIO,
                 "--tokenize: '%s' is not a regular file (a FIFO, device or folder); name a "
                 "text file",
                 in);
  int fd = open(in, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return failf(err, err_len, WF_EIO, "--tokenize: cannot open '%s': %s", in, strerror(errno));
  void *map = sb.st_size ? mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (map == MAP_FAILED)
    return failf(err, err_len, WF_EIO, "--tokenize: cannot map '%s': %s", in, strerror(errno));
  wf_status st = t->eot >= 0 ? push(out, t->eot) : WF_OK;
  if (st == WF_OK)
    st = wf_tokenizer_encode(t, map, (size_t)sb.st_size, out);
  if (map)
    munmap(map, (size_t)sb.st_size);
  return st == WF_OK ? WF_OK
                     : failf(err, err_len, st, "--tokenize: out of memory encoding '%s'", in);
}

/* Train shards of SHARD_TOKENS each, then the validation shard. */
static wf_status write_shards(const wf_tokens *tok, size_t n_train, const char *prefix,
                              int *n_files, char *err, size_t err_len)
{
  char path[WF_PATH_MAX + 64];
  *n_files = 0;
  for (size_t at = 0; at < n_train; at += SHARD_TOKENS) {
    snprintf(path, sizeof path, "%s_train_%06d.bin", prefix, (*n_files)++);
    if (write_shard(path, tok->ids + at, WF_MIN(n_train - at, (size_t)SHARD_TOKENS)) != WF_OK)
      return failf(err, err_len, WF_EIO, "--tokenize: cannot write '%s' (see the log above)", path);
  }
  snprintf(path, sizeof path, "%s_val_%06d.bin", prefix, 0);
  if (tok->n > n_train && write_shard(path, tok->ids + n_train, tok->n - n_train) != WF_OK)
    return failf(err, err_len, WF_EIO, "--tokenize: cannot write '%s' (see the log above)", path);
  return WF_OK;
}

wf_status wf_tokenize_file(const wf_tokenizer *t, const char *in, const char *prefix,
                           double val_fraction, char *summary, size_t summary_len, char *err,
                           size_t err_len)
{
  if (t->n_ids > 65536)
    return failf(err, err_len, WF_EUNSUPPORTED,
                 "--tokenize: %s has ids up to %d, but llm.c shards store uint16 tokens (< 65536)",
                 t->desc, t->n_ids - 1);
  if (!(val_fraction >= 0 && val_fraction < 1))
    return failf(err, err_len, WF_ECONFIG, "--tokenize: data.val_fraction=%g is not in [0, 1)",
                 val_fraction);
  wf_tokens tok = {0};
  wf_status st = read_text(in, t, &tok, err, err_len);
  size_t n_val = (size_t)((double)tok.n * val_fraction);
  if (st == WF_OK && (tok.n - n_val == 0 || (val_fraction > 0 && n_val == 0)))
    st = failf(err, err_len, WF_EFORMAT,
               "--tokenize: '%s' gives %zu tokens, too few for a train split and a "
               "validation split of data.val_fraction=%g",
               in, tok.n, val_fraction);
  int files = 0;
  if (st == WF_OK)
    st = write_shards(&tok, tok.n - n_val, prefix, &files, err, err_len);
  if (st == WF_OK)
    snprintf(summary, summary_len,
             "tokenized '%s' with %s: %zu tokens; train %zu in %s_train_%06d.bin%s, val %zu%s%s%s",
             in, t->desc, tok.n, tok.n - n_val, prefix, 0, files > 1 ? " and on" : "", n_val,
             n_val ? " in " : "", n_val ? prefix : "", n_val ? "_val_000000.bin" : " (no file)");
  wf_tokens_free(&tok);
  return st;
}
