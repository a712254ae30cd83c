/*
 * io_int.h - private to worker/io: what its files share.
 *
 *  - tokenizer.c (the BPE tables, encoding, decoding) and tokenizer_load.c (reading
 *    tokenizer.json, or vocab.json with merges.txt, into those tables) share the
 *    tokenizer's struct and the functions that fill its tables; tokenize.c (`worker
 *    --tokenize`) uses wf_io.h's wf_tokenizer_* and wf__tokens_push only.
 *  - data.c (the data sources) holds the synthetic source's Markov chain, which
 *    synthetic.c builds and samples.
 *
 * Error idiom: functions return a wf_status. The data and tokenizer files write errors a
 * user can cause into the caller's err buffer (naming the file and what was wrong; for
 * the tokenizer through wf__io_failf) rather than logging them, so the caller decides
 * where a message goes and a job says it once. trace.c, which is collective, logs where
 * an error arises (WF_ERROR, WF_TRY), as the rest of the worker does.
 */
#ifndef WF_IO_INT_H
#define WF_IO_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wf_io.h"

/* Write the printf-style message into err[0 .. len) (when err) and return st. */
wf_status wf__io_failf(char *err, size_t len, wf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- the tokenizer ------------------------------------------------------------------ */

#define WF__TOK_MAX_SPECIALS 1024
#define WF__TOK_EOT_TEXT     "<|endoftext|>"

typedef struct wf__tok_str {
  const char *s; /* NULL: empty slot */
  uint32_t len;
  int32_t id;
} wf__tok_str;

typedef struct wf__tok_pair {
  uint64_t key; /* a << 32 | b; UINT64_MAX: empty */
  int32_t rank, merged;
} wf__tok_pair;

typedef struct wf__tok_special {
  char *s;
  size_t len;
  int32_t id;
} wf__tok_special;

struct wf_tokenizer {
  wf__tok_str *vocab;
  size_t vocab_cap, vocab_n;
  wf__tok_pair *pairs;
  size_t pairs_cap, n_merges;
  int32_t n_ids;             /* largest id + 1 */
  unsigned char **tok_bytes; /* per id: its bytes (NULL: unused id) */
  uint32_t *tok_len;
  int32_t byte_id[256];
  wf__tok_special specials[WF__TOK_MAX_SPECIALS];
  int n_specials;
  int32_t eot;
  bool add_prefix_space, ignore_merges;
  pcre2_code *re;
  char desc[WF_PATH_MAX + 128];
};

/* tokenizer.c: the tables. Sized once for n tokens and n_merges merges (the hash maps
 * never grow), then filled; path and the merge's line number go into error messages. */
wf_status wf__tok_tables_init(wf_tokenizer *t, size_t n, size_t n_merges);
wf_status wf__tok_vocab_add(wf_tokenizer *t, const char *s, size_t len, int32_t id,
                            const char *path, char *err, size_t err_len);
wf_status wf__tok_merge_add(wf_tokenizer *t, const char *a, size_t la, const char *b, size_t lb,
                            const char *path, size_t line, char *err, size_t err_len);
wf_status wf__tok_special_add(wf_tokenizer *t, const char *s, size_t len, int32_t id);
/* The id of vocabulary string s[0 .. len), or -1. */
int32_t wf__tok_vocab_find(const wf_tokenizer *t, const char *s, size_t len);
/* After the last add: each id's bytes, each byte's token, GPT-2's compiled pattern. */
wf_status wf__tok_finish(wf_tokenizer *t, const char *path, char *err, size_t err_len);

/* Append one id to a wf_tokens (WF_ENOMEM only). */
wf_status wf__tokens_push(wf_tokens *o, int32_t id);

/* ---- the synthetic source's Markov chain ---------------------------------------------- */

#define WF__CHAIN_MAX_K    64
#define WF__CHAIN_MIN_SUCC 4
#define WF__CHAIN_MAX_SUCC 8

typedef struct wf__chain {
  int K;
  int n[WF__CHAIN_MAX_K];                          /* successors of each state */
  int succ[WF__CHAIN_MAX_K][WF__CHAIN_MAX_SUCC];   /* their symbols */
  double cdf[WF__CHAIN_MAX_K][WF__CHAIN_MAX_SUCC]; /* cumulative transition probabilities */
  double pi[WF__CHAIN_MAX_K];                      /* stationary distribution */
  double pi_cdf[WF__CHAIN_MAX_K];
  double H; /* entropy rate, nats per token */
} wf__chain;

/* synthetic.c: the fixed chain over min(vocab, WF__CHAIN_MAX_K) symbols. */
void wf__chain_build(wf__chain *c, int vocab);
/* win[0 .. T]: one row of T+1 tokens, from Philox (seed, stream) at counters row << 32 + t. */
void wf__chain_window(int *win, const wf__chain *c, uint64_t seed, int T, uint64_t stream,
                      int64_t row);

#endif /* WF_IO_INT_H */
