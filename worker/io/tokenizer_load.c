/*
 * tokenizer_load.c - wf_tokenizer_load: a Hugging Face tokenizer.json, or GPT-2's
 * vocab.json with merges.txt, read into tokenizer.c's tables.
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
    st = wf__tok_vocab_add(t, key, strlen(key), (int32_t)json_integer_value(val), path, err,
                           err_len);
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
      st = wf__tok_merge_add(t, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), path, i + 1, err,
                             err_len);
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
      const char *a = json_string_value(json_array_get(m, 0));
      const char *b = json_string_value(json_array_get(m, 1));
      st = wf__tok_merge_add(t, a, strlen(a), b, strlen(b), path, i + 1, err, err_len);
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
    return wf__io_failf(
        err, err_len, WF_EUNSUPPORTED,
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
    const char *s = json_string_value(content);
    wf_status st =
        wf__tok_vocab_add(t, s, strlen(s), (int32_t)json_integer_value(id), path, err, err_len);
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
  t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
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
      st = wf__tok_merge_add(t, line, (size_t)(sp - line), sp + 1, strlen(sp + 1), path, lineno,
                             err, err_len);
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
  int32_t eot =
      st == WF_OK ? wf__tok_vocab_find(t, WF__TOK_EOT_TEXT, strlen(WF__TOK_EOT_TEXT)) : -1;
  if (eot >= 0)
    st = wf__tok_special_add(t, WF__TOK_EOT_TEXT, strlen(WF__TOK_EOT_TEXT), eot);
  return st == WF_OK ? load_merges_txt(t, merges, err, err_len) : st;
}

/* A folder holds tokenizer.json, or vocab.json with merges.txt. */
static wf_status resolve_path(const char *path, char *out, size_t len, char *err, size_t err_len)
{
  struct stat sb;
  if (stat(path, &sb) != 0)
    return wf__io_failf(err, err_len, WF_EIO, "data.tokenizer: cannot open '%s': %s", path,
                        strerror(errno));
  if (S_ISREG(sb.st_mode)) {
    snprintf(out, len, "%s", path);
    return WF_OK;
  }
  if (!S_ISDIR(sb.st_mode))
    return wf__io_failf(err, err_len, WF_EIO,
                        "data.tokenizer: '%s' is not a regular file (a FIFO or a device); name "
                        "tokenizer.json, vocab.json or the folder holding them",
                        path);
  static const char *const names[] = {"tokenizer.json", "vocab.json"};
  for (size_t i = 0; i < WF_ARRAY_LEN(names); i++) {
    snprintf(out, len, "%s/%s", path, names[i]);
    if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode))
      return WF_OK;
  }
  return wf__io_failf(err, err_len, WF_EIO,
                      "data.tokenizer: the folder '%s' holds neither tokenizer.json nor vocab.json",
                      path);
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
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "tokenizer '%s' is not valid JSON: line %d column %d: %s", file, jerr.line,
                        jerr.column, jerr.text);
  wf_tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    json_decref(root);
    return WF_ENOMEM;
  }
  t->eot = -1;
  if (!json_is_object(root))
    st =
        wf__io_failf(err, err_len, WF_EFORMAT,
                     "tokenizer '%s': expected a JSON object (tokenizer.json or vocab.json)", file);
  else if (json_is_object(json_object_get(root, "model")))
    st = load_hf(t, root, file, err, err_len);
  else
    st = load_gpt2(t, root, file, err, err_len);
  json_decref(root);
  if (st == WF_OK)
    st = wf__tok_finish(t, file, err, err_len);
  if (st == WF_ENOMEM)
    wf__io_failf(err, err_len, st, "tokenizer '%s': out of memory", file);
  if (st != WF_OK) {
    wf_tokenizer_destroy(t);
    return st;
  }
  snprintf(t->desc, sizeof t->desc, "GPT-2 BPE '%s': %d tokens, %zu merges", file, t->n_ids,
           t->n_merges);
  *out = t;
  return WF_OK;
}
