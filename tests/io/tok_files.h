/*
 * tok_files.h - what the tokenizer tests (test_tokenizer.c, test_llama3.c) share: files in
 * the test's temporary folder, a load that must succeed and one that must fail with a
 * clear message. Each test
 * includes it once, after cmocka.h and wf_io.h, and fills tmpdir in its set-up.
 */
#ifndef WF_TESTS_TOK_FILES_H
#define WF_TESTS_TOK_FILES_H

#include <stdio.h>
#include <string.h>

static char tmpdir[256];

static void path_of(char *out, size_t len, const char *name)
{
  snprintf(out, len, "%s/%s", tmpdir, name);
}

static void write_file(const char *name, const char *text)
{
  char path[512];
  path_of(path, sizeof path, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* `name` loads. */
static wf_tokenizer *load_ok(const char *name)
{
  char path[512], err[1024] = "";
  path_of(path, sizeof path, name);
  wf_tokenizer *t = NULL;
  wf_status st = wf_tokenizer_load(&t, path, err, sizeof err);
  if (st != WF_OK)
    fprintf(stderr, "%s: %s\n", name, err);
  assert_int_equal(st, WF_OK);
  return t;
}

/* One load of `name`: fails with status st and a message naming the file and holding
 * each of the words. */
static void expect_error(const char *name, wf_status st, const char *w1, const char *w2)
{
  char path[512], err[1024] = "";
  path_of(path, sizeof path, name);
  wf_tokenizer *t = NULL;
  assert_int_equal(wf_tokenizer_load(&t, path, err, sizeof err), st);
  assert_null(t);
  printf("%s: %s\n", name, err);
  assert_non_null(strstr(err, name));
  assert_non_null(strstr(err, w1));
  if (w2)
    assert_non_null(strstr(err, w2));
}

#endif
