/*
 * data.c - the data sources behind wf_data_* (wf_io.h).
 *
 * Files are mmap()ed, never copied: llm.c shard sets run to tens of GB. A source is a
 * list of spans (one per file) that together form one token stream; the train split is
 * its head and the validation split its tail, and a window of T+1 tokens is drawn
 * wholly inside one split (it may cross from one shard into the next). With
 * data.val_path the validation files' spans follow the training files' and the split
 * falls between them. Text under data.tokenizer is encoded once at open into an int32
 * span the source owns (so a corpus worth tens of GB belongs in `worker --tokenize`
 * shards); text without one is its own bytes.
 *
 * Nothing is opened before stat() says it is a regular file: open() on a FIFO blocks
 * until a writer comes, so a FIFO, device or folder named as data is refused up front
 * (and files are opened O_NONBLOCK, so one swapped in between cannot block either).
 *
 * Every random choice is a Philox value keyed by (seed, stream, index), so a row never
 * depends on which rank or micro-batch asks for it:
 *   stream = DATA_TAG << 48 | split << 47 | index (the step, or the eval batch),
 *   counter = global row (files: the window start) or row << 32 | t (synthetic tokens).
 * The tag keeps data streams apart from the model's init streams (kind * 4096 + layer),
 * which use the same seed.
 *
 * The synthetic source's Markov chain is synthetic.c's; data.source's streams are
 * datastream.c's (wf_data holds one and passes batches and positions through).
 * Invariants: every token handed out is < the model's vocabulary; files are checked
 * once, at open, so a batch can never fail on bad data half-way through training.
 *
 * Test hooks (read once): WEFT_TEST_DATA_FAIL=R:S makes world rank R's training batches
 * of step S fail with WF_EIO, as a shard on a failing disk would, so a test can fail
 * one rank alone in the middle of a pipeline schedule; WEFT_TEST_DATA_STALL=R:S makes
 * that read hang instead (a stuck file system), for the hang diagnosis.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_int.h"

#define SHARD_HEADER_BYTES 1024     /* int32[256] */
#define CKPT_MAGIC         20240326 /* an llm.c model checkpoint, a common mix-up */
#define DATA_TAG           0xDA7Aull

typedef struct span {
  void *map;        /* the whole file */
  size_t map_len;   /* bytes mapped */
  int32_t *own;     /* tokenized text: the ids (malloc'd), else NULL */
  const void *tok;  /* first token: uint8 (text), uint16 or uint32 (shard), int32 (tokenized) */
  int width;        /* bytes per token */
  int64_t first, n; /* position of the first token in the stream, token count */
} span;

/* What a data path names, judged without opening anything that can block. */
typedef enum src_kind { SRC_TEXT = 0, SRC_SHARDS } src_kind;

struct wf_data {
  wf_data_kind kind;
  wf__dstream *ds; /* data.source's streams (datastream.c), else NULL */
  int vocab, T, batch_size;
  uint64_t seed;
  span *spans;
  int n_spans, cap_spans;
  int64_t n_tokens, n_train; /* validation = [n_train, n_tokens) */
  wf__chain ch;
  char desc[4 * WF_PATH_MAX + 512]; /* paths of data, validation data and tokenizer */
};

/* ---- helpers ------------------------------------------------------------------- */

static uint64_t data_stream(wf_data_split split, int64_t index)
{
  return DATA_TAG << 48 | (uint64_t)split << 47 | ((uint64_t)index & ((1ull << 47) - 1));
}

/* ---- files ----------------------------------------------------------------------- */

/* WF_OK when `path` is a regular file; else what it is, named for the key that gave it.
 * stat() never blocks, where open() of a FIFO waits for a writer. */
static wf_status check_regular(const char *key, const char *path, char *err, size_t err_len)
{
  struct stat sb;
  if (stat(path, &sb) != 0) {
    snprintf(err, err_len, "%s: cannot open '%s': %s", key, path, strerror(errno));
    return WF_EIO;
  }
  if (S_ISREG(sb.st_mode))
    return WF_OK;
  if (S_ISDIR(sb.st_mode)) {
    snprintf(err, err_len,
             "%s: '%s' is a folder; name a file, or the llm.c shards in it with a glob such as "
             "'%s/*.bin'",
             key, path, path);
    return WF_ECONFIG;
  }
  snprintf(err, err_len,
           "%s: '%s' is %s, not a regular file; weft maps its data and reads it at random "
           "offsets, so write the data to a file first",
           key, path,
           S_ISFIFO(sb.st_mode)                         ? "a FIFO (named pipe)"
           : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
           : S_ISSOCK(sb.st_mode)                       ? "a socket"
                                                        : "something else");
  return WF_ECONFIG;
}

/* O_NONBLOCK: should a FIFO be swapped in after the stat(), open() still returns. */
static int open_regular(const char *key, const char *path, struct stat *sb, wf_status *st,
                        char *err, size_t err_len)
{
  *st = check_regular(key, path, err, err_len);
  if (*st != WF_OK)
    return -1;
  *st = WF_EIO;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, err_len, "%s: cannot open '%s': %s", key, path, strerror(errno));
    return -1;
  }
  if (fstat(fd, sb) < 0 || !S_ISREG(sb->st_mode)) {
    snprintf(err, err_len, "%s: '%s' is not a regular file", key, path);
    close(fd);
    return -1;
  }
  *st = WF_OK;
  return fd;
}

static wf_status map_file(span *sp, const char *key, const char *path, char *err, size_t err_len)
{
  struct stat sb;
  wf_status st;
  int fd = open_regular(key, path, &sb, &st, err, err_len);
  if (fd < 0)
    return st;
  if (sb.st_size > 0) {
    sp->map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (sp->map == MAP_FAILED) {
      sp->map = NULL;
      snprintf(err, err_len, "%s: cannot map '%s': %s", key, path, strerror(errno));
      st = WF_EIO;
    } else {
      sp->map_len = (size_t)sb.st_size;
    }
  }
  close(fd);
  return st;
}

/* The header's token width: 2 for GPT-2's form, 4 for the "llama-3" form, 0 for neither. */
static int shard_width(const int32_t h[2])
{
  return h[0] == WF__SHARD_MAGIC16 && h[1] == WF__SHARD_VERSION16   ? 2
         : h[0] == WF__SHARD_MAGIC32 && h[1] == WF__SHARD_VERSION32 ? 4
                                                                    : 0;
}

static wf_status check_shard_header(const void *head, size_t file_len, const char *path, int *width,
                                    char *err, size_t err_len)
{
  int32_t h[3];
  if (file_len < SHARD_HEADER_BYTES) {
    snprintf(err, err_len,
             "llm.c shard '%s' is truncated: %zu bytes, but the header alone is %d bytes "
             "(int32[256])",
             path, file_len, SHARD_HEADER_BYTES);
    return WF_EFORMAT;
  }
  memcpy(h, head, sizeof h);
  if (h[0] != WF__SHARD_MAGIC16 && h[0] != WF__SHARD_MAGIC32) {
    snprintf(err, err_len,
             "llm.c shard '%s': bad magic %d, expected %d (uint16 tokens) or %d (uint32 tokens)%s",
             path, h[0], WF__SHARD_MAGIC16, WF__SHARD_MAGIC32,
             h[0] == CKPT_MAGIC ? "; this is a model checkpoint, pass it as model.init" : "");
    return WF_EFORMAT;
  }
  if (!(*width = shard_width(h))) {
    snprintf(err, err_len, "llm.c shard '%s': unsupported version %d, expected %d (magic %d)", path,
             h[1], h[0] == WF__SHARD_MAGIC16 ? WF__SHARD_VERSION16 : WF__SHARD_VERSION32, h[0]);
    return WF_EFORMAT;
  }
  if (h[2] <= 0) {
    snprintf(err, err_len, "llm.c shard '%s': header says %d tokens, expected at least 1", path,
             h[2]);
    return WF_EFORMAT;
  }
  size_t need = SHARD_HEADER_BYTES + (size_t)*width * (size_t)h[2];
  if (file_len < need) {
    snprintf(err, err_len,
             "llm.c shard '%s' is truncated: the header says %d tokens (%zu bytes with the "
             "header) but the file has %zu bytes",
             path, h[2], need, file_len);
    return WF_EFORMAT;
  }
  if (file_len > need) {
    snprintf(err, err_len,
             "llm.c shard '%s': the header's token count %d disagrees with the file size: "
             "%zu bytes after the header hold %zu tokens of %d bytes",
             path, h[2], file_len - SHARD_HEADER_BYTES,
             (file_len - SHARD_HEADER_BYTES) / (size_t)*width, *width);
    return WF_EFORMAT;
  }
  return WF_OK;
}

/* The token at index i of a mapped shard. */
static uint32_t shard_token(const span *sp, int64_t i)
{
  return sp->width == 2 ? ((const uint16_t *)sp->tok)[i] : ((const uint32_t *)sp->tok)[i];
}

/* Header, size and token range of one mapped shard; sets sp->tok, width and n. */
static wf_status check_shard(span *sp, const char *path, int vocab, char *err, size_t err_len)
{
  wf_status st = check_shard_header(sp->map, sp->map_len, path, &sp->width, err, err_len);
  if (st != WF_OK)
    return st;
  sp->tok = (const unsigned char *)sp->map + SHARD_HEADER_BYTES;
  sp->n = (int64_t)(sp->map_len - SHARD_HEADER_BYTES) / sp->width;
  for (int64_t i = 0; i < sp->n; i++) {
    if (shard_token(sp, i) >= (uint32_t)vocab) {
      snprintf(err, err_len,
               "llm.c shard '%s': token %u at index %lld is not below the model's vocabulary "
               "%d; use a model whose vocabulary covers the tokenizer (GPT-2: 50257, Llama 3: "
               "128256)",
               path, shard_token(sp, i), (long long)i, vocab);
      return WF_EFORMAT;
    }
  }
  return WF_OK;
}

/* A glob or *.bin names llm.c shards; another regular file is a shard when it starts
 * with the shard magic, else text. */
static wf_status classify(const char *key, const char *path, src_kind *kind, char *err,
                          size_t err_len)
{
  size_t n = strlen(path);
  *kind = SRC_SHARDS;
  if (strpbrk(path, "*?["))
    return WF_OK;
  struct stat sb;
  wf_status st;
  int fd = open_regular(key, path, &sb, &st, err, err_len);
  if (fd < 0)
    return st;
  int32_t magic = 0;
  bool shard = (n >= 4 && !strcmp(path + n - 4, ".bin")) ||
               (read(fd, &magic, sizeof magic) == sizeof magic &&
                (magic == WF__SHARD_MAGIC16 || magic == WF__SHARD_MAGIC32));
  close(fd);
  *kind = shard ? SRC_SHARDS : SRC_TEXT;
  return WF_OK;
}

static wf_status glob_shards(glob_t *g, const char *key, const char *pattern, char *err,
                             size_t err_len)
{
  int rc = glob(pattern, 0, NULL, g);
  if (rc == 0)
    return WF_OK;
  snprintf(err, err_len, "%s '%s' matches no file (expected llm.c token shards)", key, pattern);
  if (rc != GLOB_NOMATCH)
    globfree(g);
  return WF_ECONFIG;
}

static span *add_span(wf_data *d)
{
  if (d->n_spans == d->cap_spans) {
    int cap = d->cap_spans ? 2 * d->cap_spans : 8;
    span *s = realloc(d->spans, (size_t)cap * sizeof *s);
    if (!s)
      return NULL;
    d->spans = s, d->cap_spans = cap;
  }
  span *sp = &d->spans[d->n_spans++];
  memset(sp, 0, sizeof *sp);
  sp->first = d->n_tokens;
  return sp;
}

static wf_status open_shards(wf_data *d, const char *key, const char *pattern, char *desc,
                             size_t desc_len, char *err, size_t err_len)
{
  glob_t g;
  wf_status st = glob_shards(&g, key, pattern, err, err_len);
  if (st != WF_OK)
    return st;
  for (size_t i = 0; i < g.gl_pathc && st == WF_OK; i++) {
    span *sp = add_span(d);
    st = sp ? map_file(sp, key, g.gl_pathv[i], err, err_len) : WF_ENOMEM;
    if (st == WF_OK)
      st = check_shard(sp, g.gl_pathv[i], d->vocab, err, err_len);
    if (sp)
      d->n_tokens += sp->n;
  }
  snprintf(desc, desc_len, "llm.c token shards: %zu file%s matching '%s'", g.gl_pathc,
           g.gl_pathc == 1 ? "" : "s", pattern);
  globfree(&g);
  return st;
}

static const char bytes_refusal[] =
    "%s: text file '%s' would be read as bytes (token ids 0-255), but the model's "
    "vocabulary is %d: set data.tokenizer to the model's tokenizer (GPT-2's tokenizer.json, "
    "or vocab.json with merges.txt beside it; Llama 3's tokenizer.model) to encode it as "
    "tokens, tokenize it once into llm.c shards with `worker --tokenize`, or train a "
    "byte-level model (model.vocab=256)";

/* Text under a tokenizer: encoded once into ids the span owns; the file is unmapped. */
static wf_status tokenize_span(span *sp, const wf_tokenizer *tok, const char *path, char *err,
                               size_t err_len)
{
  wf_tokens ids = {0};
  wf_status st = wf_tokenizer_encode(tok, sp->map, sp->map_len, &ids);
  munmap(sp->map, sp->map_len);
  sp->map = NULL, sp->map_len = 0;
  if (st != WF_OK) {
    wf_tokens_free(&ids);
    snprintf(err, err_len, "text file '%s': out of memory while tokenizing it", path);
    return st;
  }
  sp->own = ids.ids, sp->tok = ids.ids, sp->width = 4, sp->n = (int64_t)ids.n;
  return WF_OK;
}

static wf_status check_bytes(const span *sp, const char *path, int vocab, char *err, size_t err_len)
{
  const unsigned char *b = sp->tok;
  for (int64_t i = 0; vocab < 256 && i < sp->n; i++) {
    if (b[i] >= vocab) {
      snprintf(err, err_len,
               "text file '%s': byte %u at offset %lld is not below the model's vocabulary "
               "%d; byte-level text needs model.vocab 256",
               path, b[i], (long long)i, vocab);
      return WF_EFORMAT;
    }
  }
  return WF_OK;
}

static wf_status open_text(wf_data *d, const char *key, const char *path, const wf_tokenizer *tok,
                           char *desc, size_t desc_len, char *err, size_t err_len)
{
  if (!tok && d->vocab > 256) {
    snprintf(err, err_len, bytes_refusal, key, path, d->vocab);
    return WF_ECONFIG;
  }
  span *sp = add_span(d);
  wf_status st = sp ? map_file(sp, key, path, err, err_len) : WF_ENOMEM;
  if (st != WF_OK)
    return st;
  if (sp->map_len == 0) {
    snprintf(err, err_len, "text file '%s' is empty", path);
    return WF_EFORMAT;
  }
  sp->tok = sp->map, sp->width = 1, sp->n = (int64_t)sp->map_len;
  st = tok ? tokenize_span(sp, tok, path, err, err_len)
           : check_bytes(sp, path, d->vocab, err, err_len);
  d->n_tokens += sp->n;
  if (tok)
    snprintf(desc, desc_len, "text file '%s' encoded with %s", path, wf_tokenizer_describe(tok));
  else
    snprintf(desc, desc_len,
             "text file '%s' read as bytes: the model sees byte values 0-255, not words "
             "(data.tokenizer encodes text as tokens)",
             path);
  return st;
}

static wf_status open_source(wf_data *d, const char *key, const char *path, const wf_tokenizer *tok,
                             src_kind *kind, char *desc, size_t desc_len, char *err, size_t err_len)
{
  wf_status st = classify(key, path, kind, err, err_len);
  if (st != WF_OK)
    return st;
  return *kind == SRC_SHARDS ? open_shards(d, key, path, desc, desc_len, err, err_len)
                             : open_text(d, key, path, tok, desc, desc_len, err, err_len);
}

static const char *kind_name(src_kind k)
{
  return k == SRC_SHARDS ? "llm.c shards" : "a text file";
}

typedef struct file_id {
  dev_t dev;
  ino_t ino;
} file_id;

/* (device, inode) of each file a source names: one file, or a glob's matches. */
static wf_status source_ids(const char *path, src_kind kind, file_id **ids, size_t *n)
{
  glob_t g = {0};
  bool globbed = kind == SRC_SHARDS && glob(path, 0, NULL, &g) == 0;
  size_t m = globbed ? g.gl_pathc : 1;
  *ids = calloc(m, sizeof **ids);
  *n = 0;
  for (size_t i = 0; *ids && i < m; i++) {
    struct stat sb;
    if (stat(globbed ? g.gl_pathv[i] : path, &sb) == 0)
      (*ids)[(*n)++] = (file_id){sb.st_dev, sb.st_ino};
  }
  if (globbed)
    globfree(&g);
  return *ids ? WF_OK : WF_ENOMEM;
}

/* Validation on the training data would measure memorisation, not generalisation. */
static wf_status check_disjoint(const char *path, src_kind kind, const char *val_path,
                                src_kind val_kind, char *err, size_t err_len)
{
  file_id *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  wf_status st = source_ids(path, kind, &a, &na);
  if (st == WF_OK)
    st = source_ids(val_path, val_kind, &b, &nb);
  for (size_t i = 0; st == WF_OK && i < na; i++)
    for (size_t j = 0; st == WF_OK && j < nb; j++)
      if (a[i].dev == b[j].dev && a[i].ino == b[j].ino) {
        snprintf(err, err_len,
                 "data.val_path '%s' and data.path '%s' share a file: validation on training "
                 "data measures memorisation; use disjoint files (llm.c: "
                 "data.path='DIR/*_train_*.bin' data.val_path='DIR/*_val_*.bin')",
                 val_path, path);
        st = WF_ECONFIG;
      }
  free(a);
  free(b);
  return st;
}

static wf_status check_same_kind(const char *path, src_kind kind, const char *val_path,
                                 src_kind val_kind, char *err, size_t err_len)
{
  if (kind == val_kind)
    return WF_OK;
  snprintf(err, err_len,
           "data.val_path '%s' is %s but data.path '%s' is %s; validation data must be the same "
           "kind as the training data",
           val_path, kind_name(val_kind), path, kind_name(kind));
  return WF_ECONFIG;
}

/* The training split and the validation split each need one window of T+1 tokens. With
 * validation files (n_train >= 0) the split is where they start; else the last
 * val_fraction of the stream. */
static wf_status split_tokens(wf_data *d, double val_fraction, int64_t n_train, char *err,
                              size_t err_len)
{
  int64_t n_val =
      n_train >= 0 ? d->n_tokens - n_train : (int64_t)floor((double)d->n_tokens * val_fraction);
  d->n_train = d->n_tokens - n_val;
  if (d->n_train < d->T + 1 || ((n_train >= 0 || val_fraction > 0) && n_val < d->T + 1)) {
    snprintf(err, err_len,
             "%s: %lld tokens give a train split of %lld and a validation split of %lld "
             "tokens, but each needs at least seq_len + 1 = %d; use more data, a shorter "
             "train.seq_len or %s",
             d->desc, (long long)d->n_tokens, (long long)d->n_train, (long long)n_val, d->T + 1,
             n_train >= 0 ? "other data.val_path files" : "another data.val_fraction");
    return WF_ECONFIG;
  }
  size_t len = strlen(d->desc);
  snprintf(d->desc + len, sizeof d->desc - len, ", %lld tokens (train %lld, val %lld)",
           (long long)d->n_tokens, (long long)d->n_train, (long long)n_val);
  return WF_OK;
}

static wf_status load_tokenizer(wf_tokenizer **tok, const char *path, int vocab, char *err,
                                size_t err_len)
{
  *tok = NULL;
  if (!path || !path[0])
    return WF_OK;
  wf_status st = wf_tokenizer_load(tok, path, err, err_len);
  return st == WF_OK ? wf_tokenizer_fits(*tok, vocab, err, err_len) : st;
}

static wf_status open_files(wf_data *d, const wf_data_opts *o, char *err, size_t err_len)
{
  wf_tokenizer *tok = NULL;
  char vdesc[WF_PATH_MAX * 2 + 256] = "";
  src_kind kind = SRC_TEXT, vkind = SRC_TEXT;
  bool val = o->val_path && o->val_path[0];
  wf_status st = load_tokenizer(&tok, o->tokenizer, d->vocab, err, err_len);
  if (st == WF_OK)
    st = open_source(d, "data.path", o->path, tok, &kind, d->desc, sizeof d->desc, err, err_len);
  d->kind = kind == SRC_SHARDS ? WF_DATA_SHARDS : WF_DATA_TEXT;
  int64_t n_train = d->n_tokens;
  if (st == WF_OK && val)
    st = open_source(d, "data.val_path", o->val_path, tok, &vkind, vdesc, sizeof vdesc, err,
                     err_len);
  if (st == WF_OK && val)
    st = check_same_kind(o->path, kind, o->val_path, vkind, err, err_len);
  if (st == WF_OK && val)
    st = check_disjoint(o->path, kind, o->val_path, vkind, err, err_len);
  if (st == WF_OK && val) {
    size_t len = strlen(d->desc);
    snprintf(d->desc + len, sizeof d->desc - len, "; validation (data.val_path): %s", vdesc);
  }
  if (st == WF_OK)
    st = split_tokens(d, o->val_fraction, val ? n_train : -1, err, err_len);
  wf_tokenizer_destroy(tok);
  return st;
}

/* ---- the pre-flight check ------------------------------------------------------------ */

/* One shard's header against its size: 1 KiB read, no token scan. */
static wf_status check_shard_file(const char *key, const char *path, char *err, size_t err_len)
{
  struct stat sb;
  wf_status st;
  int fd = open_regular(key, path, &sb, &st, err, err_len);
  if (fd < 0)
    return st;
  unsigned char head[SHARD_HEADER_BYTES];
  ssize_t got = read(fd, head, sizeof head);
  close(fd);
  if (got < 0) {
    snprintf(err, err_len, "%s: cannot read '%s': %s", key, path, strerror(errno));
    return WF_EIO;
  }
  int width = 0;
  return check_shard_header(head, (size_t)sb.st_size, path, &width, err, err_len);
}

static wf_status check_source(const char *key, const char *path, const wf_tokenizer *tok, int vocab,
                              src_kind *kind, char *err, size_t err_len)
{
  wf_status st = classify(key, path, kind, err, err_len);
  if (st != WF_OK || *kind == SRC_TEXT) {
    if (st == WF_OK && !tok && vocab > 256) {
      snprintf(err, err_len, bytes_refusal, key, path, vocab);
      st = WF_ECONFIG;
    }
    return st;
  }
  glob_t g;
  st = glob_shards(&g, key, path, err, err_len);
  if (st != WF_OK)
    return st;
  for (size_t i = 0; st == WF_OK && i < g.gl_pathc; i++)
    st = check_shard_file(key, g.gl_pathv[i], err, err_len);
  globfree(&g);
  return st;
}

/* A JSON Lines source before a job: a regular file behind every match, and each file's
 * first document a JSON object whose `field` is a string (its first line read, through
 * zstd when compressed: a damaged frame header or another compression is said here). */
static wf_status check_jsonl(const char *key, const char *pattern, const char *field, char *err,
                             size_t err_len)
{
  glob_t g;
  int rc = glob(pattern, 0, NULL, &g);
  if (rc != 0) {
    if (rc != GLOB_NOMATCH)
      globfree(&g);
    snprintf(err, err_len,
             "%s '%s' matches no file (expected JSON Lines, plain or "
             "zstd-compressed)",
             key, pattern);
    return WF_ECONFIG;
  }
  wf_status st = WF_OK;
  for (size_t i = 0; st == WF_OK && i < g.gl_pathc; i++) {
    wf__lines *r = NULL;
    const char *line;
    size_t len;
    bool got = false;
    char *text = NULL, e[2 * WF_PATH_MAX + 256] = "";
    st = check_regular(key, g.gl_pathv[i], err, err_len);
    if (st == WF_OK && (st = wf__lines_open(&r, g.gl_pathv[i], e, sizeof e)) == WF_OK &&
        (st = wf__lines_next(r, &line, &len, &got, e, sizeof e)) == WF_OK && got)
      st = wf__jsonl_text(r, line, len, field, &text, &len, e, sizeof e);
    if (e[0])
      snprintf(err, err_len, "%s: %s", key, e);
    free(text);
    wf__lines_close(r);
  }
  globfree(&g);
  return st;
}

static wf_status check_streams(const wf_config *cfg, int vocab, char *err, size_t err_len)
{
  wf_status st = WF_OK;
  if (!cfg->data.tokenizer[0] && vocab > 256) {
    snprintf(err, err_len, bytes_refusal, "data.source", cfg->data.source[0], vocab);
    return WF_ECONFIG;
  }
  for (int i = 0; st == WF_OK && i < cfg->data.n_source; i++)
    st = check_jsonl("data.source", cfg->data.source[i],
                     cfg->data.field[cfg->data.n_field > 1 ? i : 0], err, err_len);
  if (st == WF_OK && cfg->data.val_path[0])
    st = check_jsonl("data.val_path", cfg->data.val_path, cfg->data.field[0], err, err_len);
  return st;
}

wf_status wf_data_check(const wf_config *cfg, int vocab, char *err, size_t err_len)
{
  const char *path = cfg->data.path, *val_path = cfg->data.val_path;
  if (cfg->data.n_source > 0) {
    wf_tokenizer *tok = NULL;
    wf_status st = load_tokenizer(&tok, cfg->data.tokenizer, vocab, err, err_len);
    wf_tokenizer_destroy(tok);
    return st == WF_OK ? check_streams(cfg, vocab, err, err_len) : st;
  }
  if (!path[0])
    return WF_OK;
  wf_tokenizer *tok = NULL;
  src_kind kind = SRC_TEXT, vkind = SRC_TEXT;
  wf_status st = load_tokenizer(&tok, cfg->data.tokenizer, vocab, err, err_len);
  if (st == WF_OK)
    st = check_source("data.path", path, tok, vocab, &kind, err, err_len);
  if (st == WF_OK && val_path[0])
    st = check_source("data.val_path", val_path, tok, vocab, &vkind, err, err_len);
  if (st == WF_OK && val_path[0])
    st = check_same_kind(path, kind, val_path, vkind, err, err_len);
  if (st == WF_OK && val_path[0])
    st = check_disjoint(path, kind, val_path, vkind, err, err_len);
  wf_tokenizer_destroy(tok);
  return st;
}

/* The n tokens from stream position pos, crossing span boundaries. */
static void read_tokens(const wf_data *d, int *out, int64_t pos, int n)
{
  int lo = 0, hi = d->n_spans - 1;
  while (lo < hi) { /* last span with first <= pos */
    int mid = (lo + hi + 1) / 2;
    if (d->spans[mid].first <= pos)
      lo = mid;
    else
      hi = mid - 1;
  }
  for (int s = lo, i = 0; i < n; s++) {
    const span *sp = &d->spans[s];
    int64_t off = pos + i - sp->first;
    for (; i < n && off < sp->n; i++, off++)
      out[i] = sp->width == 1 ? ((const uint8_t *)sp->tok)[off]
               : sp->own      ? sp->own[off]
                              : (int)shard_token(sp, off);
  }
}

/* ---- public API ---------------------------------------------------------------------- */

static wf_status check_opts(const wf_data_opts *o, char *err, size_t err_len)
{
  if (o->vocab <= 0 || o->seq_len <= 0 || o->batch_size <= 0) {
    snprintf(err, err_len, "data: vocab %d, seq_len %d and batch_size %d must be positive",
             o->vocab, o->seq_len, o->batch_size);
    return WF_EINVAL;
  }
  if (!(o->val_fraction >= 0 && o->val_fraction < 1)) {
    snprintf(err, err_len, "data.val_fraction = %g, expected a fraction in [0, 1)",
             o->val_fraction);
    return WF_ECONFIG;
  }
  return WF_OK;
}

/* data.source: the tokenizer goes to the streams, which own it from here. */
static wf_status open_streams(wf_data *d, const wf_data_opts *o, char *err, size_t err_len)
{
  wf_tokenizer *tok = NULL;
  d->kind = WF_DATA_STREAM;
  wf_status st = load_tokenizer(&tok, o->tokenizer, d->vocab, err, err_len);
  if (st != WF_OK) {
    wf_tokenizer_destroy(tok);
    return st;
  }
  return wf__dstream_open(&d->ds, o, tok, d->desc, sizeof d->desc, err, err_len);
}

wf_status wf_data_open(wf_data **out, const wf_data_opts *o, char *err, size_t err_len)
{
  *out = NULL;
  wf_status st = check_opts(o, err, err_len);
  if (st != WF_OK)
    return st;
  wf_data *d = calloc(1, sizeof *d);
  if (!d)
    return WF_ENOMEM;
  d->vocab = o->vocab, d->T = o->seq_len, d->batch_size = o->batch_size, d->seed = o->seed;
  const char *path = o->path ? o->path : "";
  if (o->n_source > 0) {
    st = open_streams(d, o, err, err_len);
  } else if (!path[0]) {
    d->kind = WF_DATA_SYNTHETIC;
    wf__chain_build(&d->ch, d->vocab);
    snprintf(d->desc, sizeof d->desc,
             "synthetic: a fixed first-order Markov chain over %d of %d symbols, %d-%d "
             "successors each",
             d->ch.K, d->vocab, WF__CHAIN_MIN_SUCC, WF__CHAIN_MAX_SUCC);
  } else {
    st = open_files(d, o, err, err_len);
  }
  if (st != WF_OK) {
    wf_data_destroy(d);
    return st;
  }
  *out = d;
  return WF_OK;
}

wf_status wf_data_open_config(wf_data **out, const wf_config *cfg, int vocab, int seq_len,
                              int dp_rank, int dp_size, char *err, size_t err_len)
{
  int n = cfg->data.n_source, nf = cfg->data.n_field;
  wf_data_opts o = {
      .path = cfg->data.path,
      .vocab = vocab,
      .seq_len = seq_len > 0              ? seq_len
                 : cfg->train.seq_len > 0 ? cfg->train.seq_len
                                          : cfg->model.seq_len,
      .batch_size = cfg->train.batch_size,
      .seed = cfg->train.seed,
      .val_fraction = n > 0 ? 0 : cfg->data.val_fraction,
      .val_path = cfg->data.val_path,
      .tokenizer = cfg->data.tokenizer,
      .n_source = n,
      .n_mix = cfg->data.n_mix,
      .dp_rank = dp_rank,
      .dp_size = dp_size,
  };
  for (int i = 0; i < n; i++) {
    o.source[i] = cfg->data.source[i], o.mix[i] = cfg->data.mix[i];
    o.field[i] = cfg->data.field[nf > 1 ? i : 0];
  }
  return wf_data_open(out, &o, err, err_len);
}

void wf_data_destroy(wf_data *d)
{
  if (!d)
    return;
  wf__dstream_destroy(d->ds);
  for (int i = 0; i < d->n_spans; i++) {
    if (d->spans[i].map)
      munmap(d->spans[i].map, d->spans[i].map_len);
    free(d->spans[i].own);
  }
  free(d->spans);
  free(d);
}

wf_data_kind wf_data_get_kind(const wf_data *d) { return d->kind; }
const char *wf_data_describe(const wf_data *d) { return d->desc; }

double wf_data_entropy_floor(const wf_data *d)
{
  return d->kind == WF_DATA_SYNTHETIC ? d->ch.H : NAN;
}

int64_t wf_data_num_tokens(const wf_data *d, wf_data_split split)
{
  return split == WF_DATA_TRAIN ? d->n_train : d->n_tokens - d->n_train;
}

bool wf_data_has_val(const wf_data *d)
{
  return d->kind == WF_DATA_SYNTHETIC ||
         (d->ds ? wf__dstream_has_val(d->ds) : d->n_train < d->n_tokens);
}

int wf_data_rows(const wf_data *d, int dp_size, int micro_count)
{
  if (dp_size <= 0 || micro_count <= 0 || d->batch_size % (dp_size * micro_count))
    return 0;
  return d->batch_size / (dp_size * micro_count);
}

wf_status wf_data_row(const wf_data *d, int *win, wf_data_split split, int64_t index, int64_t row)
{
  if (index < 0 || row < 0)
    return WF_EINVAL;
  uint64_t stream = data_stream(split, index);
  if (d->ds)
    return WF_EINVAL; /* a stream's rows are its position's, not the step's: wf_data_batch */
  if (d->kind == WF_DATA_SYNTHETIC) {
    wf__chain_window(win, &d->ch, d->seed, d->T, stream, row);
    return WF_OK;
  }
  int64_t lo = split == WF_DATA_TRAIN ? 0 : d->n_train;
  int64_t hi = split == WF_DATA_TRAIN ? d->n_train : d->n_tokens;
  if (hi - lo < d->T + 1)
    return WF_EINVAL; /* no validation split (data.val_fraction = 0) */
  uint64_t starts = (uint64_t)(hi - lo - d->T);
  int64_t start = lo + (int64_t)(wf_rng_u64(d->seed, stream, (uint64_t)row) % starts);
  read_tokens(d, win, start, d->T + 1);
  return WF_OK;
}

/* A test hook "R:S" in variable `name` (read once into *r, *step) names this rank's
 * training batches of step S. */
static bool test_hook(const char *name, int *r, long long *step, wf_data_split split, int64_t index)
{
  if (*r == -2) {
    const char *e = getenv(name);
    if (!e || sscanf(e, "%d:%lld", r, step) != 2)
      *r = -1;
  }
  return split == WF_DATA_TRAIN && *r == wf_rt_rank() && index + 1 == *step;
}

wf_status wf_data_batch(wf_data *d, int *inputs, int *targets, int *starts, wf_data_split split,
                        int64_t index, int dp_rank, int dp_size, int micro, int micro_count)
{
  static int fail_r = -2, stall_r = -2;
  static long long fail_s, stall_s;
  if (test_hook("WEFT_TEST_DATA_FAIL", &fail_r, &fail_s, split, index)) {
    WF_ERROR("data: injected read failure of step %lld (WEFT_TEST_DATA_FAIL)",
             (long long)index + 1);
    return WF_EIO;
  }
  if (test_hook("WEFT_TEST_DATA_STALL", &stall_r, &stall_s, split, index)) {
    /* said first, so a test knows the job is past the last step boundary it will see */
    WF_INFO("data: step %lld's read stalls here (WEFT_TEST_DATA_STALL)", (long long)index + 1);
    while (sleep(3600)) /* a read that never returns, signals or not: the process */
      ;                 /* lives, training does not */
  }
  int rows = wf_data_rows(d, dp_size, micro_count);
  if (rows == 0 || dp_rank < 0 || dp_rank >= dp_size || micro < 0 || micro >= micro_count)
    return WF_EINVAL;
  int T = d->T;
  int64_t first = (int64_t)dp_rank * (d->batch_size / dp_size) + (int64_t)micro * rows;
  if (d->ds) {
    char err[2 * WF_PATH_MAX + 512] = "";
    wf_status st = wf__dstream_batch(d->ds, inputs, targets, starts, split, index, first, rows, err,
                                     sizeof err);
    if (st != WF_OK)
      WF_ERROR("%s", err[0] ? err : wf_status_str(st));
    return st;
  }
  if (starts) /* one stretch of text per row: no document boundaries */
    memset(starts, 0, (size_t)rows * T * sizeof *starts);
  int *win = malloc(((size_t)T + 1) * sizeof *win);
  if (!win)
    return WF_ENOMEM;
  wf_status st = WF_OK;
  for (int b = 0; b < rows; b++) {
    st = wf_data_row(d, win, split, index, first + b);
    if (st != WF_OK)
      break;
    memcpy(inputs + (size_t)b * T, win, (size_t)T * sizeof *win);
    memcpy(targets + (size_t)b * T, win + 1, (size_t)T * sizeof *win);
  }
  free(win);
  return st;
}

wf_status wf_data_ready(wf_data *d, wf_data_split split, int64_t index, char *err, size_t err_len)
{
  const int *win, *starts;
  if (!d->ds || (split == WF_DATA_VAL && !wf__dstream_has_val(d->ds)))
    return WF_OK;
  return wf__dstream_rows(d->ds, split, index, &win, &starts, err, err_len);
}

/* ---- a stream's position ------------------------------------------------------------- */

size_t wf_data_state_len(const wf_data *d) { return d->ds ? wf__dstream_state_len(d->ds) : 0; }

wf_status wf_data_state_get(wf_data *d, int64_t index, uint64_t *v, char *err, size_t err_len)
{
  return d->ds ? wf__dstream_state_get(d->ds, index, v, err, err_len) : WF_OK;
}

char *wf_data_state_json(const wf_data *d, int64_t index, const uint64_t *v)
{
  return d->ds ? wf__dstream_state_json(d->ds, index, v) : NULL;
}

wf_status wf_data_state_set(wf_data *d, const char *json, char *err, size_t err_len)
{
  if (!d->ds)
    return wf__io_failf(err, err_len, WF_EINVAL, "the data is not a data.source stream");
  return wf__dstream_state_set(d->ds, json, err, err_len);
}
