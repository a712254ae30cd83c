/*
 * test_file.c - the atomic file writer: contents, mode, checksum, and that no failure
 * leaves a temporary file or touches the old file.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>

#include "wf_file.h"

static char dir[256];

static int setup(void **state)
{
  snprintf(dir, sizeof dir, "/tmp/weft-test-file-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* Entries of `dir` other than . and .. */
static int entries(void)
{
  int n = 0;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));)
    n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d)
    closedir(d);
  return n;
}

static void read_back(const char *path, char *buf, size_t len)
{
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = '\0';
  fclose(f);
}

static void test_write_commit(void **state)
{
  char path[300], got[64];
  snprintf(path, sizeof path, "%s/a.txt", dir);
  static const char text[] = "hello, weft";
  wf_afile f;
  assert_int_equal(wf_afile_open(&f, path, 0600, WF_AFILE_HASH), WF_OK);
  assert_int_equal(wf_afile_write(&f, text, 5), WF_OK);
  assert_int_equal(entries(), 1); /* the temporary file, not yet a.txt */
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(wf_afile_write(&f, text + 5, sizeof text - 1 - 5), WF_OK);
  uint64_t bytes = 0, hash = 0;
  assert_int_equal(wf_afile_commit(&f, &bytes, &hash), WF_OK);
  assert_int_equal(bytes, sizeof text - 1);
  /* the checksum of what was written, as xxHash computes it over the whole buffer */
  assert_int_equal(hash, XXH3_64bits(text, sizeof text - 1));
  read_back(path, got, sizeof got);
  assert_string_equal(got, text);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600); /* exactly, whatever the umask */
  assert_int_equal(entries(), 1);            /* a.txt only: no temporary file left */
}

/* WF_AFILE_MEMORY: nothing on disk until spilled, growing past the first buffer (64 KiB)
 * by doubling; the size and hash before the spill are the file's; the commit as above. */
static void test_memory_then_spill(void **state)
{
  char path[300];
  snprintf(path, sizeof path, "%s/m.bin", dir);
  size_t n = 300000; /* past 64 KiB twice over */
  unsigned char *data = malloc(n), *got = malloc(n);
  for (size_t i = 0; i < n; i++)
    data[i] = (unsigned char)(i * 131 + 7);
  wf_afile f;
  assert_int_equal(wf_afile_open(&f, path, 0644, WF_AFILE_HASH | WF_AFILE_MEMORY), WF_OK);
  assert_int_equal(wf_afile_write(&f, data, 1000), WF_OK);
  assert_int_equal(wf_afile_write(&f, data + 1000, n - 1000), WF_OK);
  assert_int_equal(entries(), 0); /* no temporary file yet */
  uint64_t bytes = 0, hash = 0, bytes2 = 0, hash2 = 0;
  wf_afile_sum(&f, &bytes, &hash);
  assert_int_equal(bytes, n);
  assert_int_equal(hash, XXH3_64bits(data, n));
  assert_int_equal(wf_afile_commit(&f, NULL, NULL), WF_EINVAL); /* not spilled */
  assert_int_equal(wf_afile_open(&f, path, 0644, WF_AFILE_HASH | WF_AFILE_MEMORY), WF_OK);
  assert_int_equal(wf_afile_reserve(&f, n), WF_OK);
  assert_int_equal(wf_afile_write(&f, data, n), WF_OK);
  assert_int_equal(wf_afile_spill(&f), WF_OK);
  assert_int_equal(entries(), 1); /* the temporary file */
  assert_int_equal(wf_afile_commit(&f, &bytes2, &hash2), WF_OK);
  assert_int_equal(bytes2, n);
  assert_int_equal(hash2, hash);
  FILE *in = fopen(path, "rb");
  assert_non_null(in);
  assert_int_equal(fread(got, 1, n, in), n);
  fclose(in);
  assert_memory_equal(got, data, n);
  free(data);
  free(got);
}

static void test_replace_and_abort(void **state)
{
  char path[300], got[64];
  snprintf(path, sizeof path, "%s/b.txt", dir);
  assert_int_equal(wf_file_write_atomic(path, "old", 3, 0644), WF_OK);
  wf_afile f;
  assert_int_equal(wf_afile_open(&f, path, 0644, 0), WF_OK);
  assert_int_equal(wf_afile_write(&f, "new contents", 12), WF_OK);
  wf_afile_abort(&f);
  read_back(path, got, sizeof got);
  assert_string_equal(got, "old"); /* an aborted write leaves the old file */
  assert_int_equal(entries(), 1);
  assert_int_equal(wf_file_write_atomic(path, "new", 3, 0644), WF_OK);
  read_back(path, got, sizeof got);
  assert_string_equal(got, "new");
  assert_int_equal(entries(), 1);
}

/* Every output path may be in a new folder: the writer makes the missing ones. */
static void test_makes_parents(void **state)
{
  char path[300], got[16];
  snprintf(path, sizeof path, "%s/new/deeper/c.txt", dir);
  assert_int_equal(wf_file_write_atomic(path, "made", 4, 0644), WF_OK);
  read_back(path, got, sizeof got);
  assert_string_equal(got, "made");
}

static void test_failures(void **state)
{
  char path[300];
  /* a folder that cannot be made: its parent is a regular file (a missing one is made) */
  snprintf(path, sizeof path, "%s/plain", dir);
  assert_int_equal(wf_file_write_atomic(path, "x", 1, 0644), WF_OK);
  snprintf(path, sizeof path, "%s/plain/sub/c.txt", dir);
  wf_afile f;
  assert_int_equal(wf_afile_open(&f, path, 0644, 0), WF_EIO);
  assert_int_equal(f.fd, -1);
  snprintf(path, sizeof path, "%s/plain", dir);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(wf_afile_write(&f, "x", 1), WF_EINVAL); /* a closed writer */
  assert_int_equal(wf_afile_commit(&f, NULL, NULL), WF_EINVAL);
  assert_int_equal(wf_file_write_atomic("", "x", 1, 0644), WF_EINVAL);
  /* renaming over a directory fails: the temporary file goes, the directory stays */
  snprintf(path, sizeof path, "%s/d", dir);
  assert_int_equal(mkdir(path, 0755), 0);
  assert_int_equal(wf_file_write_atomic(path, "x", 1, 0644), WF_EIO);
  assert_int_equal(entries(), 1);
  assert_int_equal(wf_file_sync_dir(dir), WF_OK);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_write_commit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_memory_then_spill, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replace_and_abort, setup, teardown),
      cmocka_unit_test_setup_teardown(test_makes_parents, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failures, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
