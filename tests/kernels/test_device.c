/*
 * test_device.c - the CPU device of the seam (wf_device.h): memory is accounted and
 * zeroed, memset and copies move the right bytes, views of host-visible memory are the
 * memory itself, events measure host time, and every kernel of the table computes
 * exactly what the CPU kernel it wraps computes (the same function, bit for bit).
 */
#include <string.h>
#include <time.h>

#include "check.h"
#include "wf_config.h" /* wf_precision */
#include "wf_device.h"
#include "wf_kernels.h"

static void test_memory(void **state)
{
  wf_dev *d = wf_dev_cpu();
  wf_mem_stats before, during, after;
  float *p = NULL, *q = NULL;
  wf_mem_get_stats(&before);
  assert_int_equal(wf_dev_alloc_floats(d, &p, 1000), WF_OK);
  assert_int_equal(wf_dev_alloc_floats(d, &q, 1000), WF_OK);
  wf_mem_get_stats(&during);
  assert_int_equal(during.current[WF_MEM_HOST] - before.current[WF_MEM_HOST], 8000);
  for (int i = 0; i < 1000; i++)
    assert_true(p[i] == 0.0f);           /* zeroed */
  assert_true(((uintptr_t)p & 63) == 0); /* 64-byte aligned */
  for (int i = 0; i < 1000; i++)
    p[i] = (float)i;
  assert_int_equal(wf_dev_copy(d, q, p, 1000 * sizeof(float), WF_COPY_D2D, NULL), WF_OK);
  assert_memory_equal(p, q, 1000 * sizeof(float));
  assert_int_equal(wf_dev_memset(d, q + 10, 0, 990 * sizeof(float), NULL), WF_OK);
  assert_true(q[9] == 9.0f && q[10] == 0.0f && q[999] == 0.0f);
  float h[4] = {1, 2, 3, 4};
  assert_int_equal(wf_dev_write(d, p, h, sizeof h), WF_OK);
  assert_int_equal(wf_dev_read(d, h + 2, p, 2 * sizeof(float)), WF_OK);
  assert_true(h[2] == 1.0f && h[3] == 2.0f);
  wf_dev_view v;
  assert_int_equal(wf_dev_map(d, &v, p, 1000 * sizeof(float), WF_MAP_RW), WF_OK);
  assert_ptr_equal(v.host, p); /* host-visible: no staging */
  assert_int_equal(wf_dev_unmap(d, &v), WF_OK);
  assert_true(wf_dev_host_visible(d) && !strcmp(wf_dev_name(d), "cpu"));
  wf_dev_free(d, p);
  wf_dev_free(d, q);
  wf_dev_free(d, NULL);
  wf_mem_get_stats(&after);
  assert_int_equal(after.current[WF_MEM_HOST], before.current[WF_MEM_HOST]);
  assert_int_equal(wf_dev_alloc(d, (void **)&p, 0), WF_OK);
  assert_null(p);
}

static void test_streams_events(void **state)
{
  wf_dev *d = wf_dev_cpu();
  wf_stream *s = NULL;
  wf_event *a = NULL, *b = NULL;
  double sec = -1;
  assert_int_equal(wf_dev_stream_create(d, &s), WF_OK);
  assert_non_null(s);
  assert_int_equal(wf_dev_event_create(d, &a), WF_OK);
  assert_int_equal(wf_dev_event_create(d, &b), WF_OK);
  assert_int_equal(wf_dev_event_record(d, a, s), WF_OK);
  struct timespec ts = {0, 20 * 1000 * 1000};
  nanosleep(&ts, NULL);
  assert_int_equal(wf_dev_event_record(d, b, NULL), WF_OK);
  assert_int_equal(wf_dev_stream_wait(d, NULL, b), WF_OK);
  assert_int_equal(wf_dev_event_sync(d, b), WF_OK);
  assert_int_equal(wf_dev_event_elapsed(d, a, b, &sec), WF_OK);
  assert_true(sec >= 0.019 && sec < 5.0); /* the 20 ms slept, at least */
  assert_int_equal(wf_dev_stream_sync(d, s), WF_OK);
  wf_dev_event_destroy(d, a);
  wf_dev_event_destroy(d, b);
  wf_dev_stream_destroy(d, s);
  assert_int_equal(wf_dev_check(d), WF_OK);
}

/* A few ops through the table against the direct calls: identical bits. */
static void test_table_is_the_cpu_kernels(void **state)
{
  enum { N = 37, C = 24, OC = 40 };
  const wf_kset *k = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  assert_int_equal(k->reg->abi, WF_KREG_ABI);
  assert_int_equal(wf_kset_need(k, (wf_op_id[]){WF_OP_matmul, WF_OP_gelu, WF_OP_round}, 3), WF_OK);
  float x[N * C], w[OC * C], bias[OC], y1[N * OC], y2[N * OC];
  for (size_t i = 0; i < WF_ARRAY_LEN(x); i++)
    x[i] = wf_rng_normal(3, 0, i);
  for (size_t i = 0; i < WF_ARRAY_LEN(w); i++)
    w[i] = wf_rng_normal(3, 1, i);
  for (size_t i = 0; i < WF_ARRAY_LEN(bias); i++)
    bias[i] = wf_rng_normal(3, 2, i);
  wf_matmul_forward(y1, x, w, bias, N, C, OC);
  WF_K(k, matmul)->forward(y2, x, w, bias, N, C, OC, WF_PREC_BF16,
                           NULL); /* lowp: fp32 on the CPU */
  assert_memory_equal(y1, y2, sizeof y1);
  wf_gelu_forward(y1, x, N * C);
  WF_K(k, gelu)->forward(y2, x, N * C, NULL);
  assert_memory_equal(y1, y2, N * C * sizeof(float));
  wf_round_bf16(y1, x, N * C);
  WF_K(wf_kset_as(k, WF_DT_BF16), round)->round(y2, x, N * C, NULL);
  assert_memory_equal(y1, y2, N * C * sizeof(float));
  double s1 = 0.5, s2 = 0.5;
  wf_sumsq_acc(&s1, x, N * C);
  WF_K(k, norm)->sumsq_acc(&s2, x, N * C, NULL);
  assert_true(s1 == s2);
  assert_int_equal(k->reg->last_error(), WF_OK);
}

int main(void)
{
  wf_kernels_set_threads(2);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memory),
      cmocka_unit_test(test_streams_events),
      cmocka_unit_test(test_table_is_the_cpu_kernels),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
