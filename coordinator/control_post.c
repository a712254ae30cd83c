/*
 * control_post.c - what the training loop posts to the control client (control.c): step
 * reports, an error, the phase and collective, the trace and collective callbacks, and
 * the close (Bye). Posting takes `lock` and wakes the control thread (`async`), which
 * sends; the loop never waits on the network, except for an error, a bounded time.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "control_int.h"

/* ---- posted work (async) ------------------------------------------------------------ */

typedef struct sent_req {
  uv_write_t req;
  uint8_t *frame;
  wf_control *c;
  bool is_error, is_bye;
} sent_req;

static void on_posted_sent(uv_write_t *req, int status)
{
  sent_req *r = (sent_req *)req;
  wf_control *c = r->c;
  if (r->is_error) {
    pthread_mutex_lock(&c->lock);
    c->error_sent = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
  }
  if (r->is_bye)
    wf__control_close_all(c);
  free(r->frame);
  free(r);
}

/* Send with a completion callback; false when it could not be queued. */
static bool send_tracked(wf_control *c, Weft__Envelope *env, bool is_error, bool is_bye)
{
  size_t len;
  sent_req *r = calloc(1, sizeof *r);
  if (!r || !c->welcomed || uv_is_closing(&c->sock.h) ||
      wf_proto_encode(env, &r->frame, &len) != WF_OK)
    goto fail;
  r->c = c;
  r->is_error = is_error;
  r->is_bye = is_bye;
  uv_buf_t buf = uv_buf_init((char *)r->frame, (unsigned)len);
  if (uv_write(&r->req, &c->sock.s, &buf, 1, on_posted_sent) == 0)
    return true;
fail:
  if (r)
    free(r->frame);
  free(r);
  return false;
}

static void on_close_timer(uv_timer_t *t) { wf__control_close_all(t->data); }

/* The message of a report; its figures point into f and fp (WF_STEP_FIGURES each). */
static void report_to_proto(const wf_step_report *r, Weft__StepReport *sr, Weft__Figure *f,
                            Weft__Figure **fp)
{
  *sr = (Weft__StepReport)WEFT__STEP_REPORT__INIT;
  sr->step = r->step;
  sr->loss = r->loss;
  sr->tokens_per_s = r->tokens_per_s;
  sr->step_ms = r->step_ms;
  sr->mem_bytes = r->mem_bytes;
  sr->steps = r->steps;
  sr->tokens = r->tokens;
  sr->world_size = r->world_size;
  sr->lr = r->lr;
  sr->grad_norm = r->grad_norm;
  sr->val_loss = r->val_loss;
  sr->loss_scale = r->loss_scale;
  sr->mfu = r->mfu;
  sr->compute_s = r->compute_s;
  sr->p2p_wait_s = r->p2p_wait_s;
  sr->tp_s = r->tp_s;
  sr->dp_s = r->dp_s;
  sr->bubble = r->bubble;
  sr->act_bytes = r->act_bytes;
  sr->optim_bytes = r->optim_bytes;
  sr->param_bytes = r->param_bytes;
  sr->grad_bytes = r->grad_bytes;
  sr->skipped_steps = r->skipped_steps;
  sr->ckpt_wall = r->ckpt_wall;
  sr->checkpoints = r->checkpoints;
  int n = WF_MIN(r->n_figures, WF_STEP_FIGURES);
  for (int i = 0; i < n; i++) {
    f[i] = (Weft__Figure)WEFT__FIGURE__INIT;
    f[i].name = (char *)r->figures[i].name, f[i].value = r->figures[i].value;
    fp[i] = &f[i];
  }
  sr->n_figures = (size_t)n, sr->figures = n ? fp : NULL;
}

/* Send the queued step reports, oldest first. */
static void send_reports(wf_control *c, const wf_step_report *q, int n)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Figure f[WF_STEP_FIGURES], *fp[WF_STEP_FIGURES];
  bool sent = true;
  for (int i = 0; i < n && sent; i++) {
    Weft__StepReport sr;
    report_to_proto(&q[i], &sr, f, fp);
    env.msg_case = WEFT__ENVELOPE__MSG_STEP_REPORT;
    env.step_report = &sr;
    sent = send_tracked(c, &env, false, false);
  }
  if (n > 0 && sent)
    wf__control_send_heartbeat(
        c); /* so the registry's phase and collective are as fresh as the step */
}

void wf__control_on_async(uv_async_t *a)
{
  wf_control *c = a->data;
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  static _Thread_local wf_step_report q[WF__REPORTS_QUEUED]; /* 72 KiB: not on the loop's stack */
  Weft__Error err = WEFT__ERROR__INIT;
  char msg[512];
  pthread_mutex_lock(&c->lock);
  bool error = c->error_pending, closing = c->closing;
  int n = c->n_reports;
  for (int i = 0; i < n; i++)
    q[i] = c->reports[(c->report_head + i) % WF__REPORTS_QUEUED];
  c->n_reports = 0;
  err.code = c->err_code;
  wf_strlcpy(msg, c->err_msg, sizeof msg);
  c->error_pending = false;
  pthread_mutex_unlock(&c->lock);
  if (c->closed)
    return;
  send_reports(c, q, n);
  if (error) {
    err.message = msg;
    env.msg_case = WEFT__ENVELOPE__MSG_ERROR;
    env.error = &err;
    if (!send_tracked(c, &env, true, false)) {
      pthread_mutex_lock(&c->lock);
      c->error_sent = true; /* nothing will be sent: do not make the caller wait */
      pthread_cond_broadcast(&c->cond);
      pthread_mutex_unlock(&c->lock);
    }
  }
  if (closing) {
    Weft__Bye bye = WEFT__BYE__INIT;
    env.msg_case = WEFT__ENVELOPE__MSG_BYE;
    env.bye = &bye;
    uv_timer_stop(&c->timer);
    uv_timer_stop(&c->silence_timer);
    if (!send_tracked(c, &env, false, true))
      wf__control_close_all(c);
    else
      uv_timer_start(&c->close_timer, on_close_timer, 1000, 0);
  }
}

void wf_control_report_step(wf_control *c, int64_t step, double loss, double tokens_per_s,
                            double step_ms, uint64_t mem_bytes)
{
  wf_step_report r = wf__step_report_none();
  r.step = step, r.loss = loss, r.tokens_per_s = tokens_per_s, r.step_ms = step_ms;
  r.mem_bytes = mem_bytes;
  wf_control_report(c, &r);
}

void wf_control_report(wf_control *c, const wf_step_report *r)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->lock);
  if (c->n_reports == WF__REPORTS_QUEUED) { /* the control thread is far behind: drop the oldest */
    c->report_head = (c->report_head + 1) % WF__REPORTS_QUEUED;
    c->n_reports--;
  }
  c->reports[(c->report_head + c->n_reports++) % WF__REPORTS_QUEUED] = *r;
  c->step = r->step;
  c->mem_bytes = r->mem_bytes;
  pthread_mutex_unlock(&c->lock);
  uv_async_send(&c->async);
}

void wf_control_set_phase(wf_control *c, const char *phase)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->lock);
  wf_strlcpy(c->phase, phase ? phase : "", sizeof c->phase);
  pthread_mutex_unlock(&c->lock);
}

void wf_control_set_collective(wf_control *c, uint64_t seq, const char *op, bool active)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->lock);
  c->coll_seq = seq;
  wf_strlcpy(c->coll_op, op ? op : "", sizeof c->coll_op);
  c->coll_active = active;
  pthread_mutex_unlock(&c->lock);
}

void wf_control_set_collective_fn(wf_control *c, wf_control_collective_fn fn, void *user)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->lock);
  c->coll_fn = fn;
  c->coll_user = user;
  pthread_mutex_unlock(&c->lock);
}

void wf_control_set_trace_fn(wf_control *c, wf_control_trace_fn fn, void *user)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->lock);
  c->trace_fn = fn;
  c->trace_user = user;
  pthread_mutex_unlock(&c->lock);
}

void wf_control_report_error(wf_control *c, wf_status code, const char *message, int wait_ms)
{
  if (!c)
    return;
  struct timespec ts;
  pthread_mutex_lock(&c->lock);
  c->err_code = (int)code;
  wf_strlcpy(c->err_msg, message ? message : wf_status_str(code), sizeof c->err_msg);
  c->error_pending = true;
  c->error_sent = false;
  pthread_mutex_unlock(&c->lock);
  uv_async_send(&c->async);
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += wait_ms / 1000;
  ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&c->lock);
  while (!c->error_sent && wait_ms > 0)
    if (pthread_cond_timedwait(&c->cond, &c->lock, &ts) != 0)
      break;
  pthread_mutex_unlock(&c->lock);
}

bool wf_control_stop_requested(wf_control *c) { return c && atomic_load(&c->stop_req); }
bool wf_control_checkpoint_requested(wf_control *c)
{
  return c && atomic_exchange(&c->ckpt_req, false);
}
