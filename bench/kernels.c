/*
 * kernels.c - every entry of the device's kernel table (kernels/wf_kreg.h), timed at
 * given shapes, against the device's peaks.
 *
 *   kernels [--device auto|cpu|cuda] [--precision fp32|bf16] [-B 16] [-T 1024] [-C 768]
 *           [--heads 12] [-V 50257] [--layers 12] [--threads N] [--tf32]
 *           [--attention auto|cudnn|flash|reference] [--reps N] [--only SUBSTRING]
 *           [--json FILE]
 *
 * Defaults are GPT-2 124M (gpt2-small) at B 16, T 1024. The device is the GPU when one
 * is usable (auto), else the CPU; --device cuda without a GPU exits 77 (no GPU) or 1
 * (a GPU weft cannot use), as the GPU tests do.
 *
 * Columns: ms per call (events around `reps` back-to-back calls on one stream, after
 * two warm-up calls; reps chosen so a row takes ~50 ms, unless --reps), FLOPs and bytes
 * per call, achieved TFLOP/s and GB/s, and each as a percent of the device's peak:
 *  - FLOPs are the op's arithmetic: 2·m·n·k per GEMM; causal attention 2·B·T²·C forward
 *    and 2.5 times that backward (FlashAttention's convention); elementwise and
 *    reduction ops count the operations of their formula with exp, tanh, log and sqrt
 *    as one each (nominal: their figure of merit is GB/s).
 *  - Bytes are the least the op must move as the table defines it: each input read
 *    once, each output written once, an output it adds into ("backward adds into
 *    gradients") read and written; an activation (the table's `void *` arguments) in
 *    the table's format, 2 bytes at bf16 and 4 at fp32, everything else 4, and 2 bytes an
 *    element for the bf16 entries' bf16 tensors.
 *  - The table: at --precision bf16, the device's bf16 table (storage.h), the kernels a
 *    precision=bf16 run calls; at fp32 the fp32 table.
 *  - Peak FLOP/s: GEMMs at --precision bf16 against the 16-bit tensor cores, at fp32
 *    against fp32 without TF32 (weft's default, runtime.allow_tf32 false); the bf16
 *    attention entries against the 16-bit tensor cores; everything else against fp32.
 *  - Attention runs the path runtime.attention would take (--attention; default as the
 *    worker: auto, i.e. cuDNN else the flash kernels, at bf16, the fp32 reference at
 *    fp32); the module logs the path each shape takes. GPU: runtime/peak.c's datasheet table (what
 * MFU divides by) and the datasheet's HBM bandwidth. CPU: the nominal fp32 peak of the threads'
 * cores (their bf16 dot-product peak for the bf16 GEMMs and attention when oneDNN runs the bf16
 * GEMMs), and a bandwidth measured here (a STREAM triad over 3 x 128 MiB on those threads).
 *
 * Adding an op (wf_kreg.h) is one KERNEL row below per entry of its table (the op and
 * entry it times, a label, FLOPs, bytes, the call). The bench refuses to run when an
 * entry of any op has no row (exit 1, naming it), so a new entry cannot go unmeasured. Buffers are
 * named by role (act, wt, rows, ...: see `roles`), allocated and filled with values
 * of the right kind on first use; rows run in table order, so a backward row finds
 * what its forward row saved.
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "threads.h"
#include "wf_build_id.h"
#include "wf_config.h"
#include "wf_device.h"
#include "wf_gpu.h"
#include "wf_kernels.h"
#include "wf_peak.h"

/* ---- shapes and buffers ------------------------------------------------------------ */

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

/* The model's GEMM width of the vocabulary (worker/model/family.c): a multiple of 128,
 * for the tensor cores' tiles. The loss kernels read the V real columns of rows of Vp. */
static int padded_vocab(const shape *s) { return (s->V + 127) / 128 * 128; }

static size_t params_of(const shape *s)
{
  size_t C = (size_t)s->C;
  return (size_t)s->V * C + (size_t)s->T * C + (size_t)s->L * (12 * C * C + 13 * C) + 2 * C;
}

/* The packed documents' length (data.document_mask): an eighth of the sequence, so each
 * query attends to at most T/8 keys (attention.h's starts). */
static int doc_len(const shape *s) { return WF_MAX(s->T / 8, 1); }

/* Elements of a role's buffer, and its element size. */
static size_t role_elems(const bench *b, role r, size_t *esize)
{
  const shape *s = &b->sh;
  size_t N = (size_t)s->B * s->T, C = (size_t)s->C;
  *esize = sizeof(float);
  if (r == DOCS)
    return *esize = sizeof(int), N;
  if (r <= GRAD1)
    return N * 4 * C;
  if (r <= WT3)
    return (size_t)WF_MAX(padded_vocab(s), 4 * s->C) * C;
  if (r <= POS1)
    return N * 6;
  if (r == LOGITS)
    return N * (size_t)padded_vocab(s);
  if (r == TOK)
    return *esize = sizeof(int), N;
  if (r <= PAR3)
    return params_of(s);
  if (r == ATT)
    return WF_K(b->k, attention)->saved(s->B, s->T, s->C, s->NH);
  if (r == SCRATCH)
    return WF_K(b->k, attention)->scratch(s->B, s->T, s->C, s->NH);
  if (r == ACC)
    return *esize = sizeof(double), 1;
  if (r == BAD)
    return *esize = sizeof(int), 1;
  if (r <= PAR16)
    *esize = sizeof(wf_bf16);
  if (r == PAR16)
    return params_of(s);
  if (r == QKV16 || r == DQKV16)
    return N * 3 * C;
  if (r == OUT16 || r == DOUT16)
    return N * C;
  if (r == LOGITS16)
    return N * (size_t)padded_vocab(s);
  if (r == LSE)
    return (size_t)s->B * s->NH * s->T;
  if (r == MIDX || r == MPOS)
    return *esize = sizeof(int), N * MOE_K;
  if (r == MCNT)
    return *esize = sizeof(int), MOE_E;
  return WF_K(wf_kset_as(b->k, WF_DT_BF16), attention_lse)->scratch(s->B, s->T, s->C, s->NH, s->NH);
}

static void role_range(role r, float *lo, float *hi)
{
  *lo = -1.0f, *hi = 1.0f;
  if (r >= WT0 && r <= WT3)
    *lo = -0.05f, *hi = 0.05f;
  else if (r == POS0 || r == POS1 || r == PAR2)
    *lo = 0.5f, *hi = 1.5f;
  else if (r == LOGITS || r == LOGITS16)
    *lo = -4.0f, *hi = 4.0f;
  else if (r >= PAR0 && r <= PAR3)
    *lo = -1e-3f, *hi = 1e-3f;
}

/* Fill `n` elements at device pointer p from a host pattern of random values (a tile of
 * up to 1 Mi elements copied over and over: big buffers fill in one pass of copies). */
static wf_status fill(bench *b, role r, void *p, size_t n, size_t esize)
{
  /* (document starts repeat every T: their one tile is the whole buffer) */
  size_t tile = r == DOCS ? n : WF_MIN(n, (size_t)1 << 20), done = 0;
  unsigned char *h = malloc(tile * esize);
  float lo, hi;
  wf_status st = h ? WF_OK : WF_ENOMEM;
  role_range(r, &lo, &hi);
  for (size_t i = 0; h && i < tile; i++) {
    float u = wf_rng_uniform(20250101u, (uint64_t)r, i);
    if (r == DOCS) {
      int t = (int)(i % (size_t)b->sh.T), st = t - t % doc_len(&b->sh);
      memcpy(h + i * esize, &st, sizeof st);
    } else if (r == TOK || r == BAD) {
      int t = (int)(wf_rng_u64(20250101u, (uint64_t)r, i) % (uint64_t)b->sh.V);
      memcpy(h + i * esize, &t, sizeof t);
    } else if (r == MIDX || r == MPOS || r == MCNT) { /* experts; rows in expert order */
      int t = r == MIDX ? (int)(wf_rng_u64(20250101u, (uint64_t)r, i) % MOE_E) : (int)i;
      memcpy(h + i * esize, &t, sizeof t);
    } else if (esize == sizeof(float) && b->sh.lowp == WF_PREC_BF16) {
      /* The bf16 table's entries read activations and weights as pairs of bf16: two
       * values in range (a float's low half read as bf16 has any exponent, NaN and Inf
       * included: not what a model's GEMMs see). An fp32 reader sees the second (the
       * high half), with extra low bits. */
      float u2 = wf_rng_uniform(20250102u, (uint64_t)r, i);
      wf_bf16 v[2] = {wf_bf16_from_float(lo + (hi - lo) * u),
                      wf_bf16_from_float(lo + (hi - lo) * u2)};
      memcpy(h + i * esize, v, sizeof v);
    } else if (esize == sizeof(float)) {
      float v = lo + (hi - lo) * u;
      memcpy(h + i * esize, &v, sizeof v);
    } else if (esize == sizeof(wf_bf16)) {
      wf_bf16 v = wf_bf16_from_float(lo + (hi - lo) * u);
      memcpy(h + i * esize, &v, sizeof v);
    } else {
      memset(h + i * esize, 0, esize);
    }
  }
  for (; st == WF_OK && done < n; done += tile) {
    size_t m = WF_MIN(tile, n - done);
    st = wf_dev_copy(b->dev, (char *)p + done * esize, h, m * esize, WF_COPY_H2D, b->s);
  }
  if (st == WF_OK)
    st = wf_dev_stream_sync(b->dev, b->s);
  free(h);
  return st;
}

/* The buffer of role r, made on first use. */
static void *buf(bench *b, role r)
{
  if (b->buf[r] || b->failed)
    return b->buf[r];
  size_t esize, n = role_elems(b, r, &esize);
  if (wf_dev_alloc(b->dev, &b->buf[r], WF_MAX(n, 1) * esize) != WF_OK ||
      fill(b, r, b->buf[r], n, esize) != WF_OK) {
    fprintf(stderr, "kernels: cannot make a buffer of %zu bytes (role %d)\n", n * esize, r);
    b->failed = 1;
  }
  return b->buf[r];
}

/* ---- the rows ---------------------------------------------------------------------- */

/* Inside a row: the shape as ints (for the call) and as doubles (for FLOPs and bytes),
 * the table `k`, the stream `s`, and buffers by role: F(role) floats, I(role) ints. */
#define SHAPE_VARS(b)                                                                              \
  const wf_kset *k = (b)->k;                                                                       \
  wf_stream *s = (b)->s;                                                                           \
  int B = (b)->sh.B, T = (b)->sh.T, C = (b)->sh.C, NH = (b)->sh.NH, V = (b)->sh.V;                 \
  int Vp = padded_vocab(&(b)->sh), lowp = (b)->sh.lowp, N = B * T;                                 \
  size_t n4 = (size_t)N * 4 * (size_t)C, np = params_of(&(b)->sh);                                 \
  double dB = B, dT = T, dC = C, dV = V, dVp = Vp, dN = N, dP = (double)np;                        \
  double dDoc = doc_len(&(b)->sh); /* keys a query of a packed document sees, at most */           \
  int KV = NH % 2 ? NH : NH / 2;   /* Llama's rows: kv heads */                                    \
  double dQK = dN * (NH + KV) * (double)(C / NH); /* elements of the q and k heads */              \
  const wf_kset *K16 = wf_kset_as(k, WF_DT_BF16); /* the bf16-only ops' */                         \
  /* the whole sequence as one causal block (attention_block.h) */                                 \
  wf_attn_block AB = {.B = B,                                                                      \
                      .Tq = T,                                                                     \
                      .Tk = T,                                                                     \
                      .NH = NH,                                                                    \
                      .NKV = NH,                                                                   \
                      .hs = C / NH,                                                                \
                      .causal = true,                                                              \
                      .q_row = (size_t)C,                                                          \
                      .q_batch = (size_t)T * C,                                                    \
                      .kv_row = 2 * (size_t)C,                                                     \
                      .kv_batch = 2 * (size_t)T * C,                                               \
                      .o_row = (size_t)C,                                                          \
                      .o_batch = (size_t)T * C,                                                    \
                      .l_head = (size_t)T,                                                         \
                      .l_batch = (size_t)NH * T,                                                   \
                      .fmt = (int)k->dt};                                                          \
  double A = k->dt == WF_DT_F32 ? 4.0 : 2.0; /* bytes of a stored activation (void *) */           \
  (void)k, (void)K16, (void)AB, (void)s, (void)NH, (void)lowp, (void)n4, (void)dB, (void)dT,       \
      (void)dC, (void)dV, (void)dN, (void)dP, (void)KV, (void)dQK, (void)Vp, (void)dVp, (void)A,   \
      (void)dDoc
#define F(r) ((float *)buf(b, (r)))
#define I(r) ((int *)buf(b, (r)))
#define H(r) ((wf_bf16 *)buf(b, (r)))

/* The rows: KERNEL(id, op, member, label, FLOPs, bytes, gemm, call), in model order.
 * `member` is the entry of op's table (wf_<op>_op) timed; `gemm` is 1 where the precision's GEMM
 * peak applies, 2 where the 16-bit tensor cores' applies in every precision (bf16 attention).
 * Shapes: N = B*T tokens; a GEMM (N, C) x (OC, C)^T. */
#define KERNELS(KERNEL)                                                                            \
  KERNEL(emb_f, embedding, forward, "embedding_forward", 0, 4 * (2 * dN * dC + dN), 0,             \
         WF_K(k, embedding)->forward(F(GRAD0), I(TOK), F(WT0), 0, V, N, C, s))                     \
  KERNEL(emb_b, embedding, backward, "embedding_backward", dN *dC, 4 * (3 * dN * dC + dN), 0,      \
         WF_K(k, embedding)->backward(F(WT2), F(ACT0), I(TOK), 0, V, N, C, s))                     \
  KERNEL(pos_f, position, forward, "position_forward", dN *dC, 4 * (2 * dN * dC + dT * dC), 0,     \
         WF_K(k, position)->forward(F(GRAD0), F(WT1), NULL, B, T, C, s))                           \
  KERNEL(pos_b, position, backward, "position_backward", dN *dC, 4 * (dN * dC + 2 * dT * dC), 0,   \
         WF_K(k, position)->backward(F(WT3), F(ACT0), NULL, B, T, C, s))                           \
  KERNEL(ln_f, layernorm, forward, "layernorm_forward", 8 * dN * dC,                               \
         A * 2 * dN * dC + 4 * (2 * dN + 2 * dC), 0,                                               \
         WF_K(k, layernorm)->forward(F(ACT1), F(ROW0), F(POS0), F(ACT0), F(WT0), F(WT1), N, C, s)) \
  KERNEL(ln_b, layernorm, backward, "layernorm_backward", 14 * dN * dC,                            \
         A * dN * dC + 4 * (3 * dN * dC + 2 * dN + 5 * dC), 0,                                     \
         WF_K(k, layernorm)                                                                        \
             ->backward(F(GRAD0), F(WT2), F(WT3), F(ACT1), F(ACT0), F(WT0), F(ROW0), F(POS0), N,   \
                        C, s))                                                                     \
  KERNEL(resln_f, layernorm, residual_forward, "residual_layernorm_forward", 9 * dN * dC,          \
         A * 3 * dN * dC + 4 * (dN * dC + 2 * dN + 2 * dC), 0,                                     \
         WF_K(k, layernorm)                                                                        \
             ->residual_forward(F(ACT3), F(ACT1), F(ROW0), F(POS0), F(ACT0), F(ACT2), F(WT0),      \
                                F(WT1), N, C, s))                                                  \
  KERNEL(qkv_f, matmul, forward, "matmul_forward qkv (C -> 3C)", 2 * dN * dC * 3 * dC,             \
         A * (dN * dC + 3 * dC * dC + 3 * dN * dC) + 4 * 3 * dC, 1,                                \
         WF_K(k, matmul)->forward(F(ACT1), F(ACT0), F(WT0), F(WT1), N, C, 3 * C, lowp, s))         \
  KERNEL(att_f, attention, forward, "attention_forward (causal)", 2 * dB * dT * dT * dC,           \
         A * 4 * dN * dC + 4 * (double)WF_K(k, attention)->saved(B, T, C, NH), 0,                  \
         WF_K(k, attention)->forward(F(ACT2), F(ATT), F(ACT1), NULL, B, T, C, NH, NH, s))          \
  KERNEL(att_fd, attention, forward, "attention_forward (documents of T/8)",                       \
         2 * dB * dT * dDoc * dC,                                                                  \
         A * 4 * dN * dC + 4 * (double)WF_K(k, attention)->saved(B, T, C, NH), 0,                  \
         WF_K(k, attention)->forward(F(ACT2), F(ATT), F(ACT1), I(DOCS), B, T, C, NH, NH, s))       \
  KERNEL(att16_f, attention_lse, forward, "attention_bf16_forward (causal)",                       \
         2 * dB * dT * dT * dC, 2 * 4 * dN * dC + 4 * dB * NH * dT, 2,                             \
         WF_K(K16, attention_lse)->forward(H(OUT16), F(LSE), H(QKV16), B, T, C, NH, NH, s))        \
  KERNEL(proj_f, matmul, forward, "matmul_forward attproj (C -> C)", 2 * dN * dC * dC,             \
         A * (2 * dN * dC + dC * dC) + 4 * dC, 1,                                                  \
         WF_K(k, matmul)->forward(F(ACT3), F(ACT2), F(WT0), F(WT1), N, C, C, lowp, s))             \
  KERNEL(fcg_f, matmul, gelu_forward, "matmul_gelu_forward fc (C -> 4C)",                          \
         2 * dN * dC * 4 * dC + 8 * 4 * dN * dC,                                                   \
         A * (dN * dC + 4 * dC * dC + 8 * dN * dC) + 4 * 4 * dC, 1,                                \
         WF_K(k, matmul)->gelu_forward(F(ACT1), F(ACT2), F(ACT0), F(WT0), F(WT1), N, C, 4 * C,     \
                                       lowp, s))                                                   \
  KERNEL(fc_f, matmul, forward, "matmul_forward fc (C -> 4C)", 2 * dN * dC * 4 * dC,               \
         A * (dN * dC + 4 * dC * dC + 4 * dN * dC) + 4 * 4 * dC, 1,                                \
         WF_K(k, matmul)->forward(F(ACT2), F(ACT0), F(WT0), F(WT1), N, C, 4 * C, lowp, s))         \
  KERNEL(gelu_f, gelu, forward, "gelu_forward (N, 4C)", 8 * (double)n4, A * 2 * (double)n4, 0,     \
         WF_K(k, gelu)->forward(F(ACT1), F(ACT2), n4, s))                                          \
  KERNEL(fcp_f, matmul, forward, "matmul_forward fcproj (4C -> C)", 2 * dN * 4 * dC * dC,          \
         A * (4 * dN * dC + 4 * dC * dC + dN * dC) + 4 * dC, 1,                                    \
         WF_K(k, matmul)->forward(F(ACT3), F(ACT1), F(WT0), F(WT1), N, 4 * C, C, lowp, s))         \
  KERNEL(res_f, residual, forward, "residual_forward (N, C)", dN *dC,                              \
         A * 2 * dN * dC + 4 * dN * dC, 0,                                                         \
         WF_K(k, residual)->forward(F(ACT3), F(ACT0), F(ACT2), (size_t)N * C, s))                  \
  KERNEL(head_f, matmul, forward, "matmul_forward lm head (C -> Vp)", 2 * dN * dC * dVp,           \
         A * (dN * dC + dVp * dC + dN * dVp), 1,                                                   \
         WF_K(k, matmul)->forward(F(LOGITS), F(ACT0), F(WT0), NULL, N, C, Vp, lowp, s))            \
  KERNEL(cls16, classifier, fused, "classifier_bf16 (N, V, in place)", 7 * dN * dV,                \
         2 * 2 * dN * dV + 4 * 2 * dN, 0,                                                          \
         WF_K(K16, classifier)->fused(H(LOGITS16), F(ROW0), I(TOK), 1.0f / N, N, V, Vp, s))        \
  KERNEL(xs16, classifier, stats, "xent_stats_bf16 (N, V)", 4 * dN * dV, 2 * dN * dV + 4 * 4 * dN, \
         0,                                                                                        \
         WF_K(K16, classifier)                                                                     \
             ->stats(F(ROW1), F(POS1), F(ROW2), H(LOGITS16), I(TOK), N, V, Vp, 0, s))              \
  KERNEL(xb16, classifier, backward, "xent_backward_bf16 (N, V, in place)", 4 * dN * dV,           \
         2 * 2 * dN * dV + 4 * 3 * dN, 0,                                                          \
         WF_K(K16, classifier)                                                                     \
             ->backward(H(LOGITS16), H(LOGITS16), F(ROW1), F(POS1), I(TOK), 1.0f / N, N, V, Vp, 0, \
                        s))                                                                        \
  KERNEL(xs, xent, stats, "xent_stats (N, V)", 4 * dN * dV, A * dN * dV + 4 * 4 * dN, 0,           \
         WF_K(k, xent)->stats(F(ROW1), F(POS1), F(ROW2), F(LOGITS), I(TOK), N, V, Vp, 0, s))       \
  KERNEL(xpack, xent, pack, "xent_pack", 0, 4 * 6 * dN, 0,                                         \
         WF_K(k, xent)->pack(F(ROW3), F(ROW1), F(POS1), F(ROW2), N, s))                            \
  KERNEL(xcomb, xent, combine, "xent_combine (2 parts)", 8 * dN, 4 * (6 * dN + 3 * dN), 0,         \
         WF_K(k, xent)->combine(F(ROW1), F(POS1), F(ROW2), F(ROW3), N, 2, s))                      \
  KERNEL(xloss, xent, loss, "xent_loss", 3 * dN, 4 * 4 * dN, 0,                                    \
         WF_K(k, xent)->loss(F(ROW0), F(ROW1), F(POS1), F(ROW2), N, s))                            \
  KERNEL(lacc, xent, accumulate, "loss_accumulate", dN, 4 * dN + 16, 0,                            \
         WF_K(k, xent)->accumulate(buf(b, ACC), F(ROW0), N, s))                                    \
  KERNEL(xb, xent, backward, "xent_backward (N, V, in place)", 4 * dN * dV,                        \
         A * 2 * dN * dV + 4 * 3 * dN, 0,                                                          \
         WF_K(k, xent)->backward(F(LOGITS), F(LOGITS), F(ROW1), F(POS1), I(TOK), 1.0f / N, N, V,   \
                                 Vp, 0, s))                                                        \
  KERNEL(head_b, matmul, backward_f32, "matmul_backward_f32 lm head (Vp)", 4 * dN * dC * dVp,      \
         A * (dN * dVp + dN * dC + dVp * dC) + 4 * (dN * dC + 2 * dVp * dC), 1,                    \
         WF_K(k, matmul)->backward_f32(F(GRAD0), F(WT2), NULL, F(LOGITS), F(ACT0), F(WT0), N, C,   \
                                       Vp, lowp, s))                                               \
  KERNEL(res_b, residual, backward, "residual_backward (N, C)", 2 * dN * dC, 4 * 5 * dN * dC, 0,   \
         WF_K(k, residual)->backward(F(GRAD0), F(GRAD1), F(ACT3), (size_t)N * C, s))               \
  KERNEL(fcp_b, matmul, backward, "matmul_backward fcproj", 4 * dN * 4 * dC * dC,                  \
         A * (dN * dC + 2 * 4 * dN * dC + 4 * dC * dC) + 4 * (2 * 4 * dC * dC + 2 * dC), 1,        \
         WF_K(k, matmul)->backward(F(ACT1), F(WT2), F(WT3), F(ACT0), F(ACT2), F(WT0), N, 4 * C, C, \
                                   lowp, s))                                                       \
  KERNEL(gelu_b, gelu, backward, "gelu_backward (N, 4C)", 16 * (double)n4, A * 3 * (double)n4, 0,  \
         WF_K(k, gelu)->backward(F(ACT1), F(ACT2), F(ACT3), n4, s))                                \
  KERNEL(fc_b, matmul, backward_f32, "matmul_backward_f32 fc", 4 * dN * dC * 4 * dC,               \
         A * (4 * dN * dC + dN * dC + 4 * dC * dC) + 4 * (dN * dC + 2 * 4 * dC * dC + 2 * 4 * dC), \
         1,                                                                                        \
         WF_K(k, matmul)->backward_f32(F(GRAD0), F(WT2), F(WT3), F(ACT3), F(ACT0), F(WT0), N, C,   \
                                       4 * C, lowp, s))                                            \
  KERNEL(proj_b, matmul, backward, "matmul_backward attproj", 4 * dN * dC * dC,                    \
         A * (dN * dC + 2 * dN * dC + dC * dC) + 4 * (2 * dC * dC + 2 * dC), 1,                    \
         WF_K(k, matmul)->backward(F(ACT1), F(WT2), F(WT3), F(ACT3), F(ACT0), F(WT0), N, C, C,     \
                                   lowp, s))                                                       \
  KERNEL(att_b, attention, backward, "attention_backward (causal)", 5 * dB * dT * dT * dC,         \
         A * (dN * dC + 3 * dN * dC + 3 * dN * dC) +                                               \
             4 * ((double)WF_K(k, attention)->saved(B, T, C, NH) +                                 \
                  (double)WF_K(k, attention)->scratch(B, T, C, NH)),                               \
         0,                                                                                        \
         WF_K(k, attention)                                                                        \
             ->backward(F(ACT3), F(SCRATCH), F(ACT2), F(ACT1), F(ATT), NULL, B, T, C, NH, NH, s))  \
  KERNEL(                                                                                          \
      att_bd, attention, backward, "attention_backward (documents of T/8)",                        \
      5 * dB * dT * dDoc * dC,                                                                     \
      A * (dN * dC + 3 * dN * dC + 3 * dN * dC) +                                                  \
          4 * ((double)WF_K(k, attention)->saved(B, T, C, NH) +                                    \
               (double)WF_K(k, attention)->scratch(B, T, C, NH)),                                  \
      0,                                                                                           \
      WF_K(k, attention)                                                                           \
          ->backward(F(ACT3), F(SCRATCH), F(ACT2), F(ACT1), F(ATT), I(DOCS), B, T, C, NH, NH, s))  \
  KERNEL(att16_b, attention_lse, backward, "attention_bf16_backward (causal)",                     \
         5 * dB * dT * dT * dC,                                                                    \
         2 * (dN * dC + 3 * dN * dC + dN * dC + 3 * dN * dC) + 4 * dB * NH * dT +                  \
             4 * (double)WF_K(K16, attention_lse)->scratch(B, T, C, NH, NH),                       \
         2,                                                                                        \
         WF_K(K16, attention_lse)                                                                  \
             ->backward(H(DQKV16), F(SCRATCH16), H(DOUT16), H(QKV16), H(OUT16), F(LSE), B, T, C,   \
                        NH, NH, s))                                                                \
  KERNEL(qkv_b, matmul, backward_f32, "matmul_backward_f32 qkv", 4 * dN * dC * 3 * dC,             \
         A * (3 * dN * dC + dN * dC + 3 * dC * dC) + 4 * (dN * dC + 2 * 3 * dC * dC + 2 * 3 * dC), \
         1,                                                                                        \
         WF_K(k, matmul)->backward_f32(F(GRAD0), F(WT2), F(WT3), F(ACT3), F(ACT0), F(WT0), N, C,   \
                                       3 * C, lowp, s))                                            \
  KERNEL(sumsq, norm, sumsq_acc, "sumsq_acc (all parameters)", 2 * dP, 4 * dP + 16, 0,             \
         WF_K(k, norm)->sumsq_acc(buf(b, ACC), F(PAR3), np, s))                                    \
  KERNEL(scale, norm, scale, "scale (all parameters)", dP, 4 * 2 * dP, 0,                          \
         WF_K(k, norm)->scale(F(PAR3), 1.0f, np, s))                                               \
  KERNEL(adamw, adamw, update, "adamw_update (all parameters)", 12 * dP, 4 * 7 * dP, 0,            \
         WF_K(k, adamw)->update(F(PAR0), F(PAR1), F(PAR2), F(PAR3), np, 1e-4f, 0.9f, 0.95f, 1e-8f, \
                                0.1f, 2, 1.0f, s))                                                 \
  KERNEL(adamw16, adamw, update_store, "adamw_update_store (all parameters, bf16 copy)", 12 * dP,  \
         4 * 7 * dP + 2 * dP, 0,                                                                   \
         WF_K(K16, adamw)                                                                          \
             ->update_store(F(PAR0), H(PAR16), F(PAR1), F(PAR2), F(PAR3), np, 1e-4f, 0.9f, 0.95f,  \
                            1e-8f, 0.1f, 2, 1.0f, s))                                              \
  KERNEL(rbf16, round, round, "round_bf16 (all parameters)", dP, 4 * 2 * dP, 0,                    \
         WF_K(K16, round)->round(F(PAR1), F(PAR0), np, s))                                         \
  KERNEL(rfp16, round, round, "round_fp16 (all parameters)", dP, 4 * 2 * dP, 0,                    \
         WF_K(wf_kset_as(k, WF_DT_F16), round)->round(F(PAR1), F(PAR0), np, s))                    \
  KERNEL(tokchk, tokens, check, "tokens_check (N)", dN, 4 * dN + 4, 0,                             \
         WF_K(k, tokens)->check(I(BAD), I(TOK), (size_t)N, V, s))                                  \
  KERNEL(cksum, checksum, sum, "checksum (all parameters)", dP, 4 * dP + 8, 0,                     \
         WF_K(k, checksum)->sum((uint64_t *)buf(b, ACC), F(PAR0), np, 0, s))                       \
  KERNEL(proj32_f, matmul, forward_f32, "matmul_forward_f32 attproj (C -> C)", 2 * dN * dC * dC,   \
         A * (dN * dC + dC * dC) + 4 * (dN * dC + dC), 1,                                          \
         WF_K(k, matmul)->forward_f32(F(GRAD0), F(ACT1), F(WT0), F(WT1), N, C, C, lowp, s))        \
  KERNEL(store, cast, store, "store (N, 4C)", (double)n4, (A + 4) * (double)n4, 0,                 \
         WF_K(k, cast)->store(F(ACT2), F(ACT1), n4, s))                                            \
  KERNEL(load, cast, load, "load (N, 4C)", (double)n4, (A + 4) * (double)n4, 0,                    \
         WF_K(k, cast)->load(F(GRAD0), F(ACT1), n4, s))                                            \
  LLAMA_KERNELS(KERNEL)                                                                            \
  CP_KERNELS(KERNEL)                                                                               \
  MOE_KERNELS(KERNEL)

/* The mixture-of-experts ops (moe_route.h, moe_dispatch.h, moe_combine.h, qknorm.h) at
 * Mixtral's routing, E = 8 experts top-K = 2: the router over (N, E) logits (probabilities
 * in place, as the model keeps them), the N K pairs to expert order and back over rows of
 * C, the weighted combine; q/k RMSNorm per head over Llama's packed rows (NH q heads, KV k
 * heads of hs, G = NH + KV groups a row). */
#define MOE_KERNELS(KERNEL)                                                                        \
  KERNEL(rt_f, moe_route, forward, "moe_route forward (N, E)", 5 * dN * MOE_E,                     \
         4 * (2 * dN * MOE_E + dN + 2 * dN * MOE_K), 0,                                            \
         WF_K(k, moe_route)                                                                        \
             ->forward(F(GRAD0), F(POS0), I(MIDX), F(ROW0), F(ROW1), F(GRAD0), N, MOE_E, MOE_K,    \
                       true, s))                                                                   \
  KERNEL(rt_b, moe_route, backward, "moe_route backward (N, E)", 6 * dN * MOE_E,                   \
         4 * (2 * dN * MOE_E + dN + 3 * dN * MOE_K) + A * dN * MOE_E, 0,                           \
         WF_K(k, moe_route)                                                                        \
             ->backward(F(ACT0), F(ROW2), F(GRAD0), F(POS0), I(MIDX), F(ROW0), F(ROW1), 0.01f,     \
                        1e-3f, N, MOE_E, MOE_K, true, (int)k->dt, s))                              \
  KERNEL(rt_a, moe_route, aux_accumulate, "moe_aux_accumulate (E)", 2 * MOE_E,                     \
         4 * (2 * MOE_E + 2) + 24, 0,                                                              \
         WF_K(k, moe_route)->aux_accumulate((double *)buf(b, ACC), F(ROW1), MOE_E, dN, s))         \
  KERNEL(                                                                                          \
      dsp, moe_dispatch, dispatch, "moe_dispatch (N K pairs)", 0, 4 * (2 * dN * MOE_K + MOE_E), 0, \
      WF_K(k, moe_dispatch)->dispatch(I(MPOS), I(MCNT), F(ROW3), I(MIDX), N, MOE_E, MOE_K, 0, s))  \
  KERNEL(prm, moe_dispatch, permute, "moe_permute (N K, C)", 0,                                    \
         A * 2 * dN * MOE_K * dC + 4 * dN * MOE_K, 0,                                              \
         WF_K(k, moe_dispatch)->permute(F(ACT1), F(ACT0), I(MPOS), N, MOE_K, C, (int)k->dt, s))    \
  KERNEL(uprm, moe_dispatch, unpermute, "moe_unpermute (N K, C)", dN *MOE_K *dC,                   \
         4 * (dN * MOE_K * dC + 2 * dN * dC + dN * MOE_K), 0,                                      \
         WF_K(k, moe_dispatch)->unpermute(F(GRAD1), F(GRAD0), I(MPOS), N, MOE_K, C, s))            \
  KERNEL(cmb_f, moe_combine, combine, "moe_combine (N K, C)", 2 * dN * MOE_K * dC,                 \
         4 * (dN * MOE_K * dC + dN * dC + 2 * dN * MOE_K), 0,                                      \
         WF_K(k, moe_combine)->combine(F(GRAD1), F(GRAD0), F(ROW0), I(MPOS), N, MOE_K, C, s))      \
  KERNEL(cmb_b, moe_combine, backward, "moe_combine backward (N K, C)", 3 * dN * MOE_K * dC,       \
         4 * (dN * dC + dN * MOE_K * dC + 3 * dN * MOE_K) + A * dN * MOE_K * dC, 0,                \
         WF_K(k, moe_combine)                                                                      \
             ->backward(F(ACT1), F(ROW2), F(GRAD1), F(GRAD0), F(ROW0), I(MPOS), N, MOE_K, C,       \
                        (int)k->dt, s))                                                            \
  KERNEL(qkn_s, qknorm, sumsq, "qknorm sumsq (per head)", 2 * dQK, A * dQK + 4 * dN * (NH + KV),   \
         0,                                                                                        \
         WF_K(k, qknorm)->sumsq(F(GRAD0), F(ACT1), N, 3 * C, C, C / NH, KV * (C / NH), C / NH,     \
                                (int)k->dt, s))                                                    \
  KERNEL(qkn_f, qknorm, forward, "qknorm forward (per head)", 3 * dQK,                             \
         A * 3 * dQK + 4 * 2 * dN * (NH + KV), 0,                                                  \
         WF_K(k, qknorm)->forward(F(ACT1), F(ACT2), F(GRAD1), F(GRAD0), F(WT0), F(WT1), N, 3 * C,  \
                                  C, C / NH, C / NH, KV * (C / NH), C / NH, C / NH, 1e-6f,         \
                                  (int)k->dt, s))                                                  \
  KERNEL(qkn_d, qknorm, dot, "qknorm dot (per head)", 3 * dQK,                                     \
         A * 3 * dQK + 4 * 2 * dN * (NH + KV), 0,                                                  \
         WF_K(k, qknorm)->dot(F(GRAD0), F(ACT3), F(ACT2), F(GRAD1), F(WT0), F(WT1), N, 3 * C, C,   \
                              C / NH, KV * (C / NH), C / NH, (int)k->dt, s))                       \
  KERNEL(qkn_b, qknorm, backward, "qknorm backward (per head)", 6 * dQK,                           \
         A * 4 * dQK + 4 * 3 * dN * (NH + KV), 0,                                                  \
         WF_K(k, qknorm)->backward(F(ACT3), F(WT2), F(WT3), F(ACT2), F(GRAD1), F(GRAD0), F(WT0),   \
                                   F(WT1), N, 3 * C, C, C / NH, C / NH, KV * (C / NH), C / NH,     \
                                   C / NH, (int)k->dt, s))

/* Context parallelism's block attention (attention_block.h) on the whole sequence as one
 * causal block (q (N, C), kv (N, 2C) in the activations' format; out, lse, D and the
 * gradients fp32), and its packing between qkv rows and blocks. */
#define CP_KERNELS(KERNEL)                                                                         \
  KERNEL(blk_f, attention_block, forward, "attention_block forward (causal, whole T)",             \
         2 * dB * dT * dT * dC, A * 3 * dN * dC + 4 * (dN * dC + dB * NH * dT), 0,                 \
         WF_K(k, attention_block)->forward(F(GRAD0), F(LSE), F(ACT1), F(ACT2), &AB, s))            \
  KERNEL(blk_m, attention_block, merge, "attention_block merge", 6 * dN * dC,                      \
         4 * (3 * dN * dC + 3 * dB * NH * dT), 0,                                                  \
         WF_K(k, attention_block)->merge(F(GRAD0), F(LSE), F(GRAD1), F(SCRATCH16), &AB, s))        \
  KERNEL(blk_d, attention_block, delta, "attention_block delta", 2 * dN * dC,                      \
         A * 2 * dN * dC + 4 * dB * NH * dT, 0,                                                    \
         WF_K(k, attention_block)->delta(F(SCRATCH16), F(ACT3), F(ACT1), &AB, s))                  \
  KERNEL(                                                                                          \
      blk_b, attention_block, backward, "attention_block backward (causal, whole T)",              \
      5 * dB * dT * dT * dC, A * 4 * dN * dC + 4 * (6 * dN * dC + 2 * dB * NH * dT), 0,            \
      WF_K(k, attention_block)                                                                     \
          ->backward(F(GRAD0), F(GRAD1), F(ACT3), F(ACT1), F(ACT2), F(LSE), F(SCRATCH16), &AB, s)) \
  KERNEL(blk_x, attention_block, kv_extract, "attention_block kv_extract (N, 2C)", 0,              \
         A * 4 * dN * dC, 0,                                                                       \
         WF_K(k, attention_block)->kv_extract(F(ACT2), F(ACT1), (size_t)N, C, 2 * C, k->dt, s))    \
  KERNEL(blk_p, attention_block, grad_pack, "attention_block grad_pack (N, 3C)", 0,                \
         4 * 3 * dN * dC + A * 3 * dN * dC, 0,                                                     \
         WF_K(k, attention_block)                                                                  \
             ->grad_pack(F(ACT4), F(GRAD0), F(GRAD1), (size_t)N, C, 2 * C, k->dt, s))              \
  KERNEL(blk_a, attention_block, grad_add, "attention_block grad_add (N, 2C)", 2 * dN * dC,        \
         4 * 3 * 2 * dN * dC, 0,                                                                   \
         WF_K(k, attention_block)->grad_add(F(GRAD1), F(GRAD0), 2 * (size_t)N * C, s))

/* Llama's block at the same shape: NKV = NH/2 kv heads (grouped-query attention), head
 * size hs = C/NH, SwiGLU F = 2C wide (its [gate | up] input is (N, 4C), the activations'
 * width); RoPE rotates the q and k heads of a packed qkv, its (T, hs) table in ACT4. */
#define LLAMA_KERNELS(KERNEL)                                                                      \
  KERNEL(rms_f, rmsnorm, forward, "rmsnorm_forward", 4 * dN * dC, A * 2 * dN * dC + 4 * (dN + dC), \
         0, WF_K(k, rmsnorm)->forward(F(ACT1), F(POS0), F(ACT0), F(WT0), 1e-5f, N, C, s))          \
  KERNEL(                                                                                          \
      resrms_f, rmsnorm, residual_forward, "residual_rmsnorm_forward", 5 * dN * dC,                \
      A * 3 * dN * dC + 4 * (dN * dC + dN + dC), 0,                                                \
      WF_K(k, rmsnorm)                                                                             \
          ->residual_forward(F(ACT3), F(ACT1), F(POS0), F(ACT0), F(ACT2), F(WT0), 1e-5f, N, C, s)) \
  KERNEL(rope_f, rope, forward, "rope_forward (q, k; NKV = NH/2)", 3 * dQK,                        \
         A * 2 * dQK + 4 * dT * dC / NH, 0,                                                        \
         WF_K(k, rope)->forward(F(ACT1), F(ACT4), NULL, B, T, NH, KV, C / NH, s))                  \
  KERNEL(gqa_f, attention, forward, "attention_gqa_forward (NKV = NH/2)", 2 * dB * dT * dT * dC,   \
         A * dN * dC * (2 + 2.0 * KV / NH) + 4 * (double)WF_K(k, attention)->saved(B, T, C, NH),   \
         0, WF_K(k, attention)->forward(F(ACT2), F(ATT), F(ACT1), NULL, B, T, C, NH, KV, s))       \
  KERNEL(swi_f, swiglu, forward, "swiglu_forward (N, 2C)", 5 * dN * 2 * dC, A * 3 * dN * 2 * dC,   \
         0, WF_K(k, swiglu)->forward(F(ACT1), F(ACT2), N, 2 * C, s))                               \
  KERNEL(swi_b, swiglu, backward, "swiglu_backward (N, 2C)", 10 * dN * 2 * dC,                     \
         A * 5 * dN * 2 * dC, 0,                                                                   \
         WF_K(k, swiglu)->backward(F(ACT3), F(ACT2), F(ACT1), N, 2 * C, s))                        \
  KERNEL(gqa_b, attention, backward, "attention_gqa_backward (NKV = NH/2)", 5 * dB * dT * dT * dC, \
         A * (dN * dC + dN * dC * (1 + 2.0 * KV / NH) + dN * dC) +                                 \
             4 * ((double)WF_K(k, attention)->saved(B, T, C, NH) +                                 \
                  (double)WF_K(k, attention)->scratch(B, T, C, NH)),                               \
         0,                                                                                        \
         WF_K(k, attention)                                                                        \
             ->backward(F(ACT3), F(SCRATCH), F(ACT2), F(ACT1), F(ATT), NULL, B, T, C, NH, KV, s))  \
  KERNEL(rope_b, rope, backward, "rope_backward (q, k; NKV = NH/2)", 3 * dQK,                      \
         A * 2 * dQK + 4 * dT * dC / NH, 0,                                                        \
         WF_K(k, rope)->backward(F(ACT3), F(ACT4), NULL, B, T, NH, KV, C / NH, s))                 \
  KERNEL(rms_b, rmsnorm, backward, "rmsnorm_backward", 8 * dN * dC,                                \
         A * dN * dC + 4 * (3 * dN * dC + dN + 3 * dC), 0,                                         \
         WF_K(k, rmsnorm)->backward(F(GRAD0), F(WT2), F(ACT1), F(ACT0), F(WT0), F(POS0), N, C, s))

/* Entries of the ops' tables that launch nothing (answers and settings), so have no row. */
#define NOT_KERNEL(op, member)                                                                     \
  {                                                                                                \
    WF_OP_##op, offsetof(wf_##op##_op, member)                                                     \
  }
static const struct {
  int op;
  size_t member;
} not_kernels[] = {NOT_KERNEL(matmul, set_tf32),   NOT_KERNEL(attention, saved),
                   NOT_KERNEL(attention, scratch), NOT_KERNEL(attention, set_impl),
                   NOT_KERNEL(attention, path),    NOT_KERNEL(attention_lse, scratch)};

#define KERNEL_FN(id, op, member, label, flops, bytes, gemm, call)                                 \
  static void run_##id(bench *b)                                                                   \
  {                                                                                                \
    SHAPE_VARS(b);                                                                                 \
    call;                                                                                          \
  }                                                                                                \
  static void cost_##id(bench *b, double *fl, double *by)                                          \
  {                                                                                                \
    SHAPE_VARS(b);                                                                                 \
    *fl = (flops);                                                                                 \
    *by = (bytes);                                                                                 \
  }
KERNELS(KERNEL_FN)

typedef struct row {
  const char *label;
  int op;        /* the op timed (wf_op_id) */
  size_t member; /* offsetof(wf_<op>_op, member): the entry timed */
  int gemm;
  void (*run)(bench *b);
  void (*cost)(bench *b, double *flops, double *bytes);
} row;

#define KERNEL_ROW(id, op_, member_, label_, flops, bytes, gemm_, call)                            \
  {.label = label_,                                                                                \
   .op = WF_OP_##op_,                                                                              \
   .member = offsetof(wf_##op_##_op, member_),                                                     \
   .gemm = gemm_,                                                                                  \
   .run = run_##id,                                                                                \
   .cost = cost_##id},
static const row rows[] = {KERNELS(KERNEL_ROW)};

/* Whether entry `member` of op `op` has a row or is listed as launching nothing. */
static bool covered(int op, size_t member)
{
  for (size_t i = 0; i < WF_ARRAY_LEN(rows); i++)
    if (rows[i].op == op && rows[i].member == member)
      return true;
  for (size_t i = 0; i < WF_ARRAY_LEN(not_kernels); i++)
    if (not_kernels[i].op == op && not_kernels[i].member == member)
      return true;
  return false;
}

/* Every entry of every op's table (each table is entry pointers only) is a row or listed
 * as launching nothing; returns how many are neither, after naming them. */
static int unbenched(void)
{
  static const size_t size[WF_OP_COUNT] = {
#define OP_SIZE(name) sizeof(wf_##name##_op),
      WF_OP_LIST(OP_SIZE)};
  size_t fn = sizeof(void (*)(void));
  int missing = 0;
  for (int op = 0; op < WF_OP_COUNT; op++)
    for (size_t off = 0; off + fn <= size[op]; off += fn)
      if (!covered(op, off)) {
        fprintf(stderr,
                "kernels: entry %zu of op '%s' has no row: add a KERNEL row to "
                "bench/kernels.c\n",
                off / fn, wf_op_name(op));
        missing++;
      }
  return missing;
}

/* ---- timing ------------------------------------------------------------------------ */

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of `reps` back-to-back calls, between two events on the stream. */
static double time_calls(bench *b, const row *r, int reps)
{
  wf_event *e0 = NULL, *e1 = NULL;
  double sec = -1;
  if (wf_dev_event_create(b->dev, &e0) != WF_OK || wf_dev_event_create(b->dev, &e1) != WF_OK)
    goto out;
  wf_dev_event_record(b->dev, e0, b->s);
  for (int i = 0; i < reps; i++)
    r->run(b);
  wf_dev_event_record(b->dev, e1, b->s);
  if (wf_dev_event_sync(b->dev, e1) == WF_OK && wf_dev_event_elapsed(b->dev, e0, e1, &sec) == WF_OK)
    sec /= reps;
out:
  wf_dev_event_destroy(b->dev, e0);
  wf_dev_event_destroy(b->dev, e1);
  return sec;
}

/* Two warm-up calls (they also make the row's buffers), one timed call to size the
 * run, then `reps` calls (or enough for ~50 ms, 3 to 1000). Negative on failure. */
static double time_row(bench *b, const row *r, int reps)
{
  r->run(b);
  r->run(b);
  if (b->failed || wf_dev_stream_sync(b->dev, b->s) != WF_OK || wf_dev_check(b->dev) != WF_OK)
    return -1;
  if (reps <= 0) {
    double once = time_calls(b, r, 1);
    if (once < 0)
      return -1;
    reps = once > 0 ? (int)WF_MIN(1000.0, WF_MAX(3.0, 0.05 / once)) : 1000;
  }
  double sec = time_calls(b, r, reps);
  return wf_dev_check(b->dev) == WF_OK ? sec : -1;
}

/* ---- the CPU's memory bandwidth: a STREAM triad on the kernels' threads ------------- */

typedef struct triad {
  float *a, *b, *c;
  size_t lo, hi;
} triad;

static void *triad_run(void *arg)
{
  triad *t = arg;
  for (size_t i = t->lo; i < t->hi; i++)
    t->a[i] = t->b[i] + 3.0f * t->c[i];
  return NULL;
}

/* GB/s of a[i] = b[i] + 3 c[i] over 3 x 128 MiB, best of 5, counting 12 bytes per
 * element (STREAM's convention). 0 when it cannot run. */
static double cpu_bandwidth_gbs(int threads)
{
  size_t n = (size_t)32 << 20;
  float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
  double best = 0;
  pthread_t tid[256];
  triad parts[256];
  threads = WF_MAX(1, WF_MIN(threads, 256));
  for (size_t i = 0; a && b && c && i < n; i++)
    a[i] = 0, b[i] = 1, c[i] = 2; /* touch every page before timing */
  for (int rep = 0; a && b && c && rep < 5; rep++) {
    double t0 = now_s();
    for (int t = 0; t < threads; t++) {
      parts[t] = (triad){a, b, c, n * t / threads, n * (t + 1) / threads};
      pthread_create(&tid[t], NULL, triad_run, &parts[t]);
    }
    for (int t = 0; t < threads; t++)
      pthread_join(tid[t], NULL);
    best = WF_MAX(best, 12.0 * n / (now_s() - t0) / 1e9);
  }
  free(a), free(b), free(c);
  return best;
}

/* ---- the device, the peaks, the table ----------------------------------------------- */

typedef struct opts {
  const char *device, *only, *json;
  int reps, threads, tf32;
  int attention; /* a wf_attention_impl, or -1: the worker's rule for the precision */
  shape sh;
} opts;

typedef struct peaks {
  double gemm, bf16, fp32, mem_gbs; /* TFLOP/s, TFLOP/s, TFLOP/s, GB/s; 0 = unknown */
  char what[512];
} peaks;

static int usage(const char *msg)
{
  fprintf(stderr,
          "kernels: %s\nusage: kernels [--device auto|cpu|cuda] [--precision fp32|bf16] [-B 16] "
          "[-T 1024] [-C 768] [--heads 12] [-V 50257] [--layers 12] [--threads N] [--tf32] "
          "[--attention auto|cudnn|flash|reference] [--reps N] [--only SUBSTRING] [--json FILE]\n",
          msg);
  return 2;
}

/* --attention's value as a wf_attention_impl, or -1 */
static int attention_arg(const char *v)
{
  static const char *names[] = {"auto", "cudnn", "flash", "reference"};
  for (int i = 0; i < (int)WF_ARRAY_LEN(names); i++)
    if (!strcmp(v, names[i]))
      return i;
  return -1;
}

static int parse(int argc, char **argv, opts *o)
{
  *o = (opts){.device = "auto", .attention = -1, .sh = {16, 1024, 768, 12, 50257, 12, WF_PREC_NO}};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int *num = !strcmp(a, "-B")          ? &o->sh.B
               : !strcmp(a, "-T")        ? &o->sh.T
               : !strcmp(a, "-C")        ? &o->sh.C
               : !strcmp(a, "--heads")   ? &o->sh.NH
               : !strcmp(a, "-V")        ? &o->sh.V
               : !strcmp(a, "--layers")  ? &o->sh.L
               : !strcmp(a, "--threads") ? &o->threads
               : !strcmp(a, "--reps")    ? &o->reps
                                         : NULL;
    if (!strcmp(a, "--tf32")) {
      o->tf32 = 1;
      continue;
    }
    if (!v)
      return usage(a);
    i++;
    if (num)
      *num = atoi(v);
    else if (!strcmp(a, "--device"))
      o->device = v;
    else if (!strcmp(a, "--attention") && (o->attention = attention_arg(v)) < 0)
      return usage(a);
    else if (!strcmp(a, "--attention"))
      continue;
    else if (!strcmp(a, "--only"))
      o->only = v;
    else if (!strcmp(a, "--json"))
      o->json = v;
    else if (!strcmp(a, "--precision") && (!strcmp(v, "fp32") || !strcmp(v, "bf16")))
      o->sh.lowp = !strcmp(v, "bf16") ? WF_PREC_BF16 : WF_PREC_NO;
    else
      return usage(a);
  }
  const shape *s = &o->sh;
  if (s->B < 1 || s->T < 1 || s->C < 1 || s->NH < 1 || s->C % s->NH || s->V < 1 || s->L < 1)
    return usage("shapes must be positive and C a multiple of the heads");
  return 0;
}

/* The device: the GPU (auto or cuda) or the CPU. Returns 0, or the exit status. */
static int open_device(const opts *o, bench *b, wf_gpu **gpu, char *name, size_t len)
{
  char why[1024] = "";
  wf_status st = WF_ENODEV;
  if (strcmp(o->device, "cpu") != 0)
    st = wf_gpu_open(gpu, why, sizeof why);
  if (st == WF_OK && wf_gpu_set_device(*gpu, 0) == WF_OK &&
      wf_dev_open_cuda(&b->dev, *gpu, why, sizeof why) == WF_OK) {
    wf_gpu_device_name(*gpu, 0, name, len);
    return 0;
  }
  if (!strcmp(o->device, "cuda")) {
    printf("kernels: no GPU: %s\n", why);
    return st == WF_ENODEV ? 77 : 1;
  }
  if (strcmp(o->device, "cpu") != 0)
    printf("kernels: no GPU (%s); timing the CPU\n", why);
  b->dev = wf_dev_cpu();
  if (o->threads > 0)
    wf_kernels_set_threads(o->threads);
  snprintf(name, len, "CPU, %d thread(s)", wf_kernels_threads());
  return 0;
}

static void device_peaks(const opts *o, wf_gpu *gpu, const char *name, peaks *p)
{
  wf_peak pk;
  int bf16 = o->sh.lowp != WF_PREC_NO;
  *p = (peaks){0};
  if (gpu && wf_peak_gpu(name, &pk)) {
    p->gemm = bf16 ? pk.bf16 : o->tf32 ? pk.tf32 : pk.fp32;
    p->bf16 = pk.bf16;
    p->fp32 = pk.fp32;
    p->mem_gbs = pk.mem_gbs;
    snprintf(p->what, sizeof p->what, "%s", pk.source);
  } else if (gpu) {
    snprintf(p->what, sizeof p->what, "%s is not in runtime/peak.c's table: no percentages", name);
  } else {
    int threads = wf_kernels_threads();
    double gbs = cpu_bandwidth_gbs(threads);
    /* bf16 GEMMs on oneDNN run on the bf16 dot-product units; widened, on the FMAs */
    bool dots = bf16 && wf_kernels_bf16_gemm_fast();
    if (wf_peak_cpu(threads, &pk)) {
      p->fp32 = pk.fp32;
      p->bf16 = dots ? pk.bf16 : pk.fp32;
      p->gemm = p->bf16;
    }
    p->mem_gbs = gbs;
    snprintf(p->what, sizeof p->what, "%s; memory %.1f GB/s measured (STREAM triad, %d threads)",
             p->fp32 <= 0 ? "CPU peak unknown"
             : dots       ? pk.source_bf16
                          : pk.source,
             gbs, threads);
  }
}

static json_t *row_json(const row *r, double sec, double fl, double by, int gemm, const peaks *p)
{
  double pk = gemm == 2 ? p->bf16 : gemm ? p->gemm : p->fp32;
  json_t *o = json_pack("{s:s, s:f, s:f, s:f}", "kernel", r->label, "ms", sec * 1e3, "flops", fl,
                        "bytes", by);
  json_object_set_new(o, "tflops", json_real(sec > 0 ? fl / sec / 1e12 : 0));
  json_object_set_new(o, "gbs", json_real(sec > 0 ? by / sec / 1e9 : 0));
  json_object_set_new(o, "pct_peak_flops",
                      pk > 0 && sec > 0 ? json_real(100 * fl / sec / 1e12 / pk) : json_null());
  json_object_set_new(o, "pct_peak_bw",
                      p->mem_gbs > 0 && sec > 0 ? json_real(100 * by / sec / 1e9 / p->mem_gbs)
                                                : json_null());
  return o;
}

static void print_row(const json_t *o)
{
  json_t *pf = json_object_get(o, "pct_peak_flops"), *pb = json_object_get(o, "pct_peak_bw");
  char f[16] = "-", m[16] = "-";
  if (json_is_real(pf))
    snprintf(f, sizeof f, "%.1f", json_real_value(pf));
  if (json_is_real(pb))
    snprintf(m, sizeof m, "%.1f", json_real_value(pb));
  printf("| %-38s | %9.4f | %9.3f | %9.1f | %8.2f | %8.1f | %6s | %6s |\n",
         json_string_value(json_object_get(o, "kernel")), json_real_value(json_object_get(o, "ms")),
         json_real_value(json_object_get(o, "flops")) / 1e9,
         json_real_value(json_object_get(o, "bytes")) / 1e6,
         json_real_value(json_object_get(o, "tflops")), json_real_value(json_object_get(o, "gbs")),
         f, m);
}

/* Time every row (or those whose label contains --only); failures are rows too. */
static int run_rows(bench *b, const opts *o, const peaks *p, json_t *out)
{
  int failures = 0;
  double total = 0;
  printf("| %-38s | %9s | %9s | %9s | %8s | %8s | %6s | %6s |\n", "kernel", "ms", "GFLOP", "MB",
         "TFLOP/s", "GB/s", "%FLOP", "%BW");
  printf("|%s|%s|%s|%s|%s|%s|%s|%s|\n", "----------------------------------------", "----------:",
         "----------:", "----------:", "---------:", "---------:", "-------:", "-------:");
  for (size_t i = 0; i < WF_ARRAY_LEN(rows); i++) {
    const row *r = &rows[i];
    if (o->only && !strstr(r->label, o->only))
      continue;
    double fl = 0, by = 0, sec = time_row(b, r, o->reps);
    r->cost(b, &fl, &by);
    if (sec < 0) {
      printf("| %-38s | FAILED (see the log above) | | | | | | |\n", r->label);
      json_array_append_new(out, json_pack("{s:s, s:s}", "kernel", r->label, "error",
                                           "the launch or its buffers failed"));
      failures++;
      b->failed = 0;
      continue;
    }
    json_t *j = row_json(r, sec, fl, by, r->gemm, p);
    print_row(j);
    json_array_append_new(out, j);
    total += sec;
  }
  printf("total of the rows: %.3f ms\n", total * 1e3);
  return failures;
}

static void write_json(const char *path, const opts *o, const char *name, const peaks *p,
                       json_t *rows_json)
{
  const shape *s = &o->sh;
  json_t *j = json_pack("{s:s, s:s, s:s, s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:{s:f, s:f, s:f, s:s}, "
                        "s:O}",
                        "weft_build", wf_build_id(), "device", name, "precision",
                        s->lowp == WF_PREC_NO ? "fp32" : "bf16", "shape", "B", s->B, "T", s->T, "C",
                        s->C, "NH", s->NH, "V", s->V, "layers", s->L, "peaks", "gemm_tflops",
                        p->gemm, "fp32_tflops", p->fp32, "mem_gbs", p->mem_gbs, "source", p->what,
                        "rows", rows_json);
  if (!j || json_dump_file(j, path, JSON_INDENT(1)) != 0)
    fprintf(stderr, "kernels: cannot write %s\n", path);
  json_decref(j);
}

int main(int argc, char **argv)
{
  opts o;
  bench b = {0};
  wf_gpu *gpu = NULL;
  char name[160] = "";
  peaks p;
  int rc = parse(argc, argv, &o);
  if (rc)
    return rc;
  if (unbenched())
    return 1;
  if ((rc = open_device(&o, &b, &gpu, name, sizeof name)) != 0)
    return rc;
  /* at 16 bits, the table of that format: the kernels a run at that precision calls */
  b.k = wf_dev_kernels(b.dev, o.sh.lowp);
  b.sh = o.sh;
  WF_K(b.k, matmul)->set_tf32(o.tf32);
  /* as the worker sets runtime.attention: auto takes the tensor-core paths only in bf16 */
  WF_K(b.k, attention)
      ->set_impl(o.attention >= 0 && !(o.attention == WF_ATTN_AUTO && o.sh.lowp == WF_PREC_NO)
                     ? o.attention
                 : o.sh.lowp == WF_PREC_NO ? WF_ATTN_REFERENCE
                                           : WF_ATTN_AUTO);
  if (wf_dev_stream_create(b.dev, &b.s) != WF_OK)
    return 1;
  device_peaks(&o, gpu, name, &p);
  const shape *s = &o.sh;
  printf("bench/kernels on %s: %s GEMMs%s, activations stored in %s; B %d, T %d, C %d, heads "
         "%d, V %d, %d layers "
         "(%.1fM parameters)\npeaks: GEMMs %.1f TFLOP/s, the rest %.1f TFLOP/s, memory %.0f GB/s "
         "(%s)\n",
         name, s->lowp == WF_PREC_NO ? "fp32" : "bf16",
         s->lowp == WF_PREC_NO && o.tf32 ? " (TF32)" : "", wf_dtype_name(b.k->dt), s->B, s->T, s->C,
         s->NH, s->V, s->L, params_of(s) / 1e6, p.gemm, p.fp32, p.mem_gbs, p.what);
  json_t *out = json_array();
  int failures = run_rows(&b, &o, &p, out);
  if (o.json)
    write_json(o.json, &o, name, &p, out);
  json_decref(out);
  for (int r = 0; r < N_ROLES; r++)
    wf_dev_free(b.dev, b.buf[r]);
  wf_dev_stream_destroy(b.dev, b.s);
  wf_dev_close(b.dev);
  wf_gpu_close(gpu);
  return failures ? 1 : 0;
}
