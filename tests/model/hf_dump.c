/*
 * hf_dump.c - one forward and backward of a model read from Hugging Face safetensors,
 * for llama_ref_check.py, which compares it with an independent reference of Hugging
 * Face's LlamaForCausalLM (tests/model/llama_ref.py).
 *
 * Usage: hf_dump WEIGHTS TOKENS TARGETS B OUT [Z [CAPACITY]]
 *   WEIGHTS: a .safetensors file (config.json beside it says the family and dims);
 *   TOKENS, TARGETS: raw little-endian int32 files of B*T ids each;
 *   Z, CAPACITY: a mixture of experts' router z-loss coefficient and capacity factor
 *   (default 0: none, dropless);
 *   writes OUT.logits (float32 (B*T, V), the real vocabulary columns), OUT.loss (one
 *   float32: the cross-entropy), OUT.aux (two float32: the load-balancing loss and the
 *   z-loss, without their coefficients; 0 for a dense model) and OUT.grads.safetensors:
 *   the gradient of the loss trained on (the cross-entropy plus the auxiliary terms),
 *   written through the same codec as the weights (so in Hugging Face's names and layouts).
 */
#include <stdio.h>
#include <stdlib.h>

#include "wf_device.h"
#include "wf_kernels.h"
#include "wf_model.h"

static int *read_ids(const char *path, size_t *n)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f) / sizeof(int);
  fseek(f, 0, SEEK_SET);
  int *x = malloc(*n * sizeof *x);
  if (x && fread(x, sizeof *x, *n, f) != *n) {
    free(x);
    x = NULL;
  }
  fclose(f);
  return x;
}

static int write_raw(const char *prefix, const char *suffix, const void *p, size_t bytes)
{
  char path[4096];
  snprintf(path, sizeof path, "%s%s", prefix, suffix);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(p, 1, bytes, f) == bytes;
  if (f)
    fclose(f);
  return ok ? 0 : 1;
}

/* The forward and backward of one batch, the logits kept before they become their
 * gradient; then the outputs. */
static int dump(wf_model *m, const wf_model_dims *d, const int *in, const int *tg, int B, int T,
                const char *out)
{
  size_t N = (size_t)B * T, np = wf_model_num_params(d);
  double sums[3] = {0, 0, 0};
  float loss = 0, aux[2], *logits = malloc(N * (size_t)d->Vp * sizeof *logits);
  float *grads = calloc(np, sizeof *grads), *real = malloc(N * (size_t)d->V * sizeof *real);
  char path[4096];
  int rc = !logits || !grads || !real;
  rc = rc || wf_model_zero_grad(m) != WF_OK || wf_model_forward(m, in, tg, B, T, &loss) != WF_OK;
  rc = rc || wf_model_take_aux(m, sums) != WF_OK;
  aux[0] = (float)sums[0], aux[1] = (float)sums[1];
  rc = rc || wf_model_logits_read(m, logits, 0, N * (size_t)d->Vp) != WF_OK;
  rc = rc || wf_model_backward(m, 1.0f) != WF_OK || wf_model_export_full(m, 1, grads) != WF_OK;
  for (size_t i = 0; !rc && i < N; i++)
    for (int v = 0; v < d->V; v++)
      real[i * (size_t)d->V + (size_t)v] = logits[i * (size_t)d->Vp + (size_t)v];
  rc = rc || write_raw(out, ".logits", real, N * (size_t)d->V * sizeof *real);
  rc = rc || write_raw(out, ".loss", &loss, sizeof loss);
  rc = rc || write_raw(out, ".aux", aux, sizeof aux);
  snprintf(path, sizeof path, "%s.grads.safetensors", out);
  rc = rc || wf_safetensors_write(path, d, grads, 0, false, NULL, 0) != WF_OK;
  free(logits);
  free(grads);
  free(real);
  return rc;
}

int main(int argc, char **argv)
{
  if (argc < 6 || argc > 8) {
    fprintf(stderr, "usage: %s WEIGHTS TOKENS TARGETS B OUT [Z [CAPACITY]]\n", argv[0]);
    return 2;
  }
  size_t n = 0, nt = 0;
  int B = atoi(argv[4]), *in = read_ids(argv[2], &n), *tg = read_ids(argv[3], &nt);
  wf_model_dims d;
  wf_model *m = NULL;
  wf_kernels_set_threads(1);
  if (!in || !tg || n != nt || B < 1 || n % (size_t)B) {
    fprintf(stderr, "hf_dump: bad token files or batch\n");
    return 2;
  }
  int T = (int)(n / (size_t)B), rc = 1;
  float *full = NULL;
  bool peeked = wf_safetensors_peek(argv[1], &d, NULL, 0) == WF_OK;
  d.z_coef = argc > 6 ? atof(argv[6]) : 0;
  d.capacity = argc > 7 ? atof(argv[7]) : 0;
  if (peeked && wf_model_create(&m, &d, B, T) == WF_OK &&
      (full = malloc(wf_model_num_params(&d) * sizeof *full)) &&
      wf_safetensors_read(argv[1], &d, full, NULL, 0) == WF_OK &&
      wf_model_import_full(m, 0, full) == WF_OK)
    rc = dump(m, &d, in, tg, B, T, argv[5]);
  printf("hf_dump: %s, %d layers, d_model %d, %d heads (%d kv), ffn %d, vocab %d: %s\n",
         wf_model_family_name(&d), d.L, d.C, d.NH, d.KV, d.F, d.V, rc ? "FAILED" : "written");
  free(full);
  free(in);
  free(tg);
  wf_model_destroy(m);
  return rc;
}
