/*
 * kernels_rows.c - the rows that bench/kernels.c times: one per entry of every op's table,
 * with the FLOPs and bytes it counts (kernels.c's header says by which rules), and the
 * buffers the rows use.
 *

 * Adding an op (wf_kreg.h) is one KERNEL row below per entry of its table (the op and
 * entry it times, a label, FLOPs, bytes, the call). The bench refuses to run when an
 * entry of any op has no row (exit 1, naming it), so a new entry cannot go unmeasured. Buffers are
 * named by role (act, wt, rows, ...: see `roles`), allocated and filled with values
 * of the right kind on first use; rows run in table order, so a backward row finds
 * what its forward row saved.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_int.h"
#include "wf_config.h"

/* ---- shapes and buffers ------------------------------------------------------------ */

/* The model's GEMM width of the vocabulary (worker/model/family.c): a multiple of 128,
 * for the tensor cores' tiles. The loss kernels read the V real columns of rows of Vp. */
static int padded_vocab(const shape *s) { return (s->V + 127) / 128 * 128; }

size_t kbench_params(const shape *s)
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
    return kbench_params(s);
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
    return kbench_params(s);
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
  size_t n4 = (size_t)N * 4 * (size_t)C, np = kbench_params(&(b)->sh);                             \
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

#define KERNEL_ROW(id, op_, member_, label_, flops, bytes, gemm_, call)                            \
  {.label = label_,                                                                                \
   .op = WF_OP_##op_,                                                                              \
   .member = offsetof(wf_##op_##_op, member_),                                                     \
   .gemm = gemm_,                                                                                  \
   .run = run_##id,                                                                                \
   .cost = cost_##id},
const row kbench_rows[] = {KERNELS(KERNEL_ROW)};
const size_t kbench_n_rows = WF_ARRAY_LEN(kbench_rows);

/* Whether entry `member` of op `op` has a row or is listed as launching nothing. */
static bool covered(int op, size_t member)
{
  for (size_t i = 0; i < kbench_n_rows; i++)
    if (kbench_rows[i].op == op && kbench_rows[i].member == member)
      return true;
  for (size_t i = 0; i < WF_ARRAY_LEN(not_kernels); i++)
    if (not_kernels[i].op == op && not_kernels[i].member == member)
      return true;
  return false;
}

/* (kernels_int.h) */
int kbench_unbenched(void)
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
                "bench/kernels_rows.c\n",
                off / fn, wf_op_name(op));
        missing++;
      }
  return missing;
}
