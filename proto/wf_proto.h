/*
 * wf_proto.h - control-plane messages and their framing.
 *
 * A frame is a 4-byte big-endian body length followed by the body: one protobuf
 * weft.Envelope (weft.proto) that carries the protocol version and exactly one
 * message. The module is pure: it turns messages into bytes and bytes into messages
 * and never touches a socket, so every function can be unit-tested and fuzzed.
 *
 * Invariants:
 *  - No frame body is larger than WF_PROTO_MAX_FRAME bytes; a header announcing more
 *    is an error before a single body byte is buffered.
 *  - Every decoded envelope has version == WF_PROTO_VERSION and a message set.
 *  - Malformed input of any kind gives WF_EPROTO and a message, never a crash.
 */
#ifndef WF_PROTO_H
#define WF_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "weft.pb-c.h"
#include "wf_runtime.h"

#define WF_PROTO_VERSION      1u
#define WF_PROTO_HEADER_BYTES 4u
/* Hard limit on a frame body. A `ranks` reply for 4096 ranks is about 2 MiB. */
#define WF_PROTO_MAX_FRAME (8u << 20)

/* The message's name ("hello", "heartbeat", ...), for logs. */
const char *wf_proto_msg_name(Weft__Envelope__MsgCase c);

/* Bytes wf_proto_encode() writes for `env` (header included). */
size_t wf_proto_frame_size(const Weft__Envelope *env);

/* Set env->version and encode the frame into `buf` (capacity `cap`). On success
 * *len is the frame length. WF_EPROTO when the body would exceed the maximum or
 * no message is set; WF_EINVAL when `cap` is too small. */
wf_status wf_proto_encode_into(Weft__Envelope *env, uint8_t *buf, size_t cap, size_t *len);

/* Same, into a new malloc()ed buffer the caller frees. */
wf_status wf_proto_encode(Weft__Envelope *env, uint8_t **frame, size_t *len);

/* Read a frame header. With fewer than 4 bytes, *need = 4; otherwise *need is the
 * whole frame length (header + body). WF_EPROTO when the body is empty or larger
 * than `max_body` (0 = WF_PROTO_MAX_FRAME). */
wf_status wf_proto_frame_need(const uint8_t *buf, size_t len, size_t max_body, size_t *need,
                              char *err, size_t err_len);

/* Decode exactly one whole frame (header + body, nothing after it). On success *out
 * is a new envelope for wf_proto_free(). On error *out is NULL and `err` says why. */
wf_status wf_proto_decode(Weft__Envelope **out, const uint8_t *frame, size_t len, char *err,
                          size_t err_len);

/* Decode a body without its header (the fuzzer's and the reader's entry point). */
wf_status wf_proto_decode_body(Weft__Envelope **out, const uint8_t *body, size_t len, char *err,
                               size_t err_len);

void wf_proto_free(Weft__Envelope *env); /* accepts NULL */

/* ---- stream reassembly ----------------------------------------------------------
 * Bytes arrive in arbitrary pieces; the reader buffers them and pops whole frames.
 * Usage: feed each chunk, then call next() until it gives *out == NULL. After an
 * error the stream is out of step and the connection must be dropped. */

typedef struct wf_proto_reader {
  uint8_t *buf;
  size_t len, cap;
  size_t max_body; /* per-connection limit, <= WF_PROTO_MAX_FRAME */
} wf_proto_reader;

void wf_proto_reader_init(wf_proto_reader *r, size_t max_body); /* 0 = the maximum */
void wf_proto_reader_fini(wf_proto_reader *r);
/* WF_EPROTO when the buffered bytes already announce an oversized frame. */
wf_status wf_proto_reader_feed(wf_proto_reader *r, const void *data, size_t len, char *err,
                               size_t err_len);
/* WF_OK with *out set (or NULL: need more bytes), or WF_EPROTO. */
wf_status wf_proto_reader_next(wf_proto_reader *r, Weft__Envelope **out, char *err, size_t err_len);
/* True while part of a frame is buffered (a peer stalling mid-frame). */
bool wf_proto_reader_partial(const wf_proto_reader *r);

#endif /* WF_PROTO_H */
