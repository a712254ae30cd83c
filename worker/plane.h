/*
 * plane.h - the worker's side of the control plane: start the coordinator service
 * on rank 0, connect every rank's control thread, and stop both in order.
 */
#ifndef WF_PLANE_INT_H
#define WF_PLANE_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "wf_config.h"
#include "wf_coordinator.h"
#include "wf_runtime.h"
#include "wf_train.h"

struct wf_service;
struct wf_control;

typedef struct wf_plane {
  struct wf_service *svc; /* rank 0 only */
  struct wf_control *ctl; /* every rank */
  const wf_job *job;      /* borrowed: its communicators are aborted with the job */
  int local_rank;         /* this rank's on its host */
} wf_plane;

typedef struct wf_plane_opts {
  const wf_config *cfg;
  const wf_launch *launch; /* master_addr/master_port resolved */
  const wf_job *job;
  bool port_default;   /* nobody chose the port: when it is taken, listen on a free one */
  const char *gpu_bus; /* the rank's GPU's PCI bus id ("" on the CPU): NVML figures */
} wf_plane_opts;

/* Collective over MPI_COMM_WORLD. On failure every rank gets the same message. */
wf_status wf_plane_start(wf_plane *p, const wf_plane_opts *o, char *err, size_t err_len);
/* Tell the coordinator what this step did (for the console and /metrics), with the
 * wall time its last checkpoint ended (0 = none yet) and how many it wrote. */
void wf_plane_report_step(wf_plane *p, const wf_job *job, const wf_train_step_info *info,
                          double ckpt_wall, int64_t checkpoints);
/* Rank 0: remove the job file and the socket now, for a process about to end without
 * wf_plane_stop. Async-signal-safe; accepts NULL and a plane without the service. */
void wf_plane_remove_files(const wf_plane *p);
/* Collective: every rank says Bye, then rank 0 stops the service. */
void wf_plane_stop(wf_plane *p);
/* After this rank's training failed with `st` (message `what`): wait up to timeout_ms
 * for every rank to arrive here too (a failure all ranks agreed on), and return true
 * if they did; the caller then stops the plane as usual. Otherwise the failure was
 * this rank's alone and the others are blocked in a collective or a pipeline receive
 * that will never complete: report it to the coordinator, which aborts every rank
 * with the message (this one too), and return false. */
bool wf_plane_fail(wf_plane *p, wf_status st, const char *what, int timeout_ms);

#endif /* WF_PLANE_INT_H */
