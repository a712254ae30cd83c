/*
 * kernels_int.h - what bench/kernels.c (the runner: options, the device, its peaks, the
 * timing and the table it prints) and bench/kernels_rows.c (the rows, one per entry of
 * every op's table, and the buffers they use, by role) share.
 */
#ifndef BENCH_KERNELS_INT_H
#define BENCH_KERNELS_INT_H

#include <stddef.h>

#include "wf_device.h"
#include "wf_kernels.h"

typedef struct shape {
  int B, T, C, NH, V, L; /* batch, sequence, channels, heads, vocabulary, layers */
  int lowp;              /* wf_precision of the GEMMs' operands */
} shape;

/* Buffer roles: what a row may use. Sizes in elements of the shape; values drawn in
 * [lo, hi) so that every kernel sees the inputs it expects (positive rstd and second
 * moments, tokens inside the vocabulary). */
typedef enum role {
  ACT0,
  ACT1,
  ACT2,
  ACT3,
  ACT4, /* (N, 4C) activations and the gradients a table stores in its format */
  GRAD0,
  GRAD1, /* (N, 4C) fp32 outputs (float *): written only here, so that a 16-bit table never
            reads an fp32 value's low half as an activation */
  WT0,
  WT1,
  WT2,
  WT3, /* (max(V, 4C), C) weights and their gradients */
  ROW0,
  ROW1,
  ROW2,
  ROW3, /* (N, 3 x 2): per-row statistics, signed */
  POS0,
  POS1,   /* the same, positive (rstd, sumexp) */
  LOGITS, /* (N, V) */
  TOK,    /* (N) tokens in [0, V), int */
  PAR0,
  PAR1,
  PAR2,
  PAR3, /* the model's parameters, AdamW's m, v (positive), grads */
  ATT,
  SCRATCH, /* attention's saved floats and backward's scratch */
  ACC,
  BAD, /* a double accumulator, an int flag */
  QKV16,
  OUT16,
  DOUT16,
  DQKV16,   /* bf16 attention: (N, 3C) in and its gradient, (N, C) out and its gradient */
  LOGITS16, /* (N, V) bf16 */
  PAR16,    /* (the parameters) bf16: the model's 16-bit weight copy */
  LSE,
  SCRATCH16, /* bf16 attention's lse (B, NH, T) and its backward's scratch, floats */
  MIDX,
  MPOS,
  MCNT, /* a mixture of experts' (N, K) choices in [0, E), their rows (N, K), E counts: int */
  DOCS, /* (N) document starts, int: packed documents of DOC_LEN tokens */
  N_ROLES
} role;

/* The mixture of experts' rows: Mixtral's routing. */
#define MOE_E 8
#define MOE_K 2

typedef struct bench {
  wf_dev *dev;
  const wf_kset *k;
  wf_stream *s;
  shape sh;
  void *buf[N_ROLES];
  int failed; /* a buffer could not be made */
} bench;

typedef struct row {
  const char *label;
  int op;        /* the op timed (wf_op_id) */
  size_t member; /* offsetof(wf_<op>_op, member): the entry timed */
  int gemm;
  void (*run)(bench *b);
  void (*cost)(bench *b, double *flops, double *bytes);
} row;

/* The rows, in model order (kernels_rows.c). */
extern const row kbench_rows[];
extern const size_t kbench_n_rows;

/* The parameters of the shape's model. */
size_t kbench_params(const shape *s);
/* Every entry of every op's table (each table is entry pointers only) is a row or listed
 * as launching nothing; returns how many are neither, after naming them. */
int kbench_unbenched(void);

#endif
