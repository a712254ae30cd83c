/*
 * test_proto.c - framing and decoding of control-plane envelopes.
 *
 * Every message type survives encode -> decode; every kind of malformed input
 * (truncated, oversized, wrong version, empty, trailing bytes, random bytes) is an
 * error and never a crash (the suite runs under ASan/UBSan in CI).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wf_proto.h"

static Weft__Envelope *roundtrip(Weft__Envelope *env)
{
  uint8_t *frame = NULL;
  size_t len = 0;
  char err[256];
  assert_int_equal(wf_proto_encode(env, &frame, &len), WF_OK);
  assert_int_equal(len, wf_proto_frame_size(env));
  /* The header is the big-endian body length. */
  size_t body = (size_t)frame[0] << 24 | (size_t)frame[1] << 16 | (size_t)frame[2] << 8 | frame[3];
  assert_int_equal(body + 4, len);
  Weft__Envelope *out = NULL;
  assert_int_equal(wf_proto_decode(&out, frame, len, err, sizeof err), WF_OK);
  assert_non_null(out);
  assert_int_equal(out->version, WF_PROTO_VERSION);
  assert_int_equal(out->msg_case, env->msg_case);
  free(frame);
  return out;
}

static void test_roundtrip_hello(void **state)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Hello h = WEFT__HELLO__INIT;
  h.role = WEFT__HELLO__ROLE__WORKER;
  h.token = "abc";
  h.job_id = "job-1";
  h.rank = 7;
  h.local_rank = 3;
  h.pid = 4242;
  h.host = "node01";
  h.device = "cuda:3";
  h.binding = "cores 12-15";
  h.pp = 1;
  h.dp = 1;
  h.tp = 1;
  h.threads = 4;
  h.stage = "layers 6-11";
  env.msg_case = WEFT__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  Weft__Envelope *out = roundtrip(&env);
  assert_int_equal(out->hello->rank, 7);
  assert_int_equal(out->hello->local_rank, 3);
  assert_int_equal(out->hello->pid, 4242);
  assert_string_equal(out->hello->host, "node01");
  assert_string_equal(out->hello->device, "cuda:3");
  assert_string_equal(out->hello->binding, "cores 12-15");
  assert_string_equal(out->hello->token, "abc");
  assert_string_equal(out->hello->stage, "layers 6-11");
  assert_int_equal(out->hello->threads, 4);
  wf_proto_free(out);
}

static void test_roundtrip_all(void **state)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Welcome w = WEFT__WELCOME__INIT;
  Weft__Heartbeat hb = WEFT__HEARTBEAT__INIT;
  Weft__StepReport sr = WEFT__STEP_REPORT__INIT;
  Weft__Error e = WEFT__ERROR__INIT;
  Weft__Bye bye = WEFT__BYE__INIT;
  Weft__Query q = WEFT__QUERY__INIT;
  Weft__Reply r = WEFT__REPLY__INIT;
  Weft__Command c = WEFT__COMMAND__INIT;
  Weft__Abort a = WEFT__ABORT__INIT;
  Weft__Envelope *out;

  w.job_id = "j";
  w.world_size = 8;
  w.heartbeat_ms = 1000;
  env.msg_case = WEFT__ENVELOPE__MSG_WELCOME;
  env.welcome = &w;
  out = roundtrip(&env);
  assert_int_equal(out->welcome->world_size, 8);
  assert_int_equal(out->welcome->heartbeat_ms, 1000);
  wf_proto_free(out);

  hb.step = 12345678901LL;
  hb.phase = "backward";
  hb.coll_seq = 99;
  hb.coll_op = "allreduce(dp)";
  hb.coll_active = 1;
  hb.mem_bytes = 1ull << 40;
  env.msg_case = WEFT__ENVELOPE__MSG_HEARTBEAT;
  env.heartbeat = &hb;
  out = roundtrip(&env);
  assert_true(out->heartbeat->step == 12345678901LL);
  assert_string_equal(out->heartbeat->phase, "backward");
  assert_true(out->heartbeat->coll_seq == 99);
  assert_string_equal(out->heartbeat->coll_op, "allreduce(dp)");
  assert_true(out->heartbeat->coll_active);
  assert_true(out->heartbeat->mem_bytes == 1ull << 40);
  wf_proto_free(out);

  sr.step = 5;
  sr.loss = 3.25; /* exactly representable: doubles round-trip bit for bit */
  sr.tokens_per_s = 1000.5;
  sr.step_ms = 12.75;
  sr.mem_bytes = 77;
  env.msg_case = WEFT__ENVELOPE__MSG_STEP_REPORT;
  env.step_report = &sr;
  out = roundtrip(&env);
  assert_true(out->step_report->loss == 3.25 && out->step_report->step_ms == 12.75);
  assert_true(out->step_report->tokens_per_s == 1000.5 && out->step_report->mem_bytes == 77);
  wf_proto_free(out);

  e.code = -3;
  e.message = "disk full";
  env.msg_case = WEFT__ENVELOPE__MSG_ERROR;
  env.error = &e;
  out = roundtrip(&env);
  assert_int_equal(out->error->code, -3);
  assert_string_equal(out->error->message, "disk full");
  wf_proto_free(out);

  env.msg_case = WEFT__ENVELOPE__MSG_BYE;
  env.bye = &bye;
  wf_proto_free(roundtrip(&env));

  q.kind = WEFT__QUERY__KIND__MESH;
  env.msg_case = WEFT__ENVELOPE__MSG_QUERY;
  env.query = &q;
  out = roundtrip(&env);
  assert_int_equal(out->query->kind, WEFT__QUERY__KIND__MESH);
  wf_proto_free(out);

  r.ok = 1;
  r.json = "{\"a\":1}";
  r.message = "fine";
  env.msg_case = WEFT__ENVELOPE__MSG_REPLY;
  env.reply = &r;
  out = roundtrip(&env);
  assert_true(out->reply->ok);
  assert_string_equal(out->reply->json, "{\"a\":1}");
  wf_proto_free(out);

  c.kind = WEFT__COMMAND__KIND__TRACE;
  c.request_id = 7;
  env.msg_case = WEFT__ENVELOPE__MSG_COMMAND;
  env.command = &c;
  out = roundtrip(&env);
  assert_int_equal(out->command->kind, WEFT__COMMAND__KIND__TRACE);
  assert_true(out->command->request_id == 7);
  wf_proto_free(out);
  c.request_id = 0;

  c.kind = WEFT__COMMAND__KIND__CHECKPOINT;
  env.msg_case = WEFT__ENVELOPE__MSG_COMMAND;
  env.command = &c;
  out = roundtrip(&env);
  assert_int_equal(out->command->kind, WEFT__COMMAND__KIND__CHECKPOINT);
  wf_proto_free(out);

  Weft__TraceReport tr = WEFT__TRACE_REPORT__INIT;
  char *lines[] = {"dp#1 allreduce done", "dp#2 allreduce running"};
  tr.request_id = 42;
  tr.n_lines = 2;
  tr.lines = lines;
  env.msg_case = WEFT__ENVELOPE__MSG_TRACE_REPORT;
  env.trace_report = &tr;
  out = roundtrip(&env);
  assert_true(out->trace_report->request_id == 42 && out->trace_report->n_lines == 2);
  assert_string_equal(out->trace_report->lines[1], "dp#2 allreduce running");
  wf_proto_free(out);

  a.reason = "rank 3 died";
  a.dead_rank = 3;
  a.host = "n1";
  a.pid = 99;
  a.device = "cpu";
  a.step = 17;
  env.msg_case = WEFT__ENVELOPE__MSG_ABORT;
  env.abort = &a;
  out = roundtrip(&env);
  assert_int_equal(out->abort->dead_rank, 3);
  assert_int_equal(out->abort->pid, 99);
  assert_true(out->abort->step == 17);
  assert_string_equal(out->abort->reason, "rank 3 died");
  wf_proto_free(out);
}

static uint8_t *heartbeat_frame(size_t *len)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Heartbeat hb = WEFT__HEARTBEAT__INIT;
  hb.step = 3;
  hb.phase = "forward";
  env.msg_case = WEFT__ENVELOPE__MSG_HEARTBEAT;
  env.heartbeat = &hb;
  uint8_t *frame;
  assert_int_equal(wf_proto_encode(&env, &frame, len), WF_OK);
  return frame;
}

static void test_truncated(void **state)
{
  size_t len;
  char err[256];
  uint8_t *frame = heartbeat_frame(&len);
  for (size_t n = 0; n < len; n++) {
    Weft__Envelope *out = (Weft__Envelope *)1;
    assert_int_equal(wf_proto_decode(&out, frame, n, err, sizeof err), WF_EPROTO);
    assert_null(out);
  }
  /* A whole frame with its header shortened: the body is cut. */
  frame[3] = (uint8_t)(frame[3] - 1);
  Weft__Envelope *out;
  assert_int_equal(wf_proto_decode(&out, frame, len, err, sizeof err), WF_EPROTO);
  free(frame);
}

static void test_oversized(void **state)
{
  char err[256];
  size_t need;
  uint8_t hdr[8] = {0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4};
  Weft__Envelope *out;
  assert_int_equal(wf_proto_decode(&out, hdr, sizeof hdr, err, sizeof err), WF_EPROTO);
  assert_non_null(strstr(err, "exceeds"));
  /* One byte over the limit is refused from the header alone. */
  uint32_t big = WF_PROTO_MAX_FRAME + 1;
  uint8_t h2[4] = {(uint8_t)(big >> 24), (uint8_t)(big >> 16), (uint8_t)(big >> 8), (uint8_t)big};
  assert_int_equal(wf_proto_frame_need(h2, 4, 0, &need, err, sizeof err), WF_EPROTO);
  /* The reader refuses it before buffering a body. */
  wf_proto_reader r;
  wf_proto_reader_init(&r, 1024);
  uint8_t h3[4] = {0, 0, 4, 1}; /* 1025 bytes */
  assert_int_equal(wf_proto_reader_feed(&r, h3, 4, err, sizeof err), WF_EPROTO);
  wf_proto_reader_fini(&r);
  /* An encoder never produces an oversized frame. */
  char *huge = malloc(WF_PROTO_MAX_FRAME + 16);
  memset(huge, 'x', WF_PROTO_MAX_FRAME + 15);
  huge[WF_PROTO_MAX_FRAME + 15] = '\0';
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Reply rep = WEFT__REPLY__INIT;
  rep.json = huge;
  env.msg_case = WEFT__ENVELOPE__MSG_REPLY;
  env.reply = &rep;
  uint8_t *frame;
  size_t len;
  assert_int_equal(wf_proto_encode(&env, &frame, &len), WF_EPROTO);
  free(huge);
}

static void test_wrong_version_and_empty(void **state)
{
  char err[256];
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Bye bye = WEFT__BYE__INIT;
  env.msg_case = WEFT__ENVELOPE__MSG_BYE;
  env.bye = &bye;
  env.version = 2;
  uint8_t body[64];
  size_t n = weft__envelope__pack(&env, body); /* bypasses wf_proto_encode's version */
  Weft__Envelope *out;
  assert_int_equal(wf_proto_decode_body(&out, body, n, err, sizeof err), WF_EPROTO);
  assert_non_null(strstr(err, "version 2"));
  /* Version right but no message. */
  Weft__Envelope none = WEFT__ENVELOPE__INIT;
  none.version = WF_PROTO_VERSION;
  n = weft__envelope__pack(&none, body);
  assert_int_equal(wf_proto_decode_body(&out, body, n, err, sizeof err), WF_EPROTO);
  /* Encoding an envelope without a message is refused. */
  uint8_t *frame;
  size_t len;
  assert_int_equal(wf_proto_encode(&none, &frame, &len), WF_EPROTO);
  /* An empty frame and trailing bytes. */
  uint8_t zero[4] = {0, 0, 0, 0};
  assert_int_equal(wf_proto_decode(&out, zero, 4, err, sizeof err), WF_EPROTO);
  frame = heartbeat_frame(&len);
  uint8_t *longer = malloc(len + 1);
  memcpy(longer, frame, len);
  longer[len] = 0;
  assert_int_equal(wf_proto_decode(&out, longer, len + 1, err, sizeof err), WF_EPROTO);
  free(longer);
  free(frame);
}

static void test_random_bytes(void **state)
{
  char err[256];
  uint8_t buf[512];
  uint64_t x = 0x9E3779B97F4A7C15ull; /* xorshift, fixed seed: reproducible */
  int ok = 0;
  for (int iter = 0; iter < 20000; iter++) {
    size_t n = (size_t)(x % sizeof buf);
    for (size_t i = 0; i < n; i++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      buf[i] = (uint8_t)x;
    }
    if (iter & 1 && n >= 4) { /* a plausible header makes the body reach the decoder */
      buf[0] = buf[1] = 0;
      buf[2] = (uint8_t)((n - 4) >> 8);
      buf[3] = (uint8_t)(n - 4);
    }
    Weft__Envelope *out = NULL;
    wf_status st = wf_proto_decode(&out, buf, n, err, sizeof err);
    assert_true(st == WF_OK || st == WF_EPROTO);
    assert_true((st == WF_OK) == (out != NULL));
    ok += st == WF_OK;
    wf_proto_free(out);
  }
  /* Random bytes almost never form a valid versioned envelope. */
  assert_true(ok < 100);
}

static void test_reader_split(void **state)
{
  char err[256];
  size_t len;
  uint8_t *frame = heartbeat_frame(&len);
  uint8_t stream[3 * 64];
  assert_true(3 * len <= sizeof stream);
  for (int i = 0; i < 3; i++)
    memcpy(stream + (size_t)i * len, frame, len);
  /* Every split point of three back-to-back frames yields exactly three messages. */
  for (size_t cut = 0; cut <= 3 * len; cut++) {
    wf_proto_reader r;
    wf_proto_reader_init(&r, 0);
    int got = 0;
    Weft__Envelope *env;
    assert_int_equal(wf_proto_reader_feed(&r, stream, cut, err, sizeof err), WF_OK);
    while (wf_proto_reader_next(&r, &env, err, sizeof err) == WF_OK && env) {
      assert_true(env->heartbeat->step == 3);
      wf_proto_free(env);
      got++;
    }
    assert_int_equal(wf_proto_reader_feed(&r, stream + cut, 3 * len - cut, err, sizeof err), WF_OK);
    while (wf_proto_reader_next(&r, &env, err, sizeof err) == WF_OK && env) {
      wf_proto_free(env);
      got++;
    }
    assert_int_equal(got, 3);
    assert_false(wf_proto_reader_partial(&r));
    wf_proto_reader_fini(&r);
  }
  free(frame);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_hello),
      cmocka_unit_test(test_roundtrip_all),
      cmocka_unit_test(test_truncated),
      cmocka_unit_test(test_oversized),
      cmocka_unit_test(test_wrong_version_and_empty),
      cmocka_unit_test(test_random_bytes),
      cmocka_unit_test(test_reader_split),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
