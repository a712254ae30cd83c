/*
 * wf_io.h - what the worker reads and writes besides checkpoints: training data
 * (wf_data_*), the GPT-2 tokenizer (wf_tokenizer_*) and the Chrome/Perfetto trace of
 * the job (wf_trace_*).
 */
#ifndef WF_IO_H
#define WF_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wf_config.h"
#include "wf_runtime.h"

/*
 * wf_data.h - training data: llm.c token shards, raw text bytes, or a synthetic chain.
 *
 * Sources (chosen by data.path):
 *  - ""                 : a built-in synthetic source, a fixed first-order Markov chain
 *                         over the first K = min(V, 64) symbols whose entropy rate (the
 *                         loss floor) is computed exactly;
 *  - a glob or a *.bin  : llm.c token shards (int32[256] header: magic 20240520,
 *                         version 1, token count; then uint16 tokens), concatenated in
 *                         sorted order;
 *  - any other file     : raw text, one token per byte (vocabulary 256).
 * For files the last data.val_fraction of the tokens is the validation split; windows
 * never cross from one split into the other.
 *
 * Determinism (the equivalence principle): a batch is a pure function of
 * (seed, split, index, global row). The global batch has `batch_size` rows; dp rank r
 * of D, micro-batch m of M gets rows r*(batch_size/D) + m*rows .. + rows - 1 with
 * rows = batch_size / (D*M). So any mesh and any number of micro-batches sees the same
 * global batch, row for row, and a resumed run sees the same data.
 *
 * Shapes: B rows of a micro-batch, T tokens per row; a row is a window of T+1 tokens,
 * inputs are its first T, targets its last T.
 */

typedef struct wf_data wf_data;

typedef enum wf_data_kind { WF_DATA_SYNTHETIC = 0, WF_DATA_TEXT, WF_DATA_SHARDS } wf_data_kind;
typedef enum wf_data_split { WF_DATA_TRAIN = 0, WF_DATA_VAL = 1 } wf_data_split;

typedef struct wf_data_opts {
  const char *path;      /* "" or NULL: synthetic; a text file; a glob of llm.c shards */
  int vocab;             /* the model's real vocabulary V; every token must be < V */
  int seq_len;           /* T */
  int batch_size;        /* global batch, in rows */
  uint64_t seed;         /* sampling seed (train.seed) */
  double val_fraction;   /* in [0, 1); files only: the tail held out for validation */
  const char *val_path;  /* "" or NULL: the held-out tail; else validation data of the
                          * same kind as path (text, or llm.c shards), used instead */
  const char *tokenizer; /* "" or NULL: text is read as bytes (vocab <= 256 only); else a
                          * GPT-2 BPE (wf_tokenizer_load) that encodes text files */
} wf_data_opts;

/* Open a source. On error writes what was wrong, naming the file and what was expected,
 * into err and returns WF_EFORMAT (malformed file), WF_EIO (cannot open) or WF_ECONFIG. */
wf_status wf_data_open(wf_data **out, const wf_data_opts *o, char *err, size_t err_len);
/* The same with options from a validated config and the model's vocabulary. */
wf_status wf_data_open_config(wf_data **out, const wf_config *cfg, int vocab, char *err,
                              size_t err_len);
/* What can be checked before a job starts, cheaply and the same on every rank, so it is
 * reported once like a config error: data.path and data.val_path exist, are regular
 * files (a FIFO, device or directory is refused before any open that could block), a
 * glob matches, llm.c shard headers agree with the file sizes, the tokenizer loads,
 * and text under a vocabulary above 256 has a tokenizer. vocab 0: unknown (model.init
 * sets it), the vocabulary rules wait for wf_data_open. Reads at most 1 KiB per shard
 * (and the tokenizer files); token values are checked by wf_data_open. */
wf_status wf_data_check(const wf_config *cfg, int vocab, char *err, size_t err_len);
void wf_data_destroy(wf_data *d); /* accepts NULL */

wf_data_kind wf_data_get_kind(const wf_data *d);
/* One line for the start-up log, e.g. "text file 'a.txt' read as bytes: the model sees
 * byte values 0-255, not words (...), 1000 tokens (train 900, val 100)". */
const char *wf_data_describe(const wf_data *d);
/* Entropy rate of the synthetic chain in nats per token (the loss floor); NAN for files. */
double wf_data_entropy_floor(const wf_data *d);
/* Tokens in a split (for the synthetic source: 0, it is unbounded). */
int64_t wf_data_num_tokens(const wf_data *d, wf_data_split split);
/* Rows of one micro-batch: batch_size / (dp_size * micro_count); 0 if it does not divide. */
int wf_data_rows(const wf_data *d, int dp_size, int micro_count);

/* Fill inputs and targets (rows, T) with micro-batch `micro` of `micro_count` of dp rank
 * `dp_rank` of `dp_size`, from global batch `index` of `split` (the step, 0-based, for
 * training; the evaluation batch number for validation). WF_EINVAL when the slice does
 * not exist or the split is empty. */
wf_status wf_data_batch(const wf_data *d, int *inputs, int *targets, wf_data_split split,
                        int64_t index, int dp_rank, int dp_size, int micro, int micro_count);

/* The T+1 tokens of one global row (inputs are win[0..T-1], targets win[1..T]). */
wf_status wf_data_row(const wf_data *d, int *win, wf_data_split split, int64_t index, int64_t row);

/*
 * wf_tokenizer - GPT-2's byte-level BPE (Radford et al. 2019; OpenAI's encoder.py, Hugging
 * Face's ByteLevel BPE), in C.
 *
 * Files: a Hugging Face tokenizer.json (model.type "BPE" with a ByteLevel pre-tokenizer;
 * vocab, merges as "a b" strings or [a, b] pairs, added_tokens), or GPT-2's vocab.json
 * with merges.txt; wf_tokenizer_load takes either file, or a folder holding them.
 *
 * Encoding: special tokens (added_tokens marked special; <|endoftext|> for vocab.json)
 * are cut out of the text first and map to their ids; each piece between them is split
 * by GPT-2's pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (PCRE2, Unicode properties; \s is Unicode White_Space, as in Python's regex module),
 * each pre-token's UTF-8 bytes are mapped to GPT-2's printable byte alphabet and merged
 * by BPE: repeatedly the adjacent pair with the lowest merge rank, leftmost first.
 * Decoding maps the byte alphabet back, so decode(encode(text)) == text for any bytes,
 * valid UTF-8 or not.
 *
 * Invariants: a loaded tokenizer is immutable (share it between threads); every merge's
 * parts and result are in the vocabulary (checked at load); ids are < wf_tokenizer_vocab.
 * Errors name the file and what was wrong in it.
 */

typedef struct wf_tokenizer wf_tokenizer;

/* A growable array of token ids (zero-initialise; wf_tokens_free releases it). */
typedef struct wf_tokens {
  int32_t *ids;
  size_t n, cap;
} wf_tokens;
void wf_tokens_free(wf_tokens *t);

/* path: tokenizer.json, vocab.json (merges.txt beside it) or a folder with either. */
wf_status wf_tokenizer_load(wf_tokenizer **out, const char *path, char *err, size_t err_len);
void wf_tokenizer_destroy(wf_tokenizer *t); /* accepts NULL */
/* Largest id + 1 (GPT-2: 50257). */
int wf_tokenizer_vocab(const wf_tokenizer *t);
/* The id of <|endoftext|>, or -1 when the vocabulary has none (GPT-2: 50256). */
int wf_tokenizer_eot(const wf_tokenizer *t);
/* "GPT-2 BPE 'tokenizer.json': 50257 tokens, 50000 merges". */
const char *wf_tokenizer_describe(const wf_tokenizer *t);

/* Append the ids of text[0 .. len) (any bytes) to out. WF_ENOMEM only. */
wf_status wf_tokenizer_encode(const wf_tokenizer *t, const char *text, size_t len, wf_tokens *out);
/* The bytes of ids[0 .. n) into out[0 .. cap) (not NUL-terminated); *len is the full
 * length, which may exceed cap (then only cap bytes were written). WF_EINVAL when an id
 * is not in the vocabulary. */
wf_status wf_tokenizer_decode(const wf_tokenizer *t, const int32_t *ids, size_t n, char *out,
                              size_t cap, size_t *len);

/* worker --tokenize: encode text file `in` and write llm.c token shards (int32[256]
 * header {20240520, 1, n}, uint16 tokens) PREFIX_val_000000.bin (the last val_fraction
 * of the tokens) and PREFIX_train_000000.bin, ... (100M tokens per file, as llm.c's
 * fineweb.py), each written atomically. The stream starts with <|endoftext|> when the
 * vocabulary has one (llm.c's documents start with it). Ids must fit uint16. A summary
 * line goes to `summary`. */
wf_status wf_tokenize_file(const wf_tokenizer *t, const char *in, const char *prefix,
                           double val_fraction, char *summary, size_t summary_len, char *err,
                           size_t err_len);
/* The vocabulary size of the tokenizer at path (loaded and dropped); else the reason in
 * err. */
wf_status wf_tokenizer_vocab_of(const char *path, int *vocab, char *err, size_t err_len);
/* worker --tokenize IN PREFIX: the same with data.tokenizer and data.val_fraction of
 * cfg; an error is logged (WF_ECONFIG: the text, the tokenizer or the keys are wrong). */
wf_status wf_tokenize_config(const wf_config *cfg, const char *in, const char *prefix,
                             char *summary, size_t summary_len);

/*
 * wf_trace.h - a per-rank span recorder that writes one Chrome/Perfetto trace for the job.
 *
 * Each rank records complete spans (name, category, start, end, step, micro-batch) into a
 * buffer sized once at creation; wf_trace_write gathers every rank's spans on rank 0, which
 * writes a single Trace Event Format file with one process per world rank (pid = the
 * rank, named by the recorder's label) and in it one thread (tid) per kind of work: 0
 * "compute" (category compute), 1 "communication" (comm, wait), 2 "optimizer step"
 * (optim). Open it in https://ui.perfetto.dev or chrome://tracing.
 *
 * Invariants:
 *  - Recording never allocates: spans past max_spans are dropped and counted, so tracing
 *    cannot change the memory or timing profile of the step it observes beyond a store.
 *  - Spans are recorded by one thread per rank (the trainer's); the recorder has no locks.
 *  - Spans keep the order they were recorded in, within their rank's threads in the file.
 *  - Times are wf_now() seconds on the recording rank; the file puts every rank on rank 0's
 *    clock (offset estimated by MPI ping-pong) in microseconds from the earliest span.
 *  - wf_trace_write is collective over the whole job and returns the same status on every
 *    rank, so one rank's error never leaves another waiting.
 */

typedef struct wf_trace wf_trace;
struct wf_comm; /* wf_collectives.h */

/* Longest span name and category kept; longer ones are truncated. The names the worker
 * records are at most 33 characters ("step end (reduction, norm, AdamW)"). */
#define WF_TRACE_NAME_MAX 63
#define WF_TRACE_CAT_MAX  15

/* Recorder for this rank; `label` names its track, e.g. "rank 3 (pp 1, dp 0, tp 1)". Spans
 * beyond max_spans (>= 1) are dropped and counted. The recorder starts off. */
wf_status wf_trace_create(wf_trace **out, const char *label, size_t max_spans);
void wf_trace_destroy(wf_trace *t); /* NULL ok */

/* Record only while on (the trainer turns it on for train.trace_steps). NULL: no-op/false,
 * so call sites need no check when tracing is disabled. */
void wf_trace_set_on(wf_trace *t, bool on);
bool wf_trace_on(const wf_trace *t);

/* One complete span while on: t0 <= t1 from wf_now() (t1 < t0 is clamped to t0); name e.g.
 * "F3"; cat "compute" | "comm" | "optim" | "wait"; step and micro-batch go to the event's
 * args (left out when -1). Both strings are copied. */
void wf_trace_span(wf_trace *t, const char *name, const char *cat, double t0, double t1, int step,
                   int mb);

/* Spans kept, and spans dropped because the buffer was full. */
size_t wf_trace_count(const wf_trace *t);
size_t wf_trace_dropped(const wf_trace *t);

/* Collective over MPI_COMM_WORLD (every rank calls it; `t` may be NULL on a rank with nothing
 * to record and `path` is read on rank 0 only). Rank 0 writes the trace to `path` atomically
 * (a temporary file renamed into place). `world` is the job's communicator over every rank
 * (NULL only for a job of one rank): the outcome is agreed over it (wf_comm_agree), so
 * every rank returns the same status: WF_EIO when the file cannot be written (logged on
 * rank 0 with the path and the reason). */
wf_status wf_trace_write(wf_trace *t, struct wf_comm *world, const char *path);

/* Seconds inside [t0, t1] covered by at least one span of category `cat` (NULL: any), on
 * this rank's clock; overlapping spans count once. For the measured pipeline bubble. */
double wf_trace_busy(const wf_trace *t, const char *cat, double t0, double t1);

#endif /* WF_IO_H */
