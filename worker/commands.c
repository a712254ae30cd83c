/*
 * commands.c - the worker's command line: the commands as one table (docs/architecture.md:
 * seams as tables), their run functions where they are one call into a concern's folder,
 * the options, --help, and the parsing (commands.h). main.c runs what it parses.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "wf_io.h"
#include "wf_parallel.h"
#include "wf_runtime.h"
#include "wf_train.h"

/* ---- the commands ------------------------------------------------------------------- */

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
static const wf__command commands[] = {
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

void wf__print_usage(FILE *out)
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

static const wf__command *find_command(const char *s)
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
static int take_command(const wf__command *c, int argc, char **argv, int *i, wf__args *a, char *err,
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

int wf__parse_args(int argc, char **argv, wf__args *a, char *err, size_t len)
{
  memset(a, 0, sizeof *a);
  a->cmd = &commands[WF_ARRAY_LEN(commands) - 1];
  a->overrides = calloc((size_t)argc, sizeof *a->overrides);
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    const wf__command *c = find_command(s);
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
