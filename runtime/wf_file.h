/*
 * wf_file.h - the one atomic file writer: checkpoints, llm.c and safetensors files,
 * traces, metrics rewrites and the coordinator's job file all go through it.
 *
 * A file is written to a temporary name in its own directory (".NAME.tmp.PID"), fsync()ed,
 * renamed over NAME, and then the directory is fsync()ed, so after a crash at any moment
 * NAME is either the old file or the whole new one, and a completed commit survives a
 * power loss. Readers never see half a file.
 *
 * Errors are logged here, once, where they arise, with the path and the reason
 * (strerror), and returned as WF_EIO (WF_ENOMEM for the checksum state). A failed write
 * or commit removes the temporary file; the caller only propagates the status.
 *
 * Optionally the writer hashes what it writes (XXH3-64, the checkpoint manifest's
 * checksum), so a file is hashed without being read back.
 */
#ifndef WF_FILE_H
#define WF_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wf_runtime.h"

/* Longest path the writer handles (config paths are bounded by the same limit). */
#define WF_FILE_PATH_MAX 4160

typedef struct wf_afile {
  int fd; /* -1 when closed */
  unsigned mode;
  char dir[WF_FILE_PATH_MAX], tmp[WF_FILE_PATH_MAX], path[WF_FILE_PATH_MAX];
  void *xx; /* XXH3 state when hashing, else NULL */
  uint64_t bytes;
  char *mem; /* WF_AFILE_MEMORY: the contents so far (cap bytes), until wf_afile_spill */
  size_t cap;
} wf_afile;

/* Flags of wf_afile_open. */
enum {
  WF_AFILE_HASH = 1,   /* hash the contents (wf_afile_commit's *hash) */
  WF_AFILE_MEMORY = 2, /* gather the contents in memory: no file until wf_afile_spill, so
                        * the writing can happen later, on another thread (a snapshot) */
};

/* Start writing `path` (its directory and the missing parents are created) with
 * permission bits `mode`
 * (e.g. 0644; 0600 for files holding secrets). */
wf_status wf_afile_open(wf_afile *f, const char *path, unsigned mode, int flags);
wf_status wf_afile_write(wf_afile *f, const void *buf, size_t n);
/* fsync, rename into place, fsync the directory. *bytes and *hash (may be NULL) get the
 * size and, with WF_AFILE_HASH, the XXH3-64 of the contents. The writer is closed
 * afterwards whatever the outcome. */
wf_status wf_afile_commit(wf_afile *f, uint64_t *bytes, uint64_t *hash);
/* Drop the temporary file (and the gathered contents); a no-op on a closed writer. */
void wf_afile_abort(wf_afile *f);

/* WF_AFILE_MEMORY: room for `bytes` in all, allocated at once (else it grows by doubling). */
wf_status wf_afile_reserve(wf_afile *f, size_t bytes);
/* WF_AFILE_MEMORY: the size and hash of what was gathered, as wf_afile_commit gives them. */
void wf_afile_sum(const wf_afile *f, uint64_t *bytes, uint64_t *hash);
/* WF_AFILE_MEMORY: create the temporary file and write the gathered contents into it,
 * freeing them; the writer is then an ordinary one, for wf_afile_commit. */
wf_status wf_afile_spill(wf_afile *f);

/* The whole file at once. */
wf_status wf_file_write_atomic(const char *path, const void *buf, size_t n, unsigned mode);

/* The status of a path the user named that cannot be created or written, from errno:
 * WF_ECONFIG (exit 2) when the path is the mistake (a parent that is a file, a directory
 * where a file goes, no permission, a read-only file system, a name too long), WF_EIO
 * (exit 1: a later try may do) when the machine is (no space, an I/O error, no fds). */
wf_status wf_file_errno_status(int err);

/* Create dir and its missing parents (0755), as mkdir -p; an error names `what` (e.g.
 * "train.checkpoint_dir /x/ck"; NULL: dir) and the part that could not be made. */
wf_status wf_file_mkdirs(const char *dir, const char *what);
/* Create the missing directories that will hold the file `path`: every output path the
 * user names (--save, --export, train.metrics, ...) may be in a new folder. An error
 * names `what` (the key, e.g. "train.metrics"; NULL: nothing) and path. */
wf_status wf_file_make_parent(const char *path, const char *what);

/* fsync a directory (after creating, renaming or removing entries in it). */
wf_status wf_file_sync_dir(const char *dir);

#endif /* WF_FILE_H */
