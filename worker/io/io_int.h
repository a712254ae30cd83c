/*
 * io_int.h - private to worker/io: what its files share.
 *
 *  - tokenizer.c (the BPE core: tables, loading through a kind, encoding, decoding) and
 *    the kinds, tokenizer_gpt2.c (tokenizer.json, or vocab.json with merges.txt) and
 *    tokenizer_llama3.c (tiktoken's ranks file), share the tokenizer's struct, the kind
 *    table and the functions that fill the tables; tokenize.c (`worker --tokenize`) uses
 *    wf_io.h's wf_tokenizer_* and wf__tokens_push only.
 *  - data.c (the data sources) holds the synthetic source's Markov chain, which
 *    synthetic.c builds and samples.
 *  - data.source's streams are three layers: jsonl.c reads JSON Lines files (plain or
 *    zstd) a line at a time; stream.c deals their documents to lanes, mixes and packs
 *    them and keeps their position; loader.c runs a stream on a thread of its own; and
 *    datastream.c puts that behind wf_data (batches, validation, the checkpoint's JSON).
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

/* llm.c's token shards (dev/data/data_common.py): an int32[256] header {magic, version,
 * n}, then n tokens, uint16 (GPT-2's form) or uint32 (its "llama-3" form). */
#define WF__SHARD_MAGIC16   20240520
#define WF__SHARD_VERSION16 1
#define WF__SHARD_MAGIC32   20240801
#define WF__SHARD_VERSION32 7

/* Write the printf-style message into err[0 .. len) (when err) and return st. */
wf_status wf__io_failf(char *err, size_t len, wf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- the tokenizer ------------------------------------------------------------------ */

/*
 * The seam: a tokenizer kind is a table (STYLE rule 21). Both kinds weft knows are
 * byte-level BPE, so one core (tokenizer.c) encodes and decodes for both: the
 * vocabulary is keyed by each token's raw bytes, a pair of ids maps to (rank, merged id),
 * and BPE merges the lowest-ranked adjacent pair, leftmost first. What a kind supplies
 * is everything that differs: which files are its own, how they fill those tables (GPT-2:
 * merges.txt's line order ranks the pairs; Llama 3: a pair's rank is the rank of the
 * token it makes, as tiktoken does), its pre-tokenizer pattern and its special tokens.
 * Callers of wf_io.h never see the kind.
 */
#define WF__TOK_KIND_VERSION 1

typedef struct wf__tok_kind {
  int version;       /* WF__TOK_KIND_VERSION */
  const char *name;  /* "GPT-2 BPE", "Llama 3 BPE": the head of wf_tokenizer_describe */
  const char *files; /* what it reads, for errors: "tokenizer.json or vocab.json" */
  /* Whether the file whose first bytes are head[0 .. n) is this kind's (a predicate:
   * true for exactly one kind, or detection reports the file as neither). */
  bool (*claims)(const char *path, const unsigned char *head, size_t n);
  /* Fill t from path through the wf__tok_* builders below: tables, specials, bos/eot,
   * the pattern. Errors name the file (and line) in err. */
  wf_status (*load)(wf_tokenizer *t, const char *path, char *err, size_t err_len);
} wf__tok_kind;

extern const wf__tok_kind wf__tok_gpt2;   /* tokenizer_gpt2.c */
extern const wf__tok_kind wf__tok_llama3; /* tokenizer_llama3.c */

/* The pre-tokenizer patterns (PCRE2, Unicode properties; \s spelled out as Unicode's
 * White_Space, which Python's regex and Rust's regex, hence tiktoken, match). */
extern const char wf__tok_gpt2_pattern[], wf__tok_llama3_pattern[];

#define WF__TOK_MAX_SPECIALS 1024

typedef struct wf__tok_str {
  const unsigned char *s; /* NULL: empty slot */
  uint32_t len, hash;     /* hash: the key's, checked before its bytes (a cache miss) */
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
  const wf__tok_kind *kind;
  const char *name;   /* the kind's, unless its loader knows better (describe's head) */
  wf__tok_str *vocab; /* token bytes -> id (open addressing, never grows) */
  size_t vocab_cap, vocab_n;
  wf__tok_pair *pairs; /* (a, b) -> (rank, merged) */
  size_t pairs_cap, n_merges;
  int32_t n_ids;                   /* largest id + 1 */
  const unsigned char **tok_bytes; /* per id: its bytes (NULL: unused id); borrowed */
  uint32_t *tok_len;
  int32_t byte_id[256];
  unsigned char special_first[256]; /* 1 where some special token starts with the byte */
  wf__tok_special specials[WF__TOK_MAX_SPECIALS];
  int n_specials;
  int32_t eot, bos;      /* -1: none */
  bool adds_bos;         /* a text to continue (a prompt) starts with bos */
  bool add_prefix_space; /* HF ByteLevel: a segment gets a leading space */
  bool whole_first;      /* a pre-token that is a token is taken whole (tiktoken, and
                          * HF's ignore_merges) before any merging */
  const char *pattern;   /* the kind's pre-tokenizer pattern (static) */
  pcre2_code *re;
  char desc[WF_PATH_MAX + 128];
};

/* tokenizer.c: the tables. Sized once for n tokens and n_pairs merge pairs (the hash maps
 * never grow), then filled; path and line go into error messages. */
wf_status wf__tok_tables_init(wf_tokenizer *t, size_t n, size_t n_pairs);
/* Token bytes s[0 .. len) is id; the same bytes twice keep the first id (*added false). */
wf_status wf__tok_vocab_add(wf_tokenizer *t, const void *s, size_t len, int32_t id, bool *added,
                            const char *path, char *err, size_t err_len);
/* The id of token bytes s[0 .. len), or -1. */
int32_t wf__tok_vocab_find(const wf_tokenizer *t, const void *s, size_t len);
/* Pair (a, b) merges into `merged` at `rank`; a pair already present keeps its first
 * (lower) rank. */
wf_status wf__tok_pair_add(wf_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t merged);
wf_status wf__tok_special_add(wf_tokenizer *t, const char *s, size_t len, int32_t id);
/* After the last add: each id's bytes, each byte's token, the compiled pattern. */
wf_status wf__tok_finish(wf_tokenizer *t, const char *path, char *err, size_t err_len);

/* Append one id to a wf_tokens (WF_ENOMEM only). */
wf_status wf__tokens_push(wf_tokens *o, int32_t id);

/* ---- JSON Lines files (jsonl.c) ------------------------------------------------------ */

/* A JSON Lines file, plain or zstd (told by its magic), read a line at a time. */
typedef struct wf__lines wf__lines;
wf_status wf__lines_open(wf__lines **out, const char *path, char *err, size_t err_len);
void wf__lines_close(wf__lines *r); /* accepts NULL */
/* The next document's line (any line but a blank one), without its newline, in *line
 * (valid until the next call); *got false at the end of the file. */
wf_status wf__lines_next(wf__lines *r, const char **line, size_t *len, bool *got, char *err,
                         size_t err_len);
int64_t wf__lines_lineno(const wf__lines *r); /* the last line's number, 1-based */
const char *wf__lines_path(const wf__lines *r);
/* The string at `key` of the JSON object `line` (r's last line, named in errors), copied
 * into *text (malloc'd, NUL-terminated; it may hold NULs: *text_len). */
wf_status wf__jsonl_text(const wf__lines *r, const char *line, size_t len, const char *key,
                         char **text, size_t *text_len, char *err, size_t err_len);

/* ---- streams: sources, lanes, packing (stream.c) ----------------------------------------- */

typedef struct wf__stream wf__stream;
typedef struct wf__stream_src {
  const char *path;  /* a file or a glob */
  const char *field; /* the JSON key of a document's text */
  double weight;     /* > 0; normalised over the sources */
} wf__stream_src;
typedef struct wf__stream_opts {
  const wf__stream_src *src;
  int n_src;
  int lanes, lane0, lane1; /* L lanes (the global batch's rows); this rank's [lane0, lane1) */
  int T;                   /* tokens per row's inputs */
  const wf_tokenizer *tok; /* borrowed; NULL: text as bytes */
  int vocab;
  const char *key; /* the config key, for errors ("data.source", "data.val_path") */
} wf__stream_opts;
wf_status wf__stream_open(wf__stream **out, const wf__stream_opts *o, char *err, size_t err_len);
void wf__stream_destroy(wf__stream *s); /* accepts NULL */
/* The next row of every local lane: win (lanes, T+1) tokens and starts (lanes, T), where
 * each input position's document starts in its row. */
wf_status wf__stream_rows(wf__stream *s, int *win, int *starts, char *err, size_t err_len);
/* The position: uint64 per lane record, records of the local lanes into rec (lanes x
 * rec), each file's documents + 1 (0: not counted yet) into docs (wf__stream_n_files). */
size_t wf__stream_lane_rec(const wf__stream *s);
size_t wf__stream_n_files(const wf__stream *s);
void wf__stream_lanes_get(const wf__stream *s, uint64_t *rec);
void wf__stream_docs_get(const wf__stream *s, uint64_t *docs);
/* A fresh stream to a saved position: lanes holds every lane's record (L x rec; the
 * local ones are read), docs the files' counts. */
wf_status wf__stream_restore(wf__stream *s, const uint64_t *lanes, const uint64_t *docs, char *err,
                             size_t err_len);
int wf__stream_n_src(const wf__stream *s);
int wf__stream_lanes(const wf__stream *s);
int wf__stream_lane0(const wf__stream *s); /* this rank's first lane */
void wf__stream_src_info(const wf__stream *s, int i, const char **pattern, const char **field,
                         double *weight, int *n_files);
void wf__stream_file_info(const wf__stream *s, int i, int f, const char **name, int64_t *bytes);

/* ---- the loader thread (loader.c) ---------------------------------------------------------- */

/* A stream's rows made `depth` steps ahead on a thread of its own (started by the first
 * wf__loader_get). Steps are asked for in order; the one held stays valid until the
 * next is asked for. */
typedef struct wf__loader wf__loader;
wf_status wf__loader_create(wf__loader **out, wf__stream *s, int n_lanes, int T, int depth);
/* What create allocates through the runtime's memory layer (the slots' rows). */
size_t wf__loader_bytes(int n_lanes, int T, int depth);
void wf__loader_destroy(wf__loader *ld); /* accepts NULL; stops the thread */
/* Before the first get: the stream to a saved position, whose next step is `index`. */
wf_status wf__loader_restore(wf__loader *ld, int64_t index, const uint64_t *lanes,
                             const uint64_t *docs, char *err, size_t err_len);
/* Step index's rows (wf__stream_rows' win and starts); waits for the thread. */
wf_status wf__loader_get(wf__loader *ld, int64_t index, const int **win, const int **starts,
                         char *err, size_t err_len);
/* The local lanes' records and the files' counts before step index's rows: index is the
 * held step + 1 (or the first step, before any is held). */
wf_status wf__loader_state(wf__loader *ld, int64_t index, uint64_t *lanes, uint64_t *docs,
                           char *err, size_t err_len);

/* ---- data.source behind wf_data (datastream.c) --------------------------------------------- */

typedef struct wf__dstream wf__dstream;
/* Takes tok (NULL: bytes) in every case; desc gets the start-up line. */
wf_status wf__dstream_open(wf__dstream **out, const wf_data_opts *o, wf_tokenizer *tok, char *desc,
                           size_t desc_len, char *err, size_t err_len);
void wf__dstream_destroy(wf__dstream *ds); /* accepts NULL */
bool wf__dstream_has_val(const wf__dstream *ds);
/* Step (or evaluation batch) index's rows (all local lanes). */
wf_status wf__dstream_rows(wf__dstream *ds, wf_data_split split, int64_t index, const int **win,
                           const int **starts, char *err, size_t err_len);
/* rows global rows from `first` (this rank's lanes) of index's batch. starts may be NULL. */
wf_status wf__dstream_batch(wf__dstream *ds, int *inputs, int *targets, int *starts,
                            wf_data_split split, int64_t index, int64_t first, int rows, char *err,
                            size_t err_len);
size_t wf__dstream_state_len(const wf__dstream *ds);
wf_status wf__dstream_state_get(wf__dstream *ds, int64_t index, uint64_t *v, char *err,
                                size_t err_len);
char *wf__dstream_state_json(const wf__dstream *ds, int64_t index, const uint64_t *v);
wf_status wf__dstream_state_set(wf__dstream *ds, const char *text, char *err, size_t err_len);

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
