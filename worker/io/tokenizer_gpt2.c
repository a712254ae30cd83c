/*
 * tokenizer_gpt2.c - the GPT-2 kind (io_int.h's wf__tok_kind): a Hugging Face
 * tokenizer.json, or GPT-2's vocab.json with merges.txt, read into tokenizer.c's tables.
 *
 * Its files write each token in GPT-2's byte alphabet (bytes_to_unicode() of encoder.py:
 * every byte a visible character); tokens and merges are turned back into raw bytes here,
 * which is what the core's tables hold. A merge's rank is its line (or array) position.
 * The pre-tokenizer is GPT-2's pattern; <|endoftext|> both starts and ends a document.
 * Hugging Face's tokenizer.json for Llama 3 is the same format with Llama 3's
 * pre-tokenizer (a Split by its regex before ByteLevel), ignore_merges, its own specials
 * and a template that starts every text with <|begin_of_text|>: it is read here too, and
 * encodes as Llama 3's tokenizer.model does.
 *
 * Only GPT-2's byte-level BPE is accepted: a model, pre-tokenizer or normalizer that
 * would make the tables encode text differently from GPT-2 (another model type,
 * subword prefixes, dropout, a normalizer, a pre-tokenizer other than ByteLevel with its
 * regex) is refused with what was found, never silently ignored. Errors name the file
 * and, for merges.txt, the line.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io_int.h"

#define EOT_TEXT "<|endoftext|>"

/* ---- GPT-2's byte alphabet ------------------------------------------------------------ */

/* The byte that code point cp stands for in bytes_to_unicode() of encoder.py, or -1:
 * printable Latin-1 bytes stand for themselves; the other 68 (0x00-0x20, 0x7F-0xA0,
 * 0xAD), in byte order, are U+0100 .. U+0143. */
static int byte_of(uint32_t cp)
{
  if ((cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
    return (int)cp;
  uint32_t k = cp - 256;
  return cp < 256 || k >= 68 ? -1 : k < 33 ? (int)k : k < 67 ? (int)(0x7F + k - 33) : 0xAD;
}

/* The raw bytes of token s[0 .. len) written in the alphabet, into out (len bytes at
 * most: every character is one byte); its length, or -1 when s is not in the alphabet. */
static long from_alphabet(unsigned char *out, const char *s, size_t len)
{
  size_t i = 0, n = 0;
  const unsigned char *u = (const unsigned char *)s;
  while (i < len) {
    size_t k = wf_utf8_char_len(u + i, len - i);
    int b = k == 1   ? byte_of(u[i])
            : k == 2 ? byte_of((uint32_t)(u[i] & 0x1F) << 6 | (u[i + 1] & 0x3F))
                     : -1;
    if (b < 0)
      return -1;
    out[n++] = (unsigned char)b;
    i += k;
  }
  return (long)n;
}

/* A vocabulary entry written in the alphabet, as raw bytes. */
static wf_status add_alphabet_token(wf_tokenizer *t, const char *s, int32_t id, const char *path,
                                    char *err, size_t err_len)
{
  size_t len = strlen(s);
  unsigned char stack[256], *buf = len <= sizeof stack ? stack : malloc(len);
  if (!buf)
    return WF_ENOMEM;
  long n = from_alphabet(buf, s, len);
  wf_status st =
      n > 0 ? wf__tok_vocab_add(t, buf, (size_t)n, id, NULL, path, err, err_len)
            : wf__io_failf(err, err_len, WF_EFORMAT,
                           "tokenizer '%s': token '%.64s' (id %d) is not written in GPT-2's byte "
                           "alphabet; only byte-level BPE vocabularies are supported",
                           path, s, id);
  if (buf != stack)
    free(buf);
  return st;
}

/* Merge `rank` of a and b (alphabet strings): their ids and the id of a + b. */
static wf_status merge_add(wf_tokenizer *t, const char *a, size_t la, const char *b, size_t lb,
                           const char *path, size_t line, char *err, size_t err_len)
{
  unsigned char buf[1024];
  long na = la + lb <= sizeof buf ? from_alphabet(buf, a, la) : -1;
  long nb = na >= 0 ? from_alphabet(buf + na, b, lb) : -1;
  if (la + lb > sizeof buf)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s': merge %zu is longer than %zu bytes", path, line,
                        sizeof buf);
  int32_t ia = na > 0 ? wf__tok_vocab_find(t, buf, (size_t)na) : -1;
  int32_t ib = nb > 0 ? wf__tok_vocab_find(t, buf + na, (size_t)nb) : -1;
  int32_t im = ia >= 0 && ib >= 0 ? wf__tok_vocab_find(t, buf, (size_t)(na + nb)) : -1;
  /* the missing one: a, else b, else a + b */
  int show_a = ia < 0 || ib >= 0 ? (int)WF_MIN(la, 64) : 0,
      show_b = ia >= 0 ? (int)WF_MIN(lb, 64) : 0;
  if (ia < 0 || ib < 0 || im < 0)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s': merge %zu ('%.*s' '%.*s') names a token that is not in "
                        "the vocabulary ('%.*s%.*s')",
                        path, line, (int)WF_MIN(la, 64), a, (int)WF_MIN(lb, 64), b, show_a, a,
                        show_b, b);
  return wf__tok_pair_add(t, ia, ib, (int32_t)line, im) == WF_OK
             ? WF_OK
             : wf__io_failf(err, err_len, WF_EFORMAT, "tokenizer '%s': more merges than announced",
                            path);
}

static wf_status load_vocab_object(wf_tokenizer *t, json_t *vocab, size_t n_merges,
                                   const char *path, char *err, size_t err_len)
{
  wf_status st = wf__tok_tables_init(t, json_object_size(vocab), n_merges);
  const char *key;
  json_t *val;
  json_object_foreach(vocab, key, val)
  {
    if (st != WF_OK)
      break;
    if (!json_is_integer(val))
      return wf__io_failf(err, err_len, WF_EFORMAT,
                          "tokenizer '%s': vocabulary entry '%s' is not an integer id", path, key);
    st = add_alphabet_token(t, key, (int32_t)json_integer_value(val), path, err, err_len);
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
        return wf__io_failf(
            err, err_len, WF_EFORMAT,
            "tokenizer '%s': merge %zu ('%s') is not two tokens separated by one space", path,
            i + 1, s);
      st = merge_add(t, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), path, i + 1, err, err_len);
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
      const char *a = json_string_value(json_array_get(m, 0));
      const char *b = json_string_value(json_array_get(m, 1));
      st = merge_add(t, a, strlen(a), b, strlen(b), path, i + 1, err, err_len);
    } else {
      return wf__io_failf(err, err_len, WF_EFORMAT,
                          "tokenizer '%s': merge %zu is neither \"a b\" nor [\"a\", \"b\"]", path,
                          i + 1);
    }
    if (st != WF_OK)
      return st;
  }
  return WF_OK;
}

/* Llama 3's pre-tokenizer as its tokenizer.json writes it: Split by this regex
 * (isolated), then ByteLevel without GPT-2's regex. */
static const char llama3_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static bool is_type(json_t *j, const char *type)
{
  const char *t = json_string_value(json_object_get(j, "type"));
  return t && !strcmp(t, type);
}

static bool is_llama3_split(json_t *pre)
{
  const char *re = json_string_value(json_object_get(json_object_get(pre, "pattern"), "Regex"));
  const char *behavior = json_string_value(json_object_get(pre, "behavior"));
  return is_type(pre, "Split") && re && !strcmp(re, llama3_regex) && behavior &&
         !strcmp(behavior, "Isolated") && !json_is_true(json_object_get(pre, "invert"));
}

/* The pre-tokenizer must be GPT-2's (ByteLevel with its regex, alone or in a Sequence) or
 * Llama 3's (Split by Llama 3's regex, then ByteLevel without one). */
static wf_status check_pre_tokenizer(wf_tokenizer *t, json_t *pre, const char *path, char *err,
                                     size_t err_len)
{
  const char *type = json_string_value(json_object_get(pre, "type"));
  json_t *list = json_object_get(pre, "pretokenizers"), *last = json_array_get(list, 1);
  if (is_type(pre, "Sequence") && json_array_size(list) == 1)
    return check_pre_tokenizer(t, json_array_get(list, 0), path, err, err_len);
  if (is_type(pre, "Sequence") && json_array_size(list) == 2 &&
      is_llama3_split(json_array_get(list, 0)) && is_type(last, "ByteLevel") &&
      json_is_false(json_object_get(last, "use_regex"))) {
    t->pattern = wf__tok_llama3_pattern, t->name = wf__tok_llama3.name;
    t->add_prefix_space = json_is_true(json_object_get(last, "add_prefix_space"));
    return WF_OK;
  }
  json_t *use_regex = json_object_get(pre, "use_regex");
  if (!type || strcmp(type, "ByteLevel") || (use_regex && !json_is_true(use_regex)))
    return wf__io_failf(
        err, err_len, WF_EUNSUPPORTED,
        "tokenizer '%s': pre_tokenizer is %s, but weft implements GPT-2's (ByteLevel with "
        "use_regex true) and Llama 3's (a Sequence of Split by Llama 3's regex and ByteLevel)",
        path, type ? type : "missing");
  t->add_prefix_space = json_is_true(json_object_get(pre, "add_prefix_space"));
  return WF_OK;
}

/* HF's post-processor: a TemplateProcessing whose single-text template starts with a
 * special token puts that token before every text (Llama 3's <|begin_of_text|>). */
static void template_bos(wf_tokenizer *t, json_t *post)
{
  json_t *list = json_object_get(post, "processors");
  for (size_t i = 0; is_type(post, "Sequence") && i < json_array_size(list); i++)
    template_bos(t, json_array_get(list, i));
  json_t *first = json_array_get(json_object_get(post, "single"), 0);
  const char *name =
      json_string_value(json_object_get(json_object_get(first, "SpecialToken"), "id"));
  int id = is_type(post, "TemplateProcessing") && name ? wf_tokenizer_special(t, name) : -1;
  if (id >= 0)
    t->bos = id, t->adds_bos = true;
}

static bool nonempty_string(json_t *j) { return json_is_string(j) && json_string_length(j) > 0; }

static wf_status check_model(json_t *root, json_t *model, const char *path, char *err,
                             size_t err_len)
{
  const char *type = json_string_value(json_object_get(model, "type"));
  json_t *dropout = json_object_get(model, "dropout");
  if (type && strcmp(type, "BPE"))
    return wf__io_failf(err, err_len, WF_EUNSUPPORTED,
                        "tokenizer '%s': model.type is '%s'; weft implements BPE (GPT-2) only",
                        path, type);
  if (!json_is_object(json_object_get(model, "vocab")) ||
      !json_is_array(json_object_get(model, "merges")))
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s': model needs a \"vocab\" object and a \"merges\" array",
                        path);
  if (nonempty_string(json_object_get(model, "continuing_subword_prefix")) ||
      nonempty_string(json_object_get(model, "end_of_word_suffix")) ||
      (json_is_number(dropout) && json_number_value(dropout) > 0))
    return wf__io_failf(err, err_len, WF_EUNSUPPORTED,
                        "tokenizer '%s': subword prefixes, word suffixes and BPE dropout are not "
                        "GPT-2's; weft does not implement them",
                        path);
  json_t *norm = json_object_get(root, "normalizer");
  if (norm && !json_is_null(norm))
    return wf__io_failf(err, err_len, WF_EUNSUPPORTED,
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
      return wf__io_failf(err, err_len, WF_EFORMAT,
                          "tokenizer '%s': added_tokens[%zu] needs an integer \"id\" and a string "
                          "\"content\"",
                          path, i);
    const char *s = json_string_value(content); /* raw text, not the byte alphabet */
    wf_status st = wf__tok_vocab_add(t, s, strlen(s), (int32_t)json_integer_value(id), NULL, path,
                                     err, err_len);
    if (st == WF_OK)
      st = wf__tok_special_add(t, s, strlen(s), (int32_t)json_integer_value(id));
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
    st = wf__io_failf(err, err_len, WF_EFORMAT, "tokenizer '%s': added_tokens is not an array",
                      path);
  if (st == WF_OK && added)
    st = load_added_tokens(t, added, path, err, err_len);
  if (st == WF_OK)
    st = load_merges_json(t, merges, path, err, err_len);
  t->whole_first = json_is_true(json_object_get(model, "ignore_merges"));
  return st;
}

/* GPT-2's merges.txt: an optional "#version" line, then "a b" per line. */
static wf_status load_merges_txt(wf_tokenizer *t, const char *path, char *err, size_t err_len)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return wf__io_failf(err, err_len, WF_EIO, "tokenizer: cannot open '%s': %s", path,
                        strerror(errno));
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
      st = wf__io_failf(
          err, err_len, WF_EFORMAT,
          "tokenizer '%s': line %zu ('%.64s') is not two tokens separated by one space", path,
          lineno, line);
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
    return wf__io_failf(
        err, err_len, WF_EIO,
        "tokenizer '%s' is a vocab.json, but there is no merges.txt beside it ('%s')", vocab_path,
        merges);
  wf_status st = load_vocab_object(t, vocab, count_lines(merges), vocab_path, err, err_len);
  int32_t eot = st == WF_OK ? wf__tok_vocab_find(t, EOT_TEXT, strlen(EOT_TEXT)) : -1;
  if (eot >= 0)
    st = wf__tok_special_add(t, EOT_TEXT, strlen(EOT_TEXT), eot);
  return st == WF_OK ? load_merges_txt(t, merges, err, err_len) : st;
}

/* GPT-2's files are JSON: the first byte that is not white space opens an object. */
static bool claims(const char *path, const unsigned char *head, size_t n)
{
  (void)path;
  size_t i = 0;
  while (i < n && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r'))
    i++;
  return i < n && head[i] == '{';
}

static wf_status load(wf_tokenizer *t, const char *file, char *err, size_t err_len)
{
  t->pattern = wf__tok_gpt2_pattern; /* unless the pre-tokenizer is Llama 3's */
  json_error_t jerr;
  json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s' is not valid JSON: line %d column %d: %s", file, jerr.line,
                        jerr.column, jerr.text);
  wf_status st;
  if (!json_is_object(root))
    st =
        wf__io_failf(err, err_len, WF_EFORMAT,
                     "tokenizer '%s': expected a JSON object (tokenizer.json or vocab.json)", file);
  else if (json_is_object(json_object_get(root, "model")))
    st = load_hf(t, root, file, err, err_len);
  else
    st = load_gpt2(t, root, file, err, err_len);
  /* GPT-2: <|endoftext|> both separates documents (as llm.c writes them) and ends a text;
   * a Llama 3 tokenizer.json has its own pair, and says in its template to start texts */
  int eot = wf_tokenizer_special(t, EOT_TEXT), end = wf_tokenizer_special(t, "<|end_of_text|>");
  int begin = wf_tokenizer_special(t, "<|begin_of_text|>");
  t->eot = end >= 0 ? end : eot, t->bos = begin >= 0 ? begin : eot;
  if (st == WF_OK)
    template_bos(t, json_object_get(root, "post_processor"));
  json_decref(root);
  return st;
}

const wf__tok_kind wf__tok_gpt2 = {
    .version = WF__TOK_KIND_VERSION,
    .name = "GPT-2 BPE",
    .files = "tokenizer.json, or vocab.json with merges.txt",
    .claims = claims,
    .load = load,
};
