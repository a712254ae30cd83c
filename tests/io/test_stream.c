/*
 * test_stream.c - data.source streams (worker/io/stream.c) on real text: Debian's
 * fortunes written as JSON Lines, plain and zstd (one file of two frames), one source a
 * glob of two files, one so small that it wraps round many times.
 *
 *  - lanes: at dp 1, every row of every lane for 70 steps equals an independent model of
 *    the documented rules (documents dealt to lanes, mixing by tokens, packing with the
 *    row's last token carried over, starts) built here from the texts alone (bytes);
 *  - resume: with GPT-2's tokenizer (data/gpt2), the position saved after step 17 at dp
 *    1, 2 and 4 and restored at the same dp, more and fewer (1 -> 4, 2 -> 2, 2 -> 8,
 *    4 -> 1, 4 -> 2) gives every later row bit for bit as the uninterrupted run; document
 *    starts are exactly where the <|endoftext|> tokens are;
 *  - errors: every kind of bad input says the file, the line and the key, with the
 *    status a user error gets.
 *
 * usage: test_stream GPT2_TOKENIZER_DIR FORTUNES_DIR
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <zstd.h>

#include "wf_io.h"

#define MAXDOC 2048
#define NSRC   3

static char tmpdir[256];
static const char *gpt2_dir, *fortunes_dir;

/* The documents of each source, in file order (the test's own copy). */
typedef struct texts {
  char **t;
  size_t *len;
  int n;
} texts;
static texts docs[NSRC];

/* ---- fixtures -------------------------------------------------------------------- */

/* One fortune per document: the text between "%" lines. */
static void read_fortunes(const char *name, texts *out, int max)
{
  char path[512], line[4096], buf[65536];
  size_t n = 0;
  snprintf(path, sizeof path, "%s/%s", fortunes_dir, name);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  out->t = calloc(MAXDOC, sizeof *out->t), out->len = calloc(MAXDOC, sizeof *out->len);
  bool more = true;
  while (more && out->n < max) {
    more = fgets(line, sizeof line, f) != NULL;
    if (more && strcmp(line, "%\n") != 0) {
      size_t l = strlen(line);
      if (n + l < sizeof buf)
        memcpy(buf + n, line, l), n += l;
      continue;
    }
    if (n > 0 && out->n < MAXDOC) {
      out->t[out->n] = malloc(n), memcpy(out->t[out->n], buf, n);
      out->len[out->n++] = n;
    }
    n = 0;
  }
  fclose(f);
}

/* Documents [lo, hi) of src as JSON Lines: a blank line every 50th, another key first. */
static char *jsonl(const texts *src, int lo, int hi, size_t *len)
{
  char *out = NULL;
  FILE *m = open_memstream(&out, len);
  for (int i = lo; i < hi; i++) {
    json_t *o = json_pack("{s:i, s:s%}", "id", i, "text", src->t[i], src->len[i]);
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    fprintf(m, "%s\n%s", s, i % 50 == 49 ? "\n  \n" : "");
    free(s);
    json_decref(o);
  }
  fclose(m);
  return out;
}

static void write_bytes(const char *name, const void *p, size_t n)
{
  char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(p, 1, n, f), n);
  fclose(f);
}

/* zstd: one frame per part (ZSTD_compress, level 3). */
static void write_zstd(const char *name, char *const *parts, const size_t *lens, int n)
{
  size_t cap = 0, len = 0;
  for (int i = 0; i < n; i++)
    cap += ZSTD_compressBound(lens[i]);
  char *z = malloc(cap);
  for (int i = 0; i < n; i++) {
    size_t r = ZSTD_compress(z + len, cap - len, parts[i], lens[i], 3);
    assert_false(ZSTD_isError(r));
    len += r;
  }
  write_bytes(name, z, len);
  free(z);
}

static int setup(void **state)
{
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/weft_test_stream_XXXXXX");
  if (!mkdtemp(tmpdir))
    return -1;
  char path[512];
  snprintf(path, sizeof path, "%s/b", tmpdir);
  mkdir(path, 0755);
  read_fortunes("fortunes", &docs[0], MAXDOC);
  read_fortunes("wisdom", &docs[1], MAXDOC);
  read_fortunes("literature", &docs[2], 7); /* 7 documents: many epochs */
  size_t n, m;
  char *a = jsonl(&docs[0], 0, docs[0].n, &n);
  write_bytes("a.jsonl", a, n);
  int half = docs[1].n / 2, q = half + (docs[1].n - half) / 2;
  char *b1 = jsonl(&docs[1], 0, half, &n), *parts[2];
  size_t lens[2];
  write_zstd("b/1.jsonl.zst", &b1, &n, 1);
  parts[0] = jsonl(&docs[1], half, q, &lens[0]); /* two frames, one after the other */
  parts[1] = jsonl(&docs[1], q, docs[1].n, &lens[1]);
  write_zstd("b/2.jsonl.zst", parts, lens, 2);
  char *c = jsonl(&docs[2], 0, docs[2].n, &m);
  write_zstd("c.jsonl.zst", &c, &m, 1);
  free(a), free(b1), free(parts[0]), free(parts[1]), free(c);
  return 0;
}

static int teardown(void **state)
{
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

/* ---- opening ------------------------------------------------------------------------ */

static char src_path[NSRC][512];

static wf_data_opts stream_opts(int T, int L, int r, int D, const char *tok)
{
  static const char *const names[NSRC] = {"a.jsonl", "b/*.jsonl.zst", "c.jsonl.zst"};
  static const double mix[NSRC] = {0.5, 0.3, 0.2};
  wf_data_opts o = {.vocab = tok ? 50257 : 256,
                    .seq_len = T,
                    .batch_size = L,
                    .seed = 1,
                    .tokenizer = tok,
                    .n_source = NSRC,
                    .n_mix = NSRC,
                    .dp_rank = r,
                    .dp_size = D};
  for (int i = 0; i < NSRC; i++) {
    snprintf(src_path[i], sizeof src_path[i], "%s/%s", tmpdir, names[i]);
    o.source[i] = src_path[i], o.mix[i] = mix[i], o.field[i] = "text";
  }
  return o;
}

static wf_data *open_ok(const wf_data_opts *o)
{
  char err[2048] = "";
  wf_data *d = NULL;
  wf_status st = wf_data_open(&d, o, err, sizeof err);
  if (st != WF_OK)
    fprintf(stderr, "open: %s\n", err);
  assert_int_equal(st, WF_OK);
  assert_int_equal(wf_data_get_kind(d), WF_DATA_STREAM);
  return d;
}

/* Rows of lanes [first, first + rows) of step index: win (rows, T+1) and starts. */
static void rows_of(wf_data *d, int64_t index, int first, int rows, int T, int L, int D, int *win,
                    int *starts)
{
  int *in = malloc((size_t)rows * T * sizeof *in), *tg = malloc((size_t)rows * T * sizeof *tg);
  char err[2048] = "";
  wf_status st = wf_data_ready(d, WF_DATA_TRAIN, index, err, sizeof err);
  if (st != WF_OK)
    fprintf(stderr, "step %lld: %s\n", (long long)index + 1, err);
  assert_int_equal(st, WF_OK);
  assert_int_equal(wf_data_batch(d, in, tg, starts, WF_DATA_TRAIN, index, first / (L / D), D, 0, 1),
                   WF_OK);
  for (int b = 0; b < rows; b++) {
    memcpy(win + (size_t)b * (T + 1), in + (size_t)b * T, (size_t)T * sizeof *in);
    win[(size_t)b * (T + 1) + T] = tg[(size_t)b * T + T - 1];
    assert_memory_equal(in + (size_t)b * T + 1, tg + (size_t)b * T, (size_t)(T - 1) * sizeof *in);
  }
  free(in);
  free(tg);
}

/* ---- the model of the rules --------------------------------------------------------- */

/* Lane l's tokens (bytes: no document start) over `need` tokens, with the position of
 * every document start, by the rules of stream.c's header alone. */
static void model_lane(int l, int L, const double *w, int need, int *tok, char *is_start)
{
  uint64_t took[NSRC] = {0}, used[NSRC] = {0};
  double sum = 0;
  for (int i = 0; i < NSRC; i++)
    sum += w[i];
  for (int n = 0; n < need;) {
    double total = 0, best = -1e300;
    int s = 0;
    for (int i = 0; i < NSRC; i++)
      total += (double)used[i];
    for (int i = 0; i < NSRC; i++) /* furthest below its weight; the lowest among equals */
      if (w[i] / sum * total - (double)used[i] > best)
        best = w[i] / sum * total - (double)used[i], s = i;
    int64_t k = l + (int64_t)took[s]++ * L;
    int j = (int)(k % docs[s].n);
    used[s] += docs[s].len[j];
    for (size_t b = 0; b < docs[s].len[j] && n < need; b++, n++) {
      tok[n] = (unsigned char)docs[s].t[j][b];
      is_start[n] = b == 0;
    }
  }
}

static void test_lanes_model(void **state)
{
  (void)state;
  enum { T = 48, L = 8, STEPS = 70 };
  static const double w[NSRC] = {0.5, 0.3, 0.2};
  wf_data_opts o = stream_opts(T, L, 0, 1, NULL);
  wf_data *d = open_ok(&o);
  int need = STEPS * T + 1;
  int *tok = malloc((size_t)L * need * sizeof *tok);
  char *is_start = malloc((size_t)L * need);
  int *win = malloc((size_t)L * (T + 1) * sizeof *win),
      *starts = malloc((size_t)L * T * sizeof *starts);
  for (int l = 0; l < L; l++)
    model_lane(l, L, w, need, tok + (size_t)l * need, is_start + (size_t)l * need);
  for (int s = 0; s < STEPS; s++) {
    rows_of(d, s, 0, L, T, L, 1, win, starts);
    for (int l = 0; l < L; l++) {
      const int *want = tok + (size_t)l * need + (size_t)s * T; /* row s: tokens [sT, sT+T+1) */
      const char *ws = is_start + (size_t)l * need + (size_t)s * T;
      assert_memory_equal(win + (size_t)l * (T + 1), want, (T + 1) * sizeof *want);
      for (int t = 0, seg = 0; t < T; t++) {
        seg = t > 0 && ws[t] ? t : seg; /* a document that began before the row: 0 */
        assert_int_equal(starts[(size_t)l * T + t], seg);
      }
    }
  }
  wf_data_destroy(d);
  free(tok), free(is_start), free(win), free(starts);
}

/* ---- resume ----------------------------------------------------------------------- */

enum { RT = 32, RL = 8, RSTEPS = 40, RK = 17 };

/* Every lane's rows of steps [from, to) at dp D, into win (steps, L, T+1) and starts,
 * after restoring `pos` (NULL: from the start); the position before step `to` back as
 * JSON (malloc'd) when want_pos. */
static char *run_dp(int D, const char *pos, int from, int to, int *win, int *starts, bool want_pos)
{
  wf_data *d[RL];
  size_t n = 0;
  uint64_t *v = NULL, *mine = NULL;
  char err[2048] = "", *json = NULL;
  for (int r = 0; r < D; r++) {
    wf_data_opts o = stream_opts(RT, RL, r, D, gpt2_dir);
    d[r] = open_ok(&o);
    if (pos) {
      wf_status st = wf_data_state_set(d[r], pos, err, sizeof err);
      if (st != WF_OK)
        fprintf(stderr, "restore: %s\n", err);
      assert_int_equal(st, WF_OK);
    }
  }
  int rows = RL / D;
  for (int s = from; s < to; s++)
    for (int r = 0; r < D; r++)
      rows_of(d[r], s, r * rows, rows, RT, RL, D,
              win + ((size_t)(s - from) * RL + (size_t)r * rows) * (RT + 1),
              starts + ((size_t)(s - from) * RL + (size_t)r * rows) * RT);
  if (want_pos) { /* each rank's part, merged as a checkpoint does: the maximum */
    n = wf_data_state_len(d[0]);
    v = calloc(n, sizeof *v), mine = calloc(n, sizeof *mine);
    for (int r = 0; r < D; r++) {
      assert_int_equal(wf_data_state_get(d[r], to, mine, err, sizeof err), WF_OK);
      for (size_t i = 0; i < n; i++)
        v[i] = v[i] > mine[i] ? v[i] : mine[i];
    }
    json = wf_data_state_json(d[0], to, v);
    assert_non_null(json);
  }
  for (int r = 0; r < D; r++)
    wf_data_destroy(d[r]);
  free(v), free(mine);
  return json;
}

static void test_resume(void **state)
{
  (void)state;
  size_t W = (size_t)RL * (RT + 1), S = (size_t)RL * RT;
  int *ref = malloc(RSTEPS * W * sizeof *ref), *ref_st = malloc(RSTEPS * S * sizeof *ref_st);
  int *got = malloc(RSTEPS * W * sizeof *got), *got_st = malloc(RSTEPS * S * sizeof *got_st);
  free(run_dp(1, NULL, 0, RSTEPS, ref, ref_st, false));
  /* document starts are where GPT-2's document start <|endoftext|> (50256) is */
  for (size_t i = 0; i < RSTEPS * (size_t)RL; i++)
    for (int t = 1; t < RT; t++)
      assert_int_equal(ref_st[i * RT + t] == t, ref[i * (RT + 1) + t] == 50256);
  /* (saved at dp, resumed at dp): the same dp, more, fewer; each tokenizer load costs */
  static const int pairs[][3] = {{1, 4, -1}, {2, 2, 8}, {4, 1, 2}};
  for (size_t a = 0; a < WF_ARRAY_LEN(pairs); a++) {
    char *pos = run_dp(pairs[a][0], NULL, 0, RK, got, got_st, true);
    assert_memory_equal(got, ref, (size_t)RK * W * sizeof *got); /* before: the same too */
    for (size_t b = 1; b < 3 && pairs[a][b] > 0; b++) {
      memset(got, 0xff, RSTEPS * W * sizeof *got);
      free(run_dp(pairs[a][b], pos, RK, RSTEPS, got, got_st, false));
      assert_memory_equal(got, ref + RK * W, (RSTEPS - RK) * W * sizeof *got);
      assert_memory_equal(got_st, ref_st + RK * S, (RSTEPS - RK) * S * sizeof *got_st);
      printf("saved at dp %d after step %d, resumed at dp %d: steps %d-%d equal, bit for bit\n",
             pairs[a][0], RK, pairs[a][b], RK + 1, RSTEPS);
    }
    free(pos);
  }
  free(ref), free(ref_st), free(got), free(got_st);
}

/* A position for other data is refused, naming what changed. */
static void test_resume_refused(void **state)
{
  (void)state;
  int *win = malloc(3 * RL * (RT + 1) * sizeof *win), *st = malloc(3 * RL * RT * sizeof *st);
  char *pos = run_dp(1, NULL, 0, 3, win, st, true), err[2048] = "";
  wf_data_opts o = stream_opts(RT, 4, 0, 1, gpt2_dir); /* 4 lanes: another batch size */
  wf_data *d = open_ok(&o);
  assert_int_equal(wf_data_state_set(d, pos, err, sizeof err), WF_ECONFIG);
  assert_non_null(strstr(err, "it packed 8 lanes (its train.batch_size), this run has 4"));
  wf_data_destroy(d);
  o = stream_opts(RT, RL, 0, 1, NULL); /* bytes, not GPT-2's tokens */
  d = open_ok(&o);
  assert_int_equal(wf_data_state_set(d, pos, err, sizeof err), WF_ECONFIG);
  assert_non_null(strstr(err, "it was tokenized by GPT-2 BPE"));
  wf_data_destroy(d);
  char path[600]; /* a file of the source grew */
  snprintf(path, sizeof path, "%s/a.jsonl", tmpdir);
  FILE *f = fopen(path, "a");
  fputs("{\"text\": \"one more\"}\n", f);
  fclose(f);
  o = stream_opts(RT, RL, 0, 1, gpt2_dir);
  d = open_ok(&o);
  assert_int_equal(wf_data_state_set(d, pos, err, sizeof err), WF_ECONFIG);
  assert_non_null(strstr(err, "a.jsonl' was "));
  wf_data_destroy(d);
  size_t n = 0; /* back as it was */
  char *a = jsonl(&docs[0], 0, docs[0].n, &n);
  write_bytes("a.jsonl", a, n);
  free(a), free(pos), free(win), free(st);
}

/* ---- errors ----------------------------------------------------------------------------- */

/* Source `name` (written from text, or binary when len > 0) fails with st, the error
 * naming each of the words: at open, or at the first batch. */
static void expect(const char *name, const char *text, size_t len, wf_status want, const char *w1,
                   const char *w2)
{
  char path[600], err[2048] = "";
  if (text)
    write_bytes(name, text, len ? len : strlen(text));
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  wf_data_opts o = {.vocab = 256,
                    .seq_len = 16,
                    .batch_size = 2,
                    .n_source = 1,
                    .source = {path},
                    .field = {"text"}};
  wf_data *d = NULL;
  wf_status st = wf_data_open(&d, &o, err, sizeof err);
  if (st == WF_OK)
    st = wf_data_ready(d, WF_DATA_TRAIN, 0, err, sizeof err);
  printf("%s: %s\n", name, err);
  assert_int_equal(st, want);
  assert_non_null(strstr(err, w1));
  if (w2)
    assert_non_null(strstr(err, w2));
  wf_data_destroy(d);
}

static void test_errors(void **state)
{
  (void)state;
  char zbuf[4096], *z;
  const char *good = "{\"text\": \"fine\"}\n{\"text\": \"also fine\"}\n";
  size_t n = ZSTD_compress(zbuf, sizeof zbuf, good, strlen(good), 3);
  expect("none*.jsonl", NULL, 0, WF_ECONFIG, "matches no file", NULL);
  expect("json.jsonl", "{\"text\": \"a\"}\n\n{\"text\": \"b\",}\n", 0, WF_EFORMAT,
         "json.jsonl:3:", "not JSON");
  expect("key.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n", 0, WF_EFORMAT,
         "key.jsonl:2:", "no \"text\" key");
  expect("num.jsonl", "{\"text\": 7}\n", 0, WF_EFORMAT, "num.jsonl:1:", "\"text\" is a number");
  expect("list.jsonl", "[\"text\"]\n", 0, WF_EFORMAT, "list.jsonl:1:", "is a list");
  expect("blank.jsonl", "\n  \n\n", 0, WF_EFORMAT, "holds no documents", NULL);
  expect("cut.jsonl.zst", zbuf, n - 5, WF_EFORMAT, "cut.jsonl.zst' is truncated", NULL);
  z = malloc(n);
  memcpy(z, zbuf, n);
  for (size_t i = 8; i < n - 4; i++) /* the frame's content garbled */
    z[i] ^= 0x5a;
  expect("bad.jsonl.zst", z, n, WF_EFORMAT, "bad.jsonl.zst' is not valid zstd data", NULL);
  free(z);
  expect("g.jsonl.gz", "\x1f\x8b\x08\x00\x00\x00\x00\x00", 8, WF_EFORMAT, "gzip-compressed",
         "zstd");
  /* a weight that is no weight */
  char path[600], err[1024] = "";
  snprintf(path, sizeof path, "%s/a.jsonl", tmpdir);
  wf_data_opts o = {.vocab = 256,
                    .seq_len = 16,
                    .batch_size = 2,
                    .n_source = 1,
                    .n_mix = 1,
                    .mix = {-1},
                    .source = {path},
                    .field = {"text"}};
  wf_data *d = NULL;
  assert_int_equal(wf_data_open(&d, &o, err, sizeof err), WF_ECONFIG);
  assert_non_null(strstr(err, "data.mix[0] = -1"));
}

int main(int argc, char **argv)
{
  if (argc != 3) {
    fprintf(stderr, "usage: %s GPT2_TOKENIZER_DIR FORTUNES_DIR\n", argv[0]);
    return 1;
  }
  gpt2_dir = argv[1], fortunes_dir = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lanes_model),
      cmocka_unit_test(test_resume),
      cmocka_unit_test(test_resume_refused),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
