/*
 * weights.c - the whole model's weights in and out of a job (wf_ckpt.h, "weights"): one
 * dispatch over the formats, so model.init, --generate, --save and --export read and
 * write every format through the same few functions.
 *
 * A path is told apart by what it is: a directory is a weft checkpoint (or a checkpoint
 * directory holding `latest`), or else a Hugging Face model folder (model.safetensors, or
 * model.safetensors.index.json and its shards); a file starting with llm.c's magic is an
 * llm.c checkpoint (its version, 3 or 5, is the codec's business); a file named
 * *.safetensors or *.safetensors.index.json, or whose first 8 bytes are a plausible
 * header length followed by '{', is safetensors. Anything else is refused with the
 * things it could have been.
 *
 * Writing safetensors: a path ending in ".safetensors" is one file; a folder (a path
 * ending in '/', or an existing directory) or a path ending in ".safetensors.index.json"
 * is a Hugging Face model folder: config.json, and model.safetensors, or shards of at
 * most model.shard_mb with model.safetensors.index.json when the model is larger.
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
    {"safetensors", "Hugging Face safetensors (the family's Hugging Face names, float32)",
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

/* The weights a Hugging Face model folder holds (its index, else model.safetensors), into
 * out; false when `dir` is none (e.g. a weft checkpoint directory). */
static bool hf_folder(const char *dir, char *out, size_t len)
{
  static const char *const names[] = {"model.safetensors.index.json", "model.safetensors"};
  if (wf__has_manifest(dir))
    return false;
  for (size_t i = 0; i < WF_ARRAY_LEN(names); i++) {
    wf__pathf(out, len, "%s/%s", dir, names[i]);
    if (wf__is_file(out))
      return true;
  }
  return false;
}

/* What `path` holds, from its type, name and first bytes; quiet when `what` is NULL. A
 * Hugging Face folder's weights file goes into st (else st is path). */
static wf_status kind_of(const char *path, const char *what, kind *k, char *st, size_t len)
{
  struct stat sb;
  unsigned char head[9] = {0};
  wf__pathf(st, len, "%s", path);
  if (stat(path, &sb) != 0) {
    if (what)
      WF_ERROR("%s=%s: cannot open it: %s", what, path, strerror(errno));
    return WF_EIO;
  }
  if (S_ISDIR(sb.st_mode)) {
    *k = hf_folder(path, st, len) ? K_SAFETENSORS : K_CKPT;
    return WF_OK;
  }
  if (ends_with(path, ".safetensors") || ends_with(path, ".safetensors.index.json")) {
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
             "(magic %d), a safetensors file (or a sharded model's .safetensors.index.json), "
             "nor a weft checkpoint or Hugging Face model directory",
             what, path, WF_LLMC_MAGIC);
  return WF_EFORMAT;
}

/* The checkpoint a directory path stands for. */
static wf_status ckpt_dir(const char *path, char *dir, size_t len)
{
  return wf__resolve(path, dir, len);
}

wf_status wf_weights_peek(const char *path, const char *what, wf_model_dims *d)
{
  wf_status st = WF_OK;
  char dir[WF__PATH_LEN], file[WF__PATH_LEN];
  kind k;
  WF_TRY(kind_of(path, what, &k, file, sizeof file));
  if (k == K_LLMC)
    return wf_llmc_peek(path, d);
  if (k == K_SAFETENSORS)
    return wf_safetensors_peek(file, d, NULL, 0);
  WF_TRY(ckpt_dir(path, dir, sizeof dir));
  st = wf__ckpt_model_dims(dir, d);
fail:
  return st;
}

bool wf_weights_probe(const char *path, wf_model_dims *d)
{
  char err[1024], dir[WF__PATH_LEN], file[WF__PATH_LEN];
  kind k;
  if (kind_of(path, NULL, &k, file, sizeof file) != WF_OK)
    return false;
  if (k == K_LLMC)
    return wf_llmc_dims(path, d);
  if (k == K_SAFETENSORS)
    return wf_safetensors_peek(file, d, err, sizeof err) == WF_OK;
  /* a directory with no checkpoint is quietly none; a broken one's reader logs */
  char latest[WF__PATH_LEN];
  wf__pathf(latest, sizeof latest, "%s/" WF__LATEST, path);
  if (!wf__has_manifest(path) && !wf__is_file(latest))
    return false;
  return wf__resolve(path, dir, sizeof dir) == WF_OK && wf__ckpt_model_dims(dir, d) == WF_OK;
}

wf_status wf_weights_read(const char *path, const char *what, const wf_model_dims *d, float *full)
{
  wf_status st = WF_OK;
  char dir[WF__PATH_LEN], file[WF__PATH_LEN];
  kind k;
  WF_TRY(kind_of(path, what, &k, file, sizeof file));
  if (k == K_LLMC)
    return wf_llmc_read(path, d, full);
  if (k == K_SAFETENSORS)
    return wf_safetensors_read(file, d, full, NULL, 0);
  WF_TRY(ckpt_dir(path, dir, sizeof dir));
  st = wf__ckpt_model_read(dir, d, full);
fail:
  return st;
}

wf_status wf_weights_read_shard(const char *path, const char *what, const wf_model_dims *d,
                                const wf_model_shard *s, size_t lo, size_t hi, float *dst)
{
  wf_status st = WF_OK;
  char dir[WF__PATH_LEN], file[WF__PATH_LEN];
  kind k;
  WF_TRY(kind_of(path, what, &k, file, sizeof file));
  if (k == K_LLMC)
    return wf_llmc_read_shard(path, d, s, lo, hi, dst);
  if (k == K_SAFETENSORS)
    return wf_safetensors_read_shard(file, d, s, lo, hi, dst, NULL, 0);
  WF_TRY(ckpt_dir(path, dir, sizeof dir));
  st = wf__ckpt_model_read_shard(dir, d, s, lo, hi, dst);
fail:
  return st;
}

wf_status wf_weights_check(const char *path, const char *what, wf_model_dims *d)
{
  wf_status st = WF_OK;
  WF_TRY(wf_weights_peek(path, what, d));
  wf_model_shard whole = wf_model_shard_whole(d);
  st = wf_weights_read_shard(path, what, d, &whole, 0, wf_model_num_params(d), NULL);
fail:
  return st;
}

/* A Hugging Face folder to write: an index path as given (its shards beside it), or in
 * a folder (a path ending in '/', or an existing directory) the index when the model is
 * larger than a shard, else model.safetensors; into out. false for a plain file path. */
static bool folder_target(const char *path, const wf_model_dims *d, size_t shard, char *out,
                          size_t len)
{
  struct stat sb;
  if (ends_with(path, ".safetensors.index.json")) {
    wf__pathf(out, len, "%s", path);
    return true;
  }
  bool exists = stat(path, &sb) == 0;
  if (!ends_with(path, "/") && (!exists || !S_ISDIR(sb.st_mode)))
    return false;
  if (!exists && mkdir(path, 0755) != 0)
    WF_WARN("%s: cannot create the folder: %s", path, strerror(errno)); /* the write says */
  bool big = wf_model_num_params(d) * sizeof(float) > shard;
  wf__pathf(out, len, "%s%s%s", path, ends_with(path, "/") ? "" : "/",
            big ? "model.safetensors.index.json" : "model.safetensors");
  return true;
}

wf_status wf_weights_write(const char *path, wf_weights_fmt f, const wf_model_dims *d,
                           const float *full, size_t shard_bytes)
{
  char dst[WF__PATH_LEN];
  size_t shard = shard_bytes ? shard_bytes : (size_t)5000000000ull; /* save_pretrained's 5GB */
  switch (f) {
  case WF_WEIGHTS_LLMC: return wf_llmc_write_version(path, d, full, WF_LLMC_VERSION);
  case WF_WEIGHTS_LLMC_BF16: return wf_llmc_write_version(path, d, full, WF_LLMC_VERSION_BF16);
  case WF_WEIGHTS_SAFETENSORS:
    if (folder_target(path, d, shard, dst, sizeof dst))
      return wf_safetensors_write(dst, d, full, shard, true, NULL, 0);
    return wf_safetensors_write(path, d, full, 0, false, NULL, 0);
  }
  WF_ERROR("%s: unknown weights format %d", path, (int)f);
  return WF_EINVAL;
}

wf_status wf_ckpt_export(const char *dir, const char *out_path, wf_weights_fmt f,
                         size_t shard_bytes)
{
  wf_status st = WF_OK;
  wf_model_dims d;
  float *full = NULL;
  WF_TRY(wf__ckpt_model_dims(dir, &d));
  WF_CHECK(full = malloc(wf_model_num_params(&d) * sizeof *full), WF_ENOMEM,
           "cannot export %s: out of memory", dir);
  WF_TRY(wf__ckpt_model_read(dir, &d, full));
  st = wf_weights_write(out_path, f, &d, full, shard_bytes);
fail:
  free(full);
  return st;
}

wf_status wf_weights_export(const wf_config *cfg, const char *out_path, wf_weights_fmt f, char *src,
                            size_t src_len)
{
  wf_status st = WF_OK;
  wf_model_dims d;
  float *full = NULL;
  size_t shard = (size_t)(cfg->model.shard_mb * 1e6); /* a safetensors folder's shards */
  WF_CHECK(cfg->model.init[0] || cfg->train.resume[0] || cfg->train.checkpoint_dir[0], WF_ECONFIG,
           "--export needs weights to convert: model.init=FILE (an llm.c or safetensors file, or "
           "a weft checkpoint), train.resume=DIR or train.checkpoint_dir=DIR");
  if (!cfg->model.init[0]) { /* train.resume's checkpoint, or the latest in checkpoint_dir */
    WF_TRY(wf_ckpt_locate(cfg, src, src_len));
    return wf_ckpt_export(src, out_path, f, shard);
  }
  wf_strlcpy(src, cfg->model.init, src_len);
  WF_TRY(wf_weights_peek(src, "model.init", &d));
  WF_CHECK(full = malloc(wf_model_num_params(&d) * sizeof *full), WF_ENOMEM,
           "model.init=%s: out of memory for the model's %zu parameters", src,
           wf_model_num_params(&d));
  WF_TRY(wf_weights_read(src, "model.init", &d, full));
  st = wf_weights_write(out_path, f, &d, full, shard);
fail:
  free(full);
  return st;
}
