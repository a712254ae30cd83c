/*
 * jobfile.c - the job directory and the job file the console finds jobs by.
 *
 * The directory ($WEFT_JOB_DIR, else /tmp/weft-$USER) is 0700 and must belong to
 * us: it holds the token and the Unix socket, so a directory another user made
 * (in a shared /tmp) is refused rather than used. The job file is written to a
 * temporary name with mode 0600 and renamed, so a console never reads half a file.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    return WF_ESYS;
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
    return WF_ESYS;
  }
  if (!S_ISDIR(sb.st_mode)) {
    WF_ERROR("control: the job directory %s exists and is not a directory; remove it, or set "
             "WEFT_JOB_DIR to a directory you own",
             dir);
    return WF_ESYS;
  }
  if (sb.st_uid != getuid()) {
    WF_ERROR("control: the job directory %s belongs to uid %u, not to you (uid %u): another user "
             "made it first in a shared /tmp. weft will not put the job's token there; set "
             "WEFT_JOB_DIR to a directory you own (e.g. WEFT_JOB_DIR=$HOME/.weft/jobs)",
             dir, (unsigned)sb.st_uid, (unsigned)getuid());
    return WF_ESYS;
  }
  if ((sb.st_mode & 077) && chmod(dir, 0700) < 0) {
    WF_ERROR("control: cannot make %s private (chmod 0700): %s", dir, strerror(errno));
    return WF_ESYS;
  }
  return WF_OK;
}

static json_t *job_json(const wf_service *svc)
{
  return json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:f, s:s, s:s}", "job_id", svc->job_id,
                   "endpoint", svc->endpoint, "unix", svc->unix_path, "token", svc->token, "pid",
                   (int)getpid(), "world_size", svc->world, "start_time", svc->start_wall, "model",
                   svc->model, "view", svc->view_url);
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

int wf_console_find_jobs(const char *dir, wf_console_job *jobs, int max)
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
    /* A job file left by a killed job names a process that is gone. */
    if (jobs[n].pid > 0 && kill(jobs[n].pid, 0) < 0 && errno == ESRCH)
      continue;
    n++;
  }
  closedir(d);
  qsort(jobs, (size_t)n, sizeof *jobs, newest_first);
  return n;
}
