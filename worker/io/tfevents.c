/*
 * tfevents.c - TensorBoard event files (train.tensorboard=DIR), written by one rank.
 *
 * A file is a sequence of TFRecords, each holding one tensorboard.Event (tfevents.proto,
 * encoded by protobuf-c):
 *
 *   uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
 *
 * little-endian, masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (TensorFlow's
 * lib/hash/crc32c.h: a CRC stored beside the data it covers is masked, so a CRC over
 * data that holds CRCs stays well spread). CRC-32C is ISA-L's crc32_iscsi, inverted in
 * and out as the Castagnoli CRC is defined.
 *
 * Files are named events.out.tfevents.<seconds>.<host>.<pid>.weft, as TensorFlow names
 * them (TensorBoard reads every file whose name holds "tfevents", in name order); each
 * starts with a file_version record ("brain.Event:2"). A file past the roll size is
 * closed and the next one started, its seconds one past the last file's at least, so
 * name order is write order. Each step is one Event with every scalar of that step, and
 * it reaches the kernel at once (fflush): a running job can be watched, and a writer
 * killed mid-record leaves only that last record partial, which readers skip. A tag's
 * first value in a file carries its description (SummaryMetadata), as TensorFlow's
 * writers send a tag's metadata once.
 *
 * Invariant: a failed write never stops training: it is said once and the writer goes
 * quiet (an event file is a view of the run, not its result).
 */
#include <errno.h>
#include <isa-l/crc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io_int.h"
#include "tfevents.pb-c.h"
#include "wf_check.h"
#include "wf_file.h"

#define MAX_TAGS 256 /* tags described per file; more are written without a description */

struct wf_tfevents {
  char dir[WF_PATH_MAX];
  char path[WF_PATH_MAX + 256];
  FILE *f;
  int64_t bytes, roll_bytes;
  long last_sec;        /* the current file's name's seconds */
  int files;            /* opened so far */
  bool broken;          /* a write failed: said once, nothing more is written */
  char *tags[MAX_TAGS]; /* described in the current file */
  int n_tags;
};

uint32_t wf_tfevents_crc32c(const void *data, size_t n)
{
  return ~crc32_iscsi((unsigned char *)data, (int)n, 0xFFFFFFFFu);
}

static uint32_t masked_crc(const void *data, size_t n)
{
  uint32_t c = wf_tfevents_crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
  for (int i = 0; i < bytes; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

/* One TFRecord of `data`; counts the bytes written. */
static wf_status write_record(wf_tfevents *w, const void *data, size_t n)
{
  unsigned char head[12], tail[4];
  put_le(head, n, 8);
  put_le(head + 8, masked_crc(head, 8), 4);
  put_le(tail, masked_crc(data, n), 4);
  if (fwrite(head, 1, sizeof head, w->f) != sizeof head || fwrite(data, 1, n, w->f) != n ||
      fwrite(tail, 1, sizeof tail, w->f) != sizeof tail)
    return WF_EIO;
  w->bytes += (int64_t)(sizeof head + n + sizeof tail);
  return WF_OK;
}

static wf_status write_event(wf_tfevents *w, const Tensorboard__Event *ev)
{
  size_t n = tensorboard__event__get_packed_size(ev);
  uint8_t stack[4096], *buf = n <= sizeof stack ? stack : malloc(n);
  if (!buf)
    return WF_ENOMEM;
  tensorboard__event__pack(ev, buf);
  wf_status st = write_record(w, buf, n);
  if (buf != stack)
    free(buf);
  return st;
}

static void forget_tags(wf_tfevents *w)
{
  for (int i = 0; i < w->n_tags; i++)
    free(w->tags[i]);
  w->n_tags = 0;
}

/* Said once; the writer writes nothing more. */
static wf_status broken(wf_tfevents *w, const char *what, int err)
{
  if (!w->broken)
    WF_WARN("train.tensorboard: %s %s: %s; no more TensorBoard events are written this run", what,
            w->path, strerror(err));
  w->broken = true;
  return WF_EIO;
}

/* The next file, and its first record (the version). */
static wf_status next_file(wf_tfevents *w)
{
  char host[128] = "localhost";
  gethostname(host, sizeof host - 1);
  long sec = (long)time(NULL);
  if (w->files > 0 && sec <= w->last_sec)
    sec = w->last_sec + 1; /* name order is write order */
  snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010ld.%s.%ld.weft", w->dir, sec, host,
           (long)getpid());
  w->f = fopen(w->path, "wbx");
  if (!w->f)
    return errno;
  w->last_sec = sec;
  w->files++;
  w->bytes = 0;
  forget_tags(w);
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  Tensorboard__SourceMetadata src = TENSORBOARD__SOURCE_METADATA__INIT;
  src.writer = "weft";
  ev.wall_time = wf_wall_time();
  ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
  ev.file_version = "brain.Event:2";
  ev.source_metadata = &src;
  if (write_event(w, &ev) != WF_OK || fflush(w->f) != 0)
    return errno ? errno : EIO;
  return 0;
}

/* The directory, made if missing, must take a new file: said now, with the fix, before
 * the first step (a user's mistake: WF_ECONFIG). */
static wf_status open_dir(wf_tfevents *w, const char *dir)
{
  struct stat sb;
  const char *why = NULL;
  char probe[WF_PATH_MAX + 16];
  snprintf(probe, sizeof probe, "%s/x", dir);
  if (strlen(dir) + 128 >= sizeof w->dir)
    why = "the path is too long";
  else if (wf_file_make_parent(probe, "train.tensorboard") != WF_OK)
    return WF_ECONFIG; /* said why */
  else if (stat(dir, &sb) != 0)
    why = strerror(errno);
  else if (!S_ISDIR(sb.st_mode))
    why = "not a directory";
  else if (access(dir, W_OK | X_OK) != 0)
    why = strerror(errno);
  if (why) {
    WF_ERROR("train.tensorboard=%s: cannot write event files there: %s; point it at a writable "
             "directory",
             dir, why);
    return WF_ECONFIG;
  }
  wf_strlcpy(w->dir, dir, sizeof w->dir);
  return WF_OK;
}

wf_status wf_tfevents_open(wf_tfevents **out, const char *dir, int64_t roll_bytes)
{
  wf_status st = WF_OK;
  wf_tfevents *w = NULL;
  *out = NULL;
  WF_CHECK_ALLOC(w = calloc(1, sizeof *w));
  WF_TRY(open_dir(w, dir));
  w->roll_bytes = roll_bytes;
  int err = next_file(w);
  WF_CHECK(err == 0, WF_ECONFIG,
           "train.tensorboard=%s: cannot write the event file %s: %s; point it at a writable "
           "directory",
           dir, w->path, strerror(err));
  *out = w;
  return WF_OK;
fail:
  wf_tfevents_close(w);
  return st;
}

void wf_tfevents_close(wf_tfevents *w)
{
  if (!w)
    return;
  if (w->f)
    fclose(w->f);
  forget_tags(w);
  free(w);
}

const char *wf_tfevents_path(const wf_tfevents *w) { return w->path; }

/* Close the file past the roll size and start the next. */
static wf_status maybe_roll(wf_tfevents *w)
{
  if (w->roll_bytes <= 0 || w->bytes < w->roll_bytes)
    return WF_OK;
  int err = fclose(w->f) == 0 ? 0 : errno;
  w->f = NULL;
  if (err == 0)
    err = next_file(w);
  return err == 0 ? WF_OK : broken(w, "cannot roll over to a new file after", err);
}

static wf_status finish(wf_tfevents *w, wf_status st)
{
  if (st == WF_OK && fflush(w->f) != 0)
    st = WF_EIO;
  if (st != WF_OK)
    return broken(w, "cannot write", errno ? errno : EIO);
  return maybe_roll(w);
}

wf_status wf_tfevents_restart(wf_tfevents *w, int64_t step)
{
  if (!w || w->broken)
    return WF_OK;
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  Tensorboard__SessionLog sl = TENSORBOARD__SESSION_LOG__INIT;
  sl.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
  ev.wall_time = wf_wall_time();
  ev.step = step;
  ev.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
  ev.session_log = &sl;
  return finish(w, write_event(w, &ev));
}

/* Whether `tag` still needs its description in this file (and remember it has one). */
static bool first_in_file(wf_tfevents *w, const char *tag)
{
  for (int i = 0; i < w->n_tags; i++)
    if (strcmp(w->tags[i], tag) == 0)
      return false;
  if (w->n_tags < MAX_TAGS && (w->tags[w->n_tags] = strdup(tag)) != NULL)
    w->n_tags++;
  return true;
}

wf_status wf_tfevents_write(wf_tfevents *w, int64_t step, double wall, const wf_tfevents_scalar *v,
                            int n)
{
  if (!w || w->broken || n <= 0)
    return WF_OK;
  wf_status st = WF_OK;
  Tensorboard__Summary__Value *vals = NULL, **ptrs = NULL;
  Tensorboard__SummaryMetadata *meta = NULL;
  WF_CHECK_ALLOC(vals = calloc((size_t)n, sizeof *vals));
  WF_CHECK_ALLOC(meta = calloc((size_t)n, sizeof *meta));
  WF_CHECK_ALLOC(ptrs = calloc((size_t)n, sizeof *ptrs));
  for (int i = 0; i < n; i++) {
    tensorboard__summary__value__init(&vals[i]);
    vals[i].tag = (char *)v[i].tag;
    vals[i].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    vals[i].simple_value = (float)v[i].value;
    if (v[i].about && first_in_file(w, v[i].tag)) {
      tensorboard__summary_metadata__init(&meta[i]);
      meta[i].summary_description = (char *)v[i].about;
      vals[i].metadata = &meta[i];
    }
    ptrs[i] = &vals[i];
  }
  Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
  sum.n_value = (size_t)n;
  sum.value = ptrs;
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  ev.wall_time = wall;
  ev.step = step;
  ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
  ev.summary = &sum;
  st = finish(w, write_event(w, &ev));
fail:
  free(vals);
  free(meta);
  free(ptrs);
  return st;
}
