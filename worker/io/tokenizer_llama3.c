/*
 * tokenizer_llama3.c - the Llama 3 kind (io_int.h's wf__tok_kind): tiktoken's ranks file,
 * which is what Meta ships as tokenizer.model, read into tokenizer.c's tables.
 *
 * The file: one token per line, "BASE64 RANK", the token's raw bytes in standard base64
 * (RFC 4648, padded) and its rank in decimal; ranks run 0, 1, 2, ... in file order
 * (Llama 3: 128000 of them, the first 100256 being cl100k_base's). Empty lines are
 * skipped, as tiktoken's load_tiktoken_bpe does. tiktoken's BPE merges the adjacent pair
 * whose concatenation has the lowest rank; so every split of a token into two tokens is
 * a pair whose rank is that token's, which is what the core's pair table is given.
 *
 * Special tokens are not in the file: Meta's tokenizer.py appends 256 after the ranks.
 * Their names are Llama 3.1's (Meta's and Hugging Face's tokenizer.json for Llama 3.1,
 * 3.2 and 3.3): the ids every Llama 3 uses (<|begin_of_text|>, <|end_of_text|>,
 * <|start_header_id|>, <|end_header_id|>, <|eot_id|>) are the same in Llama 3.0, whose
 * names differ only for 128004, 128005, 128008, 128010 and the reserved numbering.
 *
 * Errors name the file and the line: a line that is not "BASE64 RANK", base64 that does
 * not decode, a rank out of order, the same token twice, a byte without a token.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io_int.h"

#define N_SPECIALS 256

/* Llama 3.1's named specials at ranks + 0 .. 10; the rest are reserved_special_token_3 ..
 * _247 at ranks + 11 .. 255. */
static const char *const named[] = {
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
};

/* ---- the file ----------------------------------------------------------------------- */

/* Standard base64 (RFC 4648, padded, no line breaks) of s[0 .. n) into out; the decoded
 * length, or -1 when s is not that. Strict on purpose: a ranks file with anything else
 * in it is damaged, and saying so beats reading a different token. */
static long unbase64(unsigned char *out, const char *s, size_t n)
{
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (n == 0 || n % 4)
    return -1;
  size_t pad = s[n - 1] == '=' ? s[n - 2] == '=' ? 2 : 1 : 0;
  uint32_t acc = 0;
  long len = 0;
  for (size_t i = 0; i < n - pad; i++) {
    const char *c = s[i] ? memchr(tab, s[i], 64) : NULL;
    if (!c)
      return -1;
    acc = acc << 6 | (uint32_t)(c - tab);
    if (i % 4 == 3)
      out[len++] = (unsigned char)(acc >> 16), out[len++] = (unsigned char)(acc >> 8),
      out[len++] = (unsigned char)acc;
  }
  if (pad == 2)
    out[len++] = (unsigned char)(acc >> 4);
  else if (pad == 1)
    out[len++] = (unsigned char)(acc >> 10), out[len++] = (unsigned char)(acc >> 2);
  return len;
}

/* The whole file, NUL-terminated, and its token lines (non-empty lines) counted. */
static wf_status read_all(const char *path, char **text, size_t *len, size_t *lines, char *err,
                          size_t err_len)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return wf__io_failf(err, err_len, WF_EIO, "tokenizer: cannot open '%s': %s", path,
                        strerror(errno));
  char *buf = NULL;
  long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  bool ok = size >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)size + 1)) &&
            fread(buf, 1, (size_t)size, f) == (size_t)size;
  fclose(f);
  if (!ok) {
    free(buf);
    return wf__io_failf(err, err_len, WF_EIO, "tokenizer: cannot read '%s'", path);
  }
  buf[size] = '\0';
  *lines = 0;
  for (long i = 0; i < size; i++)
    *lines += buf[i] != '\n' && (i + 1 == size || buf[i + 1] == '\n');
  *text = buf, *len = (size_t)size;
  return WF_OK;
}

/* One "BASE64 RANK" line (line[0 .. n), no newline) as the token of rank `rank`. */
static wf_status parse_line(wf_tokenizer *t, const char *line, size_t n, int32_t rank,
                            const char *path, size_t lineno, char *err, size_t err_len)
{
  const char *sp = memchr(line, ' ', n);
  char *end = NULL;
  long r = -1;
  if (sp && sp + 1 < line + n && sp[1] >= '0' && sp[1] <= '9') {
    errno = 0;
    r = strtol(sp + 1, &end, 10);
  }
  if (!sp || !end || end != line + n || errno)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s': line %zu ('%.*s') is not \"BASE64 RANK\" (tiktoken's "
                        "ranks file, as Llama 3's tokenizer.model)",
                        path, lineno, (int)WF_MIN(n, 64), line);
  unsigned char bytes[1024];
  long len =
      (size_t)(sp - line) <= 4 * sizeof bytes / 3 ? unbase64(bytes, line, (size_t)(sp - line)) : -1;
  if (len <= 0)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s': line %zu: '%.*s' is not a token in base64 (at most %zu "
                        "bytes)",
                        path, lineno, (int)WF_MIN(sp - line, 64), line, sizeof bytes);
  if (r != rank)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s': line %zu has rank %ld, expected %d: the ranks must run "
                        "0, 1, 2, ... in file order",
                        path, lineno, r, rank);
  bool added = false;
  wf_status st = wf__tok_vocab_add(t, bytes, (size_t)len, rank, &added, path, err, err_len);
  if (st == WF_OK && !added)
    return wf__io_failf(
        err, err_len, WF_EFORMAT, "tokenizer '%s': line %zu repeats the token of rank %d ('%.*s')",
        path, lineno, wf__tok_vocab_find(t, bytes, (size_t)len), (int)WF_MIN(sp - line, 64), line);
  return st;
}

static wf_status parse_ranks(wf_tokenizer *t, char *text, size_t size, const char *path, char *err,
                             size_t err_len)
{
  int32_t rank = 0;
  size_t lineno = 0;
  for (char *p = text; p < text + size;) {
    char *nl = memchr(p, '\n', (size_t)(text + size - p));
    size_t full = nl ? (size_t)(nl - p) : (size_t)(text + size - p), n = full;
    lineno++;
    if (n > 0 && p[n - 1] == '\r')
      n--;
    if (n > 0) {
      wf_status st = parse_line(t, p, n, rank++, path, lineno, err, err_len);
      if (st != WF_OK)
        return st;
    }
    p += full + (nl != NULL);
  }
  return WF_OK;
}

/* ---- the pair table: every two-token split of every token, at that token's rank ---- */

/* Visit each split of token `e` into two tokens; with t->pairs set, add it. */
static size_t splits(wf_tokenizer *t, const wf__tok_str *e, bool add)
{
  size_t n = 0;
  for (uint32_t k = 1; k < e->len; k++) {
    int32_t a = wf__tok_vocab_find(t, e->s, k),
            b = a < 0 ? -1 : wf__tok_vocab_find(t, e->s + k, e->len - k);
    if (b < 0)
      continue;
    n++;
    if (add)
      wf__tok_pair_add(t, a, b, e->id, e->id); /* sized by the counting pass: cannot fail */
  }
  return n;
}

static wf_status build_pairs(wf_tokenizer *t)
{
  size_t n = 0;
  for (size_t i = 0; i < t->vocab_cap; i++)
    n += t->vocab[i].s ? splits(t, &t->vocab[i], false) : 0;
  t->pairs_cap = 16;
  while (t->pairs_cap < 2 * n + 2)
    t->pairs_cap <<= 1;
  free(t->pairs);
  t->pairs = malloc(t->pairs_cap * sizeof *t->pairs);
  if (!t->pairs)
    return WF_ENOMEM;
  for (size_t i = 0; i < t->pairs_cap; i++)
    t->pairs[i].key = UINT64_MAX;
  for (size_t i = 0; i < t->vocab_cap; i++)
    if (t->vocab[i].s)
      splits(t, &t->vocab[i], true);
  return WF_OK;
}

/* ---- the kind ------------------------------------------------------------------------ */

static wf_status add_specials(wf_tokenizer *t, int32_t first)
{
  char name[48];
  wf_status st = WF_OK;
  for (int i = 0; st == WF_OK && i < N_SPECIALS; i++) {
    if (i < (int)WF_ARRAY_LEN(named))
      snprintf(name, sizeof name, "%s", named[i]);
    else
      snprintf(name, sizeof name, "<|reserved_special_token_%d|>", i - 8);
    st = wf__tok_special_add(t, name, strlen(name), first + i);
  }
  t->bos = first, t->eot = first + 1;
  t->adds_bos = true; /* Meta's generation encodes prompts with bos=True */
  return st;
}

/* A ranks file's first line is "BASE64 RANK". */
static bool claims(const char *path, const unsigned char *head, size_t n)
{
  (void)path;
  size_t i = 0;
  while (i < n && (isalnum(head[i]) || head[i] == '+' || head[i] == '/' || head[i] == '='))
    i++;
  if (i == 0 || i == n || head[i++] != ' ' || i == n || !isdigit(head[i]))
    return false;
  while (i < n && isdigit(head[i]))
    i++;
  return i == n || head[i] == '\n' || head[i] == '\r';
}

static wf_status load(wf_tokenizer *t, const char *path, char *err, size_t err_len)
{
  char *text = NULL;
  size_t size = 0, lines = 0;
  wf_status st = read_all(path, &text, &size, &lines, err, err_len);
  if (st == WF_OK)
    st = wf__tok_tables_init(t, lines, 0);
  if (st == WF_OK)
    st = parse_ranks(t, text, size, path, err, err_len);
  free(text);
  if (st == WF_OK && lines + N_SPECIALS > (size_t)1 << 30)
    st = wf__io_failf(err, err_len, WF_EFORMAT, "tokenizer '%s': %zu ranks, more than 2^30", path,
                      lines);
  if (st == WF_OK)
    st = build_pairs(t);
  if (st == WF_OK)
    st = add_specials(t, (int32_t)t->vocab_n);
  t->pattern = wf__tok_llama3_pattern;
  t->whole_first = true; /* tiktoken: a pre-token that is a token is that token */
  return st;
}

const wf__tok_kind wf__tok_llama3 = {
    .version = WF__TOK_KIND_VERSION,
    .name = "Llama 3 BPE",
    .files = "tiktoken's ranks file, Llama 3's tokenizer.model",
    .claims = claims,
    .load = load,
};
