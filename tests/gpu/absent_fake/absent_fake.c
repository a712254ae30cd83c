/*
 * absent_fake.c - a fake libweft_cuda.so whose dependency is missing at run time.
 *
 * It calls into libweft_test_absent.so so that the linker (which runs with
 * --as-needed) keeps the DT_NEEDED entry. dlopen() of this module must fail with
 * "libweft_test_absent.so: cannot open shared object file", and wf_gpu_open() must
 * pass that name on in its reason. The entry symbol is never reached.
 */
int wf_test_absent_symbol(void);
int wf_test_fake_module_probe(void);

int wf_test_fake_module_probe(void) { return wf_test_absent_symbol(); }
