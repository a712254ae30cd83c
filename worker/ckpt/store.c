/*
 * store.c - the checkpoint directory: names, publishing a step and `latest`, pruning,
 * finding the checkpoint to resume, and the checks before training (the directory
 * exists, every rank can write there, one checkpoint fits).
 *
 * Invariant: `latest` only ever names a directory whose files were all fsync()ed,
 * renamed into place and listed with their checksums in a manifest that was itself
 * fsync()ed; removal goes through a rename first, so a crash never leaves a
 * half-deleted directory under a step name.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ckpt_int.h"

/* ---- small helpers ------------------------------------------------------------------------ */

void wf__pathf(char *buf, size_t len, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, len, fmt, ap);
  va_end(ap);
}

void wf__step_name(char *buf, size_t len, int step) { wf__pathf(buf, len, "step-%06d", step); }
void wf__ckpt_what(char *buf, size_t len, int step)
{
  wf__pathf(buf, len, "the checkpoint of step %d", step);
}

/* Parse "step-NNNNNN" exactly (as wf__step_name writes it); -1 otherwise. */
int wf__parse_step_name(const char *name)
{
  int step, used = 0;
  char back[32];
  if (sscanf(name, "step-%d%n", &step, &used) != 1 || name[used] || step < 0)
    return -1;
  wf__step_name(back, sizeof back, step);
  return strcmp(back, name) ? -1 : step;
}

wf_comm *wf__ckpt_world(const wf_ckpt_target *t) { return t->world ? t->world : t->dp_comm; }
int wf__rank_of(wf_comm *c) { return c ? wf_comm_rank(c) : 0; }
int wf__size_of(wf_comm *c) { return c ? wf_comm_size(c) : 1; }

wf_status wf__ckpt_agree(const wf_ckpt_target *t, wf_status mine, const char *what)
{
  wf_comm *w = wf__ckpt_world(t);
  int bad = -1;
  wf_status st = wf_comm_agree(w, mine, &bad);
  if (st != WF_OK && mine == WF_OK && wf__rank_of(w) == 0 && bad > 0)
    WF_ERROR("checkpoint: %s failed on rank %d (see its message); stopping", what, bad);
  return st;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
  (void)sb, (void)flag, (void)ftw;
  return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

/* rm -rf; a missing path is fine. */
int wf__remove_tree(const char *path)
{
  struct stat sb;
  if (lstat(path, &sb) != 0)
    return errno == ENOENT ? 0 : -1;
  return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

bool wf__is_file(const char *path)
{
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

bool wf__has_manifest(const char *dir)
{
  char path[WF__PATH_LEN];
  wf__pathf(path, sizeof path, "%s/" WF__MANIFEST, dir);
  return wf__is_file(path);
}

/* ---- publishing ---------------------------------------------------------------------------- */

/* Move the finished staging directory to its final name. An older directory of the same
 * name (a checkpoint of this step from an earlier run) is swapped out atomically, so
 * `latest` never names a missing directory, then removed. Where the filesystem cannot
 * swap (no renameat2: some network filesystems) the old one is first moved aside, which
 * leaves a short window without it. */
static wf_status move_into_place(const char *root, const char *stage, const char *final)
{
  struct stat sb;
  char aside[WF__PATH_LEN];
  bool exists = stat(final, &sb) == 0;
  if (!exists && rename(stage, final) == 0)
    return wf_file_sync_dir(root);
  if (exists && renameat2(AT_FDCWD, stage, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
    wf_status st = wf_file_sync_dir(root);
    wf__remove_tree(stage); /* now the old one */
    return st;
  }
  if (exists && (errno == EINVAL || errno == ENOSYS)) {
    wf__pathf(aside, sizeof aside, "%s.old", stage);
    if (rename(final, aside) == 0 && rename(stage, final) == 0) {
      wf__remove_tree(aside);
      return wf_file_sync_dir(root);
    }
  }
  WF_ERROR("%s: cannot rename %s into place: %s", final, stage, strerror(errno));
  return WF_EIO;
}

wf_status wf__publish(const char *root, const char *stage, const char *final)
{
  wf_status st = move_into_place(root, stage, final);
  if (st != WF_OK)
    return st;
  const char *name = strrchr(final, '/');
  char path[WF__PATH_LEN], line[48];
  wf__pathf(line, sizeof line, "%s\n", name ? name + 1 : final);
  wf__pathf(path, sizeof path, "%s/" WF__LATEST, root);
  return wf_file_write_atomic(path, line, strlen(line), 0644);
}

static int cmp_desc(const void *a, const void *b)
{
  int x = *(const int *)a, y = *(const int *)b;
  return (x < y) - (x > y);
}

/* A stop's writers' staging directory (detached.c). */
static bool stop_stage(const char *name)
{
  return !strncmp(name, ".tmp-step-", 10) && strstr(name, WF__STOP_STAGE);
}

static bool stale_temp(const char *name)
{
  /* a stop's writers' stage may still be written: the next job removes it */
  return (!strncmp(name, ".tmp-step-", 10) && !stop_stage(name)) || !strncmp(name, ".trash-", 7) ||
         (!strncmp(name, "." WF__LATEST ".tmp.", sizeof WF__LATEST + 5));
}

static void remove_entry(const char *root, const char *name, bool via_trash)
{
  char path[WF__PATH_LEN], trash[WF__PATH_LEN];
  wf__pathf(path, sizeof path, "%s/%s", root, name);
  wf__pathf(trash, sizeof trash, "%s/.trash-%s", root, name);
  if (via_trash && rename(path, trash) == 0)
    wf_strlcpy(path, trash, sizeof path);
  if (wf__remove_tree(path) != 0)
    WF_WARN("checkpoint: cannot remove %s: %s", path, strerror(errno));
}

void wf__remove_stop_stages(const char *root)
{
  DIR *dir = opendir(root);
  for (struct dirent *e; dir && (e = readdir(dir)) != NULL;)
    if (stop_stage(e->d_name))
      remove_entry(root, e->d_name, false);
  if (dir)
    closedir(dir);
}

/* The step directories under root other than `skip`, newest first; *n of them. clean
 * (pruning): remove the leftovers of interrupted writes on the way. */
static int *list_steps(const char *root, int skip, bool clean, int *n)
{
  DIR *dir = opendir(root);
  int *steps = NULL, cap = 0;
  *n = 0;
  if (!dir) {
    if (clean)
      WF_WARN("checkpoint: cannot list %s to prune it: %s", root, strerror(errno));
    return NULL;
  }
  for (struct dirent *e; (e = readdir(dir)) != NULL;) {
    int s = wf__parse_step_name(e->d_name);
    if (clean && stale_temp(e->d_name)) /* leftovers of interrupted writes */
      remove_entry(root, e->d_name, false);
    if (s < 0 || s == skip)
      continue;
    if (*n == cap) {
      int *p = realloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *steps);
      if (!p)
        break;
      steps = p;
    }
    steps[(*n)++] = s;
  }
  closedir(dir);
  if (*n > 1)
    qsort(steps, (size_t)*n, sizeof *steps, cmp_desc);
  return steps;
}

/* Keep the newest `keep` step directories (0 = all) and the one `latest` names.
 * Failures are warnings: training goes on. */
void wf__prune(const char *root, int keep, int latest)
{
  int n = 0, *steps = list_steps(root, latest, true, &n);
  for (int i = keep > 0 ? keep - 1 : n; i < n; i++) { /* latest counts as one kept */
    char name[32];
    wf__step_name(name, sizeof name, steps[i]);
    remove_entry(root, name, true);
  }
  free(steps);
  if (wf_file_sync_dir(root) != WF_OK)
    WF_WARN("checkpoint: pruning %s: the directory could not be synced (see above)", root);
}

/* ---- finding a checkpoint -------------------------------------------------------------------- */

/* The newest step directory under root that has a manifest; -1 when none. */
static int newest_complete(const char *root)
{
  int n = 0, *steps = list_steps(root, -1, false, &n), best = -1;
  for (int i = 0; i < n && best < 0; i++) { /* newest first */
    char path[WF__PATH_LEN];
    wf__pathf(path, sizeof path, "%s/step-%06d", root, steps[i]);
    if (wf__has_manifest(path))
      best = steps[i];
  }
  free(steps);
  return best;
}

/* Modification time of path in ns; -1 when it cannot be read. */
static long long mtime_ns(const char *path)
{
  struct stat sb;
  if (stat(path, &sb) != 0)
    return -1;
  return (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
}

/* A complete checkpoint whose files all match its manifest (every byte read and hashed:
 * this runs only for a checkpoint newer than `latest`, which is rare). Errors are logged
 * by what fails. */
static bool verified(const char *dir)
{
  wf__manifest m = {0};
  wf_status st = wf__manifest_read(dir, &m, NULL);
  if (st == WF_OK)
    st = wf__check_model_cover(&m, dir);
  if (st == WF_OK)
    st = wf__check_optim_cover(&m, dir);
  for (int i = 0; st == WF_OK && i < m.n_files; i++)
    st = wf__verify_file(dir, &m.files[i]);
  free(m.files);
  return st == WF_OK;
}

/* `latest` lags when a newer step directory was published after `latest` was last
 * written (the job died between the two): its manifest is newer than `latest` itself. A
 * newer step whose manifest is older than `latest` was deliberately left behind (a run
 * resumed from an earlier step since), so it is not taken. The newest such checkpoint
 * that verifies goes into dir; false when there is none. */
static bool newer_than_latest(const char *root, int named, long long latest_ns, char *dir,
                              size_t len)
{
  int n = 0, *steps = list_steps(root, named, false, &n);
  bool found = false;
  for (int i = 0; i < n && steps[i] > named && !found; i++) {
    char cand[WF__PATH_LEN], manifest[WF__PATH_LEN];
    wf__pathf(cand, sizeof cand, "%s/step-%06d", root, steps[i]);
    wf__pathf(manifest, sizeof manifest, "%s/" WF__MANIFEST, cand);
    if (mtime_ns(manifest) <= latest_ns)
      continue;
    if (!verified(cand)) {
      WF_WARN("checkpoint: %s is newer than `latest` but does not verify (see above); not "
              "using it",
              cand);
      continue;
    }
    wf_strlcpy(dir, cand, len);
    found = true;
  }
  free(steps);
  return found;
}

/* The checkpoint `latest` names under root, or a newer complete and verified one when
 * `latest` lags (said in one line); when a crash came between publishing the first
 * directory and writing `latest`, the newest complete one. *none: there is none. */
static wf_status find_latest(const char *root, char *dir, size_t len, bool *none)
{
  wf_status st = WF_OK;
  char path[WF__PATH_LEN], name[128] = "";
  *none = false;
  wf__pathf(path, sizeof path, "%s/" WF__LATEST, root);
  FILE *f = fopen(path, "r");
  WF_CHECK(f || errno == ENOENT, WF_EIO, "%s: cannot read: %s", path, strerror(errno));
  if (f) {
    if (!fgets(name, sizeof name, f))
      name[0] = '\0';
    fclose(f);
    name[strcspn(name, "\r\n")] = '\0';
    wf__pathf(dir, len, "%s/%s", root, name);
    WF_CHECK(wf__parse_step_name(name) >= 0 && wf__has_manifest(dir), WF_EFORMAT,
             "%s names '%s', which is not a complete checkpoint (no %s); set train.resume to one "
             "of the step directories in %s",
             path, name, WF__MANIFEST, root);
    if (newer_than_latest(root, wf__parse_step_name(name), mtime_ns(path), dir, len))
      WF_WARN("checkpoint: %s names %s, but %s is newer, complete and verified (the job stopped "
              "before updating `latest`): resuming from it",
              path, name, dir);
    return WF_OK;
  }
  int best = newest_complete(root);
  *none = best < 0;
  if (best < 0)
    return WF_OK;
  wf__pathf(dir, len, "%s/step-%06d", root, best);
  WF_WARN("checkpoint: %s has no `latest` pointer; using the newest complete checkpoint %s", root,
          dir);
fail:
  return st;
}

wf_status wf__resolve(const char *path, char *dir, size_t len)
{
  wf_status st = WF_OK;
  char latest[WF__PATH_LEN];
  bool none = false;
  if (wf__has_manifest(path)) {
    wf_strlcpy(dir, path, len);
    return WF_OK;
  }
  wf__pathf(latest, sizeof latest, "%s/" WF__LATEST, path);
  WF_TRY(find_latest(path, dir, len, &none));
  WF_CHECK(!none, WF_EFORMAT,
           "%s: not a weft checkpoint (no %s in it) nor a checkpoint directory holding one (no "
           "%s, no step-NNNNNN with a %s)",
           path, WF__MANIFEST, WF__LATEST, WF__MANIFEST);
fail:
  return st;
}

bool wf__resume_never(const wf_config *cfg) { return !strcmp(cfg->train.resume, "never"); }

bool wf__resume_implicit(const wf_config *cfg)
{
  return !cfg->train.resume[0] || !strcmp(cfg->train.resume, "auto");
}

wf_status wf__locate(const wf_config *cfg, char *dir, size_t len, bool *none)
{
  wf_status st = WF_OK;
  const char *r = cfg->train.resume, *root = cfg->train.checkpoint_dir;
  char path[WF__PATH_LEN];
  *none = false;
  if (!wf__resume_implicit(cfg) && !wf__resume_never(cfg)) {
    wf__pathf(path, sizeof path, "%s/" WF__LATEST, r);
    if (wf__has_manifest(r)) {
      wf_strlcpy(dir, r, len);
      return WF_OK;
    }
    WF_CHECK(wf__is_file(path), WF_ECONFIG,
             "train.resume=%s: not a checkpoint (no %s in it) nor a checkpoint directory (no %s "
             "in it)",
             r, WF__MANIFEST, WF__LATEST);
    return find_latest(r, dir, len, none);
  }
  WF_CHECK(root[0], WF_ECONFIG,
           "no checkpoint to use: set train.resume to a checkpoint directory, or "
           "train.checkpoint_dir to the directory holding `latest`");
  return find_latest(root, dir, len, none);
fail:
  return st;
}

wf_status wf_ckpt_locate(const wf_config *cfg, char *dir, size_t dir_len)
{
  wf_status st = WF_OK;
  bool none = false;
  WF_TRY(wf__locate(cfg, dir, dir_len, &none));
  WF_CHECK(!none, WF_ECONFIG, "%s: no checkpoint there yet",
           cfg->train.resume[0] && strcmp(cfg->train.resume, "auto") ? cfg->train.resume
                                                                     : cfg->train.checkpoint_dir);
fail:
  return st;
}

/* ---- before training ------------------------------------------------------------------------ */

/* train.resume=never: the run train.checkpoint_dir holds is over; its step directories
 * and `latest` go (through the trash, as pruning does), so the new run's steps are the
 * only ones there. */
static wf_status start_over(const char *root)
{
  int n = 0, *steps = list_steps(root, -1, true, &n);
  char latest[WF__PATH_LEN];
  wf__pathf(latest, sizeof latest, "%s/" WF__LATEST, root);
  if (n == 0 && !wf__is_file(latest)) {
    free(steps);
    return WF_OK;
  }
  if (wf__is_file(latest) && unlink(latest) != 0)
    WF_WARN("checkpoint: cannot remove %s: %s", latest, strerror(errno));
  for (int i = 0; i < n; i++) {
    char name[32];
    wf__step_name(name, sizeof name, steps[i]);
    remove_entry(root, name, true);
  }
  WF_INFO("checkpoint: train.resume=never: removed the previous run's %d checkpoint%s from %s "
          "(newest step %d); this run starts at step 0",
          n, n == 1 ? "" : "s", root, n ? steps[0] : 0);
  free(steps);
  return wf_file_sync_dir(root);
}

static wf_status probe(const char *dir, int rank)
{
  char path[WF__PATH_LEN], block[4096] = {0};
  wf__pathf(path, sizeof path, "%s/.probe-%d-%ld", dir, rank, (long)getpid());
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write(fd, block, sizeof block) == (ssize_t)sizeof block && fsync(fd) == 0;
  int e = errno;
  if (fd >= 0) {
    ok = close(fd) == 0 && ok;
    unlink(path);
  }
  if (ok)
    return WF_OK;
  WF_ERROR("train.checkpoint_dir %s is not writable from rank %d on %s: %s", dir, rank,
           wf_rt_host(), strerror(e));
  return wf_file_errno_status(e);
}

/* One checkpoint must fit: model (header + params) and optimizer (m, v, headers) of the
 * whole model, plus the last stage's copy of a tied embedding with pp > 1. */
static wf_status check_space(const wf_ckpt_target *t, const char *dir)
{
  struct statvfs vs;
  const wf_model_dims *d = wf_model_get_dims(t->model);
  const wf_config *cfg = t->cfg;
  double n = (double)wf_model_num_params(d);
  const wf_model_desc *desc = wf_model_get_desc(t->model);
  for (int i = 0; i < desc->n && cfg->mesh.pp > 1; i++)
    if (desc->t[i].place == WF_PLACE_TIED) /* the last stage's copy */
      n += (double)wf_model_tensor_numel(d, i);
  double files = (double)cfg->mesh.tp * cfg->mesh.pp * (1 + wf__size_of(t->dp_comm));
  double need = 12 * n + WF_LLMC_HEADER_BYTES * files + 65536;
  if (statvfs(dir, &vs) != 0)
    return WF_OK; /* cannot tell: the writes will say */
  double avail = (double)vs.f_bavail * (double)vs.f_frsize;
  if (avail >= need)
    return WF_OK;
  WF_ERROR("train.checkpoint_dir %s: %.1f MiB free, one checkpoint needs %.1f MiB; free space or "
           "choose another directory",
           dir, avail / 1048576.0, need / 1048576.0);
  return WF_EIO;
}

wf_status wf_ckpt_prepare(const wf_ckpt_target *t)
{
  wf_status st = WF_OK;
  const wf_config *cfg = t->cfg;
  const char *root = cfg->train.checkpoint_dir;
  int me = wf__rank_of(wf__ckpt_world(t));
  if (!root[0]) {
    WF_REFUSE(strcmp(cfg->train.resume, "auto") && cfg->train.checkpoint_every <= 0, WF_ECONFIG,
              "train.%s needs train.checkpoint_dir (where checkpoints go)",
              cfg->train.checkpoint_every > 0 ? "checkpoint_every" : "resume=auto");
    return WF_OK;
  }
  char what[WF__PATH_LEN + 32];
  wf__pathf(what, sizeof what, "train.checkpoint_dir %s", root);
  WF_TRY(wf__ckpt_agree(t, me == 0 ? wf_file_mkdirs(root, what) : WF_OK,
                        "creating train.checkpoint_dir"));
  WF_TRY(wf__ckpt_agree(t, me == 0 ? wf__wait_for_writers(root) : WF_OK,
                        "waiting for the last job's stop writers"));
  if (wf__resume_never(cfg))
    WF_TRY(wf__ckpt_agree(t, me == 0 ? start_over(root) : WF_OK, "starting over"));
  WF_TRY(wf__ckpt_agree(t, probe(root, me), "checking train.checkpoint_dir"));
  st = wf__ckpt_agree(t, me == 0 ? check_space(t, root) : WF_OK,
                      "checking the free space in train.checkpoint_dir");
fail:
  return st;
}
