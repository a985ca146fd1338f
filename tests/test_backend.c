/* test_backend.c - the backends below the JIT: the host backend end to end (a real shared
 * object built by the system C compiler, loaded from memory and launched), the TMA request
 * checks, the CUDA target mapping, CUDA and HIP opening cleanly on a machine without their
 * devices, CUDA and HIP over stand-in driver libraries (open statuses; the caller's current
 * context or device kept across every entry point), and (RLK_TEST_GPU=1) the CUDA backend on
 * a real device: memory, events, an NVRTC kernel, large dynamic shared memory, launches from
 * another thread, a TMA copy, the caller's current context kept, an out-of-range ordinal. */
#include <check.h>
#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/core.h"
#include "jit/compiler.h"
#include "suites.h"
#include "test_util.h"

extern char **environ;

/* ---- helpers ---------------------------------------------------------------------- */

static uint64_t seeded_state(void) {
  static uint64_t counter;
  return rlk_test_seed() ^ (0x5bd1e995ull * ++counter);
}

/* Reads a whole file; NULL on failure. */
static void *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *buf = n > 0 ? malloc((size_t)n) : NULL;
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *size = buf ? (size_t)n : 0;
  return buf;
}

/* Builds `source` into <dir>/k.so (named `soname` when not NULL) with the system C compiler
 * (a child process), its path written into so_path; fails the test when the compiler is
 * missing or rejects it. */
static void compile_shared_object(const char *source, const char *dir, const char *soname,
                                  char *so_path, size_t size) {
  char c_path[1300], soname_arg[300];
  snprintf(c_path, sizeof c_path, "%s/k.c", dir);
  snprintf(so_path, size, "%s/k.so", dir);
  FILE *f = fopen(c_path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(source, f);
  fclose(f);
  char *argv[12];
  int argc = 0;
  argv[argc++] = "cc";
  argv[argc++] = "-std=c11";
  argv[argc++] = "-O1";
  argv[argc++] = "-fPIC";
  argv[argc++] = "-shared";
  if (soname) {
    snprintf(soname_arg, sizeof soname_arg, "-Wl,-soname,%s", soname);
    argv[argc++] = soname_arg;
  }
  argv[argc++] = "-o";
  argv[argc++] = so_path;
  argv[argc++] = c_path;
  argv[argc] = NULL;
  pid_t pid;
  int rc = posix_spawnp(&pid, "cc", NULL, NULL, argv, environ);
  ck_assert_msg(rc == 0, "cannot run cc: %s", strerror(rc));
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "cc failed on %s", c_path);
}

/* Builds `source` into a shared object and returns its bytes. */
static void *build_shared_object(const char *source, size_t *size) {
  char dir[1200], so_path[1300];
  rlk_test_mkdtemp(dir, sizeof dir, "backend-so");
  compile_shared_object(source, dir, NULL, so_path, sizeof so_path);
  void *image = read_file(so_path, size);
  ck_assert_ptr_nonnull(image);
  rlk_test_rmtree(dir);
  return image;
}

static rlk_backend_impl *open_host(void) {
  rlk_backend_impl *b = NULL;
  rlk_status st = rlk_host_backend_open(&b);
  ck_assert_msg(st == RLK_OK, "host backend: %s", rlk_last_error());
  ck_assert_ptr_nonnull(b);
  return b;
}

static const char *const axpy_source =
    "#include <stdint.h>\n"
    "void rlk_test_axpy(void **args) {\n"
    "  float a = *(const float *)args[0];\n"
    "  const float *x = *(const float *const *)args[1];\n"
    "  float *y = *(float **)args[2];\n"
    "  int64_t n = *(const int64_t *)args[3];\n"
    "  for (int64_t i = 0; i < n; i++) y[i] = a * x[i] + y[i];\n"
    "}\n";

/* A module whose only kernel writes `value` to *(int *)args[0]. */
static void *which_module(int value, size_t *size) {
  char src[256];
  snprintf(src, sizeof src, "void rlk_test_which(void **args) { *(int *)args[0] = %d; }\n", value);
  return build_shared_object(src, size);
}

static int call_which(rlk_backend_impl *b, void *module) {
  void *fn = NULL;
  rlk_status st = b->get_function(b, module, "rlk_test_which", &fn);
  ck_assert_msg(st == RLK_OK, "get_function: %s", rlk_last_error());
  int out = -1;
  void *args[] = {&out};
  rlk_launch_dims dims = {{1, 1, 1}, {1, 1, 1}, 0};
  ck_assert_int_eq(b->launch(b, fn, &dims, NULL, args), RLK_OK);
  return out;
}

/* ---- host backend ----------------------------------------------------------------- */

START_TEST(test_host_info) {
  rlk_backend_impl *b = open_host();
  ck_assert_int_eq(b->kind, RLK_BACKEND_HOST);
  ck_assert_str_eq(b->name, "host");
  ck_assert_str_eq(b->info.target, rlk_host_target());
  ck_assert_int_ge(b->info.multiprocessors, 1);
  ck_assert_int_eq((int)sysconf(_SC_NPROCESSORS_ONLN), b->info.multiprocessors);
  ck_assert_msg(b->info.name[0] != '\0', "empty CPU name");
  ck_assert_msg(b->info.total_memory > 0, "no memory size");
  ck_assert_int_eq(b->info.compute_major, 0);
  b->destroy(b);
}
END_TEST

START_TEST(test_host_launch_axpy) {
  uint64_t rng = seeded_state();
  size_t so_size = 0;
  void *so = build_shared_object(axpy_source, &so_size);
  rlk_backend_impl *b = open_host();
  void *module = NULL, *fn = NULL;
  rlk_status st = b->module_load(b, so, so_size, &module);
  ck_assert_msg(st == RLK_OK, "module_load: %s", rlk_last_error());
  free(so); /* the backend keeps its own copy of the image */
  st = b->get_function(b, module, "rlk_test_axpy", &fn);
  ck_assert_msg(st == RLK_OK, "get_function: %s", rlk_last_error());

  int64_t n = 1 + (int64_t)(rlk_test_rand_u64(&rng) % 5000);
  float a = (float)rlk_test_rand_normal(&rng);
  float *hx = malloc((size_t)n * sizeof *hx), *hy = malloc((size_t)n * sizeof *hy);
  double *ref = malloc((size_t)n * sizeof *ref);
  for (int64_t i = 0; i < n; i++) {
    hx[i] = (float)rlk_test_rand_normal(&rng);
    hy[i] = (float)rlk_test_rand_normal(&rng);
    ref[i] = (double)a * (double)hx[i] + (double)hy[i];
  }
  void *dx = NULL, *dy = NULL;
  ck_assert_int_eq(b->mem_alloc(b, (size_t)n * sizeof(float), &dx), RLK_OK);
  ck_assert_int_eq(b->mem_alloc(b, (size_t)n * sizeof(float), &dy), RLK_OK);
  ck_assert_int_eq(b->copy_to_device(b, dx, hx, (size_t)n * sizeof(float)), RLK_OK);
  ck_assert_int_eq(b->copy_to_device(b, dy, hy, (size_t)n * sizeof(float)), RLK_OK);
  void *args[] = {&a, &dx, &dy, &n};
  rlk_launch_dims dims = {{1, 1, 1}, {1, 1, 1}, 0};
  ck_assert_int_eq(b->launch(b, fn, &dims, NULL, args), RLK_OK);
  ck_assert_int_eq(b->synchronize(b, NULL), RLK_OK);
  memset(hy, 0, (size_t)n * sizeof(float));
  ck_assert_int_eq(b->copy_to_host(b, hy, dy, (size_t)n * sizeof(float)), RLK_OK);
  for (int64_t i = 0; i < n; i++) {
    double scale = __builtin_fabs((double)a * (double)hx[i]) + __builtin_fabs((double)hy[i]);
    double tol = 4e-7 * (1.0 + scale);
    ck_assert_msg(__builtin_fabs((double)hy[i] - ref[i]) <= tol,
                  "y[%lld] = %.9g, want %.9g (seed %llu)", (long long)i, (double)hy[i], ref[i],
                  (unsigned long long)rlk_test_seed());
  }
  b->mem_free(b, dx);
  b->mem_free(b, dy);
  b->module_unload(b, module);
  b->destroy(b);
  free(hx);
  free(hy);
  free(ref);
}
END_TEST

/* Several modules at once, and a module loaded after another was unloaded, each give their
 * own function: nothing is confused by a reused file descriptor or name. */
START_TEST(test_host_modules_stay_distinct) {
  size_t s1, s2, s3;
  void *i1 = which_module(11, &s1), *i2 = which_module(22, &s2), *i3 = which_module(33, &s3);
  rlk_backend_impl *b = open_host();
  void *m1 = NULL, *m2 = NULL, *m3 = NULL, *m1b = NULL;
  ck_assert_int_eq(b->module_load(b, i1, s1, &m1), RLK_OK);
  ck_assert_int_eq(b->module_load(b, i2, s2, &m2), RLK_OK);
  ck_assert_int_eq(b->module_load(b, i1, s1, &m1b), RLK_OK); /* the same image twice */
  ck_assert_int_eq(call_which(b, m1), 11);
  ck_assert_int_eq(call_which(b, m2), 22);
  ck_assert_int_eq(call_which(b, m1b), 11);
  b->module_unload(b, m1);
  ck_assert_int_eq(b->module_load(b, i3, s3, &m3), RLK_OK);
  ck_assert_int_eq(call_which(b, m3), 33);
  ck_assert_int_eq(call_which(b, m2), 22);
  ck_assert_int_eq(call_which(b, m1b), 11);
  for (int round = 0; round < 8; round++) { /* load/unload churn reuses descriptors */
    void *m = NULL;
    void *img = round % 2 ? i3 : i1;
    ck_assert_int_eq(b->module_load(b, img, round % 2 ? s3 : s1, &m), RLK_OK);
    ck_assert_int_eq(call_which(b, m), round % 2 ? 33 : 11);
    b->module_unload(b, m);
  }
  b->module_unload(b, m2);
  b->module_unload(b, m3);
  b->module_unload(b, m1b);
  b->destroy(b);
  free(i1);
  free(i2);
  free(i3);
}
END_TEST

START_TEST(test_host_bad_images) {
  uint64_t rng = seeded_state();
  rlk_backend_impl *b = open_host();
  void *module = (void *)1;

  /* random bytes */
  size_t n = 1 + (size_t)(rlk_test_rand_u64(&rng) % 4096);
  unsigned char *junk = malloc(n);
  for (size_t i = 0; i < n; i++) junk[i] = (unsigned char)rlk_test_rand_u64(&rng);
  junk[0] = 'J'; /* never the ELF magic by chance */
  ck_assert_int_eq(b->module_load(b, junk, n, &module), RLK_ERR_BACKEND);
  ck_assert_ptr_null(module);
  ck_assert_msg(strstr(rlk_last_error(), "host") != NULL, "message: %s", rlk_last_error());

  /* empty */
  module = (void *)1;
  ck_assert_int_eq(b->module_load(b, junk, 0, &module), RLK_ERR_BACKEND);
  ck_assert_ptr_null(module);
  free(junk);

  size_t size = 0;
  unsigned char *so = build_shared_object(axpy_source, &size);

  /* truncated at a random point past the ELF header */
  size_t cut = sizeof(Elf64_Ehdr) + (size_t)(rlk_test_rand_u64(&rng) % (size / 2));
  module = (void *)1;
  ck_assert_int_eq(b->module_load(b, so, cut, &module), RLK_ERR_BACKEND);
  ck_assert_ptr_null(module);
  ck_assert_msg(strstr(rlk_last_error(), "outside") != NULL, "message: %s", rlk_last_error());

  /* an ELF image for another machine */
  Elf64_Ehdr eh;
  memcpy(&eh, so, sizeof eh);
  uint16_t machine = eh.e_machine;
  eh.e_machine = 190; /* a CUDA cubin's machine */
  memcpy(so, &eh, sizeof eh);
  ck_assert_int_eq(b->module_load(b, so, size, &module), RLK_ERR_BACKEND);
  ck_assert_msg(strstr(rlk_last_error(), "cuda") != NULL, "message: %s", rlk_last_error());

  /* a valid header with garbage where the dynamic section should be: the loader refuses */
  eh.e_machine = machine;
  memcpy(so, &eh, sizeof eh);
  for (size_t i = sizeof eh; i < size; i++)
    if (i % 7 == 0) so[i] ^= 0xa5;
  rlk_status st = b->module_load(b, so, size, &module);
  if (st == RLK_OK) { /* the loader may cope with some damage; then it must still unload */
    b->module_unload(b, module);
  } else {
    ck_assert_int_eq(st, RLK_ERR_BACKEND);
  }
  free(so);
  b->destroy(b);
}
END_TEST

START_TEST(test_host_missing_symbol) {
  size_t size = 0;
  void *so = build_shared_object(axpy_source, &size);
  rlk_backend_impl *b = open_host();
  void *module = NULL, *fn = (void *)1;
  ck_assert_int_eq(b->module_load(b, so, size, &module), RLK_OK);
  ck_assert_int_eq(b->get_function(b, module, "rlk_no_such_kernel_7", &fn), RLK_ERR_BACKEND);
  ck_assert_ptr_null(fn);
  ck_assert_msg(strstr(rlk_last_error(), "rlk_no_such_kernel_7") != NULL, "message: %s",
                rlk_last_error());
  ck_assert_int_eq(b->get_function(b, module, "rlk_test_axpy", &fn), RLK_OK);
  ck_assert_ptr_nonnull(fn);
  ck_assert_int_eq(b->launch(b, NULL, &(rlk_launch_dims){{1, 1, 1}, {1, 1, 1}, 0}, NULL, NULL),
                   RLK_ERR_INVALID_ARGUMENT);
  b->module_unload(b, module);
  b->destroy(b);
  free(so);
}
END_TEST

START_TEST(test_host_memory_and_events) {
  uint64_t rng = seeded_state();
  rlk_backend_impl *b = open_host();
  size_t n = 1 + (size_t)(rlk_test_rand_u64(&rng) % 100000);
  int value = (int)(rlk_test_rand_u64(&rng) % 256);
  unsigned char *p = NULL;
  ck_assert_int_eq(b->mem_alloc(b, n, (void **)&p), RLK_OK);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq((int)((uintptr_t)p % 64), 0);
  ck_assert_int_eq(b->mem_set(b, p, value, n), RLK_OK);
  for (size_t i = 0; i < n; i++) ck_assert_int_eq(p[i], value);
  unsigned char *h = malloc(n);
  ck_assert_int_eq(b->copy_to_host(b, h, p, n), RLK_OK);
  ck_assert_int_eq(memcmp(h, p, n), 0);
  free(h);
  ck_assert_int_eq(b->mem_free(b, p), RLK_OK);

  void *z = (void *)1;
  ck_assert_int_eq(b->mem_alloc(b, 0, &z), RLK_OK);
  ck_assert_ptr_null(z);
  ck_assert_int_eq(b->mem_free(b, NULL), RLK_OK);

  void *e0 = NULL, *e1 = NULL;
  ck_assert_int_eq(b->event_create(b, &e0), RLK_OK);
  ck_assert_int_eq(b->event_create(b, &e1), RLK_OK);
  float ms = -1;
  ck_assert_int_eq(b->event_elapsed_ms(b, e0, e1, &ms), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(b->event_record(b, e0, NULL), RLK_OK);
  struct timespec nap = {0, 20 * 1000 * 1000};
  nanosleep(&nap, NULL);
  ck_assert_int_eq(b->event_record(b, e1, NULL), RLK_OK);
  ck_assert_int_eq(b->event_elapsed_ms(b, e0, e1, &ms), RLK_OK);
  ck_assert_msg(ms >= 19.0f && ms < 5000.0f, "elapsed %.3f ms for a 20 ms sleep", (double)ms);
  b->event_destroy(b, e0);
  b->event_destroy(b, e1);
  b->destroy(b);
}
END_TEST

/* ---- TMA request checks ----------------------------------------------------------- */

static rlk_tma_desc_request good_request(void) {
  rlk_tma_desc_request r;
  memset(&r, 0, sizeof r);
  r.base = (const void *)(uintptr_t)0x7f0000001000ull;
  r.dtype = RLK_BF16;
  r.rows = 4096;
  r.cols = 1000;
  r.row_stride = 1024;
  r.box_rows = 64;
  r.box_cols = 64;
  return r;
}

static void expect_unsupported(const rlk_tma_desc_request *r, const char *needle) {
  rlk_status st = rlk_tma_check(r);
  ck_assert_msg(st == RLK_ERR_UNSUPPORTED, "expected unsupported (%s), got %d", needle, st);
  ck_assert_msg(strstr(rlk_last_error(), needle) != NULL, "message '%s' lacks '%s'",
                rlk_last_error(), needle);
}

START_TEST(test_tma_check_accepts) {
  rlk_tma_desc_request r = good_request();
  ck_assert_msg(rlk_tma_check(&r) == RLK_OK, "%s", rlk_last_error());
  /* Random valid requests over every dtype. */
  static const rlk_dtype dtypes[] = {RLK_F32, RLK_F16, RLK_BF16, RLK_F64, RLK_I32, RLK_I64};
  uint64_t rng = seeded_state();
  for (int i = 0; i < 500; i++) {
    rlk_dtype dt = dtypes[rlk_test_rand_u64(&rng) % 6];
    uint64_t esize = rlk_dtype_size(dt), per16 = 16 / esize;
    r.dtype = dt;
    r.base = (const void *)(uintptr_t)(0x10000ull + 16 * (rlk_test_rand_u64(&rng) % 100000));
    r.rows = 1 + rlk_test_rand_u64(&rng) % 100000;
    r.cols = 1 + rlk_test_rand_u64(&rng) % 100000;
    r.row_stride = (r.cols + per16 - 1) / per16 * per16 + per16 * (rlk_test_rand_u64(&rng) % 4);
    r.box_rows = 1 + (uint32_t)(rlk_test_rand_u64(&rng) % 256);
    r.box_cols = (uint32_t)(per16 * (1 + rlk_test_rand_u64(&rng) % (256 / per16)));
    ck_assert_msg(rlk_tma_check(&r) == RLK_OK, "%s (seed %llu)", rlk_last_error(),
                  (unsigned long long)rlk_test_seed());
  }
  /* The limits themselves are allowed. */
  r = good_request();
  r.box_rows = 256;
  r.box_cols = 256;
  r.rows = UINT64_C(1) << 32;
  ck_assert_msg(rlk_tma_check(&r) == RLK_OK, "%s", rlk_last_error());
}
END_TEST

START_TEST(test_tma_check_rejects) {
  rlk_tma_desc_request r = good_request();
  r.base = (const char *)r.base + 4;
  expect_unsupported(&r, "16-byte aligned");

  r = good_request();
  r.base = NULL;
  expect_unsupported(&r, "NULL");

  r = good_request();
  r.dtype = RLK_F32;
  r.cols = 1000;
  r.row_stride = 1001; /* 4004 bytes */
  expect_unsupported(&r, "multiple of 16");

  r = good_request();
  r.box_cols = 512; /* the 256-element box limit */
  expect_unsupported(&r, "box_cols 512 exceeds");
  r = good_request();
  r.box_rows = 512;
  expect_unsupported(&r, "box_rows 512 exceeds");

  r = good_request();
  r.dtype = RLK_F32;
  r.box_cols = 6; /* 24 bytes */
  expect_unsupported(&r, "inner box");

  r = good_request();
  r.rows = 0;
  expect_unsupported(&r, "zero");
  r = good_request();
  r.cols = 0;
  expect_unsupported(&r, "zero");
  r = good_request();
  r.box_rows = 0;
  expect_unsupported(&r, "zero");

  r = good_request();
  r.cols = (UINT64_C(1) << 32) + 1;
  r.row_stride = UINT64_C(1) << 33;
  expect_unsupported(&r, "2^32");

  r = good_request();
  r.row_stride = UINT64_C(1) << 39; /* bf16: 2^40 bytes */
  expect_unsupported(&r, "2^40");

  r = good_request();
  r.row_stride = 512; /* < cols */
  expect_unsupported(&r, "smaller than cols");

  r = good_request();
  r.dtype = RLK_BOOL;
  expect_unsupported(&r, "dtype");

  /* the 128-byte swizzle: 64 bf16 columns fit, 128 do not; only 0 and 128 exist */
  r = good_request();
  r.swizzle = 128;
  ck_assert_msg(rlk_tma_check(&r) == RLK_OK, "%s", rlk_last_error());
  r.box_cols = 128;
  expect_unsupported(&r, "128-byte swizzle");
  r = good_request();
  r.swizzle = 64;
  expect_unsupported(&r, "swizzle 64");

  ck_assert_int_eq(rlk_tma_check(NULL), RLK_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_tma_encode_needs_cuda) {
  rlk_backend_impl *b = open_host();
  rlk_tma_desc_request r = good_request();
  _Alignas(64) unsigned char map[128];
  ck_assert_int_eq(rlk_cuda_tma_encode(b, &r, map), RLK_ERR_UNSUPPORTED);
  ck_assert_int_eq(rlk_cuda_tma_encode(NULL, &r, map), RLK_ERR_UNSUPPORTED);
  b->destroy(b);
}
END_TEST

/* ---- CUDA targets and opening ----------------------------------------------------- */

/* A CUDA device compiles for its arch's "a" form where a JIT wants it (Hopper's TMA and wgmma,
 * datacenter Blackwell's tcgen05), for the plain form elsewhere (consumer Blackwell). */
START_TEST(test_cuda_device_targets) {
  static const struct {
    int major, minor;
    const char *want;
  } cases[] = {
      {7, 5, "sm_75"},   {8, 0, "sm_80"},     {8, 6, "sm_86"},     {8, 9, "sm_89"},
      {9, 0, "sm_90a"},  {10, 0, "sm_100a"},  {10, 3, "sm_103a"},  {11, 0, "sm_110"},
      {12, 0, "sm_120"}, {12, 1, "sm_121"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    rlk_target t;
    rlk_target_for_cuda_device(cases[i].major, cases[i].minor, 0, 0, 0, &t);
    ck_assert_str_eq(t.name, cases[i].want);
  }
}
END_TEST

/* The typed target: one parser for compile-only names, the device path from the same arch
 * table, and the features and limits ops read instead of re-parsing the name. */
START_TEST(test_target_parse) {
  rlk_target t;
  ck_assert_int_eq(rlk_target_parse("sm_90a", &t), RLK_OK);
  ck_assert_int_eq(t.kind, RLK_BACKEND_CUDA);
  ck_assert_str_eq(t.name, "sm_90a");
  ck_assert_int_eq(t.major, 9);
  ck_assert_int_eq(t.minor, 0);
  ck_assert_int_eq(t.variant, 'a');
  ck_assert_int_eq(t.ptx, 0);
  ck_assert_int_eq(t.warp_size, 32);
  ck_assert_uint_eq(t.features, RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA | RLK_TARGET_WGMMA);
  ck_assert_uint_eq(t.smem_per_block, 227u * 1024);
  ck_assert_uint_eq(t.smem_per_sm, 228u * 1024);
  ck_assert_int_eq(rlk_target_cuda_sm(&t), 90);

  ck_assert_int_eq(rlk_target_parse("sm_90", &t), RLK_OK); /* no wgmma without the "a" */
  ck_assert_uint_eq(t.features, RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA);
  ck_assert_int_eq(rlk_target_parse("sm_80", &t), RLK_OK);
  ck_assert_uint_eq(t.features, 0);
  ck_assert_uint_eq(t.smem_per_block, 163u * 1024);

  /* compute_<cc>: PTX for that compute capability and newer, the same features as sm_<cc> */
  ck_assert_int_eq(rlk_target_parse("compute_90", &t), RLK_OK);
  ck_assert_int_eq(t.kind, RLK_BACKEND_CUDA);
  ck_assert_str_eq(t.name, "compute_90");
  ck_assert_int_eq(t.ptx, 1);
  ck_assert_int_eq(rlk_target_cuda_sm(&t), 90);
  ck_assert_uint_eq(t.features, RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA);
  ck_assert_int_eq(rlk_target_parse("compute_90a", &t), RLK_OK);
  ck_assert_uint_eq(t.features & RLK_TARGET_WGMMA, RLK_TARGET_WGMMA);
  ck_assert_int_eq(rlk_target_parse("compute_80", &t), RLK_OK);
  ck_assert_uint_eq(t.features, 0);

  /* Blackwell: datacenter (10.x) has tcgen05 through its "a" and "f" forms and no wgmma;
   * consumer (12.x) has neither. A newer arch is no superset of an older one. */
  static const struct {
    const char *name;
    int sm;
    char variant;
    unsigned features;
    unsigned smem_kib;
  } blackwell[] = {
      {"sm_100a", 100, 'a', RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA | RLK_TARGET_TCGEN05, 227},
      {"sm_100f", 100, 'f', RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA | RLK_TARGET_TCGEN05, 227},
      {"sm_100", 100, 0, RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA, 227},
      {"sm_103a", 103, 'a', RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA | RLK_TARGET_TCGEN05, 227},
      {"sm_120a", 120, 'a', RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA, 99},
      {"sm_121a", 121, 'a', RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA, 99},
  };
  for (size_t i = 0; i < sizeof blackwell / sizeof blackwell[0]; i++) {
    ck_assert_int_eq(rlk_target_parse(blackwell[i].name, &t), RLK_OK);
    ck_assert_str_eq(t.name, blackwell[i].name);
    ck_assert_int_eq(rlk_target_cuda_sm(&t), blackwell[i].sm);
    ck_assert_int_eq(t.variant, blackwell[i].variant);
    ck_assert_uint_eq(t.features, blackwell[i].features);
    ck_assert_uint_eq(t.smem_per_block, blackwell[i].smem_kib * 1024u);
  }

  ck_assert_int_eq(rlk_target_parse("gfx90a:xnack-", &t), RLK_OK);
  ck_assert_int_eq(t.kind, RLK_BACKEND_HIP);
  ck_assert_str_eq(t.name, "gfx90a");
  ck_assert_int_eq(t.major, 9);
  ck_assert_int_eq(t.stepping, 10);
  ck_assert_int_eq(t.warp_size, 64);
  ck_assert_int_eq(rlk_target_cuda_sm(&t), 0);
  ck_assert_int_eq(rlk_target_parse("gfx90a:sramecc+:xnack-", &t), RLK_OK);
  ck_assert_str_eq(t.name, "gfx90a");
  ck_assert_int_eq(rlk_target_parse("gfx1100", &t), RLK_OK);
  ck_assert_int_eq(t.major, 11);
  ck_assert_int_eq(t.warp_size, 64); /* the templates need -mwavefrontsize64 */

  ck_assert_int_eq(rlk_target_parse("host-x86_64", &t), RLK_OK);
  ck_assert_int_eq(t.kind, RLK_BACKEND_HOST);
  ck_assert_uint_eq(t.features, 0);
  ck_assert_int_eq(rlk_target_parse("host", &t), RLK_OK); /* this machine's */
  ck_assert_str_eq(t.name, rlk_host_target());

  static const char *const bad[] = {"",        "sm_",         "sm_9",    "sm_90b",      "sm_90aa", "sm_090",
                                    "sm_80a",  "sm_90f",      "sm_89a",  "compute_",    "comp_90", "gfx",
                                    "gfx9",    "gfx90a:bogus+", "gfx90a:xnack", "gfx9g0", "host-",  "host-a/b",
                                    "x86",     NULL};
  for (int i = 0; bad[i]; i++)
    ck_assert_msg(rlk_target_parse(bad[i], &t) == RLK_ERR_INVALID_ARGUMENT, "'%s' parsed", bad[i]);
}
END_TEST

/* Every spelling of a target gives one name, and every target its own: the name is the key's
 * target, so two names for one code would split the cache, and one name for two codes mix it. */
START_TEST(test_target_names) {
  static const char *const same[][2] = {{"gfx90a:sramecc-:xnack+", "gfx90a"}, {"gfx942:xnack-", "gfx942"}};
  for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
    rlk_target t;
    ck_assert_int_eq(rlk_target_parse(same[i][0], &t), RLK_OK);
    ck_assert_str_eq(t.name, same[i][1]);
  }
  static const char *const distinct[] = {"sm_90",      "sm_90a",      "compute_90", "compute_90a", "sm_100",
                                         "sm_100a",    "sm_100f",     "sm_103a",    "sm_103f",     "sm_110a",
                                         "sm_120",     "sm_120a",     "sm_120f",    "sm_121a",     "compute_100f",
                                         "gfx90a",     "gfx942",      "gfx1100",    "host-x86_64", "host-aarch64"};
  const size_t n = sizeof distinct / sizeof distinct[0];
  for (size_t i = 0; i < n; i++) {
    rlk_target t;
    char again[32];
    ck_assert_msg(rlk_target_parse(distinct[i], &t) == RLK_OK, "%s: %s", distinct[i], rlk_last_error());
    ck_assert_str_eq(t.name, distinct[i]); /* canonical spellings stay as they are */
    ck_assert_int_ge(rlk_target_name(&t, again, sizeof again), 0);
    ck_assert_str_eq(again, t.name);
    for (size_t j = 0; j < i; j++) ck_assert_str_ne(distinct[j], t.name);
  }
  ck_assert_int_eq(rlk_target_backend("compute_90"), RLK_BACKEND_CUDA);
  ck_assert_int_eq(rlk_target_backend("sm_100f"), RLK_BACKEND_CUDA);
  ck_assert_int_eq(rlk_target_backend("gfx90a:xnack-"), RLK_BACKEND_HIP);
  ck_assert_int_eq(rlk_target_backend("host"), RLK_BACKEND_HOST);
  ck_assert_int_eq(rlk_target_backend("host-x86_64"), RLK_BACKEND_HOST);
  ck_assert_int_eq(rlk_target_backend("sm_9x"), RLK_BACKEND_AUTO);
  ck_assert_int_eq(rlk_target_backend(NULL), RLK_BACKEND_AUTO);
}
END_TEST

/* One table says which archs have an "a" or "f" form (a compiler lists them) and which a device
 * compiles for; the device path and the parser agree on every row. */
START_TEST(test_target_arch_table) {
  static const int sms[] = {75, 80, 86, 89, 90, 100, 101, 103, 110, 120, 121};
  for (size_t i = 0; i < sizeof sms / sizeof sms[0]; i++) {
    rlk_target dev, parsed;
    rlk_target_for_cuda_device(sms[i] / 10, sms[i] % 10, 7, 0, 0, &dev);
    ck_assert_int_eq(dev.multiprocessors, 7);
    ck_assert_int_eq(rlk_target_parse(dev.name, &parsed), RLK_OK);
    ck_assert_int_eq(parsed.major, dev.major);
    ck_assert_int_eq(parsed.minor, dev.minor);
    ck_assert_uint_eq(parsed.features, dev.features);
    ck_assert_uint_eq(parsed.smem_per_block, dev.smem_per_block);
    if (dev.variant) ck_assert(rlk_target_cuda_has_variant(sms[i], dev.variant));
  }
  ck_assert(!rlk_target_cuda_has_variant(80, 'a'));
  ck_assert(rlk_target_cuda_has_variant(120, 'a'));
  ck_assert(!rlk_target_cuda_has_variant(90, 'f'));
  ck_assert(rlk_target_cuda_has_variant(100, 'f'));
  rlk_target dev;
  rlk_target_for_cuda_device(9, 0, 132, 200000, 210000, &dev); /* the device's own limits win */
  ck_assert_uint_eq(dev.smem_per_block, 200000);
  ck_assert_uint_eq(dev.smem_per_sm, 210000);
}
END_TEST

/* RLK_ARCH replaces a device's arch but keeps its counts; another vendor's name is ignored. */
START_TEST(test_target_env_override) {
  rlk_target t;
  rlk_target_for_cuda_device(9, 0, 132, 0, 0, &t);
  setenv("RLK_ARCH", "sm_80", 1);
  ck_assert_int_eq(rlk_target_apply_env(RLK_BACKEND_CUDA, &t), RLK_OK);
  ck_assert_str_eq(t.name, "sm_80");
  ck_assert_int_eq(t.multiprocessors, 132);
  ck_assert_uint_eq(t.features, 0);
  setenv("RLK_ARCH", "gfx90a", 1);
  ck_assert_int_eq(rlk_target_apply_env(RLK_BACKEND_CUDA, &t), RLK_OK);
  ck_assert_str_eq(t.name, "sm_80");
  setenv("RLK_ARCH", "sm_9x", 1);
  ck_assert_int_eq(rlk_target_apply_env(RLK_BACKEND_CUDA, &t), RLK_ERR_INVALID_ARGUMENT);
  unsetenv("RLK_ARCH");
}
END_TEST

/* The SMs clusters keep busy are the device's, like its multiprocessors: RLK_ARCH naming the
 * device's own arch leaves its target as it was, and another arch keeps them too. */
START_TEST(test_target_env_keeps_cluster_sms) {
  rlk_target dev, t;
  rlk_target_for_cuda_device(9, 0, 132, 0, 0, &dev);
  const int cluster_sms[RLK_TARGET_CLUSTER_SIZES] = {0, 132, 128, 120};
  memcpy(dev.cluster_sms, cluster_sms, sizeof cluster_sms);
  static const char *const archs[] = {"sm_90a", "sm_90", "compute_90a"};
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
    t = dev;
    setenv("RLK_ARCH", archs[i], 1);
    ck_assert_int_eq(rlk_target_apply_env(RLK_BACKEND_CUDA, &t), RLK_OK);
    ck_assert_str_eq(t.name, archs[i]);
    ck_assert_int_eq(t.multiprocessors, 132);
    for (int c = 0; c < RLK_TARGET_CLUSTER_SIZES; c++)
      ck_assert_msg(t.cluster_sms[c] == cluster_sms[c], "RLK_ARCH=%s: cluster_sms[%d] %d, want %d", archs[i], c,
                    t.cluster_sms[c], cluster_sms[c]);
  }
  unsetenv("RLK_ARCH");
}
END_TEST

/* Device 0 of a backend opened here (st, b: what the open gave): 1 when it opened; else 0, after
 * checking it is unavailable, with no handle and a message that starts with `name`. */
static int opened_here(rlk_status st, const rlk_backend_impl *b, const char *name) {
  if (st == RLK_OK) return 1;
  ck_assert_int_eq(st, RLK_ERR_UNAVAILABLE);
  ck_assert_ptr_null(b);
  ck_assert_msg(strncmp(rlk_last_error(), name, strlen(name)) == 0, "message: %s", rlk_last_error());
  printf("%s backend unavailable here: %s\n", name, rlk_last_error());
  return 0;
}

/* Past the last device: a bad request when the backend is here, still unavailable when it is
 * not (only the latter lets an automatic backend choice move on); device -1 is a bad request. */
static void expect_device_range(rlk_status (*open)(int, rlk_backend_impl **), int present) {
  rlk_backend_impl *b = (rlk_backend_impl *)1;
  ck_assert_int_eq(open(4096, &b), present ? RLK_ERR_INVALID_ARGUMENT : RLK_ERR_UNAVAILABLE);
  ck_assert_ptr_null(b);
  ck_assert_int_eq(open(-1, &b), RLK_ERR_INVALID_ARGUMENT);
}

START_TEST(test_cuda_open_here) {
  rlk_backend_impl *b = (rlk_backend_impl *)1;
  rlk_status st = rlk_cuda_backend_open(0, &b);
  const int present = opened_here(st, b, "cuda");
  if (present) {
    ck_assert_int_eq(b->kind, RLK_BACKEND_CUDA);
    ck_assert_msg(strncmp(b->info.target, "sm_", 3) == 0, "target %s", b->info.target);
    ck_assert_int_gt(b->info.multiprocessors, 0);
    ck_assert_int_gt(b->info.compute_major, 0);
    b->destroy(b);
  }
  expect_device_range(rlk_cuda_backend_open, present);
  ck_assert_int_eq(rlk_cuda_backend_open(0, NULL), RLK_ERR_INVALID_ARGUMENT);
}
END_TEST

/* What every device backend's open starts with: the checks on out and the ordinal, named by the
 * backend, then a backend with its zeroed state. */
START_TEST(test_backend_alloc) {
  rlk_backend_impl *out = (rlk_backend_impl *)1, *b = (rlk_backend_impl *)1;
  ck_assert_int_eq(rlk_backend_alloc("gpu", 0, 16, NULL, &b), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "gpu: out is NULL");
  ck_assert_ptr_null(b);
  ck_assert_int_eq(rlk_backend_alloc("gpu", -2, 16, &out, &b), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_str_eq(rlk_last_error(), "gpu: device ordinal -2 is negative");
  ck_assert_ptr_null(out);
  ck_assert_ptr_null(b);
  out = (rlk_backend_impl *)1;
  ck_assert_int_eq(rlk_backend_alloc("gpu", 3, 16, &out, &b), RLK_OK);
  ck_assert_ptr_null(out); /* the caller's open writes it once it has opened */
  ck_assert_ptr_nonnull(b);
  ck_assert_ptr_nonnull(b->impl);
  const unsigned char *state = b->impl;
  for (int i = 0; i < 16; i++) ck_assert_int_eq(state[i], 0);
  ck_assert_ptr_null(b->launch);
  free(b->impl);
  free(b);
}
END_TEST

START_TEST(test_hip_open_here) {
  rlk_backend_impl *b = (rlk_backend_impl *)1;
  rlk_status st;
  /* An explicit library that does not exist is reported by name, with no fallback. This
   * runs first: once a runtime has loaded, the process keeps it (so it needs the forked
   * test process Check gives by default). */
  const char *fork_mode = getenv("CK_FORK");
  if (!fork_mode || strcmp(fork_mode, "no") != 0) {
    const char *old = getenv("RLK_HIP_LIB");
    char *saved = old ? strdup(old) : NULL;
    setenv("RLK_HIP_LIB", "/nonexistent/rlk/libamdhip64.so", 1);
    st = rlk_hip_backend_open(0, &b);
    if (saved) {
      setenv("RLK_HIP_LIB", saved, 1);
      free(saved);
    } else {
      unsetenv("RLK_HIP_LIB");
    }
    ck_assert_int_eq(st, RLK_ERR_UNAVAILABLE);
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(rlk_last_error(), "/nonexistent/rlk/libamdhip64.so") != NULL,
                  "message: %s", rlk_last_error());
  }
  /* The default search: OK with an AMD GPU, else unavailable (a runtime without a device
   * included). */
  b = (rlk_backend_impl *)1;
  st = rlk_hip_backend_open(0, &b);
  const int present = opened_here(st, b, "hip");
  if (present) {
    ck_assert_int_eq(b->kind, RLK_BACKEND_HIP);
    ck_assert_msg(strncmp(b->info.target, "gfx", 3) == 0, "target %s", b->info.target);
    ck_assert_ptr_null(strchr(b->info.target, ':'));
    b->destroy(b);
  }
  expect_device_range(rlk_hip_backend_open, present);
}
END_TEST

/* ---- CUDA over a stand-in driver: statuses and the caller's current context -------- */

/* A stand-in libcuda.so.1 (built by the test, loaded under that soname before the backend
 * looks for the driver) that keeps a current context per thread the way the driver does,
 * counts context switches, and refuses work when any context but the device's primary one
 * is current. Its failures are set through stub_configure. */
static const char *const stub_driver_source =
    "#include <stddef.h>\n"
    "#include <string.h>\n"
    "typedef int R;\n"
    "static _Thread_local void *current;\n"
    "static char primary, other, module, function, event;\n"
    "static int devices = 1, init_err, get_err, retain_err, retains, switches, misplaced;\n"
    "static char fail_name[64];\n"
    "static int fail_err;\n"
    "void stub_configure(int n, int init_e, int get_e, int retain_e) {\n"
    "  devices = n; init_err = init_e; get_err = get_e; retain_err = retain_e;\n"
    "}\n"
    "void stub_fail(const char *name, int e) {\n"
    "  strncpy(fail_name, name, sizeof fail_name - 1); fail_err = e;\n"
    "}\n"
    "static R failing(const char *name) { return fail_err && !strcmp(fail_name, name) ? fail_err : 0; }\n"
    "void *stub_primary(void) { return &primary; }\n"
    "void *stub_other(void) { return &other; }\n"
    "void *stub_current(void) { return current; }\n"
    "void stub_place(void *ctx) { current = ctx; }\n"
    "int stub_switches(void) { return switches; }\n"
    "int stub_misplaced(void) { return misplaced; }\n"
    "int stub_retains(void) { return retains; }\n"
    "static R work(void) {\n"
    "  if (current == &primary) return 0;\n"
    "  misplaced++;\n"
    "  return 201;\n"
    "}\n"
    "R cuInit(unsigned f) { (void)f; return init_err; }\n"
    "R cuGetErrorName(R e, const char **s) { *s = e ? \"CUDA_ERROR_STUB\" : \"CUDA_SUCCESS\"; return 0; }\n"
    "R cuGetErrorString(R e, const char **s) { (void)e; *s = \"stand-in\"; return 0; }\n"
    "R cuDeviceGetCount(int *n) { *n = devices; return 0; }\n"
    "R cuDeviceGet(int *d, int o) { if (get_err) return get_err; *d = o; return 0; }\n"
    "R cuDeviceGetName(char *n, int len, int d) { (void)d; strncpy(n, \"stub\", (size_t)len); return 0; }\n"
    "R cuDeviceGetAttribute(int *v, int a, int d) {\n"
    "  (void)d;\n"
    "  *v = a == 75 ? 9 : a == 76 ? 0 : a == 16 ? 132 : a == 97 ? 232448 : 0;\n"
    "  return 0;\n"
    "}\n"
    "R cuDeviceTotalMem_v2(size_t *b, int d) { (void)d; *b = (size_t)1 << 30; return 0; }\n"
    "R cuDevicePrimaryCtxRetain(void **c, int d) {\n"
    "  (void)d;\n"
    "  if (retain_err) return retain_err;\n"
    "  retains++;\n"
    "  *c = &primary;\n"
    "  return 0;\n"
    "}\n"
    "R cuDevicePrimaryCtxRelease_v2(int d) { (void)d; retains--; return 0; }\n"
    "R cuDevicePrimaryCtxRelease(int d) { (void)d; retains--; return 0; }\n"
    "R cuCtxGetCurrent(void **c) { *c = current; return 0; }\n"
    "R cuCtxSetCurrent(void *c) {\n"
    "  if (failing(\"cuCtxSetCurrent\")) return failing(\"cuCtxSetCurrent\");\n"
    "  switches++; current = c; return 0;\n"
    "}\n"
    "R cuCtxSynchronize(void) { return work(); }\n"
    "R cuModuleLoadData(void **m, const void *i) { (void)i; *m = &module; return work(); }\n"
    "R cuModuleUnload(void *m) { (void)m; return failing(\"cuModuleUnload\") ? failing(\"cuModuleUnload\") : work(); }\n"
    "R cuModuleGetFunction(void **f, void *m, const char *name) {\n"
    "  (void)m;\n"
    "  R r = work();\n"
    "  if (r) return r;\n"
    "  if (strcmp(name, \"rlk_stub_kernel\") != 0) return 500;\n"
    "  *f = &function;\n"
    "  return 0;\n"
    "}\n"
    "R cuFuncSetAttribute(void *f, int a, int v) {\n"
    "  (void)f; (void)a; (void)v;\n"
    "  return failing(\"cuFuncSetAttribute\") ? failing(\"cuFuncSetAttribute\") : work();\n"
    "}\n"
    "R cuFuncGetAttribute(int *v, int a, void *f) {\n"
    "  (void)a; (void)f; *v = 0;\n"
    "  return failing(\"cuFuncGetAttribute\") ? failing(\"cuFuncGetAttribute\") : work();\n"
    "}\n"
    "R cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,\n"
    "                 unsigned bz, unsigned sh, void *s, void **p, void **e) {\n"
    "  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh;\n"
    "  (void)s; (void)p; (void)e;\n"
    "  return work();\n"
    "}\n"
    "R cuMemAlloc_v2(unsigned long long *p, size_t n) { (void)n; *p = 0x10000; return work(); }\n"
    "R cuMemFree_v2(unsigned long long p) { (void)p; return work(); }\n"
    "R cuMemcpyHtoD_v2(unsigned long long d, const void *s, size_t n) {\n"
    "  (void)d; (void)s; (void)n;\n"
    "  return work();\n"
    "}\n"
    "R cuMemcpyDtoH_v2(void *d, unsigned long long s, size_t n) {\n"
    "  (void)s;\n"
    "  memset(d, 0, n);\n"
    "  return work();\n"
    "}\n"
    "R cuMemsetD8_v2(unsigned long long d, unsigned char v, size_t n) {\n"
    "  (void)d; (void)v; (void)n;\n"
    "  return work();\n"
    "}\n"
    "R cuStreamSynchronize(void *s) { (void)s; return work(); }\n"
    "R cuEventCreate(void **e, unsigned f) { (void)f; *e = &event; return work(); }\n"
    "R cuEventRecord(void *e, void *s) { (void)e; (void)s; return work(); }\n"
    "R cuEventSynchronize(void *e) { (void)e; return work(); }\n"
    "R cuEventElapsedTime_v2(float *ms, void *a, void *b) { (void)a; (void)b; *ms = 1.0f; return work(); }\n"
    "R cuEventDestroy_v2(void *e) { (void)e; return failing(\"cuEventDestroy\") ? failing(\"cuEventDestroy\") : work(); }\n";

typedef struct stub_driver {
  void (*configure)(int devices, int init_err, int get_err, int retain_err);
  void (*fail_call)(const char *name, int err); /* the named call fails with err; 0: none */
  void *(*primary)(void);
  void *(*other)(void);
  void *(*current)(void);
  void (*place)(void *ctx);
  int (*switches)(void);
  int (*misplaced)(void);
  int (*retains)(void);
} stub_driver;

/* A stand-in library built from `source` (soname: NULL for none) in a new directory under `stem`
 * and loaded, its path in so_path; NULL (and why, printed) when the test process is not forked,
 * since the backend keeps the first library it loads for the life of the process. */
static void *stub_library_load(const char *what, const char *source, const char *stem, const char *soname,
                               char *so_path, size_t size) {
  const char *fork_mode = getenv("CK_FORK");
  if (fork_mode && strcmp(fork_mode, "no") == 0) {
    printf("skip (backend: %s): needs a forked test process (CK_FORK=no)\n", what);
    return NULL;
  }
  char dir[1200];
  rlk_test_mkdtemp(dir, sizeof dir, stem);
  compile_shared_object(source, dir, soname, so_path, size);
  void *lib = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(lib != NULL, "%s: %s", what, dlerror());
  return lib;
}

/* Builds and loads the stand-in driver; 0 (and why, printed) when this process cannot use
 * one: a driver already loaded, or a test process that is not forked (the backend keeps the
 * first driver it finds for the life of the process). */
static int stub_driver_load(stub_driver *stub) {
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
    printf("skip (backend: cuda stand-in driver): a CUDA driver is already loaded\n");
    return 0;
  }
  char so_path[1300];
  void *lib = stub_library_load("cuda stand-in driver", stub_driver_source, "backend-stub-cuda", "libcuda.so.1",
                                so_path, sizeof so_path);
  if (!lib) return 0;
  *strrchr(so_path, '/') = '\0';
  rlk_test_rmtree(so_path); /* mapped: the file is no longer needed */
  stub->configure = (void (*)(int, int, int, int))dlsym(lib, "stub_configure");
  stub->fail_call = (void (*)(const char *, int))dlsym(lib, "stub_fail");
  stub->primary = (void *(*)(void))dlsym(lib, "stub_primary");
  stub->other = (void *(*)(void))dlsym(lib, "stub_other");
  stub->current = (void *(*)(void))dlsym(lib, "stub_current");
  stub->place = (void (*)(void *))dlsym(lib, "stub_place");
  stub->switches = (int (*)(void))dlsym(lib, "stub_switches");
  stub->misplaced = (int (*)(void))dlsym(lib, "stub_misplaced");
  stub->retains = (int (*)(void))dlsym(lib, "stub_retains");
  ck_assert(stub->configure && stub->fail_call && stub->primary && stub->other && stub->current && stub->place &&
            stub->switches && stub->misplaced && stub->retains);
  return 1;
}

/* Case i of an open-status table: opening device `ordinal` gives `want`; an opened backend is
 * for `target` and is returned, a failed open leaves no handle, says `message` and returns NULL. */
static rlk_backend_impl *open_as_wanted(rlk_status (*open)(int ordinal, rlk_backend_impl **b), int ordinal,
                                        rlk_status want, const char *message, const char *target, size_t i) {
  rlk_backend_impl *b = (rlk_backend_impl *)1;
  rlk_status st = open(ordinal, &b);
  ck_assert_msg(st == want, "case %zu: status %d, want %d (%s)", i, st, want, rlk_last_error());
  if (st == RLK_OK) {
    ck_assert_str_eq(b->info.target, target);
    return b;
  }
  ck_assert_ptr_null(b);
  ck_assert_msg(strstr(rlk_last_error(), message) != NULL, "case %zu: message %s", i, rlk_last_error());
  return NULL;
}

START_TEST(test_cuda_stub_open_statuses) {
  stub_driver stub;
  if (!stub_driver_load(&stub)) return;
  struct {
    int devices, init_err, get_err, retain_err, ordinal;
    rlk_status want;
    const char *message;
  } cases[] = {
      {1, 100, 0, 0, 0, RLK_ERR_UNAVAILABLE, "cuda: cuInit: CUDA_ERROR_STUB"},
      {0, 0, 0, 0, 0, RLK_ERR_UNAVAILABLE, "cuda: no CUDA device is present"},
      {1, 0, 0, 0, 3, RLK_ERR_INVALID_ARGUMENT, "cuda: device 3 requested, but only 1 present"},
      {2, 0, 0, 0, 2, RLK_ERR_INVALID_ARGUMENT, "cuda: device 2 requested, but only 2 present"},
      {1, 0, 101, 0, 0, RLK_ERR_BACKEND, "cuda: cuDeviceGet: CUDA_ERROR_STUB"},
      {1, 0, 0, 2, 0, RLK_ERR_BACKEND, "cuda: cuDevicePrimaryCtxRetain: CUDA_ERROR_STUB"},
      {2, 0, 0, 0, 1, RLK_OK, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    stub.configure(cases[i].devices, cases[i].init_err, cases[i].get_err, cases[i].retain_err);
    rlk_backend_impl *b =
        open_as_wanted(rlk_cuda_backend_open, cases[i].ordinal, cases[i].want, cases[i].message, "sm_90a", i);
    if (b) {
      ck_assert_int_eq(stub.retains(), 1);
      b->destroy(b);
    }
    ck_assert_int_eq(stub.retains(), 0); /* a failed open keeps nothing */
    ck_assert_ptr_null(stub.current());
  }
}
END_TEST

/* A stand-in driver's view of one round, started with the caller's context or device (`start`)
 * current: whether `start` is current again (`after` names the call just made, for the failure
 * message), the driver's counters of context switches and of work done outside the backend's
 * own, and whether `start` already is the backend's (then the round switches nothing). */
typedef struct stub_view {
  void (*expect_start_current)(const struct stub_view *v, const char *after);
  int (*switches)(void);
  int (*misplaced)(void);
  int start_is_ours;
} stub_view;

/* Opens device `ordinal` and runs every backend entry point once, checking after each call that
 * `start` is current again; the stand-in refuses any work done outside the backend's context, so
 * success also proves each call ran there. `image` is a module the stand-in loads; `block` the
 * launch's threads; opt_in: a second launch with 100 KiB of shared memory (the opt-in path). */
static void stub_walk_entry_points(const stub_view *v, rlk_status (*open)(int ordinal, rlk_backend_impl **b),
                                   int ordinal, const char *image, size_t image_size, unsigned block, int opt_in) {
#define STUB_STEP(call)                                                                   \
  do {                                                                                    \
    rlk_status st_ = (call);                                                              \
    ck_assert_msg(st_ == RLK_OK, "%s: %s", #call, rlk_last_error());                      \
    v->expect_start_current(v, #call);                                                    \
  } while (0)
  const int switches0 = v->switches();
  rlk_backend_impl *b = NULL;
  STUB_STEP(open(ordinal, &b));
  void *module = NULL, *fn = NULL, *missing = NULL, *d = NULL, *e0 = NULL, *e1 = NULL;
  char host[64] = {0};
  float ms = 0;
  STUB_STEP(b->module_load(b, image, image_size, &module));
  STUB_STEP(b->get_function(b, module, "rlk_stub_kernel", &fn));
  /* A failing call restores the context too. */
  ck_assert_int_eq(b->get_function(b, module, "rlk_no_such_kernel", &missing), RLK_ERR_BACKEND);
  v->expect_start_current(v, "a failed get_function");
  STUB_STEP(b->mem_alloc(b, sizeof host, &d));
  STUB_STEP(b->copy_to_device(b, d, host, sizeof host));
  STUB_STEP(b->event_create(b, &e0));
  STUB_STEP(b->event_create(b, &e1));
  STUB_STEP(b->event_record(b, e0, NULL));
  rlk_launch_dims dims = {{1, 1, 1}, {block, 1, 1}, 0};
  void *args[] = {&d};
  STUB_STEP(b->launch(b, fn, &dims, NULL, args));
  if (opt_in) {
    dims.shared_bytes = 100 * 1024;
    STUB_STEP(b->launch(b, fn, &dims, NULL, args));
  }
  STUB_STEP(b->event_record(b, e1, NULL));
  STUB_STEP(b->synchronize(b, NULL));
  STUB_STEP(b->event_elapsed_ms(b, e0, e1, &ms));
  STUB_STEP(b->mem_set(b, d, 7, sizeof host));
  STUB_STEP(b->copy_to_host(b, host, d, sizeof host));
  b->event_destroy(b, e0);
  b->event_destroy(b, e1);
  v->expect_start_current(v, "event_destroy");
  STUB_STEP(b->mem_free(b, d));
  b->module_unload(b, module);
  v->expect_start_current(v, "module_unload");
  b->destroy(b);
  v->expect_start_current(v, "destroy");
#undef STUB_STEP
  ck_assert_int_eq(v->misplaced(), 0);
  if (v->start_is_ours) ck_assert_int_eq(v->switches(), switches0);
  else ck_assert_int_gt(v->switches(), switches0);
}

/* The CUDA stand-in's round: `start` the context current on this thread. */
typedef struct cuda_round {
  stub_view view;
  const stub_driver *stub;
  void *start;
} cuda_round;

static void cuda_expect_start_current(const stub_view *v, const char *after) {
  const cuda_round *r = (const cuda_round *)v;
  ck_assert_msg(r->stub->current() == r->start, "after %s: %p current, want %p", after, r->stub->current(),
                r->start);
}

/* Every entry point once with `start` current on this thread; `start` is current after each. */
static void stub_round(const stub_driver *stub, void *start) {
  static const char ptx[] = ".version 8.0\n.target sm_90a\n";
  stub->place(start);
  /* The caller already on the primary context (a framework on the same device) costs no
   * switch at all. */
  const cuda_round round = {{cuda_expect_start_current, stub->switches, stub->misplaced, start == stub->primary()},
                            stub, start};
  stub_walk_entry_points(&round.view, rlk_cuda_backend_open, 0, ptx, sizeof ptx, 32, 1);
  ck_assert_int_eq(stub->retains(), 0);
}

typedef struct stub_thread {
  const stub_driver *stub;
  void *seen_before, *seen_after;
  rlk_status status;
} stub_thread;

/* A fresh thread (no context current) launching through a backend opened elsewhere. */
static void *stub_launch_on_thread(void *arg) {
  stub_thread *t = arg;
  t->seen_before = t->stub->current();
  rlk_backend_impl *b = NULL;
  t->status = rlk_cuda_backend_open(0, &b);
  if (t->status == RLK_OK) {
    t->status = b->synchronize(b, NULL);
    b->destroy(b);
  }
  t->seen_after = t->stub->current();
  return NULL;
}

START_TEST(test_cuda_stub_keeps_callers_context) {
  stub_driver stub;
  if (!stub_driver_load(&stub)) return;
  stub.configure(1, 0, 0, 0);
  stub_round(&stub, NULL);           /* nothing current: nothing current after */
  stub_round(&stub, stub.other());   /* another context (another device's): kept */
  stub_round(&stub, stub.primary()); /* already ours: no switch */
  stub_round(&stub, NULL);
  stub.place(NULL);
  stub_thread t = {&stub, (void *)1, (void *)1, RLK_ERR_INTERNAL};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, stub_launch_on_thread, &t), 0);
  pthread_join(th, NULL);
  ck_assert_int_eq(t.status, RLK_OK);
  ck_assert_ptr_null(t.seen_before);
  ck_assert_ptr_null(t.seen_after);
  ck_assert_int_eq(stub.misplaced(), 0);
}
END_TEST

/* A kernel lookup that fails in the shared-memory opt-in names the attribute call that failed. */
START_TEST(test_cuda_stub_function_attribute_failures) {
  stub_driver stub;
  if (!stub_driver_load(&stub)) return;
  stub.configure(1, 0, 0, 0);
  static const char ptx[] = ".version 8.0\n.target sm_90a\n";
  rlk_backend_impl *b = NULL;
  ck_assert_int_eq(rlk_cuda_backend_open(0, &b), RLK_OK);
  void *module = NULL;
  ck_assert_int_eq(b->module_load(b, ptx, sizeof ptx, &module), RLK_OK);
  static const char *const calls[] = {"cuFuncGetAttribute", "cuFuncSetAttribute"};
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    void *fn = (void *)1;
    stub.fail_call(calls[i], 1);
    ck_assert_int_eq(b->get_function(b, module, "rlk_stub_kernel", &fn), RLK_ERR_BACKEND);
    ck_assert_ptr_null(fn);
    char want[64];
    snprintf(want, sizeof want, "cuda: %s: ", calls[i]);
    ck_assert_msg(strncmp(rlk_last_error(), want, strlen(want)) == 0, "message: %s", rlk_last_error());
  }
  stub.fail_call("", 0);
  b->module_unload(b, module);
  b->destroy(b);
  ck_assert_ptr_null(stub.current());
}
END_TEST

/* An unload or a destroy that fails is a warning: the thread's last error stays the failure
 * being reported (the JIT unloads a module whose kernel lookup failed, then returns that
 * lookup's status), whether the driver call or the switch to the device's context fails. */
START_TEST(test_cuda_stub_cleanup_keeps_last_error) {
  stub_driver stub;
  if (!stub_driver_load(&stub)) return;
  stub.configure(1, 0, 0, 0);
  static const char ptx[] = ".version 8.0\n.target sm_90a\n";
  rlk_backend_impl *b = NULL;
  ck_assert_int_eq(rlk_cuda_backend_open(0, &b), RLK_OK);
  void *module = NULL, *fn = NULL, *event = NULL;
  ck_assert_int_eq(b->module_load(b, ptx, sizeof ptx, &module), RLK_OK);
  ck_assert_int_eq(b->event_create(b, &event), RLK_OK);
  ck_assert_int_eq(b->get_function(b, module, "rlk_no_such_kernel", &fn), RLK_ERR_BACKEND);
  char want[512];
  snprintf(want, sizeof want, "%s", rlk_last_error());
  ck_assert_msg(strstr(want, "rlk_no_such_kernel") != NULL, "message: %s", want);
  stub.fail_call("cuModuleUnload", 700);
  b->module_unload(b, module);
  ck_assert_str_eq(rlk_last_error(), want);
  stub.place(stub.other()); /* the destroy has to switch, and the switch fails */
  stub.fail_call("cuCtxSetCurrent", 201);
  b->event_destroy(b, event);
  ck_assert_str_eq(rlk_last_error(), want);
  ck_assert_ptr_eq(stub.current(), stub.other());
  stub.fail_call("", 0);
  stub.place(NULL);
  b->destroy(b);
}
END_TEST

/* ---- HIP over a stand-in runtime: statuses and the caller's current device --------- */

/* A stand-in libamdhip64 (loaded through RLK_HIP_LIB) with a current device per thread
 * (0 on a fresh thread, as in HIP) that counts device switches and refuses work on any
 * device but the one opened, `stub_configure`'s `target`. */
static const char *const hip_stub_source =
    "#include <stddef.h>\n"
    "#include <string.h>\n"
    "typedef int E;\n"
    "static _Thread_local int current;\n"
    "static char module, function, event, memory[64];\n"
    "static int devices = 2, target = 1, init_err, get_err, switches, misplaced;\n"
    "static char fail_name[64];\n"
    "static int fail_err;\n"
    "void stub_configure(int n, int t, int init_e, int get_e) {\n"
    "  devices = n; target = t; init_err = init_e; get_err = get_e;\n"
    "}\n"
    "void stub_fail(const char *name, int e) {\n"
    "  strncpy(fail_name, name, sizeof fail_name - 1); fail_err = e;\n"
    "}\n"
    "static E failing(const char *name) { return fail_err && !strcmp(fail_name, name) ? fail_err : 0; }\n"
    "int stub_current(void) { return current; }\n"
    "void stub_place(int d) { current = d; }\n"
    "int stub_switches(void) { return switches; }\n"
    "int stub_misplaced(void) { return misplaced; }\n"
    "static E work(void) {\n"
    "  if (current == target) return 0;\n"
    "  misplaced++;\n"
    "  return 101;\n"
    "}\n"
    "E hipInit(unsigned f) { (void)f; return init_err; }\n"
    "const char *hipGetErrorName(E e) { return e ? \"hipErrorStub\" : \"hipSuccess\"; }\n"
    "const char *hipGetErrorString(E e) { (void)e; return \"stand-in\"; }\n"
    "E hipGetDeviceCount(int *n) { *n = devices; return devices ? 0 : 100; }\n"
    "E hipGetDevice(int *d) { *d = current; return 0; }\n"
    "E hipSetDevice(int d) {\n"
    "  if (failing(\"hipSetDevice\")) return failing(\"hipSetDevice\");\n"
    "  if (d < 0 || d >= devices) return 101;\n"
    "  switches++; current = d; return 0;\n"
    "}\n"
    "E hipDeviceGet(int *d, int o) { if (get_err) return get_err; *d = o; return 0; }\n"
    "E hipDeviceGetName(char *n, int len, int d) { (void)d; strncpy(n, \"stub\", (size_t)len); return 0; }\n"
    "E hipDeviceGetAttribute(int *v, int a, int d) { (void)a; (void)d; *v = 104; return 0; }\n"
    "E hipDeviceTotalMem(size_t *b, int d) { (void)d; *b = (size_t)1 << 30; return 0; }\n"
    "E hipGetDevicePropertiesR0600(void *p, int d) {\n"
    "  (void)d;\n"
    "  memset(p, 0, 1024);\n"
    "  strcpy((char *)p + 400, \"gfx90a:sramecc+:xnack-\");\n"
    "  return 0;\n"
    "}\n"
    "E hipModuleLoadData(void **m, const void *i) { (void)i; *m = &module; return work(); }\n"
    "E hipModuleUnload(void *m) { (void)m; return failing(\"hipModuleUnload\") ? failing(\"hipModuleUnload\") : work(); }\n"
    "E hipModuleGetFunction(void **f, void *m, const char *name) {\n"
    "  (void)m;\n"
    "  E r = work();\n"
    "  if (r) return r;\n"
    "  if (strcmp(name, \"rlk_stub_kernel\") != 0) return 500;\n"
    "  *f = &function;\n"
    "  return 0;\n"
    "}\n"
    "E hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,\n"
    "                        unsigned by, unsigned bz, unsigned sh, void *s, void **p, void **e) {\n"
    "  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh;\n"
    "  (void)s; (void)p; (void)e;\n"
    "  return work();\n"
    "}\n"
    "E hipMalloc(void **p, size_t n) { (void)n; *p = memory; return work(); }\n"
    "E hipFree(void *p) { (void)p; return work(); }\n"
    "E hipMemcpy(void *d, const void *s, size_t n, int k) {\n"
    "  (void)d; (void)s; (void)n; (void)k;\n"
    "  return work();\n"
    "}\n"
    "E hipMemset(void *d, int v, size_t n) { (void)d; (void)v; (void)n; return work(); }\n"
    "E hipStreamSynchronize(void *s) { (void)s; return work(); }\n"
    "E hipEventCreate(void **e) { *e = &event; return work(); }\n"
    "E hipEventRecord(void *e, void *s) { (void)e; (void)s; return work(); }\n"
    "E hipEventSynchronize(void *e) { (void)e; return work(); }\n"
    "E hipEventElapsedTime(float *ms, void *a, void *b) { (void)a; (void)b; *ms = 1.0f; return work(); }\n"
    "E hipEventDestroy(void *e) { (void)e; return work(); }\n";

typedef struct hip_stub {
  void (*configure)(int devices, int target, int init_err, int get_err);
  void (*fail_call)(const char *name, int err); /* the named call fails with err; 0: none */
  int (*current)(void);
  void (*place)(int device);
  int (*switches)(void);
  int (*misplaced)(void);
} hip_stub;

/* Builds the stand-in runtime and points RLK_HIP_LIB at it; 0 (and why, printed) when the
 * test process is not forked (the backend keeps the first runtime it loads). */
static int hip_stub_load(hip_stub *stub) {
  char so_path[1300];
  void *lib = stub_library_load("hip stand-in runtime", hip_stub_source, "backend-stub-hip", NULL, so_path,
                                sizeof so_path);
  if (!lib) return 0;
  setenv("RLK_HIP_LIB", so_path, 1); /* the forked test process's own environment */
  stub->configure = (void (*)(int, int, int, int))dlsym(lib, "stub_configure");
  stub->fail_call = (void (*)(const char *, int))dlsym(lib, "stub_fail");
  stub->current = (int (*)(void))dlsym(lib, "stub_current");
  stub->place = (void (*)(int))dlsym(lib, "stub_place");
  stub->switches = (int (*)(void))dlsym(lib, "stub_switches");
  stub->misplaced = (int (*)(void))dlsym(lib, "stub_misplaced");
  ck_assert(stub->configure && stub->fail_call && stub->current && stub->place && stub->switches &&
            stub->misplaced);
  return 1;
}

START_TEST(test_hip_stub_open_statuses) {
  hip_stub stub;
  if (!hip_stub_load(&stub)) return;
  struct {
    int devices, init_err, get_err, ordinal;
    rlk_status want;
    const char *message;
  } cases[] = {
      {1, 100, 0, 0, RLK_ERR_UNAVAILABLE, "hip: no usable AMD GPU (hipInit: hipErrorStub)"},
      {0, 0, 0, 0, RLK_ERR_UNAVAILABLE, "hip: no AMD GPU is present"},
      {1, 0, 0, 3, RLK_ERR_INVALID_ARGUMENT, "hip: device 3 requested, but only 1 present"},
      {2, 0, 0, 2, RLK_ERR_INVALID_ARGUMENT, "hip: device 2 requested, but only 2 present"},
      {2, 0, 101, 1, RLK_ERR_BACKEND, "hip: hipDeviceGet: hipErrorStub"},
      {2, 0, 0, 1, RLK_OK, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    stub.configure(cases[i].devices, cases[i].ordinal, cases[i].init_err, cases[i].get_err);
    rlk_backend_impl *b =
        open_as_wanted(rlk_hip_backend_open, cases[i].ordinal, cases[i].want, cases[i].message, "gfx90a", i);
    if (b) b->destroy(b);
    ck_assert_int_eq(stub.current(), 0);
  }
}
END_TEST

/* The HIP stand-in's round: `start` the current device. */
typedef struct hip_round {
  stub_view view;
  const hip_stub *stub;
  int start;
} hip_round;

static void hip_expect_start_current(const stub_view *v, const char *after) {
  const hip_round *r = (const hip_round *)v;
  ck_assert_msg(r->stub->current() == r->start, "after %s: device %d current, want %d", after, r->stub->current(),
                r->start);
}

/* Every entry point once with `start` the current device; `start` is current after each. */
static void hip_stub_round(const hip_stub *stub, int start) {
  static const char bundle[] = "__CLANG_OFFLOAD_BUNDLE__ and the rest of a bundle";
  stub->place(start);
  /* device 1 is the backend's */
  const hip_round round = {{hip_expect_start_current, stub->switches, stub->misplaced, start == 1}, stub, start};
  stub_walk_entry_points(&round.view, rlk_hip_backend_open, 1, bundle, sizeof bundle, 64, 0);
}

START_TEST(test_hip_stub_keeps_callers_device) {
  hip_stub stub;
  if (!hip_stub_load(&stub)) return;
  stub.configure(2, 1, 0, 0);
  hip_stub_round(&stub, 0); /* another device current: kept */
  hip_stub_round(&stub, 1); /* already ours: no switch */
  hip_stub_round(&stub, 0);
}
END_TEST

/* As on CUDA: a failing unload or destroy leaves the thread's last error as it was. */
START_TEST(test_hip_stub_cleanup_keeps_last_error) {
  hip_stub stub;
  if (!hip_stub_load(&stub)) return;
  stub.configure(2, 1, 0, 0);
  static const char bundle[] = "__CLANG_OFFLOAD_BUNDLE__ and the rest of a bundle";
  stub.place(1);
  rlk_backend_impl *b = NULL;
  ck_assert_int_eq(rlk_hip_backend_open(1, &b), RLK_OK);
  void *module = NULL, *fn = NULL, *event = NULL;
  ck_assert_int_eq(b->module_load(b, bundle, sizeof bundle, &module), RLK_OK);
  ck_assert_int_eq(b->event_create(b, &event), RLK_OK);
  ck_assert_int_eq(b->get_function(b, module, "rlk_no_such_kernel", &fn), RLK_ERR_BACKEND);
  char want[512];
  snprintf(want, sizeof want, "%s", rlk_last_error());
  ck_assert_msg(strstr(want, "rlk_no_such_kernel") != NULL, "message: %s", want);
  stub.fail_call("hipModuleUnload", 98);
  b->module_unload(b, module);
  ck_assert_str_eq(rlk_last_error(), want);
  stub.place(0); /* the destroy has to switch, and the switch fails */
  stub.fail_call("hipSetDevice", 101);
  b->event_destroy(b, event);
  ck_assert_str_eq(rlk_last_error(), want);
  ck_assert_int_eq(stub.current(), 0);
  stub.fail_call("", 0);
  b->destroy(b);
}
END_TEST

/* ---- CUDA on a device (RLK_TEST_GPU=1) -------------------------------------------- */

static rlk_backend_impl *open_cuda_or_fail(void) {
  rlk_backend_impl *b = NULL;
  rlk_status st = rlk_cuda_backend_open(0, &b);
  ck_assert_msg(st == RLK_OK, "RLK_TEST_GPU=1 but CUDA device 0 does not open: %s",
                rlk_last_error());
  printf("cuda device 0: %s, cc %d.%d, %d SMs, %.1f GiB, target %s\n", b->info.name,
         b->info.compute_major, b->info.compute_minor, b->info.multiprocessors,
         (double)b->info.total_memory / (1u << 30), b->info.target);
  return b;
}

START_TEST(test_cuda_device_memory_events) {
  if (!rlk_test_gpu_enabled("backend: cuda memory")) return;
  uint64_t rng = seeded_state();
  rlk_backend_impl *b = open_cuda_or_fail();
  size_t n = 1 + (size_t)(rlk_test_rand_u64(&rng) % (1u << 22));
  unsigned char *h = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n; i++) h[i] = (unsigned char)rlk_test_rand_u64(&rng);
  void *d = NULL;
  ck_assert_int_eq(b->mem_alloc(b, n, &d), RLK_OK);
  ck_assert_int_eq(b->copy_to_device(b, d, h, n), RLK_OK);
  ck_assert_int_eq(b->copy_to_host(b, back, d, n), RLK_OK);
  ck_assert_int_eq(memcmp(h, back, n), 0);
  int value = (int)(rlk_test_rand_u64(&rng) % 256);
  ck_assert_int_eq(b->mem_set(b, d, value, n), RLK_OK);
  ck_assert_int_eq(b->copy_to_host(b, back, d, n), RLK_OK);
  for (size_t i = 0; i < n; i++) ck_assert_int_eq(back[i], value);

  void *e0 = NULL, *e1 = NULL;
  float ms = -1;
  ck_assert_int_eq(b->event_create(b, &e0), RLK_OK);
  ck_assert_int_eq(b->event_create(b, &e1), RLK_OK);
  ck_assert_int_eq(b->event_record(b, e0, NULL), RLK_OK);
  ck_assert_int_eq(b->mem_set(b, d, 0, n), RLK_OK);
  ck_assert_int_eq(b->event_record(b, e1, NULL), RLK_OK);
  ck_assert_int_eq(b->event_elapsed_ms(b, e0, e1, &ms), RLK_OK);
  ck_assert_msg(ms >= 0.0f && ms < 10000.0f, "elapsed %.3f ms", (double)ms);
  b->event_destroy(b, e0);
  b->event_destroy(b, e1);

  void *z = (void *)1;
  ck_assert_int_eq(b->mem_alloc(b, 0, &z), RLK_OK);
  ck_assert_ptr_null(z);
  void *huge = NULL;
  ck_assert_int_eq(b->mem_alloc(b, (size_t)1 << 52, &huge), RLK_ERR_OUT_OF_MEMORY);
  ck_assert_msg(strstr(rlk_last_error(), "cuda: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY") != NULL,
                "message: %s", rlk_last_error());
  ck_assert_int_eq(b->mem_free(b, d), RLK_OK);

  /* A corrupt image is an error the JIT can act on, never a crash: refused before the
   * driver when it is no known format, by the driver when it only looks like one. */
  void *module = (void *)1;
  h[0] = 'J';
  ck_assert_int_eq(b->module_load(b, h, n, &module), RLK_ERR_BACKEND);
  ck_assert_ptr_null(module);
  static const char bad_ptx[] = ".version 99.9\n.target sm_90a\nthis is not ptx\n";
  module = (void *)1;
  ck_assert_int_eq(b->module_load(b, bad_ptx, sizeof bad_ptx, &module), RLK_ERR_BACKEND);
  ck_assert_ptr_null(module);
  ck_assert_msg(strstr(rlk_last_error(), "cuda: cuModuleLoadData: CUDA_ERROR_") != NULL,
                "message: %s", rlk_last_error());
  free(h);
  free(back);
  b->destroy(b);
}
END_TEST

static const char *const cuda_kernels =
    "template <int SCALE>\n"
    "__global__ void rlk_test_axpy(float a, const float *x, float *y, long long n) {\n"
    "  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = SCALE * (a * x[i]) + y[i];\n"
    "}\n"
    "template <int SCALE>\n"
    "__global__ void rlk_test_reverse(const float *in, float *out, int n) {\n"
    "  extern __shared__ float buf[];\n"
    "  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = in[i];\n"
    "  __syncthreads();\n"
    "  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = SCALE * buf[n - 1 - i];\n"
    "}\n";

typedef struct compiled {
  rlk_compiler *nvrtc;
  rlk_compile_result result;
} compiled;

/* Compiles `source` for `target` with NVRTC; returns 0 (and prints why) when NVRTC is
 * not installed, fails the test when it rejects the source. */
static int compile_for_target(const char *target, const char *source, const char *const *names,
                              size_t nnames, compiled *out) {
  memset(out, 0, sizeof *out);
  rlk_status st = rlk_nvrtc_open(&out->nvrtc);
  if (st != RLK_OK) {
    printf("skip (backend: cuda kernels): NVRTC unavailable: %s\n", rlk_last_error());
    return 0;
  }
  rlk_target t;
  ck_assert_msg(rlk_target_parse(target, &t) == RLK_OK, "%s", rlk_last_error());
  rlk_compile_request req;
  memset(&req, 0, sizeof req);
  req.source = source;
  req.source_name = "rlk_test_backend.cu";
  req.target = &t;
  req.nnames = nnames;
  req.names = names;
  st = out->nvrtc->compile(out->nvrtc, &req, &out->result);
  ck_assert_msg(st == RLK_OK, "nvrtc: %s", rlk_last_error());
  ck_assert_uint_eq(out->result.nnames, nnames);
  return 1;
}

static int compile_for(rlk_backend_impl *b, const char *source, const char *const *names,
                       size_t nnames, compiled *out) {
  return compile_for_target(b->info.target, source, names, nnames, out);
}

static void compiled_free(compiled *c) {
  rlk_compile_result_free(&c->result);
  if (c->nvrtc) c->nvrtc->destroy(c->nvrtc);
}

typedef struct thread_launch {
  rlk_backend_impl *b;
  void *fn;
  rlk_launch_dims dims;
  void **args;
  rlk_status status;
} thread_launch;

static void *launch_on_thread(void *arg) {
  thread_launch *t = arg;
  t->status = t->b->launch(t->b, t->fn, &t->dims, NULL, t->args);
  if (t->status == RLK_OK) t->status = t->b->synchronize(t->b, NULL);
  return NULL;
}

START_TEST(test_cuda_device_kernels) {
  if (!rlk_test_gpu_enabled("backend: cuda kernels")) return;
  uint64_t rng = seeded_state();
  rlk_backend_impl *b = open_cuda_or_fail();
  static const char *const names[] = {"rlk_test_axpy<3>", "rlk_test_reverse<2>"};
  compiled c;
  if (!compile_for(b, cuda_kernels, names, 2, &c)) {
    b->destroy(b);
    return;
  }
  void *module = NULL, *axpy = NULL, *reverse = NULL, *missing = (void *)1;
  rlk_status st = b->module_load(b, c.result.binary, c.result.size, &module);
  ck_assert_msg(st == RLK_OK, "module_load: %s", rlk_last_error());
  ck_assert_int_eq(b->get_function(b, module, c.result.lowered_names[0], &axpy), RLK_OK);
  ck_assert_int_eq(b->get_function(b, module, c.result.lowered_names[1], &reverse), RLK_OK);
  ck_assert_int_eq(b->get_function(b, module, "rlk_no_such_kernel_7", &missing),
                   RLK_ERR_BACKEND);
  ck_assert_ptr_null(missing);
  ck_assert_msg(strstr(rlk_last_error(), "rlk_no_such_kernel_7") != NULL &&
                    strstr(rlk_last_error(), "CUDA_ERROR_NOT_FOUND") != NULL,
                "message: %s", rlk_last_error());

  /* axpy: y = 3 * a * x + y, launched from the calling thread and from a fresh one (where
   * no context is current yet). */
  long long n = 1 + (long long)(rlk_test_rand_u64(&rng) % 300000);
  float a = (float)rlk_test_rand_normal(&rng);
  size_t bytes = (size_t)n * sizeof(float);
  float *hx = malloc(bytes), *hy = malloc(bytes), *out = malloc(bytes);
  double *ref = malloc((size_t)n * sizeof *ref);
  for (long long i = 0; i < n; i++) {
    hx[i] = (float)rlk_test_rand_normal(&rng);
    hy[i] = (float)rlk_test_rand_normal(&rng);
  }
  void *dx = NULL, *dy = NULL;
  ck_assert_int_eq(b->mem_alloc(b, bytes, &dx), RLK_OK);
  ck_assert_int_eq(b->mem_alloc(b, bytes, &dy), RLK_OK);
  ck_assert_int_eq(b->copy_to_device(b, dx, hx, bytes), RLK_OK);
  ck_assert_int_eq(b->copy_to_device(b, dy, hy, bytes), RLK_OK);
  void *args[] = {&a, &dx, &dy, &n};
  rlk_launch_dims dims = {{(unsigned)((n + 255) / 256), 1, 1}, {256, 1, 1}, 0};
  ck_assert_int_eq(b->launch(b, axpy, &dims, NULL, args), RLK_OK);
  thread_launch t = {b, axpy, dims, args, RLK_ERR_INTERNAL};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, launch_on_thread, &t), 0);
  pthread_join(th, NULL);
  ck_assert_msg(t.status == RLK_OK, "launch on another thread: %s", rlk_last_error());
  ck_assert_int_eq(b->copy_to_host(b, out, dy, bytes), RLK_OK);
  for (long long i = 0; i < n; i++) {
    double once = 3.0 * (double)a * (double)hx[i];
    ref[i] = once + once + (double)hy[i];
    double tol = 1e-5 * (1.0 + __builtin_fabs(ref[i]) + __builtin_fabs(once));
    ck_assert_msg(__builtin_fabs((double)out[i] - ref[i]) <= tol, "y[%lld] = %.9g, want %.9g",
                  i, (double)out[i], ref[i]);
  }

  /* reverse with 100 KiB of dynamic shared memory: needs the opt-in above 48 KiB. */
  int m = 25600;
  size_t mbytes = (size_t)m * sizeof(float);
  void *din = NULL, *dout = NULL;
  ck_assert_int_eq(b->mem_alloc(b, mbytes, &din), RLK_OK);
  ck_assert_int_eq(b->mem_alloc(b, mbytes, &dout), RLK_OK);
  ck_assert_int_eq(b->copy_to_device(b, din, hx, mbytes < bytes ? mbytes : bytes), RLK_OK);
  if (mbytes > bytes) ck_assert_int_eq(b->mem_set(b, (char *)din + bytes, 0, mbytes - bytes), RLK_OK);
  void *rargs[] = {&din, &dout, &m};
  rlk_launch_dims rdims = {{1, 1, 1}, {512, 1, 1}, mbytes};
  st = b->launch(b, reverse, &rdims, NULL, rargs);
  ck_assert_msg(st == RLK_OK, "100 KiB shared launch: %s", rlk_last_error());
  ck_assert_int_eq(b->synchronize(b, NULL), RLK_OK);
  float *rout = malloc(mbytes);
  ck_assert_int_eq(b->copy_to_host(b, rout, dout, mbytes), RLK_OK);
  for (int i = 0; i < m; i++) {
    long long src = m - 1 - i;
    double want = src < n ? 2.0 * (double)hx[src] : 0.0;
    ck_assert_msg((double)rout[i] == want, "reverse[%d] = %.9g, want %.9g", i, (double)rout[i],
                  want);
  }
  rdims.shared_bytes = (size_t)4 << 20; /* beyond any device */
  ck_assert_int_eq(b->launch(b, reverse, &rdims, NULL, rargs), RLK_ERR_INVALID_ARGUMENT);

  /* A well-formed cubin for another architecture is refused by the driver: the error the
   * JIT answers by rebuilding the entry. */
  compiled other;
  const char *other_target = b->info.compute_major == 8 ? "sm_90" : "sm_80";
  if (compile_for_target(other_target, cuda_kernels, names, 2, &other)) {
    void *wrong = (void *)1;
    st = b->module_load(b, other.result.binary, other.result.size, &wrong);
    ck_assert_msg(st == RLK_ERR_BACKEND, "a %s cubin loaded on cc %d.%d", other_target,
                  b->info.compute_major, b->info.compute_minor);
    ck_assert_ptr_null(wrong);
    ck_assert_msg(strstr(rlk_last_error(), "cuModuleLoadData") != NULL, "message: %s",
                  rlk_last_error());
    printf("cuda: a %s cubin on this device: %s\n", other_target, rlk_last_error());
    compiled_free(&other);
  }

  b->mem_free(b, dx);
  b->mem_free(b, dy);
  b->mem_free(b, din);
  b->mem_free(b, dout);
  b->module_unload(b, module);
  compiled_free(&c);
  free(hx);
  free(hy);
  free(out);
  free(ref);
  free(rout);
  b->destroy(b);
}
END_TEST

START_TEST(test_cuda_device_tma) {
  if (!rlk_test_gpu_enabled("backend: cuda tma")) return;
  uint64_t rng = seeded_state();
  rlk_backend_impl *b = open_cuda_or_fail();
  enum { BOX_ROWS = 16, BOX_COLS = 32 };
  uint64_t rows = 100 + rlk_test_rand_u64(&rng) % 400, cols = 40 + rlk_test_rand_u64(&rng) % 200;
  uint64_t stride = (cols + 3) / 4 * 4 + 4 * (rlk_test_rand_u64(&rng) % 3); /* 16-byte rows */
  size_t bytes = (size_t)(rows * stride * sizeof(float));
  float *h = malloc(bytes);
  for (uint64_t i = 0; i < rows * stride; i++) h[i] = (float)rlk_test_rand_normal(&rng);
  void *d = NULL;
  ck_assert_int_eq(b->mem_alloc(b, bytes, &d), RLK_OK);
  ck_assert_int_eq(b->copy_to_device(b, d, h, bytes), RLK_OK);

  rlk_tma_desc_request req = {d, RLK_F32, rows, cols, stride, BOX_ROWS, BOX_COLS, 0};
  _Alignas(64) unsigned char map[128];
  memset(map, 0, sizeof map);
  if (b->info.compute_major < 9) {
    printf("skip (backend: cuda tma): cc %d.%d has no tensor memory accelerator\n",
           b->info.compute_major, b->info.compute_minor);
    b->mem_free(b, d);
    b->destroy(b);
    free(h);
    return;
  }
  rlk_status st = rlk_cuda_tma_encode(b, &req, map);
  ck_assert_msg(st == RLK_OK, "encode: %s", rlk_last_error());
  int nonzero = 0;
  for (int i = 0; i < 128; i++) nonzero |= map[i];
  ck_assert_msg(nonzero, "the encoded map is all zeros");
  /* The encoding is a pure function of the request: the same one gives the same bytes, a
   * different box different ones. */
  _Alignas(64) unsigned char again[128];
  ck_assert_int_eq(rlk_cuda_tma_encode(b, &req, again), RLK_OK);
  ck_assert_int_eq(memcmp(map, again, sizeof map), 0);
  rlk_tma_desc_request narrow = req;
  narrow.box_cols = BOX_COLS / 2;
  ck_assert_int_eq(rlk_cuda_tma_encode(b, &narrow, again), RLK_OK);
  ck_assert_int_ne(memcmp(map, again, sizeof map), 0);

  /* The checks run before the driver: a 512-column box is refused with the reason. */
  rlk_tma_desc_request wide = req;
  wide.box_cols = 512;
  ck_assert_int_eq(rlk_cuda_tma_encode(b, &wide, again), RLK_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(rlk_last_error(), "box_cols 512") != NULL, "message: %s",
                rlk_last_error());

  /* A box copied through such a map, element for element, is the hopper suite's (its
   * hopper_tma_box kernel, on the library's own TMA and mbarrier wrappers). */
  b->mem_free(b, d);
  free(h);
  b->destroy(b);
}
END_TEST

/* ---- CUDA on a device: the caller's current context survives ---------------------- */

/* The driver entry points the tests call themselves, resolved apart from the backend so
 * they see the driver's per-thread state directly. */
typedef struct test_cu {
  int (*device_count)(int *count);
  int (*device_get)(int *device, int ordinal);
  int (*ctx_get_current)(void **ctx);
  int (*ctx_set_current)(void *ctx);
  int (*ctx_create_v2)(void **ctx, unsigned flags, int device);
  int (*ctx_create_v4)(void **ctx, void *params, unsigned flags, int device);
  int (*ctx_destroy)(void *ctx);
  int (*primary_retain)(void **ctx, int device);
  int (*primary_release)(int device);
} test_cu;

static void test_cu_load(test_cu *cu) {
  memset(cu, 0, sizeof *cu);
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(lib != NULL, "RLK_TEST_GPU=1 but libcuda.so.1 does not load: %s", dlerror());
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
  cu->device_count = (int (*)(int *))dlsym(lib, "cuDeviceGetCount");
  cu->device_get = (int (*)(int *, int))dlsym(lib, "cuDeviceGet");
  cu->ctx_get_current = (int (*)(void **))dlsym(lib, "cuCtxGetCurrent");
  cu->ctx_set_current = (int (*)(void *))dlsym(lib, "cuCtxSetCurrent");
  /* cuCtxCreate changed its arguments in CUDA 13 (the _v4 form takes a parameter block,
   * NULL for none); drivers keep exporting the _v2 form for older binaries. */
  cu->ctx_create_v2 = (int (*)(void **, unsigned, int))dlsym(lib, "cuCtxCreate_v2");
  cu->ctx_create_v4 = (int (*)(void **, void *, unsigned, int))dlsym(lib, "cuCtxCreate_v4");
  cu->ctx_destroy = (int (*)(void *))dlsym(lib, "cuCtxDestroy_v2");
  cu->primary_retain = (int (*)(void **, int))dlsym(lib, "cuDevicePrimaryCtxRetain");
  cu->primary_release = (int (*)(int))dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
  if (!cu->primary_release)
    cu->primary_release = (int (*)(int))dlsym(lib, "cuDevicePrimaryCtxRelease");
  ck_assert(init && cu->device_count && cu->device_get && cu->ctx_get_current &&
            cu->ctx_set_current && (cu->ctx_create_v2 || cu->ctx_create_v4) &&
            cu->ctx_destroy && cu->primary_retain && cu->primary_release);
  ck_assert_int_eq(init(0), 0);
}

static void *cu_current(const test_cu *cu) {
  void *ctx = (void *)1;
  if (cu->ctx_get_current(&ctx) != 0) return (void *)1; /* never a real context */
  return ctx;
}

enum { START_NONE, START_OTHER, START_PRIMARY };

/* One thread's run: open, load, launch, copy, time, free and destroy with a given context
 * current at the start, checking after every call that it still is. Failures are written
 * into `failure` (Check's assertions belong to the test's own thread). */
typedef struct ctx_probe {
  const test_cu *cu;
  int start;
  const compiled *kernels; /* [0] = rlk_test_axpy<3> */
  uint64_t seed;
  char failure[768];
} ctx_probe;

#define PROBE_FAIL_IF(cond, ...)                                                      \
  do {                                                                                \
    if (cond) {                                                                       \
      snprintf(p->failure, sizeof p->failure, __VA_ARGS__);                           \
      goto done;                                                                      \
    }                                                                                 \
  } while (0)
#define PROBE_STEP(call)                                                              \
  do {                                                                                \
    rlk_status st_ = (call);                                                          \
    PROBE_FAIL_IF(st_ != RLK_OK, "%s: %s", #call, rlk_last_error());                  \
    void *now_ = cu_current(cu);                                                      \
    PROBE_FAIL_IF(now_ != want, "after %s: context %p current, want %p", #call, now_, \
                  want);                                                              \
  } while (0)

static void *ctx_probe_run(void *arg) {
  ctx_probe *p = arg;
  const test_cu *cu = p->cu;
  rlk_backend_impl *b = NULL;
  void *own = NULL, *want = NULL, *module = NULL, *fn = NULL, *missing = NULL;
  void *dx = NULL, *dy = NULL, *e0 = NULL, *e1 = NULL;
  float *hx = NULL, *hy = NULL, *out = NULL;
  int retained = 0, device = 0;
  p->failure[0] = '\0';
  void *first = cu_current(cu);
  PROBE_FAIL_IF(first != NULL, "a fresh thread has context %p current", first);
  PROBE_FAIL_IF(cu->device_get(&device, 0) != 0, "cuDeviceGet failed");
  if (p->start == START_OTHER) {
    /* A second, non-primary context on the same device stands for "another device's
     * context" on a one-GPU machine: creating it makes it current. */
    int r = cu->ctx_create_v2 ? cu->ctx_create_v2(&own, 0, device)
                              : cu->ctx_create_v4(&own, NULL, 0, device);
    PROBE_FAIL_IF(r != 0 || !own, "cuCtxCreate: CUresult %d", r);
    want = own;
  } else if (p->start == START_PRIMARY) {
    PROBE_FAIL_IF(cu->primary_retain(&want, device) != 0, "cuDevicePrimaryCtxRetain failed");
    retained = 1;
    PROBE_FAIL_IF(cu->ctx_set_current(want) != 0, "cuCtxSetCurrent failed");
  }
  void *now = cu_current(cu);
  PROBE_FAIL_IF(now != want, "setting up: context %p current, want %p", now, want);

  uint64_t rng = p->seed;
  long long n = 1 + (long long)(rlk_test_rand_u64(&rng) % 100000);
  float a = (float)rlk_test_rand_normal(&rng);
  size_t bytes = (size_t)n * sizeof(float);
  hx = malloc(bytes);
  hy = malloc(bytes);
  out = malloc(bytes);
  PROBE_FAIL_IF(!hx || !hy || !out, "out of host memory");
  for (long long i = 0; i < n; i++) {
    hx[i] = (float)rlk_test_rand_normal(&rng);
    hy[i] = (float)rlk_test_rand_normal(&rng);
  }
  const compiled *c = p->kernels;
  PROBE_STEP(rlk_cuda_backend_open(0, &b));
  PROBE_STEP(b->module_load(b, c->result.binary, c->result.size, &module));
  PROBE_STEP(b->get_function(b, module, c->result.lowered_names[0], &fn));
  rlk_status st = b->get_function(b, module, "rlk_no_such_kernel_7", &missing);
  PROBE_FAIL_IF(st != RLK_ERR_BACKEND, "a missing kernel: status %d", st);
  now = cu_current(cu);
  PROBE_FAIL_IF(now != want, "after a failed get_function: context %p current, want %p", now,
                want);
  PROBE_STEP(b->mem_alloc(b, bytes, &dx));
  PROBE_STEP(b->mem_alloc(b, bytes, &dy));
  PROBE_STEP(b->copy_to_device(b, dx, hx, bytes));
  PROBE_STEP(b->copy_to_device(b, dy, hy, bytes));
  PROBE_STEP(b->event_create(b, &e0));
  PROBE_STEP(b->event_create(b, &e1));
  PROBE_STEP(b->event_record(b, e0, NULL));
  void *args[] = {&a, &dx, &dy, &n};
  rlk_launch_dims dims = {{(unsigned)((n + 255) / 256), 1, 1}, {256, 1, 1}, 0};
  PROBE_STEP(b->launch(b, fn, &dims, NULL, args));
  PROBE_STEP(b->event_record(b, e1, NULL));
  PROBE_STEP(b->synchronize(b, NULL));
  float ms = -1;
  PROBE_STEP(b->event_elapsed_ms(b, e0, e1, &ms));
  PROBE_STEP(b->copy_to_host(b, out, dy, bytes));
  for (long long i = 0; i < n; i++) {
    double want_y = 3.0 * (double)a * (double)hx[i] + (double)hy[i];
    double tol = 1e-5 * (1.0 + __builtin_fabs(want_y) + __builtin_fabs(3.0 * a * hx[i]));
    PROBE_FAIL_IF(__builtin_fabs((double)out[i] - want_y) > tol, "y[%lld] = %.9g, want %.9g", i,
                  (double)out[i], want_y);
  }
  PROBE_STEP(b->mem_set(b, dy, 0, bytes));
  b->event_destroy(b, e0);
  b->event_destroy(b, e1);
  e0 = e1 = NULL;
  PROBE_STEP(b->mem_free(b, dx));
  PROBE_STEP(b->mem_free(b, dy));
  dx = dy = NULL;
  b->module_unload(b, module);
  module = NULL;
  b->destroy(b);
  b = NULL;
  now = cu_current(cu);
  PROBE_FAIL_IF(now != want, "after destroy: context %p current, want %p", now, want);
done:
  if (b) {
    if (e0) b->event_destroy(b, e0);
    if (e1) b->event_destroy(b, e1);
    if (dx) b->mem_free(b, dx);
    if (dy) b->mem_free(b, dy);
    if (module) b->module_unload(b, module);
    b->destroy(b);
  }
  if (own) cu->ctx_destroy(own);
  if (retained) {
    cu->ctx_set_current(NULL);
    cu->primary_release(device);
  }
  free(hx);
  free(hy);
  free(out);
  return NULL;
}
#undef PROBE_STEP
#undef PROBE_FAIL_IF

START_TEST(test_cuda_device_keeps_callers_context) {
  if (!rlk_test_gpu_enabled("backend: cuda current context")) return;
  test_cu cu;
  test_cu_load(&cu);
  rlk_backend_impl *b = open_cuda_or_fail();
  static const char *const names[] = {"rlk_test_axpy<3>"};
  compiled c;
  int have = compile_for(b, cuda_kernels, names, 1, &c);
  b->destroy(b);
  if (!have) return;
  static const char *const starts[] = {"no context", "another context", "the primary context"};
  for (int start = START_NONE; start <= START_PRIMARY; start++) {
    ctx_probe p = {&cu, start, &c, seeded_state(), ""};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, ctx_probe_run, &p), 0);
    pthread_join(th, NULL);
    ck_assert_msg(p.failure[0] == '\0', "starting with %s current: %s", starts[start],
                  p.failure);
  }
  compiled_free(&c);
}
END_TEST

START_TEST(test_cuda_device_ordinal_out_of_range) {
  if (!rlk_test_gpu_enabled("backend: cuda ordinal out of range")) return;
  test_cu cu;
  test_cu_load(&cu);
  int count = 0;
  ck_assert_int_eq(cu.device_count(&count), 0);
  ck_assert_int_gt(count, 0);
  void *before = cu_current(&cu);
  uint64_t rng = seeded_state();
  int ordinals[] = {count, count + 1 + (int)(rlk_test_rand_u64(&rng) % 1000)};
  for (int i = 0; i < 2; i++) {
    rlk_backend_impl *b = (rlk_backend_impl *)1;
    rlk_status st = rlk_cuda_backend_open(ordinals[i], &b);
    ck_assert_int_eq(st, RLK_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(b);
    char want[128];
    snprintf(want, sizeof want, "cuda: device %d requested, but only %d present", ordinals[i],
             count);
    ck_assert_str_eq(rlk_last_error(), want);
  }
  ck_assert_ptr_eq(cu_current(&cu), before);
}
END_TEST

Suite *backend_suite(void) {
  Suite *s = suite_create("backend");
  rlk_test_add_case(s, "host", 60, TESTS(test_host_info, test_host_launch_axpy,
      test_host_modules_stay_distinct, test_host_bad_images, test_host_missing_symbol,
      test_host_memory_and_events));

  rlk_test_add_case(s, "tma", 0, TESTS(test_tma_check_accepts, test_tma_check_rejects,
      test_tma_encode_needs_cuda));

  rlk_test_add_case(s, "open", 0, TESTS(test_cuda_device_targets, test_target_parse, test_target_names,
      test_target_arch_table, test_target_env_override, test_target_env_keeps_cluster_sms, test_backend_alloc, test_cuda_open_here, test_hip_open_here,
      test_cuda_stub_open_statuses, test_cuda_stub_keeps_callers_context, test_cuda_stub_cleanup_keeps_last_error,
      test_cuda_stub_function_attribute_failures,
      test_hip_stub_open_statuses, test_hip_stub_keeps_callers_device, test_hip_stub_cleanup_keeps_last_error));

  rlk_test_add_case(s, "gpu", 120, TESTS(test_cuda_device_memory_events, test_cuda_device_kernels,
      test_cuda_device_tma, test_cuda_device_keeps_callers_context, test_cuda_device_ordinal_out_of_range));
  return s;
}
