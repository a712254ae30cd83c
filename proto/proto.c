/*
 * proto.c - framing and checked encode/decode of control-plane envelopes.
 *
 * protobuf-c does the wire format; this file adds what protobuf does not: the
 * length prefix, the size limit, the version check, and "exactly one message".
 * Decoding never trusts a length before comparing it with the limit, and never
 * reads past the bytes it was given.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_proto.h"

static wf_status proto_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static wf_status proto_err(char *err, size_t err_len, const char *fmt, ...)
{
  if (err && err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return WF_EPROTO;
}

const char *wf_proto_msg_name(Weft__Envelope__MsgCase c)
{
  switch (c) {
  case WEFT__ENVELOPE__MSG__NOT_SET: return "none";
  case WEFT__ENVELOPE__MSG_HELLO: return "hello";
  case WEFT__ENVELOPE__MSG_WELCOME: return "welcome";
  case WEFT__ENVELOPE__MSG_HEARTBEAT: return "heartbeat";
  case WEFT__ENVELOPE__MSG_STEP_REPORT: return "step_report";
  case WEFT__ENVELOPE__MSG_ERROR: return "error";
  case WEFT__ENVELOPE__MSG_BYE: return "bye";
  case WEFT__ENVELOPE__MSG_QUERY: return "query";
  case WEFT__ENVELOPE__MSG_REPLY: return "reply";
  case WEFT__ENVELOPE__MSG_COMMAND: return "command";
  case WEFT__ENVELOPE__MSG_ABORT: return "abort";
  case WEFT__ENVELOPE__MSG_TRACE_REPORT: return "trace_report";
  default: break;
  }
  return "unknown";
}

static void put_be32(uint8_t *p, uint32_t v)
{
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p)
{
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

size_t wf_proto_frame_size(const Weft__Envelope *env)
{
  return WF_PROTO_HEADER_BYTES + weft__envelope__get_packed_size(env);
}

wf_status wf_proto_encode_into(Weft__Envelope *env, uint8_t *buf, size_t cap, size_t *len)
{
  if (!env || !buf || !len)
    return WF_EINVAL;
  if (env->msg_case == WEFT__ENVELOPE__MSG__NOT_SET)
    return WF_EPROTO;
  env->version = WF_PROTO_VERSION;
  size_t body = weft__envelope__get_packed_size(env);
  if (body > WF_PROTO_MAX_FRAME)
    return WF_EPROTO;
  if (cap < WF_PROTO_HEADER_BYTES + body)
    return WF_EINVAL;
  put_be32(buf, (uint32_t)body);
  size_t n = weft__envelope__pack(env, buf + WF_PROTO_HEADER_BYTES);
  if (n != body)
    return WF_EPROTO;
  *len = WF_PROTO_HEADER_BYTES + body;
  return WF_OK;
}

wf_status wf_proto_encode(Weft__Envelope *env, uint8_t **frame, size_t *len)
{
  if (!env || !frame || !len)
    return WF_EINVAL;
  *frame = NULL;
  env->version = WF_PROTO_VERSION;
  size_t cap = wf_proto_frame_size(env);
  if (cap > WF_PROTO_HEADER_BYTES + WF_PROTO_MAX_FRAME)
    return WF_EPROTO;
  uint8_t *buf = malloc(cap);
  if (!buf)
    return WF_ENOMEM;
  wf_status st = wf_proto_encode_into(env, buf, cap, len);
  if (st != WF_OK) {
    free(buf);
    return st;
  }
  *frame = buf;
  return WF_OK;
}

wf_status wf_proto_frame_need(const uint8_t *buf, size_t len, size_t max_body, size_t *need,
                              char *err, size_t err_len)
{
  if (max_body == 0 || max_body > WF_PROTO_MAX_FRAME)
    max_body = WF_PROTO_MAX_FRAME;
  *need = WF_PROTO_HEADER_BYTES;
  if (len < WF_PROTO_HEADER_BYTES)
    return WF_OK;
  uint32_t body = get_be32(buf);
  if (body == 0)
    return proto_err(err, err_len, "empty frame");
  if (body > max_body)
    return proto_err(err, err_len, "frame of %u bytes exceeds the limit of %zu", body, max_body);
  *need = WF_PROTO_HEADER_BYTES + body;
  return WF_OK;
}

wf_status wf_proto_decode_body(Weft__Envelope **out, const uint8_t *body, size_t len, char *err,
                               size_t err_len)
{
  if (!out)
    return WF_EINVAL;
  *out = NULL;
  if (!body || len == 0)
    return proto_err(err, err_len, "empty frame");
  if (len > WF_PROTO_MAX_FRAME)
    return proto_err(err, err_len, "frame of %zu bytes exceeds the limit", len);
  Weft__Envelope *env = weft__envelope__unpack(NULL, len, body);
  if (!env)
    return proto_err(err, err_len, "frame is not a valid weft.Envelope");
  if (!protobuf_c_message_check(&env->base)) {
    wf_proto_free(env);
    return proto_err(err, err_len, "frame has missing or invalid fields");
  }
  if (env->version != WF_PROTO_VERSION) {
    uint32_t v = env->version;
    wf_proto_free(env);
    return proto_err(err, err_len,
                     "protocol version %u, this build speaks %u: use the same weft build "
                     "for workers and console",
                     v, WF_PROTO_VERSION);
  }
  if (env->msg_case == WEFT__ENVELOPE__MSG__NOT_SET || env->hello == NULL) {
    wf_proto_free(env);
    return proto_err(err, err_len, "frame carries no message");
  }
  *out = env;
  return WF_OK;
}

wf_status wf_proto_decode(Weft__Envelope **out, const uint8_t *frame, size_t len, char *err,
                          size_t err_len)
{
  if (!out)
    return WF_EINVAL;
  *out = NULL;
  if (!frame && len)
    return WF_EINVAL;
  size_t need;
  wf_status st = wf_proto_frame_need(frame, len, 0, &need, err, err_len);
  if (st != WF_OK)
    return st;
  if (len < need)
    return proto_err(err, err_len, "truncated frame: %zu of %zu bytes", len, need);
  if (len > need)
    return proto_err(err, err_len, "%zu stray bytes after the frame", len - need);
  return wf_proto_decode_body(out, frame + WF_PROTO_HEADER_BYTES, need - WF_PROTO_HEADER_BYTES, err,
                              err_len);
}

void wf_proto_free(Weft__Envelope *env)
{
  if (env)
    weft__envelope__free_unpacked(env, NULL);
}

/* ---- reader ---------------------------------------------------------------------- */

void wf_proto_reader_init(wf_proto_reader *r, size_t max_body)
{
  memset(r, 0, sizeof *r);
  r->max_body = (max_body == 0 || max_body > WF_PROTO_MAX_FRAME) ? WF_PROTO_MAX_FRAME : max_body;
}

void wf_proto_reader_fini(wf_proto_reader *r)
{
  free(r->buf);
  memset(r, 0, sizeof *r);
}

bool wf_proto_reader_partial(const wf_proto_reader *r) { return r->len > 0; }

wf_status wf_proto_reader_feed(wf_proto_reader *r, const void *data, size_t len, char *err,
                               size_t err_len)
{
  size_t need;
  if (len == 0)
    return WF_OK;
  /* Never buffer more than one maximal frame plus the chunk that completes it. */
  if (r->len + len > 2 * (WF_PROTO_HEADER_BYTES + r->max_body))
    return proto_err(err, err_len, "peer sent more than it may without reading replies");
  if (r->len + len > r->cap) {
    size_t cap = r->cap ? r->cap : 4096;
    while (cap < r->len + len)
      cap *= 2;
    uint8_t *b = realloc(r->buf, cap);
    if (!b)
      return WF_ENOMEM;
    r->buf = b;
    r->cap = cap;
  }
  memcpy(r->buf + r->len, data, len);
  r->len += len;
  return wf_proto_frame_need(r->buf, r->len, r->max_body, &need, err, err_len);
}

wf_status wf_proto_reader_next(wf_proto_reader *r, Weft__Envelope **out, char *err, size_t err_len)
{
  size_t need;
  *out = NULL;
  wf_status st = wf_proto_frame_need(r->buf, r->len, r->max_body, &need, err, err_len);
  if (st != WF_OK || r->len < need)
    return st;
  st = wf_proto_decode_body(out, r->buf + WF_PROTO_HEADER_BYTES, need - WF_PROTO_HEADER_BYTES, err,
                            err_len);
  memmove(r->buf, r->buf + need, r->len - need);
  r->len -= need;
  return st;
}
