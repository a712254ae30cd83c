/*
 * absent_stub.c - a library that exists only at link time.
 *
 * The fake GPU module in ../absent_fake links against it, so the fake gets a
 * DT_NEEDED entry for libweft_test_absent.so. The library is never on the dynamic
 * linker's path (no rpath, no LD_LIBRARY_PATH), so at run time it is "absent",
 * exactly like libcudart.so on a machine without the CUDA toolkit.
 */
int wf_test_absent_symbol(void);

int wf_test_absent_symbol(void) { return 42; }
