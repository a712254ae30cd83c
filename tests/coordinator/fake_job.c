/*
 * fake_job.c - a stand-in for a running job, for console tests and demos without MPI.
 *
 *   fake_job WORLD DP TP PP SECONDS
 *
 * Starts the coordinator service (job dir from $WEFT_JOB_DIR) and WORLD control
 * clients as threads, each reporting a step every 200 ms with a falling loss and
 * a collective sequence, until SECONDS pass or the console says `stop`. Prints the
 * job id on stdout once every rank has registered. Exits 0 on stop or time out,
 * 3 when the job was aborted.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wf_control.h"

#define MAXW 64

static atomic_int aborted;
static _Atomic int64_t current_step;

/* Stands in for the collectives' flight recorder. */
static void trace_fn(void *user, char *buf, size_t len)
{
  int64_t s = atomic_load(&current_step);
  snprintf(buf, len,
           "clock: precise (ns)\ndp#%lld allreduce 4 x f32 (16 B) done in 1.000 ms\n"
           "tp#%lld allreduce 4 x f32 (16 B) running for 2.000 ms\n",
           (long long)(3 * s), (long long)(3 * s + 1));
}

static void on_abort(void *user, const char *reason) { atomic_store(&aborted, 1); }

static wf_rank_facts facts_for(int r, const wf_mesh *m)
{
  wf_rank_facts f;
  memset(&f, 0, sizeof f);
  f.rank = r;
  f.local_rank = r % 4;
  f.local_size = 4;
  f.pid = (int)getpid();
  snprintf(f.host, sizeof f.host, "node%02d", r / 4);
  snprintf(f.device, sizeof f.device, "cpu");
  snprintf(f.binding, sizeof f.binding, "core %d", r % 4);
  f.threads = 1;
  f.coords = (wf_coords){.pp = r / (m->tp * m->dp), .dp = (r / m->tp) % m->dp, .tp = r % m->tp};
  return f;
}

int main(int argc, char **argv)
{
  if (argc != 6) {
    fprintf(stderr, "usage: fake_job WORLD DP TP PP SECONDS\n");
    return 2;
  }
  int world = atoi(argv[1]);
  wf_mesh mesh = {.dp = atoi(argv[2]), .tp = atoi(argv[3]), .pp = atoi(argv[4])};
  double seconds = atof(argv[5]);
  if (world < 1 || world > MAXW || mesh.dp * mesh.tp * mesh.pp != world)
    return 2;
  wf_rank_facts facts[MAXW];
  for (int r = 0; r < world; r++)
    facts[r] = facts_for(r, &mesh);
  char id[64];
  snprintf(id, sizeof id, "fake-%d", (int)getpid());
  wf_service_opts so = {.job_id = id,
                        .world_size = world,
                        .mesh = mesh,
                        .facts = facts,
                        .master_addr = "127.0.0.1",
                        .bind_addr = "127.0.0.1",
                        .port = getenv("MASTER_PORT") ? atoi(getenv("MASTER_PORT")) : 0,
                        .model_desc = "gpt2-tiny (fake job)",
                        .total_steps = 1000};
  wf_service *svc;
  if (wf_service_start(&svc, &so) != WF_OK)
    return 1;
  wf_control *ctl[MAXW];
  for (int r = 0; r < world; r++) {
    wf_control_opts co = {.endpoint = wf_service_endpoint(svc),
                          .token = wf_service_token(svc),
                          .job_id = id,
                          .facts = facts[r],
                          .stage_desc = "layers 0-3",
                          .on_abort = on_abort};
    if (wf_control_start(&ctl[r], &co) != WF_OK)
      return 1;
    wf_control_set_trace_fn(ctl[r], trace_fn, NULL);
  }
  printf("%s\n", id);
  fflush(stdout);
  double t0 = wf_now();
  int64_t step = 0;
  while (wf_now() - t0 < seconds && !wf_control_stop_requested(ctl[0]) && !atomic_load(&aborted)) {
    for (int r = 0; r < world; r++) {
      wf_control_set_phase(ctl[r], step % 2 ? "forward" : "backward");
      wf_control_set_collective(ctl[r], (uint64_t)(3 * step + 1), "allreduce(dp)", false);
      bool last = facts[r].coords.pp == mesh.pp - 1;
      wf_control_report_step(ctl[r], step, last ? 5.0 * exp(-0.01 * (double)step) : NAN, 12345.0,
                             200.0, (uint64_t)(64 + r) << 20);
    }
    step++;
    atomic_store(&current_step, step);
    usleep(200 * 1000);
  }
  for (int r = 0; r < world; r++)
    wf_control_destroy(ctl[r]);
  wf_service_destroy(svc);
  return atomic_load(&aborted) ? 3 : 0;
}
