/*
 * fuzz_seeds.c - writes one valid frame of every message type into DIR, the seed
 * corpus for fuzz_proto_decode, so the fuzzer starts from real envelopes instead of
 * having to discover the protobuf layout by chance.
 */
#include <stdio.h>
#include <stdlib.h>

#include "wf_proto.h"

static int write_seed(const char *dir, const char *name, Weft__Envelope *env)
{
  uint8_t *frame;
  size_t len;
  char path[1024];
  if (wf_proto_encode(env, &frame, &len) != WF_OK)
    return 1;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  int bad = !f || fwrite(frame, 1, len, f) != len;
  if (f)
    fclose(f);
  free(frame);
  return bad;
}

int main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  const char *dir = argv[1];
  int bad = 0;
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Hello h = WEFT__HELLO__INIT;
  h.token = "00ff";
  h.host = "node01";
  h.device = "cuda:0";
  h.binding = "cores 0-7";
  h.rank = 3;
  h.stage = "layers 0-5";
  env.msg_case = WEFT__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  bad |= write_seed(dir, "hello", &env);
  Weft__Welcome w = WEFT__WELCOME__INIT;
  w.job_id = "job";
  w.world_size = 8;
  w.heartbeat_ms = 1000;
  w.silence_ms = 3000;
  env.msg_case = WEFT__ENVELOPE__MSG_WELCOME;
  env.welcome = &w;
  bad |= write_seed(dir, "welcome", &env);
  Weft__Heartbeat hb = WEFT__HEARTBEAT__INIT;
  hb.step = 17;
  hb.phase = "forward";
  hb.coll_seq = 99;
  hb.coll_op = "allreduce(dp)";
  hb.coll_active = 1;
  hb.mem_bytes = 1 << 30;
  env.msg_case = WEFT__ENVELOPE__MSG_HEARTBEAT;
  env.heartbeat = &hb;
  bad |= write_seed(dir, "heartbeat", &env);
  Weft__StepReport sr = WEFT__STEP_REPORT__INIT;
  sr.step = 17;
  sr.loss = 3.5;
  sr.tokens_per_s = 1e5;
  sr.step_ms = 120;
  env.msg_case = WEFT__ENVELOPE__MSG_STEP_REPORT;
  env.step_report = &sr;
  bad |= write_seed(dir, "step_report", &env);
  Weft__Error e = WEFT__ERROR__INIT;
  e.code = -3;
  e.message = "disk full";
  env.msg_case = WEFT__ENVELOPE__MSG_ERROR;
  env.error = &e;
  bad |= write_seed(dir, "error", &env);
  Weft__Bye bye = WEFT__BYE__INIT;
  env.msg_case = WEFT__ENVELOPE__MSG_BYE;
  env.bye = &bye;
  bad |= write_seed(dir, "bye", &env);
  Weft__Query q = WEFT__QUERY__INIT;
  q.kind = WEFT__QUERY__KIND__RANKS;
  env.msg_case = WEFT__ENVELOPE__MSG_QUERY;
  env.query = &q;
  bad |= write_seed(dir, "query", &env);
  Weft__Reply r = WEFT__REPLY__INIT;
  r.ok = 1;
  r.json = "{\"ranks\":[]}";
  env.msg_case = WEFT__ENVELOPE__MSG_REPLY;
  env.reply = &r;
  bad |= write_seed(dir, "reply", &env);
  Weft__Command c = WEFT__COMMAND__INIT;
  c.kind = WEFT__COMMAND__KIND__STOP;
  env.msg_case = WEFT__ENVELOPE__MSG_COMMAND;
  env.command = &c;
  bad |= write_seed(dir, "command", &env);
  Weft__Abort a = WEFT__ABORT__INIT;
  a.reason = "rank 2 died";
  a.dead_rank = 2;
  a.host = "node01";
  env.msg_case = WEFT__ENVELOPE__MSG_ABORT;
  env.abort = &a;
  bad |= write_seed(dir, "abort", &env);
  Weft__TraceReport tr = WEFT__TRACE_REPORT__INIT;
  char *lines[] = {"dp#1 allreduce 1024 x f32 done", "pp#4 send 64 x f32 running"};
  tr.request_id = 1;
  tr.n_lines = 2;
  tr.lines = lines;
  env.msg_case = WEFT__ENVELOPE__MSG_TRACE_REPORT;
  env.trace_report = &tr;
  bad |= write_seed(dir, "trace_report", &env);
  return bad;
}
