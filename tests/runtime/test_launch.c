/*
 * test_launch.c - every launch source, the precedence between them, and every
 * disagreement with MPI, using a fake environment (no MPI needed).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "wf_launch.h"

/* Fake environments are NULL-terminated "NAME=value" lists, read through
 * wf_launch_getenv like the worker's snapshot of its launch environment. */
static wf_status detect(wf_launch *l, const char **env, char *err)
{
  return wf_launch_detect(l, -1, 0, wf_launch_getenv, (void *)env, err, 512);
}

static void test_singleton(void **state)
{
  const char *env[] = {NULL};
  wf_launch l;
  char err[512];
  assert_int_equal(detect(&l, env, err), WF_OK);
  assert_int_equal(l.source, WF_LAUNCH_NONE);
  assert_int_equal(wf_launch_crosscheck(&l, 0, 1, 0, 1, err, sizeof err), WF_OK);
  assert_int_equal(l.rank, 0);
  assert_int_equal(l.world_size, 1);
  wf_launch_default_master(&l, "node7");
  assert_string_equal(l.master_addr, "node7");
  assert_int_equal(l.master_port, 29500); /* torchrun's default port */
}

static void test_torchrun(void **state)
{
  const char *env[] = {"RANK=3",
                       "WORLD_SIZE=4",
                       "LOCAL_RANK=1",
                       "LOCAL_WORLD_SIZE=2",
                       "MASTER_ADDR=10.0.0.5",
                       "MASTER_PORT=1234",
                       NULL};
  wf_launch l;
  char err[512];
  assert_int_equal(detect(&l, env, err), WF_OK);
  assert_int_equal(l.source, WF_LAUNCH_TORCHRUN);
  assert_int_equal(l.rank, 3);
  assert_int_equal(l.world_size, 4);
  assert_int_equal(l.local_rank, 1);
  assert_string_equal(l.master_addr, "10.0.0.5");
  assert_int_equal(l.master_port, 1234);
  assert_int_equal(wf_launch_crosscheck(&l, 3, 4, 1, 2, err, sizeof err), WF_OK);
}

static void test_ompi(void **state)
{
  const char *env[] = {"OMPI_COMM_WORLD_RANK=5",
                       "OMPI_COMM_WORLD_SIZE=8",
                       "OMPI_COMM_WORLD_LOCAL_RANK=1",
                       "OMPI_COMM_WORLD_LOCAL_SIZE=4",
                       "PMIX_RANK=5",
                       NULL};
  wf_launch l;
  char err[512];
  assert_int_equal(detect(&l, env, err), WF_OK);
  assert_int_equal(l.source, WF_LAUNCH_OMPI);
  assert_int_equal(l.rank, 5);
  assert_int_equal(l.local_size, 4);
  assert_int_equal(wf_launch_crosscheck(&l, 5, 8, 1, 4, err, sizeof err), WF_OK);
}

static void test_pmi_and_pmix(void **state)
{
  const char *env[] = {"PMI_RANK=2", "PMI_SIZE=3", NULL};
  const char *envx[] = {"PMIX_RANK=2", NULL};
  wf_launch l;
  char err[512];
  assert_int_equal(detect(&l, env, err), WF_OK);
  assert_int_equal(l.source, WF_LAUNCH_PMI);
  assert_int_equal(l.world_size, 3);
  assert_int_equal(detect(&l, envx, err), WF_OK);
  assert_int_equal(l.source, WF_LAUNCH_PMI);
  assert_int_equal(l.rank, 2);
  assert_int_equal(l.world_size, -1); /* PMIx alone gives no size: MPI fills it */
  assert_int_equal(wf_launch_crosscheck(&l, 2, 6, 0, 1, err, sizeof err), WF_OK);
  assert_int_equal(l.world_size, 6);
}

static void test_slurm(void **state)
{
  const char *env[] = {"SLURM_PROCID=1",
                       "SLURM_NTASKS=4",
                       "SLURM_LOCALID=1",
                       "SLURM_NNODES=2",
                       "SLURM_JOB_NODELIST=gpu[07-08]",
                       "SLURM_JOB_ID=4242",
                       "PMIX_RANK=1",
                       NULL};
  wf_launch l;
  char err[512];
  assert_int_equal(detect(&l, env, err), WF_OK);
  /* PMI outranks Slurm, and PMIX_RANK agrees; the Slurm facts are still read. */
  assert_int_equal(l.rank, 1);
  assert_true(l.slurm);
  assert_int_equal(l.slurm_ntasks, 4);
  assert_int_equal(l.num_nodes, 2);
  assert_string_equal(l.slurm_first_host, "gpu07");
  wf_launch_default_master(&l, "ignored");
  assert_string_equal(l.master_addr, "gpu07");
  assert_int_equal(l.master_port, 20000 + 4242); /* 20000 + job id mod 20000 */
}

static void test_slurm_only(void **state)
{
  const char *env[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", "SLURM_LOCALID=2", NULL};
  wf_launch l;
  char err[512];
  assert_int_equal(detect(&l, env, err), WF_OK);
  assert_int_equal(l.source, WF_LAUNCH_SLURM);
  assert_int_equal(l.world_size, 4);
  assert_int_equal(wf_launch_crosscheck(&l, 2, 4, 2, 4, err, sizeof err), WF_OK);
}

static void test_precedence(void **state)
{
  /* torchrun > OMPI > PMI > Slurm; flags beat them all. */
  const char *env[] = {"RANK=1",
                       "WORLD_SIZE=2",
                       "OMPI_COMM_WORLD_RANK=0",
                       "OMPI_COMM_WORLD_SIZE=2",
                       "SLURM_PROCID=0",
                       "SLURM_NTASKS=2",
                       NULL};
  wf_launch l;
  char err[512];
  assert_int_equal(detect(&l, env, err), WF_OK);
  assert_int_equal(l.source, WF_LAUNCH_TORCHRUN);
  assert_int_equal(l.rank, 1);
  assert_int_equal(wf_launch_detect(&l, 0, 2, wf_launch_getenv, (void *)env, err, sizeof err),
                   WF_OK);
  assert_int_equal(l.source, WF_LAUNCH_FLAGS);
  assert_int_equal(l.rank, 0);
  const char *env2[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "SLURM_PROCID=0",
                        "SLURM_NTASKS=1", NULL};
  assert_int_equal(detect(&l, env2, err), WF_OK);
  assert_int_equal(l.source, WF_LAUNCH_OMPI); /* mpirun inside sbatch */
  assert_int_equal(l.rank, 1);
}

static void expect_detect_error(const char **env, const char *needle)
{
  wf_launch l;
  char err[512];
  assert_int_equal(detect(&l, env, err), WF_ELAUNCH);
  if (!strstr(err, needle))
    fail_msg("message '%s' lacks '%s'", err, needle);
}

static void test_bad_environment(void **state)
{
  const char *e1[] = {"RANK=4", "WORLD_SIZE=4", NULL};
  expect_detect_error(e1, "rank 4 is not below world size 4");
  const char *e2[] = {"RANK=abc", "WORLD_SIZE=4", NULL};
  expect_detect_error(e2, "RANK='abc'");
  const char *e3[] = {"RANK=1", NULL};
  expect_detect_error(e3, "WORLD_SIZE is not");
  const char *e4[] = {"MASTER_PORT=70000", NULL};
  expect_detect_error(e4, "MASTER_PORT");
  const char *e5[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=gpu[01-", NULL};
  expect_detect_error(e5, "SLURM_JOB_NODELIST");
  const char *e6[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=3", "LOCAL_WORLD_SIZE=2", NULL};
  expect_detect_error(e6, "local rank 3 is not below local size 2");
}

static void expect_cross_error(const char **env, int r, int n, int lr, int ln, const char *needle)
{
  wf_launch l;
  char err[512];
  assert_int_equal(detect(&l, env, err), WF_OK);
  assert_int_equal(wf_launch_crosscheck(&l, r, n, lr, ln, err, sizeof err), WF_ELAUNCH);
  if (!strstr(err, needle))
    fail_msg("message '%s' lacks '%s'", err, needle);
}

static void test_disagreements(void **state)
{
  const char *ws[] = {"RANK=1", "WORLD_SIZE=4", NULL};
  expect_cross_error(ws, 1, 2, 0, 1, "world size 4");
  const char *rk[] = {"RANK=1", "WORLD_SIZE=2", NULL};
  expect_cross_error(rk, 0, 2, 0, 1, "disagrees with MPI rank 0");
  /* srun --mpi=none: four singletons that each see a world of one. */
  const char *srun[] = {"SLURM_PROCID=3", "SLURM_NTASKS=4", NULL};
  expect_cross_error(srun, 0, 1, 0, 1, "--mpi=pmix");
  const char *tr[] = {"RANK=0", "WORLD_SIZE=8", NULL};
  expect_cross_error(tr, 0, 1, 0, 1, "mpirun -np 8");
  const char *lr[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", NULL};
  expect_cross_error(lr, 1, 2, 1, 2, "contradicts the node");
  const char *ls[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4", NULL};
  expect_cross_error(ls, 1, 2, 1, 2, "LOCAL_WORLD_SIZE");
}

/* Environments recorded under Slurm 22.05 on the one-node test cluster (tests/slurm). */
static void test_slurm_precheck(void **state)
{
  char err[512];
  /* srun --mpi=none: a step id, no PMI at all. */
  const char *none[] = {"SLURM_JOB_ID=5", "SLURM_STEP_ID=0", "SLURM_PROCID=1",
                        "SLURM_STEP_NUM_TASKS=4", NULL};
  assert_int_equal(wf_launch_precheck(wf_launch_getenv, (void *)none, err, sizeof err), WF_ELAUNCH);
  assert_non_null(strstr(err, "srun --mpi=pmix"));
  assert_non_null(strstr(err, "--mpi=none"));
  assert_non_null(strstr(err, "4 tasks"));
  /* srun --mpi=pmi2: Slurm's PMI-2 variables, which Debian's Open MPI cannot use. */
  const char *pmi2[] = {"SLURM_JOB_ID=7", "SLURM_STEP_ID=0", "SLURM_PROCID=0",      "PMI_FD=13",
                        "PMI_RANK=0",     "PMI_SIZE=2",      "SLURM_MPI_TYPE=pmi2", NULL};
  assert_int_equal(wf_launch_precheck(wf_launch_getenv, (void *)pmi2, err, sizeof err), WF_ELAUNCH);
  assert_non_null(strstr(err, "PMI-2"));
  assert_non_null(strstr(err, "srun --mpi=pmix"));
  /* srun --mpi=pmix, mpirun inside an allocation, the batch step, no Slurm: fine. */
  const char *pmix[] = {"SLURM_STEP_ID=0", "SLURM_PROCID=0", "PMIX_RANK=0", NULL};
  const char *mpirun[] = {"SLURM_STEP_ID=0", "SLURM_PROCID=0", "OMPI_COMM_WORLD_SIZE=8", NULL};
  const char *batch[] = {"SLURM_JOB_ID=9", "SLURM_PROCID=0", "SLURM_NTASKS=4", NULL};
  const char *plain[] = {NULL};
  assert_int_equal(wf_launch_precheck(wf_launch_getenv, (void *)pmix, err, sizeof err), WF_OK);
  assert_int_equal(wf_launch_precheck(wf_launch_getenv, (void *)mpirun, err, sizeof err), WF_OK);
  assert_int_equal(wf_launch_precheck(wf_launch_getenv, (void *)batch, err, sizeof err), WF_OK);
  assert_int_equal(wf_launch_precheck(wf_launch_getenv, (void *)plain, err, sizeof err), WF_OK);
}

/* Which processes MPI_Init makes singletons (those get OMPI_MCA_ess_singleton_isolated). */
static void test_singleton_mpi_init(void **state)
{
  const char *plain[] = {NULL};
  const char *torchrun[] = {"RANK=0", "WORLD_SIZE=1", NULL};
  const char *batch[] = {"SLURM_JOB_ID=9", "SLURM_PROCID=0", "SLURM_NTASKS=4", NULL};
  const char *mpirun[] = {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1", NULL};
  const char *pmix[] = {"SLURM_PROCID=0", "PMIX_RANK=0", "PMIX_NAMESPACE=slurm.pmix.5.0", NULL};
  const char *pmi2[] = {"PMI_FD=13", "PMI_RANK=0", "PMI_SIZE=2", NULL};
  assert_true(wf_launch_is_singleton(wf_launch_getenv, (void *)plain));
  assert_true(wf_launch_is_singleton(wf_launch_getenv, (void *)torchrun));
  assert_true(wf_launch_is_singleton(wf_launch_getenv, (void *)batch));
  assert_false(wf_launch_is_singleton(wf_launch_getenv, (void *)mpirun));
  assert_false(wf_launch_is_singleton(wf_launch_getenv, (void *)pmix));
  assert_false(wf_launch_is_singleton(wf_launch_getenv, (void *)pmi2));
}

/* The worker run straight from an sbatch script of 4 tasks: the batch step has
 * SLURM_PROCID=0 and the allocation's SLURM_NTASKS but no step id. */
static void test_slurm_batch_step(void **state)
{
  const char *batch[] = {"SLURM_JOB_ID=9", "SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0",
                         NULL};
  wf_launch l;
  char err[512];
  assert_int_equal(detect(&l, batch, err), WF_OK);
  assert_true(l.slurm_batch);
  assert_int_equal(wf_launch_crosscheck(&l, 0, 1, 0, 1, err, sizeof err), WF_ELAUNCH);
  assert_non_null(strstr(err, "batch script of Slurm job 9"));
  assert_non_null(strstr(err, "srun --mpi=pmix ./worker"));
  /* An srun task is not the batch step. */
  const char *task[] = {"SLURM_JOB_ID=9", "SLURM_STEP_ID=0", "SLURM_PROCID=0",
                        "SLURM_NTASKS=4", "PMIX_RANK=0",     NULL};
  assert_int_equal(detect(&l, task, err), WF_OK);
  assert_false(l.slurm_batch);
}

static void write_text(const char *path, const char *text)
{
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Open MPI's settings: the ranks' OMPI_MCA_* variables (mpirun's --mca and environment),
 * then the user's parameter file, then the system's, then Open MPI 4.1's defaults
 * (ompi_info: odls_base_sigkill_timeout 1, oob_tcp_keepalive_time 300, _intvl 20,
 * _probes 9, so 300 + 20 x 9 = 480 s). */
static void test_ompi_limits(void **state)
{
  char dir[] = "/tmp/weft-test-ompi-XXXXXX", home[128], sys[128], user[160], val[64];
  assert_non_null(mkdtemp(dir));
  snprintf(home, sizeof home, "HOME=%s", dir);
  snprintf(sys, sizeof sys, "%s/system.conf", dir);
  snprintf(user, sizeof user, "%s/.openmpi", dir);
  const char *none[] = {home, NULL};
  wf_ompi_limits l;
  wf_launch_ompi_limits(&l, wf_launch_getenv, (void *)none, sys); /* no file at all */
  assert_true(l.sigkill_timeout_s == 1 && l.keepalive_s == 480);
  write_text(sys, "# site\nodls_base_sigkill_timeout = 60\noob_tcp_keepalive_time=0 # off\n");
  wf_launch_ompi_limits(&l, wf_launch_getenv, (void *)none, sys);
  assert_true(l.sigkill_timeout_s == 60 && l.keepalive_s == 0);
  assert_int_equal(mkdir(user, 0755), 0);
  strcat(user, "/mca-params.conf");
  write_text(user, "oob_tcp_keepalive_time = 5\nodls_base_sigkill_timeout = 2\n");
  wf_launch_ompi_limits(&l, wf_launch_getenv, (void *)none, sys); /* the user's wins */
  assert_true(l.sigkill_timeout_s == 2 && l.keepalive_s == 5 + 20 * 9);
  const char *env[] = {home, "OMPI_MCA_oob_tcp_keepalive_time=1",
                       "OMPI_MCA_oob_tcp_keepalive_intvl=1", "OMPI_MCA_oob_tcp_keepalive_probes=2",
                       NULL};
  wf_launch_ompi_limits(&l, wf_launch_getenv, (void *)env, sys); /* mpirun's win */
  assert_true(l.sigkill_timeout_s == 2 && l.keepalive_s == 1 + 1 * 2);
  assert_true(wf_launch_ompi_param("oob_tcp_keepalive_probes", wf_launch_getenv, (void *)env, sys,
                                   val, sizeof val));
  assert_string_equal(val, "2");
  assert_false(wf_launch_ompi_param("btl", wf_launch_getenv, (void *)env, sys, val, sizeof val));
  unlink(user);
  unlink(sys);
  user[strlen(user) - strlen("/mca-params.conf")] = '\0';
  rmdir(user);
  rmdir(dir);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_singleton),
      cmocka_unit_test(test_torchrun),
      cmocka_unit_test(test_ompi),
      cmocka_unit_test(test_pmi_and_pmix),
      cmocka_unit_test(test_slurm),
      cmocka_unit_test(test_slurm_only),
      cmocka_unit_test(test_precedence),
      cmocka_unit_test(test_bad_environment),
      cmocka_unit_test(test_disagreements),
      cmocka_unit_test(test_slurm_precheck),
      cmocka_unit_test(test_singleton_mpi_init),
      cmocka_unit_test(test_slurm_batch_step),
      cmocka_unit_test(test_ompi_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
