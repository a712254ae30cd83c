/*
 * test_data.c - the data sources: the synthetic chain's entropy floor, the dp/micro-batch
 * slice property, seeds, llm.c shards (reading and each malformed-file error), text,
 * validation files (data.val_path), paths that are no regular file, and the pre-flight
 * check (wf_data_check). Text under a tokenizer is tested in tests/io (test_tokenizer),
 * against an independent BPE.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "wf_io.h"
#include "wf_model.h"

static char tmpdir[256];

static int make_tmpdir(void **state)
{
  snprintf(tmpdir, sizeof tmpdir, "/tmp/weft_test_data_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state)
{
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static wf_data *open_ok(const char *path, int vocab, int T, int batch, uint64_t seed, double val)
{
  wf_data_opts o = {.path = path,
                    .vocab = vocab,
                    .seq_len = T,
                    .batch_size = batch,
                    .seed = seed,
                    .val_fraction = val};
  char err[1024] = "";
  wf_data *d = NULL;
  wf_status st = wf_data_open(&d, &o, err, sizeof err);
  if (st != WF_OK)
    fprintf(stderr, "wf_data_open: %s\n", err);
  assert_int_equal(st, WF_OK);
  return d;
}

/* ---- synthetic ------------------------------------------------------------------------- */

/* The plug-in conditional entropy of a long sample must match the computed entropy rate:
 * this checks the stationary distribution, the row entropies and that rows start in pi. */
static void test_synthetic_floor(void **state)
{
  enum { K = 64, T = 64, ROWS = 32, STEPS = 60 };
  wf_data *d = open_ok("", 256, T, ROWS, 7, 0.0);
  double H = wf_data_entropy_floor(d);
  /* Rows have 4-8 successors with Dirichlet(1) weights: entropies ~0.9-1.9 nats. */
  assert_true(H > 0.5 && H < log(8.0));
  static long counts[K][K];
  memset(counts, 0, sizeof counts);
  int in[ROWS * T], tg[ROWS * T];
  long n = 0;
  for (int s = 0; s < STEPS; s++) {
    assert_int_equal(wf_data_batch(d, in, tg, NULL, WF_DATA_TRAIN, s, 0, 1, 0, 1), WF_OK);
    for (int i = 0; i < ROWS * T; i++) {
      assert_true(in[i] >= 0 && in[i] < K && tg[i] >= 0 && tg[i] < K);
      counts[in[i]][tg[i]]++;
      n++;
    }
  }
  double Hemp = 0;
  for (int i = 0; i < K; i++) {
    long row = 0;
    for (int j = 0; j < K; j++)
      row += counts[i][j];
    for (int j = 0; j < K; j++)
      if (counts[i][j])
        Hemp -= (double)counts[i][j] / n * log((double)counts[i][j] / row);
  }
  /* 123k transitions: the plug-in bias is ~(cells - rows) / 2N ~ 0.002 nats and the
   * standard error ~0.003; 0.02 is several sigma. */
  printf("entropy floor %.4f nats, empirical %.4f\n", H, Hemp);
  assert_true(fabs(Hemp - H) < 0.02);
  /* The floor is a property of the fixed chain, not of the sampling seed. */
  wf_data *d2 = open_ok(NULL, 256, T, ROWS, 8, 0.0);
  assert_true(wf_data_entropy_floor(d2) == H);
  wf_data_destroy(d2);
  wf_data_destroy(d);
}

static void test_small_vocab(void **state)
{
  wf_data *d = open_ok("", 10, 32, 4, 1, 0.0);
  int in[4 * 32], tg[4 * 32];
  assert_int_equal(wf_data_batch(d, in, tg, NULL, WF_DATA_VAL, 3, 0, 1, 0, 1), WF_OK);
  for (int i = 0; i < 4 * 32; i++)
    assert_true(in[i] < 10 && tg[i] < 10);
  assert_true(wf_data_entropy_floor(d) < log(10.0));
  wf_data_destroy(d);
}

/* ---- slices and seeds ------------------------------------------------------------------ */

/* The union of the dp x micro-batch slices is the dp=1, M=1 batch, row for row. */
static void check_slices(wf_data *d, int batch, int T, wf_data_split split, int64_t idx)
{
  int full_in[batch * T], full_tg[batch * T], in[batch * T], tg[batch * T];
  assert_int_equal(wf_data_batch(d, full_in, full_tg, NULL, split, idx, 0, 1, 0, 1), WF_OK);
  for (int b = 0; b < batch * T; b++) /* targets are inputs shifted by one */
    if ((b + 1) % T)
      assert_int_equal(full_tg[b], full_in[b + 1]);
  const int shapes[][2] = {{2, 1}, {1, 2}, {2, 2}, {4, 2}, {8, 1}, {1, 8}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int D = shapes[s][0], M = shapes[s][1], rows = wf_data_rows(d, D, M);
    assert_int_equal(rows, batch / (D * M));
    for (int r = 0; r < D; r++) {
      for (int m = 0; m < M; m++) {
        assert_int_equal(wf_data_batch(d, in, tg, NULL, split, idx, r, D, m, M), WF_OK);
        size_t first = ((size_t)r * (batch / D) + (size_t)m * rows) * T;
        assert_memory_equal(in, full_in + first, (size_t)rows * T * sizeof(int));
        assert_memory_equal(tg, full_tg + first, (size_t)rows * T * sizeof(int));
      }
    }
  }
  assert_int_equal(wf_data_rows(d, 3, 1), 0); /* 8 rows do not split 3 ways */
  assert_int_equal(wf_data_batch(d, in, tg, NULL, split, idx, 0, 3, 0, 1), WF_EINVAL);
  assert_int_equal(wf_data_batch(d, in, tg, NULL, split, idx, 2, 2, 0, 1), WF_EINVAL);
}

static void write_file(const char *path, const void *data, size_t n)
{
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
}

static void test_dp_slices(void **state)
{
  wf_data *d = open_ok("", 256, 16, 8, 3, 0.0);
  check_slices(d, 8, 16, WF_DATA_TRAIN, 0);
  check_slices(d, 8, 16, WF_DATA_TRAIN, 41);
  check_slices(d, 8, 16, WF_DATA_VAL, 2);
  wf_data_destroy(d);

  char path[300];
  snprintf(path, sizeof path, "%s/slices.txt", tmpdir);
  unsigned char text[4000];
  for (size_t i = 0; i < sizeof text; i++)
    text[i] = (unsigned char)((i * 2654435761u) >> 13);
  write_file(path, text, sizeof text);
  d = open_ok(path, 256, 16, 8, 3, 0.1);
  check_slices(d, 8, 16, WF_DATA_TRAIN, 5);
  check_slices(d, 8, 16, WF_DATA_VAL, 0);
  wf_data_destroy(d);
}

static int count_equal(const int *a, const int *b, size_t n)
{
  int same = 0;
  for (size_t i = 0; i < n; i++)
    same += a[i] == b[i];
  return same;
}

static void test_seeds(void **state)
{
  enum { B = 4, T = 32, N = B * T };
  wf_data *d1 = open_ok("", 256, T, B, 1, 0.0), *d1b = open_ok("", 256, T, B, 1, 0.0);
  wf_data *d2 = open_ok("", 256, T, B, 2, 0.0);
  int a[N], at[N], b[N], bt[N];
  wf_data_batch(d1, a, at, NULL, WF_DATA_TRAIN, 9, 0, 1, 0, 1);
  wf_data_batch(d1b, b, bt, NULL, WF_DATA_TRAIN, 9, 0, 1, 0, 1);
  assert_memory_equal(a, b, sizeof a); /* same seed and step: the same batch */
  wf_data_batch(d2, b, bt, NULL, WF_DATA_TRAIN, 9, 0, 1, 0, 1);
  /* Another seed, step or split: a different sample. Chance agreement between two
   * independent chain samples is roughly sum_i pi_i sum_j P_ij^2 < 0.4 per token. */
  assert_true(count_equal(a, b, N) < N / 2);
  wf_data_batch(d1, b, bt, NULL, WF_DATA_TRAIN, 10, 0, 1, 0, 1);
  assert_true(count_equal(a, b, N) < N / 2);
  wf_data_batch(d1, b, bt, NULL, WF_DATA_VAL, 9, 0, 1, 0, 1);
  assert_true(count_equal(a, b, N) < N / 2);
  wf_data_destroy(d1);
  wf_data_destroy(d1b);
  wf_data_destroy(d2);
}

/* ---- llm.c shards ------------------------------------------------------------------------ */

/* A shard whose tokens are first, first+1, ... (so a window shows where it came from). */
static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count, int first,
                        int n)
{
  int32_t h[256] = {magic, version, count};
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
  for (int i = 0; i < n; i++) {
    uint16_t t = (uint16_t)(first + i);
    assert_int_equal(fwrite(&t, sizeof t, 1, f), 1);
  }
  fclose(f);
}

static void test_shards_read(void **state)
{
  enum { NS = 5, PER = 100, T = 16, B = 4 };
  char path[300], pattern[300];
  for (int s = NS - 1; s >= 0; s--) { /* written out of order: glob sorts */
    snprintf(path, sizeof path, "%s/tok_%02d.bin", tmpdir, s);
    write_shard(path, 20240520, 1, PER, s * PER, PER);
  }
  snprintf(pattern, sizeof pattern, "%s/tok_*.bin", tmpdir);
  wf_data *d = open_ok(pattern, 50257, T, B, 5, 0.2);
  assert_int_equal(wf_data_get_kind(d), WF_DATA_SHARDS);
  assert_int_equal(wf_data_num_tokens(d, WF_DATA_TRAIN), 400);
  assert_int_equal(wf_data_num_tokens(d, WF_DATA_VAL), 100);
  assert_non_null(strstr(wf_data_describe(d), "5 files"));
  int win[T + 1], crossed = 0;
  for (int split = 0; split < 2; split++) {
    for (int64_t row = 0; row < 400; row++) {
      assert_int_equal(wf_data_row(d, win, split, row / B, row % B), WF_OK);
      for (int t = 1; t <= T; t++) /* contiguous in the concatenated stream */
        assert_int_equal(win[t], win[0] + t);
      if (split == WF_DATA_TRAIN)
        assert_true(win[T] < 400); /* wholly inside its split */
      else
        assert_true(win[0] >= 400 && win[T] < 500);
      crossed += win[0] / PER != win[T] / PER;
    }
  }
  assert_true(crossed > 0); /* windows run on from one shard into the next */
  wf_data_destroy(d);

  /* One shard by its own name. */
  snprintf(path, sizeof path, "%s/tok_03.bin", tmpdir);
  d = open_ok(path, 50257, T, B, 5, 0.2);
  assert_int_equal(wf_data_num_tokens(d, WF_DATA_TRAIN), 80);
  assert_int_equal(wf_data_row(d, win, WF_DATA_TRAIN, 0, 0), WF_OK);
  assert_true(win[0] >= 300 && win[T] < 380);
  wf_data_destroy(d);
}

/* Opening `pattern` fails with `code`, and the message names `file` and says `what`. */
static void expect_error(const char *pattern, int vocab, wf_status code, const char *file,
                         const char *what)
{
  wf_data_opts o = {.path = pattern,
                    .vocab = vocab,
                    .seq_len = 8,
                    .batch_size = 2,
                    .seed = 1,
                    .val_fraction = 0.1};
  char err[1024] = "";
  wf_data *d = (wf_data *)1;
  wf_status st = wf_data_open(&d, &o, err, sizeof err);
  printf("%s\n", err);
  assert_int_equal(st, code);
  assert_null(d);
  assert_non_null(strstr(err, file));
  assert_non_null(strstr(err, what));
}

static void test_shard_errors(void **state)
{
  char good[300], bad[300], pattern[300];
  snprintf(good, sizeof good, "%s/e_0.bin", tmpdir);
  snprintf(bad, sizeof bad, "%s/e_1.bin", tmpdir);
  snprintf(pattern, sizeof pattern, "%s/e_*.bin", tmpdir);
  write_shard(good, 20240520, 1, 100, 0, 100);

  write_shard(bad, 20240326, 1, 100, 0, 100); /* the checkpoint magic */
  expect_error(pattern, 256, WF_EFORMAT, bad, "bad magic 20240326, expected 20240520");
  write_shard(bad, 20240520, 2, 100, 0, 100);
  expect_error(pattern, 256, WF_EFORMAT, bad, "unsupported version 2, expected 1");
  write_shard(bad, 20240520, 1, 100, 0, 60); /* tokens cut short */
  expect_error(pattern, 256, WF_EFORMAT, bad, "truncated: the header says 100 tokens");
  int32_t half[100] = {20240520, 1, 100};
  write_file(bad, half, sizeof half); /* the header itself cut short */
  expect_error(pattern, 256, WF_EFORMAT, bad, "truncated: 400 bytes");
  write_shard(bad, 20240520, 1, 50, 0, 100); /* more tokens than the header says */
  expect_error(pattern, 256, WF_EFORMAT, bad, "token count 50 disagrees with the file size");
  write_shard(bad, 20240520, 1, 100, 200, 100); /* tokens 200..299 */
  expect_error(pattern, 256, WF_EFORMAT, bad, "token 256 at index 56");
  write_shard(bad, 20240520, 1, 0, 0, 0);
  expect_error(pattern, 256, WF_EFORMAT, bad, "header says 0 tokens");

  snprintf(pattern, sizeof pattern, "%s/nothing_*.bin", tmpdir);
  expect_error(pattern, 256, WF_ECONFIG, pattern, "matches no file");
  snprintf(pattern, sizeof pattern, "%s/missing.txt", tmpdir);
  expect_error(pattern, 256, WF_EIO, pattern, "cannot open");
}

/* ---- text ---------------------------------------------------------------------------------- */

static long find_window(const unsigned char *text, long n, const int *win, int len)
{
  long at = -1;
  for (long s = 0; s + len <= n; s++) {
    int t = 0;
    while (t < len && text[s + t] == win[t])
      t++;
    if (t == len) {
      assert_int_equal(at, -1); /* random text: every window is unique */
      at = s;
    }
  }
  return at;
}

static void test_text(void **state)
{
  enum { N = 2000, T = 24 };
  static unsigned char text[N];
  for (int i = 0; i < N; i++) /* all byte values, including >= 128 */
    text[i] = (unsigned char)(wf_rng_u64(99, 0, (uint64_t)i) & 0xff);
  char path[300];
  snprintf(path, sizeof path, "%s/corpus.txt", tmpdir);
  write_file(path, text, N);
  wf_data *d = open_ok(path, 256, T, 4, 1, 0.25);
  assert_int_equal(wf_data_get_kind(d), WF_DATA_TEXT);
  assert_int_equal(wf_data_num_tokens(d, WF_DATA_TRAIN), 1500);
  assert_int_equal(wf_data_num_tokens(d, WF_DATA_VAL), 500);
  int win[T + 1], high = 0;
  for (int split = 0; split < 2; split++) {
    for (int row = 0; row < 200; row++) {
      assert_int_equal(wf_data_row(d, win, split, row, row % 4), WF_OK);
      long at = find_window(text, N, win, T + 1);
      assert_true(at >= 0);
      if (split == WF_DATA_TRAIN) /* train windows end before the held-out tail */
        assert_true(at + T < 1500);
      else
        assert_true(at >= 1500);
      for (int t = 0; t <= T; t++)
        high += win[t] >= 128;
    }
  }
  assert_true(high > 0);
  wf_data_destroy(d);

  /* Too short for a window in each split; empty; bytes beyond a small vocabulary. */
  write_file(path, text, 12); /* seq_len 8: train 11 tokens is enough, val 1 is not */
  expect_error(path, 256, WF_ECONFIG, path, "validation split of 1 tokens");
  write_file(path, text, 0);
  expect_error(path, 256, WF_EFORMAT, path, "is empty");
  write_file(path, text, N);
  expect_error(path, 100, WF_EFORMAT, path, "not below the model's vocabulary 100");
}

/* ---- validation files (data.val_path) ------------------------------------------------------ */

static wf_data *open_val(const char *path, const char *val_path, int vocab, int T, char *err,
                         size_t len, wf_status *st)
{
  wf_data_opts o = {.path = path,
                    .vocab = vocab,
                    .seq_len = T,
                    .batch_size = 4,
                    .seed = 3,
                    .val_fraction = 0.1,
                    .val_path = val_path};
  wf_data *d = NULL;
  *st = wf_data_open(&d, &o, err, len);
  return d;
}

/* llm.c's layout: *_train_* shards for training, *_val_* for validation, each split its
 * own files (no held-out tail); windows never leave their split. */
static void test_val_shards(void **state)
{
  enum { T = 16 };
  char path[300], train[300], val[300], err[1024] = "";
  for (int s = 0; s < 3; s++) {
    snprintf(path, sizeof path, "%s/ds_train_%06d.bin", tmpdir, s);
    write_shard(path, 20240520, 1, 100, s * 100, 100); /* tokens 0..299 */
  }
  snprintf(path, sizeof path, "%s/ds_val_000000.bin", tmpdir);
  write_shard(path, 20240520, 1, 50, 1000, 50); /* tokens 1000..1049 */
  snprintf(train, sizeof train, "%s/ds_train_*.bin", tmpdir);
  snprintf(val, sizeof val, "%s/ds_val_*.bin", tmpdir);
  wf_status st;
  wf_data *d = open_val(train, val, 50257, T, err, sizeof err, &st);
  assert_int_equal(st, WF_OK);
  printf("%s\n", wf_data_describe(d));
  assert_int_equal(wf_data_num_tokens(d, WF_DATA_TRAIN), 300); /* all of the train files */
  assert_int_equal(wf_data_num_tokens(d, WF_DATA_VAL), 50);
  assert_non_null(strstr(wf_data_describe(d), "validation (data.val_path)"));
  int win[T + 1];
  for (int row = 0; row < 300; row++) {
    assert_int_equal(wf_data_row(d, win, WF_DATA_TRAIN, row / 4, row % 4), WF_OK);
    assert_true(win[0] >= 0 && win[T] < 300);
    assert_int_equal(wf_data_row(d, win, WF_DATA_VAL, row / 4, row % 4), WF_OK);
    assert_true(win[0] >= 1000 && win[T] < 1050);
    for (int t = 1; t <= T; t++)
      assert_int_equal(win[t], win[0] + t);
  }
  wf_data_destroy(d);

  /* The validation files must hold one window; overlap and kind mismatches are refused. */
  d = open_val(train, val, 50257, 64, err, sizeof err, &st);
  printf("%s\n", err);
  assert_int_equal(st, WF_ECONFIG);
  assert_null(d);
  assert_non_null(strstr(err, "validation split of 50 tokens"));
  assert_non_null(strstr(err, "data.val_path"));
  snprintf(val, sizeof val, "%s/ds_*_000000.bin", tmpdir); /* train 0 and val 0 */
  d = open_val(train, val, 50257, T, err, sizeof err, &st);
  printf("%s\n", err);
  assert_int_equal(st, WF_ECONFIG);
  assert_non_null(strstr(err, "share a file"));
  snprintf(val, sizeof val, "%s/ds_val.txt", tmpdir);
  write_file(val, "some validation text that is long enough", 40);
  d = open_val(train, val, 50257, T, err, sizeof err, &st);
  printf("%s\n", err);
  assert_int_equal(st, WF_ECONFIG);
  /* text under a GPT-2 vocabulary is refused first; with vocab 256 the kinds differ */
  assert_non_null(strstr(err, "would be read as bytes"));
  d = open_val(train, val, 256, 8, err, sizeof err, &st);
  assert_int_not_equal(st, WF_OK);
}

/* Text validation data: the held-out fraction does not apply. */
static void test_val_text(void **state)
{
  char train[300], val[300], err[1024] = "";
  static char text[1000];
  for (int i = 0; i < 1000; i++)
    text[i] = (char)('a' + i % 26);
  snprintf(train, sizeof train, "%s/vt_train.txt", tmpdir);
  snprintf(val, sizeof val, "%s/vt_val.txt", tmpdir);
  write_file(train, text, 1000);
  write_file(val, text, 300);
  wf_status st;
  wf_data *d = open_val(train, val, 256, 8, err, sizeof err, &st);
  assert_int_equal(st, WF_OK);
  assert_int_equal(wf_data_num_tokens(d, WF_DATA_TRAIN), 1000);
  assert_int_equal(wf_data_num_tokens(d, WF_DATA_VAL), 300);
  /* byte-level data says so in the banner's description */
  printf("%s\n", wf_data_describe(d));
  assert_non_null(strstr(wf_data_describe(d), "read as bytes"));
  assert_non_null(strstr(wf_data_describe(d), "byte values 0-255, not words"));
  wf_data_destroy(d);
}

/* A FIFO would block open() until a writer came (issue 19: the job hung until the hang
 * timeout); a folder or a device is no data either. Each is refused at once, by name.
 * The test itself would hang on the FIFO if anything opened it, so it runs under an
 * alarm. */
static void test_not_regular(void **state)
{
  char fifo[300], err[1024] = "";
  snprintf(fifo, sizeof fifo, "%s/data.fifo", tmpdir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  alarm(20);
  expect_error(fifo, 256, WF_ECONFIG, fifo, "a FIFO (named pipe), not a regular file");
  expect_error(tmpdir, 256, WF_ECONFIG, tmpdir, "is a folder");
  expect_error("/dev/null", 256, WF_ECONFIG, "/dev/null", "a device");
  char good[300];
  snprintf(good, sizeof good, "%s/nr_train.txt", tmpdir);
  write_file(good, "0123456789abcdefghijklmnopqrstuvwxyz", 36);
  wf_status st;
  wf_data *d = open_val(good, fifo, 256, 8, err, sizeof err, &st);
  assert_int_equal(st, WF_ECONFIG);
  assert_null(d);
  assert_non_null(strstr(err, "data.val_path"));
  assert_non_null(strstr(err, "FIFO"));
  /* the pre-flight check says the same, before any rank opens anything */
  wf_config cfg;
  wf_config_init(&cfg);
  snprintf(cfg.data.path, sizeof cfg.data.path, "%s", fifo);
  assert_int_equal(wf_data_check(&cfg, 256, err, sizeof err), WF_ECONFIG);
  assert_non_null(strstr(err, "FIFO"));
  alarm(0);
}

/* Text under a vocabulary above 256 needs a tokenizer; wf_data_check finds what opening
 * would, from headers and file types alone. */
static void test_check(void **state)
{
  char text[300], shard[300], err[1024] = "";
  snprintf(text, sizeof text, "%s/ck.txt", tmpdir);
  write_file(text, "hello, world: some text to train on", 35);
  wf_config cfg;
  wf_config_init(&cfg);
  assert_int_equal(wf_data_check(&cfg, 50257, err, sizeof err), WF_OK); /* synthetic */
  snprintf(cfg.data.path, sizeof cfg.data.path, "%s", text);
  assert_int_equal(wf_data_check(&cfg, 256, err, sizeof err), WF_OK);
  assert_int_equal(wf_data_check(&cfg, 0, err, sizeof err), WF_OK); /* vocab unknown */
  assert_int_equal(wf_data_check(&cfg, 50257, err, sizeof err), WF_ECONFIG);
  printf("%s\n", err);
  assert_non_null(strstr(err, "would be read as bytes"));
  assert_non_null(strstr(err, "vocabulary is 50257"));
  assert_non_null(strstr(err, "data.tokenizer"));
  expect_error(text, 50257, WF_ECONFIG, text, "would be read as bytes");
  /* a truncated shard is found from its header and size */
  snprintf(shard, sizeof shard, "%s/ck_train.bin", tmpdir);
  write_shard(shard, 20240520, 1, 100, 0, 60);
  snprintf(cfg.data.path, sizeof cfg.data.path, "%s", shard);
  assert_int_equal(wf_data_check(&cfg, 50257, err, sizeof err), WF_EFORMAT);
  assert_non_null(strstr(err, "truncated"));
  write_shard(shard, 20240520, 1, 100, 0, 100);
  assert_int_equal(wf_data_check(&cfg, 50257, err, sizeof err), WF_OK);
  snprintf(cfg.data.val_path, sizeof cfg.data.val_path, "%s/ck_val_*.bin", tmpdir);
  assert_int_equal(wf_data_check(&cfg, 50257, err, sizeof err), WF_ECONFIG);
  assert_non_null(strstr(err, "data.val_path"));
  assert_non_null(strstr(err, "matches no file"));
  snprintf(cfg.data.val_path, sizeof cfg.data.val_path, "%s", shard);
  assert_int_equal(wf_data_check(&cfg, 50257, err, sizeof err), WF_ECONFIG);
  assert_non_null(strstr(err, "share a file"));
  snprintf(cfg.data.tokenizer, sizeof cfg.data.tokenizer, "%s/no_tokenizer.json", tmpdir);
  assert_int_equal(wf_data_check(&cfg, 50257, err, sizeof err), WF_EIO);
  assert_non_null(strstr(err, "no_tokenizer.json"));
}

/* data.val_path replaces the held-out fraction: both set is a config error, as is
 * validation data beside the synthetic source. */
static void test_config_rules(void **state)
{
  char err[1024] = "";
  wf_config cfg;
  wf_config_init(&cfg);
  assert_int_equal(wf_config_set(&cfg, "data.path", "a.bin", WF_SRC_CLI, err, sizeof err), WF_OK);
  assert_int_equal(wf_config_set(&cfg, "data.val_path", "v.bin", WF_SRC_CLI, err, sizeof err),
                   WF_OK);
  assert_int_equal(wf_config_validate(&cfg, 1, err, sizeof err), WF_OK);
  assert_int_equal(wf_config_set(&cfg, "data.val_fraction", "0.2", WF_SRC_CLI, err, sizeof err),
                   WF_OK);
  assert_int_equal(wf_config_validate(&cfg, 1, err, sizeof err), WF_ECONFIG);
  printf("%s\n", err);
  assert_non_null(strstr(err, "data.val_fraction=0.2 is set but data.val_path='v.bin'"));
  wf_config_init(&cfg);
  assert_int_equal(wf_config_set(&cfg, "data.val_path", "v.bin", WF_SRC_CLI, err, sizeof err),
                   WF_OK);
  assert_int_equal(wf_config_validate(&cfg, 1, err, sizeof err), WF_ECONFIG);
  assert_non_null(strstr(err, "data.path is empty"));
}

int main(void)
{
  /* the model's rules on the model.* keys, as the worker's main sets them */
  wf_config_set_model_check(wf_model_config_check);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_synthetic_floor),
      cmocka_unit_test(test_small_vocab),
      cmocka_unit_test(test_dp_slices),
      cmocka_unit_test(test_seeds),
      cmocka_unit_test(test_shards_read),
      cmocka_unit_test(test_shard_errors),
      cmocka_unit_test(test_text),
      cmocka_unit_test(test_val_shards),
      cmocka_unit_test(test_val_text),
      cmocka_unit_test(test_not_regular),
      cmocka_unit_test(test_check),
      cmocka_unit_test(test_config_rules),
  };
  return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
