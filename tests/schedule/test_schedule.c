/*
 * test_schedule.c - pipeline schedules as data: generator properties over many
 * (p, m, v), the validator's rejections (deadlock, missing and repeated micro-batches,
 * wrong order), in-flight accounting, the simulated bubble and the drawing.
 *
 * Each case runs in its own process (meson passes the case name as argv[1]).
 *
 * Cost model of the bubble checks: forward and backward take a whole number of ticks
 * each (unit: 1 and 1; also 1 and 2), messages take none, every stage costs the same.
 * Then GPipe and 1F1B both finish in (m + p - 1)(F + B) ticks while each rank is busy
 * m (F + B), so the idle fraction is exactly (p - 1) / (m + p - 1); interleaved with v
 * chunks of cost F/v, B/v gives (p - 1) / (v m + p - 1) (Megatron-LM paper, sec. 2.2).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wf_parallel.h"

enum { MAX_P = 8, MAX_M = 16 };

#define ACT(o, mb, c, peer) ((wf_sched_action){WF_ACT_##o, (mb), (c), (peer)})
#define F(mb)               ACT(FORWARD, mb, 0, -1)
#define B(mb)               ACT(BACKWARD, mb, 0, -1)
#define SF(mb, to)          ACT(SEND_F, mb, 0, to)
#define RF(mb, from)        ACT(RECV_F, mb, 0, from)
#define SB(mb, to)          ACT(SEND_B, mb, 0, to)
#define RB(mb, from)        ACT(RECV_B, mb, 0, from)

static int count_op(const wf_schedule *s, wf_sched_op op)
{
  int n = 0;
  for (int i = 0; i < s->n; i++)
    n += s->actions[i].op == op;
  return n;
}

/* Every (mb, chunk) has exactly one forward and one backward on this rank. */
static void assert_each_once(const wf_schedule *s)
{
  int m = s->prm.microbatches, v = s->prm.virtual_stages;
  int *cnt = calloc((size_t)2 * m * v, sizeof *cnt);
  assert_non_null(cnt);
  for (int i = 0; i < s->n; i++) {
    const wf_sched_action *a = &s->actions[i];
    if (a->op == WF_ACT_FORWARD || a->op == WF_ACT_BACKWARD)
      cnt[(a->op == WF_ACT_BACKWARD) * m * v + a->mb * v + a->chunk]++;
  }
  for (int k = 0; k < 2 * m * v; k++)
    assert_int_equal(cnt[k], 1);
  free(cnt);
}

/* A SEND comes right after the compute that produced it: the last compute before it
 * is that micro-batch's forward (SEND_F) or backward (SEND_B) on the same chunk. */
static void assert_sends_follow_producer(const wf_schedule *s)
{
  const wf_sched_action *last = NULL;
  for (int i = 0; i < s->n; i++) {
    const wf_sched_action *a = &s->actions[i];
    if (a->op == WF_ACT_FORWARD || a->op == WF_ACT_BACKWARD)
      last = a;
    if (a->op != WF_ACT_SEND_F && a->op != WF_ACT_SEND_B)
      continue;
    assert_non_null(last);
    assert_int_equal(last->op, a->op == WF_ACT_SEND_F ? WF_ACT_FORWARD : WF_ACT_BACKWARD);
    assert_int_equal(last->mb, a->mb);
    assert_int_equal(last->chunk, a->chunk);
  }
}

/* Generating one rank alone gives the same list as generating all ranks together. */
static void assert_pure(const wf_schedule *all, const wf_sched_params *prm, int r)
{
  wf_schedule one;
  char err[256];
  assert_int_equal(wf_schedule_init(&one, prm, r, err, sizeof err), WF_OK);
  assert_int_equal(one.n, all[r].n);
  assert_memory_equal(one.actions, all[r].actions, (size_t)one.n * sizeof *one.actions);
  wf_schedule_fini(&one);
}

/* Megatron's warm-up length for the interleaved schedule. */
static int interleaved_warmup(int p, int r, int m, int v)
{
  int w = (p - r - 1) * 2 + (v - 1) * p;
  return w < m * v ? w : m * v;
}

/* The peak in-flight count each kind promises for rank r. */
static int expected_peak(const wf_sched_params *prm, int r)
{
  int p = prm->pp, m = prm->microbatches, v = prm->virtual_stages;
  switch (prm->kind) {
  case WF_SCHED_GPIPE: return m;                    /* all forwards first */
  case WF_SCHED_1F1B: return p - r < m ? p - r : m; /* warm-up + 1, the 1F1B bound */
  case WF_SCHED_INTERLEAVED: {
    int w = interleaved_warmup(p, r, m, v); /* warm-up + 1 chunk activations */
    return w + 1 < m * v ? w + 1 : m * v;
  }
  }
  return -1;
}

static void check_one(const wf_sched_params *prm)
{
  wf_schedule ranks[MAX_P];
  char err[512] = "";
  int span = 0;
  double bubble = -1, theory = wf_schedule_bubble_theory(prm);
  assert_int_equal(wf_schedule_init_all(ranks, prm, err, sizeof err), WF_OK);
  if (wf_schedule_validate(ranks, err, sizeof err) != WF_OK)
    fail_msg("%s p=%d m=%d v=%d: %s", wf_schedule_kind_str(prm->kind), prm->pp, prm->microbatches,
             prm->virtual_stages, err);
  int units = prm->microbatches * prm->virtual_stages;
  for (int r = 0; r < prm->pp; r++) {
    assert_int_equal(count_op(&ranks[r], WF_ACT_FORWARD), units);
    assert_int_equal(count_op(&ranks[r], WF_ACT_BACKWARD), units);
    assert_each_once(&ranks[r]);
    assert_sends_follow_producer(&ranks[r]);
    assert_int_equal(wf_schedule_peak_inflight(&ranks[r]), expected_peak(prm, r));
    assert_pure(ranks, prm, r);
  }
  /* unit costs, then backward twice the forward: both give the textbook bubble */
  wf_sched_cost costs[2] = {{1, 1}, {1, 2}};
  for (int c = 0; c < 2; c++) {
    assert_int_equal(wf_schedule_simulate(ranks, costs[c], &span, &bubble), WF_OK);
    assert_float_equal(bubble, theory, 1e-12);
  }
  wf_schedule_fini_all(ranks, prm->pp);
}

static void for_all(wf_schedule_kind kind, int v)
{
  for (int p = 1; p <= MAX_P; p++)
    for (int m = 1; m <= MAX_M; m++)
      if (kind != WF_SCHED_INTERLEAVED || m % p == 0)
        check_one(&(wf_sched_params){kind, p, m, v});
}

static void test_gpipe_properties(void **state) { for_all(WF_SCHED_GPIPE, 1); }
static void test_1f1b_properties(void **state) { for_all(WF_SCHED_1F1B, 1); }

static void test_interleaved_properties(void **state)
{
  for (int v = 2; v <= 4; v++)
    for_all(WF_SCHED_INTERLEAVED, v);
}

/* The compute order alone, as "F0 F1 B0 ...". */
static void compute_str(const wf_schedule *s, char *buf, size_t len)
{
  char a[32];
  buf[0] = '\0';
  for (int i = 0; i < s->n; i++)
    if (s->actions[i].op == WF_ACT_FORWARD || s->actions[i].op == WF_ACT_BACKWARD) {
      wf_schedule_action_str(s, &s->actions[i], a, sizeof a);
      if (buf[0])
        strncat(buf, " ", len - strlen(buf) - 1);
      strncat(buf, a, len - strlen(buf) - 1);
    }
}

static void assert_order(const wf_sched_params *prm, int r, const char *want)
{
  wf_schedule s;
  char err[256], got[1024];
  assert_int_equal(wf_schedule_init(&s, prm, r, err, sizeof err), WF_OK);
  compute_str(&s, got, sizeof got);
  assert_string_equal(got, want);
  wf_schedule_fini(&s);
}

/* The compute orders, written out by hand from the definitions in schedule.c. */
static void test_compute_orders(void **state)
{
  /* 1F1B p=4 m=8: rank 0 warms up with min(3, 8) = 3 forwards, rank 3 with none */
  wf_sched_params ofob = {WF_SCHED_1F1B, 4, 8, 1};
  assert_order(&ofob, 0, "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  assert_order(&ofob, 3, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  /* m < p: warm-up min(p - r - 1, m) = m on rank 0 means GPipe order there */
  assert_order(&(wf_sched_params){WF_SCHED_1F1B, 4, 2, 1}, 0, "F0 F1 B0 B1");
  assert_order(&(wf_sched_params){WF_SCHED_GPIPE, 3, 3, 1}, 1, "F0 F1 F2 B0 B1 B2");
  /* interleaved p=2 m=4 v=2, rank 1: warm-up (2-1-1)*2 + (2-1)*2 = 2 units; forward
   * units go mb 0,1 on chunk a, 0,1 on b, 2,3 on a, 2,3 on b; backward units the
   * same micro-batches with the chunks reversed */
  assert_order(&(wf_sched_params){WF_SCHED_INTERLEAVED, 2, 4, 2}, 1,
               "F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a");
}

/* Two ranks whose first actions are both receives: neither can move. */
static void test_deadlock_recv_first(void **state)
{
  wf_sched_params prm = {WF_SCHED_1F1B, 2, 1, 1};
  wf_sched_action r0[] = {RB(0, 1), F(0), SF(0, 1), B(0)};
  wf_sched_action r1[] = {RF(0, 0), F(0), B(0), SB(0, 0)};
  wf_schedule ranks[2] = {{prm, 0, 4, r0}, {prm, 1, 4, r1}};
  char err[512] = "";
  assert_int_equal(wf_schedule_validate(ranks, err, sizeof err), WF_EINVAL);
  assert_non_null(strstr(err, "rank 0 step 0 (RB0<1)"));
  assert_non_null(strstr(err, "deadlock"));
  assert_non_null(strstr(err, "rank 1, which is blocked at step 0 (RF0<0)"));
}

/* 1F1B p=2 m=2 with each message a blocking op in Megatron's textual order: rank 0
 * sends F1 while rank 1 sends B0, a criss-cross that only grouping or even/odd
 * ordering avoids. With rank 1 receiving first it passes. */
static void test_deadlock_criss_cross(void **state)
{
  wf_sched_params prm = {WF_SCHED_1F1B, 2, 2, 1};
  wf_sched_action r0[] = {F(0), SF(0, 1), F(1), SF(1, 1), RB(0, 1), B(0), RB(1, 1), B(1)};
  wf_sched_action r1[] = {RF(0, 0), F(0), B(0), SB(0, 0), RF(1, 0), F(1), B(1), SB(1, 0)};
  wf_schedule ranks[2] = {{prm, 0, 8, r0}, {prm, 1, 8, r1}};
  char err[512] = "";
  assert_int_equal(wf_schedule_validate(ranks, err, sizeof err), WF_EINVAL);
  assert_non_null(strstr(err, "rank 0 step 3 (SF1>1)"));
  assert_non_null(strstr(err, "blocked at step 3 (SB0>0)"));
  r1[3] = RF(1, 0);
  r1[4] = SB(0, 0);
  assert_int_equal(wf_schedule_validate(ranks, err, sizeof err), WF_OK);
}

/* Generate p=2 1F1B, then let the test edit rank `r`'s list. */
static void make(wf_schedule ranks[2], int m)
{
  char err[256];
  assert_int_equal(
      wf_schedule_init_all(ranks, &(wf_sched_params){WF_SCHED_1F1B, 2, m, 1}, err, sizeof err),
      WF_OK);
}

static int find(const wf_schedule *s, wf_sched_op op, int mb)
{
  for (int i = 0; i < s->n; i++)
    if (s->actions[i].op == op && s->actions[i].mb == mb)
      return i;
  fail_msg("no action %d for micro-batch %d", op, mb);
  return -1;
}

static void drop_mb(wf_schedule *s, int mb)
{
  int n = 0;
  for (int i = 0; i < s->n; i++)
    if (s->actions[i].mb != mb)
      s->actions[n++] = s->actions[i];
  s->n = n;
}

static void expect(const wf_schedule ranks[2], const char *a, const char *b)
{
  char err[512] = "";
  assert_int_equal(wf_schedule_validate(ranks, err, sizeof err), WF_EINVAL);
  if (!strstr(err, a) || (b && !strstr(err, b)))
    fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", err, a, b ? b : "");
}

static void test_missing_microbatch(void **state)
{
  wf_schedule ranks[2];
  char want[64];
  make(ranks, 3);
  drop_mb(&ranks[0], 2); /* rank 0 never touches micro-batch 2 */
  snprintf(want, sizeof want, "rank 0 step %d (end of list)", ranks[0].n);
  expect(ranks, want, "micro-batch 2 on stage 0 (chunk 0) never runs forward");
  wf_schedule_fini_all(ranks, 2);

  make(ranks, 3);
  drop_mb(&ranks[1], 1); /* rank 1 skips micro-batch 1; rank 0 still sends it */
  snprintf(want, sizeof want, "rank 1 step %d (end of list)", ranks[1].n);
  expect(ranks, want, "micro-batch 1 on stage 1 (chunk 0) never runs forward");
  wf_schedule_fini_all(ranks, 2);
}

static void test_repeated_microbatch(void **state)
{
  wf_schedule ranks[2];
  char want[64];
  make(ranks, 2);
  int i = find(&ranks[0], WF_ACT_FORWARD, 1), first = find(&ranks[0], WF_ACT_FORWARD, 0);
  ranks[0].actions[i].mb = 0; /* rank 0 runs F0 twice */
  snprintf(want, sizeof want, "rank 0 step %d (F0): repeats micro-batch 0", i);
  expect(ranks, want, NULL);
  snprintf(want, sizeof want, "already ran at step %d", first);
  expect(ranks, want, NULL);
  wf_schedule_fini_all(ranks, 2);
}

static void test_order_violations(void **state)
{
  wf_schedule ranks[2];
  char want[64];
  make(ranks, 2);
  int f = find(&ranks[1], WF_ACT_FORWARD, 0), b = find(&ranks[1], WF_ACT_BACKWARD, 0);
  ranks[1].actions[f] = B(0); /* backward before its forward on the last stage */
  ranks[1].actions[b] = F(0);
  snprintf(want, sizeof want, "rank 1 step %d (B0): backward before its forward", f);
  expect(ranks, want, NULL);
  wf_schedule_fini_all(ranks, 2);

  make(ranks, 2);
  int rf = find(&ranks[1], WF_ACT_RECV_F, 1);
  f = find(&ranks[1], WF_ACT_FORWARD, 1);
  memmove(&ranks[1].actions[rf], &ranks[1].actions[rf + 1],
          (size_t)(f - rf) * sizeof *ranks[1].actions); /* F1 ahead of its RECV_F */
  ranks[1].actions[f] = RF(1, 0);
  snprintf(want, sizeof want, "rank 1 step %d (F1): forward before its input arrived", f - 1);
  expect(ranks, want, NULL);
  wf_schedule_fini_all(ranks, 2);

  make(ranks, 2);
  ranks[0].actions[find(&ranks[0], WF_ACT_SEND_F, 0)].peer = 0;
  expect(ranks, "rank 0 step 1 (SF0>0)", "peer 0 is wrong: stage 1 is on rank 1");
  wf_schedule_fini_all(ranks, 2);
}

/* Rank 0 sends micro-batches 0 and 1 in the opposite order to rank 1's receives:
 * NCCL would hand micro-batch 1's activation to micro-batch 0's receive. */
static void test_message_order_mismatch(void **state)
{
  wf_sched_params prm = {WF_SCHED_GPIPE, 2, 2, 1};
  wf_sched_action r0[] = {F(0), F(1), SF(1, 1), SF(0, 1), RB(0, 1), B(0), RB(1, 1), B(1)};
  wf_sched_action r1[] = {RF(0, 0), F(0), RF(1, 0), F(1), B(0), SB(0, 0), B(1), SB(1, 0)};
  wf_schedule ranks[2] = {{prm, 0, 8, r0}, {prm, 1, 8, r1}};
  expect(ranks, "rank 0 step 2 (SF1>1): meets rank 1 step 0 (RF0<0): not the same message", NULL);
}

static void test_params_rejected(void **state)
{
  wf_schedule ranks[MAX_P];
  char err[256] = "";
  assert_int_equal(wf_schedule_init_all(ranks, &(wf_sched_params){WF_SCHED_INTERLEAVED, 4, 6, 2},
                                        err, sizeof err),
                   WF_EINVAL);
  assert_non_null(strstr(err, "microbatches=6 to be a multiple of pp=4"));
  assert_int_equal(
      wf_schedule_init_all(ranks, &(wf_sched_params){WF_SCHED_GPIPE, 2, 4, 2}, err, sizeof err),
      WF_EINVAL);
  assert_non_null(strstr(err, "virtual_stages=2 must be 1"));
  assert_int_equal(
      wf_schedule_init(ranks, &(wf_sched_params){WF_SCHED_1F1B, 2, 4, 1}, 2, err, sizeof err),
      WF_EINVAL);
}

static char *capture_draw(const wf_sched_params *prm, wf_sched_cost cost)
{
  wf_schedule ranks[MAX_P];
  char err[256], *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  assert_non_null(out);
  assert_int_equal(wf_schedule_init_all(ranks, prm, err, sizeof err), WF_OK);
  assert_int_equal(wf_schedule_draw(out, ranks, cost), WF_OK);
  fclose(out);
  wf_schedule_fini_all(ranks, prm->pp);
  return text;
}

/* 1F1B p=2 m=2 by hand: rank 0 runs F0 F1, waits a tick for B0's gradient (rank 1
 * runs F0 then B0), runs B0, waits for B1's; rank 1 waits a tick for F0. Makespan
 * 2 (m + p - 1) = 6 ticks. */
static void test_draw(void **state)
{
  char *text = capture_draw(&(wf_sched_params){WF_SCHED_1F1B, 2, 2, 1}, (wf_sched_cost){1, 1});
  assert_string_equal(text, "rank 0 | F0 F1 .. B0 .. B1\n"
                            "rank 1 | .. F0 B0 F1 B1 ..\n");
  free(text);
  /* backward 2 ticks: it fills two columns; GPipe p=2 m=1 takes (1+1)(1+2) = 6 */
  text = capture_draw(&(wf_sched_params){WF_SCHED_GPIPE, 2, 1, 1}, (wf_sched_cost){1, 2});
  assert_string_equal(text, "rank 0 | F0 .. .. .. B0 B0\n"
                            "rank 1 | .. F0 B0 B0 .. ..\n");
  free(text);
}

static void test_print(void **state)
{
  char *text = NULL, err[256];
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  assert_int_equal(
      wf_schedule_print(out, &(wf_sched_params){WF_SCHED_1F1B, 4, 8, 1}, err, sizeof err), WF_OK);
  fclose(out);
  /* (p-1)/(m+p-1) = 3/11 = 0.2727, and 2 (m + p - 1) = 22 ticks */
  assert_non_null(strstr(text, "theoretical (p-1)/(m+p-1) = 3/11 = 0.2727; simulated 0.2727 "
                               "(makespan 22 ticks"));
  assert_non_null(strstr(text, "rank 0 | F0 F1 F2 F3 .. .. .. B0 F4 B1"));
  assert_non_null(strstr(text, "rank 3 (32 actions, peak in flight 1, message buffers 1+0+2):"));
  free(text);
}

/* rank r's message buffers for prm */
static wf_sched_bufs bufs_of(const wf_sched_params *prm, int r)
{
  wf_schedule s;
  char err[256];
  assert_int_equal(wf_schedule_init(&s, prm, r, err, sizeof err), WF_OK);
  wf_sched_bufs b = wf_schedule_buffers(&s);
  wf_schedule_fini(&s);
  return b;
}

/* A stage's message buffers do not grow with p or m. GPipe and 1F1B post each receive
 * one action ahead of its consumer (schedule.c places it where the data comes into
 * being), so: the first stage receives gradients only (one buffer), the last
 * activations only (one), a middle stage one of each, and a stage that sends
 * gradients has two send buffers. Before receive-in-place the engine kept up to
 * min(m, slots + 2) buffers per kind (m under GPipe). Interleaved lists post further
 * ahead, but still a constant: at p = 4, v = 2, m = 8 and m = 32 alike, one or two of
 * each (activations + gradients: rank 0 1 + 2, the middle ranks 2 + 1, the last 2 + 2). */
static void test_buffers(void **state)
{
  wf_schedule_kind kinds[] = {WF_SCHED_1F1B, WF_SCHED_GPIPE};
  for (int kind = 0; kind < 2; kind++)
    for (int p = 2; p <= 8; p *= 2)
      for (int m = 8; m <= 32; m *= 4)
        for (int r = 0; r < p; r++) {
          wf_sched_bufs b = bufs_of(&(wf_sched_params){kinds[kind], p, m, 1}, r);
          assert_int_equal(b.recv_f, r > 0);
          assert_int_equal(b.recv_b, r < p - 1);
          assert_int_equal(b.send_b, r > 0 ? 2 : 0);
        }
  static const int want[4][2] = {{1, 2}, {2, 1}, {2, 1}, {2, 2}}; /* recv_f, recv_b */
  for (int r = 0; r < 4; r++) {
    wf_sched_bufs a = bufs_of(&(wf_sched_params){WF_SCHED_INTERLEAVED, 4, 8, 2}, r);
    wf_sched_bufs b = bufs_of(&(wf_sched_params){WF_SCHED_INTERLEAVED, 4, 32, 2}, r);
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(a.recv_f, want[r][0]);
    assert_int_equal(a.recv_b, want[r][1]);
    assert_int_equal(a.send_b, 2);
  }
  /* one stage: no messages */
  wf_sched_bufs one = bufs_of(&(wf_sched_params){WF_SCHED_1F1B, 1, 8, 1}, 0);
  assert_int_equal(one.recv_f + one.recv_b + one.send_b, 0);
}

int main(int argc, char **argv)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpipe_properties),
      cmocka_unit_test(test_1f1b_properties),
      cmocka_unit_test(test_interleaved_properties),
      cmocka_unit_test(test_compute_orders),
      cmocka_unit_test(test_deadlock_recv_first),
      cmocka_unit_test(test_deadlock_criss_cross),
      cmocka_unit_test(test_missing_microbatch),
      cmocka_unit_test(test_repeated_microbatch),
      cmocka_unit_test(test_order_violations),
      cmocka_unit_test(test_message_order_mismatch),
      cmocka_unit_test(test_params_rejected),
      cmocka_unit_test(test_draw),
      cmocka_unit_test(test_print),
      cmocka_unit_test(test_buffers),
  };
  if (argc > 1)
    cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
