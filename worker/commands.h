/*
 * commands.h - private to the worker binary: its commands, one table (commands.c), and
 * the exit statuses they end with.
 *
 * A command is a row of commands.c's table: its flag, its values, the world its config is
 * validated against, whether it needs the mesh (device, binding, bootstrap), the
 * checks it makes before that, and its run function. The run functions are thin: the
 * work is in the folder of each concern (ckpt/ converts weights, io/ tokenizes, plan/
 * plans, train/ trains and samples, job.c runs the training job with its control plane
 * and signals).
 *
 * Exit statuses (the README's "Exit status"): a launcher's wrapper (scripts/weft-run,
 * the Slurm scripts) retries 1 and 3, never 2, and does not retry 0 or a stop.
 */
#ifndef WF_WORKER_COMMANDS_H
#define WF_WORKER_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "device.h"
#include "wf_ckpt.h"
#include "wf_collectives.h"
#include "wf_config.h"
#include "wf_coordinator.h"
#include "wf_launch.h"
#include "wf_plan.h"

enum {
  WF_EXIT_OK = 0,      /* done, or stopped at a step boundary as asked */
  WF_EXIT_FAILED = 1,  /* failed while running: a restart may succeed */
  WF_EXIT_INPUT = 2,   /* the command line, config or an input file is wrong: it would
                          fail the same way again */
  WF_EXIT_ABORTED = 3, /* the coordinator aborted the job (a rank died or hung) */
  WF_EXIT_SIGNAL = 128 /* + the signal: a second SIGINT/SIGTERM stopped it at once */
};

/* The exit status of a failure with status st (WF_EXIT_INPUT for the user's errors). */
int wf__exit_status(wf_status st);

/* The world a command's config is validated against. */
typedef enum cmd_world {
  W_LAUNCH,  /* the ranks launched (MPI's size) */
  W_MESH,    /* the mesh the keys describe, launched or not (--print-schedule) */
  W_PLANNED, /* the world the config plans for, nothing launched (--estimate) */
  W_ANY,     /* any: the command chooses the mesh (--plan) */
} cmd_world;

/* What a mesh command checks before the device and the mesh, once for the job. */
enum { C_INIT = 1, C_NEED_INIT = 2, C_DATA = 4, C_SAMPLE = 8, C_PROMPT = 16, C_PLANE = 32 };

/* The command line, as parsed by commands.c's tables. */
typedef struct wf__args {
  const struct wf__command *cmd; /* what to run (training unless a command flag is given) */
  const char *val[2];            /* the command's values, e.g. --export's FORMAT and FILE */
  const char *config_file, *save, *save_format;
  const char *hw, *device_mem, *gpus_per_node, *top; /* the planner's options */
  bool json, check_estimate, help, version;
  wf_weights_fmt format; /* of --save and --export */
  wf_plan_cli pc;        /* the planner's options, parsed */
  int n_overrides;
  char **overrides; /* "key=value" */
} wf__args;

/* What a command runs with. job and rd are set for commands that need the mesh. */
typedef struct wf__cmd_ctx {
  const wf_config *cfg;
  const wf__args *a;
  struct wf_comm *world; /* the start-up communicator (every rank) */
  int rank, size;
  wf_launch *launch;
  const wf_job *job;
  const wf__rank_device *rd;
} wf__cmd_ctx;

/* A row of the table (commands.c). */
typedef struct wf__command {
  const char *flag; /* NULL: training, the default */
  int nargs;        /* values after the flag; -1: one optional value */
  const char *vals; /* their names in --help */
  cmd_world world;
  bool mesh;  /* runs on the mesh (device, binding, bootstrap) */
  int checks; /* C_* before the mesh */
  int (*run)(const wf__cmd_ctx *c);
  const char *help;
} wf__command;

/* commands.c: the command line against the tables (the last row, training, when no
 * command flag is given); -1 with the reason in err. */
int wf__parse_args(int argc, char **argv, wf__args *a, char *err, size_t len);
/* commands.c: --help. */
void wf__print_usage(FILE *out);

/* job.c: train on the mesh with the control plane up and SIGINT/SIGTERM turned into a
 * stop at a step boundary (the default command); and the mesh's groups as the trainer's
 * hooks, for --generate and --dump-state. */
int wf__cmd_train(const wf__cmd_ctx *c);
/* Before the mesh, on rank 0 (WF_OK elsewhere): whether the coordinator can listen where
 * training would start it (MASTER_ADDR resolves, a chosen port is free); logs what is
 * wrong. */
wf_status wf__cmd_train_precheck(const wf__cmd_ctx *c);
int wf__cmd_generate(const wf__cmd_ctx *c);
int wf__cmd_dump_state(const wf__cmd_ctx *c);

#endif /* WF_WORKER_COMMANDS_H */
