/*
 * console.c - the `coordinator` binary: the operator's console for running jobs.
 *
 *   coordinator [--json] [--dir DIR] status|ranks|mesh|top|trace|schedule|checkpoint|stop [JOB]
 *   coordinator [--dir DIR] list
 *   coordinator [--dir DIR] attach [JOB]
 *
 * Jobs are found from the job files in the job directory ($WEFT_JOB_DIR, else
 * /tmp/weft-$USER); JOB is a job id, a unique prefix of one, or a job file. With no
 * JOB and one running job, that job is used; with several, they are listed.
 * Every request is one connection (see client.c), so the console holds no state a
 * coordinator could lose. Exit status: 0 done, 1 failed, 2 usage.
 */
#include <editline/readline.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "wf_control.h"

#define MAX_JOBS 64

typedef struct console {
  bool json;
  const char *dir;
  int top_count; /* refreshes of `top`; 0 = until Ctrl-C */
  wf_console_job job;
} console;

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) { interrupted = 1; }

static void usage(FILE *out)
{
  fprintf(out, "usage: coordinator [--json] [--dir DIR] COMMAND [JOB]\n"
               "commands:\n"
               "  status      job, model, mesh, step, loss, tokens/s, ETA\n"
               "  ranks       one row per rank: host, pid, device, binding, coordinates, state,\n"
               "              heartbeat age, step, memory, last collective\n"
               "  mesh        the mesh as dp x tp grids per pipeline stage, with groups\n"
               "  top         status and ranks, refreshed every second (--count N refreshes)\n"
               "  schedule    the pipeline action grid per rank\n"
               "  trace       recent collectives from each rank's flight recorder\n"
               "  checkpoint  write a checkpoint at the next step boundary\n"
               "  stop        stop gracefully at the next step boundary\n"
               "  list        the running jobs in the job directory\n"
               "  attach      an interactive prompt for the commands above\n"
               "JOB is a job id, a unique prefix of one, or a job file; the job directory is\n"
               "$WEFT_JOB_DIR, else /tmp/weft-$USER (--dir overrides).\n");
}

static void list_jobs(const wf_console_job *jobs, int n, FILE *out)
{
  fprintf(out, "%-40s %6s %8s %-22s %s\n", "job", "ranks", "pid", "endpoint", "started");
  for (int i = 0; i < n; i++) {
    char when[32];
    time_t t = (time_t)jobs[i].start_time;
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
    fprintf(out, "%-40s %6d %8d %-22s %s\n", jobs[i].id, jobs[i].world_size, jobs[i].pid,
            jobs[i].endpoint, when);
  }
}

/* Pick the job named by `arg` (NULL = the only one). */
static int pick_job(console *con, const char *arg)
{
  static wf_console_job jobs[MAX_JOBS];
  char err[512], dirbuf[512];
  const char *dir = con->dir ? con->dir : wf_job_dir_default(dirbuf, sizeof dirbuf);
  if (arg && strchr(arg, '/')) {
    if (wf_console_job_load(arg, &con->job, err, sizeof err) == WF_OK)
      return 0;
    fprintf(stderr, "coordinator: %s\n", err);
    return 1;
  }
  int n = wf_console_find_jobs(dir, jobs, MAX_JOBS), match = -1, matches = 0;
  if (n <= 0) {
    fprintf(stderr, "coordinator: no running weft job in %s (set WEFT_JOB_DIR or --dir)\n", dir);
    return 1;
  }
  for (int i = 0; i < n; i++) {
    if (!arg || strncmp(jobs[i].id, arg, strlen(arg)) == 0) {
      match = i;
      matches++;
      if (arg && strcmp(jobs[i].id, arg) == 0) {
        matches = 1;
        break;
      }
    }
  }
  if (matches == 1) {
    con->job = jobs[match];
    return 0;
  }
  if (matches == 0)
    fprintf(stderr, "coordinator: no running job '%s' in %s; running jobs:\n", arg, dir);
  else
    fprintf(stderr, "coordinator: %d running jobs; name one:\n", matches);
  list_jobs(jobs, n, stderr);
  return 1;
}

/* One request, printed as text or JSON. Returns 0 or 1. */
static int run_one(console *con, wf_console_cmd cmd)
{
  char *json = NULL, err[1024];
  wf_status st = wf_console_request(&con->job, cmd, 5000, &json, err, sizeof err);
  if (st == WF_EUNSUPPORTED) {
    if (!con->json) {
      printf("%s\n", err);
      return 0;
    }
    json_t *j = json_pack("{s:b, s:s}", "available", 0, "message", err);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    printf("%s\n", s ? s : "{\"available\":false}");
    free(s);
    json_decref(j);
    return 0;
  }
  if (st != WF_OK) {
    fprintf(stderr, "coordinator: %s %s: %s\n", wf_console_cmd_name(cmd), con->job.id, err);
    return 1;
  }
  if (con->json)
    printf("%s\n", json);
  else if (cmd == WF_CONSOLE_STOP || cmd == WF_CONSOLE_CHECKPOINT)
    printf("%s\n", err);
  else
    wf_console_render(cmd, json, stdout);
  free(json);
  fflush(stdout);
  return 0;
}

static int run_top(console *con)
{
  struct sigaction sa = {.sa_handler = on_sigint}, old;
  sigaction(SIGINT, &sa, &old); /* no SA_RESTART: Ctrl-C cuts the sleep short */
  interrupted = 0;
  int rc = 0;
  for (int i = 0; !interrupted && (con->top_count == 0 || i < con->top_count); i++) {
    if (!con->json && isatty(STDOUT_FILENO))
      printf("\033[H\033[2J");
    if ((rc = run_one(con, WF_CONSOLE_STATUS)) != 0)
      break;
    if (!con->json)
      printf("\n");
    if ((rc = run_one(con, WF_CONSOLE_RANKS)) != 0)
      break;
    if (con->top_count == 0 || i + 1 < con->top_count)
      sleep(1);
  }
  sigaction(SIGINT, &old, NULL);
  return rc;
}

static int run_command(console *con, const char *name)
{
  if (strcmp(name, "top") == 0)
    return run_top(con);
  int cmd = wf_console_cmd_parse(name);
  if (cmd < 0) {
    fprintf(stderr, "coordinator: unknown command '%s' (try help)\n", name);
    return 2;
  }
  return run_one(con, (wf_console_cmd)cmd);
}

static void attach_help(void)
{
  printf("commands: status ranks mesh top schedule trace checkpoint stop\n"
         "          json on|off   help   quit (or Ctrl-D)\n");
}

/* The interactive console: the same commands, with line editing and history. */
static int run_attach(console *con)
{
  char prompt[160];
  snprintf(prompt, sizeof prompt, "weft %s> ", con->job.id);
  printf("attached to job %s (%d ranks) at %s; type help\n", con->job.id, con->job.world_size,
         con->job.endpoint);
  using_history();
  for (char *line; (line = readline(prompt)) != NULL; free(line)) {
    char *cmd = strtok(line, " \t");
    if (!cmd)
      continue;
    add_history(line);
    char *arg = strtok(NULL, " \t");
    if (strcmp(cmd, "quit") == 0 || strcmp(cmd, "exit") == 0) {
      free(line);
      break;
    } else if (strcmp(cmd, "help") == 0) {
      attach_help();
    } else if (strcmp(cmd, "json") == 0) {
      con->json = !arg || strcmp(arg, "off") != 0;
    } else {
      int saved = con->top_count;
      run_command(con, cmd);
      con->top_count = saved;
    }
  }
  printf("\n");
  return 0;
}

int main(int argc, char **argv)
{
  console con = {0};
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      con.json = true;
    } else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
      con.dir = argv[++i];
    } else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
      con.top_count = atoi(argv[++i]);
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "coordinator: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (i >= argc) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[i], *job = i + 1 < argc ? argv[i + 1] : NULL;
  if (i + 2 < argc) {
    usage(stderr);
    return 2;
  }
  if (strcmp(cmd, "list") == 0) {
    static wf_console_job jobs[MAX_JOBS];
    char dirbuf[512];
    const char *dir = con.dir ? con.dir : wf_job_dir_default(dirbuf, sizeof dirbuf);
    int n = wf_console_find_jobs(dir, jobs, MAX_JOBS);
    if (n <= 0) {
      printf("no running weft job in %s\n", dir);
      return 0;
    }
    list_jobs(jobs, n, stdout);
    return 0;
  }
  if (strcmp(cmd, "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "top") != 0 && strcmp(cmd, "attach") != 0 && wf_console_cmd_parse(cmd) < 0) {
    fprintf(stderr, "coordinator: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
  }
  if (pick_job(&con, job) != 0)
    return 1;
  if (strcmp(cmd, "attach") == 0)
    return run_attach(&con);
  return run_command(&con, cmd);
}
