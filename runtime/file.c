/*
 * file.c - the atomic file writer of wf_file.h.
 *
 * Invariants: while a writer is open its temporary file exists and NAME is untouched;
 * every exit path of commit closes the descriptor and, unless the rename happened,
 * unlinks the temporary file. Writes loop over short writes and EINTR, in pieces of
 * at most CHUNK bytes so a slow file system reports progress errors early.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "wf_check.h"
#include "wf_file.h"

#define CHUNK (4u << 20)

wf_status wf_file_sync_dir(const char *dir)
{
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    WF_ERROR("%s: cannot fsync the directory: %s", dir, strerror(errno));
    if (fd >= 0)
      close(fd);
    return WF_EIO;
  }
  close(fd);
  return WF_OK;
}

wf_status wf_file_errno_status(int err)
{
  switch (err) {
  case ENOTDIR:
  case EISDIR:
  case EACCES:
  case EPERM:
  case EROFS:
  case ENAMETOOLONG:
  case ELOOP:
  case EEXIST: return WF_ECONFIG;
  default: return WF_EIO;
  }
}

wf_status wf_file_mkdirs(const char *dir, const char *what)
{
  char path[WF_FILE_PATH_MAX];
  struct stat sb;
  if (strlen(dir) >= sizeof path) {
    WF_ERROR("'%.200s': the path is longer than %d bytes", dir, WF_FILE_PATH_MAX - 1);
    return WF_EINVAL;
  }
  wf_strlcpy(path, dir, sizeof path);
  for (char *p = path + 1; *p; p++) { /* each parent, then the directory itself */
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      break; /* the last mkdir says why */
    *p = '/';
  }
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    int e = errno;
    if (what)
      WF_ERROR("%s: cannot create %s: %s; point it at a writable directory", what, path,
               strerror(e));
    else
      WF_ERROR("cannot create the directory %s: %s; name a writable place", path, strerror(e));
    return wf_file_errno_status(e);
  }
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    WF_ERROR("%s: not a directory", what ? what : dir);
    return WF_ECONFIG;
  }
  return WF_OK;
}

wf_status wf_file_make_parent(const char *path, const char *what)
{
  char copy[WF_FILE_PATH_MAX], named[WF_FILE_PATH_MAX + 64];
  struct stat sb;
  wf_strlcpy(copy, path, sizeof copy);
  const char *dir = dirname(copy);
  /* Only what is missing: a parent that exists but is no directory is the opener's to
   * report, with its own reason. */
  if (stat(dir, &sb) == 0 || errno != ENOENT)
    return WF_OK;
  snprintf(named, sizeof named, "%s%s%s", what ? what : "", what ? "=" : "", path);
  return wf_file_mkdirs(dir, named);
}

/* dir and tmp of `path`: the temporary file lives beside the target, so the rename
 * never crosses a file system. */
static wf_status name_parts(wf_afile *f, const char *path)
{
  char copy[WF_FILE_PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof copy || n + 32 >= sizeof f->tmp) {
    WF_ERROR("'%.200s': the path is empty or longer than %d bytes", path, WF_FILE_PATH_MAX - 32);
    return WF_EINVAL;
  }
  memcpy(f->path, path, n + 1);
  memcpy(copy, path, n + 1);
  wf_strlcpy(f->dir, dirname(copy), sizeof f->dir);
  memcpy(copy, path, n + 1);
  /* the check above leaves room for "/." + ".tmp." + a pid in tmp */
  if (snprintf(f->tmp, sizeof f->tmp, "%s/.%s.tmp.%ld", f->dir, basename(copy), (long)getpid()) >=
      (int)sizeof f->tmp)
    return WF_EINVAL;
  return WF_OK;
}

static wf_status create_tmp(wf_afile *f);

wf_status wf_afile_open(wf_afile *f, const char *path, unsigned mode, int flags)
{
  wf_status st = WF_OK;
  memset(f, 0, sizeof *f);
  f->fd = -1;
  f->mode = mode;
  WF_TRY(name_parts(f, path));
  WF_TRY(wf_file_make_parent(path, NULL));
  if (flags & WF_AFILE_HASH) {
    f->xx = XXH3_createState();
    WF_CHECK(f->xx && XXH3_64bits_reset(f->xx) == XXH_OK, WF_ENOMEM,
             "%s: out of memory for the checksum state", f->path);
  }
  if (flags & WF_AFILE_MEMORY) {
    f->cap = 1u << 16;
    WF_CHECK(f->mem = malloc(f->cap), WF_ENOMEM, "%s: out of memory for its snapshot", f->path);
  } else
    WF_TRY(create_tmp(f));
exit:
  return st;
fail:
  wf_afile_abort(f);
  goto exit;
}

static wf_status create_tmp(wf_afile *f)
{
  wf_status st = WF_OK;
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, f->mode);
  WF_CHECK(f->fd >= 0, WF_EIO, "%s: cannot create its temporary file %s: %s", f->path, f->tmp,
           strerror(errno));
  /* open() applies the umask; a file holding a secret must have exactly `mode`. */
  WF_CHECK(fchmod(f->fd, f->mode) == 0, WF_EIO, "%s: cannot set mode %o: %s", f->tmp, f->mode,
           strerror(errno));
fail:
  return st;
}

wf_status wf_afile_reserve(wf_afile *f, size_t bytes)
{
  if (!f->mem || bytes <= f->cap)
    return f->mem ? WF_OK : WF_EINVAL;
  char *m = realloc(f->mem, bytes);
  if (!m) {
    WF_ERROR("%s: out of memory for its snapshot (%zu bytes)", f->path, bytes);
    wf_afile_abort(f);
    return WF_ENOMEM;
  }
  f->mem = m, f->cap = bytes;
  return WF_OK;
}

static wf_status gather(wf_afile *f, const void *buf, size_t n)
{
  if (f->bytes + n > f->cap) {
    size_t cap = f->cap;
    while (cap < f->bytes + n)
      cap *= 2;
    wf_status st = wf_afile_reserve(f, cap);
    if (st != WF_OK)
      return st;
  }
  memcpy(f->mem + f->bytes, buf, n);
  f->bytes += n;
  return WF_OK;
}

void wf_afile_sum(const wf_afile *f, uint64_t *bytes, uint64_t *hash)
{
  if (bytes)
    *bytes = f->bytes;
  if (hash)
    *hash = f->xx ? XXH3_64bits_digest(f->xx) : 0;
}

wf_status wf_afile_write(wf_afile *f, const void *buf, size_t n)
{
  const char *p = buf;
  if (f->fd < 0 && !f->mem)
    return WF_EINVAL;
  if (f->xx)
    XXH3_64bits_update(f->xx, buf, n);
  if (f->mem)
    return gather(f, buf, n);
  while (n > 0) {
    ssize_t w = write(f->fd, p, WF_MIN(n, (size_t)CHUNK));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      WF_ERROR("%s: write failed after %llu bytes: %s", f->path, (unsigned long long)f->bytes,
               w < 0 ? strerror(errno) : "no progress");
      wf_afile_abort(f);
      return WF_EIO;
    }
    p += w, n -= (size_t)w, f->bytes += (uint64_t)w;
  }
  return WF_OK;
}

wf_status wf_afile_spill(wf_afile *f)
{
  wf_status st = WF_OK;
  char *mem = f->mem;
  uint64_t n = f->bytes;
  WF_CHECK(mem && f->fd < 0, WF_EINVAL, "%s: nothing gathered to write", f->path);
  f->mem = NULL, f->bytes = 0;
  void *xx = f->xx; /* already holds the contents' hash */
  f->xx = NULL;
  if ((st = create_tmp(f)) == WF_OK)
    st = wf_afile_write(f, mem, n);
  f->xx = xx;
  free(mem);
  if (st != WF_OK)
    wf_afile_abort(f);
fail:
  return st;
}

void wf_afile_abort(wf_afile *f)
{
  free(f->mem);
  f->mem = NULL;
  if (f->fd >= 0) {
    close(f->fd);
    unlink(f->tmp);
  }
  f->fd = -1;
  if (f->xx)
    XXH3_freeState(f->xx);
  f->xx = NULL;
}

wf_status wf_afile_commit(wf_afile *f, uint64_t *bytes, uint64_t *hash)
{
  wf_status st = WF_OK;
  if (f->fd < 0) { /* closed, or gathered in memory and never spilled: closed now */
    wf_afile_abort(f);
    return WF_EINVAL;
  }
  if (bytes)
    *bytes = f->bytes;
  if (hash)
    *hash = f->xx ? XXH3_64bits_digest(f->xx) : 0;
  WF_CHECK(fsync(f->fd) == 0, WF_EIO, "%s: fsync failed: %s", f->path, strerror(errno));
  int fd = f->fd;
  f->fd = -1; /* closed here whatever happens; the temporary file is ours to unlink */
  if (close(fd) != 0) {
    WF_ERROR("%s: close failed: %s", f->path, strerror(errno));
    st = WF_EIO;
  } else if (rename(f->tmp, f->path) != 0) {
    WF_ERROR("%s: cannot rename into place: %s", f->path, strerror(errno));
    st = WF_EIO;
  }
  if (st != WF_OK) {
    unlink(f->tmp);
    goto exit;
  }
  st = wf_file_sync_dir(f->dir);
exit:
  wf_afile_abort(f);
  return st;
fail:
  goto exit;
}

wf_status wf_file_write_atomic(const char *path, const void *buf, size_t n, unsigned mode)
{
  wf_afile f;
  wf_status st = wf_afile_open(&f, path, mode, 0);
  if (st == WF_OK)
    st = wf_afile_write(&f, buf, n);
  if (st == WF_OK)
    st = wf_afile_commit(&f, NULL, NULL);
  return st;
}
