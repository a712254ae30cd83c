/*
 * tokenize.c - `worker --tokenize` (wf_tokenize_file): a text file encoded with a
 * wf_tokenizer into llm.c token shards, so a large corpus is tokenized once rather than at
 * every data.path open.
 *
 * Uses the tokenizer through wf_io.h only. Shards are llm.c's (data_common.py): an
 * int32[256] header {magic, version, n}, then the tokens; {20240520, 1} with uint16 tokens
 * when every id fits (GPT-2), else llm.c's "llama-3" form {20240801, 7} with uint32 tokens;
 * SHARD_TOKENS per training file as fineweb.py writes them; each file is written atomically
 * (wf_afile), so an interrupted run leaves no half shard under a final name. The text is mapped,
 * not read, and opened O_NONBLOCK after stat() says it is a regular file, so a FIFO cannot block
 * it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_int.h"
#include "wf_file.h"

#define SHARD_TOKENS 100000000LL /* llm.c's fineweb.py: 10^8 tokens per shard */

/* One llm.c token shard of `width` bytes per token (2 or 4), atomically. */
static wf_status write_shard(const char *path, const int32_t *ids, size_t n, int width)
{
  int32_t header[256] = {width == 2 ? WF__SHARD_MAGIC16 : WF__SHARD_MAGIC32,
                         width == 2 ? WF__SHARD_VERSION16 : WF__SHARD_VERSION32, (int32_t)n};
  wf_afile f;
  wf_status st = wf_afile_open(&f, path, 0644, 0);
  if (st != WF_OK)
    return st;
  st = wf_afile_write(&f, header, sizeof header);
  union {
    uint16_t u16[4096];
    uint32_t u32[4096];
  } buf;
  for (size_t i = 0; st == WF_OK && i < n; i += 4096) {
    size_t m = WF_MIN(n - i, (size_t)4096);
    for (size_t j = 0; j < m; j++) {
      if (width == 2)
        buf.u16[j] = (uint16_t)ids[i + j];
      else
        buf.u32[j] = (uint32_t)ids[i + j];
    }
    st = wf_afile_write(&f, &buf, m * (size_t)width);
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
    return wf__io_failf(err, err_len, WF_EIO, "--tokenize: cannot open '%s': %s", in,
                        strerror(errno));
  if (!S_ISREG(sb.st_mode))
    return wf__io_failf(err, err_len, WF_EIO,
                        "--tokenize: '%s' is not a regular file (a FIFO, device or folder); name a "
                        "text file",
                        in);
  int fd = open(in, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return wf__io_failf(err, err_len, WF_EIO, "--tokenize: cannot open '%s': %s", in,
                        strerror(errno));
  void *map = sb.st_size ? mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (map == MAP_FAILED)
    return wf__io_failf(err, err_len, WF_EIO, "--tokenize: cannot map '%s': %s", in,
                        strerror(errno));
  int bos = wf_tokenizer_bos(t);
  wf_status st = bos >= 0 ? wf__tokens_push(out, bos) : WF_OK;
  if (st == WF_OK)
    st = wf_tokenizer_encode(t, map, (size_t)sb.st_size, out);
  if (map)
    munmap(map, (size_t)sb.st_size);
  return st == WF_OK
             ? WF_OK
             : wf__io_failf(err, err_len, st, "--tokenize: out of memory encoding '%s'", in);
}

/* Train shards of SHARD_TOKENS each, then the validation shard. */
static wf_status write_shards(const wf_tokens *tok, size_t n_train, int width, const char *prefix,
                              int *n_files, char *err, size_t err_len)
{
  char path[WF_PATH_MAX + 64];
  *n_files = 0;
  for (size_t at = 0; at < n_train; at += SHARD_TOKENS) {
    snprintf(path, sizeof path, "%s_train_%06d.bin", prefix, (*n_files)++);
    if (write_shard(path, tok->ids + at, WF_MIN(n_train - at, (size_t)SHARD_TOKENS), width) !=
        WF_OK)
      return wf__io_failf(err, err_len, WF_EIO, "--tokenize: cannot write '%s' (see the log above)",
                          path);
  }
  snprintf(path, sizeof path, "%s_val_%06d.bin", prefix, 0);
  if (tok->n > n_train && write_shard(path, tok->ids + n_train, tok->n - n_train, width) != WF_OK)
    return wf__io_failf(err, err_len, WF_EIO, "--tokenize: cannot write '%s' (see the log above)",
                        path);
  return WF_OK;
}

wf_status wf_tokenize_file(const wf_tokenizer *t, const char *in, const char *prefix,
                           double val_fraction, char *summary, size_t summary_len, char *err,
                           size_t err_len)
{
  int width = wf_tokenizer_vocab(t) <= 65536 ? 2 : 4;
  if (!(val_fraction >= 0 && val_fraction < 1))
    return wf__io_failf(err, err_len, WF_ECONFIG,
                        "--tokenize: data.val_fraction=%g is not in [0, 1)", val_fraction);
  wf_tokens tok = {0};
  wf_status st = read_text(in, t, &tok, err, err_len);
  size_t n_val = (size_t)((double)tok.n * val_fraction);
  if (st == WF_OK && (tok.n - n_val == 0 || (val_fraction > 0 && n_val == 0)))
    st = wf__io_failf(err, err_len, WF_EFORMAT,
                      "--tokenize: '%s' gives %zu tokens, too few for a train split and a "
                      "validation split of data.val_fraction=%g",
                      in, tok.n, val_fraction);
  int files = 0;
  if (st == WF_OK)
    st = write_shards(&tok, tok.n - n_val, width, prefix, &files, err, err_len);
  if (st == WF_OK)
    snprintf(summary, summary_len,
             "tokenized '%s' with %s: %zu tokens (uint%d); train %zu in %s_train_%06d.bin%s, val "
             "%zu%s%s%s",
             in, wf_tokenizer_describe(t), tok.n, 8 * width, tok.n - n_val, prefix, 0,
             files > 1 ? " and on" : "", n_val, n_val ? " in " : "", n_val ? prefix : "",
             n_val ? "_val_000000.bin" : " (no file)");
  wf_tokens_free(&tok);
  return st;
}

wf_status wf_tokenize_config(const wf_config *cfg, const char *in, const char *prefix,
                             char *summary, size_t summary_len)
{
  char err[2048] = "";
  wf_tokenizer *tok = NULL;
  wf_status st = WF_OK;
  if (!cfg->data.tokenizer[0])
    st = wf__io_failf(err, sizeof err, WF_ECONFIG,
                      "--tokenize needs a tokenizer: add data.tokenizer=FILE (GPT-2's "
                      "tokenizer.json, or vocab.json with merges.txt beside it; Llama 3's "
                      "tokenizer.model; or the folder holding them)");
  if (st == WF_OK)
    st = wf_tokenizer_load(&tok, cfg->data.tokenizer, err, sizeof err);
  if (st == WF_OK)
    st = wf_tokenize_file(tok, in, prefix, cfg->data.val_fraction, summary, summary_len, err,
                          sizeof err);
  wf_tokenizer_destroy(tok);
  if (st != WF_OK)
    WF_ERROR("%s", err);
  /* a text or tokenizer that cannot be read is the user's to fix, as a missing one is */
  return st == WF_OK || st == WF_ENOMEM ? st : WF_ECONFIG;
}

wf_status wf_tokenizer_vocab_of(const char *path, int *vocab, char *err, size_t err_len)
{
  wf_tokenizer *tok = NULL;
  wf_status st = wf_tokenizer_load(&tok, path, err, err_len);
  if (st == WF_OK)
    *vocab = wf_tokenizer_vocab(tok);
  wf_tokenizer_destroy(tok);
  return st == WF_OK || st == WF_ENOMEM ? st : WF_ECONFIG;
}
