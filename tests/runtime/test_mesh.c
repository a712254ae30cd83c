/*
 * test_mesh.c - mesh coordinates and groups over many shapes: coordinates round
 * trip, tp varies fastest, each axis's groups partition the world, every rank is
 * in exactly one group per axis, the embedding group pairs the first and last
 * pipeline stage, and the dp x cp group holds the dp and cp groups' ranks together.
 * The expert groups: ep groups of ep consecutive dp ranks and edp groups of the dp ranks
 * ep apart (over every cp rank) partition the dp x cp groups, each pair meeting in one rank.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "wf_coordinator.h"

static int expected_size(wf_axis a, int dp, int tp, int pp, int cp)
{
  switch (a) {
  case WF_AXIS_TP: return tp;
  case WF_AXIS_DP: return dp;
  case WF_AXIS_PP: return pp;
  case WF_AXIS_CP: return cp;
  default: return dp * cp; /* WF_AXIS_DPCP */
  }
}

/* Whether two ranks' coordinates may differ along group axis a. */
static void same_but(wf_axis a, wf_coords c, wf_coords d)
{
  bool dpcp = a == WF_AXIS_DPCP;
  assert_true(a == WF_AXIS_TP || c.tp == d.tp);
  assert_true(a == WF_AXIS_DP || dpcp || c.dp == d.dp);
  assert_true(a == WF_AXIS_PP || c.pp == d.pp);
  assert_true(a == WF_AXIS_CP || dpcp || c.cp == d.cp);
}

static void check_shape(int dp, int tp, int pp, int cp)
{
  wf_mesh m = {dp, tp, pp, cp, 1};
  int n = wf_mesh_size(&m), members[4096];
  for (int r = 0; r < n; r++) {
    wf_coords c = wf_mesh_coords(&m, r);
    assert_int_equal(wf_mesh_rank(&m, c), r);
    assert_int_equal(
        r, c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp))); /* docs/architecture.md's formula */
  }
  wf_axis axes[] = {WF_AXIS_TP, WF_AXIS_DP, WF_AXIS_PP, WF_AXIS_CP, WF_AXIS_DPCP};
  for (size_t ai = 0; ai < sizeof axes / sizeof axes[0]; ai++) {
    wf_axis a = axes[ai];
    int seen[4096] = {0};
    int expect = expected_size(a, dp, tp, pp, cp);
    for (int r = 0; r < n; r++) {
      int k = wf_mesh_group(&m, a, r, members, 4096);
      assert_int_equal(k, expect);
      int in = 0;
      for (int i = 0; i < k; i++) {
        in += members[i] == r;
        /* members of one group share every other coordinate */
        same_but(a, wf_mesh_coords(&m, r), wf_mesh_coords(&m, members[i]));
        if (i > 0)
          assert_true(members[i] > members[i - 1]);
      }
      assert_int_equal(in, 1);
      /* the colour is the same for all members of the group */
      for (int i = 0; i < k; i++)
        assert_int_equal(wf_mesh_group_color(&m, (wf_axis)a, members[i]),
                         wf_mesh_group_color(&m, (wf_axis)a, r));
      if (members[0] == r) /* count each group once, from its first member */
        for (int i = 0; i < k; i++)
          seen[members[i]]++;
    }
    for (int r = 0; r < n; r++)
      assert_int_equal(seen[r], 1); /* the groups partition the world */
  }
  for (int r = 0; r < n; r++) {
    wf_coords c = wf_mesh_coords(&m, r);
    int k = wf_mesh_group(&m, WF_AXIS_EMB, r, members, 4096);
    if (c.pp != 0 && c.pp != pp - 1) {
      assert_int_equal(k, 0);
      assert_int_equal(wf_mesh_group_color(&m, WF_AXIS_EMB, r), -1);
      continue;
    }
    assert_int_equal(k, pp > 1 ? 2 : 1);
    assert_int_equal(wf_mesh_coords(&m, members[0]).pp, 0);
    assert_int_equal(wf_mesh_coords(&m, members[k - 1]).pp, pp - 1);
  }
}

static void test_many_shapes(void **state)
{
  int dims[] = {1, 2, 3, 4, 8};
  for (size_t i = 0; i < 5; i++)
    for (size_t j = 0; j < 5; j++)
      for (size_t k = 0; k < 5; k++)
        for (size_t l = 0; l < 4; l++)
          check_shape(dims[i], dims[j], dims[k], dims[l]);
}

/* 2 x 2 x 2 x 2 (dp, cp, tp, pp): rank 13 = tp 1 + 2*(cp 0 + 2*(dp 1 + 2*pp 1)). */
static void test_cp_layout(void **state)
{
  wf_mesh m = {.dp = 2, .tp = 2, .pp = 2, .cp = 2};
  wf_coords c = wf_mesh_coords(&m, 13);
  assert_int_equal(c.pp, 1);
  assert_int_equal(c.dp, 1);
  assert_int_equal(c.cp, 0);
  assert_int_equal(c.tp, 1);
  int g[16];
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_CP, 13, g, 16), 2); /* tp 1, cp 0 and 1 */
  assert_int_equal(g[0], 13);
  assert_int_equal(g[1], 15);
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_DP, 13, g, 16), 2); /* dp 0 and 1 */
  assert_int_equal(g[0], 9);
  assert_int_equal(g[1], 13);
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_DPCP, 13, g, 16), 4); /* (dp, cp), cp fastest */
  assert_int_equal(g[0], 9);
  assert_int_equal(g[1], 11);
  assert_int_equal(g[2], 13);
  assert_int_equal(g[3], 15);
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_TP, 13, g, 16), 2);
  assert_int_equal(g[0], 12);
  assert_int_equal(g[1], 13);
  /* a mesh written without the axis (cp 0) is a cp 1 mesh */
  wf_mesh old = {.dp = 2, .tp = 2, .pp = 2};
  assert_int_equal(wf_mesh_size(&old), 8);
  assert_int_equal(wf_mesh_coords(&old, 5).dp, 0);
}

static void test_2x2x2_layout(void **state)
{
  /* The default demo mesh: rank 5 = tp 1 + 2*(dp 0 + 2*pp 1). */
  wf_mesh m = {2, 2, 2, 1, 1};
  wf_coords c = wf_mesh_coords(&m, 5);
  assert_int_equal(c.pp, 1);
  assert_int_equal(c.dp, 0);
  assert_int_equal(c.tp, 1);
  int g[8];
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_TP, 5, g, 8), 2);
  assert_int_equal(g[0], 4);
  assert_int_equal(g[1], 5);
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_DP, 5, g, 8), 2);
  assert_int_equal(g[0], 5);
  assert_int_equal(g[1], 7);
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_PP, 5, g, 8), 2);
  assert_int_equal(g[0], 1);
  assert_int_equal(g[1], 5);
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_EMB, 5, g, 8), 2);
  assert_int_equal(g[0], 1);
  assert_int_equal(g[1], 5);
}

/* dp 4 x tp 2 x pp 2 with ep 2: rank 11 = tp 1 + 2 (dp 1 + 4 pp 1) is ep rank 1 of dp ranks
 * {0, 1} and edp rank 0 of dp ranks {1, 3}; with cp 2 the edp group takes both cp ranks of
 * those dp ranks. Every dp x cp group splits into ep groups and edp groups that meet in
 * exactly one rank, and ep = 1 has neither. */
static void test_expert_groups(void **state)
{
  (void)state;
  wf_mesh m = {.dp = 4, .tp = 2, .pp = 2, .cp = 1, .ep = 2}, none = {4, 2, 2, 1, 1};
  int g[16], h[16], d[16];
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_EP, 11, g, 8), 2);
  assert_true(g[0] == 9 && g[1] == 11);
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_EDP, 11, g, 8), 2);
  assert_true(g[0] == 11 && g[1] == 15);
  assert_int_equal(wf_mesh_group(&none, WF_AXIS_EP, 11, g, 8), 0);
  assert_int_equal(wf_mesh_group_color(&none, WF_AXIS_EDP, 11), -1);
  m.cp = 2; /* rank 11 = tp 1 + 2 (cp 1 + 2 (dp 2 + 4 pp 0)): dp 2 and 3 of cp 1; edp dp 0, 2 */
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_EP, 11, g, 8), 2);
  assert_true(g[0] == 11 && g[1] == 15);
  assert_int_equal(wf_mesh_group(&m, WF_AXIS_EDP, 11, g, 8), 4);
  assert_true(g[0] == 1 && g[1] == 3 && g[2] == 9 && g[3] == 11);
  for (m.cp = 1; m.cp <= 2; m.cp++)
    for (int r = 0; r < wf_mesh_size(&m); r++) {
      int ne = wf_mesh_group(&m, WF_AXIS_EP, r, g, 16),
          nd = wf_mesh_group(&m, WF_AXIS_EDP, r, h, 16);
      int np = wf_mesh_group(&m, WF_AXIS_DPCP, r, d, 16), meet = 0;
      assert_true(ne == 2 && nd == 2 * m.cp && np == 4 * m.cp);
      for (int i = 0; i < ne; i++)
        for (int j = 0; j < nd; j++)
          meet += g[i] == h[j];
      assert_int_equal(meet, 1);     /* they meet in r alone */
      for (int i = 0; i < nd; i++) { /* both inside r's dp x cp group */
        bool in_e = i >= ne, in_d = false;
        for (int k = 0; k < np; k++)
          in_e |= i < ne && d[k] == g[i], in_d |= d[k] == h[i];
        assert_true(in_e && in_d);
      }
    }
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_many_shapes), cmocka_unit_test(test_2x2x2_layout),
      cmocka_unit_test(test_cp_layout), cmocka_unit_test(test_expert_groups)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
