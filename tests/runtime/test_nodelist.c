/* test_nodelist.c - Slurm host-list expansion, including malformed lists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "wf_launch.h"

#define NAME 64

static void expect_hosts(const char *list, const char *want[], int n)
{
  char names[64][NAME], err[256];
  int got = wf_nodelist_expand(list, &names[0][0], 64, NAME, err, sizeof err);
  if (got != n)
    fail_msg("'%s': got %d hosts, want %d (%s)", list, got, n, got < 0 ? err : "");
  for (int i = 0; i < n; i++)
    assert_string_equal(names[i], want[i]);
  assert_int_equal(wf_nodelist_expand(list, NULL, 0, NAME, err, sizeof err), n);
}

static void test_forms(void **state)
{
  const char *a[] = {"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"};
  expect_hosts("gpu[01-04,07],cpu3", a, 6);
  const char *b[] = {"node1"};
  expect_hosts("node1", b, 1);
  const char *c[] = {"n8", "n9", "n10"};
  expect_hosts("n[8-10]", c, 3);
  const char *d[] = {"r1n01", "r1n02", "r2n01", "r2n02"};
  expect_hosts("r[1-2]n[01-02]", d, 4);
  const char *e[] = {"a-1.x", "b"};
  expect_hosts("a-1.x,b", e, 2);
  const char *f[] = {"x099", "x100"};
  expect_hosts("x[099-100]", f, 2);
  const char *g[] = {"h5-ib"};
  expect_hosts("h[5]-ib", g, 1);
}

static void expect_error(const char *list, const char *needle)
{
  char names[4][NAME], err[256] = "";
  assert_int_equal(wf_nodelist_expand(list, &names[0][0], 4, NAME, err, sizeof err), -1);
  if (!strstr(err, needle))
    fail_msg("'%s': message '%s' lacks '%s'", list, err, needle);
}

static void test_errors(void **state)
{
  expect_error("gpu[01-04", "missing ']'");
  expect_error("gpu01]", "unbalanced");
  expect_error("gpu[04-01]", "backwards");
  expect_error("gpu[a-b]", "not a number");
  expect_error("gpu[]", "empty");
  expect_error("a,,b", "empty host name");
  expect_error("", "empty");
  expect_error("n[1-5]", "more than 4 hosts");
}

int main(void)
{
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_forms), cmocka_unit_test(test_errors)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
