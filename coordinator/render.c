/*
 * render.c - the console's text views of the service's JSON replies.
 *
 * Pure functions of the JSON document: the same reply gives the same text, and
 * `--json` prints the document itself. A field the service did not send (an older
 * or newer build) shows as "-" rather than failing.
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "control_int.h"

static const char *str(json_t *o, const char *key)
{
  const char *s = json_string_value(json_object_get(o, key));
  return s && s[0] ? s : "-";
}

static json_int_t num_i(json_t *o, const char *key)
{
  return json_integer_value(json_object_get(o, key));
}

/* A number as text with `fmt`, or "-" when null. */
static const char *num_s(char *buf, size_t len, json_t *o, const char *key, const char *fmt)
{
  json_t *v = json_object_get(o, key);
  if (!json_is_number(v))
    return "-";
  snprintf(buf, len, fmt, json_number_value(v));
  return buf;
}

static const char *bytes_s(char *buf, size_t len, double b)
{
  if (b >= 1 << 30)
    snprintf(buf, len, "%.1f GiB", b / (1 << 30));
  else if (b >= 1 << 20)
    snprintf(buf, len, "%.1f MiB", b / (1 << 20));
  else
    snprintf(buf, len, "%.0f KiB", b / 1024);
  return buf;
}

/* "dp 2 x cp 2 x tp 1 x pp 1, ep 2 inside dp": cp and ep only when the job uses them. */
static const char *mesh_axes(char *buf, size_t len, json_t *m)
{
  int cp = (int)num_i(m, "cp"), ep = (int)num_i(m, "ep");
  char cps[32] = "", eps[32] = "";
  if (cp > 1)
    snprintf(cps, sizeof cps, " x cp %d", cp);
  if (ep > 1)
    snprintf(eps, sizeof eps, ", ep %d inside dp", ep);
  snprintf(buf, len, "dp %d%s x tp %d x pp %d%s", (int)num_i(m, "dp"), cps, (int)num_i(m, "tp"),
           (int)num_i(m, "pp"), eps);
  return buf;
}

static void render_status(json_t *j, FILE *out)
{
  char a[64], b[64], c[64], d[64], axes[128];
  json_t *mesh = json_object_get(j, "mesh");
  double eta = json_number_value(json_object_get(j, "eta_s"));
  fprintf(out, "job      %s (%s)\n", str(j, "job"), str(j, "state"));
  fprintf(out, "model    %s\n", str(j, "model"));
  fprintf(out, "mesh     %s = %d ranks (%d registered, %d alive)\n",
          mesh_axes(axes, sizeof axes, mesh), (int)num_i(j, "world_size"),
          (int)num_i(j, "registered"), (int)num_i(j, "alive"));
  json_int_t step = num_i(j, "step"), total = num_i(j, "total_steps");
  if (step < 0)
    fprintf(out, "step     - (no step finished yet)\n");
  else if (total > 0)
    fprintf(out, "step     %" JSON_INTEGER_FORMAT " / %" JSON_INTEGER_FORMAT "\n", step, total);
  else
    fprintf(out, "step     %" JSON_INTEGER_FORMAT "\n", step);
  fprintf(out, "loss     %s\n", num_s(a, sizeof a, j, "loss", "%.4f"));
  fprintf(out, "speed    %s tokens/s, %s ms/step\n", num_s(b, sizeof b, j, "tokens_per_s", "%.0f"),
          num_s(c, sizeof c, j, "step_ms", "%.1f"));
  if (json_is_number(json_object_get(j, "eta_s")))
    snprintf(d, sizeof d, "%dh%02dm%02ds", (int)(eta / 3600), (int)fmod(eta / 60, 60),
             (int)fmod(eta, 60));
  fprintf(out, "eta      %s\n", json_is_number(json_object_get(j, "eta_s")) ? d : "-");
  fprintf(out, "uptime   %s s\n", num_s(a, sizeof a, j, "uptime_s", "%.0f"));
  if (json_object_get(j, "abort_reason"))
    fprintf(out, "aborted  %s\n", str(j, "abort_reason"));
}

/* "params/grads/optim/act MiB", or "-" before the rank's first step report. */
static const char *kinds_s(char *buf, size_t len, json_t *r)
{
  const char *k[] = {"param_bytes", "grad_bytes", "optim_bytes", "act_bytes"};
  double mib[4];
  for (int i = 0; i < 4; i++) {
    json_t *v = json_object_get(r, k[i]);
    if (!json_is_number(v))
      return "-";
    mib[i] = json_number_value(v) / (1 << 20);
  }
  snprintf(buf, len, "%.1f/%.1f/%.1f/%.1f MiB", mib[0], mib[1], mib[2], mib[3]);
  return buf;
}

/* The rank's GPU through NVML: "37% 1.2G/80.0G" (utilisation, memory used of total),
 * "-" without a GPU or NVML. */
static const char *gpu_s(char *buf, size_t len, json_t *r)
{
  json_t *u = json_object_get(r, "gpu_util_percent");
  if (!json_is_integer(u))
    return "-";
  char used[32], total[32];
  snprintf(buf, len, "%d%% %s/%s", (int)json_integer_value(u),
           bytes_s(used, sizeof used, (double)num_i(r, "gpu_mem_used_bytes")),
           bytes_s(total, sizeof total, (double)num_i(r, "gpu_mem_total_bytes")));
  return buf;
}

static void render_ranks(json_t *j, FILE *out)
{
  size_t i;
  json_t *r;
  char age[32], rtt[32], mem[32], rss[32], ms[32], tps[32], cpu[32], coll[96], kinds[96], gpu[80];
  fprintf(out,
          "%4s %-12s %7s %-8s %-16s %-8s %-16s %-7s %5s %7s %6s %8s %9s %9s %-30s %9s %5s %-20s "
          "%s\n",
          "rank", "host", "pid", "device", "binding", "pp/dp/tp", "stage", "state", "hb", "rtt ms",
          "step", "step ms", "tok/s", "memory", "mem params/grads/optim/act", "rss", "cpu%",
          "gpu util mem", "last collective");
  json_array_foreach(json_object_get(j, "ranks"), i, r)
  {
    json_t *c = json_object_get(r, "coords"), *k = json_object_get(r, "collective");
    char coords[32];
    snprintf(coords, sizeof coords, "%d/%d/%d", (int)num_i(c, "pp"), (int)num_i(c, "dp"),
             (int)num_i(c, "tp"));
    if (num_i(k, "seq") > 0 || json_string_length(json_object_get(k, "op")) > 0)
      snprintf(coll, sizeof coll, "#%" JSON_INTEGER_FORMAT " %s%s", num_i(k, "seq"), str(k, "op"),
               json_is_true(json_object_get(k, "active")) ? " (inside)" : "");
    else
      snprintf(coll, sizeof coll, "-");
    json_int_t step = num_i(r, "step");
    char steps[32];
    snprintf(steps, sizeof steps, step < 0 ? "-" : "%" JSON_INTEGER_FORMAT, step);
    fprintf(out,
            "%4d %-12.12s %7d %-8.8s %-16.16s %-8s %-16.16s %-7s %5s %7s %6s %8s %9s %9s %-30s %9s "
            "%5s %-20s %s\n",
            (int)num_i(r, "rank"), str(r, "host"), (int)num_i(r, "pid"), str(r, "device"),
            str(r, "binding"), coords, str(r, "stage"), str(r, "state"),
            num_s(age, sizeof age, r, "heartbeat_age_s", "%.1fs"),
            num_s(rtt, sizeof rtt, r, "rtt_ms", "%.1f"), steps,
            num_s(ms, sizeof ms, r, "step_ms", "%.1f"),
            num_s(tps, sizeof tps, r, "tokens_per_s_per_rank", "%.0f"),
            bytes_s(mem, sizeof mem, (double)num_i(r, "mem_bytes")),
            kinds_s(kinds, sizeof kinds, r),
            bytes_s(rss, sizeof rss, (double)num_i(r, "rss_bytes")),
            num_s(cpu, sizeof cpu, r, "cpu_percent", "%.0f"), gpu_s(gpu, sizeof gpu, r), coll);
  }
}

static void print_groups(json_t *groups, const char *axis, FILE *out)
{
  size_t i, k;
  json_t *g, *m;
  fprintf(out, "  %-4s groups:", axis);
  json_array_foreach(json_object_get(groups, axis), i, g)
  {
    fprintf(out, " [");
    json_array_foreach(g, k, m) fprintf(out, "%s%d", k ? " " : "", (int)json_integer_value(m));
    fprintf(out, "]");
  }
  fprintf(out, json_array_size(json_object_get(groups, axis)) ? "\n" : " none\n");
}

static void render_mesh(json_t *j, FILE *out)
{
  size_t s, row, col;
  json_t *stage, *r, *cell;
  int tp = (int)num_i(j, "tp");
  bool cp = num_i(j, "cp") > 1;
  char axes[128];
  fprintf(out, "mesh %s (rank = tp + TP*(%s))%s\n", mesh_axes(axes, sizeof axes, j),
          cp ? "cp + CP*(dp + DP*pp)" : "dp + DP*pp",
          cp ? "; each grid cell is the (pp, dp, tp) rank of cp 0, the cp groups hold the rest"
             : "");
  json_array_foreach(json_object_get(j, "stages"), s, stage)
  {
    fprintf(out, "\npipeline stage pp=%d\n       ", (int)num_i(stage, "pp"));
    for (int t = 0; t < tp; t++)
      fprintf(out, " tp=%-3d", t);
    fprintf(out, "\n");
    json_array_foreach(json_object_get(stage, "grid"), row, r)
    {
      fprintf(out, "  dp=%-2d", (int)row);
      json_array_foreach(r, col, cell) fprintf(out, " [%4d]", (int)json_integer_value(cell));
      fprintf(out, "\n");
    }
  }
  json_t *groups = json_object_get(j, "groups");
  fprintf(out, "\ngroups (world ranks):\n");
  print_groups(groups, "tp", out);
  print_groups(groups, "dp", out);
  print_groups(groups, "pp", out);
  print_groups(groups, "emb", out);
  if (cp)
    print_groups(groups, "cp", out);
  if (num_i(j, "ep") > 1)
    print_groups(groups, "ep", out);
}

static void render_trace(json_t *j, FILE *out)
{
  size_t i, k;
  json_t *r, *line;
  json_array_foreach(json_object_get(j, "ranks"), i, r)
  {
    json_t *lines = json_object_get(r, "lines");
    if (!json_is_true(json_object_get(r, "answered")))
      fprintf(out, "rank %d: no answer (not alive, or frozen)\n", (int)num_i(r, "rank"));
    else if (json_array_size(lines) == 0)
      fprintf(out, "rank %d: no collectives yet\n", (int)num_i(r, "rank"));
    else
      fprintf(out, "rank %d:\n", (int)num_i(r, "rank"));
    json_array_foreach(lines, k, line) fprintf(out, "  %s\n", json_string_value(line));
  }
}

wf_status wf_console_render(wf_console_cmd cmd, const char *json, FILE *out)
{
  json_error_t je;
  json_t *j = json_loads(json, 0, &je);
  if (!j)
    return WF_EFORMAT;
  switch (cmd) {
  case WF_CONSOLE_STATUS: render_status(j, out); break;
  case WF_CONSOLE_RANKS: render_ranks(j, out); break;
  case WF_CONSOLE_MESH: render_mesh(j, out); break;
  case WF_CONSOLE_TRACE: render_trace(j, out); break;
  case WF_CONSOLE_SCHEDULE: fprintf(out, "%s\n", str(j, "schedule")); break;
  default: fprintf(out, "%s\n", json); break;
  }
  json_decref(j);
  return WF_OK;
}
