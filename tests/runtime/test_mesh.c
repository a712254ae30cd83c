/*
 * test_mesh.c - mesh coordinates and groups over many shapes: coordinates round
 * trip, tp varies fastest, each axis's groups partition the world, every rank is
 * in exactly one group per axis, and the embedding group pairs the first and last
 * pipeline stage.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "wf_coordinator.h"

static void check_shape(int dp, int tp, int pp)
{
  wf_mesh m = {dp, tp, pp};
  int n = wf_mesh_size(&m), members[512];
  for (int r = 0; r < n; r++) {
    wf_coords c = wf_mesh_coords(&m, r);
    assert_int_equal(wf_mesh_rank(&m, c), r);
    assert_int_equal(r, c.tp + tp * (c.dp + dp * c.pp)); /* DESIGN.md's formula */
  }
  for (int a = 0; a < WF_AXIS_EMB; a++) {
    int seen[512] = {0};
    int expect = a == WF_AXIS_TP ? tp : a == WF_AXIS_DP ? dp : pp;
    for (int r = 0; r < n; r++) {
      int k = wf_mesh_group(&m, (wf_axis)a, r, members, 512);
      assert_int_equal(k, expect);
      int in = 0;
      for (int i = 0; i < k; i++) {
        in += members[i] == r;
        /* members of one group share every other coordinate */
        wf_coords c = wf_mesh_coords(&m, r), d = wf_mesh_coords(&m, members[i]);
        assert_true(a == WF_AXIS_TP || c.tp == d.tp);
        assert_true(a == WF_AXIS_DP || c.dp == d.dp);
        assert_true(a == WF_AXIS_PP || c.pp == d.pp);
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
    int k = wf_mesh_group(&m, WF_AXIS_EMB, r, members, 512);
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
        check_shape(dims[i], dims[j], dims[k]);
}

static void test_2x2x2_layout(void **state)
{
  /* The default demo mesh: rank 5 = tp 1 + 2*(dp 0 + 2*pp 1). */
  wf_mesh m = {2, 2, 2};
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

int main(void)
{
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_many_shapes),
                                     cmocka_unit_test(test_2x2x2_layout)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
