/*
 * registry.c - what the service (service.c) does with each message: a worker's Hello
 * (authenticated, then registered), heartbeats, step reports (the job's figures) and
 * errors; a console's queries and commands (STOP, CHECKPOINT, TRACE). Loop thread only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_int.h"

static void send_welcome(wf__conn *c)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Welcome w = WEFT__WELCOME__INIT;
  w.job_id = c->svc->job_id;
  w.world_size = c->svc->world;
  w.heartbeat_ms = (uint32_t)c->svc->heartbeat_ms;
  w.silence_ms = (uint32_t)(c->svc->dead_after_ms + c->svc->heartbeat_ms);
  w.host = (char *)wf_rt_host();
  w.pid = (int32_t)getpid();
  env.msg_case = WEFT__ENVELOPE__MSG_WELCOME;
  env.welcome = &w;
  wf__conn_send(c, &env);
}

static void facts_from_hello(wf__rank *r, const Weft__Hello *h)
{
  wf_rank_facts *f = &r->facts;
  f->rank = h->rank;
  f->local_rank = h->local_rank;
  f->pid = h->pid;
  f->threads = h->threads;
  f->coords.pp = h->pp;
  f->coords.dp = h->dp;
  f->coords.tp = h->tp;
  f->coords.cp = h->cp;
  wf__sanitize(f->host, sizeof f->host, h->host);
  wf__sanitize(f->device, sizeof f->device, h->device);
  wf__sanitize(f->binding, sizeof f->binding, h->binding);
  wf__sanitize(r->stage, sizeof r->stage, h->stage);
}

static void register_worker(wf__conn *c, const Weft__Hello *h)
{
  wf_service *svc = c->svc;
  char msg[256];
  if (h->rank < 0 || h->rank >= svc->world) {
    snprintf(msg, sizeof msg, "rank %d is outside this job of %d ranks", h->rank, svc->world);
    wf__conn_reject(c, msg);
    return;
  }
  wf__rank *r = &svc->ranks[h->rank];
  if (r->state != WF__RANK_WAITING) {
    snprintf(msg, sizeof msg, "rank %d has already registered with this job", h->rank);
    wf__conn_reject(c, msg);
    return;
  }
  facts_from_hello(r, h);
  r->state = WF__RANK_ALIVE;
  r->conn = c;
  r->t_hello = r->t_heartbeat = r->t_change = wf__now_ms();
  c->role = WF__CONN_WORKER;
  c->rank = h->rank;
  send_welcome(c);
  if (++svc->registered == svc->world) {
    svc->t_progress = wf__now_ms();
    WF_INFO("control: all %d ranks registered with job %s", svc->world, svc->job_id);
  }
}

static void on_hello(wf__conn *c, const Weft__Hello *h)
{
  wf_service *svc = c->svc;
  /* On TCP the token is the only credential; on the Unix socket the kernel already
   * vouched for the peer's uid, and a token, when sent, must still be right. */
  bool token_ok = wf__ct_streq(h->token, svc->token);
  long more = 0;
  if (!token_ok && (!c->is_unix || h->token[0])) {
    if (wf__ratelimit_ok(&svc->rl_auth, wf__now_ms(), &more))
      WF_WARN("control: rejected a connection with a %s token (%ld more rejected since the "
              "last such line; logged at most every %d s)",
              h->token[0] ? "wrong" : "missing", more, WF__LOG_EVERY_MS / 1000);
    wf__conn_reject(c, "access denied: missing or wrong job token (see the job file)");
    return;
  }
  if (h->job_id[0] && strcmp(h->job_id, svc->job_id) != 0) {
    wf__conn_reject(c, "this coordinator serves another job");
    return;
  }
  if (h->role == WEFT__HELLO__ROLE__WORKER) {
    register_worker(c, h);
  } else if (h->role == WEFT__HELLO__ROLE__CONSOLE) {
    c->role = WF__CONN_CONSOLE;
    send_welcome(c);
  } else {
    wf__conn_reject(c, "unknown peer role");
  }
}

static void on_heartbeat(wf__conn *c, const Weft__Heartbeat *hb)
{
  wf__rank *r = &c->svc->ranks[c->rank];
  double now = wf__now_ms();
  r->t_heartbeat = now;
  /* Progress is any change of step, phase or collective, not the heartbeat itself. */
  if (hb->step != r->step || hb->coll_seq != r->coll_seq || strcmp(hb->phase, r->phase) != 0 ||
      hb->coll_active != r->coll_active) {
    r->t_change = now;
    c->svc->t_progress = now;
  }
  r->step = hb->step;
  r->coll_seq = hb->coll_seq;
  r->coll_active = hb->coll_active;
  r->mem_bytes = hb->mem_bytes;
  r->rss_bytes = hb->rss_bytes;
  r->gpu = hb->gpu;
  r->gpu_util_pct = (int)hb->gpu_util_pct;
  r->gpu_mem_used = hb->gpu_mem_used;
  r->gpu_mem_total = hb->gpu_mem_total;
  /* CPU% over the interval since the last heartbeat that carried it (100 = one core) */
  if (r->t_cpu > 0 && now > r->t_cpu && hb->cpu_s >= r->cpu_s)
    r->cpu_pct = 100.0 * (hb->cpu_s - r->cpu_s) / ((now - r->t_cpu) / 1000.0);
  r->cpu_s = hb->cpu_s;
  r->t_cpu = now;
  /* The round trip of our stamp, less the time the worker held it (one clock), smoothed
   * as TCP smooths its RTT (RFC 6298), with a gain of 1/4 rather than 1/8 as there is one
   * sample a second: one quiet moment on a busy link does not hide it. */
  double rtt = now - hb->echo_ms - hb->echo_held_ms;
  if (hb->echo_ms > 0 && rtt >= 0)
    r->rtt_ms = isnan(r->rtt_ms) ? rtt : 0.75 * r->rtt_ms + 0.25 * rtt;
  wf__sanitize(r->phase, sizeof r->phase, hb->phase);
  wf__sanitize(r->coll_op, sizeof r->coll_op, hb->coll_op);
}

/* A figure's name as /metrics may print it: letters, digits, '_' and '/', else '_'. */
static void figure_name(char *dst, size_t len, const char *src)
{
  size_t i = 0;
  for (; src && src[i] && i + 1 < len; i++) {
    char ch = src[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '/';
    dst[i] = ok ? ch : '_';
  }
  dst[i] = '\0';
}

static void report_from_proto(wf_step_report *r, const Weft__StepReport *sr)
{
  *r = (wf_step_report){.step = sr->step,
                        .steps = sr->steps,
                        .loss = sr->loss,
                        .tokens_per_s = sr->tokens_per_s,
                        .step_ms = sr->step_ms,
                        .mem_bytes = sr->mem_bytes,
                        .tokens = sr->tokens,
                        .world_size = sr->world_size,
                        .lr = sr->lr,
                        .grad_norm = sr->grad_norm,
                        .val_loss = sr->val_loss,
                        .loss_scale = sr->loss_scale,
                        .mfu = sr->mfu,
                        .compute_s = sr->compute_s,
                        .p2p_wait_s = sr->p2p_wait_s,
                        .tp_s = sr->tp_s,
                        .dp_s = sr->dp_s,
                        .bubble = sr->bubble,
                        .act_bytes = sr->act_bytes,
                        .optim_bytes = sr->optim_bytes,
                        .param_bytes = sr->param_bytes,
                        .grad_bytes = sr->grad_bytes,
                        .skipped_steps = sr->skipped_steps,
                        .ckpt_wall = sr->ckpt_wall,
                        .checkpoints = sr->checkpoints};
  for (size_t i = 0; i < sr->n_figures && r->n_figures < WF_STEP_FIGURES; i++) {
    const Weft__Figure *f = sr->figures[i];
    if (!f || !f->name || !f->name[0])
      continue;
    wf_step_figure *d = &r->figures[r->n_figures++];
    figure_name(d->name, sizeof d->name, f->name);
    d->value = f->value;
  }
}

#define TAKE(f)                                                                                    \
  do {                                                                                             \
    if (isfinite(r->f))                                                                            \
      j->f = r->f;                                                                                 \
  } while (0)

/* The job's figures: ranks without the loss (pipeline stages before the last) send
 * NaN, so each figure is the newest finite one any rank sent for the newest step. */
static void job_from_report(wf_service *svc, const wf_step_report *r)
{
  wf_step_report *j = &svc->job;
  j->step = r->step;
  j->steps = WF_MAX(j->steps, r->steps);
  j->world_size = r->world_size > 0 ? r->world_size : svc->world;
  TAKE(loss);
  TAKE(tokens_per_s);
  TAKE(step_ms);
  TAKE(tokens);
  TAKE(lr);
  TAKE(grad_norm);
  TAKE(val_loss);
  TAKE(loss_scale);
  TAKE(mfu);
  j->skipped_steps = WF_MAX(j->skipped_steps, r->skipped_steps);
  j->ckpt_wall = WF_MAX(j->ckpt_wall, r->ckpt_wall);
  j->checkpoints = WF_MAX(j->checkpoints, r->checkpoints);
  if (r->n_figures > 0) { /* a model's figures, the same on every rank that has them */
    j->n_figures = r->n_figures;
    memcpy(j->figures, r->figures, sizeof j->figures);
  }
}
#undef TAKE

static void on_step_report(wf__conn *c, const Weft__StepReport *sr)
{
  wf_service *svc = c->svc;
  wf__rank *r = &svc->ranks[c->rank];
  double now = wf__now_ms();
  r->t_heartbeat = r->t_change = svc->t_progress = now;
  r->step = sr->step;
  r->loss = sr->loss;
  r->tokens_per_s = sr->tokens_per_s;
  r->step_ms = sr->step_ms;
  r->mem_bytes = sr->mem_bytes;
  report_from_proto(&r->rep, sr);
  r->reports++;
  if (sr->step >= svc->step) {
    svc->step = sr->step;
    if (sr->loss == sr->loss) /* NaN on ranks without the loss */
      svc->loss = sr->loss;
    if (sr->tokens_per_s > 0)
      svc->tokens_per_s = sr->tokens_per_s;
    if (sr->step_ms > 0)
      svc->step_ms = sr->step_ms;
    job_from_report(svc, &r->rep);
  }
  wf__history_add(svc, &r->rep);
}

static void on_worker_error(wf__conn *c, const Weft__Error *e)
{
  wf__rank *r = &c->svc->ranks[c->rank];
  char reason[512];
  wf__sanitize(r->error, sizeof r->error, e->message);
  snprintf(reason, sizeof reason, "it reported an error: %s", r->error);
  wf__rank_lost(c->svc, c->rank, reason);
}

static void on_worker_msg(wf__conn *c, const Weft__Envelope *env)
{
  switch (env->msg_case) {
  case WEFT__ENVELOPE__MSG_HEARTBEAT: on_heartbeat(c, env->heartbeat); break;
  case WEFT__ENVELOPE__MSG_STEP_REPORT: on_step_report(c, env->step_report); break;
  case WEFT__ENVELOPE__MSG_ERROR: on_worker_error(c, env->error); break;
  case WEFT__ENVELOPE__MSG_TRACE_REPORT: wf__trace_report(c, env->trace_report); break;
  case WEFT__ENVELOPE__MSG_BYE:
    c->svc->ranks[c->rank].state = WF__RANK_EXITED;
    c->svc->t_progress = wf__now_ms();
    break;
  default: wf__conn_reject(c, "unexpected message from a worker"); break;
  }
}

void wf__reply(wf__conn *c, bool ok, const char *json, const char *msg)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Reply r = WEFT__REPLY__INIT;
  r.ok = ok;
  r.json = (char *)(json ? json : "");
  r.message = (char *)(msg ? msg : "");
  env.msg_case = WEFT__ENVELOPE__MSG_REPLY;
  env.reply = &r;
  wf__conn_send(c, &env);
}

bool wf__request(wf_service *svc, int kind, char *msg, size_t len)
{
  bool stop = kind == WEFT__COMMAND__KIND__STOP;
  if (!stop && kind != WEFT__COMMAND__KIND__CHECKPOINT) {
    snprintf(msg, len, "unknown command");
    return false;
  }
  if (!stop && !svc->can_checkpoint) {
    snprintf(msg, len,
             "checkpoint refused: this job has no checkpoint directory; start it with "
             "train.checkpoint_dir=DIR to write checkpoints");
    return false;
  }
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Command fwd = WEFT__COMMAND__INIT;
  fwd.kind = (Weft__Command__Kind)kind;
  env.msg_case = WEFT__ENVELOPE__MSG_COMMAND;
  env.command = &fwd;
  wf__broadcast(svc, &env);
  svc->stop_requested |= stop;
  WF_INFO("control: console requested %s", stop ? "stop" : "a checkpoint");
  snprintf(msg, len, "%s",
           stop ? "stop requested: the job stops at the next step boundary"
                : "checkpoint requested: it is written at the next step boundary");
  return true;
}

static void on_command(wf__conn *c, const Weft__Command *cmd)
{
  char msg[256];
  bool stop = cmd->kind == WEFT__COMMAND__KIND__STOP;
  bool ok = wf__request(c->svc, cmd->kind, msg, sizeof msg);
  wf__reply(c, ok,
            !ok    ? NULL
            : stop ? "{\"requested\":\"stop\"}"
                   : "{\"requested\":\"checkpoint\"}",
            msg);
}

static void on_console_msg(wf__conn *c, const Weft__Envelope *env)
{
  char msg[256] = "";
  if (env->msg_case == WEFT__ENVELOPE__MSG_COMMAND) {
    on_command(c, env->command);
  } else if (env->msg_case == WEFT__ENVELOPE__MSG_QUERY &&
             env->query->kind == WEFT__QUERY__KIND__TRACE) {
    wf__trace_start(c->svc, c);
  } else if (env->msg_case == WEFT__ENVELOPE__MSG_QUERY) {
    char *json = wf__query_json(c->svc, env->query->kind, msg, sizeof msg);
    wf__reply(c, json != NULL, json, msg);
    free(json);
  } else {
    wf__conn_reject(c, "unexpected message from a console");
  }
}

void wf__dispatch(wf__conn *c, const Weft__Envelope *env)
{
  if (c->role == WF__CONN_NEW) {
    if (env->msg_case == WEFT__ENVELOPE__MSG_HELLO)
      on_hello(c, env->hello);
    else
      wf__conn_reject(c, "the first message must be Hello");
  } else if (c->role == WF__CONN_WORKER) {
    on_worker_msg(c, env);
  } else {
    on_console_msg(c, env);
  }
}
