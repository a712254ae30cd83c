/*
 * bench/tokenizer.c - encoding and decoding speed of each tokenizer given, on one text.
 *
 * usage: build/bench/tokenizer TEXT TOKENIZER... (GPT-2's tokenizer.json or vocab.json,
 * Llama 3's tokenizer.model, or their folders). One thread, as `worker --tokenize` and
 * data.tokenizer encode. Prints one row per tokenizer: load time, tokens, bytes per token,
 * encode MB/s (the best of ROUNDS passes over the whole text, so a busy machine's noise
 * shows as the spread to the median) and decode MB/s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_io.h"

#define ROUNDS 5

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static char *read_text(const char *path, size_t *len)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *len = buf ? (size_t)n : 0;
  return buf;
}

static int bench_one(const char *path, const char *text, size_t len)
{
  char err[1024] = "";
  wf_tokenizer *t = NULL;
  double t0 = wf_now();
  if (wf_tokenizer_load(&t, path, err, sizeof err) != WF_OK) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  double load_s = wf_now() - t0, enc[ROUNDS], dec[ROUNDS];
  size_t n = 0, back_len = 0;
  char *back = malloc(len + 1);
  for (int r = 0; r < ROUNDS && back; r++) {
    wf_tokens tok = {0};
    t0 = wf_now();
    if (wf_tokenizer_encode(t, text, len, &tok) != WF_OK)
      return 1;
    enc[r] = wf_now() - t0;
    t0 = wf_now();
    wf_tokenizer_decode(t, tok.ids, tok.n, back, len, &back_len);
    dec[r] = wf_now() - t0;
    n = tok.n;
    wf_tokens_free(&tok);
  }
  if (!back || back_len != len || memcmp(back, text, len)) {
    fprintf(stderr, "%s: decode(encode(text)) is not the text\n", path);
    return 1;
  }
  qsort(enc, ROUNDS, sizeof *enc, cmp_double);
  qsort(dec, ROUNDS, sizeof *dec, cmp_double);
  double mb = (double)len / 1e6;
  printf("%-60.60s %8.0f %9zu %6.2f %8.2f %8.2f %9.0f\n", wf_tokenizer_describe(t), load_s * 1e3, n,
         (double)len / (double)n, mb / enc[0], mb / enc[ROUNDS / 2], mb / dec[0]);
  free(back);
  wf_tokenizer_destroy(t);
  return 0;
}

int main(int argc, char **argv)
{
  if (argc < 3) {
    fprintf(stderr, "usage: %s TEXT TOKENIZER...\n", argv[0]);
    return 2;
  }
  size_t len = 0;
  char *text = read_text(argv[1], &len);
  if (!text) {
    fprintf(stderr, "cannot read '%s'\n", argv[1]);
    return 1;
  }
  printf("text '%s': %.2f MB; encode: best and median of %d passes, one thread\n", argv[1],
         (double)len / 1e6, ROUNDS);
  printf("%-60s %8s %9s %6s %8s %8s %9s\n", "tokenizer", "load_ms", "tokens", "B/tok", "enc_MB/s",
         "(median)", "dec_MB/s");
  int rc = 0;
  for (int i = 2; i < argc; i++)
    rc |= bench_one(argv[i], text, len);
  free(text);
  return rc;
}
