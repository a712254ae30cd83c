/*
 * control_fixture.h - what the control-plane tests (test_control*.c, one binary, one test
 * per process) share: a service with control clients as threads (the fixture), raw
 * sockets that play misbehaving peers, and the table of tests.
 */
#ifndef WF_TEST_CONTROL_FIXTURE_H
#define WF_TEST_CONTROL_FIXTURE_H

#include <arpa/inet.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "wf_control.h"
#include "wf_proto.h"

#define MAXR 8

typedef struct fixture {
  char dir[64];
  wf_service *svc;
  wf_control *ctl[MAXR];
  int n;
  atomic_int aborts;
  double abort_at[MAXR]; /* wf_now() when each rank's on_abort ran */
  char abort_reason[MAXR][2048];
  int idx[MAXR];
  wf_console_job job;
} fixture;

extern fixture *g_fx;          /* the running fixture: on_abort records into it */
extern const char *g_gpu_bus0; /* control client 0's GPU (test_gpu_figures) */
extern int g_http_port;        /* the service's HTTP listener (test_view); 0 = none */

/* A control client's abort callback: records the time and reason for rank *user. */
void on_abort(void *user, const char *reason);
/* Rank `rank`'s facts in mesh m: two ranks per host. */
wf_rank_facts facts_for(int rank, const wf_mesh *m);
/* Start a service for `world` ranks and `nctl` control clients (ranks 0..nctl-1). */
fixture *fx_start(int world, int nctl, double hang_s);
void fx_stop(fixture *fx);
/* A console command's answer, parsed. */
json_t *query(fixture *fx, wf_console_cmd cmd);
void wait_for(atomic_int *v, int want, double seconds);
/* A port of 127.0.0.1 that was free a moment ago. */
int free_port(void);

/* ---- raw peers ------------------------------------------------------------------- */

int raw_connect(fixture *fx);
void raw_send(int fd, Weft__Envelope *env);
void raw_hello(int fd, const char *token, int rank);
/* Read one envelope, or NULL when the peer closed or nothing came in `ms`. */
Weft__Envelope *raw_recv(int fd, int ms);
/* True when the server closes the connection within `ms` (reading past any Error). */
bool raw_closed_within(int fd, int ms);

/* ---- the tests (one table in test_control.c) ------------------------------------- */

void test_registry_and_queries(void **state);
void test_view(void **state);
void test_dropped_worker(void **state);
void test_trace(void **state);
void test_silent_worker(void **state);
void test_hang_diagnosis(void **state);
void test_hang_diagnosis_per_communicator(void **state);
void test_bad_peers(void **state);
void test_auth_flood_and_trickle(void **state);
void test_polling_load(void **state);
void test_error_report(void **state);
void test_orderly_shutdown(void **state);
void test_coordinator_death(void **state);
void test_coordinator_frozen(void **state);
void test_coordinator_reset(void **state);
void test_port_in_use_and_unreachable(void **state);
void test_connect_deadline(void **state);
void test_listen_address(void **state);
void test_metrics(void **state);
void test_unix_worker_and_files(void **state);
void test_gpu_figures(void **state);

#endif
