/*
 * llmc.c - llm.c's GPT-2 file formats: the checkpoint and the debug state.
 *
 * Checkpoint (train_gpt2.c, version 3): int32[256] header {20240326, 3, maxT, V, L,
 * NH, C, Vp, 0...}, then the float32 parameters in the checkpoint layout, which is
 * exactly the whole model's flat layout, so reading and writing are one read/write.
 * Version 5 (train_gpt2.cu's bf16 checkpoint) is the same header with 5, then the same
 * parameters as bf16: read widened exactly to float32, written rounded to the nearest
 * bf16 (ties to even), as llm.c's float -> bf16 conversion does.
 * Debug state (version 2): int32[256] header {20240327, 2, B, T, 0...}, int32
 * inputs[B*T], int32 targets[B*T], float32 logits[B*T*V] (unpadded), float32 loss,
 * float32 gradients in checkpoint layout.
 *
 * Invariants:
 *  - Files are little-endian, as llm.c writes them on every machine it runs on; the
 *    host must be little-endian too (checked at compile time).
 *  - Nothing is read past what the header and the file length agree on: every
 *    malformed file is a WF_EFORMAT logged with the file, what was found and what was
 *    expected, never a crash.
 *  - Writes go through the runtime's atomic writer: a reader never sees half a file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_int.h"
#include "wf_kernels.h"
#include "wf_file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm.c files are little-endian; add byte swapping for this host"
#endif

_Static_assert(sizeof(int) == sizeof(int32_t), "token ids are written as int32");
_Static_assert(sizeof(float) == 4, "llm.c files hold IEEE float32");

#define STATE_VERSION 2

/* ---- the header codec ------------------------------------------------------------------ */

static void header_encode(int32_t h[WF_LLMC_HEADER_INTS], const wf_model_dims *d, int version)
{
  memset(h, 0, WF_LLMC_HEADER_BYTES);
  int32_t v[8] = {WF_LLMC_MAGIC, version, d->maxT, d->V, d->L, d->NH, d->C, d->Vp};
  memcpy(h, v, sizeof v);
}

void wf_llmc_header_encode(int32_t h[WF_LLMC_HEADER_INTS], const wf_model_dims *d)
{
  header_encode(h, d, WF_LLMC_VERSION);
}

static bool known_version(int32_t v) { return v == WF_LLMC_VERSION || v == WF_LLMC_VERSION_BF16; }

/* Bytes per parameter of a file of version v (3 or 5). */
static size_t elem_bytes(int32_t v) { return v == WF_LLMC_VERSION_BF16 ? 2 : 4; }

/* A bf16 is the top half of a float32: widening is exact. */
static float bf16_to_f32(uint16_t b)
{
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

wf_status wf_llmc_header_decode(const int32_t h[WF_LLMC_HEADER_INTS], const char *path,
                                wf_model_dims *d)
{
  wf_status st = WF_OK;
  const char *bad;
  *d = (wf_model_dims){.maxT = h[2], .V = h[3], .L = h[4], .NH = h[5], .C = h[6], .Vp = h[7]};
  WF_CHECK(h[0] == WF_LLMC_MAGIC, WF_EFORMAT,
           "%s: not an llm.c GPT-2 checkpoint: magic %d, expected %d", path, h[0], WF_LLMC_MAGIC);
  WF_CHECK(known_version(h[1]), WF_EFORMAT,
           "%s: llm.c checkpoint version %d: weft reads version %d (float32) and %d (bf16), the "
           "formats with the padded vocab in the header",
           path, h[1], WF_LLMC_VERSION, WF_LLMC_VERSION_BF16);
  bad = wf_model_dims_check(d);
  WF_CHECK(bad == NULL, WF_EFORMAT, "%s: bad header dims maxT=%d V=%d L=%d NH=%d C=%d Vp=%d: %s",
           path, d->maxT, d->V, d->L, d->NH, d->C, d->Vp, bad);
fail:
  return st;
}

/* ---- reading ------------------------------------------------------------------------- */

/* Open `path`, read and decode the header, check the file length against it; *version
 * gets the header's version (3 or 5). */
static wf_status open_checkpoint(FILE **out, const char *path, wf_model_dims *d, int *version)
{
  wf_status st = WF_OK;
  int32_t h[WF_LLMC_HEADER_INTS];
  struct stat sb;
  FILE *f = fopen(path, "rb");
  *out = NULL;
  WF_CHECK(f, WF_EIO, "%s: cannot open the llm.c checkpoint: %s", path, strerror(errno));
  WF_CHECK(fstat(fileno(f), &sb) == 0 && fread(h, 4, WF_LLMC_HEADER_INTS, f) == WF_LLMC_HEADER_INTS,
           WF_EFORMAT, "%s: truncated llm.c checkpoint: shorter than its %d-byte header", path,
           WF_LLMC_HEADER_BYTES);
  WF_TRY(wf_llmc_header_decode(h, path, d));
  long long want =
      WF_LLMC_HEADER_BYTES + (long long)wf_model_num_params(d) * (long long)elem_bytes(h[1]);
  WF_CHECK((long long)sb.st_size == want, WF_EFORMAT,
           "%s: %s llm.c checkpoint (version %d, %s): file is %lld bytes, expected %lld for its "
           "header dims L=%d NH=%d C=%d maxT=%d V=%d Vp=%d",
           path, (long long)sb.st_size < want ? "truncated" : "oversized", h[1],
           h[1] == WF_LLMC_VERSION_BF16 ? "bf16" : "float32", (long long)sb.st_size, want, d->L,
           d->NH, d->C, d->maxT, d->V, d->Vp);
  *out = f;
  if (version)
    *version = h[1];
  return WF_OK;
fail:
  if (f)
    fclose(f);
  return st;
}

bool wf_llmc_dims(const char *path, wf_model_dims *d)
{
  int32_t h[WF_LLMC_HEADER_INTS];
  FILE *f = fopen(path, "rb");
  bool ok = f && fread(h, 4, WF_LLMC_HEADER_INTS, f) == WF_LLMC_HEADER_INTS &&
            h[0] == WF_LLMC_MAGIC && known_version(h[1]);
  if (f)
    fclose(f);
  if (!ok)
    return false;
  *d = (wf_model_dims){.maxT = h[2], .V = h[3], .L = h[4], .NH = h[5], .C = h[6], .Vp = h[7]};
  return !wf_model_dims_check(d);
}

wf_status wf_llmc_peek(const char *path, wf_model_dims *d)
{
  FILE *f;
  wf_status st = open_checkpoint(&f, path, d, NULL);
  if (st == WF_OK)
    fclose(f);
  return st;
}

/* NULL when equal, else the name of the first field that differs (values in *a, *b). */
static const char *dims_diff(const wf_model_dims *x, const wf_model_dims *y, int *a, int *b)
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

/* llm.c's files hold GPT-2 alone. */
static wf_status gpt2_only(const char *path, const wf_model_dims *d)
{
  if (wf_model_family(d)->llmc)
    return WF_OK;
  WF_ERROR("%s: llm.c checkpoints hold GPT-2 only, and this model is model.family=%s; write "
           "Hugging Face safetensors instead (--save-format safetensors, --export safetensors)",
           path, wf_model_family_name(d));
  return WF_EINVAL;
}

/* n parameters from the file's position into out: float32 read straight, bf16 widened
 * through a bounded buffer; out NULL: read through a bounded buffer and dropped (a
 * check, which holds no range). */
static wf_status read_params(FILE *f, const char *path, int version, float *out, size_t n)
{
  wf_status st = WF_OK;
  enum { CHUNK = 1 << 16 };
  size_t eb = elem_bytes(version);
  bool straight = out && eb == sizeof *out;
  void *raw = straight ? (void *)out : malloc(CHUNK * eb);
  WF_CHECK_ALLOC(raw);
  for (size_t i = 0, k; i < n; i += k) {
    k = straight ? n : WF_MIN((size_t)CHUNK, n - i);
    WF_CHECK(fread(raw, eb, k, f) == k, WF_EIO, "%s: read error in the parameters: %s", path,
             ferror(f) ? strerror(errno) : "unexpected end of file");
    for (size_t j = 0; out && !straight && j < k; j++)
      out[i + j] = bf16_to_f32(((const uint16_t *)raw)[j]);
  }
fail:
  if (!straight)
    free(raw);
  return st;
}

/* The checkpoint at path opened for the model of dims d (its header checked against
 * them), positioned at its parameters. */
static wf_status open_for(FILE **f, const char *path, const wf_model_dims *d, int *version)
{
  wf_status st = WF_OK;
  wf_model_dims fd;
  int a, b;
  WF_TRY(gpt2_only(path, d));
  WF_TRY(open_checkpoint(f, path, &fd, version));
  const char *field = dims_diff(&fd, d, &a, &b);
  WF_CHECK(!field, WF_EFORMAT,
           "%s: checkpoint has %s = %d but the model has %d; set the model's dimensions to the "
           "checkpoint's",
           path, field, a, b);
fail:
  if (st != WF_OK && *f) {
    fclose(*f);
    *f = NULL;
  }
  return st;
}

/* wf_llmc_read_shard over one run inside [lo, hi): its elements read where the file
 * holds them (the file is the whole model's flat vector after the header), into dst
 * (NULL: dropped). */
typedef struct shard_read {
  FILE *f;
  const char *path;
  int version;
  float *dst;
  size_t lo;
  wf_status st;
} shard_read;

static void read_run(void *user, const wf_model_run *r)
{
  shard_read *x = user;
  if (x->st != WF_OK)
    return;
  size_t eb = elem_bytes(x->version);
  long long at = WF_LLMC_HEADER_BYTES + (long long)r->full * (long long)eb;
  wf_status st = WF_OK;
  FILE *f = x->f;
  const char *path = x->path;
  WF_CHECK(fseeko(f, (off_t)at, SEEK_SET) == 0, WF_EIO, "%s: cannot seek to byte %lld: %s", path,
           at, strerror(errno));
  st = read_params(f, path, x->version, x->dst ? x->dst + (r->local - x->lo) : NULL, r->n);
fail:
  x->st = st;
}

wf_status wf_llmc_read_shard(const char *path, const wf_model_dims *d, const wf_model_shard *s,
                             size_t lo, size_t hi, float *dst)
{
  shard_read x = {.path = path, .dst = dst, .lo = lo};
  wf_status st = open_for(&x.f, path, d, &x.version);
  if (st != WF_OK)
    return st;
  wf_model_shard_runs_in(d, s, lo, hi, read_run, &x);
  fclose(x.f);
  return x.st;
}

wf_status wf_llmc_read(const char *path, const wf_model_dims *d, float *full)
{
  wf_status st = WF_OK;
  FILE *f = NULL;
  int version;
  WF_TRY(open_for(&f, path, d, &version));
  st = read_params(f, path, version, full, wf_model_num_params(d));
fail:
  if (f)
    fclose(f);
  return st;
}

/* ---- writing ------------------------------------------------------------------------- */

/* n parameters rounded to bf16 (the kernels' rounding: nearest, ties to even, as mixed
 * precision and llm.c's float -> bf16 conversion round), then the top half of each
 * rounded float32, which is exactly its bf16; through bounded buffers. */
static wf_status write_bf16(wf_afile *f, const float *full, size_t n)
{
  wf_status st = WF_OK;
  enum { CHUNK = 1 << 16 };
  float *rounded = NULL;
  uint16_t *raw = NULL;
  WF_CHECK_ALLOC(rounded = malloc(CHUNK * sizeof *rounded));
  WF_CHECK_ALLOC(raw = malloc(CHUNK * sizeof *raw));
  for (size_t i = 0; i < n;) {
    size_t k = WF_MIN((size_t)CHUNK, n - i);
    wf_round_bf16(rounded, full + i, k);
    for (size_t j = 0; j < k; j++) {
      uint32_t u;
      memcpy(&u, &rounded[j], sizeof u);
      raw[j] = (uint16_t)(u >> 16);
    }
    WF_TRY(wf_afile_write(f, raw, k * sizeof *raw));
    i += k;
  }
fail:
  free(rounded);
  free(raw);
  return st;
}

wf_status wf_llmc_write_version(const char *path, const wf_model_dims *d, const float *full,
                                int version)
{
  wf_status st = WF_OK;
  int32_t h[WF_LLMC_HEADER_INTS];
  wf_afile f;
  size_t n = wf_model_num_params(d);
  WF_TRY(gpt2_only(path, d));
  WF_CHECK(known_version(version), WF_EINVAL, "%s: cannot write llm.c checkpoint version %d", path,
           version);
  header_encode(h, d, version);
  WF_TRY(wf_afile_open(&f, path, 0644, 0));
  st = wf_afile_write(&f, h, sizeof h);
  if (st == WF_OK && version == WF_LLMC_VERSION_BF16)
    st = write_bf16(&f, full, n);
  else if (st == WF_OK)
    st = wf_afile_write(&f, full, n * sizeof *full);
  if (st != WF_OK) {
    wf_afile_abort(&f);
    goto fail;
  }
  st = wf_afile_commit(&f, NULL, NULL);
fail:
  return st;
}

wf_status wf_llmc_write(const char *path, const wf_model_dims *d, const float *full)
{
  return wf_llmc_write_version(path, d, full, WF_LLMC_VERSION);
}

/* A whole model on one rank: the file passes through one host array of parameters. */
static wf_status whole_only(const wf_model *m, const char *path, float **full)
{
  const wf_model_shard *s = wf_model_get_shard(m);
  *full = NULL;
  if (s->tp != 1 || !s->first || !s->last || s->chunks > 1) {
    WF_ERROR("%s: an llm.c checkpoint holds the whole model; this rank holds a shard (use "
             "wf_gather_full or wf_model_import_full)",
             path);
    return WF_EINVAL;
  }
  *full = malloc(wf_model_num_params(wf_model_get_dims(m)) * sizeof **full);
  if (*full)
    return WF_OK;
  WF_ERROR("%s: out of memory for the model's parameters", path);
  return WF_ENOMEM;
}

/* The parameters (which 0) or gradients (1) of a whole model into full. */
static wf_status export_whole(wf_model *m, int which, float *full)
{
  memset(full, 0, wf_model_num_params(wf_model_get_dims(m)) * sizeof *full);
  return wf_model_export_full(m, which, full);
}

wf_status wf_model_load_llmc(wf_model *m, const char *path)
{
  float *full;
  wf_status st = whole_only(m, path, &full);
  if (st == WF_OK)
    st = wf_llmc_read(path, wf_model_get_dims(m), full);
  if (st == WF_OK)
    st = wf_model_import_full(m, 0, full);
  free(full);
  return st;
}

wf_status wf_model_save_llmc(wf_model *m, const char *path)
{
  float *full;
  wf_status st = whole_only(m, path, &full);
  if (st == WF_OK)
    st = export_whole(m, 0, full);
  if (st == WF_OK)
    st = wf_llmc_write(path, wf_model_get_dims(m), full);
  free(full);
  return st;
}

/* ---- debug state ------------------------------------------------------------------------ */

wf_status wf_llmc_write_state(const char *path, const wf_model_dims *d, int B, int T,
                              const int *inputs, const int *targets, const float *logits,
                              float loss, const float *grads)
{
  wf_status st = WF_OK;
  size_t N = (size_t)B * (size_t)T;
  int32_t h[WF_LLMC_HEADER_INTS] = {WF_LLMC_STATE_MAGIC, STATE_VERSION, B, T};
  wf_afile f;
  WF_TRY(wf_afile_open(&f, path, 0644, 0));
  WF_TRY(wf_afile_write(&f, h, sizeof h));
  WF_TRY(wf_afile_write(&f, inputs, N * sizeof *inputs));
  WF_TRY(wf_afile_write(&f, targets, N * sizeof *targets));
  for (size_t i = 0; i < N; i++) /* the unpadded columns of each row */
    WF_TRY(wf_afile_write(&f, logits + i * (size_t)d->Vp, (size_t)d->V * sizeof *logits));
  WF_TRY(wf_afile_write(&f, &loss, sizeof loss));
  WF_TRY(wf_afile_write(&f, grads, wf_model_num_params(d) * sizeof *grads));
  st = wf_afile_commit(&f, NULL, NULL);
fail:
  return st;
}

wf_status wf_model_dump_state(wf_model *m, const char *path, const int *inputs, const int *targets,
                              int B, int T)
{
  wf_status st = WF_OK;
  const wf_model_dims *d = wf_model_get_dims(m);
  size_t nl = (size_t)B * (size_t)T * (size_t)d->Vp;
  float loss = 0, *logits = NULL, *grads = NULL;
  WF_CHECK(inputs && targets, WF_EINVAL, "%s: the debug state needs inputs and targets", path);
  WF_CHECK(B > 0 && T > 0 && B * T <= m->Bmax * m->Tmax && T <= m->Tmax, WF_EINVAL,
           "%s: cannot dump the debug state of a %d x %d batch: the model was created for at "
           "most %d x %d",
           path, B, T, m->Bmax, m->Tmax);
  WF_TRY(whole_only(m, path, &grads));
  WF_CHECK_ALLOC(logits = malloc(nl * sizeof *logits));
  WF_TRY(wf_model_zero_grad(m));
  WF_TRY(wf_model_forward(m, inputs, targets, B, T, &loss));
  /* The logits become their gradient in backward, so they are kept first. */
  WF_TRY(wf_model_logits_read(m, logits, 0, nl));
  WF_TRY(wf_model_backward(m, 1.0f));
  WF_TRY(export_whole(m, 1, grads));
  st = wf_llmc_write_state(path, d, B, T, inputs, targets, logits, loss, grads);
fail:
  free(logits);
  free(grads);
  return st;
}
