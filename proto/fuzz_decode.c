/*
 * fuzz_decode.c - libFuzzer target for the frame decoder and the stream reader.
 *
 * The input is fed whole to wf_proto_decode() and, split at a data-chosen point, to
 * the reader, so both the one-shot and the incremental paths see every input. Any
 * crash, leak or undefined behaviour is a bug; errors are the expected outcome.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "wf_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char err[256];
  Weft__Envelope *env = NULL;
  if (wf_proto_decode(&env, data, size, err, sizeof err) == WF_OK) {
    /* A decoded envelope must re-encode within the limit. */
    uint8_t *frame = NULL;
    size_t len = 0;
    if (wf_proto_encode(env, &frame, &len) == WF_OK)
      free(frame);
    wf_proto_free(env);
  }
  wf_proto_reader r;
  wf_proto_reader_init(&r, 1u << 16);
  size_t cut = size ? data[0] % (size + 1) : 0;
  if (wf_proto_reader_feed(&r, data, cut, err, sizeof err) == WF_OK &&
      wf_proto_reader_feed(&r, data + cut, size - cut, err, sizeof err) == WF_OK) {
    for (int i = 0; i < 64; i++) {
      if (wf_proto_reader_next(&r, &env, err, sizeof err) != WF_OK || !env)
        break;
      wf_proto_free(env);
    }
  }
  wf_proto_reader_fini(&r);
  return 0;
}
