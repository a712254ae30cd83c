/*
 * metrics.c - Prometheus's GET /metrics on the HTTP listener (runtime.metrics_port,
 * http.c): the job's and every rank's figures in Prometheus's text format. It exposes
 * no token-protected data (job-level numbers, per-rank heartbeat age, times and memory),
 * so it is open to scrapers, as Prometheus expects.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_int.h"
#include "wf_build_config.h"

wf_status wf__metrics_start(wf_service *svc)
{
  int rc = wf__listen_tcp(svc, &svc->http, svc->metrics_port, 16);
  svc->have_http = svc->http.data == svc; /* initialised, so it must be closed */
  if (rc < 0) {
    WF_WARN("control: cannot serve metrics on %s:%d: %s; choose another port with "
            "runtime.metrics_port=... or address with runtime.listen_addr=...",
            svc->bind_addr, svc->metrics_port, uv_strerror(rc));
    return WF_EUV;
  }
  return WF_OK;
}

/* The exposition text, grown as needed. */
typedef struct text {
  char *buf;
  size_t len, cap;
  bool oom;
} text;

static void out(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(text *t, const char *fmt, ...)
{
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = t->oom ? 0 : vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (t->oom || n < 0)
      return;
    if ((size_t)n < t->cap - t->len) {
      t->len += (size_t)n;
      return;
    }
    char *grown = realloc(t->buf, t->cap * 2 + (size_t)n);
    if (!grown) {
      t->oom = true;
      return;
    }
    t->buf = grown;
    t->cap = t->cap * 2 + (size_t)n;
  }
}

static void family(text *t, const char *name, const char *type, const char *help)
{
  out(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One job-level sample; a figure not known yet (NaN) is left out. */
static void job_sample(text *t, const wf_service *svc, const char *name, const char *type,
                       const char *help, double v)
{
  family(t, name, type, help);
  if (isfinite(v))
    out(t, "%s{job_id=\"%s\"} %.17g\n", name, svc->job_id, v);
}

static const char *job_state(const wf_service *svc)
{
  if (svc->aborted)
    return "aborted";
  if (svc->shutting_down)
    return "stopping";
  if (svc->registered < svc->world)
    return "registering";
  return "running";
}

static void job_series(text *t, wf_service *svc)
{
  static const char *const states[] = {"registering", "running", "stopping", "aborted"};
  const wf_step_report *j = &svc->job;
  int alive = 0;
  for (int i = 0; i < svc->world; i++)
    alive += svc->ranks[i].state == WF__RANK_ALIVE;
  family(t, "weft_build_info", "gauge", "weft's version; always 1");
  out(t, "weft_build_info{job_id=\"%s\",version=\"%s\"} 1\n", svc->job_id, WF_VERSION);
  family(t, "weft_job_state", "gauge", "1 for the job's current state, 0 for the others");
  pthread_mutex_lock(&svc->lock);
  const char *now_state = job_state(svc);
  pthread_mutex_unlock(&svc->lock);
  for (size_t i = 0; i < WF_ARRAY_LEN(states); i++)
    out(t, "weft_job_state{job_id=\"%s\",state=\"%s\"} %d\n", svc->job_id, states[i],
        strcmp(states[i], now_state) == 0);
  job_sample(t, svc, "weft_world_size", "gauge", "ranks (GPUs or CPU processes) in the job",
             svc->world);
  job_sample(t, svc, "weft_ranks_alive", "gauge", "ranks registered and heartbeating", alive);
  int64_t done = j->step > 0 ? j->step : 0;
  job_sample(t, svc, "weft_steps_total", "counter", "training steps completed", (double)done);
  job_sample(t, svc, "weft_target_steps", "gauge", "train.steps: the step the run ends at",
             j->steps > 0 ? (double)j->steps : NAN);
  job_sample(t, svc, "weft_tokens_total", "counter", "tokens trained on (steps x global batch)",
             isfinite(j->tokens) ? j->tokens * (double)done : 0.0);
  job_sample(t, svc, "weft_skipped_steps_total", "counter",
             "fp16 steps skipped for a gradient overflow", (double)j->skipped_steps);
  job_sample(t, svc, "weft_checkpoints_total", "counter", "checkpoints written by this run",
             (double)j->checkpoints);
}

static void job_training_series(text *t, wf_service *svc)
{
  const wf_step_report *j = &svc->job;
  int world = j->world_size > 0 ? j->world_size : svc->world;
  double eta = j->steps > 0 && j->step >= 0 && isfinite(j->step_ms)
                   ? (double)(j->steps - j->step) * j->step_ms / 1000.0
                   : NAN;
  job_sample(t, svc, "weft_loss", "gauge", "training loss of the last step (nats per token)",
             j->loss);
  job_sample(t, svc, "weft_val_loss", "gauge", "loss of the last evaluation (nats per token)",
             j->val_loss);
  job_sample(t, svc, "weft_grad_norm", "gauge", "global gradient norm of the last step",
             j->grad_norm);
  job_sample(t, svc, "weft_learning_rate", "gauge", "learning rate of the last step", j->lr);
  job_sample(t, svc, "weft_loss_scale", "gauge", "fp16 loss scale (precision=fp16 only)",
             j->loss_scale);
  job_sample(t, svc, "weft_mfu_ratio", "gauge",
             "model FLOP utilisation of the last step, 0-1 (achieved / peak of all ranks)", j->mfu);
  job_sample(t, svc, "weft_tokens_per_second_per_gpu", "gauge",
             "tokens per second of the last step, per rank (GPU)", j->tokens_per_s / world);
  job_sample(t, svc, "weft_step_seconds", "gauge", "wall time of the last step",
             j->step_ms / 1000.0);
  job_sample(t, svc, "weft_checkpoint_age_seconds", "gauge",
             "seconds since the last checkpoint this run wrote ended",
             j->ckpt_wall > 0 ? wf_wall_time() - j->ckpt_wall : NAN);
  job_sample(t, svc, "weft_eta_seconds", "gauge",
             "estimated seconds to the last step, at the last step's pace", eta);
}

/* The model's named figures of the last step (a mixture of experts' router/aux_loss,
 * ...) as gauges weft_<name>, '/' read as '_'. */
static void job_figure_series(text *t, wf_service *svc)
{
  const wf_step_report *j = &svc->job;
  for (int i = 0; i < j->n_figures && i < WF_STEP_FIGURES; i++) {
    char name[64], help[128];
    snprintf(name, sizeof name, "weft_%s", j->figures[i].name);
    for (char *p = name; *p; p++)
      if (*p == '/')
        *p = '_';
    snprintf(help, sizeof help, "the model's figure %s of the last step (as the metrics file's)",
             j->figures[i].name);
    job_sample(t, svc, name, "gauge", help, j->figures[i].value);
  }
}

typedef struct rank_metric {
  const char *name, *type, *help;
  double (*get)(const wf__rank *r, double now);
} rank_metric;

static double r_step(const wf__rank *r, double now) { return r->rep.step_ms / 1000.0; }
static double r_compute(const wf__rank *r, double now) { return r->rep.compute_s; }
static double r_p2p(const wf__rank *r, double now) { return r->rep.p2p_wait_s; }
static double r_tp(const wf__rank *r, double now) { return r->rep.tp_s; }
static double r_dp(const wf__rank *r, double now) { return r->rep.dp_s; }
static double r_bubble(const wf__rank *r, double now) { return r->rep.bubble; }
static double r_act(const wf__rank *r, double now) { return (double)r->rep.act_bytes; }
static double r_optim(const wf__rank *r, double now) { return (double)r->rep.optim_bytes; }
static double r_param(const wf__rank *r, double now) { return (double)r->rep.param_bytes; }
static double r_grad(const wf__rank *r, double now) { return (double)r->rep.grad_bytes; }
static double r_mem(const wf__rank *r, double now) { return (double)r->mem_bytes; }
static double r_rss(const wf__rank *r, double now) { return (double)r->rss_bytes; }
static double r_cpu(const wf__rank *r, double now) { return r->cpu_s; }
static double r_up(const wf__rank *r, double now) { return r->state == WF__RANK_ALIVE; }
static double r_rtt(const wf__rank *r, double now) { return r->rtt_ms / 1000.0; }
static double r_hb(const wf__rank *r, double now)
{
  return r->state == WF__RANK_WAITING ? NAN : (now - r->t_heartbeat) / 1000.0;
}

/* Per-rank series; a rank that has not reported a step yet has no step figures. */
static const rank_metric rank_metrics[] = {
    {"weft_rank_up", "gauge", "1 while the rank is registered and heartbeating", r_up},
    {"weft_rank_heartbeat_age_seconds", "gauge", "seconds since the rank's last heartbeat", r_hb},
    {"weft_rank_control_rtt_seconds", "gauge",
     "round trip of the control plane between rank 0's host and the rank's", r_rtt},
    {"weft_rank_step_seconds", "gauge", "wall time of the rank's last step", r_step},
    {"weft_rank_compute_seconds", "gauge", "forward + backward compute in the rank's last step",
     r_compute},
    {"weft_rank_p2p_wait_seconds", "gauge",
     "waiting in pipeline sends and receives in the rank's last step", r_p2p},
    {"weft_rank_tp_seconds", "gauge", "in tensor-parallel collectives in the rank's last step",
     r_tp},
    {"weft_rank_dp_seconds", "gauge",
     "data-parallel gradient communication not hidden behind backward in the last step", r_dp},
    {"weft_rank_bubble_ratio", "gauge",
     "pipeline idle share of the last step, 0-1 (1 - mean busy / longest stage)", r_bubble},
    {"weft_rank_activation_bytes", "gauge", "peak activations held by the rank's pipeline stage",
     r_act},
    {"weft_rank_optimizer_bytes", "gauge", "AdamW state the rank holds", r_optim},
    {"weft_rank_parameter_bytes", "gauge",
     "parameters the rank holds (their GEMM copy and ZeRO's gather buffer or shard)", r_param},
    {"weft_rank_gradient_bytes", "gauge", "gradients the rank holds and the dp reduction's buffers",
     r_grad},
    {"weft_rank_memory_bytes", "gauge",
     "memory the rank holds through weft's allocator (host + device)", r_mem},
    {"weft_rank_resident_memory_bytes", "gauge", "the rank process's resident set size", r_rss},
    {"weft_rank_cpu_seconds_total", "counter", "user + system CPU seconds of the rank process",
     r_cpu},
};

static void rank_series(text *t, wf_service *svc, double now)
{
  for (size_t m = 0; m < WF_ARRAY_LEN(rank_metrics); m++) {
    const rank_metric *rm = &rank_metrics[m];
    bool step_figure = rm->get != r_up && rm->get != r_hb && rm->get != r_rss && rm->get != r_cpu &&
                       rm->get != r_mem;
    family(t, rm->name, rm->type, rm->help);
    for (int i = 0; i < svc->world; i++) {
      const wf__rank *r = &svc->ranks[i];
      double v = rm->get(r, now);
      if (!isfinite(v) || (step_figure && r->rep.step < 0))
        continue;
      out(t, "%s{job_id=\"%s\",rank=\"%d\",pp=\"%d\",dp=\"%d\",tp=\"%d\"} %.17g\n", rm->name,
          svc->job_id, i, r->facts.coords.pp, r->facts.coords.dp, r->facts.coords.tp, v);
    }
  }
}

/* Prometheus text format 0.0.4: every family has HELP and TYPE, counters end in
 * _total, the job is labelled job_id (Prometheus owns `job`). A malloc()ed string. */
static char *metrics_text(wf_service *svc, size_t *len)
{
  text t = {.cap = 8192};
  t.buf = malloc(t.cap);
  if (!t.buf)
    return NULL;
  job_series(&t, svc);
  job_training_series(&t, svc);
  job_figure_series(&t, svc);
  rank_series(&t, svc, wf__now_ms());
  if (t.oom) {
    free(t.buf);
    return NULL;
  }
  *len = t.len;
  return t.buf;
}

void wf__metrics_serve(wf__conn *c)
{
  size_t n = 0;
  char *body = metrics_text(c->svc, &n);
  if (!body) {
    wf__conn_close(c);
    return;
  }
  wf__http_respond(c, "200 OK", "text/plain; version=0.0.4", "", body, n);
  free(body);
}
