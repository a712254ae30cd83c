/*
 * test_control.c - the coordinator service, control clients and console in one process:
 * the table of tests, and the tests of queries, reports and shutdown.
 *
 * The service listens on a free port of 127.0.0.1; control clients run as their own
 * threads (no MPI); raw sockets play misbehaving peers. Timings asserted here are
 * the watchdog's contract: a dropped worker is noticed and every other rank told
 * within 2 s.
 */
#include "control_fixture.h"

void test_registry_and_queries(void **state)
{
  fixture *fx = fx_start(4, 4, 0);
  for (int i = 0; i < 4; i++) {
    wf_control_set_phase(fx->ctl[i], "forward");
    wf_control_set_collective(fx->ctl[i], 7, "allreduce(tp)", false);
    wf_control_report_step(fx->ctl[i], 4, i == 3 ? 2.5 : NAN, 1234.0, 50.0, 1u << 20);
  }
  usleep(1300 * 1000); /* one heartbeat carries phase and collective */

  json_t *st = query(fx, WF_CONSOLE_STATUS);
  assert_string_equal(json_string_value(json_object_get(st, "state")), "running");
  assert_int_equal(json_integer_value(json_object_get(st, "step")), 4);
  assert_true(json_real_value(json_object_get(st, "loss")) == 2.5); /* rank 3's loss */
  assert_int_equal(json_integer_value(json_object_get(st, "alive")), 4);
  /* ETA: (100 - 1 - 4) steps x 50 ms = 4.75 s */
  assert_true(fabs(json_real_value(json_object_get(st, "eta_s")) - 4.75) < 1e-9);
  json_decref(st);

  json_t *rk = query(fx, WF_CONSOLE_RANKS);
  json_t *ranks = json_object_get(rk, "ranks");
  assert_int_equal(json_array_size(ranks), 4);
  for (int i = 0; i < 4; i++) {
    json_t *r = json_array_get(ranks, (size_t)i);
    assert_int_equal(json_integer_value(json_object_get(r, "pid")), 1000 + i);
    assert_string_equal(json_string_value(json_object_get(r, "state")), "alive");
    assert_string_equal(json_string_value(json_object_get(r, "phase")), "forward");
    json_t *c = json_object_get(r, "collective");
    assert_int_equal(json_integer_value(json_object_get(c, "seq")), 7);
    assert_true(json_real_value(json_object_get(r, "heartbeat_age_s")) < 1.5);
    /* rank = tp + 2 * dp on a dp 2 x tp 2 mesh */
    json_t *co = json_object_get(r, "coords");
    assert_int_equal(json_integer_value(json_object_get(co, "tp")), i % 2);
    assert_int_equal(json_integer_value(json_object_get(co, "dp")), i / 2);
  }
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  char *js = json_dumps(rk, 0);
  assert_int_equal(wf_console_render(WF_CONSOLE_RANKS, js, out), WF_OK);
  fclose(out);
  assert_non_null(strstr(text, "#7 allreduce(tp)"));
  assert_non_null(strstr(text, "host1"));
  free(text);
  free(js);
  json_decref(rk);

  json_t *mesh = query(fx, WF_CONSOLE_MESH);
  /* tp groups on dp 2 x tp 2: {0,1}, {2,3}; dp groups: {0,2}, {1,3} */
  js = json_dumps(json_object_get(json_object_get(mesh, "groups"), "tp"), JSON_COMPACT);
  assert_string_equal(js, "[[0,1],[2,3]]");
  free(js);
  js = json_dumps(json_object_get(json_object_get(mesh, "groups"), "dp"), JSON_COMPACT);
  assert_string_equal(js, "[[0,2],[1,3]]");
  free(js);
  js = json_dumps(mesh, 0);
  out = open_memstream(&text, &len);
  wf_console_render(WF_CONSOLE_MESH, js, out);
  fclose(out);
  assert_non_null(strstr(text, "pipeline stage pp=0"));
  free(text);
  free(js);
  json_decref(mesh);

  /* schedule says so rather than failing silently */
  char err[512];
  assert_int_equal(wf_console_request(&fx->job, WF_CONSOLE_SCHEDULE, 2000, &js, err, sizeof err),
                   WF_EUNSUPPORTED);
  assert_non_null(strstr(err, "not available"));
  assert_int_equal(wf_service_set_schedule(fx->svc, "rank 0: F0 F1 B0 B1\nrank 1: F0 B0 F1 B1"),
                   WF_OK);
  json_t *sch = query(fx, WF_CONSOLE_SCHEDULE);
  assert_non_null(strstr(json_string_value(json_object_get(sch, "schedule")), "rank 1: F0 B0"));
  json_decref(sch);

  /* console commands reach every worker */
  assert_int_equal(wf_console_request(&fx->job, WF_CONSOLE_CHECKPOINT, 2000, &js, err, sizeof err),
                   WF_OK);
  free(js);
  assert_int_equal(wf_console_request(&fx->job, WF_CONSOLE_STOP, 2000, &js, err, sizeof err),
                   WF_OK);
  free(js);
  usleep(200 * 1000);
  for (int i = 0; i < 4; i++) {
    assert_true(wf_control_stop_requested(fx->ctl[i]));
    assert_true(wf_control_checkpoint_requested(fx->ctl[i]));
    assert_false(wf_control_checkpoint_requested(fx->ctl[i])); /* consumed */
  }
  /* The job is listed in its directory. */
  wf_console_job jobs[4];
  assert_int_equal(wf_console_find_jobs(fx->dir, jobs, 4), 1);
  assert_string_equal(jobs[0].id, fx->job.id);
  assert_int_equal(atomic_load(&fx->aborts), 0);
  fx_stop(fx);
}

static void fake_trace(void *user, char *buf, size_t len)
{
  int rank = *(int *)user;
  snprintf(buf, len, "dp#%d allreduce 1024 x f32 done\ndp#%d allreduce 1024 x f32 running\n",
           2 * rank, 2 * rank + 1);
}

void test_trace(void **state)
{
  fixture *fx = fx_start(4, 3, 0); /* rank 3 never registers */
  wf_control_set_trace_fn(fx->ctl[0], fake_trace, &fx->idx[0]);
  wf_control_set_trace_fn(fx->ctl[1], fake_trace, &fx->idx[1]);
  /* rank 2 has no flight recorder */
  double t0 = wf_now();
  json_t *j = query(fx, WF_CONSOLE_TRACE);
  /* every live rank answered, so no waiting for the 1 s deadline */
  assert_true(wf_now() - t0 < 0.5);
  json_t *ranks = json_object_get(j, "ranks");
  assert_int_equal(json_array_size(ranks), 4);
  json_t *r1 = json_array_get(ranks, 1);
  assert_true(json_is_true(json_object_get(r1, "answered")));
  assert_string_equal(json_string_value(json_array_get(json_object_get(r1, "lines"), 1)),
                      "dp#3 allreduce 1024 x f32 running");
  json_t *r2 = json_array_get(ranks, 2);
  assert_non_null(strstr(json_string_value(json_array_get(json_object_get(r2, "lines"), 0)),
                         "no flight recorder"));
  assert_false(json_is_true(json_object_get(json_array_get(ranks, 3), "answered")));
  char *js = json_dumps(j, 0), *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  assert_int_equal(wf_console_render(WF_CONSOLE_TRACE, js, out), WF_OK);
  fclose(out);
  assert_non_null(strstr(text, "rank 3: no answer"));
  assert_non_null(strstr(text, "  dp#0 allreduce 1024 x f32 done"));
  free(text);
  free(js);
  json_decref(j);
  fx_stop(fx);
}

void test_polling_load(void **state)
{
  fixture *fx = fx_start(8, 8, 0);
  /* 3 s in CI; WEFT_TEST_POLL_SECONDS=60 for the full minute */
  const char *env = getenv("WEFT_TEST_POLL_SECONDS");
  double secs = env ? atof(env) : 3.0, end = wf_now() + secs, worst = 0;
  int n = 0;
  while (wf_now() < end) {
    double t = wf_now();
    char *js = NULL, err[512];
    assert_int_equal(wf_console_request(&fx->job, WF_CONSOLE_RANKS, 2000, &js, err, sizeof err),
                     WF_OK);
    free(js);
    worst = WF_MAX(worst, wf_now() - t);
    n++;
    double next = t + 0.01; /* 100 queries a second */
    if (wf_now() < next)
      usleep((useconds_t)((next - wf_now()) * 1e6));
  }
  fprintf(stderr, "polling: %d ranks queries in %.0f s, slowest %.1f ms\n", n, secs, worst * 1e3);
  assert_true(n >= 66 * secs); /* 100 a second, less sleep overshoot */
  assert_int_equal(atomic_load(&fx->aborts), 0);
  json_t *st = query(fx, WF_CONSOLE_STATUS);
  assert_int_equal(json_integer_value(json_object_get(st, "alive")), 8);
  json_decref(st);
  fx_stop(fx);
}

void test_error_report(void **state)
{
  fixture *fx = fx_start(3, 3, 0);
  wf_control_report_step(fx->ctl[1], 9, NAN, 0, 0, 0);
  usleep(100 * 1000);
  wf_control_report_error(fx->ctl[1], WF_EIO, "cannot read data shard 7", 1000);
  wait_for(&fx->aborts, 3, 3.0);
  assert_int_equal(atomic_load(&fx->aborts), 3);
  for (int i = 0; i < 3; i++) {
    assert_non_null(strstr(fx->abort_reason[i], "rank 1 (host host0, pid 1001"));
    assert_non_null(strstr(fx->abort_reason[i], "cannot read data shard 7"));
    assert_non_null(strstr(fx->abort_reason[i], "at step 9"));
  }
  fx_stop(fx);
}

void test_orderly_shutdown(void **state)
{
  fixture *fx = fx_start(2, 2, 0);
  /* The service ends first (rank 0 finished): SHUTDOWN, then EOF, is no abort. */
  char file[700];
  wf_strlcpy(file, wf_service_job_file(fx->svc), sizeof file);
  wf_service_destroy(fx->svc);
  assert_int_equal(access(file, F_OK), -1);
  usleep(500 * 1000);
  assert_int_equal(atomic_load(&fx->aborts), 0);
  for (int i = 0; i < 2; i++)
    wf_control_destroy(fx->ctl[i]);
  rmdir(fx->dir);
  free(fx);
  g_fx = NULL;
}

/* A rank with a GPU sends its NVML figures in heartbeats and `ranks` shows them; a rank
 * without one shows none. NVML is tests/runtime/fake_nvml.c here (LD_LIBRARY_PATH from
 * meson), whose device at 0000:19:00.0 is 37% busy with 1288490188 of 85899345920 bytes
 * in use. */
void test_gpu_figures(void **state)
{
  (void)state;
  g_gpu_bus0 = "0000:19:00.0";
  fixture *fx = fx_start(2, 2, 0);
  usleep(1300 * 1000); /* one heartbeat */
  json_t *rk = query(fx, WF_CONSOLE_RANKS);
  json_t *r0 = json_array_get(json_object_get(rk, "ranks"), 0);
  json_t *r1 = json_array_get(json_object_get(rk, "ranks"), 1);
  assert_int_equal(json_integer_value(json_object_get(r0, "gpu_util_percent")), 37);
  assert_int_equal(json_integer_value(json_object_get(r0, "gpu_mem_used_bytes")), 1288490188);
  assert_int_equal(json_integer_value(json_object_get(r0, "gpu_mem_total_bytes")), 85899345920);
  assert_true(json_is_null(json_object_get(r1, "gpu_util_percent")));
  json_decref(rk);
  g_gpu_bus0 = NULL;
  fx_stop(fx);
}

/* One table; `test_control NAME` runs one test (meson runs each in its own process). */
int main(int argc, char **argv)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registry_and_queries),
      cmocka_unit_test(test_view),
      cmocka_unit_test(test_dropped_worker),
      cmocka_unit_test(test_trace),
      cmocka_unit_test(test_silent_worker),
      cmocka_unit_test(test_hang_diagnosis),
      cmocka_unit_test(test_hang_diagnosis_per_communicator),
      cmocka_unit_test(test_bad_peers),
      cmocka_unit_test(test_auth_flood_and_trickle),
      cmocka_unit_test(test_polling_load),
      cmocka_unit_test(test_error_report),
      cmocka_unit_test(test_orderly_shutdown),
      cmocka_unit_test(test_coordinator_death),
      cmocka_unit_test(test_coordinator_frozen),
      cmocka_unit_test(test_coordinator_reset),
      cmocka_unit_test(test_port_in_use_and_unreachable),
      cmocka_unit_test(test_connect_deadline),
      cmocka_unit_test(test_listen_address),
      cmocka_unit_test(test_metrics),
      cmocka_unit_test(test_unix_worker_and_files),
      cmocka_unit_test(test_gpu_figures),
  };
  if (argc > 1)
    cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
