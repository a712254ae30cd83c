/*
 * main.c - the worker: one process per rank.
 *
 * Start-up order (docs/architecture.md): parse the command line against the tables below;
 * MPI_Init_thread; read the config (file, WEFT_* environment, key=value arguments);
 * read the launch environment and cross-check it with MPI; validate the config against
 * the world the command names; then either run the command at once (it needs no mesh:
 * --print-config, --export, --plan, ...) or pick the device, bind with hwloc, bootstrap
 * the mesh and run it there (training, --dry-run, --generate, --dump-state).
 *
 * The commands are one table (docs/architecture.md: seams as tables): a row says what a command
 * takes, what world its config is checked against, what it checks before the mesh and
 * which function runs it. The work is in each concern's folder; main only sequences.
 *
 * Failure policy: every check that can fail on one rank is agreed on with an
 * MPI_Allreduce before anyone acts on it, so either all ranks go on or all exit
 * non-zero together; user errors are printed once (by rank 0, or by the rank that
 * found them when only it knows), exit with WF_EXIT_INPUT, and never turn into a hang.
 */
#include <mpi.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__ /* defined by the headers above */
#include <malloc.h>
#endif

#include "commands.h"
#include "wf_bind.h"
#include "wf_gpu.h"
#include "wf_build_config.h"
#include "wf_build_id.h"
#include "wf_io.h"
#include "wf_kernels.h"
#include "wf_parallel.h"
#include "wf_runtime.h"
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

/* ---- the commands ------------------------------------------------------------------- */

/* The world a command's config is validated against. */
typedef enum cmd_world {
  W_LAUNCH,  /* the ranks launched (MPI's size) */
  W_MESH,    /* the mesh the keys describe, launched or not (--print-schedule) */
  W_PLANNED, /* the world the config plans for, nothing launched (--estimate) */
  W_ANY,     /* any: the command chooses the mesh (--plan) */
} cmd_world;

/* What a mesh command checks before the device and the mesh, once for the job. */
enum { C_INIT = 1, C_NEED_INIT = 2, C_DATA = 4, C_SAMPLE = 8, C_PROMPT = 16, C_PLANE = 32 };

typedef struct wf__command {
  const char *flag; /* NULL: training, the default */
  int nargs;        /* values after the flag; -1: one optional value */
  const char *vals; /* their names in --help */
  cmd_world world;
  bool mesh;  /* runs on the mesh (device, binding, bootstrap) */
  int checks; /* C_* before the mesh */
  int (*run)(const wf__cmd_ctx *c);
  const char *help;
} command;

static int run_print_config(const wf__cmd_ctx *c)
{
  if (c->rank == 0)
    wf_config_print(c->cfg, stdout);
  return WF_EXIT_OK;
}

static int run_print_schedule(const wf__cmd_ctx *c)
{
  char err[512];
  const wf_config *cfg = c->cfg;
  wf_sched_params prm = {cfg->train.schedule, cfg->mesh.pp, cfg->train.microbatches,
                         cfg->parallel.virtual_stages};
  if (c->rank != 0)
    return WF_EXIT_OK;
  if (wf_schedule_print(stdout, &prm, err, sizeof err) != WF_OK) {
    WF_ERROR("%s", err);
    return WF_EXIT_INPUT;
  }
  return WF_EXIT_OK;
}

/* --export FORMAT FILE (rank 0; every rank learns the outcome). */
static int run_export(const wf__cmd_ctx *c)
{
  char src[WF_PATH_MAX + 64];
  wf_status st = WF_OK;
  if (c->rank == 0) {
    st = wf_weights_export(c->cfg, c->a->val[1], c->a->format, src, sizeof src);
    if (st == WF_OK)
      printf("exported %s to %s (%s)\n", src, c->a->val[1], wf_weights_fmt_describe(c->a->format));
  }
  return wf__exit_status(wf_comm_agree(c->world, st, NULL));
}

/* --tokenize IN OUT_PREFIX (rank 0; every rank learns the outcome). */
static int run_tokenize(const wf__cmd_ctx *c)
{
  char summary[2048] = "";
  wf_status st = WF_OK;
  if (c->rank == 0) {
    st = wf_tokenize_config(c->cfg, c->a->val[0], c->a->val[1], summary, sizeof summary);
    if (st == WF_OK)
      printf("%s\n", summary);
  }
  return wf__exit_status(wf_comm_agree(c->world, st, NULL));
}

static int run_estimate(const wf__cmd_ctx *c)
{
  return c->rank == 0 ? wf_plan_estimate(c->cfg, &c->a->pc, stdout) : WF_EXIT_OK;
}

static int run_plan(const wf__cmd_ctx *c)
{
  if (c->rank != 0)
    return WF_EXIT_OK;
  if (c->a->pc.world == 1 && !c->cfg->dist.world_size && !c->cfg->dist.num_nodes)
    WF_INFO("--plan: no world size given, so this plans for 1 rank; give the job's size with "
            "dist.world_size=N (or dist.num_nodes=N dist.procs_per_node=M)");
  return wf_plan_search(c->cfg, &c->a->pc, stdout);
}

static int run_profile_hw(const wf__cmd_ctx *c)
{
  return wf_plan_profile_hw(c->cfg, c->world, c->a->val[0] ? c->a->val[0] : "hw_profile.json",
                            stdout);
}

static int run_dry_run(const wf__cmd_ctx *c)
{
  if (c->rank == 0) {
    const wf_mesh *m = wf_job_mesh(c->job);
    wf_job_print_table(c->job, stdout);
    printf("groups verified against MPI: tp, dp, pp%s%s and embedding communicators match the "
           "mesh\n",
           m->cp > 1 ? ", cp, dp x cp" : "", m->ep > 1 ? ", ep, edp" : "");
  }
  return WF_EXIT_OK;
}

/* Training is the last row: the default. */
static const command commands[] = {
    {"--dry-run", 0, "", W_LAUNCH, true, 0, run_dry_run,
     "set up the mesh, print one row per rank, exit"},
    {"--print-config", 0, "", W_MESH, false, 0, run_print_config,
     "print the effective config and where each value came from"},
    {"--print-schedule", 0, "", W_MESH, false, 0, run_print_schedule,
     "draw the pipeline schedule of the configured mesh, run nothing"},
    {"--dump-state", 1, "FILE", W_LAUNCH, true, C_INIT | C_DATA, wf__cmd_dump_state,
     "write llm.c's debug state for the first batch and exit"},
    {"--export", 2, "FORMAT FILE", W_LAUNCH, false, 0, run_export,
     "convert the weights model.init names (llm.c v3/v5, safetensors, a weft\n"
     "                     checkpoint), else train.resume's or train.checkpoint_dir's latest\n"
     "                     checkpoint, into FILE: FORMAT llmc (v3), llmc-bf16 (v5) or\n"
     "                     safetensors; trains nothing"},
    {"--generate", 1, "PROMPT", W_LAUNCH, true, C_INIT | C_NEED_INIT | C_PROMPT, wf__cmd_generate,
     "sample train.sample_tokens tokens after PROMPT from model.init"},
    {"--tokenize", 2, "IN.txt OUT_PREFIX", W_LAUNCH, false, 0, run_tokenize,
     "encode a text file with data.tokenizer into llm.c shards\n"
     "                     OUT_PREFIX_train_000000.bin and OUT_PREFIX_val_000000.bin (the\n"
     "                     last data.val_fraction of the tokens) and exit"},
    {"--estimate", 0, "", W_PLANNED, false, 0, run_estimate,
     "predict this config's memory per rank and step time; run nothing"},
    {"--plan", 0, "", W_ANY, false, 0, run_plan,
     "rank the meshes of dist.world_size ranks by predicted tokens/s"},
    {"--profile-hw", -1, "[FILE]", W_LAUNCH, false, 0, run_profile_hw,
     "measure GEMMs and collectives here (under mpirun) into a JSON\n"
     "                     profile for --hw (default hw_profile.json)"},
    {NULL, 0, "", W_LAUNCH, true, C_INIT | C_DATA | C_SAMPLE | C_PLANE, wf__cmd_train, "train"},
};

/* Options: a flag, its value's name ("" for a flag without one), and where it goes. */
typedef struct option {
  const char *flag, *vals;
  size_t at; /* offsetof the const char * (value) or bool (flag) in wf__args */
  const char *help;
} option;

#define OPT(f, v, field, h)                                                                        \
  {                                                                                                \
    f, v, offsetof(wf__args, field), h                                                             \
  }
static const option options[] = {
    OPT("--config", "FILE", config_file, "YAML config (keys as in --print-config)"),
    OPT("--save", "FILE", save, "after training, write the model (llm.c v3 unless --save-format)"),
    OPT("--save-format", "F", save_format, "what --save writes: llmc, llmc-bf16 or safetensors"),
    OPT("--check-estimate", "", check_estimate,
        "train, and print each rank's predicted beside measured memory after the first "
        "step (the first after a checkpoint with train.checkpoint_every)"),
    OPT("--json", "", json, "the planner's output as JSON"),
    OPT("--hw", "PROFILE", hw, "the planner's hardware: a file, h100-sxm, h200 or a100-80gb"),
    OPT("--device-mem", "GIB", device_mem, "the planner's memory per rank"),
    OPT("--gpus-per-node", "N", gpus_per_node, "the planner's ranks per node"),
    OPT("--top", "N", top, "how many plans --plan prints"),
    OPT("--help", "", help, "this text"),
    OPT("-h", "", help, NULL),
    OPT("--version", "", version, "weft's version"),
};

/* "  FLAG VALS   help", the help on the next line when FLAG VALS is long. */
static void usage_line(FILE *out, const char *flag, const char *vals, const char *help)
{
  char head[64];
  snprintf(head, sizeof head, "%s%s%s", flag, vals[0] ? " " : "", vals);
  if (strlen(head) > 18)
    fprintf(out, "  %s\n  %-18s %s\n", head, "", help);
  else
    fprintf(out, "  %-18s %s\n", head, help);
}

static void print_usage(FILE *out)
{
  fprintf(out, "usage: worker [command] [options] [key=value ...]\n"
               "commands (without one, the worker trains):\n");
  for (size_t i = 0; commands[i].flag; i++)
    usage_line(out, commands[i].flag, commands[i].vals, commands[i].help);
  fprintf(out, "options:\n");
  for (size_t i = 0; i < WF_ARRAY_LEN(options); i++)
    if (options[i].help)
      usage_line(out, options[i].flag, options[i].vals, options[i].help);
  fprintf(out, "  key=value          set a config key, e.g. mesh.tp=2 train.steps=100\n"
               "Launch with mpirun -np N, srun --mpi=pmix -n N, or alone for one rank.\n");
}

/* ---- the command line --------------------------------------------------------------- */

static const command *find_command(const char *s)
{
  for (size_t i = 0; commands[i].flag; i++)
    if (!strcmp(s, commands[i].flag))
      return &commands[i];
  return NULL;
}

static const option *find_option(const char *s)
{
  for (size_t i = 0; i < WF_ARRAY_LEN(options); i++)
    if (!strcmp(s, options[i].flag))
      return &options[i];
  return NULL;
}

/* argv[*i] is command c: take its values. */
static int take_command(const command *c, int argc, char **argv, int *i, wf__args *a, char *err,
                        size_t len)
{
  if (a->cmd->flag) {
    snprintf(err, len, "%s and %s are two commands: give one", a->cmd->flag, c->flag);
    return -1;
  }
  a->cmd = c;
  int n = c->nargs < 0 ? 1 : c->nargs;
  for (int k = 0; k < n; k++) {
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    bool is_value = v && (c->nargs > 0 || (v[0] != '-' && !strchr(v, '=')));
    if (!is_value && c->nargs > 0) {
      snprintf(err, len, "%s needs %s", c->flag, c->vals);
      return -1;
    }
    if (is_value)
      a->val[k] = argv[++*i];
  }
  return 0;
}

static int take_option(const option *o, int argc, char **argv, int *i, wf__args *a, char *err,
                       size_t len)
{
  if (!o->vals[0]) {
    *(bool *)((char *)a + o->at) = true;
    return 0;
  }
  if (*i + 1 >= argc) {
    snprintf(err, len, "%s needs %s: %s", o->flag, o->vals, o->help);
    return -1;
  }
  *(const char **)((char *)a + o->at) = argv[++*i];
  return 0;
}

/* The flag closest to `s` ("--generat": --generate), or NULL. */
static const char *closest_flag(const char *s)
{
  const char *names[WF_ARRAY_LEN(commands) + WF_ARRAY_LEN(options)];
  size_t n = 0;
  for (size_t i = 0; commands[i].flag; i++)
    names[n++] = commands[i].flag;
  for (size_t i = 0; i < WF_ARRAY_LEN(options); i++)
    names[n++] = options[i].flag;
  return wf_closest_name(s, names, n);
}

/* "--train.steps=20", "--config=FILE" and "--generat": say what was meant. */
static void unknown_argument(const char *s, char *err, size_t len)
{
  const char *eq = strchr(s, '='), *flag = s[0] == '-' && !eq ? closest_flag(s) : NULL;
  if (s[0] == '-' && s[1] == '-' && eq && !strncmp(s, "--config=", 9))
    snprintf(err, len, "unknown argument '%s': write --config %s", s, s + 9);
  else if (s[0] == '-' && eq)
    snprintf(err, len,
             "unknown argument '%s': config keys are given as key=value without "
             "dashes, e.g. %s",
             s, s + strspn(s, "-"));
  else if (flag)
    snprintf(err, len, "unknown argument '%s'; did you mean %s? (see worker --help)", s, flag);
  else if (s[0] != '-')
    snprintf(err, len,
             "unknown argument '%s': config keys are given as key=value (e.g. "
             "train.steps=20), commands and options start with -- (see worker --help)",
             s);
  else
    snprintf(err, len, "unknown argument '%s' (see worker --help)", s);
}

/* --save-format and --export's FORMAT name formats --save and --export can write;
 * `--export llmc --save-format llmc-bf16` is the older spelling of --export llmc-bf16. */
static int check_formats(wf__args *a, char *err, size_t len)
{
  a->format = WF_WEIGHTS_LLMC;
  bool export = a->cmd->run == run_export;
  const char *fmt = export ? a->val[0] : a->save_format, *sf = a->save_format;
  if (sf && !a->save && !(export && !strcmp(fmt, "llmc"))) {
    snprintf(err, len,
             "--save-format %s applies to --save FILE (--export takes its format: "
             "--export %s FILE)",
             sf, sf);
    return -1;
  }
  if (export && sf && !a->save && strcmp(sf, "llmc") && strcmp(sf, "llmc-bf16")) {
    snprintf(err, len, "--export llmc writes llm.c files; for %s use --export %s FILE", sf, sf);
    return -1;
  }
  if (export && sf && !a->save)
    fmt = sf;
  if (a->save && sf && !wf_weights_fmt_parse(sf, &a->format)) {
    snprintf(err, len, "--save-format %s: unknown; use llmc, llmc-bf16 or safetensors", sf);
    return -1;
  }
  if (export && !wf_weights_fmt_parse(fmt, &a->format)) {
    snprintf(err, len, "--export %s: unknown format; use llmc, llmc-bf16 or safetensors", fmt);
    return -1;
  }
  return 0;
}

static int parse_args(int argc, char **argv, wf__args *a, char *err, size_t len)
{
  memset(a, 0, sizeof *a);
  a->cmd = &commands[WF_ARRAY_LEN(commands) - 1];
  a->overrides = calloc((size_t)argc, sizeof *a->overrides);
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    const command *c = find_command(s);
    const option *o = find_option(s);
    int rc = 0;
    if (c)
      rc = take_command(c, argc, argv, &i, a, err, len);
    else if (o)
      rc = take_option(o, argc, argv, &i, a, err, len);
    else if (!strncmp(s, "--config=", 9))
      a->config_file = s + 9;
    else if (s[0] != '-' && strchr(s, '='))
      a->overrides[a->n_overrides++] = argv[i];
    else
      unknown_argument(s, err, len), rc = -1;
    if (rc < 0)
      return -1;
  }
  a->pc = (wf_plan_cli){.json = a->json,
                        .hw = a->hw,
                        .device_mem_gib = a->device_mem ? atof(a->device_mem) : 0,
                        .gpus_per_node = a->gpus_per_node ? atoi(a->gpus_per_node) : 0,
                        .top = a->top ? atoi(a->top) : 0};
  return check_formats(a, err, len);
}

/* ---- the config and the launch ------------------------------------------------------ */

static wf_status load_config(wf_config *cfg, const wf__args *a, char *err, size_t len)
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

/* The world size the config is validated against (0: the range rules report it). */
static int check_world(wf_config *cfg, wf__args *a, int size)
{
  switch (a->cmd->world) {
  case W_PLANNED: return wf_plan_world(cfg);
  case W_ANY: /* the plan picks the mesh: validate the rest, remember the world */
    a->pc.world = wf_plan_world(cfg);
    wf_plan_reset_mesh(cfg);
    return 0;
  case W_MESH: {
    long long w = (long long)(cfg->mesh.dp > 0 ? cfg->mesh.dp : 1) * cfg->mesh.tp * cfg->mesh.pp;
    return w > 0 && w <= 1 << 24 ? (int)w : 0;
  }
  case W_LAUNCH: break;
  }
  return size;
}

/* model.vocab is the tokenizer's when data.tokenizer is given and the vocabulary is not
 * (nor taken from model.init's file): one less number to keep in step. */
static wf_status vocab_from_tokenizer(wf_config *cfg, char *err, size_t len)
{
  int k = wf_config_key_find("model.vocab"), v = 0;
  wf_config_source src = (wf_config_source)cfg->source[k];
  if (!cfg->data.tokenizer[0] || cfg->model.init[0] || src > WF_SRC_PRESET)
    return WF_OK;
  wf_status st = wf_tokenizer_vocab_of(cfg->data.tokenizer, &v, err, len);
  if (st == WF_OK) {
    cfg->model.vocab = v;
    cfg->source[k] = WF_SRC_DERIVED;
  }
  return st;
}

/* All ranks learn whether every rank succeeded (over the start-up communicator, a
 * duplicate of the world made right after MPI_Init, before the mesh exists). */
static bool all_ok(wf_comm *world, bool ok)
{
  return wf_comm_agree(world, ok ? WF_OK : WF_ECONFIG, NULL) == WF_OK;
}

/* Say a user error once: by rank 0 when it has it (every rank validates the same config,
 * so they agree), else by each rank that found it. */
static int fail_all(wf_comm *world, bool mine_failed, const char *msg, int rank)
{
  int32_t rank0_failed = mine_failed;
  if (wf_comm_bcast(world, &rank0_failed, 1, WF_COMM_I32, 0) != WF_OK)
    rank0_failed = 0; /* the broadcast failed (logged): every rank says its own */
  if (mine_failed && msg[0] && (rank == 0 || !rank0_failed)) /* "": said where it arose */
    WF_ERROR("%s", msg);
  return WF_EXIT_INPUT;
}

/* ---- before the mesh: what a command can check once for the whole job -------------- */

/* model.init's shape meets the config's model keys on every rank (collective): rank 0
 * reads the file's header first and says once what is wrong with it (err is then ""),
 * then every rank reads it and meets it. */
static bool init_meets(wf_comm *world, wf_config *cfg, int rank, char *err, size_t len)
{
  wf_model_dims d = {0};
  err[0] = '\0';
  bool ok = rank != 0 || wf_weights_peek(cfg->model.init, "model.init", &d) == WF_OK;
  if (!all_ok(world, ok))
    return false;
  if (rank != 0 && !wf_weights_probe(cfg->model.init, &d)) {
    snprintf(err, len,
             "model.init=%s: rank %d on %s cannot read it, though rank 0 can: put the weights "
             "where every host sees them",
             cfg->model.init, rank, wf_rt_host());
    return false;
  }
  return wf_model_dims_meet_config(&d, cfg->model.init, cfg, err, len) == WF_OK;
}

/* model.init read whole by rank 0, so a bad file is said once; *vocab gets its V. */
static bool init_ok(const wf__cmd_ctx *c, int *vocab)
{
  const wf_config *cfg = c->cfg;
  wf_model_dims d = {0};
  bool ok = true;
  if (c->rank == 0 && cfg->model.init[0])
    ok = wf_weights_check(cfg->model.init, "model.init", &d) == WF_OK;
  ok = all_ok(c->world, c->rank == 0 ? ok : true);
  int32_t v = d.V;
  if (ok && cfg->model.init[0] && wf_comm_bcast(c->world, &v, 1, WF_COMM_I32, 0) == WF_OK)
    *vocab = v;
  return ok;
}

/* What a command checks of its inputs on each rank before the mesh, without MPI: that it
 * has a model to sample from, the data (cheaply, never blocking on a FIFO) and the
 * sample's prompt, against the model's vocabulary (model.init's, once it met the
 * config). */
static wf_status check_inputs(const wf_config *cfg, const wf__args *a, char *err, size_t len)
{
  int checks = a->cmd->checks, vocab = cfg->model.vocab;
  if ((checks & C_NEED_INIT) && !cfg->model.init[0]) {
    snprintf(err, len,
             "%s needs the model to sample from: add model.init=FILE (an llm.c or safetensors "
             "file, or a weft checkpoint directory)",
             a->cmd->flag);
    return WF_ECONFIG;
  }
  wf_status st = (checks & C_DATA) ? wf_data_check(cfg, vocab, err, len) : WF_OK;
  if (st == WF_OK && (checks & (C_SAMPLE | C_PROMPT)))
    st = wf_sample_check(cfg, (checks & C_PROMPT) ? a->val[0] : NULL, vocab, err, len);
  return st;
}

/* model.init, the data, the sample prompt and where the coordinator listens, as the
 * command asks; once for the job (`early`: the last three were checked before MPI_Init,
 * on every rank). Returns the exit status (WF_EXIT_OK: go on). */
static int preflight(const wf__cmd_ctx *c, bool early)
{
  char err[2048] = "";
  int checks = c->a->cmd->checks, vocab = c->cfg->model.vocab;
  if ((checks & C_INIT) && !init_ok(c, &vocab))
    return WF_EXIT_INPUT;
  if ((checks & C_PROMPT) && !c->cfg->data.tokenizer[0] && vocab > 256 && c->rank == 0)
    WF_WARN("%s without data.tokenizer: the model's %d-token vocabulary is not bytes, so the "
            "prompt is read as bytes and the sample printed as <id>s; add data.tokenizer=DIR "
            "(the tokenizer the model was trained with) to read and write text",
            c->a->cmd->flag, vocab);
  if (early)
    return WF_EXIT_OK;
  /* Data that cannot work is a config-level error: every rank checks it, rank 0 says it */
  bool ok = check_inputs(c->cfg, c->a, err, sizeof err) == WF_OK;
  if (!all_ok(c->world, ok))
    return fail_all(c->world, !ok, err, c->rank);
  /* where the coordinator will listen: rank 0's to check, and to say */
  if (!(checks & C_PLANE))
    return WF_EXIT_OK;
  return wf__exit_status(wf_comm_agree(c->world, wf__cmd_train_precheck(c), NULL));
}

/* ---- the mesh ----------------------------------------------------------------------- */

/* Bind this rank with hwloc and size its compute threads. */
static void bind_rank(const wf_config *cfg, const wf_launch *launch, wf__rank_device *rd,
                      wf_binding *binding)
{
  wf_bind_apply(binding, cfg->runtime.bind, launch->local_rank, launch->local_size,
                rd->bus[0] ? rd->bus : NULL);
  if (binding->shared && launch->local_rank == 0)
    WF_INFO("%d ranks share %d cores on %s: one compute thread each", launch->local_size,
            binding->node_cores, wf_rt_host());
  if (cfg->runtime.threads > 0 && cfg->runtime.threads != binding->threads) {
    if (launch->local_rank == 0)
      WF_INFO("runtime.threads=%d compute threads per rank (the binding gives %d)",
              cfg->runtime.threads, binding->threads);
    binding->threads = cfg->runtime.threads;
  }
  wf_kernels_set_threads(binding->threads);
  /* ranks sharing cores share their peak too: the job's sum is the node's */
  double cores =
      binding->shared ? (double)binding->node_cores / launch->local_size : binding->threads;
  if (!rd->gpu)
    wf__cpu_peak(rd, cores, cfg);
}

#define GIB (1024.0 * 1024.0 * 1024.0)

static void log_launch(const wf__cmd_ctx *c)
{
  bool launched = c->a->cmd->world == W_LAUNCH || c->a->cmd->world == W_MESH;
  if (c->rank == 0 && launched)
    WF_INFO("weft " WF_VERSION " (build %s); launch: rank/size from %s; %d rank%s", wf_build_id(),
            wf_launch_source_str(c->launch->source), c->size, c->size == 1 ? "" : "s");
}

/* Training: whether the model fits this rank's memory as --estimate sizes it, before
 * anything is allocated: the GPU's memory, or on the CPU the host's shared by the ranks
 * on it. */
static wf_status check_fits(const wf__cmd_ctx *c, const wf__rank_device *rd, char *err, size_t len)
{
  const wf_config *cfg = c->cfg;
  wf_model_dims d = wf_model_dims_from_config(cfg);
  char desc[192];
  double limit = 0;
  err[0] = '\0';
  if (!(c->a->cmd->checks & C_PLANE) ||
      (cfg->model.init[0] && !wf_weights_probe(cfg->model.init, &d)))
    return WF_OK;
  if (rd->gpu) {
    size_t free_b = 0, total = 0;
    if (wf_gpu_mem_info(rd->gpu, &free_b, &total) == WF_OK)
      limit = (double)total;
    snprintf(desc, sizeof desc, "the memory of %s", rd->desc);
  } else {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int ranks = c->launch->local_size > 0 ? c->launch->local_size : 1;
    double host = pages > 0 && page > 0 ? (double)pages * page : 0;
    limit = host / ranks;
    snprintf(desc, sizeof desc, "%.1f GiB of memory on %s shared by %d rank%s", host / GIB,
             wf_rt_host(), ranks, ranks == 1 ? "" : "s");
  }
  return wf_plan_fits(cfg, &d, limit, desc, wf_dev_kernels(rd->dev, WF_DT_F32), err, len);
}

/* Pick the device, bind, bootstrap the mesh and run the command on it. */
static int run_on_mesh(wf__cmd_ctx *c)
{
  char err[2048] = "";
  wf__rank_device rd;
  bool ok = wf__pick_device(c->cfg, c->launch, &rd, err, sizeof err) == WF_OK;
  if (!all_ok(c->world, ok)) { /* the node's device, not the command: a restart may do */
    fail_all(c->world, !ok, err, c->rank);
    return WF_EXIT_FAILED;
  }
  ok = check_fits(c, &rd, err, sizeof err) == WF_OK;
  if (!all_ok(c->world, ok)) {
    wf__rank_device_close(&rd);
    return fail_all(c->world, !ok, err, c->rank);
  }
  log_launch(c);
  wf_binding binding;
  bind_rank(c->cfg, c->launch, &rd, &binding);
  char device[64], model[48] = "";
  if (rd.gpu) /* "cuda:0 (NVIDIA H100 80GB HBM3)": the job checks every rank has the same */
    wf_gpu_device_name(rd.gpu, wf_gpu_current_device(rd.gpu), model, sizeof model);
  snprintf(device, sizeof device, model[0] ? "%s (%s)" : "%s", rd.desc, model);
  wf_job *job = NULL;
  wf_job_opts jo = {c->cfg, c->launch, device, &binding, rd.gpu, false};
  ok = wf__survey_gpus(c->world, &rd, &jo.nccl) == WF_OK;
  ok = ok && wf_job_bootstrap(&job, &jo) == WF_OK;
  int rc = WF_EXIT_FAILED;
  if (!all_ok(c->world, ok)) {
    if (c->rank == 0)
      WF_ERROR("mesh bootstrap failed (see the log above)");
  } else if (!all_ok(c->world, wf_job_check_devices(job) == WF_OK)) {
    rc = WF_EXIT_INPUT; /* said by rank 0, which holds every rank's facts */
  } else {
    c->job = job, c->rd = &rd;
    rc = c->a->cmd->run(c);
  }
  wf_job_destroy(job);
  wf__rank_device_close(&rd);
  return rc;
}

/* What main found before MPI_Init, on every rank alike: the command line, the config
 * (file, WEFT_* variables, key=value arguments) and, where the launcher's variables give
 * the world size, the config's check against it. */
typedef struct early {
  wf__args a;
  wf_config cfg;
  bool ok;
  int exit;    /* the exit status when not ok */
  bool inputs; /* the data, the prompt and the coordinator's address were checked too */
  char err[2048];
} early;

/* The world size the launcher's variables state before MPI_Init, where MPI will agree
 * with it (mpirun's, or a singleton's 1); 0 when only MPI can tell. */
static int early_world(void)
{
  wf_launch l;
  char err[256];
  if (wf_launch_is_singleton(wf_launch_getenv, launch_env))
    return wf_launch_getenv(launch_env, "RANK") || wf_launch_getenv(launch_env, "WORLD_SIZE")
               ? 0 /* started by hand as one of several: the launch check says what to do */
               : 1;
  if (wf_launch_detect(&l, -1, -1, wf_launch_getenv, launch_env, err, sizeof err) != WF_OK)
    return 0;
  return l.source == WF_LAUNCH_OMPI && l.world_size > 0 ? l.world_size : 0;
}

/* The model's shape within the bounds every model size is computed in (model.init's
 * file is checked when it is read). */
static wf_status check_shape(const wf_config *cfg, char *err, size_t len)
{
  wf_model_dims d = wf_model_dims_from_config(cfg);
  const char *bad = cfg->model.init[0] ? NULL : wf_model_dims_check(&d);
  if (!bad)
    return WF_OK;
  snprintf(err, len,
           "model.family=%s model.layers=%d model.d_model=%d model.heads=%d model.kv_heads=%d "
           "model.ffn=%d model.seq_len=%d model.vocab=%d: %s; choose a smaller model",
           cfg->model.family, d.L, d.C, d.NH, d.KV, d.F, d.maxT, d.V, bad);
  return WF_ECONFIG;
}

/* Whether a mistake found before MPI_Init can be said there once (said_early): under
 * mpirun, or in a process no launcher started. */
static bool sayable_early(void)
{
  return getenv("OMPI_COMM_WORLD_RANK") || wf_launch_is_singleton(wf_launch_getenv, NULL);
}

/* The inputs a mesh command checks (preflight's), before MPI_Init: the data and the
 * sample's prompt on every rank, where the coordinator will listen on rank 0 (which
 * says what is wrong there itself: err is then ""). cfg: the validated copy. */
static void early_inputs(early *e, const wf_config *cfg)
{
  wf_launch l;
  char why[256];
  e->ok = check_inputs(cfg, &e->a, e->err, sizeof e->err) == WF_OK;
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  bool rank0 = !r || !strcmp(r, "0");
  if (e->ok && rank0 && (e->a.cmd->checks & C_PLANE) &&
      wf_launch_detect(&l, cfg->dist.rank, cfg->dist.world_size, wf_launch_getenv, launch_env, why,
                       sizeof why) == WF_OK) {
    wf__cmd_ctx c = {cfg, &e->a, NULL, 0, 1, &l, NULL, NULL};
    wf_status st = wf__cmd_train_precheck(&c);
    e->ok = st == WF_OK;
    e->exit = wf__exit_status(st);
    e->err[0] = '\0'; /* said by the check */
  }
  e->inputs = e->ok;
}

/* model.init cannot be read here, before MPI_Init: rank 0 reads it again and says why
 * (err ""); another rank says that it alone cannot, if rank 0 can (said_early waits).
 * Returns false; true when rank 0 reads it after all. */
static bool unreadable_init(early *e, const char *init)
{
  wf_model_dims d;
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  if (!r || !strcmp(r, "0")) {
    e->err[0] = '\0';
    return wf_weights_peek(init, "model.init", &d) == WF_OK;
  }
  snprintf(e->err, sizeof e->err,
           "model.init=%s: rank %s on %s cannot read it, though rank 0 can: put the weights "
           "where every host sees them",
           init, r, wf_rt_host());
  return false;
}

static void early_checks(early *e, int argc, char **argv)
{
  wf_model_dims d;
  e->exit = WF_EXIT_INPUT;
  e->ok = parse_args(argc, argv, &e->a, e->err, sizeof e->err) == 0;
  if (!e->ok || e->a.help || e->a.version)
    return;
  e->ok = load_config(&e->cfg, &e->a, e->err, sizeof e->err) == WF_OK;
  if (e->ok) /* what is said from here on says it at runtime.log_level */
    wf_log_set_level(e->cfg.runtime.log_level);
  e->ok = e->ok && vocab_from_tokenizer(&e->cfg, e->err, sizeof e->err) == WF_OK;
  /* model.init decides the model: a file that cannot be read is rank 0's to report,
   * once (here when it can be said here, else after MPI_Init) */
  const char *init = e->cfg.model.init;
  if (e->ok && init[0] && !wf_weights_probe(init, &d)) {
    e->ok = !sayable_early() || unreadable_init(e, init);
    return;
  }
  if (e->ok && init[0])
    e->ok = wf_model_dims_meet_config(&d, init, &e->cfg, e->err, sizeof e->err) == WF_OK;
  if (e->ok) {
    int w = early_world();
    wf_config cfg = e->cfg; /* validated again after MPI_Init, against MPI's world */
    e->ok = wf_config_validate(&cfg,
                               e->a.cmd->world == W_LAUNCH && !w ? 0 : check_world(&cfg, &e->a, w),
                               e->err, sizeof e->err) == WF_OK;
    e->ok = e->ok && check_shape(&cfg, e->err, sizeof e->err) == WF_OK;
    if (e->ok && e->a.cmd->mesh && sayable_early())
      early_inputs(e, &cfg);
  }
}

/* How long mpirun's ranks other than 0 wait for rank 0 to report a mistake they all
 * found before MPI_Init (rank 0's exit makes mpirun end them). Rank 0 needs
 * milliseconds; the wait covers ranks started late on a loaded host. */
#define EARLY_WAIT_S 3

/* mpirun ends a job's ranks with SIGCONT, then SIGTERM a second later: the first is
 * enough for a rank that only waits to be ended. */
static void on_ended_early(int sig, siginfo_t *si, void *uc)
{
  (void)uc;
  if (sig != SIGCONT || (si && si->si_pid == getppid()))
    _exit(WF_EXIT_INPUT);
}

/* A mistake found before MPI_Init, alike on every rank: say it once. A singleton says it
 * at once. Under mpirun rank 0 says it and exits 2, and mpirun ends the other ranks,
 * which wait for that so that rank 0 is the first to exit; one still running after
 * EARLY_WAIT_S says it itself (rank 0 did not find it: its files or variables differ).
 * Under srun or another PMI launcher nothing would end the others, so the ranks agree
 * over MPI instead: returns false. */
static bool said_early(const char *err)
{
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  if (!r && !wf_launch_is_singleton(wf_launch_getenv, NULL))
    return false;
  if (r && strcmp(r, "0") != 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_ended_early;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCONT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    struct timespec ts = {EARLY_WAIT_S, 0};
    while (nanosleep(&ts, &ts) != 0) {
    }
  }
  if (err[0]) /* "": said where it was found */
    WF_ERROR("%s", err);
  return true;
}

static int run(wf_comm *world, early *e, int rank, int size)
{
  char *err = e->err;
  wf__args *a = &e->a;
  wf_config *cfg = &e->cfg;
  wf_launch launch;
  const command *cmd = a->cmd;
  bool ok = e->ok;
  memset(&launch, 0, sizeof launch); /* --estimate and --plan plan a world, launch none */
  bool launched = cmd->world == W_LAUNCH || cmd->world == W_MESH;
  ok = ok && (!launched || read_launch(&launch, cfg, rank, size, err, sizeof e->err) == WF_OK);
  if (!all_ok(world, ok))
    return fail_all(world, !ok, err, rank);
  ok = !cfg->model.init[0] || init_meets(world, cfg, rank, err, sizeof e->err);
  ok = ok && wf_config_validate(cfg, check_world(cfg, a, size), err, sizeof e->err) == WF_OK;
  if (!all_ok(world, ok))
    return fail_all(world, !ok, err, rank);
  wf_log_set_level(cfg->runtime.log_level);
  wf__cmd_ctx c = {cfg, a, world, rank, size, &launch, NULL, NULL};
  int rc = cmd->mesh ? preflight(&c, e->inputs) : WF_EXIT_OK;
  if (rc != WF_EXIT_OK)
    return rc;
  if (!cmd->mesh)
    log_launch(&c);
  return cmd->mesh ? run_on_mesh(&c) : cmd->run(&c);
}

static void free_early(early *e)
{
  free(e->a.overrides);
  for (char **p = launch_env; p && *p; p++)
    free(*p);
  free(launch_env);
}

int main(int argc, char **argv)
{
  static early e; /* the config is large */
  int provided, rank = 0, size = 1;
#ifdef __GLIBC__
  /* Large blocks stay mmapped, so what is freed goes back to the system: Open MPI's
   * reduction buffers and --save's whole model on rank 0 are freed after use, and glibc's
   * default (a threshold that rises to the largest block freed) would then serve later
   * blocks from the heap and keep the freed block resident, out of --check-estimate's
   * sight. */
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
  /* A write into a closed pipe or socket (`worker ... | head`, a console that hung up)
   * fails with EPIPE instead of ending the process without a word: training then stops
   * at the step boundary, checkpointed, and says why (job.c). */
  signal(SIGPIPE, SIG_IGN);
  wf_config_set_model_check(wf_model_config_check);
  /* srun without PMIx: Open MPI would abort in MPI_Init without saying what to do. */
  if (wf_launch_precheck(wf_launch_getenv, NULL, e.err, sizeof e.err) != WF_OK) {
    const char *task = getenv("SLURM_PROCID");
    if (!task || strcmp(task, "0") == 0)
      WF_ERROR("%s", e.err);
    return WF_EXIT_INPUT;
  }
  launch_env = copy_environ();
  early_checks(&e, argc, argv);
  if (e.ok && (e.a.help || e.a.version)) {
    if (e.a.help)
      print_usage(stdout);
    else
      printf("weft " WF_VERSION " (build %s)\n", wf_build_id());
    free_early(&e);
    return WF_EXIT_OK;
  }
  if (!e.ok && said_early(e.err)) {
    free_early(&e);
    return e.exit;
  }
  /* One rank and the tools (--estimate, --plan, --export, ...) need no MPI daemon. */
  wf_launch_isolate_singleton();
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    WF_ERROR("MPI_Init_thread failed");
    return WF_EXIT_FAILED;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  wf_rt_set_rank(rank);
  wf_comm *world = NULL;
  int rc = WF_EXIT_FAILED;
  if (wf_comm_world_create(&world) == WF_OK)
    rc = run(world, &e, rank, size);
  else
    WF_ERROR("cannot create the start-up communicator (see above)");
  wf_comm_destroy(world);
  free_early(&e);
  MPI_Finalize();
  return rc;
}
