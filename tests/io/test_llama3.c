/*
 * test_llama3.c - Llama 3's tokenizer (worker/io/tokenizer.c with tokenizer_llama3.c) on
 * real files and real text, against independent implementations.
 *
 * tests/io/llama3_ref.mjs, under node, rebuilds Llama 3's tokenizer.model (tiktoken's
 * ranks format) from npm's llama3-tokenizer-js and cl100k_base's from js-tiktoken, and
 * encodes every fortune of Debian's fortunes packages (English, Chinese, Russian) plus
 * edge cases with llama3-tokenizer-js (Hugging Face's tokenizer.json semantics) and with
 * js-tiktoken (a port of tiktoken, Meta's own encoder) given Llama 3's ranks. weft must
 * give the same ids token for token, decode them back to the same bytes, know the 256
 * special tokens by the package's names and ids, and refuse damaged files with an error
 * naming the file and the line. The packages are tests-only (scripts/setup.sh installs
 * them); the vocabulary is written to a temporary folder and never kept.
 *
 * usage: test_llama3 NODE NODE_MODULES llama3_ref.mjs FORTUNES_DIR
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "wf_io.h"
#include "tok_files.h"

static char **g_argv;

/* One reference case: its text and the ids of each reference. */
typedef struct ref_case {
  const unsigned char *text;
  uint32_t len;
  const uint32_t *ids[3]; /* llama3-tokenizer-js, js-tiktoken (Llama 3), cl100k_base */
  uint32_t n[3];          /* UINT32_MAX: no cl100k_base ids for this text */
} ref_case;

static unsigned char *cases_buf;
static uint32_t *ids_buf; /* the ids, copied out of the file to aligned memory */
static ref_case *cases;
static uint32_t n_cases;

static unsigned char *read_file(const char *path, size_t *len)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf)
    buf[n] = '\0', *len = (size_t)n;
  return buf;
}

/* Append one id (a wf_tokens the test fills itself). */
static wf_status tokens_push(wf_tokens *o, int32_t id)
{
  if (o->n == o->cap) {
    o->cap = o->cap ? 2 * o->cap : 1024;
    o->ids = realloc(o->ids, o->cap * sizeof *o->ids);
    if (!o->ids)
      return WF_ENOMEM;
  }
  o->ids[o->n++] = id;
  return WF_OK;
}

static uint32_t take_u32(const unsigned char **p)
{
  uint32_t v;
  memcpy(&v, *p, 4);
  *p += 4;
  return v;
}

static int parse_cases(void)
{
  char path[512];
  size_t len = 0;
  path_of(path, sizeof path, "cases.bin");
  if (!(cases_buf = read_file(path, &len)))
    return -1;
  const unsigned char *p = cases_buf;
  n_cases = take_u32(&p);
  cases = calloc(n_cases, sizeof *cases);
  ids_buf = malloc(len); /* more than the ids need */
  uint32_t *at = ids_buf;
  for (uint32_t i = 0; cases && ids_buf && i < n_cases; i++) {
    cases[i].len = take_u32(&p);
    cases[i].text = p;
    p += cases[i].len;
    for (int r = 0; r < 3; r++) {
      cases[i].n[r] = take_u32(&p);
      size_t n = cases[i].n[r] == UINT32_MAX ? 0 : cases[i].n[r];
      memcpy(at, p, 4 * n);
      cases[i].ids[r] = at;
      at += n, p += 4 * n;
    }
  }
  return cases && ids_buf && p == cases_buf + len ? 0 : -1;
}

static int setup(void **state)
{
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/weft_test_llama3_XXXXXX");
  if (!mkdtemp(tmpdir))
    return -1;
  char cmd[16384];
  snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s' '%s'", g_argv[1], g_argv[3], g_argv[2], tmpdir,
           g_argv[4]);
  if (system(cmd) != 0) {
    fprintf(stderr,
            "the reference (%s) failed: are the tests-only packages (npm's "
            "llama3-tokenizer-js and js-tiktoken in %s, Debian's fortunes, fortunes-zh "
            "and fortunes-ru) installed? scripts/setup.sh installs them\n",
            g_argv[3], g_argv[2]);
    return -1;
  }
  return parse_cases();
}

static int teardown(void **state)
{
  (void)state;
  char cmd[300];
  free(cases);
  free(ids_buf);
  free(cases_buf);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

/* ---- the real vocabulary ------------------------------------------------------------ */

/* Sizes, the document ids, and the 256 specials by the package's names and ids. */
static void test_ranks_file(void **state)
{
  (void)state;
  wf_tokenizer *t = load_ok("tokenizer.model");
  printf("%s\n", wf_tokenizer_describe(t));
  assert_non_null(strstr(wf_tokenizer_describe(t), "Llama 3 BPE"));
  assert_int_equal(wf_tokenizer_vocab(t), 128256); /* 128000 ranks + 256 specials */
  assert_int_equal(wf_tokenizer_bos(t), 128000);   /* <|begin_of_text|> */
  assert_int_equal(wf_tokenizer_eot(t), 128001);   /* <|end_of_text|> */
  assert_true(wf_tokenizer_adds_bos(t));           /* Meta's generate: bos=True */
  char path[512], back[64];
  size_t len = 0;
  path_of(path, sizeof path, "specials.txt");
  char *names = (char *)read_file(path, &len), *save = NULL;
  assert_non_null(names);
  int id = 128000, n = 0;
  for (char *s = strtok_r(names, "\n", &save); s; s = strtok_r(NULL, "\n", &save), id++, n++) {
    assert_int_equal(wf_tokenizer_special(t, s), id);
    int32_t one = id;
    assert_int_equal(wf_tokenizer_decode(t, &one, 1, back, sizeof back, &len), WF_OK);
    assert_int_equal(len, strlen(s));
    assert_memory_equal(back, s, len);
  }
  assert_int_equal(n, 256);
  assert_int_equal(wf_tokenizer_special(t, "<|eot_id|>"), 128009); /* Meta's chat format */
  assert_int_equal(wf_tokenizer_special(t, "<|start_header_id|>"), 128006);
  free(names);
  wf_tokenizer_destroy(t);
}

/* Texts against one reference; returns the mismatching texts (the first few printed). */
static int compare(const wf_tokenizer *t, int ref, const char *who, size_t *tokens)
{
  int bad = 0;
  size_t cap = 1 << 20;
  char *back = malloc(cap);
  assert_non_null(back);
  for (uint32_t i = 0; i < n_cases; i++) {
    const ref_case *c = &cases[i];
    if (c->n[ref] == UINT32_MAX)
      continue;
    wf_tokens tok = {0};
    assert_int_equal(wf_tokenizer_encode(t, (const char *)c->text, c->len, &tok), WF_OK);
    bool same = tok.n == c->n[ref];
    for (size_t k = 0; same && k < tok.n; k++)
      same = (uint32_t)tok.ids[k] == c->ids[ref][k];
    if (!same && bad++ < 5) {
      size_t k = 0;
      while (k < tok.n && k < c->n[ref] && (uint32_t)tok.ids[k] == c->ids[ref][k])
        k++;
      fprintf(stderr,
              "%s: text %u ('%.60s'): %zu ids, the reference %u; first difference at "
              "%zu: %d, the reference %u\n",
              who, i, (const char *)c->text, tok.n, c->n[ref], k, k < tok.n ? tok.ids[k] : -1,
              k < c->n[ref] ? c->ids[ref][k] : UINT32_MAX);
    }
    size_t len = 0;
    assert_int_equal(wf_tokenizer_decode(t, tok.ids, tok.n, back, cap, &len), WF_OK);
    assert_int_equal(len, c->len);
    assert_memory_equal(back, c->text, len);
    *tokens += tok.n;
    wf_tokens_free(&tok);
  }
  free(back);
  return bad;
}

/* Every text: the ids of both references, and decode gives the bytes back. */
static void test_real_text(void **state)
{
  (void)state;
  wf_tokenizer *t = load_ok("tokenizer.model");
  size_t tokens = 0, tokens2 = 0;
  int bad = compare(t, 0, "llama3-tokenizer-js", &tokens);
  int bad2 = compare(t, 1, "js-tiktoken (Llama 3 ranks)", &tokens2);
  printf("Llama 3: %u texts, %zu tokens compared with each reference: %d mismatching texts "
         "against llama3-tokenizer-js, %d against js-tiktoken; every text decoded back byte "
         "for byte\n",
         n_cases, tokens, bad, bad2);
  assert_int_equal(bad, 0);
  assert_int_equal(bad2, 0);
  wf_tokenizer_destroy(t);
}

/* Hugging Face's form of the same tokenizer (tokenizer.json: Llama 3's Split
 * pre-tokenizer, merges ranked by their order, ignore_merges, a template adding
 * <|begin_of_text|>) read by the GPT-2 reader, against both references. */
static void test_hf_json(void **state)
{
  (void)state;
  wf_tokenizer *t = load_ok("tokenizer.json");
  printf("%s\n", wf_tokenizer_describe(t));
  assert_non_null(strstr(wf_tokenizer_describe(t), "Llama 3 BPE"));
  assert_int_equal(wf_tokenizer_vocab(t), 128256);
  assert_int_equal(wf_tokenizer_bos(t), 128000);
  assert_int_equal(wf_tokenizer_eot(t), 128001);
  assert_true(wf_tokenizer_adds_bos(t));
  assert_int_equal(wf_tokenizer_special(t, "<|eot_id|>"), 128009);
  size_t tokens = 0; /* the references agree on every text (llama3_ref.mjs checks) */
  int bad = compare(t, 0, "tokenizer.json vs llama3-tokenizer-js", &tokens);
  printf("Llama 3 tokenizer.json: %zu tokens, %d mismatching texts\n", tokens, bad);
  assert_int_equal(bad, 0);
  wf_tokenizer_destroy(t);
}

/* The same pattern and merging on a second vocabulary: OpenAI's cl100k_base (through the
 * same kind: its specials are not Llama 3's, so texts holding "<|" are left out). */
static void test_cl100k(void **state)
{
  (void)state;
  wf_tokenizer *t = load_ok("cl100k_base.tiktoken");
  size_t tokens = 0;
  int bad = compare(t, 2, "js-tiktoken (cl100k_base)", &tokens);
  printf("cl100k_base: %zu tokens compared with js-tiktoken, %d mismatching texts\n", tokens, bad);
  assert_int_equal(bad, 0);
  wf_tokenizer_destroy(t);
}

/* ---- single texts --------------------------------------------------------------------- */

static void expect_ids(const wf_tokenizer *t, const char *text, const int32_t *ids, size_t n)
{
  wf_tokens tok = {0};
  assert_int_equal(wf_tokenizer_encode(t, text, strlen(text), &tok), WF_OK);
  assert_int_equal(tok.n, n);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(tok.ids[i], ids[i]);
  wf_tokens_free(&tok);
}

/* Ids documented outside weft, and specials inside text. */
static void test_known_ids(void **state)
{
  (void)state;
  wf_tokenizer *t = load_ok("tokenizer.model");
  /* llama3-tokenizer-js's README: "Hello world!" is 9906 1917 0 */
  expect_ids(t, "Hello world!", (const int32_t[]){9906, 1917, 0}, 3);
  /* a chat turn: the specials are cut out, the text between them is encoded */
  expect_ids(t, "<|begin_of_text|>Hello world!<|eot_id|>",
             (const int32_t[]){128000, 9906, 1917, 0, 128009}, 5);
  /* an unknown <|name|> is plain text, as in every reference */
  wf_tokens tok = {0};
  assert_int_equal(wf_tokenizer_encode(t, "<|nope|>", 8, &tok), WF_OK);
  for (size_t i = 0; i < tok.n; i++)
    assert_true(tok.ids[i] < 128000);
  wf_tokens_free(&tok);
  wf_tokenizer_destroy(t);
}

/* Any bytes round-trip (malformed UTF-8 included); a token holding part of a character
 * decodes to those bytes, which wf_utf8_char_len does not take for a character. */
static void test_bytes_and_partial_utf8(void **state)
{
  (void)state;
  wf_tokenizer *t = load_ok("tokenizer.model");
  unsigned char buf[8192];
  char back[8192];
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int round = 0; round < 40; round++) {
    size_t n = 1 + (size_t)(round * 197) % sizeof buf;
    for (size_t i = 0; i < n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      buf[i] = (unsigned char)(round % 2 ? x : (x % 3 ? 'a' + x % 26 : x % 5 ? ' ' : 0xC3));
    }
    wf_tokens tok = {0};
    assert_int_equal(wf_tokenizer_encode(t, (const char *)buf, n, &tok), WF_OK);
    size_t len = 0;
    assert_int_equal(wf_tokenizer_decode(t, tok.ids, tok.n, back, sizeof back, &len), WF_OK);
    assert_int_equal(len, n);
    assert_memory_equal(back, buf, n);
    wf_tokens_free(&tok);
  }
  /* "𝔘" (U+1D518, 4 bytes) is rare: Llama 3 splits it into tokens of part of a character */
  const char *rare = "\xF0\x9D\x94\x98";
  wf_tokens tok = {0};
  assert_int_equal(wf_tokenizer_encode(t, rare, 4, &tok), WF_OK);
  assert_true(tok.n >= 2);
  size_t len = 0;
  assert_int_equal(wf_tokenizer_decode(t, tok.ids, 1, back, sizeof back, &len), WF_OK);
  assert_true(len >= 1 && len < 4);
  assert_memory_equal(back, rare, len);
  assert_int_equal(wf_utf8_char_len(back, len), 0); /* part of a character, not one */
  assert_int_equal(wf_tokenizer_decode(t, tok.ids, tok.n, back, sizeof back, &len), WF_OK);
  assert_int_equal(wf_utf8_char_len(back, len), 4);
  wf_tokens_free(&tok);
  /* ids outside the vocabulary are refused */
  int32_t bad[2] = {5, 128256};
  assert_int_equal(wf_tokenizer_decode(t, bad, 2, back, sizeof back, &len), WF_EINVAL);
  bad[1] = -1;
  assert_int_equal(wf_tokenizer_decode(t, bad, 2, back, sizeof back, &len), WF_EINVAL);
  wf_tokenizer_destroy(t);
}

/* One pre-token of a megabyte (a run of letters, of spaces, of digits' neighbours) costs
 * O(n log n): without the heap this test would not end within its timeout. */
static void test_long_pretokens(void **state)
{
  (void)state;
  wf_tokenizer *t = load_ok("tokenizer.model");
  size_t n = 1 << 20;
  char *text = malloc(n), *back = malloc(n);
  assert_non_null(text);
  assert_non_null(back);
  const char fill[] = {'a', ' ', '\xE4'};
  for (size_t k = 0; k < WF_ARRAY_LEN(fill); k++) {
    for (size_t i = 0; i < n; i++)
      text[i] = k == 2 ? (char)(i % 3 == 0 ? 0xE4 : i % 3 == 1 ? 0xB8 : 0x80) : fill[k];
    wf_tokens tok = {0};
    assert_int_equal(wf_tokenizer_encode(t, text, n, &tok), WF_OK);
    size_t len = 0;
    assert_int_equal(wf_tokenizer_decode(t, tok.ids, tok.n, back, n, &len), WF_OK);
    assert_int_equal(len, n);
    assert_memory_equal(back, text, n);
    printf("a pre-token of %zu bytes of 0x%02x: %zu tokens\n", n, (unsigned char)text[0], tok.n);
    wf_tokens_free(&tok);
  }
  free(text);
  free(back);
  wf_tokenizer_destroy(t);
}

/* ---- --tokenize and the data source ----------------------------------------------------- */

/* worker --tokenize under Llama 3: llm.c's "llama-3" shards (magic 20240801, version 7,
 * uint32 tokens) holding <|begin_of_text|> and the text's ids, which the data source
 * reads back token for token. */
static void test_tokenize_shards(void **state)
{
  (void)state;
  wf_tokenizer *t = load_ok("tokenizer.model");
  char in[512], prefix[512], shard[600], summary[2048], err[1024] = "";
  path_of(in, sizeof in, "corpus.txt");
  path_of(prefix, sizeof prefix, "l3");
  FILE *f = fopen(in, "wb");
  assert_non_null(f);
  wf_tokens want = {0};
  assert_int_equal(wf_tokenizer_encode(t, "<|begin_of_text|>", 17, &want), WF_OK);
  for (uint32_t i = 0; i < 400 && i < n_cases; i++) { /* the first fortunes */
    assert_int_equal(fwrite(cases[i].text, 1, cases[i].len, f), cases[i].len);
    assert_int_equal(wf_tokenizer_encode(t, (const char *)cases[i].text, cases[i].len, &want),
                     WF_OK);
  }
  fclose(f);
  wf_tokens got = {0};
  assert_int_equal(wf_tokenize_file(t, in, prefix, 0.1, summary, sizeof summary, err, sizeof err),
                   WF_OK);
  printf("%s\n", summary);
  for (int split = 0; split < 2; split++) {
    size_t len = 0;
    snprintf(shard, sizeof shard, "%s_%s_000000.bin", prefix, split ? "val" : "train");
    unsigned char *b = read_file(shard, &len);
    assert_non_null(b);
    int32_t h[3];
    memcpy(h, b, sizeof h);
    assert_int_equal(h[0], 20240801); /* llm.c's data_common.py, "llama-3" */
    assert_int_equal(h[1], 7);
    assert_int_equal(len, 1024 + 4 * (size_t)h[2]);
    for (int32_t k = 0; k < h[2]; k++) {
      uint32_t id;
      memcpy(&id, b + 1024 + 4 * (size_t)k, 4);
      assert_int_equal(tokens_push(&got, (int32_t)id), WF_OK);
    }
    free(b);
  }
  assert_int_equal(got.n, want.n); /* the text's encoding after <|begin_of_text|>, split 9:1 */
  assert_memory_equal(got.ids, want.ids, want.n * sizeof *want.ids);
  assert_int_equal(want.ids[0], 128000);
  /* the data source reads the uint32 shards back: every window is a run of the stream */
  enum { T = 32 };
  char pattern[600];
  snprintf(pattern, sizeof pattern, "%s_train_*.bin", prefix);
  wf_data_opts o = {.path = pattern,
                    .vocab = 128256,
                    .seq_len = T,
                    .batch_size = 4,
                    .seed = 7,
                    .val_fraction = 0.25};
  wf_data *d = NULL;
  assert_int_equal(wf_data_open(&d, &o, err, sizeof err), WF_OK);
  printf("%s\n", wf_data_describe(d));
  int win[T + 1];
  for (int row = 0; row < 16; row++) {
    assert_int_equal(wf_data_row(d, win, WF_DATA_TRAIN, 3, row), WF_OK);
    bool found = false;
    for (size_t s0 = 0; !found && s0 + T < got.n; s0++)
      found = !memcmp(win, got.ids + s0, sizeof win);
    assert_true(found);
  }
  wf_data_destroy(d);
  /* under a model vocabulary below Llama 3's the shards are refused, naming the token */
  o.vocab = 50257;
  assert_int_equal(wf_data_open(&d, &o, err, sizeof err), WF_EFORMAT);
  printf("%s\n", err);
  assert_non_null(strstr(err, "not below the model's vocabulary 50257"));
  wf_tokens_free(&got);
  wf_tokens_free(&want);
  wf_tokenizer_destroy(t);
}

/* ---- errors ----------------------------------------------------------------------------- */

/* A small ranks file: the 256 bytes, then `extra` lines. */
static void write_ranks(const char *name, const char *extra)
{
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char path[512];
  path_of(path, sizeof path, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int b = 0; b < 256; b++)
    fprintf(f, "%c%c== %d\n", tab[b >> 2], tab[(b & 3) << 4], b);
  fputs(extra, f);
  fclose(f);
}

static void test_errors(void **state)
{
  (void)state;
  /* a small file loads: 256 bytes, "ab" (rank 256) and "abc" (257), specials after */
  write_ranks("small.model", "YWI= 256\nYWJj 257\n");
  wf_tokenizer *t = load_ok("small.model");
  assert_int_equal(wf_tokenizer_vocab(t), 258 + 256);
  assert_int_equal(wf_tokenizer_bos(t), 258);
  expect_ids(t, "abcab", (const int32_t[]){257, 256}, 2);
  wf_tokenizer_destroy(t);
  write_ranks("noline.model", "YWI=256\n");
  expect_error("noline.model", WF_EFORMAT, "line 257", "BASE64 RANK");
  write_ranks("badb64.model", "Y!I= 256\n");
  expect_error("badb64.model", WF_EFORMAT, "line 257", "base64");
  write_ranks("order.model", "YWI= 256\nYWJj 259\n");
  expect_error("order.model", WF_EFORMAT, "line 258", "rank 259, expected 257");
  write_ranks("twice.model", "YWI= 256\nYWI= 257\n");
  expect_error("twice.model", WF_EFORMAT, "line 258", "repeats the token of rank 256");
  write_file("nobytes.model", "YQ== 0\nYg== 1\n");
  expect_error("nobytes.model", WF_EFORMAT, "no token for byte 0x00", NULL);
  write_file("neither.txt", "hello world\n");
  expect_error("neither.txt", WF_EFORMAT, "neither", "tokenizer.model");
  expect_error("missing.model", WF_EIO, "cannot open", NULL);
  /* a folder with both kinds' files: which one was meant is unknowable */
  char cmd[1200];
  snprintf(cmd, sizeof cmd,
           "mkdir -p '%s/both' && cp '%s/small.model' '%s/both/tokenizer.model' && echo '{}' > "
           "'%s/both/tokenizer.json'",
           tmpdir, tmpdir, tmpdir, tmpdir);
  assert_int_equal(system(cmd), 0);
  expect_error("both", WF_ECONFIG, "both", "name the file");
  /* a folder with tokenizer.model alone is Llama 3's */
  snprintf(cmd, sizeof cmd, "rm '%s/both/tokenizer.json'", tmpdir);
  assert_int_equal(system(cmd), 0);
  t = load_ok("both");
  assert_int_equal(wf_tokenizer_bos(t), 258);
  wf_tokenizer_destroy(t);
}

int main(int argc, char **argv)
{
  if (argc != 5) {
    fprintf(stderr, "usage: %s NODE NODE_MODULES llama3_ref.mjs FORTUNES_DIR\n", argv[0]);
    return 2;
  }
  g_argv = argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ranks_file),     cmocka_unit_test(test_real_text),
      cmocka_unit_test(test_hf_json),        cmocka_unit_test(test_cl100k),
      cmocka_unit_test(test_known_ids),      cmocka_unit_test(test_bytes_and_partial_utf8),
      cmocka_unit_test(test_long_pretokens), cmocka_unit_test(test_tokenize_shards),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
