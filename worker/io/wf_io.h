/*
 * wf_io.h - what the worker reads and writes besides checkpoints: training data
 * (wf_data_*), the tokenizers (wf_tokenizer_*: GPT-2's and Llama 3's BPE) and the Chrome/Perfetto
 * trace of the job (wf_trace_*).
 */
#ifndef WF_IO_H
#define WF_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wf_config.h"
#include "wf_runtime.h"
#include "wf_trace.h"

/*
 * wf_data - training data: llm.c token shards, raw text bytes, or a synthetic chain.
 *
 * Sources (chosen by data.path):
 *  - ""                 : a built-in synthetic source, a fixed first-order Markov chain
 *                         over the first K = min(V, 64) symbols whose entropy rate (the
 *                         loss floor) is computed exactly;
 *  - a glob or a *.bin  : llm.c token shards (int32[256] header: magic 20240520,
 *                         version 1, token count, then uint16 tokens (GPT-2); or magic
 *                         20240801, version 7, then uint32 tokens (Llama 3)),
 *                         concatenated in sorted order;
 *  - any other file     : raw text, one token per byte (vocabulary 256).
 * For files the last data.val_fraction of the tokens is the validation split; windows
 * never cross from one split into the other.
 * Or, with data.source, streams (worker/io/stream.c): JSON Lines files, plain or zstd,
 * tokenized on a background thread, mixed by weight (data.mix) and packed into rows of
 * whole documents one after another; validation from data.val_path (JSON Lines).
 *
 * Determinism (the equivalence principle): a batch is a pure function of
 * (seed, split, index, global row). The global batch has `batch_size` rows; dp rank r
 * of D, micro-batch m of M gets rows r*(batch_size/D) + m*rows .. + rows - 1 with
 * rows = batch_size / (D*M). So any mesh and any number of micro-batches sees the same
 * global batch, row for row, and a resumed run sees the same data. A stream is not a
 * pure function of the step but of its position, which it keeps per global row (a lane)
 * and a checkpoint saves (wf_data_state_*): its batches are asked for in step order, and
 * a resumed run, on any dp, reads what the uninterrupted run reads.
 *
 * Shapes: B rows of a micro-batch, T tokens per row; a row is a window of T+1 tokens,
 * inputs are its first T, targets its last T. starts (B, T): where the document of each
 * input position starts in its row (streams; 0 everywhere for the other sources, whose
 * rows are one stretch of text).
 */

typedef struct wf_data wf_data;

typedef enum wf_data_kind {
  WF_DATA_SYNTHETIC = 0,
  WF_DATA_TEXT,
  WF_DATA_SHARDS,
  WF_DATA_STREAM
} wf_data_kind;
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
                          * tokenizer (wf_tokenizer_load) that encodes text files */
  /* data.source: JSON Lines streams instead of path (n_source > 0); val_path is then
   * JSON Lines too */
  int n_source;
  const char *source[WF_DATA_MAX_SOURCES]; /* files or globs */
  double mix[WF_DATA_MAX_SOURCES];         /* weights (n_mix of them; 0: equal) */
  int n_mix;
  const char *field[WF_DATA_MAX_SOURCES]; /* each source's JSON key of the text */
  int dp_rank, dp_size; /* streams: the dp slice this rank reads (dp_size 0: all rows) */
} wf_data_opts;

/* Open a source. On error writes what was wrong, naming the file and what was expected,
 * into err and returns WF_EFORMAT (malformed file), WF_EIO (cannot open) or WF_ECONFIG. */
wf_status wf_data_open(wf_data **out, const wf_data_opts *o, char *err, size_t err_len);
/* The same with options from a validated config and the model's vocabulary, sequences of
 * seq_len tokens (0: the config's train.seq_len); streams are read for dp rank dp_rank of
 * dp_size. */
wf_status wf_data_open_config(wf_data **out, const wf_config *cfg, int vocab, int seq_len,
                              int dp_rank, int dp_size, char *err, size_t err_len);
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
/* Tokens in a split (for the synthetic source and streams: 0, they are unbounded). */
int64_t wf_data_num_tokens(const wf_data *d, wf_data_split split);
/* Whether there are validation batches (the synthetic source's own, a file's held-out
 * tail or data.val_path). */
bool wf_data_has_val(const wf_data *d);
/* Rows of one micro-batch: batch_size / (dp_size * micro_count); 0 if it does not divide. */
int wf_data_rows(const wf_data *d, int dp_size, int micro_count);

/* Fill inputs and targets (rows, T), and starts (rows, T) unless NULL, with micro-batch
 * `micro` of `micro_count` of dp rank `dp_rank` of `dp_size`, from global batch `index`
 * of `split` (the step, 0-based, for training; the evaluation batch number for
 * validation). WF_EINVAL when the slice does not exist or the split is empty. A stream
 * gives the step it holds or the next one (the one before it is then gone); a stream's
 * failure (a bad line) is logged here. */
wf_status wf_data_batch(wf_data *d, int *inputs, int *targets, int *starts, wf_data_split split,
                        int64_t index, int dp_rank, int dp_size, int micro, int micro_count);
/* Bytes a data.source stream's loader allocates through the runtime's memory layer for
 * `lanes` lanes of T tokens (its ring of steps made ahead): what the planner counts. */
size_t wf_data_loader_bytes(int lanes, int T);
/* Streams: wait until batch index of split is made, and say why it cannot be into err (a
 * missing file, a line that is not JSON, a document without the data.field key: the file
 * and line named). Every rank calls it before the step and agrees on the outcome, so a
 * bad line found by one rank stops every rank alike. Other sources: WF_OK at once. */
wf_status wf_data_ready(wf_data *d, wf_data_split split, int64_t index, char *err, size_t err_len);

/* The position of a stream, for checkpoints (other sources are pure functions of the
 * step and have none: length 0). wf_data_state_get writes this rank's part of it
 * before step index's batch (the step after the last one trained) into v (len uint64,
 * zero elsewhere): the element-wise maximum over every rank that read the stream is the
 * whole position, which wf_data_state_json writes as JSON (malloc'd; NULL: out of
 * memory). wf_data_state_set, before the first batch, puts a fresh stream there on any
 * dp; WF_ECONFIG (the reason in err) when the JSON's data is not this run's (other
 * files, sizes, lanes or tokenizer). */
size_t wf_data_state_len(const wf_data *d);
wf_status wf_data_state_get(wf_data *d, int64_t index, uint64_t *v, char *err, size_t err_len);
char *wf_data_state_json(const wf_data *d, int64_t index, const uint64_t *v);
wf_status wf_data_state_set(wf_data *d, const char *json, char *err, size_t err_len);

/* The T+1 tokens of one global row (inputs are win[0..T-1], targets win[1..T]). */
wf_status wf_data_row(const wf_data *d, int *win, wf_data_split split, int64_t index, int64_t row);

/*
 * wf_tokenizer - byte-level BPE, in C: GPT-2's (Radford et al. 2019; OpenAI's encoder.py,
 * Hugging Face's ByteLevel BPE) and Llama 3's (Meta's tokenizer.py over tiktoken).
 * docs/tokenizers.md is the reference.
 *
 * Files (the kind is told from the file's content, never from a key):
 *  - GPT-2: a Hugging Face tokenizer.json (model.type "BPE" with a ByteLevel
 *    pre-tokenizer; vocab, merges as "a b" strings or [a, b] pairs, added_tokens), or
 *    GPT-2's vocab.json with merges.txt beside it;
 *  - Llama 3: tiktoken's ranks file (Meta's tokenizer.model: one "BASE64 RANK" line per
 *    token, ranks 0, 1, 2, ... in order) and the 256 special tokens that follow the ranks
 *    (<|begin_of_text|> = 128000, <|end_of_text|> = 128001, ..., <|eot_id|> = 128009).
 * wf_tokenizer_load takes a file or a folder holding one of them.
 *
 * Encoding: special tokens are cut out of the text first and map to their ids; each
 * piece between them is split by the kind's pattern (PCRE2, Unicode properties; \s is
 * Unicode White_Space), and each pre-token is taken whole when it is a token and the
 * kind says so (Llama 3, as tiktoken; HF's ignore_merges), else merged by BPE: the
 * adjacent pair of lowest rank first, the leftmost of equals.
 * Decoding concatenates each id's bytes, so decode(encode(text)) == text for any bytes,
 * valid UTF-8 or not. One token may hold part of a character (byte-level BPE splits
 * characters whose bytes are rare): decoding such a token alone gives those bytes,
 * not a character; wf_utf8_char_len tells a printer where characters end.
 *
 * Invariants: a loaded tokenizer is immutable (share it between threads); every merge's
 * parts and result are in the vocabulary (checked at load); ids are < wf_tokenizer_vocab.
 * Errors name the file and what was wrong in it (and the line, for line-based files).
 */

typedef struct wf_tokenizer wf_tokenizer;

/* A growable array of token ids (zero-initialise; wf_tokens_free releases it). */
typedef struct wf_tokens {
  int32_t *ids;
  size_t n, cap;
} wf_tokens;
void wf_tokens_free(wf_tokens *t);

/* path: tokenizer.json, vocab.json (merges.txt beside it), tokenizer.model, or a folder
 * holding one of them. */
wf_status wf_tokenizer_load(wf_tokenizer **out, const char *path, char *err, size_t err_len);
void wf_tokenizer_destroy(wf_tokenizer *t); /* accepts NULL */
/* Largest id + 1, specials included: the least model.vocab (GPT-2: 50257; Llama 3: 128256). */
int wf_tokenizer_vocab(const wf_tokenizer *t);
/* Whether the tokenizer fits a model of `vocab` ids, both ways: every id it gives is
 * below vocab, and the model has no more ids than the tokenizer's padded to a multiple
 * of 1024 (GPT-2 checkpoints pad 50257 to 50304); a larger model was trained with
 * another tokenizer, whose ids it would sample. WF_ECONFIG with the message otherwise;
 * vocab <= 0: unknown, WF_OK. */
wf_status wf_tokenizer_fits(const wf_tokenizer *t, int vocab, char *err, size_t err_len);
/* The id that ends a text, or -1 (GPT-2: <|endoftext|> 50256; Llama 3: <|end_of_text|>
 * 128001). */
int wf_tokenizer_eot(const wf_tokenizer *t);
/* The id that starts a document, or -1 (GPT-2: <|endoftext|> 50256, as llm.c separates
 * documents; Llama 3: <|begin_of_text|> 128000). */
int wf_tokenizer_bos(const wf_tokenizer *t);
/* Whether a text to continue (a sample's prompt) starts with wf_tokenizer_bos: Llama 3's
 * (Meta's generation encodes prompts with bos=True; Hugging Face's template adds it); not
 * GPT-2's. */
bool wf_tokenizer_adds_bos(const wf_tokenizer *t);
/* The id of special token `text` (e.g. "<|eot_id|>"), or -1. */
int wf_tokenizer_special(const wf_tokenizer *t, const char *text);
/* "GPT-2 BPE 'tokenizer.json': 50257 tokens (1 special), 50000 merges". */
const char *wf_tokenizer_describe(const wf_tokenizer *t);

/* Append the ids of text[0 .. len) (any bytes) to out. WF_ENOMEM only. */
wf_status wf_tokenizer_encode(const wf_tokenizer *t, const char *text, size_t len, wf_tokens *out);
/* The bytes of ids[0 .. n) into out[0 .. cap) (not NUL-terminated); *len is the full
 * length, which may exceed cap (then only cap bytes were written). WF_EINVAL when an id
 * is not in the vocabulary. */
wf_status wf_tokenizer_decode(const wf_tokenizer *t, const int32_t *ids, size_t n, char *out,
                              size_t cap, size_t *len);

/* Bytes of the whole, valid UTF-8 character at s[0 .. n): 1-4, or 0 when s starts none
 * (a continuation byte, an overlong form, a surrogate, or a character cut short). */
size_t wf_utf8_char_len(const void *s, size_t n);

/* worker --tokenize: encode text file `in` and write llm.c token shards
 * PREFIX_val_000000.bin (the last val_fraction of the tokens) and PREFIX_train_000000.bin,
 * ... (100M tokens per file, as llm.c's fineweb.py), each written atomically. The format
 * is llm.c's for the vocabulary: int32[256] header {20240520, 1, n} and uint16 tokens up
 * to 65536 ids (GPT-2), else header {20240801, 7, n} and uint32 tokens (llm.c's
 * "llama-3"). The stream starts with the tokenizer's document start when it has one
 * (wf_tokenizer_bos: llm.c's documents start with it). A summary line goes to `summary`. */
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
 * The job's trace file: every rank's spans (the runtime's recorder, wf_trace.h) in one
 * Chrome/Perfetto Trace Event Format file with one process per world rank (pid = the
 * rank, named by the recorder's label) and in it one thread (tid) per kind of work: 0
 * "compute" (category compute), 1 "communication" (comm, wait), 2 "optimizer step"
 * (optim). Open it in https://ui.perfetto.dev or chrome://tracing. Times are put on rank
 * 0's clock (offset estimated by MPI ping-pong) in microseconds from the earliest span.
 */
struct wf_comm; /* wf_collectives.h */

/* Collective over MPI_COMM_WORLD (every rank calls it; `t` may be NULL on a rank with nothing
 * to record and `path` is read on rank 0 only). Rank 0 writes the trace to `path` atomically
 * (a temporary file renamed into place). `world` is the job's communicator over every rank
 * (NULL only for a job of one rank): the outcome is agreed over it (wf_comm_agree), so
 * every rank returns the same status: WF_EIO when the file cannot be written (logged on
 * rank 0 with the path and the reason). */
wf_status wf_trace_write(wf_trace *t, struct wf_comm *world, const char *path);

/*
 * TensorBoard event files (train.tensorboard=DIR; tfevents.c has the format). One
 * writer, on one rank: each step's scalars are one record, flushed at once, so
 * TensorBoard can watch a running job. A write that fails later is said once and the
 * writer goes quiet; training goes on.
 */
typedef struct wf_tfevents wf_tfevents;
typedef struct wf_tfevents_scalar {
  const char *tag;   /* "train/loss", "memory/params_mib", ... */
  double value;      /* written as a float32, TensorBoard's scalar */
  const char *about; /* the tag's description, sent with its first value in a file; NULL = none */
} wf_tfevents_scalar;

/* Create DIR (and its parents) when missing and start the first event file in it; a
 * directory that cannot be written is WF_ECONFIG, said with the key and the fix.
 * roll_bytes > 0: a file that grows past it is closed and the next one started. */
wf_status wf_tfevents_open(wf_tfevents **out, const char *dir, int64_t roll_bytes);
/* A run resumed from a checkpoint restarts at `step`: a SessionLog START there makes
 * TensorBoard drop the steps >= step an earlier, killed run had written. */
wf_status wf_tfevents_restart(wf_tfevents *w, int64_t step);
/* One step's scalars (wall: seconds since the epoch). */
wf_status wf_tfevents_write(wf_tfevents *w, int64_t step, double wall, const wf_tfevents_scalar *v,
                            int n);
const char *wf_tfevents_path(const wf_tfevents *w); /* the file now written */
void wf_tfevents_close(wf_tfevents *w);             /* accepts NULL */
/* CRC-32C (Castagnoli) of n bytes, unmasked: for tests. */
uint32_t wf_tfevents_crc32c(const void *data, size_t n);

#endif /* WF_IO_H */
