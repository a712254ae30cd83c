/*
 * capture.h - what a piece of code logs, for tests of error messages.
 *
 * weft logs errors where they arise, on stderr (one write per line). A test that checks
 * a message captures stderr around the call: capture_begin() points file descriptor 2
 * at a temporary file, capture_end() restores it and returns what was written
 * (NUL-terminated, cut to len - 1 bytes). Header-only: each test program includes it
 * once.
 */
#ifndef WF_TEST_CAPTURE_H
#define WF_TEST_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int capture_saved = -1;
static FILE *capture_file;

static void capture_begin(void)
{
  fflush(stderr);
  capture_file = tmpfile();
  if (!capture_file || (capture_saved = dup(STDERR_FILENO)) < 0 ||
      dup2(fileno(capture_file), STDERR_FILENO) < 0) {
    perror("capture_begin");
    abort();
  }
}

static const char *capture_end(char *buf, size_t len)
{
  fflush(stderr);
  dup2(capture_saved, STDERR_FILENO);
  close(capture_saved);
  capture_saved = -1;
  rewind(capture_file);
  size_t n = fread(buf, 1, len - 1, capture_file);
  buf[n] = '\0';
  fclose(capture_file);
  capture_file = NULL;
  fputs(buf, stderr); /* still shown in the test's log */
  return buf;
}

#endif /* WF_TEST_CAPTURE_H */
