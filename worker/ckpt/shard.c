/*
 * shard.c - the data files of a checkpoint: the shard geometry they record, writing a
 * rank's model and optimizer files through host views of its device, and reading them
 * back with every byte checked (size, header and XXH3-64 against the manifest).
 *
 * Test hooks (read once): WEFT_TEST_CKPT_DELAY_MS sleeps inside each data-file write,
 * after its first bytes, so a test can kill a rank mid-write; WEFT_TEST_CKPT_FAIL=R:S
 * makes world rank R's write of the step-S checkpoint fail as a full disk would (its
 * optimizer file after the header; under ZeRO-3, a model file it writes where the next
 * dp rank's shard begins, mid-stream).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt_int.h"

/* ---- test hooks -------------------------------------------------------------------------- */

/* WEFT_TEST_CKPT_DELAY_MS: "MS" holds every data file MS ms half-written; "MS:STEP" only
 * the files of the checkpoint of STEP. */
static int test_delay_ms(int step)
{
  static int ms = -1, only = 0; /* environment parameters are read once */
  if (ms < 0) {
    const char *s = getenv("WEFT_TEST_CKPT_DELAY_MS");
    if (!s || sscanf(s, "%d:%d", &ms, &only) < 1)
      ms = 0;
    ms = ms > 0 ? ms : 0;
  }
  return only <= 0 || only == step ? ms : 0;
}

static bool test_fail(int rank, int step)
{
  static int r = -2, s = -1;
  if (r == -2) {
    const char *e = getenv("WEFT_TEST_CKPT_FAIL");
    if (!e || sscanf(e, "%d:%d", &r, &s) != 2)
      r = -1;
  }
  return r == rank && s == step;
}

/* Hold a data file half-written (test hook): its header is out, its data is not. A
 * snapshot's files are held when the saver writes them (saver.c). */
void wf__ckpt_test_delay(int step)
{
  int ms = test_delay_ms(step);
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (ms > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* ---- geometry ------------------------------------------------------------------------------ */

/* What a checkpoint records of a shard: the fields that decide its parameter layout
 * (sequence parallelism does not change it; chunk_stride matters only with chunks). */
wf_model_shard wf__saved_geo(const wf_model_shard *s)
{
  wf_model_shard g = *s;
  g.sequence = false;
  g.chunks = WF_MAX(g.chunks, 1);
  if (g.chunks == 1)
    g.chunk_stride = 0;
  return g;
}

bool wf__same_geo(const wf_model_shard *a, const wf_model_shard *b)
{
  return a->tp == b->tp && a->tp_rank == b->tp_rank && a->l0 == b->l0 && a->l1 == b->l1 &&
         a->chunks == b->chunks && a->chunk_stride == b->chunk_stride && a->first == b->first &&
         a->last == b->last;
}

/* The whole model. */
bool wf__whole_geo(const wf_model_shard *g)
{
  return g->tp == 1 && g->first && g->last && g->chunks == 1;
}

/* The whole model of a family llm.c holds (GPT-2): its file is a plain llm.c checkpoint. */
bool wf__llmc_geo(const wf_model_dims *d, const wf_model_shard *g)
{
  return wf__whole_geo(g) && wf_model_family(d)->llmc;
}

static void describe_geo(char *buf, size_t len, const wf_model_shard *g)
{
  char chunks[64] = "";
  if (g->chunks > 1)
    wf__pathf(chunks, sizeof chunks, " in %d chunks %d layers apart", g->chunks, g->chunk_stride);
  wf__pathf(buf, len, "tp rank %d of %d, layers [%d, %d)%s%s%s", g->tp_rank, g->tp, g->l0, g->l1,
            chunks, g->first ? ", first stage" : "", g->last ? ", last stage" : "");
}

/* The header of the model file of shard g with n parameters; returns its bytes. */
static size_t model_header(wf__model_hdr *h, const wf_model_dims *d, const wf_model_shard *g,
                           uint64_t n)
{
  wf_model_dims r = wf_model_dims_resolve(d);
  memset(h, 0, sizeof *h);
  if (wf__llmc_geo(d, g)) {
    wf_llmc_header_encode(h->llmc, d);
    return WF_LLMC_HEADER_BYTES;
  }
  h->shard = (wf__shard_header){WF__SHARD_MAGIC,
                                WF__SHARD_VERSION,
                                d->L,
                                d->NH,
                                d->C,
                                d->maxT,
                                d->V,
                                d->Vp,
                                g->tp,
                                g->tp_rank,
                                g->l0,
                                g->l1,
                                g->chunks,
                                g->chunk_stride,
                                g->first,
                                g->last,
                                n,
                                r.KV == r.NH ? 0 : r.KV,
                                r.F == 4 * r.C ? 0 : r.F,
                                {0}};
  return WF__SHARD_HEADER;
}

void wf__model_name(char *buf, size_t len, int pp, int tp)
{
  wf__pathf(buf, len, "model-pp%02d-tp%02d.bin", pp, tp);
}

void wf__optim_name(char *buf, size_t len, int pp, int tp, int dp)
{
  if (dp < 0)
    wf__pathf(buf, len, "optim-pp%02d-tp%02d.bin", pp, tp);
  else
    wf__pathf(buf, len, "optim-pp%02d-tp%02d-dp%02d.bin", pp, tp, dp);
}

void wf__optim_range(const wf_ckpt_target *t, uint64_t *lo, uint64_t *hi)
{
  size_t a, b;
  float *m, *v;
  wf_optim_state(t->optim, &a, &b, &m, &v);
  *lo = a, *hi = b;
}

/* ---- writing ----------------------------------------------------------------------------------
 */

/* Write `bytes` of device memory at p through a host view. */
static wf_status write_dev(wf_afile *f, wf_dev *dev, const float *p, size_t bytes)
{
  wf_dev_view v;
  wf_status st = wf_dev_map(dev, &v, (void *)p, bytes, WF_MAP_READ);
  if (st == WF_OK)
    st = wf_afile_write(f, v.host, bytes);
  wf_status u = wf_dev_unmap(dev, &v);
  return st == WF_OK ? u : st;
}

/* ZeRO-3's dp shards into the model file, in order: they tile its flat vector. */
typedef struct file_sink {
  wf_afile *f;
  uint64_t next; /* the element the next chunk must start at */
  wf_status st;  /* the first failure; the rest of the stream is skipped */
  bool fail;     /* test hook: fail where another rank's shard begins */
} file_sink;

static wf_status to_file(void *user, const wf__piece *p, const float *x, uint64_t lo, uint64_t hi)
{
  file_sink *s = user;
  if (s->st == WF_OK && s->fail && lo == p->lo && lo > 0) {
    WF_ERROR("%s: write failed after %llu bytes: %s (injected by WEFT_TEST_CKPT_FAIL)", s->f->path,
             (unsigned long long)s->f->bytes, strerror(ENOSPC));
    s->st = WF_EIO;
  }
  if (s->st == WF_OK && lo != s->next) {
    WF_ERROR("%s: the dp shards do not tile the parameters (element %llu follows %llu)", s->f->path,
             (unsigned long long)lo, (unsigned long long)s->next);
    s->st = WF_EINVAL;
  }
  if (s->st == WF_OK)
    s->st = wf_afile_write(s->f, x, (size_t)(hi - lo) * sizeof *x);
  s->next = hi;
  return s->st;
}

/* The parameters after the header: the model's flat vector, or under ZeRO-3 every dp
 * rank's shard streamed to dp rank 0 (collective over the dp group; f is open on dp rank
 * 0 alone, when opened is WF_OK), so no rank gathers them whole. */
static wf_status write_params(const wf_ckpt_target *t, int step, wf_afile *f, wf_status opened,
                              size_t n)
{
  wf_dev *dev = wf_model_dev(t->model);
  if (!t->param_shard)
    return opened != WF_OK ? opened
                           : write_dev(f, dev, wf_model_params(t->model), n * sizeof(float));
  wf__piece mine = {.geo = wf__saved_geo(wf_model_get_shard(t->model))};
  wf__optim_range(t, &mine.lo, &mine.hi);
  file_sink s = {f, 0, opened, test_fail(wf__rank_of(wf__ckpt_world(t)), step)};
  wf_status st = wf__stream_pieces(t->dp_comm, 0, &mine, dev, t->param_shard, to_file, &s);
  if (wf__rank_of(t->dp_comm) != 0)
    return st;
  st = s.st != WF_OK ? s.st : st;
  if (st == WF_OK && s.next != n) {
    WF_ERROR("%s: the dp shards hold %llu of the %zu parameters", f->path,
             (unsigned long long)s.next, n);
    st = WF_EINVAL;
  }
  return st;
}

/* The file written (into the stage), or, for a snapshot (keep), gathered in memory and
 * handed over whole in *keep, its size and hash already known. */
static wf_status finish(wf_afile *f, wf_afile *keep, uint64_t *bytes, uint64_t *hash)
{
  if (!keep)
    return wf_afile_commit(f, bytes, hash);
  wf_afile_sum(f, bytes, hash);
  *keep = *f;
  return WF_OK;
}

/* Open the file `name` of the stage: written at once, or gathered into memory for a
 * snapshot, with room for all of its bytes. */
static wf_status open_file(wf_afile *f, const char *stage, const char *name, size_t bytes,
                           bool snapshot)
{
  char path[WF__PATH_LEN];
  wf__pathf(path, sizeof path, "%s/%s", stage, name);
  wf_status st = wf_afile_open(f, path, 0644, WF_AFILE_HASH | (snapshot ? WF_AFILE_MEMORY : 0));
  if (st == WF_OK && snapshot)
    st = wf_afile_reserve(f, bytes); /* closes f on failure */
  return st;
}

wf_status wf__write_model(const wf_ckpt_target *t, const char *stage, int step, wf__shard_rec *r,
                          wf_afile *keep)
{
  wf_status st = WF_OK;
  const wf_model_dims *d = wf_model_get_dims(t->model);
  wf_model_shard g = wf__saved_geo(wf_model_get_shard(t->model));
  size_t n = wf_model_local_params(t->model);
  bool writer = wf__rank_of(t->dp_comm) == 0;
  wf__model_hdr h;
  size_t hb = model_header(&h, d, &g, n);
  char name[64];
  wf_afile f;
  wf_status opened = WF_OK;
  if (writer) {
    wf__model_name(name, sizeof name, t->pp_rank, t->tp_rank);
    if ((opened = open_file(&f, stage, name, hb + n * sizeof(float), keep)) == WF_OK &&
        (opened = wf_afile_write(&f, &h, hb)) != WF_OK)
      wf_afile_abort(&f);
    if (opened == WF_OK && !keep)
      wf__ckpt_test_delay(step);
  }
  st = write_params(t, step, &f, opened, n); /* every dp rank under ZeRO-3 */
  if (!writer || opened != WF_OK)
    return opened != WF_OK ? opened : st;
  if (st != WF_OK) {
    wf_afile_abort(&f);
    return st;
  }
  r->has_model = true;
  return finish(&f, keep, &r->model_bytes, &r->model_hash);
}

wf_status wf__write_optim(const wf_ckpt_target *t, const char *stage, int step, wf__shard_rec *r,
                          wf_afile *keep)
{
  wf_status st = WF_OK;
  size_t lo, hi;
  float *m, *v;
  int dpi = t->optim_sharded ? wf__rank_of(t->dp_comm) : -1;
  wf_optim_state(t->optim, &lo, &hi, &m, &v);
  r->lo = lo, r->hi = hi;
  if (dpi < 0 && wf__rank_of(t->dp_comm) != 0)
    return WF_OK; /* unsharded: dp 0 writes it */
  wf__optim_header h = {WF__OPT_MAGIC,
                        WF__OPT_VERSION,
                        wf_model_local_params(t->model),
                        lo,
                        hi,
                        (uint64_t)step,
                        (uint32_t)t->pp_rank,
                        (uint32_t)t->tp_rank,
                        dpi < 0 ? WF__OPT_UNSHARDED : (uint32_t)dpi,
                        (uint32_t)wf__size_of(t->dp_comm),
                        {0}};
  char name[64];
  wf_afile f;
  wf_dev *dev = wf_model_dev(t->model);
  wf__optim_name(name, sizeof name, t->pp_rank, t->tp_rank, dpi);
  WF_TRY(open_file(&f, stage, name, sizeof h + 2 * (hi - lo) * sizeof(float), keep));
  WF_TRY(wf_afile_write(&f, &h, sizeof h));
  if (!keep)
    wf__ckpt_test_delay(step);
  if (test_fail(wf__rank_of(wf__ckpt_world(t)), step)) {
    WF_ERROR("%s: write failed after %zu bytes: %s (injected by WEFT_TEST_CKPT_FAIL)", f.path,
             sizeof h, strerror(ENOSPC));
    st = WF_EIO;
  }
  if (st == WF_OK)
    st = write_dev(&f, dev, m, (hi - lo) * sizeof(float));
  if (st == WF_OK)
    st = write_dev(&f, dev, v, (hi - lo) * sizeof(float));
  if (st != WF_OK) {
    wf_afile_abort(&f);
    goto fail;
  }
  r->has_optim = true;
  r->sharded = dpi >= 0;
  st = finish(&f, keep, &r->optim_bytes, &r->optim_hash);
fail:
  return st;
}

/* ---- reading -----------------------------------------------------------------------------------
 */

/* Open a checkpoint file and check its size against the manifest. */
static wf_status open_checked(const char *dir, const wf__entry *e, int *fd, char *path)
{
  wf_status st = WF_OK;
  struct stat sb;
  wf__pathf(path, WF__PATH_LEN, "%s/%s", dir, e->name);
  *fd = open(path, O_RDONLY | O_CLOEXEC);
  WF_CHECK(*fd >= 0, WF_EIO, "%s: cannot open: %s (the checkpoint is incomplete)", path,
           strerror(errno));
  if (fstat(*fd, &sb) != 0 || (uint64_t)sb.st_size != e->bytes) {
    WF_ERROR("%s: %s: %lld bytes, the manifest says %llu; resume from an older checkpoint", path,
             (uint64_t)sb.st_size < e->bytes ? "truncated" : "wrong size", (long long)sb.st_size,
             (unsigned long long)e->bytes);
    close(*fd);
    *fd = -1;
    st = WF_EFORMAT;
  }
fail:
  return st;
}

static wf_status pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path)
{
  char *p = buf;
  while (n > 0) {
    ssize_t r = pread(fd, p, WF_MIN(n, (size_t)WF__CHUNK), (off_t)off);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      WF_ERROR("%s: read failed at byte %llu: %s", path, (unsigned long long)off,
               r < 0 ? strerror(errno) : "unexpected end of file");
      return WF_EIO;
    }
    p += r, n -= (size_t)r, off += (uint64_t)r;
  }
  return WF_OK;
}

static wf_status check_hash(uint64_t got, const wf__entry *e, const char *path)
{
  if (got == e->hash)
    return WF_OK;
  WF_ERROR("%s: checksum mismatch (xxh3_64 %016llx, the manifest says %016llx): the file is "
           "corrupt; resume from an older checkpoint",
           path, (unsigned long long)got, (unsigned long long)e->hash);
  return WF_EFORMAT;
}

/* A model file's header disagrees with its manifest entry: say what each holds. */
static wf_status header_mismatch(const char *path, const wf__entry *e, const wf__model_hdr *h)
{
  char saw[160], want[160];
  describe_geo(want, sizeof want, &e->geo);
  const wf__shard_header *s = &h->shard;
  if (e->llmc || s->magic != WF__SHARD_MAGIC || s->version != WF__SHARD_VERSION) {
    WF_ERROR("%s: header does not match the manifest (which lists %s of %s)", path,
             e->llmc ? "an llm.c file" : "a weft shard", want);
    return WF_EFORMAT;
  }
  describe_geo(saw, sizeof saw,
               &(wf_model_shard){.tp = s->tp,
                                 .tp_rank = s->tp_rank,
                                 .l0 = s->l0,
                                 .l1 = s->l1,
                                 .chunks = s->chunks,
                                 .chunk_stride = s->chunk_stride,
                                 .first = s->first,
                                 .last = s->last});
  WF_ERROR("%s: its header does not match the manifest: the file holds %s (%llu parameters of "
           "L=%d C=%d), the manifest lists %s (%llu); the file was moved or replaced: resume from "
           "an older checkpoint",
           path, saw, (unsigned long long)s->n, s->L, s->C, want, (unsigned long long)e->hi);
  return WF_EFORMAT;
}

static wf_status read_checked(int fd, const char *path, const wf__entry *e, wf__model_hdr *h,
                              size_t hb, float *params, size_t bytes)
{
  wf_status st = WF_OK;
  XXH3_state_t *xx = NULL;
  WF_CHECK(e->bytes == hb + bytes, WF_EFORMAT, "%s: %llu bytes, but its shard needs %zu", path,
           (unsigned long long)e->bytes, hb + bytes);
  WF_TRY(pread_all(fd, h, hb, 0, path));
  WF_TRY(pread_all(fd, params, bytes, hb, path));
  WF_CHECK(xx = XXH3_createState(), WF_ENOMEM, "%s: out of memory for the checksum state", path);
  XXH3_64bits_reset(xx);
  XXH3_64bits_update(xx, h, hb);
  XXH3_64bits_update(xx, params, bytes);
  st = check_hash(XXH3_64bits_digest(xx), e, path);
fail:
  XXH3_freeState(xx);
  return st;
}

wf_status wf__read_model(const char *dir, const wf__entry *e, const wf_model_dims *d, float *params)
{
  char path[WF__PATH_LEN];
  wf__model_hdr h, want;
  int fd;
  size_t hb = model_header(&want, d, &e->geo, e->hi);
  wf_status st = open_checked(dir, e, &fd, path);
  if (st != WF_OK)
    return st;
  st = read_checked(fd, path, e, &h, hb, params, e->hi * sizeof(float));
  close(fd);
  if (st == WF_OK && memcmp(&h, &want, hb) != 0)
    st = header_mismatch(path, e, &h);
  return st;
}

/* The first chunk's header against what the manifest's entry says (a model file's
 * encoded header, or an optimizer file's range of n). */
typedef struct head_check {
  const wf__model_hdr *want; /* a model file's, hb bytes */
  size_t hb;
  bool optim; /* else, with no want, the header is hashed alone */
  uint64_t n;
} head_check;

static wf_status check_opt_header(const wf__optim_header *h, const wf__entry *e, uint64_t n,
                                  const char *path);

static wf_status check_head(const head_check *hc, const char *buf, const wf__entry *e,
                            const char *path)
{
  if (!hc->want)
    return hc->optim ? check_opt_header((const wf__optim_header *)buf, e, hc->n, path) : WF_OK;
  return memcmp(buf, hc->want, hc->hb) ? header_mismatch(path, e, (const wf__model_hdr *)buf)
                                       : WF_OK;
}

/* Copy the file bytes [off, off + len) (in buf) that copies c (sorted, the data's byte
 * offsets past hb header bytes) want; *i: the first copy not yet behind. */
static void copy_out(const wf__copy *c, size_t nc, size_t *i, uint64_t hb, uint64_t off,
                     const char *buf, size_t len)
{
  while (*i < nc && hb + c[*i].off + c[*i].bytes <= off)
    (*i)++;
  for (size_t j = *i; j < nc && hb + c[j].off < off + len; j++) {
    uint64_t a = WF_MAX(hb + c[j].off, off), b = WF_MIN(hb + c[j].off + c[j].bytes, off + len);
    if (a < b)
      memcpy(c[j].dst + (a - hb - c[j].off), buf + (a - off), b - a);
  }
}

/* All of open file e, streamed in chunks: every byte hashed against the manifest, the
 * header checked, and the bytes the copies want kept, so no rank holds the file whole. */
static wf_status stream(int fd, const char *path, const wf__entry *e, const head_check *hc,
                        const wf__copy *c, size_t nc)
{
  wf_status st = WF_OK;
  char *buf = NULL;
  XXH3_state_t *xx = NULL;
  size_t i = 0;
  uint64_t hb = hc->want ? hc->hb : WF__OPT_HEADER;
  WF_CHECK((buf = malloc(WF__CHUNK)) && (xx = XXH3_createState()), WF_ENOMEM, "%s: out of memory",
           path);
  XXH3_64bits_reset(xx);
  for (uint64_t off = 0; off < e->bytes; off += WF__CHUNK) {
    size_t len = (size_t)WF_MIN((uint64_t)WF__CHUNK, e->bytes - off);
    WF_TRY(pread_all(fd, buf, len, off, path));
    if (off == 0)
      WF_TRY(check_head(hc, buf, e, path));
    XXH3_64bits_update(xx, buf, len);
    copy_out(c, nc, &i, hb, off, buf, len);
  }
  st = check_hash(XXH3_64bits_digest(xx), e, path);
fail:
  XXH3_freeState(xx);
  free(buf);
  return st;
}

static wf_status verify(const char *dir, const wf__entry *e, const head_check *hc,
                        const wf__copy *c, size_t nc)
{
  char path[WF__PATH_LEN];
  int fd;
  wf_status st = open_checked(dir, e, &fd, path);
  if (st != WF_OK)
    return st;
  st = stream(fd, path, e, hc, c, nc);
  close(fd);
  return st;
}

wf_status wf__read_model_copies(const char *dir, const wf__entry *e, const wf_model_dims *d,
                                const wf__copy *c, size_t nc)
{
  wf__model_hdr want;
  head_check hc = {&want, model_header(&want, d, &e->geo, e->hi), false, 0};
  if (e->bytes == hc.hb + e->hi * sizeof(float))
    return verify(dir, e, &hc, c, nc);
  WF_ERROR("%s/%s: %llu bytes, but its shard needs %zu", dir, e->name, (unsigned long long)e->bytes,
           hc.hb + (size_t)e->hi * sizeof(float));
  return WF_EFORMAT;
}

wf_status wf__read_copies(const char *dir, const wf__entry *e, const wf_model_dims *d,
                          const wf__copy *c, size_t nc)
{
  char path[WF__PATH_LEN];
  wf__model_hdr want;
  int fd;
  uint64_t hb = e->optim ? WF__OPT_HEADER : model_header(&want, d, &e->geo, e->hi);
  wf_status st = open_checked(dir, e, &fd, path);
  for (size_t i = 0; st == WF_OK && i < nc; i++)
    st = pread_all(fd, c[i].dst, c[i].bytes, hb + c[i].off, path);
  if (fd >= 0)
    close(fd);
  return st;
}

wf_status wf__read_model_range(const char *dir, const wf__entry *e, const wf_model_dims *d,
                               uint64_t lo, uint64_t hi, float *dst, bool verify)
{
  wf__copy c = {4 * lo, 4 * (hi - lo), (char *)dst};
  if (verify)
    return wf__read_model_copies(dir, e, d, &c, 1);
  return hi > lo ? wf__read_copies(dir, e, d, &c, 1) : WF_OK;
}

static wf_status check_opt_header(const wf__optim_header *h, const wf__entry *e, uint64_t n,
                                  const char *path)
{
  if (h->magic == WF__OPT_MAGIC && h->version == WF__OPT_VERSION && h->n == n && h->lo == e->lo &&
      h->hi == e->hi && e->bytes == WF__OPT_HEADER + 8 * (e->hi - e->lo))
    return WF_OK;
  WF_ERROR("%s: header does not match the manifest (magic %08x, range [%llu, %llu) of %llu)", path,
           h->magic, (unsigned long long)h->lo, (unsigned long long)h->hi,
           (unsigned long long)h->n);
  return WF_EFORMAT;
}

/* The file bytes of element x of part 0 (m) or 1 (v). */
static uint64_t part_offset(const wf__entry *e, int part, uint64_t x)
{
  return WF__OPT_HEADER + (uint64_t)part * 4 * (e->hi - e->lo) + 4 * (x - e->lo);
}

/* The copies of an optimizer file that fill span sp: m's part, then v's. */
static size_t span_copies(const wf__entry *e, const wf__span *sp, wf__copy c[2])
{
  uint64_t x0 = WF_MAX(e->lo, sp->lo), x1 = WF_MIN(e->hi, sp->hi);
  size_t nc = 0;
  for (int part = 0; part < 2 && x0 < x1; part++)
    c[nc++] = (wf__copy){part_offset(e, part, x0) - WF__OPT_HEADER, 4 * (x1 - x0),
                         (char *)((part ? sp->v : sp->m) + (x0 - sp->lo))};
  return nc;
}

wf_status wf__read_optim_copies(const char *dir, const wf__entry *e, uint64_t n, const wf__copy *c,
                                size_t nc)
{
  return verify(dir, e, &(head_check){NULL, 0, true, n}, c, nc);
}

wf_status wf__verify_optim(const char *dir, const wf__entry *e, uint64_t n, const wf__span *sp)
{
  wf__copy c[2];
  return wf__read_optim_copies(dir, e, n, c, span_copies(e, sp, c));
}

/* The whole file of entry e: its size and XXH3-64 (model and optimizer files hash every
 * byte, header included). */
wf_status wf__verify_file(const char *dir, const wf__entry *e)
{
  return verify(dir, e, &(head_check){NULL, 0, false, 0}, NULL, 0);
}

wf_status wf__read_optim_part(const char *dir, const wf__entry *e, uint64_t n, const wf__span *sp)
{
  char path[WF__PATH_LEN];
  wf__optim_header h;
  int fd;
  uint64_t x0 = WF_MAX(e->lo, sp->lo), x1 = WF_MIN(e->hi, sp->hi);
  wf_status st = open_checked(dir, e, &fd, path);
  if (st != WF_OK)
    return st;
  st = pread_all(fd, &h, sizeof h, 0, path);
  if (st == WF_OK)
    st = check_opt_header(&h, e, n, path);
  if (st == WF_OK)
    st = pread_all(fd, sp->m + (x0 - sp->lo), 4 * (x1 - x0), part_offset(e, 0, x0), path);
  if (st == WF_OK)
    st = pread_all(fd, sp->v + (x0 - sp->lo), 4 * (x1 - x0), part_offset(e, 1, x0), path);
  close(fd);
  return st;
}
