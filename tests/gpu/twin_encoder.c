/*
 * twin_encoder.c - CUDA kernels against their CPU twins (twin.h): the embedding and position ops
 * (GPT-2's input, also split over the vocabulary), and the token check.
 */
#include "../common/encode.h"
#include "twin.h"

/* The GPU's twin of encode.h: GPT-2's input from the embedding and position ops. */
static void gpu_encode(ctx *c, float *out, const int *inp, const float *wte, int v_offset, int Vl,
                       const float *wpe, int B, int T, int C)
{
  WF_K(c->k, embedding)->forward(out, inp, wte, v_offset, Vl, B * T, C, c->stream);
  if (wpe)
    WF_K(c->k, position)->forward(out, wpe, NULL, B, T, C, c->stream);
}

static void gpu_encode_backward(ctx *c, float *dwte, float *dwpe, const float *dout, const int *inp,
                                int v_offset, int Vl, int B, int T, int C)
{
  if (dwte)
    WF_K(c->k, embedding)->backward(dwte, dout, inp, v_offset, Vl, B * T, C, c->stream);
  if (dwpe)
    WF_K(c->k, position)->backward(dwpe, dout, NULL, B, T, C, c->stream);
}

void test_encoder(ctx *c)
{
  const int B = 3, T = 7, C = 13, V = 11, maxT = 9;
  const size_t BTC = (size_t)B * T * C;
  int *inp = hints(c, (size_t)B * T, 0, V);
  float *wte = hrand(c, (size_t)V * C, -1, 1), *wpe = hrand(c, (size_t)maxT * C, -1, 1);
  float *out = hzero(c, BTC), *d_out = df(c, out, BTC);
  int *d_inp = di(c, inp, (size_t)B * T);
  encode(out, inp, wte, 0, INT_MAX, wpe, B, T, C);
  gpu_encode(c, d_out, d_inp, df(c, wte, (size_t)V * C), 0, INT_MAX, df(c, wpe, (size_t)maxT * C),
             B, T, C);
  expect_close(c, "embedding+position forward out", out, d_out, BTC, TOL_EXACT, TOL_EXACT);

  float *dout = hrand(c, BTC, -1, 1);
  float *dwte = hrand(c, (size_t)V * C, -1, 1), *dwpe = hrand(c, (size_t)maxT * C, -1, 1);
  float *d_dwte = df(c, dwte, (size_t)V * C), *d_dwpe = df(c, dwpe, (size_t)maxT * C);
  encode_backward(dwte, dwpe, dout, inp, 0, INT_MAX, B, T, C);
  gpu_encode_backward(c, d_dwte, d_dwpe, df(c, dout, BTC), d_inp, 0, INT_MAX, B, T, C);
  expect_bits(c, "encoder_backward dwte", dwte, d_dwte, (size_t)V * C);
  expect_bits(c, "encoder_backward dwpe", dwpe, d_dwpe, (size_t)maxT * C);
}

/* The embedding's backward at GPT-2's width: 4096 tokens (4 of embedding.cu's token
 * tiles), six in seven of them on 5 rows, the rest anywhere in 5000: dwte and dwpe are
 * the CPU twin's bit for bit, on two runs from the same start (same seed, same bits). */
void test_encoder_deterministic(ctx *c)
{
  const int B = 8, T = 512, C = 768, V = 5000, maxT = 512;
  const size_t BT = (size_t)B * T, BTC = BT * C, VC = (size_t)V * C, PC = (size_t)maxT * C;
  int *inp = hints(c, BT, 0, 5), *rare = hints(c, BT, 0, V);
  for (size_t i = 0; i < BT; i++)
    inp[i] = i % 7 ? inp[i] : rare[i];
  float *dout = hrand(c, BTC, -1, 1), *dwte = hrand(c, VC, -1, 1), *dwpe = hrand(c, PC, -1, 1);
  float *d_dout = df(c, dout, BTC);
  int *d_inp = di(c, inp, BT);
  float *d_w[2] = {df(c, dwte, VC), df(c, dwte, VC)}, *d_p[2] = {df(c, dwpe, PC), df(c, dwpe, PC)};
  for (int run = 0; run < 2; run++)
    gpu_encode_backward(c, d_w[run], d_p[run], d_dout, d_inp, 0, INT_MAX, B, T, C);
  encode_backward(dwte, dwpe, dout, inp, 0, INT_MAX, B, T, C);
  expect_bits(c, "encoder_backward dwte, run 1", dwte, d_w[0], VC);
  expect_bits(c, "encoder_backward dwte, run 2", dwte, d_w[1], VC);
  expect_bits(c, "encoder_backward dwpe, run 1", dwpe, d_p[0], PC);
  expect_bits(c, "encoder_backward dwpe, run 2", dwpe, d_p[1], PC);
}

/* The vocabulary-parallel embedding, rank by rank of a 3-way split of V = 12 rows:
 * rank 0 adds wpe, and in the first pass rank 1 passes dwpe = NULL and rank 2
 * dwte = NULL, so the NULL paths run. 21 tokens in 12 rows repeat; in the second
 * pass every token lies in two rows of rank 2's slice, so many additions hit the
 * same row, and in none of rank 0's, so its out is wpe and its dwte is untouched. */
static void encoder_vp_rank(ctx *c, const int *inp, const float *wte, const float *wpe, int r,
                            bool nulls)
{
  const int B = 3, T = 7, C = 13, Vl = 4, maxT = 9, v_offset = r * Vl;
  const size_t BTC = (size_t)B * T * C, VlC = (size_t)Vl * C, PC = (size_t)maxT * C;
  int *d_inp = di(c, inp, (size_t)B * T);
  const float *w = wte + (size_t)v_offset * C, *pe = r == 0 ? wpe : NULL;
  float *out = hzero(c, BTC), *d_out = df(c, out, BTC);
  encode(out, inp, w, v_offset, Vl, pe, B, T, C);
  gpu_encode(c, d_out, d_inp, df(c, w, VlC), v_offset, Vl, pe ? df(c, pe, PC) : NULL, B, T, C);
  expect_close(c, "embedding+position forward (split) out", out, d_out, BTC, TOL_EXACT, TOL_EXACT);

  float *dout = hrand(c, BTC, -1, 1);
  float *dwte = hrand(c, VlC, -1, 1), *dwpe = hrand(c, PC, -1, 1);
  float *d_dwte = df(c, dwte, VlC), *d_dwpe = df(c, dwpe, PC);
  float *cw = nulls && r == 2 ? NULL : dwte, *cp = nulls && r == 1 ? NULL : dwpe;
  encode_backward(cw, cp, dout, inp, v_offset, Vl, B, T, C);
  gpu_encode_backward(c, cw ? d_dwte : NULL, cp ? d_dwpe : NULL, df(c, dout, BTC), d_inp, v_offset,
                      Vl, B, T, C);
  expect_bits(c, "encoder_backward_vp dwte", dwte, d_dwte, VlC);
  expect_bits(c, "encoder_backward_vp dwpe", dwpe, d_dwpe, PC);
}

void test_encoder_vp(ctx *c)
{
  const int B = 3, T = 7, C = 13, V = 12, maxT = 9;
  int *inp = hints(c, (size_t)B * T, 0, V);
  float *wte = hrand(c, (size_t)V * C, -1, 1), *wpe = hrand(c, (size_t)maxT * C, -1, 1);
  for (int r = 0; r < 3; r++)
    encoder_vp_rank(c, inp, wte, wpe, r, true);
  int *crowded = hints(c, (size_t)B * T, 8, 10); /* rows 0 and 1 of rank 2's slice */
  encoder_vp_rank(c, crowded, wte, wpe, 2, false);
  encoder_vp_rank(c, crowded, wte, wpe, 0, false); /* and no token in rank 0's slice */
}

/* The first bad token of a long batch (two of them: the first must win), none, and
 * a negative one at position 0. */
void test_tokens(ctx *c)
{
  const size_t n = 5003;
  const int V = 50;
  int *tok = hints(c, n, 0, V), bad[2], got[2];
  tok[4000] = V, tok[3001] = -7;
  int *d_tok = di(c, tok, n), *d_bad = di(c, tok, 2);
  for (int round = 0; round < 3; round++) {
    if (round == 1)
      tok[4000] = 1, tok[3001] = 2, d_tok = di(c, tok, n);
    if (round == 2)
      tok[0] = -1, d_tok = di(c, tok, n);
    wf_tokens_check(bad, tok, n, V);
    WF_K(c->k, tokens)->check(d_bad, d_tok, n, V, c->stream);
    bool ok = wf_gpu_stream_sync(c->g, c->stream) == WF_OK &&
              wf_gpu_memcpy_d2h(c->g, got, d_bad, sizeof got) == WF_OK && got[0] == bad[0] &&
              got[1] == bad[1];
    printf("  %-4s %-28s cpu {%d, %d} gpu {%d, %d}\n", ok ? "ok" : "FAIL", "tokens_check", bad[0],
           bad[1], got[0], got[1]);
    c->failures += !ok;
  }
}
