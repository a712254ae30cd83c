/*
 * jobfile.c - the job directory and the job file the console finds jobs by.
 *
 * The directory ($WEFT_JOB_DIR, else /tmp/weft-$USER) is 0700 and must belong to
 * us: it holds the token and the Unix socket, so a directory another user made
 * (in a shared /tmp) is refused rather than used. The job file is written to a
 * temporary name with mode 0600 and renamed, so a console never reads half a file.
 *
 * Nothing is left behind when rank 0 ends however it ends: it removes the job file and
 * the socket when it stops, and a reaper process (below) removes them when it is killed
 * first (mpirun's SIGKILL a moment after another rank died, a segfault, SIGPIPE). A job
 * file whose process is gone anyway (the host rebooted, the reaper was killed with the
 * job's cgroup) is named by the console as stale, and replaced by a job of its name.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "control_int.h"

const char *wf_job_dir_default(char *buf, size_t len)
{
  const char *env = getenv("WEFT_JOB_DIR");
  if (env && env[0]) {
    wf_strlcpy(buf, env, len);
    return buf;
  }
  const char *user = getenv("USER");
  if (user && user[0] && !strchr(user, '/'))
    snprintf(buf, len, "/tmp/weft-%s", user);
  else
    snprintf(buf, len, "/tmp/weft-%u", (unsigned)getuid());
  return buf;
}

wf_status wf__job_dir_prepare(const char *dir)
{
  struct stat sb;
  if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
    WF_ERROR("control: cannot create the job directory %s: %s (set WEFT_JOB_DIR to a directory "
             "you own)",
             dir, strerror(errno));
    return errno == ENOSPC || errno == EIO ? WF_ESYS : WF_ECONFIG; /* the user's to fix */
  }
  if (lstat(dir, &sb) < 0) {
    WF_ERROR("control: cannot inspect the job directory %s: %s (set WEFT_JOB_DIR to a directory "
             "you own)",
             dir, strerror(errno));
    return WF_ESYS;
  }
  if (S_ISLNK(sb.st_mode)) {
    WF_ERROR("control: the job directory %s is a symbolic link; weft refuses it, since whoever "
             "made it could point it elsewhere (it would hold the job's token). Remove it, or set "
             "WEFT_JOB_DIR to a directory you own (e.g. WEFT_JOB_DIR=$HOME/.weft/jobs)",
             dir);
    return WF_ECONFIG;
  }
  if (!S_ISDIR(sb.st_mode)) {
    WF_ERROR("control: the job directory %s exists and is not a directory; remove it, or set "
             "WEFT_JOB_DIR to a directory you own",
             dir);
    return WF_ECONFIG;
  }
  if (sb.st_uid != getuid()) {
    WF_ERROR("control: the job directory %s belongs to uid %u, not to you (uid %u): another user "
             "made it first in a shared /tmp. weft will not put the job's token there; set "
             "WEFT_JOB_DIR to a directory you own (e.g. WEFT_JOB_DIR=$HOME/.weft/jobs)",
             dir, (unsigned)sb.st_uid, (unsigned)getuid());
    return WF_ECONFIG;
  }
  if ((sb.st_mode & 077) && chmod(dir, 0700) < 0) {
    WF_ERROR("control: cannot make %s private (chmod 0700): %s", dir, strerror(errno));
    return WF_ESYS;
  }
  return WF_OK;
}

static json_t *job_json(const wf_service *svc)
{
  return json_pack("{s:s, s:s, s:s, s:s, s:i, s:s, s:i, s:f, s:s, s:s}", "job_id", svc->job_id,
                   "endpoint", svc->endpoint, "unix", svc->unix_path, "token", svc->token, "pid",
                   (int)getpid(), "host", wf_rt_host(), "world_size", svc->world, "start_time",
                   svc->start_wall, "model", svc->model, "view", svc->view_url);
}

wf_status wf__job_file_write(wf_service *svc)
{
  char tmp[720];
  json_t *j = job_json(svc);
  if (!j)
    return WF_ENOMEM;
  snprintf(tmp, sizeof tmp, "%s.tmp", svc->job_file);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    WF_ERROR("control: cannot write the job file %s: %s", tmp, strerror(errno));
    json_decref(j);
    return WF_EIO;
  }
  int rc = json_dumpfd(j, fd, JSON_INDENT(2));
  json_decref(j);
  if (rc < 0 || fsync(fd) < 0 || close(fd) < 0 || rename(tmp, svc->job_file) < 0) {
    WF_ERROR("control: cannot write the job file %s: %s", svc->job_file, strerror(errno));
    unlink(tmp);
    return WF_EIO;
  }
  return WF_OK;
}

static void copy_str(char *dst, size_t len, json_t *o, const char *key)
{
  const char *v = json_string_value(json_object_get(o, key));
  wf_strlcpy(dst, v ? v : "", len);
}

wf_status wf_console_job_load(const char *path, wf_console_job *out, char *err, size_t err_len)
{
  json_error_t je;
  memset(out, 0, sizeof *out);
  json_t *j = json_load_file(path, 0, &je);
  if (!j) {
    snprintf(err, err_len, "%s: %s", path, je.text);
    return WF_EFORMAT;
  }
  copy_str(out->id, sizeof out->id, j, "job_id");
  copy_str(out->endpoint, sizeof out->endpoint, j, "endpoint");
  copy_str(out->unix_path, sizeof out->unix_path, j, "unix");
  copy_str(out->token, sizeof out->token, j, "token");
  copy_str(out->view, sizeof out->view, j, "view");
  copy_str(out->host, sizeof out->host, j, "host");
  out->pid = (int)json_integer_value(json_object_get(j, "pid"));
  out->world_size = (int)json_integer_value(json_object_get(j, "world_size"));
  out->start_time = json_number_value(json_object_get(j, "start_time"));
  wf_strlcpy(out->file, path, sizeof out->file);
  json_decref(j);
  if (!out->id[0] || !out->endpoint[0]) {
    snprintf(err, err_len, "%s: not a weft job file", path);
    return WF_EFORMAT;
  }
  return WF_OK;
}

static int newest_first(const void *a, const void *b)
{
  double ta = ((const wf_console_job *)a)->start_time;
  double tb = ((const wf_console_job *)b)->start_time;
  return (ta < tb) - (ta > tb);
}

/* Job files in dir whose process runs (stale false) or is gone (stale true). */
static int find_jobs(const char *dir, wf_console_job *jobs, int max, bool stale)
{
  char dbuf[512], path[1024], err[256];
  if (!dir)
    dir = wf_job_dir_default(dbuf, sizeof dbuf);
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL && n < max;) {
    size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0)
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (wf_console_job_load(path, &jobs[n], err, sizeof err) != WF_OK)
      continue;
    if (wf_console_job_stale(&jobs[n]) != stale)
      continue;
    n++;
  }
  closedir(d);
  qsort(jobs, (size_t)n, sizeof *jobs, newest_first);
  return n;
}

int wf_console_find_jobs(const char *dir, wf_console_job *jobs, int max)
{
  return find_jobs(dir, jobs, max, false);
}

int wf_console_find_stale(const char *dir, wf_console_job *jobs, int max)
{
  return find_jobs(dir, jobs, max, true);
}

bool wf_console_job_stale(const wf_console_job *job)
{
  /* a pid means something only on its own host (a job file without one is older than
   * the host field: a local one) */
  if (job->pid <= 0 || (job->host[0] && strcmp(job->host, wf_rt_host()) != 0))
    return false;
  return kill(job->pid, 0) < 0 && errno == ESRCH;
}

/* ---- the job file's name, and what is left when rank 0 is killed ------------------------ */

/* A job file at `path` whose job still runs on this host: the name is taken. */
static wf_status name_taken(const char *path, const char *id, wf_console_job *old)
{
  char err[256];
  if (access(path, F_OK) != 0 || wf_console_job_load(path, old, err, sizeof err) != WF_OK ||
      wf_console_job_stale(old))
    return WF_OK; /* none, not a job file (the rename replaces it), or stale */
  WF_ERROR("control: a job named %s is already running (pid %d on %s; job file %s); choose "
           "another runtime.job_name, or stop that one first (coordinator stop %s)",
           id, old->pid, old->host[0] ? old->host : "this host", path, id);
  return WF_ECONFIG;
}

wf_status wf_service_check_name(const char *job_name)
{
  char dir[512], path[700];
  wf_console_job old;
  if (!job_name || !job_name[0])
    return WF_OK; /* host-pid-time or slurm-ID: unique */
  wf_job_dir_default(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/%s.json", dir, job_name);
  return name_taken(path, job_name, &old);
}

wf_status wf__job_file_claim(wf_service *svc)
{
  wf_console_job old = {.pid = 0};
  wf_status st = name_taken(svc->job_file, svc->job_id, &old);
  if (st != WF_OK || old.pid <= 0)
    return st;
  WF_INFO("control: removed the stale job file %s (job %s: its pid %d is gone)", svc->job_file,
          old.id, old.pid);
  unlink(svc->job_file);
  if (old.unix_path[0])
    unlink(old.unix_path);
  return WF_OK;
}

/* Whether `path` is still the file whose status was `was` (the same inode, written at the
 * same time): a job of the same name started since is never touched. */
static bool same_file(const char *path, const struct stat *was)
{
  struct stat now;
  return stat(path, &now) == 0 && now.st_ino == was->st_ino && now.st_dev == was->st_dev &&
         now.st_mtim.tv_sec == was->st_mtim.tv_sec && now.st_mtim.tv_nsec == was->st_mtim.tv_nsec;
}

/* The reaper, a child of rank 0 in a session of its own (the launcher ends the job's
 * processes, not this one): it waits for its pipe to close, which happens when rank 0
 * ends however it ends, removes what is left, and exits. Forked from a process with
 * threads, it makes only async-signal-safe calls. */
static _Noreturn void reap(int fd, const char *file, const struct stat *fst, const char *sock,
                           const struct stat *sst)
{
  char c;
  int null = open("/dev/null", O_RDWR);
  prctl(PR_SET_NAME, "weft-reaper"); /* what ps and top show */
  if (null >= 0) { /* nothing of the job's output stays open: a reader waiting for EOF */
    dup2(null, 0), dup2(null, 1), dup2(null, 2);
  }
  for (int i = 3; i < 1024; i++) /* fds above are the job's too; the pipe stays */
    if (i != fd)
      close(i);
  while (read(fd, &c, 1) != 0 && errno == EINTR) {
  }
  if (same_file(file, fst))
    unlink(file);
  if (sock[0] && same_file(sock, sst))
    unlink(sock);
  _exit(0);
}

void wf__job_reaper_start(wf_service *svc)
{
  int fds[2];
  struct stat fst, sst = {0};
  svc->reaper_fd = -1;
  if (stat(svc->job_file, &fst) != 0 || (svc->unix_path[0] && stat(svc->unix_path, &sst) != 0) ||
      pipe2(fds, O_CLOEXEC) != 0)
    return;
  pid_t pid = fork();
  if (pid == 0) { /* a session of its own, then a grandchild init adopts */
    close(fds[1]);
    if (setsid() < 0 || fork() != 0)
      _exit(0);
    reap(fds[0], svc->job_file, &fst, svc->unix_path, &sst);
  }
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    WF_WARN("control: cannot start the process that removes the job file if this one is "
            "killed: %s",
            strerror(errno));
    return;
  }
  waitpid(pid, NULL, 0);
  svc->reaper_fd = fds[1];
}
