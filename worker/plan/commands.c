/*
 * commands.c - worker --estimate (one run's memory and time) and worker --plan (every
 * mesh of a world, ranked), as a table or JSON.
 *
 * A candidate plan is a copy of the config with its mesh keys set, checked by the
 * config's own validation (wf_config_validate: the rules a launch would apply) and by
 * the model's shard rules; what passes is sized per stage by wf_plan_stage_mem_get and
 * timed by wf_plan_time_get. A plan is left out with the first reason found, the
 * memory one saying by how much and where: "31.2 GiB > 24.0 GiB on stage 0".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "plan_int.h"
#include "wf_gpu.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

static const char *recompute_name(wf_recompute r)
{
  return r == WF_RECOMPUTE_FULL ? "full" : r == WF_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

static const char *prec_name(wf_precision p)
{
  return p == WF_PREC_BF16 ? "bf16" : p == WF_PREC_FP16 ? "fp16" : "fp32";
}

void wf__plan_keys(const wf_plan_mesh *m, char *buf, size_t len)
{
  snprintf(buf, len,
           "mesh.dp=%d mesh.tp=%d mesh.pp=%d mesh.fsdp=%d train.microbatches=%d "
           "train.schedule=%s parallel.virtual_stages=%d optim.zero=%d "
           "parallel.reshard_after_forward=%s parallel.sequence=%s "
           "parallel.activation_checkpointing=%s precision=%s",
           m->dp, m->tp, m->pp, m->fsdp, m->M, wf_schedule_kind_str(m->kind), m->v, m->zero,
           m->keep ? "false" : "true", m->sp ? "true" : "false", recompute_name(m->recompute),
           m->prec == WF_PREC_NO ? "no" : prec_name(m->prec));
  size_t n = strlen(buf);
  if (m->cp > 1 && n < len)
    snprintf(buf + n, len - n, " mesh.cp=%d parallel.cp_mode=%s", m->cp,
             m->cp_mode == WF_CP_ALLGATHER ? "allgather" : "ring");
  n = strlen(buf);
  if (m->ep > 1 && n < len)
    snprintf(buf + n, len - n, " mesh.ep=%d", m->ep);
}

void wf__plan_describe(const wf_plan_mesh *m, char *buf, size_t len)
{
  char v[16] = "", z[48];
  if (m->kind == WF_SCHED_INTERLEAVED)
    snprintf(v, sizeof v, " v%d", m->v);
  snprintf(z, sizeof z, "zero %d%s", m->zero, m->keep ? " kept" : "");
  if (m->fsdp > 0 && m->fsdp < m->dp) /* HSDP: replicas x fsdp groups */
    snprintf(z + strlen(z), sizeof z - strlen(z), " hsdp %dx%d", m->dp / m->fsdp, m->fsdp);
  char c[32] = "", e[24] = "";
  if (m->cp > 1)
    snprintf(c, sizeof c, " x cp %d%s", m->cp, m->cp_mode == WF_CP_ALLGATHER ? " all-gather" : "");
  if (m->ep > 1) /* inside dp */
    snprintf(e, sizeof e, " (ep %d)", m->ep);
  snprintf(buf, len, "dp %d%s x tp %d x pp %d%s, %s%s, %d x %d rows, %s%s%s, %s", m->dp, e, m->tp,
           m->pp, c, m->pp > 1 ? wf_schedule_kind_str(m->kind) : "-", v, m->M, m->B, z,
           m->sp ? ", sp" : "",
           m->recompute == WF_RECOMPUTE_FULL        ? ", recompute"
           : m->recompute == WF_RECOMPUTE_SELECTIVE ? ", selective recompute"
                                                    : "",
           prec_name(m->prec));
}

double wf__plan_mem_limit(const wf_hw *hw, const wf_plan_cli *cli, int world)
{
  if (cli->device_mem_gib > 0)
    return cli->device_mem_gib * GIB;
  int per_node = WF_MIN(world, WF_MAX(1, hw->gpus_per_node));
  return hw->gpu ? hw->mem_bytes : hw->mem_bytes / per_node; /* CPU ranks share the host */
}

wf_status wf__plan_hw(const wf_config *cfg, const wf_plan_cli *cli, int world, wf_hw *hw, char *err,
                      size_t len)
{
  wf_status st = WF_OK;
  if (cli->hw) {
    st = wf_hw_load(cli->hw, hw, err, len);
  } else {
    wf_model_dims d = wf_model_dims_from_config(cfg);
    int T = cfg->train.seq_len > 0 ? cfg->train.seq_len : cfg->model.seq_len;
    st = wf__plan_measure(&d, cfg->train.batch_size * T, T, world, hw);
    if (st != WF_OK)
      snprintf(err, len, "measuring this machine failed (%s)", wf_status_str(st));
  }
  if (st == WF_OK && cli->gpus_per_node > 0)
    hw->gpus_per_node = cli->gpus_per_node;
  return st;
}

/* ---- --estimate ----------------------------------------------------------------------- */

static void print_stage_row(FILE *out, int r, const wf_plan_stage_mem *sm)
{
  fprintf(out, "%5d  [%3d,%3d)%s", r, sm->l0, sm->l1, sm->chunks > 1 ? "+" : " ");
  for (int i = 0; i < WF_PM_N; i++)
    fprintf(out, " %9.2f", sm->bytes[i] / MIB);
  fprintf(out, " %10.2f %5d\n", sm->total / MIB, sm->slots);
}

static void print_time(FILE *out, const wf_plan_time *t)
{
  fprintf(out,
          "step time (ms): compute %.1f, tp comm %.1f, pp comm %.1f, bubble %.1f (simulated "
          "schedule idle %.1f%%), dp comm %.1f of which exposed %.1f, optimizer %.1f\n"
          "  = %.1f ms per step, %.0f tokens/s\n",
          t->compute * 1e3, t->tp_comm * 1e3, t->pp_comm * 1e3, t->bubble * 1e3,
          t->sim_bubble * 100, t->dp_comm * 1e3, t->dp_exposed * 1e3, t->optim * 1e3, t->step * 1e3,
          t->tokens_per_s);
  if (t->cp_comm > 0)
    fprintf(out,
            "  cp comm (keys and values) %.1f ms, of which exposed %.1f (%.1f%% of the step)\n",
            t->cp_comm * 1e3, t->cp_exposed * 1e3, 100 * t->cp_exposed / t->step);
  if (t->ep_comm > 0)
    fprintf(out,
            "  ep comm (the tokens' all-to-alls, in compute's stages) %.1f ms (%.1f%% of the "
            "step)\n",
            t->ep_comm * 1e3, 100 * t->ep_comm / t->step);
}

static json_t *time_json(const wf_plan_time *t)
{
  return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                   "compute_ms", t->compute * 1e3, "tp_comm_ms", t->tp_comm * 1e3, "pp_comm_ms",
                   t->pp_comm * 1e3, "bubble_ms", t->bubble * 1e3, "schedule_idle", t->sim_bubble,
                   "dp_comm_ms", t->dp_comm * 1e3, "dp_exposed_ms", t->dp_exposed * 1e3, "optim_ms",
                   t->optim * 1e3, "step_ms", t->step * 1e3, "tokens_per_s", t->tokens_per_s,
                   "cp_comm_ms", t->cp_comm * 1e3, "cp_exposed_ms", t->cp_exposed * 1e3,
                   "ep_comm_ms", t->ep_comm * 1e3);
}

static json_t *mesh_json(const wf_plan_mesh *m)
{
  char keys[512];
  wf__plan_keys(m, keys, sizeof keys);
  return json_pack(
      "{s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:b, s:b, s:s, s:s, s:s, s:i, s:s, s:i}",
      "dp", m->dp, "tp", m->tp, "pp", m->pp, "microbatches", m->M, "micro_batch_rows", m->B,
      "seq_len", m->T, "schedule", wf_schedule_kind_str(m->kind), "virtual_stages", m->v, "zero",
      m->zero, "fsdp", m->fsdp, "reshard_after_forward", !m->keep, "sequence", m->sp, "recompute",
      recompute_name(m->recompute), "precision", prec_name(m->prec), "keys", keys, "cp",
      m->cp > 1 ? m->cp : 1, "cp_mode", m->cp_mode == WF_CP_ALLGATHER ? "allgather" : "ring", "ep",
      m->ep > 1 ? m->ep : 1);
}

static json_t *stage_json(int r, const wf_plan_stage_mem *sm)
{
  json_t *b = json_object();
  for (int i = 0; i < WF_PM_N; i++)
    json_object_set_new(b, wf_plan_mem_kind_name((wf_plan_mem_kind)i),
                        json_integer((json_int_t)sm->bytes[i]));
  return json_pack("{s:i, s:[i, i], s:i, s:o, s:I, s:i, s:I, s:I}", "stage", r, "layers", sm->l0,
                   sm->l1, "chunks", sm->chunks, "bytes", b, "total_bytes", (json_int_t)sm->total,
                   "slots", sm->slots, "params", (json_int_t)sm->params, "act_bytes",
                   (json_int_t)sm->act);
}

static void dump_json(FILE *out, json_t *o)
{
  char *text = json_dumps(o, JSON_INDENT(2));
  if (text)
    fprintf(out, "%s\n", text);
  free(text);
  json_decref(o);
}

static int estimate_out(const wf_config *cfg, const wf_plan_cli *cli, const wf_hw *hw,
                        const wf_plan_mesh *m, FILE *out)
{
  wf_model_dims d = wf_model_dims_from_config(cfg);
  const wf_kset *k = wf__plan_kernels(hw);
  wf_plan_time t;
  char desc[256];
  json_t *stages = json_array();
  size_t peak = 0;
  if (wf_plan_time_get(&d, m, hw, &t) != WF_OK)
    return 1;
  wf__plan_describe(m, desc, sizeof desc);
  if (!cli->json) {
    fprintf(out, "estimate: %s, seq %d, on %s\n", desc, m->T, hw->name);
    fprintf(out, "memory per rank (MiB; dp rank 0, which holds the largest ZeRO shard):\n"
                 "stage  layers     params     grads     optim      acts      comm     other "
                 "     total slots\n");
  }
  for (int r = 0; r < m->pp; r++) {
    wf_plan_stage_mem sm;
    if (wf_plan_stage_mem_get(&d, m, r, 0, k, &sm) != WF_OK) {
      json_decref(stages);
      return 1;
    }
    peak = WF_MAX(peak, sm.total);
    if (cli->json)
      json_array_append_new(stages, stage_json(r, &sm));
    else
      print_stage_row(out, r, &sm);
  }
  if (!cli->json) {
    fprintf(out, "peak %.2f MiB per rank (%.3f GiB); limit %.2f GiB per rank on %s\n", peak / MIB,
            peak / GIB,
            wf__plan_mem_limit(hw, cli, m->dp * m->tp * m->pp * (m->cp > 1 ? m->cp : 1)) / GIB,
            hw->name);
    print_time(out, &t);
    json_decref(stages);
    return 0;
  }
  dump_json(out,
            json_pack("{s:o, s:s, s:o, s:I, s:o}", "mesh", mesh_json(m), "hw", hw->name, "stages",
                      stages, "peak_bytes", (json_int_t)peak, "time", time_json(&t)));
  return 0;
}

int wf_plan_estimate(const wf_config *cfg, const wf_plan_cli *cli, FILE *out)
{
  wf_plan_mesh m;
  wf_hw hw;
  char err[1024] = "";
  int world = wf_plan_world(cfg);
  if (wf_plan_mesh_from_config(cfg, world, &m) != WF_OK)
    return 1;
  if (wf__plan_hw(cfg, cli, world, &hw, err, sizeof err) != WF_OK) {
    fprintf(stderr, "weft: error: %s\n", err);
    return 1;
  }
  return estimate_out(cfg, cli, &hw, &m, out);
}

/* ---- --check-estimate ------------------------------------------------------------------ */

void wf_plan_rss_read(wf_plan_rss *r, struct wf_gpu *gpu)
{
  char line[256];
  size_t free_b = 0, total = 0;
  FILE *f = fopen("/proc/self/status", "r");
  r->rss_kb = r->hwm_kb = -1;
  r->gpu = gpu;
  r->dev_used = gpu && wf_gpu_mem_info(gpu, &free_b, &total) == WF_OK
                    ? (long long)total - (long long)free_b
                    : -1;
  while (f && fgets(line, sizeof line, f)) {
    if (!strncmp(line, "VmRSS:", 6))
      r->rss_kb = strtol(line + 6, NULL, 10);
    else if (!strncmp(line, "VmHWM:", 6))
      r->hwm_kb = strtol(line + 6, NULL, 10);
  }
  if (f)
    fclose(f);
}

void wf_plan_check_print(const wf_config *cfg, int pp_rank, int dp_rank, int rank,
                         const struct wf_kset *k, const wf_plan_rss *base, long long reported,
                         FILE *out)
{
  wf_plan_mesh m;
  wf_plan_stage_mem sm;
  wf_plan_rss now;
  wf_model_dims d = wf_model_dims_from_config(cfg);
  wf_plan_rss_read(&now, base->gpu);
  int world = cfg->mesh.dp * cfg->mesh.tp * cfg->mesh.pp * cfg->mesh.cp;
  if (wf_plan_mesh_from_config(cfg, world, &m) != WF_OK ||
      wf_plan_stage_mem_get(&d, &m, pp_rank, dp_rank, k, &sm) != WF_OK)
    return;
  double pred = (double)sm.total;
  fprintf(out,
          "estimate check: rank %d stage %d dp %d predicted %zu bytes, reported %lld (%+.3f%%), ",
          rank, pp_rank, dp_rank, sm.total, reported,
          100.0 * (pred - (double)reported) / (double)reported);
  if (base->dev_used >= 0 && now.dev_used >= 0) {
    double used = (double)(now.dev_used - base->dev_used);
    fprintf(out, "device used growth %.0f (%+.2f%%)\n", used, 100.0 * (pred - used) / used);
  } else {
    /* rss growth is the steady state after the step, hwm growth the peak since set-up
     * began: their ratio says how far set-up or the step rose above it */
    double rss = (now.rss_kb - base->rss_kb) * 1024.0, hwm = (now.hwm_kb - base->hwm_kb) * 1024.0;
    fprintf(out, "rss growth %.0f (%+.2f%%), hwm growth %.0f (%+.2f%%), peak/steady %.3f\n", rss,
            100.0 * (pred - rss) / rss, hwm, 100.0 * (pred - hwm) / hwm, hwm / rss);
  }
  fflush(out);
}
