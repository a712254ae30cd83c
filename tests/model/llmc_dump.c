/*
 * llmc_dump.c - writes an llm.c checkpoint and debug state of a small GPT-2 for
 * llmc_reference.py, which recomputes the forward independently from the files.
 *
 * Usage: llmc_dump DIR   (writes DIR/model.bin and DIR/state.bin)
 *
 * The parameters are the GPT-2 initialisation moved by N(0, 0.3^2) noise (padding
 * rows of wte excepted), so biases and layernorm parameters are far from 0 and 1 and
 * the logits are of order one: a reference that dropped a bias, swapped q and k, or
 * mis-shaped a weight would disagree by far more than float32 rounding.
 */
#include <stdio.h>
#include <stdlib.h>

#include "wf_kernels.h"
#include "wf_model.h"

int main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  enum { B = 2, T = 7 };
  wf_model_dims d = {.L = 2, .NH = 2, .C = 8, .maxT = 8, .V = 11, .Vp = 16};
  char model[4096], state[4096];
  snprintf(model, sizeof model, "%s/model.bin", argv[1]);
  snprintf(state, sizeof state, "%s/state.bin", argv[1]);
  wf_kernels_set_threads(1);
  wf_model *m;
  if (wf_model_create(&m, &d, B, T) != WF_OK)
    return 1;
  wf_model_init(m, 2024);
  float *p = wf_model_params(m);
  size_t n = wf_model_num_params(&d);
  for (size_t i = 0; i < n; i++)
    if (i < (size_t)d.V * d.C || i >= (size_t)d.Vp * d.C)
      p[i] += 0.3f * wf_rng_normal(77, 1, i);
  int in[B * T], tg[B * T];
  for (int i = 0; i < B * T; i++) {
    in[i] = (i * 7 + 3) % d.V;
    tg[i] = (i * 4 + 1) % d.V;
  }
  int rc = 0;
  if (wf_model_save_llmc(m, model) != WF_OK ||
      wf_model_dump_state(m, state, in, tg, B, T) != WF_OK) { /* the error is logged */
    rc = 1;
  }
  wf_model_destroy(m);
  return rc;
}
