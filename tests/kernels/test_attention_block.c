/*
 * test_attention_block.c - context parallelism's block attention (kernels/cpu/
 * attention_block.c) against the one-rank grouped-query attention kernels
 * (kernels/cpu/attention.c) it must reproduce:
 *  - a causal block over a whole sequence is causal attention: the same output, and
 *    backward's dq, dk, dv equal to attention's dqkv;
 *  - a sequence's keys split into blocks (the first half of the rows against the first
 *    half of the keys causally; the second half against the first half fully and against
 *    the second half causally), merged by log-sum-exp and run backward block by block from
 *    the merged log-sum-exp, give the same output and gradients: the ring's algebra on one
 *    rank;
 *  - the 16-bit forms read bf16 operands: equal to the fp32 kernel on the widened values.
 * Shapes: B 2, T 48 (blocks of 24, not a multiple of the kernel's 64-row tiles), 4 query
 * heads over 2 kv heads of size 8.
 *
 * Tolerance 2e-5 absolute: both sides are fp32 sums of at most 48 terms of O(1) values in
 * another order (the merge adds a rescaling by exp(lse_block - lse), backward rebuilds
 * the probabilities from the lse): ~sqrt(48) x 6e-8 x the O(1) magnitudes, ~1e-6; a
 * wrong mask or offset moves values by O(0.1). Measured: output 1.2e-7, gradients 3.6e-7.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "attention_block.h"
#include "storage.h"
#include "wf_kernels.h"

#define B   2
#define T   48
#define NH  4
#define NKV 2
#define HS  8
#define C   (NH * HS)
#define KW  (2 * NKV * HS)
#define LD  (C + KW)
#define TOL 2e-5

static void fill(float *x, size_t n, unsigned seed)
{
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = ((seed >> 8) / 16777216.0f) * 2.0f - 1.0f;
  }
}

static double max_diff(const float *a, const float *b, size_t n)
{
  double m = 0;
  for (size_t i = 0; i < n; i++)
    m = fmax(m, fabs((double)a[i] - b[i]));
  return m;
}

/* A block of nq rows against nk keys of a (B, T) sequence whose rows are qkv (B, T, LD)
 * and whose keys and values are kv (B, T, KW); the caller offsets the pointers to the
 * block's first row and key. */
static wf_attn_block block(int nq, int nk, bool causal, int fmt)
{
  return (wf_attn_block){B,
                         nq,
                         nk,
                         NH,
                         NKV,
                         HS,
                         causal,
                         LD,
                         (size_t)T * LD,
                         KW,
                         (size_t)T * KW,
                         C,
                         (size_t)T * C,
                         T,
                         (size_t)NH * T,
                         fmt};
}

typedef struct fixture {
  float qkv[B * T * LD], kv[B * T * KW], dout[B * T * C];
  float out[B * T * C], att[B * NH * T * T], dqkv[B * T * LD], scratch[B * NH * T * T];
} fixture;

static fixture *setup_ref(void)
{
  fixture *f = calloc(1, sizeof *f);
  fill(f->qkv, B * T * LD, 1);
  fill(f->dout, B * T * C, 2);
  wf_attention_kv_extract(f->kv, f->qkv, B * T, C, KW, WF_PREC_NO);
  wf_attention_gqa_forward(f->out, f->att, f->qkv, NULL, B, T, C, NH, NKV);
  wf_attention_gqa_backward(f->dqkv, f->scratch, f->dout, f->qkv, f->att, NULL, B, T, C, NH, NKV);
  return f;
}

/* The whole sequence as one causal block: attention itself. */
static void test_causal_block_is_attention(void **state)
{
  (void)state;
  fixture *f = setup_ref();
  static float out[B * T * C], lse[B * NH * T], D[B * NH * T], dq[B * T * C], dkv[B * T * KW];
  static float dqkv[B * T * LD];
  wf_attn_block g = block(T, T, true, WF_PREC_NO);
  wf_attention_block_forward(out, lse, f->qkv, f->kv, &g);
  assert_true(max_diff(out, f->out, B * T * C) < TOL);
  wf_attention_block_delta(D, f->dout, out, &g);
  memset(dq, 0, sizeof dq), memset(dkv, 0, sizeof dkv);
  wf_attention_block_backward(dq, dkv, f->dout, f->qkv, f->kv, lse, D, &g);
  wf_attention_grad_pack(dqkv, dq, dkv, B * T, C, KW, WF_PREC_NO);
  double d = max_diff(dqkv, f->dqkv, B * T * LD);
  print_message("causal block: out %.2e, dqkv %.2e\n", max_diff(out, f->out, B * T * C), d);
  assert_true(d < TOL);
  free(f);
}

/* Rows and keys in two halves: (h0 | k0) causal, (h1 | k0) full, (h1 | k1) causal. */
static void test_split_blocks_merge(void **state)
{
  (void)state;
  fixture *f = setup_ref();
  static float acc[B * T * C], lse[B * NH * T], blk[B * T * C], blse[B * NH * T], D[B * NH * T];
  static float dq[B * T * C], dkv[B * T * KW], dqkv[B * T * LD];
  const int h = T / 2;
  size_t qo = (size_t)h * LD, oo = (size_t)h * C, ko = (size_t)h * KW;
  for (size_t i = 0; i < B * NH * T; i++)
    lse[i] = -INFINITY;
  wf_attn_block g00 = block(h, h, true, WF_PREC_NO), g10 = block(h, h, false, WF_PREC_NO);
  wf_attn_block g11 = block(h, h, true, WF_PREC_NO);
  wf_attention_block_forward(acc, lse, f->qkv, f->kv, &g00);               /* rows h0 */
  wf_attention_block_forward(acc + oo, lse + h, f->qkv + qo, f->kv, &g10); /* rows h1, k0 */
  wf_attention_block_forward(blk + oo, blse + h, f->qkv + qo, f->kv + ko, &g11);
  wf_attention_block_merge(acc + oo, lse + h, blk + oo, blse + h, &g11);
  double dout_ = max_diff(acc, f->out, B * T * C);
  assert_true(dout_ < TOL);
  wf_attn_block whole = block(T, T, true, WF_PREC_NO);
  wf_attention_block_delta(D, f->dout, acc, &whole);
  memset(dq, 0, sizeof dq), memset(dkv, 0, sizeof dkv);
  wf_attention_block_backward(dq, dkv, f->dout, f->qkv, f->kv, lse, D, &g00);
  wf_attention_block_backward(dq + oo, dkv, f->dout + oo, f->qkv + qo, f->kv, lse + h, D + h, &g10);
  wf_attention_block_backward(dq + oo, dkv + ko, f->dout + oo, f->qkv + qo, f->kv + ko, lse + h,
                              D + h, &g11);
  wf_attention_grad_pack(dqkv, dq, dkv, B * T, C, KW, WF_PREC_NO);
  double dg = max_diff(dqkv, f->dqkv, B * T * LD);
  print_message("split blocks: out %.2e, dqkv %.2e\n", dout_, dg);
  assert_true(dg < TOL);
  free(f);
}

/* bf16 operands: the block on bf16 q, kv and dout equals the fp32 block on their
 * widened values exactly (the same arithmetic on the same floats). */
static void test_bf16_reads_widened(void **state)
{
  (void)state;
  fixture *f = setup_ref();
  static wf_bf16 q16[B * T * LD], kv16[B * T * KW];
  static float qw[B * T * LD], kvw[B * T * KW], o1[B * T * C], o2[B * T * C];
  static float l1[B * NH * T], l2[B * NH * T];
  wf_storage_store(q16, f->qkv, B * T * LD, WF_PREC_BF16);
  wf_storage_store(kv16, f->kv, B * T * KW, WF_PREC_BF16);
  wf_storage_load(qw, q16, B * T * LD, WF_PREC_BF16);
  wf_storage_load(kvw, kv16, B * T * KW, WF_PREC_BF16);
  wf_attn_block g16 = block(T, T, true, WF_PREC_BF16), g32 = block(T, T, true, WF_PREC_NO);
  wf_attention_block_forward(o1, l1, q16, kv16, &g16);
  wf_attention_block_forward(o2, l2, qw, kvw, &g32);
  assert_memory_equal(o1, o2, sizeof o1);
  assert_memory_equal(l1, l2, sizeof l1);
  assert_true(max_diff(o1, f->out, B * T * C) > 1e-4); /* the operands were rounded */
  free(f);
}

int main(void)
{
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_causal_block_is_attention),
                                     cmocka_unit_test(test_split_blocks_merge),
                                     cmocka_unit_test(test_bf16_reads_widened)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
