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
#ifndef WF_DATA_H
#define WF_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "wf_config.h"
#include "wf_runtime.h"

typedef struct wf_data wf_data;

typedef enum wf_data_kind { WF_DATA_SYNTHETIC = 0, WF_DATA_TEXT, WF_DATA_SHARDS } wf_data_kind;
typedef enum wf_data_split { WF_DATA_TRAIN = 0, WF_DATA_VAL = 1 } wf_data_split;

typedef struct wf_data_opts {
  const char *path;    /* "" or NULL: synthetic; a text file; a glob of llm.c shards */
  int vocab;           /* the model's real vocabulary V; every token must be < V */
  int seq_len;         /* T */
  int batch_size;      /* global batch, in rows */
  uint64_t seed;       /* sampling seed (train.seed) */
  double val_fraction; /* in [0, 1); files only: the tail held out for validation */
} wf_data_opts;

/* Open a source. On error writes what was wrong, naming the file and what was expected,
 * into err and returns WF_EFORMAT (malformed file), WF_EIO (cannot open) or WF_ECONFIG. */
wf_status wf_data_open(wf_data **out, const wf_data_opts *o, char *err, size_t err_len);
/* The same with options from a validated config and the model's vocabulary. */
wf_status wf_data_open_config(wf_data **out, const wf_config *cfg, int vocab, char *err,
                              size_t err_len);
void wf_data_destroy(wf_data *d); /* accepts NULL */

wf_data_kind wf_data_get_kind(const wf_data *d);
/* One line for the start-up log, e.g. "text file 'a.txt': 1000 bytes (train 900, val 100)". */
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

#endif /* WF_DATA_H */
