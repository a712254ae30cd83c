/*
 * weights.c - the whole model's weights in and out of a job (wf_ckpt.h, "weights"): one
 * dispatch over the formats, so model.init, --generate, --save and --export read and
 * write every format through the same few functions.
 *
 * A path is told apart by what it is: a directory is a weft checkpoint (or a checkpoint
 * directory holding `latest`); a file starting with llm.c's magic is an llm.c checkpoint
 * (its version, 3 or 5, is the codec's business); a file named *.safetensors, or whose
 * first 8 bytes are a plausible header length followed by '{', is safetensors. Anything
 * else is refused with the three things it could have been.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_int.h"

typedef enum kind { K_LLMC, K_SAFETENSORS, K_CKPT } kind;

static const struct {
  const char *name, *describe;
  wf_weights_fmt fmt;
} formats[] = {
    {"llmc", "llm.c GPT-2 checkpoint, version 3 (float32)", WF_WEIGHTS_LLMC},
    {"llmc-bf16", "llm.c GPT-2 checkpoint, version 5 (bf16)", WF_WEIGHTS_LLMC_BF16},
    {"safetensors", "Hugging Face safetensors (GPT2LMHeadModel names, float32)",
     WF_WEIGHTS_SAFETENSORS},
};

bool wf_weights_fmt_parse(const char *name, wf_weights_fmt *f)
{
  for (size_t i = 0; i < WF_ARRAY_LEN(formats); i++) {
    if (!strcmp(name, formats[i].name)) {
      *f = formats[i].fmt;
      return true;
    }
  }
  return false;
}

const char *wf_weights_fmt_describe(wf_weights_fmt f)
{
  for (size_t i = 0; i < WF_ARRAY_LEN(formats); i++)
    if (formats[i].fmt == f)
      return formats[i].describe;
  return "?";
}

static bool ends_with(const char *s, const char *suffix)
{
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* What `path` holds, from its type, name and first bytes; quiet when `what` is NULL. */
static wf_status kind_of(const char *path, const char *what, kind *k)
{
  struct stat sb;
  unsigned char head[9] = {0};
  if (stat(path, &sb) != 0) {
    if (what)
      WF_ERROR("%s=%s: cannot open it: %s", what, path, strerror(errno));
    return WF_EIO;
  }
  if (S_ISDIR(sb.st_mode)) {
    *k = K_CKPT;
    return WF_OK;
  }
  if (ends_with(path, ".safetensors")) {
    *k = K_SAFETENSORS;
    return WF_OK;
  }
  FILE *f = S_ISREG(sb.st_mode) ? fopen(path, "rb") : NULL;
  size_t got = f ? fread(head, 1, sizeof head, f) : 0;
  if (f)
    fclose(f);
  int32_t magic;
  uint64_t hlen;
  memcpy(&magic, head, 4);
  memcpy(&hlen, head, 8);
  *k = got >= 4 && magic == WF_LLMC_MAGIC ? K_LLMC : K_SAFETENSORS;
  if (got >= 4 && magic == WF_LLMC_MAGIC)
    return WF_OK;
  if (got == sizeof head && hlen + 8 <= (uint64_t)sb.st_size && head[8] == '{')
    return WF_OK;
  if (what)
    WF_ERROR("%s=%s: not model weights weft can read: neither an llm.c GPT-2 checkpoint "
             "(magic %d), a safetensors file, nor a weft checkpoint directory",
             what, path, WF_LLMC_MAGIC);
  return WF_EFORMAT;
}

/* The checkpoint a directory path stands for. */
static wf_status ckpt_dir(const char *path, char *dir, size_t len)
{
  return wf__resolve(path, dir, len);
}

wf_status wf_weights_peek(const char *path, const char *what, wf_gpt_dims *d)
{
  wf_status st = WF_OK;
  char dir[WF__PATH_LEN];
  kind k;
  WF_TRY(kind_of(path, what, &k));
  if (k == K_LLMC)
    return wf_llmc_peek(path, d);
  if (k == K_SAFETENSORS)
    return wf_safetensors_peek(path, d, NULL, 0);
  WF_TRY(ckpt_dir(path, dir, sizeof dir));
  st = wf__ckpt_model_dims(dir, d);
fail:
  return st;
}

bool wf_weights_probe(const char *path, wf_gpt_dims *d)
{
  char err[1024], dir[WF__PATH_LEN];
  kind k;
  if (kind_of(path, NULL, &k) != WF_OK)
    return false;
  if (k == K_LLMC)
    return wf_llmc_dims(path, d);
  if (k == K_SAFETENSORS)
    return wf_safetensors_peek(path, d, err, sizeof err) == WF_OK;
  /* a directory with no checkpoint is quietly none; a broken one's reader logs */
  char latest[WF__PATH_LEN];
  wf__pathf(latest, sizeof latest, "%s/" WF__LATEST, path);
  if (!wf__has_manifest(path) && !wf__is_file(latest))
    return false;
  return wf__resolve(path, dir, sizeof dir) == WF_OK && wf__ckpt_model_dims(dir, d) == WF_OK;
}

wf_status wf_weights_read(const char *path, const char *what, const wf_gpt_dims *d, float *full)
{
  wf_status st = WF_OK;
  char dir[WF__PATH_LEN];
  kind k;
  WF_TRY(kind_of(path, what, &k));
  if (k == K_LLMC)
    return wf_llmc_read(path, d, full);
  if (k == K_SAFETENSORS)
    return wf_safetensors_read(path, d, full, NULL, 0);
  WF_TRY(ckpt_dir(path, dir, sizeof dir));
  st = wf__ckpt_model_read(dir, d, full);
fail:
  return st;
}

wf_status wf_weights_check(const char *path, const char *what, wf_gpt_dims *d)
{
  wf_status st = WF_OK;
  float *full = NULL;
  WF_TRY(wf_weights_peek(path, what, d));
  WF_CHECK(full = malloc(wf_gpt_num_params(d) * sizeof *full), WF_ENOMEM,
           "%s=%s: out of memory for the model's %zu parameters", what, path, wf_gpt_num_params(d));
  st = wf_weights_read(path, what, d, full);
fail:
  free(full);
  return st;
}

wf_status wf_weights_write(const char *path, wf_weights_fmt f, const wf_gpt_dims *d,
                           const float *full)
{
  switch (f) {
  case WF_WEIGHTS_LLMC: return wf_llmc_write_version(path, d, full, WF_LLMC_VERSION);
  case WF_WEIGHTS_LLMC_BF16: return wf_llmc_write_version(path, d, full, WF_LLMC_VERSION_BF16);
  case WF_WEIGHTS_SAFETENSORS: return wf_safetensors_write(path, d, full, NULL, 0);
  }
  WF_ERROR("%s: unknown weights format %d", path, (int)f);
  return WF_EINVAL;
}

wf_status wf_ckpt_export(const char *dir, const char *out_path, wf_weights_fmt f)
{
  wf_status st = WF_OK;
  wf_gpt_dims d;
  float *full = NULL;
  WF_TRY(wf__ckpt_model_dims(dir, &d));
  WF_CHECK(full = malloc(wf_gpt_num_params(&d) * sizeof *full), WF_ENOMEM,
           "cannot export %s: out of memory", dir);
  WF_TRY(wf__ckpt_model_read(dir, &d, full));
  st = wf_weights_write(out_path, f, &d, full);
fail:
  free(full);
  return st;
}

wf_status wf_weights_export(const wf_config *cfg, const char *out_path, wf_weights_fmt f, char *src,
                            size_t src_len)
{
  wf_status st = WF_OK;
  wf_gpt_dims d;
  float *full = NULL;
  WF_CHECK(cfg->model.init[0] || cfg->train.resume[0] || cfg->train.checkpoint_dir[0], WF_ECONFIG,
           "--export needs weights to convert: model.init=FILE (an llm.c or safetensors file, or "
           "a weft checkpoint), train.resume=DIR or train.checkpoint_dir=DIR");
  if (!cfg->model.init[0]) { /* train.resume's checkpoint, or the latest in checkpoint_dir */
    WF_TRY(wf_ckpt_locate(cfg, src, src_len));
    return wf_ckpt_export(src, out_path, f);
  }
  wf_strlcpy(src, cfg->model.init, src_len);
  WF_TRY(wf_weights_peek(src, "model.init", &d));
  WF_CHECK(full = malloc(wf_gpt_num_params(&d) * sizeof *full), WF_ENOMEM,
           "model.init=%s: out of memory for the model's %zu parameters", src,
           wf_gpt_num_params(&d));
  WF_TRY(wf_weights_read(src, "model.init", &d, full));
  st = wf_weights_write(out_path, f, &d, full);
fail:
  free(full);
  return st;
}
