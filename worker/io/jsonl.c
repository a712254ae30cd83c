/*
 * jsonl.c - JSON Lines files, plain or zstd-compressed, read line by line, and the text
 * of one document out of a line.
 *
 * A file is zstd when it starts with zstd's frame magic (28 b5 2f fd), whatever its
 * name; frames may follow one another (zstd -T0, pzstd and `cat a.zst b.zst` write
 * several) and skippable frames are skipped, as libzstd's streaming decoder does. A
 * file that ends inside a frame is truncated, and said so. Decompressed bytes go into
 * one growing buffer; a line is a pointer into it, valid until the next call, so a line
 * is copied only when it is longer than the buffer.
 *
 * Documents: one per line that holds anything but white space (blank lines, a trailing
 * newline's empty line, are not documents: every reader counts them alike). Line
 * numbers are the file's own (1-based, blank lines included), for errors.
 *
 * Invariants: every error names the file (and the line, for a line's content) and
 * says what to do; nothing here logs (io_int.h's idiom: errors into the caller's buffer).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <zstd.h>

#include "io_int.h"

#define ZSTD_MAGIC 0xFD2FB528u
#define READ_CHUNK (1u << 20) /* bytes of a plain file per read() */

struct wf__lines {
  int fd;
  char path[WF_PATH_MAX];
  ZSTD_DCtx *z;      /* NULL: a plain file */
  unsigned char *in; /* zstd's input: [in_pos, in_len) not yet decoded */
  size_t in_len, in_pos, in_cap;
  size_t frame_left; /* the last ZSTD_decompressStream's answer: 0 at a frame's end */
  uint64_t in_total; /* compressed bytes read, for errors */
  char *buf;         /* decoded bytes: [start, end) not yet handed out */
  size_t start, end, cap;
  bool eof;       /* the file is read to its end (buf may still hold a last line) */
  int64_t lineno; /* the line last handed out */
};

static wf_status read_in(wf__lines *r, void *dst, size_t cap, size_t *got, char *err,
                         size_t err_len)
{
  ssize_t n;
  do
    n = read(r->fd, dst, cap);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return wf__io_failf(err, err_len, WF_EIO, "cannot read '%s': %s", r->path, strerror(errno));
  *got = (size_t)n;
  return WF_OK;
}

/* Room for at least `want` more bytes at buf's end: the handed-out head dropped first. */
static wf_status make_room(wf__lines *r, size_t want)
{
  if (r->start > 0) {
    memmove(r->buf, r->buf + r->start, r->end - r->start);
    r->end -= r->start, r->start = 0;
  }
  if (r->cap - r->end >= want)
    return WF_OK;
  size_t cap = r->cap ? r->cap : READ_CHUNK;
  while (cap - r->end < want)
    cap *= 2;
  char *b = realloc(r->buf, cap);
  if (!b)
    return WF_ENOMEM;
  r->buf = b, r->cap = cap;
  return WF_OK;
}

static wf_status fill_plain(wf__lines *r, char *err, size_t err_len)
{
  size_t got = 0;
  wf_status st = make_room(r, READ_CHUNK);
  if (st == WF_OK)
    st = read_in(r, r->buf + r->end, r->cap - r->end, &got, err, err_len);
  r->end += got;
  r->eof = st == WF_OK && got == 0;
  return st;
}

/* Decode until some output appears or the input ends. */
static wf_status fill_zstd(wf__lines *r, char *err, size_t err_len)
{
  wf_status st = make_room(r, ZSTD_DStreamOutSize());
  size_t before = r->end;
  while (st == WF_OK && r->end == before && !r->eof) {
    if (r->in_pos == r->in_len) {
      st = read_in(r, r->in, r->in_cap, &r->in_len, err, err_len);
      r->in_pos = 0, r->in_total += r->in_len;
      if (st == WF_OK && r->in_len == 0) {
        r->eof = true;
        if (r->frame_left != 0)
          st = wf__io_failf(err, err_len, WF_EFORMAT,
                            "'%s' is truncated: its last zstd frame ends early (after %llu "
                            "compressed bytes); write the file again",
                            r->path, (unsigned long long)r->in_total);
        break;
      }
    }
    ZSTD_inBuffer in = {r->in, r->in_len, r->in_pos};
    ZSTD_outBuffer out = {r->buf + r->end, r->cap - r->end, 0};
    size_t rc = ZSTD_decompressStream(r->z, &out, &in);
    if (ZSTD_isError(rc))
      return wf__io_failf(err, err_len, WF_EFORMAT,
                          "'%s' is not valid zstd data (%s, within its first %llu compressed "
                          "bytes); the file is damaged: write it again",
                          r->path, ZSTD_getErrorName(rc), (unsigned long long)r->in_total);
    r->in_pos = in.pos, r->end += out.pos, r->frame_left = rc;
  }
  return st;
}

static wf_status fill(wf__lines *r, char *err, size_t err_len)
{
  return r->z ? fill_zstd(r, err, err_len) : fill_plain(r, err, err_len);
}

/* What the first bytes say the file is: zstd, or plain text; gzip and bzip2 refused. */
static wf_status sniff(wf__lines *r, char *err, size_t err_len)
{
  unsigned char head[4] = {0};
  ssize_t n = pread(r->fd, head, sizeof head, 0);
  uint32_t magic = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 |
                   (uint32_t)head[3] << 24;
  if (n < 0)
    return wf__io_failf(err, err_len, WF_EIO, "cannot read '%s': %s", r->path, strerror(errno));
  if (n >= 2 && ((head[0] == 0x1f && head[1] == 0x8b) || (head[0] == 'B' && head[1] == 'Z')))
    return wf__io_failf(err, err_len, WF_EFORMAT,
                        "'%s' is %s-compressed; weft reads JSON Lines plain or zstd-compressed: "
                        "recompress it (e.g. `%s -dc FILE | zstd -o FILE.zst`)",
                        r->path, head[0] == 0x1f ? "gzip" : "bzip2",
                        head[0] == 0x1f ? "gzip" : "bzip2");
  if (n < 4 || magic != ZSTD_MAGIC)
    return WF_OK;
  r->z = ZSTD_createDCtx();
  r->in_cap = ZSTD_DStreamInSize();
  r->in = malloc(r->in_cap);
  return r->z && r->in ? WF_OK : WF_ENOMEM;
}

wf_status wf__lines_open(wf__lines **out, const char *path, char *err, size_t err_len)
{
  *out = NULL;
  struct stat sb;
  if (stat(path, &sb) != 0)
    return wf__io_failf(err, err_len, WF_EIO, "cannot open '%s': %s", path, strerror(errno));
  if (!S_ISREG(sb.st_mode)) /* a FIFO would block open() */
    return wf__io_failf(err, err_len, WF_ECONFIG, "'%s' is not a regular file", path);
  wf__lines *r = calloc(1, sizeof *r);
  if (!r)
    return WF_ENOMEM;
  wf_strlcpy(r->path, path, sizeof r->path);
  r->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  wf_status st =
      r->fd < 0 ? wf__io_failf(err, err_len, WF_EIO, "cannot open '%s': %s", path, strerror(errno))
                : sniff(r, err, err_len);
  if (st != WF_OK) {
    wf__lines_close(r);
    return st;
  }
  *out = r;
  return WF_OK;
}

void wf__lines_close(wf__lines *r)
{
  if (!r)
    return;
  if (r->fd >= 0)
    close(r->fd);
  ZSTD_freeDCtx(r->z);
  free(r->in);
  free(r->buf);
  free(r);
}

static bool blank(const char *s, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
      return false;
  return true;
}

/* The next line, blank or not, without its newline; *got false at the end. */
static wf_status next_raw(wf__lines *r, const char **line, size_t *len, bool *got, char *err,
                          size_t err_len)
{
  size_t scan = r->start;
  *got = false;
  for (;;) {
    char *nl = r->end > scan ? memchr(r->buf + scan, '\n', r->end - scan) : NULL;
    if (nl) {
      *line = r->buf + r->start, *len = (size_t)(nl - *line);
      r->start = (size_t)(nl - r->buf) + 1;
      break;
    }
    if (r->eof) {
      if (r->start == r->end)
        return WF_OK;
      *line = r->buf + r->start, *len = r->end - r->start; /* no newline at the end */
      r->start = r->end;
      break;
    }
    size_t have = r->end - r->start;
    wf_status st = fill(r, err, err_len);
    if (st != WF_OK)
      return st;
    scan = r->start + have; /* fill moved the unread bytes to the front */
  }
  r->lineno++;
  *got = true;
  if (r->lineno == 1 && *len >= 3 && !memcmp(*line, "\xef\xbb\xbf", 3)) /* a UTF-8 BOM */
    *line += 3, *len -= 3;
  return WF_OK;
}

wf_status wf__lines_next(wf__lines *r, const char **line, size_t *len, bool *got, char *err,
                         size_t err_len)
{
  wf_status st;
  do
    st = next_raw(r, line, len, got, err, err_len);
  while (st == WF_OK && *got && blank(*line, *len));
  return st;
}

int64_t wf__lines_lineno(const wf__lines *r) { return r->lineno; }
const char *wf__lines_path(const wf__lines *r) { return r->path; }

static const char *json_kind(const json_t *v)
{
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "a list";
  case JSON_INTEGER:
  case JSON_REAL: return "a number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  default: return "a string";
  }
}

wf_status wf__jsonl_text(const wf__lines *r, const char *line, size_t len, const char *key,
                         char **text, size_t *text_len, char *err, size_t err_len)
{
  json_error_t je;
  *text = NULL, *text_len = 0;
  json_t *o = json_loadb(line, len, JSON_ALLOW_NUL, &je);
  wf_status st = WF_EFORMAT;
  json_t *v = json_is_object(o) ? json_object_get(o, key) : NULL;
  if (!o)
    wf__io_failf(err, err_len, st,
                 "%s:%lld: not JSON (column %d: %s); each line must be one "
                 "JSON object such as {\"%s\": \"...\"}",
                 r->path, (long long)r->lineno, je.column, je.text, key);
  else if (!json_is_object(o))
    wf__io_failf(err, err_len, st, "%s:%lld: the line is %s, not a JSON object with a \"%s\" key",
                 r->path, (long long)r->lineno, json_kind(o), key);
  else if (!v)
    wf__io_failf(err, err_len, st,
                 "%s:%lld: no \"%s\" key (data.field names the key of each "
                 "line's text)",
                 r->path, (long long)r->lineno, key);
  else if (!json_is_string(v))
    wf__io_failf(err, err_len, st, "%s:%lld: \"%s\" is %s, not a string of text", r->path,
                 (long long)r->lineno, key, json_kind(v));
  else
    st = WF_OK;
  if (st == WF_OK) {
    *text_len = json_string_length(v);
    *text = malloc(*text_len + 1);
    if (*text)
      memcpy(*text, json_string_value(v), *text_len + 1);
    else
      st = WF_ENOMEM;
  }
  json_decref(o);
  return st;
}
