/*
 * llmc.c - llm.c's GPT-2 file formats: the checkpoint and the debug state.
 *
 * Checkpoint (train_gpt2.c, version 3): int32[256] header {20240326, 3, maxT, V, L,
 * NH, C, Vp, 0...}, then the float32 parameters in the checkpoint layout, which is
 * exactly wf_gpt_params()'s layout, so reading and writing are one fread/fwrite.
 * Debug state (version 2): int32[256] header {20240327, 2, B, T, 0...}, int32
 * inputs[B*T], int32 targets[B*T], float32 logits[B*T*V] (unpadded), float32 loss,
 * float32 gradients in checkpoint layout.
 *
 * Invariants:
 *  - Files are little-endian, as llm.c writes them on every machine it runs on; the
 *    host must be little-endian too (checked at compile time).
 *  - Nothing is read past what the header and the file length agree on: every
 *    malformed file is a WF_EFORMAT with a message naming the file, what was found
 *    and what was expected, never a crash.
 *  - Writes go to "<path>.tmp.<pid>", are flushed and fsync()ed, then renamed, so
 *    a reader never sees a half-written file under the final name.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wf_model.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm.c files are little-endian; add byte swapping for this host"
#endif

_Static_assert(sizeof(int) == sizeof(int32_t), "token ids are written as int32");
_Static_assert(sizeof(float) == 4, "llm.c files hold IEEE float32");

#define CKPT_MAGIC    20240326
#define CKPT_VERSION  3
#define STATE_MAGIC   20240327
#define STATE_VERSION 2
#define HEADER_INTS   256
#define HEADER_BYTES  (HEADER_INTS * (long long)sizeof(int32_t))

/* Write the message into err (or log it when there is no buffer); returns `s`. */
static wf_status failf(char *err, size_t err_len, wf_status s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static wf_status failf(char *err, size_t err_len, wf_status s, const char *fmt, ...)
{
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (err && err_len)
    wf_strlcpy(err, buf, err_len);
  else
    WF_ERROR("%s", buf);
  return s;
}

/* ---- checkpoint ------------------------------------------------------------------ */

static void dims_from_header(wf_gpt_dims *d, const int32_t *h)
{
  d->maxT = h[2], d->V = h[3], d->L = h[4], d->NH = h[5], d->C = h[6], d->Vp = h[7];
}

/* Open `path`, read and validate the checkpoint header and the file length. */
static wf_status open_checkpoint(FILE **out, const char *path, wf_gpt_dims *d, char *err,
                                 size_t err_len)
{
  int32_t h[HEADER_INTS];
  struct stat sb;
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    return failf(err, err_len, WF_EIO, "%s: cannot open the llm.c checkpoint: %s", path,
                 strerror(errno));
  if (fstat(fileno(f), &sb) != 0 || fread(h, sizeof(int32_t), HEADER_INTS, f) != HEADER_INTS) {
    fclose(f);
    return failf(err, err_len, WF_EFORMAT,
                 "%s: truncated llm.c checkpoint: shorter than its %lld-byte header", path,
                 HEADER_BYTES);
  }
  wf_status st = WF_EFORMAT;
  const char *bad;
  dims_from_header(d, h);
  if (h[0] != CKPT_MAGIC) {
    failf(err, err_len, st, "%s: not an llm.c GPT-2 checkpoint: magic %d, expected %d", path, h[0],
          CKPT_MAGIC);
  } else if (h[1] != CKPT_VERSION) {
    failf(err, err_len, st,
          "%s: llm.c checkpoint version %d, expected %d (the format with the padded "
          "vocab in the header)",
          path, h[1], CKPT_VERSION);
  } else if ((bad = wf_gpt_dims_check(d)) != NULL) {
    failf(err, err_len, st, "%s: bad header dims maxT=%d V=%d L=%d NH=%d C=%d Vp=%d: %s", path,
          d->maxT, d->V, d->L, d->NH, d->C, d->Vp, bad);
  } else {
    long long want = HEADER_BYTES + (long long)wf_gpt_num_params(d) * (long long)sizeof(float);
    if ((long long)sb.st_size != want)
      failf(err, err_len, st,
            "%s: %s llm.c checkpoint: file is %lld bytes, expected %lld for its header "
            "dims L=%d NH=%d C=%d maxT=%d V=%d Vp=%d",
            path, (long long)sb.st_size < want ? "truncated" : "oversized", (long long)sb.st_size,
            want, d->L, d->NH, d->C, d->maxT, d->V, d->Vp);
    else
      st = WF_OK;
  }
  if (st != WF_OK) {
    fclose(f);
    return st;
  }
  *out = f;
  return WF_OK;
}

wf_status wf_gpt_peek_llmc(const char *path, wf_gpt_dims *d, char *err, size_t err_len)
{
  FILE *f;
  wf_status st = open_checkpoint(&f, path, d, err, err_len);
  if (st == WF_OK)
    fclose(f);
  return st;
}

/* NULL when equal, else the name of the first field that differs (values in *a, *b). */
static const char *dims_diff(const wf_gpt_dims *x, const wf_gpt_dims *y, int *a, int *b)
{
  struct {
    const char *name;
    int a, b;
  } f[] = {{"layers (L)", x->L, y->L},  {"heads (NH)", x->NH, y->NH},
           {"d_model (C)", x->C, y->C}, {"context length (maxT)", x->maxT, y->maxT},
           {"vocab (V)", x->V, y->V},   {"padded vocab (Vp)", x->Vp, y->Vp}};
  for (size_t i = 0; i < WF_ARRAY_LEN(f); i++) {
    if (f[i].a != f[i].b) {
      *a = f[i].a, *b = f[i].b;
      return f[i].name;
    }
  }
  return NULL;
}

wf_status wf_gpt_load_llmc(wf_gpt *m, const char *path, char *err, size_t err_len)
{
  FILE *f;
  wf_gpt_dims d;
  const wf_gpt_dims *md = wf_gpt_get_dims(m);
  int a, b;
  wf_status st = open_checkpoint(&f, path, &d, err, err_len);
  if (st != WF_OK)
    return st;
  const char *field = dims_diff(&d, md, &a, &b);
  if (field) {
    fclose(f);
    return failf(err, err_len, WF_EFORMAT,
                 "%s: checkpoint has %s = %d but the model has %d; set the model's "
                 "dimensions to the checkpoint's",
                 path, field, a, b);
  }
  size_t n = wf_gpt_num_params(md);
  if (fread(wf_gpt_params(m), sizeof(float), n, f) != n)
    st = failf(err, err_len, WF_EIO, "%s: read error in the parameters: %s", path,
               ferror(f) ? strerror(errno) : "unexpected end of file");
  fclose(f);
  wf_gpt_params_changed(m); /* the rounded GEMM weights of mixed precision follow */
  return st;
}

/* ---- atomic file writing -------------------------------------------------------- */

typedef struct out_file {
  FILE *f;
  const char *path;
  char tmp[4096];
  int err; /* errno of the first failure, 0 while all is well */
} out_file;

static wf_status out_open(out_file *o, const char *path, char *err, size_t err_len)
{
  o->path = path;
  o->err = 0;
  int n = snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", path, (long)getpid());
  if (n < 0 || (size_t)n >= sizeof o->tmp)
    return failf(err, err_len, WF_EINVAL, "%s: path too long", path);
  o->f = fopen(o->tmp, "wb");
  if (!o->f)
    return failf(err, err_len, WF_EIO, "%s: cannot create %s: %s", path, o->tmp, strerror(errno));
  return WF_OK;
}

static void out_fail(out_file *o) { o->err = o->err ? o->err : (errno ? errno : EIO); }

static void out_write(out_file *o, const void *p, size_t size, size_t n)
{
  if (!o->err && fwrite(p, size, n, o->f) != n)
    out_fail(o);
}

/* Flush, fsync, close and rename into place; on any failure remove the temp file. */
static wf_status out_close(out_file *o, char *err, size_t err_len)
{
  if (!o->err && (fflush(o->f) != 0 || fsync(fileno(o->f)) != 0))
    out_fail(o);
  if (fclose(o->f) != 0)
    out_fail(o);
  if (!o->err && rename(o->tmp, o->path) != 0)
    out_fail(o);
  if (!o->err)
    return WF_OK;
  remove(o->tmp);
  return failf(err, err_len, WF_EIO, "%s: write failed: %s", o->path, strerror(o->err));
}

wf_status wf_gpt_save_llmc(wf_gpt *m, const char *path, char *err, size_t err_len)
{
  const wf_gpt_dims *d = wf_gpt_get_dims(m);
  int32_t h[HEADER_INTS] = {CKPT_MAGIC, CKPT_VERSION, d->maxT, d->V, d->L, d->NH, d->C, d->Vp};
  out_file o;
  wf_status st = out_open(&o, path, err, err_len);
  if (st != WF_OK)
    return st;
  out_write(&o, h, sizeof(int32_t), HEADER_INTS);
  out_write(&o, wf_gpt_params(m), sizeof(float), wf_gpt_num_params(d));
  return out_close(&o, err, err_len);
}

/* ---- debug state ------------------------------------------------------------------ */

wf_status wf_llmc_write_state(const char *path, const wf_gpt_dims *d, int B, int T,
                              const int *inputs, const int *targets, const float *logits,
                              float loss, const float *grads, char *err, size_t err_len)
{
  size_t N = (size_t)B * (size_t)T;
  int32_t h[HEADER_INTS] = {STATE_MAGIC, STATE_VERSION, B, T};
  out_file o;
  wf_status st = out_open(&o, path, err, err_len);
  if (st != WF_OK)
    return st;
  out_write(&o, h, sizeof(int32_t), HEADER_INTS);
  out_write(&o, inputs, sizeof(int32_t), N);
  out_write(&o, targets, sizeof(int32_t), N);
  for (size_t i = 0; i < N && !o.err; i++)
    out_write(&o, logits + i * (size_t)d->Vp, sizeof(float), (size_t)d->V);
  out_write(&o, &loss, sizeof(float), 1);
  out_write(&o, grads, sizeof(float), wf_gpt_num_params(d));
  return out_close(&o, err, err_len);
}

wf_status wf_gpt_dump_state(wf_gpt *m, const char *path, const int *inputs, const int *targets,
                            int B, int T, char *err, size_t err_len)
{
  const wf_gpt_dims *d = wf_gpt_get_dims(m);
  size_t N = (size_t)B * (size_t)T, nl = N * (size_t)d->Vp;
  if (!inputs || !targets)
    return failf(err, err_len, WF_EINVAL, "%s: the debug state needs inputs and targets", path);
  wf_gpt_zero_grad(m);
  float loss = wf_gpt_forward(m, inputs, targets, B, T);
  if (isnan(loss))
    return failf(err, err_len, WF_EINVAL,
                 "%s: cannot dump the debug state: the forward of the %d x %d batch failed "
                 "(see the error above)",
                 path, B, T);
  /* The logits become their gradient in backward, so they are kept first. */
  float *logits = malloc(nl * sizeof *logits);
  if (!logits)
    return failf(err, err_len, WF_ENOMEM, "%s: no memory for the logits", path);
  memcpy(logits, wf_gpt_logits(m), nl * sizeof *logits);
  wf_gpt_backward(m, 1.0f);
  wf_status st = wf_llmc_write_state(path, d, B, T, inputs, targets, logits, loss, wf_gpt_grads(m),
                                     err, err_len);
  free(logits);
  return st;
}
