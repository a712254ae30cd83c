/*
 * test_layout.c - the local <-> full parameter mapping of model shards
 * (wf_model_shard_runs), which checkpoints use to reassemble and reshard a model.
 *
 * For every shard of several meshes (tp 1, 2, 4; even, uneven and one-layer pipeline
 * stages; interleaved chunks) it checks that the runs tile the shard's flat vector in
 * order, that the counted runs of all shards of a mesh cover every element of the full
 * layout exactly once, and that the runs say what wf_model_import_full and
 * wf_model_export_full do. The full vector holds each element's own index (exact in
 * float32 below 2^24), so a misplaced element shows as a wrong number. Spot checks
 * against the slicing wf_model.h describes (q|k|v head rows, fc rows, fcproj and
 * attproj columns, vocabulary rows, chunk layers) keep the mapping honest on its own
 * terms, not only consistent with itself. The runs clipped to a window [lo, hi) of the
 * local vector (wf_model_shard_runs_in) tile exactly that window, with the same mapping.
 * The same for a mixture of experts (OLMoE's tensors) on meshes with expert parallelism:
 * each ep rank holds its experts of every expert tensor, each split over tp, and only ep
 * rank 0 counts the dense tensors; spot checks of an expert's rows and columns.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wf_model.h"
#include "../common/gpt2_kinds.h"

/* L=4, NH=4, C=8, maxT=8, V=11 padded to 16: tp 4 divides the heads, C and Vp. */
static const wf_model_dims gpt2_dims = {.L = 4, .NH = 4, .C = 8, .maxT = 8, .V = 11, .Vp = 16};
/* The dims the checks run on (GPT-2's, then the MoE family's). */
static wf_model_dims dims;

/* A mesh: tp ranks x pp stages (x ep expert ranks); stage s holds layers
 * [bounds[s], bounds[s+1]), or with chunks > 1 the interleaved schedule's chunk layers
 * (stage c*pp + s). */
typedef struct mesh {
  int tp, pp, chunks;
  int bounds[5];
  int ep;
} mesh;

static const mesh meshes[] = {
    {1, 1, 1, {0, 4}, 1},          {2, 1, 1, {0, 4}, 1},    {4, 1, 1, {0, 4}, 1},
    {1, 2, 1, {0, 2, 4}, 1},       {2, 2, 1, {0, 1, 4}, 1}, {2, 2, 2, {0, 1, 2}, 1},
    {4, 4, 1, {0, 1, 2, 3, 4}, 1}, {1, 2, 2, {0, 1, 2}, 1},
};

static wf_model_shard shard_of(const mesh *m, int pp_rank, int tp_rank, int ep_rank)
{
  int lc = m->bounds[pp_rank + 1] - m->bounds[pp_rank];
  return (wf_model_shard){.tp = m->tp,
                          .tp_rank = tp_rank,
                          .ep = m->ep,
                          .ep_rank = ep_rank,
                          .l0 = m->bounds[pp_rank],
                          .l1 = m->bounds[pp_rank + 1],
                          .chunks = m->chunks,
                          .chunk_stride = m->pp * lc,
                          .first = pp_rank == 0,
                          .last = pp_rank == m->pp - 1};
}

/* The run callback's view: coverage counts of the full layout, the next local offset
 * expected (runs come in local order and tile the vector), and the shard's model. */
typedef struct visit {
  int *cover; /* (n) times a counted run held each full element */
  size_t next, n_full;
  const float *local; /* the shard's parameters after importing the index vector */
} visit;

static void check_run(void *user, const wf_model_run *r)
{
  visit *v = user;
  assert_int_equal(r->local, v->next);
  assert_true(r->n > 0 && r->full + r->n <= v->n_full);
  v->next += r->n;
  for (size_t i = 0; i < r->n; i++) {
    /* import copied full element r->full + i to local r->local + i */
    assert_true(v->local[r->local + i] == (float)(r->full + i));
    if (r->counted)
      v->cover[r->full + i]++;
  }
}

/* Region operators that fail the test if called: import, export and init do no tp
 * communication. */
static wf_status never_enter_fwd(void *c, const void **o, const void *x, void *f, size_t N,
                                 size_t C, int fmt)
{
  (void)c, (void)o, (void)x, (void)f, (void)N, (void)C, (void)fmt;
  fail_msg("a tp region operator was called");
  return WF_EINVAL;
}
static wf_status never_leave_bwd(void *c, const float **o, const float *x, float *f, size_t N,
                                 size_t C)
{
  (void)c, (void)o, (void)x, (void)f, (void)N, (void)C;
  fail_msg("a tp region operator was called");
  return WF_EINVAL;
}
static wf_status never_bwd(void *c, float *a, float *b, size_t N, size_t C)
{
  (void)c, (void)a, (void)b, (void)N, (void)C;
  fail_msg("a tp region operator was called");
  return WF_EINVAL;
}
static wf_status never_gather(void *c, const float *x, float *a, size_t n)
{
  (void)c, (void)x, (void)a, (void)n;
  fail_msg("a tp region operator was called");
  return WF_EINVAL;
}
static wf_status never_sum(void *c, float *x, size_t n)
{
  (void)c, (void)x, (void)n;
  fail_msg("a tp region operator was called");
  return WF_EINVAL;
}
static const wf_tp_ops never = {WF_TP_OPS_VERSION, never_enter_fwd, never_bwd, never_bwd,
                                never_leave_bwd,   never_gather,    never_sum};

static wf_status never_counts(void *c, const int *send, int *recv, size_t n)
{
  (void)c, (void)send, (void)recv, (void)n;
  fail_msg("an ep exchange was called");
  return WF_EINVAL;
}
static wf_status never_rows(void *c, const void *send, const size_t *send_rows, void *recv,
                            const size_t *recv_rows, size_t width, int fmt)
{
  (void)c, (void)send, (void)send_rows, (void)recv, (void)recv_rows, (void)width, (void)fmt;
  fail_msg("an ep exchange was called");
  return WF_EINVAL;
}
static const wf_ep_ops never_ep = {WF_EP_OPS_VERSION, never_counts, never_rows};

static wf_model *make_shard(const wf_model_shard *s)
{
  wf_model_opts o = {.dims = dims,
                     .shard = *s,
                     .tp = {s->tp > 1 ? &never : NULL, NULL},
                     .ep = {s->ep > 1 ? &never_ep : NULL, NULL},
                     .B = 1,
                     .T = 1,
                     .slots = 1};
  wf_model *m = NULL;
  assert_int_equal(wf_model_create_shard(&m, &o), WF_OK);
  return m;
}

static float *index_vector(size_t n)
{
  float *f = malloc(n * sizeof *f);
  assert_non_null(f);
  for (size_t i = 0; i < n; i++)
    f[i] = (float)i;
  return f;
}

static int eps_of(const mesh *me) { return me->ep > 1 ? me->ep : 1; }

static void check_mesh(const mesh *me)
{
  size_t n = wf_model_num_params(&dims);
  float *full = index_vector(n), *sum = calloc(n, sizeof *sum);
  int *cover = calloc(n, sizeof *cover);
  assert_true(n < (1u << 24) && sum && cover);
  for (int p = 0; p < me->pp; p++) {
    for (int q = 0; q < me->tp * eps_of(me); q++) {
      wf_model_shard s = shard_of(me, p, q % me->tp, q / me->tp);
      assert_null(wf_model_shard_check(&dims, &s));
      wf_model *m = make_shard(&s);
      assert_int_equal(wf_model_shard_params(&dims, &s), wf_model_local_params(m));
      wf_model_import_full(m, 0, full);
      visit v = {cover, 0, n, wf_model_params(m)};
      wf_model_shard_runs(&dims, &s, check_run, &v);
      assert_int_equal(v.next, wf_model_local_params(m));
      wf_model_export_full(m, 0, sum);
      wf_model_destroy(m);
    }
  }
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(cover[i], 1);
    assert_true(sum[i] == full[i]); /* every element exported exactly once */
  }
  free(full);
  free(sum);
  free(cover);
}

/* Windows [lo, hi) of shard s's local vector that cut runs at both ends, empty ones and
 * the whole vector: the clipped runs tile each window in order, mapped as import maps. */
static void check_windows(const wf_model_shard *s, const float *full, int *cover)
{
  wf_model *m = make_shard(s);
  size_t n = wf_model_local_params(m);
  wf_model_import_full(m, 0, full);
  const size_t win[][2] = {{0, n}, {n / 3, 2 * n / 3 + 1}, {1, n - 1}, {n / 2, n / 2}, {n, n}};
  for (size_t w = 0; w < sizeof win / sizeof win[0]; w++) {
    size_t lo = WF_MIN(win[w][0], n), hi = WF_MAX(lo, WF_MIN(win[w][1], n));
    visit v = {cover, lo, wf_model_num_params(&dims), wf_model_params(m)};
    wf_model_shard_runs_in(&dims, s, lo, hi, check_run, &v);
    assert_int_equal(v.next, hi);
  }
  wf_model_destroy(m);
}

static void test_windows_clip(void **state)
{
  (void)state;
  size_t n = wf_model_num_params(&dims);
  float *full = index_vector(n);
  int *cover = calloc(n, sizeof *cover);
  assert_non_null(cover);
  for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++)
    for (int p = 0; p < meshes[i].pp; p++)
      for (int t = 0; t < meshes[i].tp; t++) {
        wf_model_shard s = shard_of(&meshes[i], p, t, 0);
        check_windows(&s, full, cover);
      }
  free(full);
  free(cover);
}

static void test_meshes_cover_once(void **state)
{
  (void)state;
  for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++)
    check_mesh(&meshes[i]);
}

/* OLMoE's tensors (whole-projection q/k norms split over tp, a replicated router, the
 * experts): 4 experts of width 8, top-2, meshes with ep 1, 2 and 4 beside tp and pp. */
static wf_model_dims moe_dims(void)
{
  return (wf_model_dims){.fam = wf_model_family_find("olmoe"),
                         .L = 4,
                         .NH = 4,
                         .KV = 4,
                         .C = 8,
                         .maxT = 8,
                         .V = 11,
                         .Vp = 16,
                         .F = 8,
                         .E = 4,
                         .K = 2};
}

static const mesh moe_meshes[] = {
    {1, 1, 1, {0, 4}, 2},    {1, 1, 1, {0, 4}, 4},          {2, 1, 1, {0, 4}, 2},
    {2, 2, 1, {0, 1, 4}, 2}, {4, 4, 1, {0, 1, 2, 3, 4}, 4}, {2, 2, 2, {0, 1, 2}, 4},
};

static void test_moe_meshes_cover_once(void **state)
{
  (void)state;
  dims = moe_dims();
  for (size_t i = 0; i < sizeof moe_meshes / sizeof moe_meshes[0]; i++)
    check_mesh(&moe_meshes[i]);
  for (size_t i = 0; i < sizeof moe_meshes / sizeof moe_meshes[0]; i++) {
    size_t n = wf_model_num_params(&dims);
    float *full = index_vector(n);
    int *cover = calloc(n, sizeof *cover);
    wf_model_shard s = shard_of(&moe_meshes[i], 0, moe_meshes[i].tp - 1, moe_meshes[i].ep - 1);
    check_windows(&s, full, cover);
    free(full);
    free(cover);
  }
  dims = gpt2_dims;
}

/* ep 2 rank 1 (experts 2 and 3), tp 2 rank 1, one stage: expert 2's [gate | up] rows are
 * hidden units [F/2, F) of each of its groups, its down's columns [F/2, F); q_norm is the
 * second half of the projection's; the router is whole; only ep rank 0 counts it. */
static void test_moe_spot_checks(void **state)
{
  (void)state;
  dims = moe_dims();
  size_t n = wf_model_num_params(&dims), C = 8, F = 8;
  float *full = index_vector(n);
  mesh me = {2, 1, 1, {0, 4}, 2};
  wf_model_shard s = shard_of(&me, 0, 1, 1);
  wf_model *m = make_shard(&s);
  wf_model_import_full(m, 0, full);
  int gu = wf_model_tensor_find(&dims, "expert_gate_upw");
  int down = wf_model_tensor_find(&dims, "expert_downw");
  int qn = wf_model_tensor_find(&dims, "q_norm"), router = wf_model_tensor_find(&dims, "router");
  assert_true(gu > 0 && down > 0 && qn > 0 && router > 0);
  size_t gbase = wf_model_tensor_offset(&dims, gu) + wf_model_layer_numel(&dims, gu); /* layer 1 */
  const float *g = wf_model_param(m, gu, 1, 0);
  /* local expert 0 = expert 2: its gate rows F/2.., then its up rows F + F/2.. */
  assert_true(g[0] == (float)(gbase + 2 * (2 * F * C) + (F / 2) * C));
  assert_true(g[(F / 2) * C] == (float)(gbase + 2 * (2 * F * C) + (F + F / 2) * C));
  /* local expert 1 = expert 3 */
  assert_true(g[F * C] == (float)(gbase + 3 * (2 * F * C) + (F / 2) * C));
  size_t dbase = wf_model_tensor_offset(&dims, down); /* layer 0 */
  const float *d = wf_model_param(m, down, 0, 0);
  assert_true(d[0] == (float)(dbase + 2 * (C * F) + F / 2)); /* row 0, column F/2 of expert 2 */
  assert_true(d[F / 2] == (float)(dbase + 2 * (C * F) + F + F / 2)); /* row 1 */
  assert_true(wf_model_param(m, qn, 0, 0)[0] == (float)(wf_model_tensor_offset(&dims, qn) + C / 2));
  assert_true(wf_model_param(m, router, 0, 0)[0] == (float)wf_model_tensor_offset(&dims, router));
  assert_true(wf_model_counted(m, gu) && !wf_model_counted(m, router) && !wf_model_counted(m, qn));
  assert_true(wf_model_shard_expert(&dims, gu) && !wf_model_shard_expert(&dims, router));
  wf_model_destroy(m);
  free(full);
  dims = gpt2_dims;
}

/* Full index of element (row, col) of tensor (k, layer) with rows of `cols`. */
static float at(wf_param_kind k, int layer, size_t row, size_t cols, size_t col)
{
  return (float)(wf_model_tensor_offset(&dims, k) + (size_t)layer * wf_model_layer_numel(&dims, k) +
                 row * cols + col);
}

/* tp 2, rank 1, stage [1, 2) of an interleaved pp 2 x v 2 mesh (chunk 1: layer 3):
 * the slices wf_model.h promises. */
static void test_spot_checks(void **state)
{
  (void)state;
  size_t n = wf_model_num_params(&dims), C = (size_t)dims.C;
  float *full = index_vector(n);
  wf_model_shard s = shard_of(&meshes[5], 1, 1, 0);
  wf_model *m = make_shard(&s);
  wf_model_import_full(m, 0, full);
  /* qkv: local rows [q | k | v] of heads 2..3, i.e. full rows C/2, C + C/2, 2C + C/2 */
  const float *qkv = wf_model_param(m, WF_P_QKVW, 3, 0);
  assert_true(qkv[0] == at(WF_P_QKVW, 3, C / 2, C, 0));
  assert_true(qkv[(C / 2) * C] == at(WF_P_QKVW, 3, C + C / 2, C, 0));
  assert_true(qkv[2 * (C / 2) * C + 1] == at(WF_P_QKVW, 3, 2 * C + C / 2, C, 1));
  assert_true(wf_model_param(m, WF_P_QKVB, 1, 0)[C / 2] == at(WF_P_QKVB, 1, C + C / 2, 1, 0));
  /* fc: rows [2C, 4C); fcproj and attproj: columns [2C, 4C) and [C/2, C) of every row */
  assert_true(wf_model_param(m, WF_P_FCW, 1, 0)[0] == at(WF_P_FCW, 1, 2 * C, C, 0));
  assert_true(wf_model_param(m, WF_P_FCPROJW, 3, 0)[2 * C + 1] ==
              at(WF_P_FCPROJW, 3, 1, 4 * C, 2 * C + 1));
  assert_true(wf_model_param(m, WF_P_ATTPROJW, 1, 0)[C / 2] == at(WF_P_ATTPROJW, 1, 1, C, C / 2));
  /* replicated: all of ln1w of layer 3; the last stage's wte: vocabulary rows [8, 16) */
  assert_true(wf_model_param(m, WF_P_LN1W, 3, 0)[C - 1] == at(WF_P_LN1W, 3, 0, C, C - 1));
  assert_true(wf_model_param(m, WF_P_WTE, 0, 0)[0] == at(WF_P_WTE, 0, (size_t)dims.Vp / 2, C, 0));
  assert_false(wf_model_counted(m, WF_P_WTE) || wf_model_counted(m, WF_P_LN1W));
  assert_true(wf_model_counted(m, WF_P_QKVW));
  assert_int_equal(wf_model_local_numel(m, WF_P_WPE), 0);
  wf_model_destroy(m);
  free(full);
}

/* One rank's whole model is one run per tensor, identical in both layouts. */
static void count_run(void *user, const wf_model_run *r)
{
  size_t *k = user;
  assert_int_equal(r->full, r->local);
  assert_true(r->counted);
  k[0]++;
  k[1] += r->n;
}

static void test_whole_is_identity(void **state)
{
  (void)state;
  wf_model_shard s = wf_model_shard_whole(&dims);
  size_t k[2] = {0, 0};
  wf_model_shard_runs(&dims, &s, count_run, k);
  /* 4 whole-model tensors (wte, wpe, lnfw, lnfb) + 12 layered kinds x 4 layers */
  assert_int_equal(k[0], 4 + 12 * 4);
  assert_int_equal(k[1], wf_model_num_params(&dims));
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_meshes_cover_once),     cmocka_unit_test(test_spot_checks),
      cmocka_unit_test(test_whole_is_identity),     cmocka_unit_test(test_windows_clip),
      cmocka_unit_test(test_moe_meshes_cover_once), cmocka_unit_test(test_moe_spot_checks),
  };
  dims = gpt2_dims;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
