/*
 * mpi_fault.c - a small MPI job on the real control plane, with one injected fault.
 *
 *   mpirun -np N mpi_fault MODE FAULT_RANK
 *
 * Rank 0 starts the coordinator service and broadcasts its endpoint and token, every
 * rank starts its control thread, then all run steps of MPI_Allreduce, reporting each
 * step and collective like the worker does. At step 5 FAULT_RANK injects MODE:
 *   none   - no fault: the job ends normally and every rank exits 0
 *   kill   - SIGKILL itself               exit   - exit(1) without a word
 *   stop   - SIGSTOP itself (frozen)      skip   - skip one all-reduce (a hang)
 * (FAULT_RANK 0 makes kill/stop hit the coordinator's rank.) Lines "FAULT t=" and
 * "ABORT t=" (wall clock) let the driver measure detection and exit times. A skipped
 * all-reduce is matched by MPI with the next one, so the job runs on and hangs only
 * at its end: "STEP t=" lines mark when it stopped progressing.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wf_control.h"

typedef struct plane {
  int ok;
  char endpoint[300], token[WF_TOKEN_HEX + 1], job_id[64];
} plane;

static void on_abort(void *user, const char *reason)
{
  fprintf(stderr, "ABORT t=%.3f rank=%d: %s\n", wf_wall_time(), *(int *)user, reason);
  fflush(stderr);
  _exit(3);
}

static void fault(const char *mode, int rank)
{
  fprintf(stderr, "FAULT t=%.3f rank=%d mode=%s\n", wf_wall_time(), rank, mode);
  fflush(stderr);
  if (strcmp(mode, "kill") == 0)
    raise(SIGKILL);
  if (strcmp(mode, "exit") == 0)
    exit(1);
  if (strcmp(mode, "stop") == 0)
    raise(SIGSTOP);
}

static wf_service *start_service(int world, plane *p)
{
  wf_service *svc = NULL;
  snprintf(p->job_id, sizeof p->job_id, "fault-%d", (int)getpid());
  wf_service_opts so = {.job_id = p->job_id,
                        .world_size = world,
                        .mesh = {.dp = world, .tp = 1, .pp = 1},
                        .master_addr = "127.0.0.1",
                        .model_desc = "mpi_fault",
                        .total_steps = 40,
                        .hang_timeout_s = 3.0};
  if (wf_service_start(&svc, &so) == WF_OK) {
    p->ok = 1;
    wf_strlcpy(p->endpoint, wf_service_endpoint(svc), sizeof p->endpoint);
    wf_strlcpy(p->token, wf_service_token(svc), sizeof p->token);
  }
  return svc;
}

int main(int argc, char **argv)
{
  int provided, rank, world;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  wf_rt_set_rank(rank);
  const char *mode = argc > 1 ? argv[1] : "none";
  int fault_rank = argc > 2 ? atoi(argv[2]) : 1;
  plane p;
  memset(&p, 0, sizeof p);
  wf_service *svc = rank == 0 ? start_service(world, &p) : NULL;
  MPI_Bcast(&p, sizeof p, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (!p.ok)
    MPI_Abort(MPI_COMM_WORLD, 2);
  wf_rank_facts f;
  memset(&f, 0, sizeof f);
  f.rank = rank;
  f.pid = (int)getpid();
  wf_strlcpy(f.host, wf_rt_host(), sizeof f.host);
  wf_strlcpy(f.device, "cpu", sizeof f.device);
  f.coords.dp = rank;
  wf_control_opts co = {.endpoint = p.endpoint,
                        .token = p.token,
                        .job_id = p.job_id,
                        .facts = f,
                        .on_abort = on_abort,
                        .user = &rank};
  wf_control *ctl;
  if (wf_control_start(&ctl, &co) != WF_OK)
    MPI_Abort(MPI_COMM_WORLD, 2);
  uint64_t seq = 0;
  for (int step = 0; step < 40; step++) {
    if (step == 5 && rank == fault_rank && strcmp(mode, "none") != 0)
      fault(mode, rank);
    bool skip = step == 5 && rank == fault_rank && strcmp(mode, "skip") == 0;
    double x = 1.0, sum = 0.0;
    if (!skip) {
      wf_control_set_collective(ctl, ++seq, "allreduce(world)", true);
      MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      wf_control_set_collective(ctl, seq, "allreduce(world)", false);
    }
    wf_control_report_step(ctl, step, sum, 0, 50, 0);
    if (strcmp(mode, "skip") == 0) /* the hang starts after the last step anyone ends */
      fprintf(stderr, "STEP t=%.3f rank=%d step=%d\n", wf_wall_time(), rank, step);
    usleep(50 * 1000);
  }
  wf_control_destroy(ctl);
  MPI_Barrier(MPI_COMM_WORLD);
  wf_service_destroy(svc);
  MPI_Finalize();
  return 0;
}
