/*
 * data.c - the data sources behind wf_data.h.
 *
 * Files are mmap()ed, never copied: llm.c shard sets run to tens of GB. A source is a
 * list of spans (one per file) that together form one token stream; the train split is
 * its head and the validation split its tail, and a window of T+1 tokens is drawn
 * wholly inside one split (it may cross from one shard into the next).
 *
 * Every random choice is a Philox value keyed by (seed, stream, index), so a row never
 * depends on which rank or micro-batch asks for it:
 *   stream = DATA_TAG << 48 | split << 47 | index (the step, or the eval batch),
 *   counter = global row (files: the window start) or row << 32 | t (synthetic tokens).
 * The tag keeps data streams apart from the model's init streams (kind * 4096 + layer),
 * which use the same seed.
 *
 * The synthetic chain itself is fixed (its own constant seed), so its entropy floor is
 * the same for every run with the same vocabulary; train.seed only changes the samples.
 * Invariants: every token handed out is < the model's vocabulary; files are checked
 * once, at open, so a batch can never fail on bad data half-way through training.
 *
 * Test hooks (read once): WEFT_TEST_DATA_FAIL=R:S makes world rank R's training batches
 * of step S fail with WF_EIO, as a shard on a failing disk would, so a test can fail
 * one rank alone in the middle of a pipeline schedule; WEFT_TEST_DATA_STALL=R:S makes
 * that read hang instead (a stuck file system), for the hang diagnosis.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wf_io.h"

#define SHARD_MAGIC        20240520
#define SHARD_VERSION      1
#define SHARD_HEADER_BYTES 1024     /* int32[256] */
#define CKPT_MAGIC         20240326 /* an llm.c model checkpoint, a common mix-up */

#define CHAIN_MAX_K    64
#define CHAIN_MIN_SUCC 4
#define CHAIN_MAX_SUCC 8
#define CHAIN_SEED     0x5eedc4a1ull /* fixes the chain; not train.seed */
#define DATA_TAG       0xDA7Aull

typedef struct span {
  void *map;        /* the whole file */
  size_t map_len;   /* bytes mapped */
  const void *tok;  /* first token: uint8 (text) or uint16 (shard) */
  int width;        /* bytes per token */
  int64_t first, n; /* position of the first token in the stream, token count */
} span;

typedef struct chain {
  int K;
  int n[CHAIN_MAX_K];                      /* successors of each state */
  int succ[CHAIN_MAX_K][CHAIN_MAX_SUCC];   /* their symbols */
  double cdf[CHAIN_MAX_K][CHAIN_MAX_SUCC]; /* cumulative transition probabilities */
  double pi[CHAIN_MAX_K];                  /* stationary distribution */
  double pi_cdf[CHAIN_MAX_K];
  double H; /* entropy rate, nats per token */
} chain;

struct wf_data {
  wf_data_kind kind;
  int vocab, T, batch_size;
  uint64_t seed;
  span *spans;
  int n_spans;
  int64_t n_tokens, n_train; /* validation = [n_train, n_tokens) */
  chain ch;
  char desc[WF_PATH_MAX + 256];
};

/* ---- helpers ------------------------------------------------------------------- */

static double unit(uint64_t r) { return (double)(r >> 11) * (1.0 / 9007199254740992.0); }

static uint64_t data_stream(wf_data_split split, int64_t index)
{
  return DATA_TAG << 48 | (uint64_t)split << 47 | ((uint64_t)index & ((1ull << 47) - 1));
}

static int sample_cdf(const double *cdf, int n, double u)
{
  for (int i = 0; i < n - 1; i++)
    if (u < cdf[i])
      return i;
  return n - 1;
}

/* ---- the synthetic Markov chain ------------------------------------------------- */

/* Row i: always i -> i+1 (so the chain is irreducible), plus 3-7 distinct random
 * successors; weights are Exp(1) draws, i.e. the row is a Dirichlet(1) sample. */
static void chain_row_build(chain *c, int i)
{
  uint64_t stream = 0xC4A1ull << 48 | (uint64_t)i;
  uint64_t ctr = 0;
  int n = CHAIN_MIN_SUCC +
          (int)(wf_rng_u64(CHAIN_SEED, stream, ctr++) % (CHAIN_MAX_SUCC - CHAIN_MIN_SUCC + 1));
  n = WF_MIN(n, c->K);
  c->succ[i][0] = (i + 1) % c->K;
  for (int k = 1; k < n;) {
    int s = (int)(wf_rng_u64(CHAIN_SEED, stream, ctr++) % (uint64_t)c->K);
    int dup = 0;
    for (int j = 0; j < k; j++)
      dup |= c->succ[i][j] == s;
    if (!dup)
      c->succ[i][k++] = s;
  }
  double w[CHAIN_MAX_SUCC], sum = 0;
  for (int k = 0; k < n; k++) {
    w[k] = -log(1.0 - unit(wf_rng_u64(CHAIN_SEED, stream, ctr++)));
    sum += w[k];
  }
  double acc = 0, h = 0;
  for (int k = 0; k < n; k++) {
    double p = w[k] / sum;
    acc += p;
    c->cdf[i][k] = acc;
    h -= p > 0 ? p * log(p) : 0;
  }
  c->cdf[i][n - 1] = 1.0;
  c->n[i] = n;
  c->pi[i] = h; /* row entropy, parked here until chain_stationary() */
}

static double row_prob(const chain *c, int i, int k)
{
  return k == 0 ? c->cdf[i][0] : c->cdf[i][k] - c->cdf[i][k - 1];
}

/* Power iteration on the lazy chain (P + I) / 2: same stationary distribution, but
 * aperiodic, so it converges; the i -> i+1 cycle makes the distribution unique. */
static void chain_stationary(chain *c, const double *row_h)
{
  double p[CHAIN_MAX_K], q[CHAIN_MAX_K];
  for (int i = 0; i < c->K; i++)
    p[i] = 1.0 / c->K;
  for (int it = 0; it < 200000; it++) {
    for (int i = 0; i < c->K; i++)
      q[i] = 0.5 * p[i];
    for (int i = 0; i < c->K; i++)
      for (int k = 0; k < c->n[i]; k++)
        q[c->succ[i][k]] += 0.5 * p[i] * row_prob(c, i, k);
    double diff = 0;
    for (int i = 0; i < c->K; i++) {
      diff += fabs(q[i] - p[i]);
      p[i] = q[i];
    }
    if (diff < 1e-15)
      break;
  }
  double acc = 0, H = 0;
  for (int i = 0; i < c->K; i++) {
    c->pi[i] = p[i];
    acc += p[i];
    c->pi_cdf[i] = acc;
    H += p[i] * row_h[i];
  }
  c->pi_cdf[c->K - 1] = 1.0;
  c->H = H;
}

static void chain_build(chain *c, int vocab)
{
  double row_h[CHAIN_MAX_K];
  c->K = WF_MIN(vocab, CHAIN_MAX_K);
  for (int i = 0; i < c->K; i++) {
    chain_row_build(c, i);
    row_h[i] = c->pi[i];
  }
  chain_stationary(c, row_h);
}

/* A row starts in a state drawn from pi, so every target is a stationary transition
 * and the best possible mean loss is exactly H. */
static void chain_window(const wf_data *d, int *win, uint64_t stream, int64_t row)
{
  const chain *c = &d->ch;
  uint64_t base = (uint64_t)row << 32;
  int x = sample_cdf(c->pi_cdf, c->K, unit(wf_rng_u64(d->seed, stream, base)));
  win[0] = x;
  for (int t = 1; t <= d->T; t++) {
    int k = sample_cdf(c->cdf[x], c->n[x], unit(wf_rng_u64(d->seed, stream, base + t)));
    x = c->succ[x][k];
    win[t] = x;
  }
}

/* ---- files ----------------------------------------------------------------------- */

static wf_status map_file(span *sp, const char *path, char *err, size_t err_len)
{
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    snprintf(err, err_len, "data.path: cannot open '%s': %s", path, strerror(errno));
    return WF_EIO;
  }
  struct stat sb;
  wf_status st = WF_OK;
  if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
    snprintf(err, err_len, "data.path: '%s' is not a regular file", path);
    st = WF_EIO;
  } else if (sb.st_size > 0) {
    sp->map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (sp->map == MAP_FAILED) {
      sp->map = NULL;
      snprintf(err, err_len, "data.path: cannot map '%s': %s", path, strerror(errno));
      st = WF_EIO;
    } else {
      sp->map_len = (size_t)sb.st_size;
    }
  }
  close(fd);
  return st;
}

static wf_status check_shard_header(const span *sp, const char *path, char *err, size_t err_len)
{
  int32_t h[3];
  if (sp->map_len < SHARD_HEADER_BYTES) {
    snprintf(err, err_len,
             "llm.c shard '%s' is truncated: %zu bytes, but the header alone is %d bytes "
             "(int32[256])",
             path, sp->map_len, SHARD_HEADER_BYTES);
    return WF_EFORMAT;
  }
  memcpy(h, sp->map, sizeof h);
  if (h[0] != SHARD_MAGIC) {
    snprintf(err, err_len, "llm.c shard '%s': bad magic %d, expected %d (a token shard)%s", path,
             h[0], SHARD_MAGIC,
             h[0] == CKPT_MAGIC ? "; this is a model checkpoint, pass it as model.init" : "");
    return WF_EFORMAT;
  }
  if (h[1] != SHARD_VERSION) {
    snprintf(err, err_len, "llm.c shard '%s': unsupported version %d, expected %d", path, h[1],
             SHARD_VERSION);
    return WF_EFORMAT;
  }
  if (h[2] <= 0) {
    snprintf(err, err_len, "llm.c shard '%s': header says %d tokens, expected at least 1", path,
             h[2]);
    return WF_EFORMAT;
  }
  return WF_OK;
}

/* Header, size and token range of one mapped shard; sets sp->tok and sp->n. */
static wf_status check_shard(span *sp, const char *path, int vocab, char *err, size_t err_len)
{
  wf_status st = check_shard_header(sp, path, err, err_len);
  if (st != WF_OK)
    return st;
  int32_t h[3];
  memcpy(h, sp->map, sizeof h);
  size_t need = SHARD_HEADER_BYTES + 2 * (size_t)h[2];
  if (sp->map_len < need) {
    snprintf(err, err_len,
             "llm.c shard '%s' is truncated: the header says %d tokens (%zu bytes with the "
             "header) but the file has %zu bytes",
             path, h[2], need, sp->map_len);
    return WF_EFORMAT;
  }
  if (sp->map_len > need) {
    snprintf(err, err_len,
             "llm.c shard '%s': the header's token count %d disagrees with the file size: "
             "%zu bytes after the header hold %zu tokens",
             path, h[2], sp->map_len - SHARD_HEADER_BYTES, (sp->map_len - SHARD_HEADER_BYTES) / 2);
    return WF_EFORMAT;
  }
  sp->tok = (const unsigned char *)sp->map + SHARD_HEADER_BYTES;
  sp->width = 2;
  sp->n = h[2];
  const uint16_t *tok = sp->tok;
  for (int64_t i = 0; i < sp->n; i++) {
    if (tok[i] >= vocab) {
      snprintf(err, err_len,
               "llm.c shard '%s': token %u at index %lld is not below the model's vocabulary "
               "%d; use a model whose vocabulary covers the tokenizer (GPT-2: 50257)",
               path, tok[i], (long long)i, vocab);
      return WF_EFORMAT;
    }
  }
  return WF_OK;
}

static wf_status open_shards(wf_data *d, const char *pattern, char *err, size_t err_len)
{
  glob_t g;
  int rc = glob(pattern, 0, NULL, &g);
  if (rc != 0) {
    snprintf(err, err_len, "data.path '%s' matches no file (expected llm.c token shards)", pattern);
    if (rc != GLOB_NOMATCH)
      globfree(&g);
    return WF_ECONFIG;
  }
  wf_status st = WF_OK;
  d->spans = calloc(g.gl_pathc, sizeof *d->spans);
  if (!d->spans) {
    st = WF_ENOMEM;
    goto out_glob;
  }
  for (size_t i = 0; i < g.gl_pathc && st == WF_OK; i++) {
    span *sp = &d->spans[d->n_spans++];
    st = map_file(sp, g.gl_pathv[i], err, err_len);
    if (st == WF_OK)
      st = check_shard(sp, g.gl_pathv[i], d->vocab, err, err_len);
    sp->first = d->n_tokens;
    d->n_tokens += sp->n;
  }
  d->kind = WF_DATA_SHARDS;
  snprintf(d->desc, sizeof d->desc, "llm.c token shards: %zu file%s matching '%s'", g.gl_pathc,
           g.gl_pathc == 1 ? "" : "s", pattern);
out_glob:
  globfree(&g);
  return st;
}

static wf_status open_text(wf_data *d, const char *path, char *err, size_t err_len)
{
  d->spans = calloc(1, sizeof *d->spans);
  if (!d->spans)
    return WF_ENOMEM;
  d->n_spans = 1;
  span *sp = &d->spans[0];
  wf_status st = map_file(sp, path, err, err_len);
  if (st != WF_OK)
    return st;
  if (sp->map_len == 0) {
    snprintf(err, err_len, "text file '%s' is empty", path);
    return WF_EFORMAT;
  }
  sp->tok = sp->map;
  sp->width = 1;
  sp->n = (int64_t)sp->map_len;
  const unsigned char *b = sp->tok;
  for (int64_t i = 0; d->vocab < 256 && i < sp->n; i++) {
    if (b[i] >= d->vocab) {
      snprintf(err, err_len,
               "text file '%s': byte %u at offset %lld is not below the model's vocabulary "
               "%d; byte-level text needs model.vocab 256",
               path, b[i], (long long)i, d->vocab);
      return WF_EFORMAT;
    }
  }
  d->kind = WF_DATA_TEXT;
  d->n_tokens = sp->n;
  snprintf(d->desc, sizeof d->desc, "text file '%s' (byte-level)", path);
  return WF_OK;
}

static bool is_shard_path(const char *path)
{
  size_t n = strlen(path);
  if (strpbrk(path, "*?[") || (n >= 4 && !strcmp(path + n - 4, ".bin")))
    return true;
  int32_t magic = 0;
  FILE *f = fopen(path, "rb");
  if (!f)
    return false; /* open_text reports it */
  bool shard = fread(&magic, sizeof magic, 1, f) == 1 && magic == SHARD_MAGIC;
  fclose(f);
  return shard;
}

/* Head for training, the last val_fraction for validation; each must hold a window. */
static wf_status split_tokens(wf_data *d, double val_fraction, char *err, size_t err_len)
{
  int64_t n_val = (int64_t)floor((double)d->n_tokens * val_fraction);
  d->n_train = d->n_tokens - n_val;
  if (d->n_train < d->T + 1 || (val_fraction > 0 && n_val < d->T + 1)) {
    snprintf(err, err_len,
             "%s: %lld tokens give a train split of %lld and a validation split of %lld "
             "tokens, but each needs at least seq_len + 1 = %d; use more data, a shorter "
             "train.seq_len or another data.val_fraction",
             d->desc, (long long)d->n_tokens, (long long)d->n_train, (long long)n_val, d->T + 1);
    return WF_ECONFIG;
  }
  size_t len = strlen(d->desc);
  snprintf(d->desc + len, sizeof d->desc - len, ", %lld tokens (train %lld, val %lld)",
           (long long)d->n_tokens, (long long)d->n_train, (long long)n_val);
  return WF_OK;
}

/* The n tokens from stream position pos, crossing span boundaries. */
static void read_tokens(const wf_data *d, int *out, int64_t pos, int n)
{
  int lo = 0, hi = d->n_spans - 1;
  while (lo < hi) { /* last span with first <= pos */
    int mid = (lo + hi + 1) / 2;
    if (d->spans[mid].first <= pos)
      lo = mid;
    else
      hi = mid - 1;
  }
  for (int s = lo, i = 0; i < n; s++) {
    const span *sp = &d->spans[s];
    int64_t off = pos + i - sp->first;
    for (; i < n && off < sp->n; i++, off++)
      out[i] = sp->width == 1 ? ((const uint8_t *)sp->tok)[off] : ((const uint16_t *)sp->tok)[off];
  }
}

/* ---- public API ---------------------------------------------------------------------- */

static wf_status check_opts(const wf_data_opts *o, char *err, size_t err_len)
{
  if (o->vocab <= 0 || o->seq_len <= 0 || o->batch_size <= 0) {
    snprintf(err, err_len, "data: vocab %d, seq_len %d and batch_size %d must be positive",
             o->vocab, o->seq_len, o->batch_size);
    return WF_EINVAL;
  }
  if (!(o->val_fraction >= 0 && o->val_fraction < 1)) {
    snprintf(err, err_len, "data.val_fraction = %g, expected a fraction in [0, 1)",
             o->val_fraction);
    return WF_ECONFIG;
  }
  return WF_OK;
}

wf_status wf_data_open(wf_data **out, const wf_data_opts *o, char *err, size_t err_len)
{
  *out = NULL;
  wf_status st = check_opts(o, err, err_len);
  if (st != WF_OK)
    return st;
  wf_data *d = calloc(1, sizeof *d);
  if (!d)
    return WF_ENOMEM;
  d->vocab = o->vocab, d->T = o->seq_len, d->batch_size = o->batch_size, d->seed = o->seed;
  const char *path = o->path ? o->path : "";
  if (!path[0]) {
    d->kind = WF_DATA_SYNTHETIC;
    chain_build(&d->ch, d->vocab);
    snprintf(d->desc, sizeof d->desc,
             "synthetic: a fixed first-order Markov chain over %d of %d symbols, %d-%d "
             "successors each",
             d->ch.K, d->vocab, CHAIN_MIN_SUCC, CHAIN_MAX_SUCC);
  } else {
    st =
        is_shard_path(path) ? open_shards(d, path, err, err_len) : open_text(d, path, err, err_len);
    if (st == WF_OK)
      st = split_tokens(d, o->val_fraction, err, err_len);
  }
  if (st != WF_OK) {
    wf_data_destroy(d);
    return st;
  }
  *out = d;
  return WF_OK;
}

wf_status wf_data_open_config(wf_data **out, const wf_config *cfg, int vocab, char *err,
                              size_t err_len)
{
  wf_data_opts o = {
      .path = cfg->data.path,
      .vocab = vocab,
      .seq_len = cfg->train.seq_len > 0 ? cfg->train.seq_len : cfg->model.seq_len,
      .batch_size = cfg->train.batch_size,
      .seed = cfg->train.seed,
      .val_fraction = cfg->data.val_fraction,
  };
  return wf_data_open(out, &o, err, err_len);
}

void wf_data_destroy(wf_data *d)
{
  if (!d)
    return;
  for (int i = 0; i < d->n_spans; i++)
    if (d->spans[i].map)
      munmap(d->spans[i].map, d->spans[i].map_len);
  free(d->spans);
  free(d);
}

wf_data_kind wf_data_get_kind(const wf_data *d) { return d->kind; }
const char *wf_data_describe(const wf_data *d) { return d->desc; }

double wf_data_entropy_floor(const wf_data *d)
{
  return d->kind == WF_DATA_SYNTHETIC ? d->ch.H : NAN;
}

int64_t wf_data_num_tokens(const wf_data *d, wf_data_split split)
{
  return split == WF_DATA_TRAIN ? d->n_train : d->n_tokens - d->n_train;
}

int wf_data_rows(const wf_data *d, int dp_size, int micro_count)
{
  if (dp_size <= 0 || micro_count <= 0 || d->batch_size % (dp_size * micro_count))
    return 0;
  return d->batch_size / (dp_size * micro_count);
}

wf_status wf_data_row(const wf_data *d, int *win, wf_data_split split, int64_t index, int64_t row)
{
  if (index < 0 || row < 0)
    return WF_EINVAL;
  uint64_t stream = data_stream(split, index);
  if (d->kind == WF_DATA_SYNTHETIC) {
    chain_window(d, win, stream, row);
    return WF_OK;
  }
  int64_t lo = split == WF_DATA_TRAIN ? 0 : d->n_train;
  int64_t hi = split == WF_DATA_TRAIN ? d->n_train : d->n_tokens;
  if (hi - lo < d->T + 1)
    return WF_EINVAL; /* no validation split (data.val_fraction = 0) */
  uint64_t starts = (uint64_t)(hi - lo - d->T);
  int64_t start = lo + (int64_t)(wf_rng_u64(d->seed, stream, (uint64_t)row) % starts);
  read_tokens(d, win, start, d->T + 1);
  return WF_OK;
}

/* A test hook "R:S" in variable `name` (read once into *r, *step) names this rank's
 * training batches of step S. */
static bool test_hook(const char *name, int *r, long long *step, wf_data_split split, int64_t index)
{
  if (*r == -2) {
    const char *e = getenv(name);
    if (!e || sscanf(e, "%d:%lld", r, step) != 2)
      *r = -1;
  }
  return split == WF_DATA_TRAIN && *r == wf_rt_rank() && index + 1 == *step;
}

wf_status wf_data_batch(const wf_data *d, int *inputs, int *targets, wf_data_split split,
                        int64_t index, int dp_rank, int dp_size, int micro, int micro_count)
{
  static int fail_r = -2, stall_r = -2;
  static long long fail_s, stall_s;
  if (test_hook("WEFT_TEST_DATA_FAIL", &fail_r, &fail_s, split, index)) {
    WF_ERROR("data: injected read failure of step %lld (WEFT_TEST_DATA_FAIL)",
             (long long)index + 1);
    return WF_EIO;
  }
  if (test_hook("WEFT_TEST_DATA_STALL", &stall_r, &stall_s, split, index))
    sleep(3600); /* a read that never returns: the process lives, training does not */
  int rows = wf_data_rows(d, dp_size, micro_count);
  if (rows == 0 || dp_rank < 0 || dp_rank >= dp_size || micro < 0 || micro >= micro_count)
    return WF_EINVAL;
  int T = d->T;
  int *win = malloc(((size_t)T + 1) * sizeof *win);
  if (!win)
    return WF_ENOMEM;
  int64_t first = (int64_t)dp_rank * (d->batch_size / dp_size) + (int64_t)micro * rows;
  wf_status st = WF_OK;
  for (int b = 0; b < rows; b++) {
    st = wf_data_row(d, win, split, index, first + b);
    if (st != WF_OK)
      break;
    memcpy(inputs + (size_t)b * T, win, (size_t)T * sizeof *win);
    memcpy(targets + (size_t)b * T, win + 1, (size_t)T * sizeof *win);
  }
  free(win);
  return st;
}
