/*
 * console.c - the `coordinator` binary: the operator's console for running jobs.
 *
 *   coordinator [--json] [--dir DIR] status|mesh|top|schedule|checkpoint|stop [JOB]
 *   coordinator [--json] [--dir DIR] ranks [RANK] [JOB]
 *   coordinator [--json] [--dir DIR] trace [RANK] [GROUP] [JOB]
 *   coordinator [--dir DIR] list
 *   coordinator [--dir DIR] attach [JOB]
 *   coordinator [--dir DIR] view [JOB]
 *   coordinator plot METRICS.jsonl OUT.svg|OUT.png
 *
 * Options may come anywhere (`coordinator ranks --json` as `coordinator --json ranks`).
 * RANK is a world rank; GROUP a communicator name (world, dp, tp, pp, emb): `ranks`
 * and `trace` show only those. Ranks are world ranks everywhere.
 * Jobs are found from the job files in the job directory ($WEFT_JOB_DIR, else
 * /tmp/weft-$USER); JOB is a job id, a unique prefix of one, or a job file. With no
 * JOB and one running job, that job is used; with several, they are listed. --wait S
 * waits up to S seconds for the job to appear (a job just launched writes its job file
 * within seconds); a job file whose process is gone is named as stale, with the command
 * that removes it.
 * Every request is one connection (see client.c), so the console holds no state a
 * coordinator could lose. Exit status: 0 done, 1 failed, 2 usage. SIGPIPE is ignored:
 * an output whose reader has gone (`coordinator top | head`) is said once, and ends
 * the command with 1.
 */
#include <editline/readline.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plot_int.h"
#include "wf_control.h"

#define MAX_JOBS 64

typedef struct console {
  bool json;
  const char *dir;
  double wait_s;   /* how long to wait for the job to appear; 0 = not at all */
  int top_count;   /* refreshes of `top`; 0 = until Ctrl-C */
  int rank;        /* `ranks` and `trace`: only this world rank; -1 = all */
  char group[16];  /* `trace`: only this communicator's operations; "" = all */
  bool out_closed; /* standard output's reader has gone */
  wf_console_job job;
} console;

static const char *const commands[] = {"status",     "ranks", "mesh", "top",  "schedule", "trace",
                                       "checkpoint", "stop",  "json", "help", "quit",     NULL};

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) { interrupted = 1; }

/* One line per command, also `help COMMAND` in attach. */
static const struct {
  const char *name, *args, *text;
} help_text[] = {
    {"status", "", "job, model, mesh, step, loss, tokens/s, ETA"},
    {"ranks", "[RANK]",
     "one row per rank (or rank RANK): host, pid, device, binding,\n"
     "coordinates, state, heartbeat age, step, step ms, tokens/s per rank,\n"
     "memory, RSS, CPU%, last collective"},
    {"mesh", "", "the mesh as dp x tp grids per pipeline stage, with groups"},
    {"top", "", "status and ranks, refreshed every second (--count N refreshes)"},
    {"schedule", "", "the pipeline action grid per rank"},
    {"trace", "[RANK] [GROUP]",
     "recent collectives from each rank's flight recorder (or rank RANK's,\n"
     "or group GROUP's: world, dp, tp, pp, emb), peers as world ranks"},
    {"checkpoint", "", "write a checkpoint at the next step boundary (needs train.checkpoint_dir)"},
    {"stop", "", "stop gracefully at the next step boundary"},
    {"list", "", "the running jobs in the job directory"},
    {"attach", "", "an interactive prompt for the commands above, with completion"},
    {"view", "",
     "the address of the job's live view in a browser (it carries the job's token;\n"
     "the job needs runtime.metrics_port)"},
    {"plot", "METRICS OUT",
     "draw a train.metrics file's loss and tokens/s into OUT (.svg or .png)\n"
     "with gnuplot; needs no job"},
};

/* `text`, its continuation lines indented by `indent` columns. */
static void print_indented(FILE *out, const char *text, int indent)
{
  for (const char *p = text; *p;) {
    const char *nl = strchr(p, '\n');
    int n = nl ? (int)(nl - p) : (int)strlen(p);
    fprintf(out, "%.*s\n", n, p);
    if (!nl)
      break;
    p = nl + 1;
    fprintf(out, "%*s", indent, "");
  }
}

static void usage(FILE *out)
{
  fprintf(out,
          "usage: coordinator [--json] [--dir DIR] [--count N] [--wait S] COMMAND [ARGS] [JOB]\n"
          "commands:\n");
  for (size_t i = 0; i < sizeof help_text / sizeof help_text[0]; i++) {
    char head[32];
    snprintf(head, sizeof head, "%s %s", help_text[i].name, help_text[i].args);
    fprintf(out, "  %-20s ", head);
    print_indented(out, help_text[i].text, 23);
  }
  fprintf(out, "JOB is a job id, a unique prefix of one, or a job file; the job directory is\n"
               "$WEFT_JOB_DIR, else /tmp/weft-$USER (--dir overrides). --wait S waits up to S\n"
               "seconds for JOB to start. Options may come anywhere on the line.\n");
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

/* Job files whose process is gone: named, with the command that removes them. */
static void name_stale(const char *dir)
{
  static wf_console_job stale[MAX_JOBS];
  int n = wf_console_find_stale(dir, stale, MAX_JOBS);
  for (int i = 0; i < n; i++)
    fprintf(stderr,
            "coordinator: stale job file %s (job %s: its rank 0, pid %d, is gone); remove it: "
            "rm -f %s%s%s\n",
            stale[i].file, stale[i].id, stale[i].pid, stale[i].file,
            stale[i].unix_path[0] ? " " : "", stale[i].unix_path);
}

/* The running job `arg` names (NULL = the only one): its index in jobs[0..n), -1 when
 * none matches, -2 when several do. */
static int match_job(const wf_console_job *jobs, int n, const char *arg)
{
  int match = -1, matches = 0;
  for (int i = 0; i < n; i++) {
    if (arg && strcmp(jobs[i].id, arg) == 0)
      return i;
    if (!arg || strncmp(jobs[i].id, arg, strlen(arg)) == 0)
      match = i, matches++;
  }
  return matches > 1 ? -2 : match;
}

/* Pick the job named by `arg` (NULL = the only one), waiting up to con->wait_s for it to
 * appear. Several that match are listed at once: waiting would not make one of them. */
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
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int n = wf_console_find_jobs(dir, jobs, MAX_JOBS), i = n > 0 ? match_job(jobs, n, arg) : -1;
    if (i >= 0) {
      con->job = jobs[i];
      return 0;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    double waited = (double)(now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) * 1e-9;
    if (i == -2 || waited >= con->wait_s) {
      name_stale(dir);
      if (n <= 0)
        fprintf(stderr, "coordinator: no running weft job in %s (set WEFT_JOB_DIR or --dir)\n",
                dir);
      else if (i == -1)
        fprintf(stderr, "coordinator: no running job '%s' in %s; running jobs:\n", arg, dir);
      else
        fprintf(stderr, "coordinator: %d running jobs; name one:\n", n);
      if (n > 0)
        list_jobs(jobs, n, stderr);
      return 1;
    }
    usleep(200 * 1000);
  }
}

/* Keep only trace lines of `group` ("dp#12 allreduce ..."). */
static void filter_lines(json_t *rank, const char *group)
{
  json_t *lines = json_object_get(rank, "lines");
  size_t n = strlen(group);
  for (size_t i = json_array_size(lines); i-- > 0;) {
    const char *l = json_string_value(json_array_get(lines, i));
    if (!l || strncmp(l, group, n) != 0 || l[n] != '#')
      json_array_remove(lines, i);
  }
}

/* `ranks RANK`, `trace RANK GROUP`: drop what was not asked for. Returns 0, or 1 with a
 * message when the rank is not in the job. */
static int filter_reply(const console *con, wf_console_cmd cmd, char **json)
{
  if ((cmd != WF_CONSOLE_RANKS && cmd != WF_CONSOLE_TRACE) || (con->rank < 0 && !con->group[0]))
    return 0;
  json_error_t je;
  json_t *j = json_loads(*json, 0, &je), *ranks = json_object_get(j, "ranks");
  if (!j)
    return 0;
  if (con->rank >= 0 && (size_t)con->rank >= json_array_size(ranks)) {
    fprintf(stderr, "coordinator: no rank %d: job %s has ranks 0-%zu\n", con->rank, con->job.id,
            json_array_size(ranks) - 1);
    json_decref(j);
    return 1;
  }
  for (size_t i = json_array_size(ranks); i-- > 0;) {
    json_t *r = json_array_get(ranks, i);
    if (con->rank >= 0 && json_integer_value(json_object_get(r, "rank")) != con->rank)
      json_array_remove(ranks, i);
    else if (cmd == WF_CONSOLE_TRACE && con->group[0])
      filter_lines(r, con->group);
  }
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (s) {
    free(*json);
    *json = s;
  }
  return 0;
}

/* Whether standard output's reader has gone (EPIPE: SIGPIPE is ignored); said once. */
static bool output_closed(console *con)
{
  if (!con->out_closed && fflush(stdout) == EOF && errno == EPIPE) {
    con->out_closed = true;
    fprintf(stderr, "coordinator: standard output is a closed pipe (its reader exited): "
                    "stopping\n");
  }
  return con->out_closed;
}

/* One request, printed as text or JSON. Returns 0 or 1. */
static int run_one(console *con, wf_console_cmd cmd)
{
  char *json = NULL, err[1024];
  wf_status st = wf_console_request(&con->job, cmd, 5000, &json, err, sizeof err);
  if (st == WF_OK && filter_reply(con, cmd, &json) != 0) {
    free(json);
    return 1;
  }
  if (st == WF_EUNSUPPORTED && (cmd == WF_CONSOLE_CHECKPOINT || cmd == WF_CONSOLE_STOP)) {
    fprintf(stderr, "coordinator: %s\n", err); /* refused: an error, not a view to show */
    return 1;
  }
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
  return output_closed(con) ? 1 : 0;
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

static void attach_help(const char *cmd)
{
  for (size_t i = 0; cmd && i < sizeof help_text / sizeof help_text[0]; i++) {
    if (strcmp(cmd, help_text[i].name) == 0) {
      printf("%s %s\n  ", help_text[i].name, help_text[i].args);
      print_indented(stdout, help_text[i].text, 2);
      return;
    }
  }
  if (cmd && strcmp(cmd, "json") == 0) {
    printf("json on|off\n  print replies as JSON (as --json does)\n");
    return;
  }
  if (cmd)
    printf("no command '%s'; ", cmd);
  printf("commands: status ranks [RANK] mesh top schedule trace [RANK] [GROUP] checkpoint stop\n"
         "          json on|off   help [COMMAND]   quit (or Ctrl-D); Tab completes commands\n");
}

/* Tab completion: commands, and after `help` a command to explain. Never file names. */
static char *command_generator(const char *text, int state)
{
  static int next;
  if (state == 0)
    next = 0;
  for (size_t n = strlen(text); commands[next];) {
    const char *c = commands[next++];
    if (strncmp(c, text, n) == 0)
      return strdup(c);
  }
  return NULL;
}

static char **complete(const char *text, int start, int end)
{
  rl_attempted_completion_over = 1;
  if (start == 0 || strncmp(rl_line_buffer, "help ", 5) == 0)
    return rl_completion_matches(text, command_generator);
  return NULL;
}

/* `ranks 3`, `trace 3 dp`, `trace dp`: a number is a world rank, a word a group. */
static void parse_filters(console *con, char *arg)
{
  con->rank = -1;
  con->group[0] = '\0';
  for (; arg; arg = strtok(NULL, " \t")) {
    if (arg[0] >= '0' && arg[0] <= '9')
      con->rank = atoi(arg);
    else
      snprintf(con->group, sizeof con->group, "%s", arg);
  }
}

/* The interactive console: the same commands, with line editing, history and
 * completion. */
static int run_attach(console *con)
{
  char prompt[160];
  snprintf(prompt, sizeof prompt, "weft %s> ", con->job.id);
  printf("attached to job %s (%d ranks) at %s; type help\n", con->job.id, con->job.world_size,
         con->job.endpoint);
  using_history();
  rl_attempted_completion_function = complete;
  for (char *line; (line = readline(prompt)) != NULL; free(line)) {
    if (*line)
      add_history(line);
    char *cmd = strtok(line, " \t");
    if (!cmd)
      continue;
    char *arg = strtok(NULL, " \t");
    if (strcmp(cmd, "quit") == 0 || strcmp(cmd, "exit") == 0) {
      free(line);
      break;
    } else if (strcmp(cmd, "help") == 0) {
      attach_help(arg);
    } else if (strcmp(cmd, "json") == 0) {
      con->json = !arg || strcmp(arg, "off") != 0;
    } else {
      int saved = con->top_count;
      parse_filters(con, arg);
      run_command(con, cmd);
      con->top_count = saved;
    }
    if (output_closed(con)) {
      free(line);
      return 1;
    }
  }
  printf("\n");
  return 0;
}

/* `view`: the live view's address with the token, which the page turns into a cookie. */
static int print_view(const console *con)
{
  if (!con->job.view[0]) {
    fprintf(stderr,
            "coordinator: job %s serves no live view: start it with runtime.metrics_port=PORT "
            "(the view shares the Prometheus listener)\n",
            con->job.id);
    return 1;
  }
  printf("%s?token=%s\n", con->job.view, con->job.token);
  return 0;
}

/* Options anywhere; the positionals, in order, into pos[] (at most max). Returns the
 * number of positionals, or -1 (usage printed; *rc set). */
static int parse_args(console *con, int argc, char **argv, char **pos, int max, int *rc)
{
  int n = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--json") == 0) {
      con->json = true;
    } else if (strcmp(a, "--dir") == 0 && i + 1 < argc) {
      con->dir = argv[++i];
    } else if (strcmp(a, "--count") == 0 && i + 1 < argc) {
      con->top_count = atoi(argv[++i]);
    } else if (strcmp(a, "--wait") == 0 && i + 1 < argc) {
      con->wait_s = atof(argv[++i]);
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      *rc = 0;
      return -1;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "coordinator: unknown option '%s'\n", a);
      usage(stderr);
      *rc = 2;
      return -1;
    } else if (n < max) {
      pos[n++] = argv[i];
    } else {
      usage(stderr);
      *rc = 2;
      return -1;
    }
  }
  return n;
}

static bool all_digits(const char *s)
{
  if (!*s)
    return false;
  for (; *s; s++)
    if (*s < '0' || *s > '9')
      return false;
  return true;
}

/* After `ranks` and `trace`: a number is a rank, a group name (trace) a group, and what
 * is left the job. Returns the job argument or NULL. */
static const char *take_filters(console *con, const char *cmd, char **pos, int n)
{
  const char *job = NULL;
  bool filters = strcmp(cmd, "ranks") == 0 || strcmp(cmd, "trace") == 0;
  for (int i = 1; i < n; i++) {
    if (filters && con->rank < 0 && all_digits(pos[i]))
      con->rank = atoi(pos[i]);
    else if (strcmp(cmd, "trace") == 0 && !con->group[0] && !strchr(pos[i], '-') &&
             !strchr(pos[i], '/') && strlen(pos[i]) < sizeof con->group)
      snprintf(con->group, sizeof con->group, "%s", pos[i]); /* job ids have a '-' */
    else
      job = pos[i];
  }
  return job;
}

int main(int argc, char **argv)
{
  console con = {.rank = -1};
  signal(SIGPIPE, SIG_IGN);
  char *pos[4];
  int rc = 2, n = parse_args(&con, argc, argv, pos, 4, &rc);
  if (n < 0)
    return rc;
  if (n == 0) {
    usage(stderr);
    return 2;
  }
  const char *cmd = pos[0];
  if (strcmp(cmd, "plot") == 0) {
    if (n != 3) {
      fprintf(stderr, "usage: coordinator plot METRICS.jsonl OUT.svg|OUT.png\n");
      return 2;
    }
    return wf__plot(pos[1], pos[2]);
  }
  const char *job = take_filters(&con, cmd, pos, n);
  if (strcmp(cmd, "list") == 0) {
    static wf_console_job jobs[MAX_JOBS];
    char dirbuf[512];
    const char *dir = con.dir ? con.dir : wf_job_dir_default(dirbuf, sizeof dirbuf);
    int found = wf_console_find_jobs(dir, jobs, MAX_JOBS);
    name_stale(dir);
    if (found <= 0) {
      printf("no running weft job in %s\n", dir);
      return 0;
    }
    list_jobs(jobs, found, stdout);
    return 0;
  }
  if (strcmp(cmd, "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "top") != 0 && strcmp(cmd, "attach") != 0 && strcmp(cmd, "view") != 0 &&
      wf_console_cmd_parse(cmd) < 0) {
    fprintf(stderr, "coordinator: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
  }
  if (pick_job(&con, job) != 0)
    return 1;
  if (strcmp(cmd, "attach") == 0)
    return run_attach(&con);
  if (strcmp(cmd, "view") == 0)
    return print_view(&con);
  return run_command(&con, cmd);
}
