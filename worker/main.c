/*
 * main.c - the worker: one process per rank.
 *
 * Start-up order (DESIGN.md): MPI_Init_thread; read the config (file, WEFT_*
 * environment, key=value arguments); read the launch environment and cross-check
 * it with MPI; validate the config against the world size; pick the device and
 * bind with hwloc; bootstrap the mesh; then print (--dry-run, --print-config) or
 * train. --print-schedule needs no mesh: it draws right after validation.
 *
 * Failure policy: every check that can fail on one rank is agreed on with an
 * MPI_Allreduce before anyone acts on it, so either all ranks go on or all exit
 * non-zero together; user errors are printed once (by rank 0, or by the rank that
 * found them when only it knows) and never turn into a hang.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __GLIBC__ /* defined by the headers above */
#include <malloc.h>
#endif

#include "wf_bind.h"
#include "wf_build_config.h"
#include "wf_ckpt.h"
#include "wf_collectives.h"
#include "wf_config.h"
#include "device.h"
#include "wf_coordinator.h"
#include "wf_gpu.h"
#include "wf_io.h"
#include "wf_kernels.h"
#include "wf_control.h"
#include "wf_launch.h"
#include "plane.h"
#include "wf_runtime.h"
#include "wf_parallel.h"
#include "wf_plan.h"
#include "wf_train.h"

extern char **environ;

/* The environment as the launcher gave it. Open MPI's singleton start-up adds
 * PMIX_* variables to the process environment inside MPI_Init, so the launch
 * environment is read from this copy, taken before MPI_Init_thread. */
static char **launch_env;

static char **copy_environ(void)
{
  size_t n = 0;
  while (environ[n])
    n++;
  char **copy = calloc(n + 1, sizeof *copy);
  for (size_t i = 0; copy && i < n; i++)
    copy[i] = strdup(environ[i]);
  return copy;
}

typedef struct args {
  const char *config_file;
  bool dry_run, print_config, print_schedule, help, version;
  const char *dump_state;
  const char *save;
  const char *export_path;                         /* --export llmc|safetensors FILE */
  const char *export_kind;                         /* "llmc" or "safetensors" */
  const char *save_format;                         /* --save-format NAME (NULL: llmc) */
  const char *generate;                            /* --generate PROMPT */
  const char *tokenize_in, *tokenize_prefix;       /* --tokenize IN.txt OUT_PREFIX */
  wf_weights_fmt format;                           /* of --save and --export */
  bool estimate, plan, profile_hw, check_estimate; /* the planner (worker/plan) */
  const char *profile_out;                         /* --profile-hw [FILE] */
  wf_plan_cli pc;                                  /* --json, --hw, --device-mem, ... */
  int n_overrides;
  char **overrides; /* "key=value" */
} args;

static const char usage[] =
    "usage: worker [options] [key=value ...]\n"
    "  --config FILE      YAML config (keys as in `--print-config`)\n"
    "  --dry-run          set up the mesh, print one row per rank, exit\n"
    "  --print-config     print the effective config and where each value came from\n"
    "  --print-schedule   draw the pipeline schedule of the configured mesh, run nothing\n"
    "  --dump-state FILE  write llm.c's debug state for the first batch and exit\n"
    "  --save FILE        after training, write the model as an llm.c checkpoint\n"
    "  --save-format F    what --save and --export llmc write: llmc (version 3, float32;\n"
    "                     the default), llmc-bf16 (version 5) or safetensors\n"
    "  --export llmc|safetensors FILE  write the checkpoint train.resume names (else the\n"
    "                     latest in train.checkpoint_dir) as FILE and exit\n"
    "  --generate PROMPT  sample train.sample_tokens tokens after PROMPT from model.init\n"
    "                     (an llm.c, safetensors or weft checkpoint) and exit\n"
    "  --tokenize IN.txt OUT_PREFIX  encode a text file with data.tokenizer into llm.c\n"
    "                     shards OUT_PREFIX_train_000000.bin and OUT_PREFIX_val_000000.bin\n"
    "                     (the last data.val_fraction of the tokens) and exit\n"
    "  --estimate         predict this config's memory per rank and step time; run nothing\n"
    "  --plan             rank every dp x tp x pp mesh of the world by predicted tokens/s\n"
    "  --profile-hw [FILE] measure GEMMs and collectives here (under mpirun), write JSON\n"
    "                     (default hw_profile.json)\n"
    "  --check-estimate   train, and print each rank's predicted beside measured memory\n"
    "    planner options: --json, --hw FILE|h100-sxm|h200|a100-80gb, --device-mem GIB,\n"
    "                     --gpus-per-node N, --top N\n"
    "  --version, --help\n"
    "  key=value          override a config key, e.g. mesh.tp=2 train.steps=100\n"
    "Launch with mpirun -np N, srun --mpi=pmix -n N, or alone for one rank.\n";

/* --save-format names a format; --export safetensors takes no other. */
static int check_formats(args *a, char *err, size_t len)
{
  a->format = WF_WEIGHTS_LLMC;
  if (a->save_format && !wf_weights_fmt_parse(a->save_format, &a->format)) {
    snprintf(err, len, "--save-format %s: unknown; use llmc, llmc-bf16 or safetensors",
             a->save_format);
    return -1;
  }
  if (a->save_format && !a->save && !a->export_path) {
    snprintf(err, len, "--save-format %s applies to --save FILE or --export llmc FILE",
             a->save_format);
    return -1;
  }
  if (a->export_kind && !strcmp(a->export_kind, "llmc") && a->format == WF_WEIGHTS_SAFETENSORS) {
    snprintf(err, len,
             "--export llmc writes llm.c (--save-format llmc or llmc-bf16); for "
             "safetensors use --export safetensors FILE");
    return -1;
  }
  if (a->export_kind && !strcmp(a->export_kind, "safetensors")) {
    if (a->save_format && a->format != WF_WEIGHTS_SAFETENSORS) {
      snprintf(err, len, "--export safetensors writes safetensors; drop --save-format %s",
               a->save_format);
      return -1;
    }
    a->format = WF_WEIGHTS_SAFETENSORS;
  }
  return 0;
}

/* The planner's flags; true when argv[*i] was one (bad: its value was missing). */
static bool plan_arg(int argc, char **argv, int *i, args *a, char *err, size_t len, bool *bad)
{
  const char *s = argv[*i], *next = *i + 1 < argc ? argv[*i + 1] : NULL;
  bool has = next && next[0] != '-' && !strchr(next, '=');
  *bad = false;
  if (!strcmp(s, "--estimate") || !strcmp(s, "--plan") || !strcmp(s, "--json") ||
      !strcmp(s, "--check-estimate")) {
    a->estimate |= !strcmp(s, "--estimate");
    a->plan |= !strcmp(s, "--plan");
    a->pc.json |= !strcmp(s, "--json");
    a->check_estimate |= !strcmp(s, "--check-estimate");
    return true;
  }
  if (!strcmp(s, "--profile-hw")) {
    a->profile_hw = true;
    a->profile_out = has ? argv[++*i] : "hw_profile.json";
    return true;
  }
  if (strcmp(s, "--hw") && strcmp(s, "--device-mem") && strcmp(s, "--gpus-per-node") &&
      strcmp(s, "--top"))
    return false;
  if (!next) {
    snprintf(err, len, "%s needs a value", s);
    *bad = true;
    return true;
  }
  ++*i;
  if (!strcmp(s, "--hw"))
    a->pc.hw = next;
  else if (!strcmp(s, "--device-mem"))
    a->pc.device_mem_gib = atof(next);
  else if (!strcmp(s, "--gpus-per-node"))
    a->pc.gpus_per_node = atoi(next);
  else
    a->pc.top = atoi(next);
  return true;
}

static int parse_args(int argc, char **argv, args *a, char *err, size_t len)
{
  bool bad;
  memset(a, 0, sizeof *a);
  a->overrides = calloc((size_t)argc, sizeof *a->overrides);
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (!strcmp(s, "--save-format") || !strcmp(s, "--generate")) {
      if (i + 1 >= argc) {
        snprintf(err, len, "%s needs an argument", s);
        return -1;
      }
      *(s[2] == 's' ? &a->save_format : &a->generate) = argv[++i];
    } else if (!strcmp(s, "--config") || !strcmp(s, "--dump-state") || !strcmp(s, "--save")) {
      if (i + 1 >= argc) {
        snprintf(err, len, "%s needs a file argument", s);
        return -1;
      }
      const char **dst = s[2] == 'c' ? &a->config_file : s[2] == 'd' ? &a->dump_state : &a->save;
      *dst = argv[++i];
    } else if (!strcmp(s, "--export")) {
      if (i + 2 >= argc || (strcmp(argv[i + 1], "llmc") && strcmp(argv[i + 1], "safetensors"))) {
        snprintf(err, len,
                 "--export needs a format and a file: --export llmc FILE or --export "
                 "safetensors FILE");
        return -1;
      }
      a->export_kind = argv[i + 1];
      a->export_path = argv[i + 2];
      i += 2;
    } else if (!strcmp(s, "--tokenize")) {
      if (i + 2 >= argc) {
        snprintf(err, len,
                 "--tokenize needs a text file and an output prefix: --tokenize "
                 "IN.txt OUT_PREFIX");
        return -1;
      }
      a->tokenize_in = argv[i + 1];
      a->tokenize_prefix = argv[i + 2];
      i += 2;
    } else if (!strncmp(s, "--config=", 9)) {
      a->config_file = s + 9;
    } else if (plan_arg(argc, argv, &i, a, err, len, &bad)) {
      if (bad)
        return -1;
    } else if (!strcmp(s, "--dry-run")) {
      a->dry_run = true;
    } else if (!strcmp(s, "--print-config")) {
      a->print_config = true;
    } else if (!strcmp(s, "--print-schedule")) {
      a->print_schedule = true;
    } else if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
      a->help = true;
    } else if (!strcmp(s, "--version")) {
      a->version = true;
    } else if (s[0] != '-' && strchr(s, '=')) {
      a->overrides[a->n_overrides++] = argv[i];
    } else {
      snprintf(err, len, "unknown argument '%s' (see worker --help)", s);
      return -1;
    }
  }
  return check_formats(a, err, len);
}

/* All ranks learn whether every rank succeeded (over the start-up communicator, a
 * duplicate of the world made right after MPI_Init, before the mesh exists). */
static bool all_ok(wf_comm *world, bool ok)
{
  return wf_comm_agree(world, ok ? WF_OK : WF_EINVAL, NULL) == WF_OK;
}

static wf_status load_config(wf_config *cfg, const args *a, char *err, size_t len)
{
  wf_config_init(cfg);
  if (a->config_file) {
    wf_status st = wf_config_load_file(cfg, a->config_file, err, len);
    if (st != WF_OK)
      return st;
  }
  wf_status st = wf_config_load_env(cfg, launch_env, err, len);
  for (int i = 0; st == WF_OK && i < a->n_overrides; i++) {
    char key[256];
    const char *eq = strchr(a->overrides[i], '=');
    snprintf(key, sizeof key, "%.*s", (int)(eq - a->overrides[i]), a->overrides[i]);
    st = wf_config_set(cfg, key, eq + 1, WF_SRC_CLI, err, len);
  }
  return st;
}

static wf_status read_launch(wf_launch *l, const wf_config *cfg, int rank, int size, char *err,
                             size_t len)
{
  MPI_Comm node;
  int lrank = 0, lsize = 1;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_size(node, &lsize);
    MPI_Comm_free(&node);
  }
  wf_status st = wf_launch_detect(l, cfg->dist.rank, cfg->dist.world_size, wf_launch_getenv,
                                  launch_env, err, len);
  if (st == WF_OK)
    st = wf_launch_crosscheck(l, rank, size, lrank, lsize, err, len);
  return st;
}

/* Print a user error once: by rank 0 when it has it (every rank validates the
 * same config, so they agree), else by each rank that found it. */
static int fail_all(wf_comm *world, bool mine_failed, const char *msg, int rank)
{
  int32_t rank0_failed = mine_failed;
  if (wf_comm_bcast(world, &rank0_failed, 1, WF_COMM_I32, 0) != WF_OK)
    rank0_failed = 0; /* the broadcast failed (logged): every rank says its own */
  if (mine_failed && (rank == 0 || !rank0_failed))
    fprintf(stderr, "weft: error: %s\n", msg);
  return 1;
}

/* SIGTERM (Slurm's preemption and time-limit signal) and SIGINT ask for a graceful
 * stop; the handler only sets a flag that the step boundary reads. */
static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

static void install_signals(void)
{
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
}

/* What the step boundary agreed on, for the trainer's hooks. */
typedef struct boundary {
  wf_plane *plane;
  const wf_job *job;
  wf_control *ctl;
  wf_comm *world;   /* the agreement is a collective like any other: flight-recorded */
  bool checkpoint;  /* the console asked for a checkpoint */
  bool failed;      /* the agreement itself failed: stop, and exit non-zero */
  int last_step;    /* the last step reported (0 before the first) */
  bool in_ckpt;     /* inside the "checkpoint" phase */
  double ckpt_wall; /* when the last checkpoint after a step ended (wall time); 0 = none */
  int64_t checkpoints;
  /* --check-estimate: after the first step, predicted beside measured memory */
  const wf_config *check_cfg; /* NULL = no check */
  int rank, pp_rank, dp_rank;
  const wf_ktable *k;
  wf_plan_rss base;
} boundary;

/* After every step: tell the coordinator, then agree with every rank whether to stop
 * or checkpoint. A stop request (signal or console) reaches ranks at different
 * moments; without the all-reduce one rank would leave the loop while the others wait
 * in the next step's collectives. The trainer checkpoints before it stops. */
static bool on_step(void *user, const wf_train_step_info *info)
{
  boundary *b = user;
  wf_control *ctl = b->ctl;
  b->last_step = info->step;
  wf_plane_report_step(b->plane, b->job, info, b->ckpt_wall, b->checkpoints);
  if (b->check_cfg) {
    wf_plan_check_print(b->check_cfg, b->pp_rank, b->dp_rank, b->rank, b->k, &b->base,
                        (long long)info->mem_bytes, stdout);
    b->check_cfg = NULL;
  }
  /* Whether any rank saw each request: a signal, the console's stop, the console's
   * checkpoint. */
  int32_t req[3] = {stop_signal != 0, wf_control_stop_requested(ctl),
                    wf_control_checkpoint_requested(ctl)};
  if (wf_comm_allreduce(b->world, req, req, 3, WF_COMM_I32, WF_COMM_MAX) != WF_OK) {
    b->failed = true; /* logged where it failed */
    return false;
  }
  b->checkpoint = req[2] > 0;
  bool stop = req[0] > 0 || req[1] > 0;
  if (stop && wf_rt_rank() == 0)
    WF_INFO("stopping after step %d: %s", info->step,
            req[0] > 0 ? "a rank received SIGTERM or SIGINT" : "the console asked");
  return !stop;
}

static bool checkpoint_now(void *user) { return ((boundary *)user)->checkpoint; }

/* The checkpoint phase also covers reading one at start-up; only those after a step are
 * written ones, whose age /metrics reports. */
static void on_phase(void *user, const char *phase)
{
  boundary *b = user;
  bool ckpt = strcmp(phase, "checkpoint") == 0;
  if (b->in_ckpt && !ckpt && b->last_step > 0) {
    b->ckpt_wall = wf_wall_time();
    b->checkpoints++;
  }
  b->in_ckpt = ckpt;
  wf_control_set_phase(b->ctl, phase);
}

/* How long a rank whose training failed waits for the others to fail with it before
 * it takes the failure for its own and has the coordinator abort the job. Ranks that
 * agreed on a failure arrive within milliseconds of each other. */
#define FAIL_SETTLE_MS 3000

/* Whether every rank reaches this call within timeout_ms (a failure they agreed on),
 * by a non-blocking barrier over the world; one that does not complete stays posted
 * (the process then ends by the coordinator's Abort). wf_plane_fail waits the same way
 * for its own barrier, which follows at once when this one completed. */
static bool all_arrive(int timeout_ms)
{
  MPI_Request req;
  int done = 0;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    return false;
  double end = wf_now() + timeout_ms * 1e-3;
  while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && wf_now() < end)
    usleep(1000);
  return done != 0;
}

/* Train (or dump llm.c's debug state) on this rank's share of the mesh, with the
 * control plane up so the console can attach and the watchdog can act. */
static int train(const wf_config *cfg, wf_launch *launch, const wf_job *job, const args *a,
                 const wf__rank_device *rd)
{
  int rank = wf_job_rank(job);
  if (a->dump_state || a->generate) {
    wf_train_hooks comms = {.dp = wf_job_comm(job, WF_AXIS_DP),
                            .world = wf_job_world_comm(job),
                            .tp = cfg->mesh.tp > 1 ? wf_job_comm(job, WF_AXIS_TP) : NULL,
                            .pp = cfg->mesh.pp > 1 ? wf_job_comm(job, WF_AXIS_PP) : NULL,
                            .emb = cfg->mesh.pp > 1 ? wf_job_comm(job, WF_AXIS_EMB) : NULL,
                            .dev = rd->dev};
    wf_status st = a->generate ? wf_train_generate(cfg, a->generate, &comms)
                               : wf_train_dump_state(cfg, a->dump_state, &comms);
    return st == WF_OK ? 0 : 1;
  }
  char err[1024];
  wf_plane plane;
  if (cfg->dist.master_port)
    launch->master_port = cfg->dist.master_port; /* the key beats MASTER_PORT */
  bool port_default = launch->master_port == 0;
  wf_launch_default_master(launch, wf_rt_host());
  wf_plane_opts po = {cfg, launch, job, port_default, rd->bus};
  if (wf_plane_start(&plane, &po, err, sizeof err) != WF_OK) {
    if (rank == 0)
      fprintf(stderr, "weft: error: %s\n", err);
    return 1;
  }
  install_signals();
  wf_control_set_phase(plane.ctl, "train");
  boundary bd = {.plane = &plane, .job = job, .ctl = plane.ctl, .world = wf_job_world_comm(job)};
  if (a->check_estimate) {
    bd.check_cfg = cfg, bd.rank = rank, bd.k = wf_dev_kernels(rd->dev);
    bd.pp_rank = wf_comm_rank(wf_job_comm(job, WF_AXIS_PP));
    bd.dp_rank = wf_comm_rank(wf_job_comm(job, WF_AXIS_DP));
    wf_plan_rss_read(&bd.base);
  }
  wf_train_hooks hooks = {.user = &bd,
                          .on_step = on_step,
                          .dp = wf_job_comm(job, WF_AXIS_DP),
                          .save_llmc = a->save,
                          .save_format = a->format,
                          .checkpoint_now = checkpoint_now,
                          .on_phase = on_phase,
                          .world = wf_job_world_comm(job),
                          .tp = cfg->mesh.tp > 1 ? wf_job_comm(job, WF_AXIS_TP) : NULL,
                          .pp = cfg->mesh.pp > 1 ? wf_job_comm(job, WF_AXIS_PP) : NULL,
                          .emb = cfg->mesh.pp > 1 ? wf_job_comm(job, WF_AXIS_EMB) : NULL,
                          .dev = rd->dev,
                          .peak_tflops = rd->peak_tflops,
                          .peak_source = rd->peak_source};
  wf_status st = wf_train_run(cfg, &hooks);
  if (st == WF_OK && bd.failed)
    st = WF_EMPI;
  if (st != WF_OK) {
    /* A failure every rank agreed on meets here at once: rank 0 says so once for the
     * job (the error itself was logged once, where it arose). A failure of this rank
     * alone leaves the others waiting: it says so, and the coordinator aborts the job. */
    bool together = all_arrive(FAIL_SETTLE_MS);
    if (together && rank == 0)
      fprintf(stderr, "weft: error: training failed on every rank: %s (see the log above)\n",
              wf_status_str(st));
    else if (!together)
      fprintf(stderr, "weft: error: training failed on rank %d: %s (see the log above)\n", rank,
              wf_status_str(st));
    char what[64];
    snprintf(what, sizeof what, "its first error is in rank %d's log above", rank);
    if (!wf_plane_fail(&plane, st, what, together ? FAIL_SETTLE_MS : 0)) {
      sleep(10); /* the coordinator's Abort ends this process (exit 3) well before */
      _exit(1);  /* the control plane is gone too: MPI_Finalize would wait forever */
    }
  }
  wf_plane_stop(&plane);
  return st == WF_OK ? 0 : 1;
}

/* --print-schedule launches nothing, so the config is checked against the mesh it
 * describes (mesh.dp, or 1 when derived, x tp x pp) rather than the MPI world: a
 * singleton can draw a pp=4 schedule. */
static int check_world(const wf_config *cfg, const args *a, int size)
{
  if (a->estimate || a->plan)
    return a->plan ? 0 : wf_plan_world(cfg); /* the planned world, not this launch */
  if (!a->print_schedule)
    return size;
  long long w = (long long)(cfg->mesh.dp > 0 ? cfg->mesh.dp : 1) * cfg->mesh.tp * cfg->mesh.pp;
  return w > 0 && w <= 1 << 24 ? (int)w : 0; /* 0: the range rules report bad sizes */
}

static int print_schedule(const wf_config *cfg, int rank)
{
  char err[512];
  wf_sched_params prm = {cfg->train.schedule, cfg->mesh.pp, cfg->train.microbatches,
                         cfg->parallel.virtual_stages};
  if (rank != 0)
    return 0;
  if (wf_schedule_print(stdout, &prm, err, sizeof err) != WF_OK) {
    fprintf(stderr, "weft: error: %s\n", err);
    return 1;
  }
  return 0;
}

/* --export FORMAT FILE: rank 0 writes the model of the checkpoint; no mesh is needed. */
static int export_weights(wf_comm *world, const wf_config *cfg, const args *a, int rank)
{
  char dir[WF_PATH_MAX + 64];
  bool ok = true;
  if (rank == 0) {
    ok = wf_ckpt_locate(cfg, dir, sizeof dir) == WF_OK &&
         wf_ckpt_export(dir, a->export_path, a->format, (size_t)(cfg->model.shard_mb * 1e6)) ==
             WF_OK;
    if (ok)
      printf("exported %s to %s (%s)\n", dir, a->export_path, wf_weights_fmt_describe(a->format));
  }
  if (!all_ok(world, ok))
    return fail_all(world, !ok, "--export failed (the error is above)", rank);
  return 0;
}

/* --tokenize IN OUT_PREFIX: rank 0 encodes the file with data.tokenizer; no mesh. */
static int tokenize(wf_comm *world, const wf_config *cfg, const args *a, int rank)
{
  char err[2048] = "", summary[2048] = "";
  wf_tokenizer *tok = NULL;
  bool ok = true;
  if (rank == 0 && !cfg->data.tokenizer[0]) {
    snprintf(err, sizeof err,
             "--tokenize needs a tokenizer: add data.tokenizer=FILE (GPT-2's tokenizer.json, "
             "or vocab.json with merges.txt beside it, or the folder holding them)");
    ok = false;
  } else if (rank == 0) {
    ok = wf_tokenizer_load(&tok, cfg->data.tokenizer, err, sizeof err) == WF_OK &&
         wf_tokenize_file(tok, a->tokenize_in, a->tokenize_prefix, cfg->data.val_fraction, summary,
                          sizeof summary, err, sizeof err) == WF_OK;
    wf_tokenizer_destroy(tok);
    if (ok)
      printf("%s\n", summary);
  }
  if (!all_ok(world, ok))
    return fail_all(world, !ok, err, rank);
  return 0;
}

/* model.init (required by --generate) checked whole by rank 0; *vocab gets its V. */
static bool init_ok(wf_comm *world, const wf_config *cfg, const args *a, int rank, int *vocab)
{
  wf_model_dims d = {0};
  bool ok = true;
  if (rank == 0 && a->generate && !cfg->model.init[0])
    WF_ERROR("--generate needs the model to sample from: add model.init=FILE (an llm.c or "
             "safetensors file, or a weft checkpoint directory)");
  ok = !a->generate || cfg->model.init[0];
  if (ok && rank == 0 && cfg->model.init[0])
    ok = wf_weights_check(cfg->model.init, "model.init", &d) == WF_OK;
  ok = all_ok(world, rank == 0 ? ok : true);
  int32_t v = d.V;
  if (ok && cfg->model.init[0] && wf_comm_bcast(world, &v, 1, WF_COMM_I32, 0) == WF_OK)
    *vocab = v;
  return ok;
}

/* --estimate and --plan (rank 0 answers; nothing is launched) and --profile-hw. */
static int planner(const wf_config *cfg, wf_comm *world, const args *a, int rank)
{
  if (a->profile_hw)
    return wf_plan_profile_hw(cfg, world, a->profile_out, stdout);
  if (rank != 0)
    return 0;
  return a->plan ? wf_plan_search(cfg, &a->pc, stdout) : wf_plan_estimate(cfg, &a->pc, stdout);
}

static int run(wf_comm *world, args *a, int rank, int size)
{
  char err[2048] = "";
  wf_config cfg;
  wf_launch launch;
  bool ok = load_config(&cfg, a, err, sizeof err) == WF_OK;
  memset(&launch, 0, sizeof launch); /* --estimate and --plan plan a world, launch none */
  ok = ok &&
       (a->estimate || a->plan || read_launch(&launch, &cfg, rank, size, err, sizeof err) == WF_OK);
  if (ok && a->plan) { /* the plan picks the mesh: validate the rest, remember the world */
    a->pc.world = wf_plan_world(&cfg);
    wf_plan_reset_mesh(&cfg);
  }
  ok = ok && wf_config_validate(&cfg, check_world(&cfg, a, size), err, sizeof err) == WF_OK;
  if (!all_ok(world, ok))
    return fail_all(world, !ok, err, rank);
  wf_log_set_level(cfg.runtime.log_level);
  if (rank == 0)
    WF_INFO("launch: rank/size from %s; %d ranks", wf_launch_source_str(launch.source), size);
  if (a->print_config) {
    if (rank == 0)
      wf_config_print(&cfg, stdout);
    return 0;
  }
  if (a->export_path)
    return export_weights(world, &cfg, a, rank);
  if (a->print_schedule)
    return print_schedule(&cfg, rank);
  if (a->estimate || a->plan || a->profile_hw)
    return planner(&cfg, world, a, rank);
  if (a->tokenize_in)
    return tokenize(world, &cfg, a, rank);
  /* model.init is read whole by rank 0 first, so a bad file is said once (logged where
   * found), and its vocabulary is known to the data check. */
  int vocab = cfg.model.vocab;
  if (!a->dry_run && !init_ok(world, &cfg, a, rank, &vocab))
    return 1;
  /* Data that cannot work is a config-level error: every rank checks it (cheaply, never
   * blocking on a FIFO) and rank 0 says it once. */
  ok = a->dry_run || a->generate || wf_data_check(&cfg, vocab, err, sizeof err) == WF_OK;
  ok = ok && (a->dry_run || wf_sample_check(&cfg, a->generate, vocab, err, sizeof err) == WF_OK);
  if (!all_ok(world, ok))
    return fail_all(world, !ok, err, rank);

  wf__rank_device rd;
  ok = wf__pick_device(&cfg, &launch, &rd, err, sizeof err) == WF_OK;
  if (!all_ok(world, ok))
    return fail_all(world, !ok, err, rank);
  wf_binding binding;
  wf_bind_apply(&binding, cfg.runtime.bind, launch.local_rank, launch.local_size,
                rd.bus[0] ? rd.bus : NULL);
  if (binding.shared && launch.local_rank == 0)
    WF_INFO("%d ranks share %d cores on %s: one compute thread each", launch.local_size,
            binding.node_cores, wf_rt_host());
  if (cfg.runtime.threads > 0 && cfg.runtime.threads != binding.threads) {
    if (launch.local_rank == 0)
      WF_INFO("runtime.threads=%d compute threads per rank (the binding gives %d)",
              cfg.runtime.threads, binding.threads);
    binding.threads = cfg.runtime.threads;
  }
  wf_kernels_set_threads(binding.threads);
  if (!rd.gpu) /* ranks sharing cores share their peak too: the job's sum is the node's */
    wf__cpu_peak(&rd,
                 binding.shared ? (double)binding.node_cores / launch.local_size : binding.threads);

  wf_job *job = NULL;
  wf_job_opts jo = {&cfg, &launch, rd.desc, &binding};
  ok = wf_job_bootstrap(&job, &jo) == WF_OK;
  if (!all_ok(world, ok)) {
    wf__rank_device_close(&rd);
    return fail_all(world, !ok, "mesh bootstrap failed (see the log above)", rank);
  }
  ok = wf__comms_on_device(job, rd.gpu, &launch) == WF_OK;
  int rc = ok ? 0 : 1;
  if (!ok) {
    if (rank == 0)
      fprintf(stderr, "weft: error: the collectives could not reach device memory (see the log "
                      "above)\n");
  } else if (a->dry_run) {
    if (rank == 0) {
      wf_job_print_table(job, stdout);
      printf("groups verified against MPI: tp, dp, pp and embedding communicators match the "
             "mesh\n");
    }
  } else {
    rc = train(&cfg, &launch, job, a, &rd);
  }
  wf_job_destroy(job);
  wf__rank_device_close(&rd);
  return rc;
}

int main(int argc, char **argv)
{
  args a;
  char err[512];
  int provided, rank = 0, size = 1;
#ifdef __GLIBC__
  /* Large blocks stay mmapped, so what is freed goes back to the system: ZeRO-2 and 3
   * free the model's flat gradients and parameters after set-up, and glibc's default
   * (a threshold that rises to the largest block freed) would then serve later blocks
   * from the heap and keep the freed vector resident, out of --check-estimate's sight. */
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
  if (parse_args(argc, argv, &a, err, sizeof err) < 0) {
    fprintf(stderr, "weft: error: %s\n%s", err, usage);
    return 2;
  }
  if (a.help || a.version) {
    printf(a.help ? usage : "weft " WF_VERSION "\n");
    return 0;
  }
  /* srun without PMIx: Open MPI would abort in MPI_Init without saying what to do. */
  if (wf_launch_precheck(wf_launch_getenv, NULL, err, sizeof err) != WF_OK) {
    const char *task = getenv("SLURM_PROCID");
    if (!task || strcmp(task, "0") == 0)
      fprintf(stderr, "weft: error: %s\n", err);
    return 1;
  }
  launch_env = copy_environ();
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    fprintf(stderr, "weft: error: MPI_Init_thread failed\n");
    return 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  wf_rt_set_rank(rank);
  wf_comm *world = NULL;
  int rc = 1;
  if (wf_comm_world_create(&world) == WF_OK)
    rc = run(world, &a, rank, size);
  else
    fprintf(stderr, "weft: error: cannot create the start-up communicator (see above)\n");
  wf_comm_destroy(world);
  free(a.overrides);
  for (char **e = launch_env; e && *e; e++)
    free(*e);
  free(launch_env);
  MPI_Finalize();
  return rc;
}
