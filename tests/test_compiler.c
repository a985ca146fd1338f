/* test_compiler.c - the three kernel compilers (NVRTC, hiprtc, the host C compiler) and the
 * dlopen wrapper under them. Compilers need no GPU; a compiler that is not installed makes
 * its cases print why they skip. Compiling every real template for every target is the
 * precompile tool's job; these cases use small self-contained sources. */
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "core/target.h"
#include "jit/compiler.h"
#include "jit/compiler_impl.h"
#include "core/dynlib.h"
#include "suites.h"
#include "test_util.h"

/* Opens a compiler or prints why its cases skip (NULL). */
static rlk_compiler *open_or_skip(rlk_status (*open_fn)(rlk_compiler **), const char *what) {
  rlk_compiler *c = NULL;
  rlk_status st = open_fn(&c);
  if (st == RLK_ERR_UNAVAILABLE) {
    printf("skip (%s): %s\n", what, rlk_last_error());
    fflush(stdout);
    return NULL;
  }
  ck_assert_msg(st == RLK_OK, "%s: %s", what, rlk_last_error());
  ck_assert_ptr_nonnull(c);
  return c;
}

static int has_option(const rlk_compiler *c, const char *option) {
  for (size_t i = 0; i < c->nbase_options; i++)
    if (strcmp(c->base_options[i], option) == 0) return 1;
  return 0;
}

/* The typed target of a name (a compiler takes nothing else); the test fails if it does not parse.
 * Kept in a ring of slots, so a few may be used at once. */
static const rlk_target *T(const char *name) {
  static rlk_target ring[8];
  static unsigned next;
  rlk_target *t = &ring[next++ % 8];
  ck_assert_msg(rlk_target_parse(name, t) == RLK_OK, "%s: %s", name, rlk_last_error());
  return t;
}

static int is_elf(const rlk_compile_result *r) {
  return r->binary && r->size > 64 && memcmp(r->binary, "\x7f" "ELF", 4) == 0;
}

/* ---- device sources (compiled by NVRTC and hiprtc alike) --------------------------------- */

static const char *const dev_header_names[] = {"rlk_test/helper.cuh"};
static const char *const dev_header_sources[] = {
    "#pragma once\n"
    "namespace rlk_test {\n"
    "template <typename T> __device__ inline T mul(T a, T b) { return a * b; }\n"
    "}\n"};

/* A templated kernel using the in-memory header and a -D define that must arrive. */
static const char *dev_source =
    "#include \"rlk_test/helper.cuh\"\n"
    "#ifndef RLK_TEST_FACTOR\n"
    "#error RLK_TEST_FACTOR is not defined\n"
    "#endif\n"
    "namespace rlk_test {\n"
    "template <typename T, int N>\n"
    "__global__ void scale(T *x) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < N) x[i] = mul(x[i], (T)RLK_TEST_FACTOR);\n"
    "}\n"
    "}\n";

/* A request for dev_source with its header, one name expression and one option. */
static rlk_compile_request scale_request(const rlk_target *target, const char *const *names,
                                         const char *const *options) {
  rlk_compile_request req = {.source = dev_source,
                             .source_name = "scale.cu",
                             .nheaders = 1,
                             .header_names = dev_header_names,
                             .header_sources = dev_header_sources,
                             .target = target,
                             .noptions = 1,
                             .options = options,
                             .nnames = 1,
                             .names = names};
  return req;
}

/* Compiles dev_source for `target` with a fresh N and checks the binary and lowered name. */
static void compile_scale(rlk_compiler *c, const char *target, uint64_t *rng) {
  int n = 1 + (int)(rlk_test_rand_u64(rng) % 100000);
  char name[96], define[64];
  snprintf(name, sizeof name, "rlk_test::scale<float, %d>", n);
  snprintf(define, sizeof define, "-DRLK_TEST_FACTOR=%d", 2 + (int)(rlk_test_rand_u64(rng) % 7));
  const char *names[] = {name};
  const char *options[] = {define};
  rlk_compile_request req = scale_request(T(target), names, options);
  rlk_compile_result r;
  rlk_status st = c->compile(c, &req, &r);
  ck_assert_msg(st == RLK_OK, "%s for %s: %s", c->id, target, rlk_last_error());
  ck_assert_msg(is_elf(&r), "%s for %s: %zu bytes, not ELF", c->id, target, r.size);
  ck_assert_ptr_nonnull(r.binary_name);
  ck_assert_uint_eq(r.nnames, 1);
  ck_assert_ptr_nonnull(r.lowered_names);
  /* Itanium mangling: the template argument appears as "Li<N>E". */
  char arg[32];
  snprintf(arg, sizeof arg, "Li%dE", n);
  ck_assert_msg(strncmp(r.lowered_names[0], "_Z", 2) == 0 && strstr(r.lowered_names[0], arg),
                "lowered name '%s' for %s", r.lowered_names[0], name);
  ck_assert_ptr_nonnull(r.log);
  ck_assert(r.seconds > 0.0);
  rlk_compile_result_free(&r);
  ck_assert_ptr_null(r.binary);
}

/* Compiles a source with an error and checks the compiler's words reach rlk_last_error(). */
static void compile_broken(rlk_compiler *c, const char *target) {
  static const char *broken =
      "__global__ void broken(float *x) { x[0] = rlk_undefined_thing + ; }\n";
  rlk_compile_request req = {.source = broken, .source_name = "broken.cu", .target = T(target)};
  rlk_compile_result r;
  ck_assert_int_eq(c->compile(c, &req, &r), RLK_ERR_COMPILE);
  const char *msg = rlk_last_error();
  ck_assert_msg(strstr(msg, "broken.cu") && strstr(msg, target) && strstr(msg, "rlk_undefined_thing") &&
                    strstr(msg, "error"),
                "message: %s", msg);
  ck_assert_ptr_null(r.binary);
  ck_assert_ptr_null(r.lowered_names);
}

/* ---- NVRTC ------------------------------------------------------------------------------- */

START_TEST(nvrtc_opens) {
  rlk_compiler *c = open_or_skip(rlk_nvrtc_open, "nvrtc");
  if (!c) return;
  ck_assert_str_eq(c->kind, "nvrtc");
  char id[64];
  snprintf(id, sizeof id, "nvrtc-%s", c->version);
  ck_assert_str_eq(c->id, id);
  ck_assert_msg(strncmp(c->version, "12.", 3) == 0 || strncmp(c->version, "13.", 3) == 0, "%s",
                c->version);
  ck_assert(c->supports_target(c, T("sm_80")));
  ck_assert(c->supports_target(c, T("sm_90")));
  ck_assert(c->supports_target(c, T("sm_90a")));
  ck_assert(c->supports_target(c, T("compute_90")));
  ck_assert_ptr_nonnull(strstr(c->targets, "sm_80 "));
  ck_assert_ptr_nonnull(strstr(c->targets, "sm_90a "));
  ck_assert_ptr_nonnull(strstr(c->targets, "compute_90 "));
  ck_assert(!c->supports_target(c, T("sm_13"))); /* an arch it does not list */
  ck_assert(!c->supports_target(c, T("gfx90a")));
  ck_assert(!c->supports_target(c, T("host")));
  /* Blackwell by name, where this NVRTC knows it (13.0 does) */
  if (strstr(c->targets, "sm_100 ")) {
    ck_assert(c->supports_target(c, T("sm_100a")));
    ck_assert(c->supports_target(c, T("sm_120a")));
    ck_assert_ptr_nonnull(strstr(c->targets, "sm_100a "));
    ck_assert_ptr_nonnull(strstr(c->targets, "sm_120a "));
    const int family = atoi(c->version) > 12 || atof(c->version) >= 12.9;
    ck_assert_int_eq(c->supports_target(c, T("sm_100f")), family);
  }
  ck_assert(has_option(c, "-DRLK_NVRTC=1"));
  ck_assert(has_option(c, "--std=c++17"));
  c->destroy(c);
}
END_TEST

START_TEST(nvrtc_compiles_templates) {
  rlk_compiler *c = open_or_skip(rlk_nvrtc_open, "nvrtc");
  if (!c) return;
  uint64_t rng = rlk_test_seed() ^ 0x6e7672746301ull;
  compile_scale(c, "sm_80", &rng);
  compile_scale(c, "sm_90a", &rng);
  c->destroy(c);
}
END_TEST

/* A virtual target gives PTX (text the driver reads as a C string, so NUL-terminated) for its
 * compute capability, under its own file name in the cache; a real one a cubin. */
START_TEST(nvrtc_compiles_ptx_for_compute_targets) {
  rlk_compiler *c = open_or_skip(rlk_nvrtc_open, "nvrtc");
  if (!c) return;
  const char *names[] = {"rlk_test::scale<float, 7>"};
  const char *options[] = {"-DRLK_TEST_FACTOR=3"};
  rlk_compile_request req = scale_request(T("compute_90"), names, options);
  rlk_compile_result r;
  ck_assert_msg(c->compile(c, &req, &r) == RLK_OK, "%s", rlk_last_error());
  ck_assert_str_eq(r.binary_name, "kernel.ptx");
  ck_assert(!is_elf(&r));
  ck_assert_uint_gt(r.size, 1);
  ck_assert_int_eq(((const char *)r.binary)[r.size - 1], '\0');
  ck_assert_uint_eq(strlen(r.binary), r.size - 1);
  ck_assert_msg(strstr(r.binary, ".target sm_90") != NULL, "PTX without its target:\n%.300s", (const char *)r.binary);
  ck_assert_msg(strstr(r.binary, r.lowered_names[0]) != NULL, "PTX without %s", r.lowered_names[0]);
  rlk_compile_result_free(&r);
  req.target = T("sm_90");
  ck_assert_msg(c->compile(c, &req, &r) == RLK_OK, "%s", rlk_last_error());
  ck_assert_str_eq(r.binary_name, "kernel.cubin");
  ck_assert(is_elf(&r));
  rlk_compile_result_free(&r);
  c->destroy(c);
}
END_TEST

START_TEST(nvrtc_reports_errors) {
  rlk_compiler *c = open_or_skip(rlk_nvrtc_open, "nvrtc");
  if (!c) return;
  compile_broken(c, "sm_80");
  /* A target it does not know is refused before compiling. */
  rlk_compile_request req = {.source = dev_source, .source_name = "scale.cu", .target = T("sm_13")};
  rlk_compile_result r;
  rlk_test_expect_error(c->compile(c, &req, &r), RLK_ERR_UNSUPPORTED, "sm_13", "sm_13");
  /* A name expression that names nothing is a compile error, not a crash. */
  const char *names[] = {"rlk_test::no_such_kernel<float>"};
  const char *options[] = {"-DRLK_TEST_FACTOR=2"};
  rlk_compile_request bad = scale_request(T("sm_80"), names, options);
  ck_assert_int_eq(c->compile(c, &bad, &r), RLK_ERR_COMPILE);
  /* A missing in-memory header is a compile error naming it. */
  rlk_compile_request nohdr = bad;
  nohdr.nheaders = 0;
  nohdr.nnames = 0;
  rlk_test_expect_error(c->compile(c, &nohdr, &r), RLK_ERR_COMPILE, "helper.cuh", "helper.cuh");
  c->destroy(c);
}
END_TEST

/* With the environment's `name` set to `value` (left set), `open` is refused as unavailable, gives
 * no compiler and its message names `needle`. */
static void expect_open_unavailable(rlk_status (*open)(rlk_compiler **c), const char *name, const char *value,
                                    const char *needle) {
  setenv(name, value, 1);
  rlk_compiler *c = NULL;
  ck_assert_int_eq(open(&c), RLK_ERR_UNAVAILABLE);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(rlk_last_error(), needle) != NULL, "'%s' lacks '%s'", rlk_last_error(), needle);
}

START_TEST(nvrtc_explicit_library_must_exist) {
  expect_open_unavailable(rlk_nvrtc_open, "RLK_NVRTC_LIB", "/nonexistent/libnvrtc.so.13",
                          "/nonexistent/libnvrtc.so.13");
  /* a long one is tried whole: its first 511 bytes would be another file */
  char path[700];
  size_t n = (size_t)snprintf(path, sizeof path, "/nonexistent");
  while (n < 600) n += (size_t)snprintf(path + n, sizeof path - n, "/d");
  snprintf(path + n, sizeof path - n, "/libnvrtc.so.13");
  expect_open_unavailable(rlk_nvrtc_open, "RLK_NVRTC_LIB", path, "/d/d/libnvrtc.so.13");
  unsetenv("RLK_NVRTC_LIB");
}
END_TEST

/* ---- hiprtc ------------------------------------------------------------------------------ */

START_TEST(hiprtc_compiles) {
  rlk_compiler *c = open_or_skip(rlk_hiprtc_open, "hiprtc");
  if (!c) return;
  ck_assert_str_eq(c->kind, "hiprtc");
  ck_assert_int_eq(strncmp(c->id, "hiprtc-", 7), 0);
  ck_assert(has_option(c, "-DRLK_HIPRTC=1"));
  ck_assert(c->supports_target(c, T("gfx90a")));
  ck_assert(c->supports_target(c, T("gfx90a:sramecc+:xnack-"))); /* the features are dropped */
  ck_assert(!c->supports_target(c, T("sm_90a")));
  uint64_t rng = rlk_test_seed() ^ 0x686970727463ull;
  compile_scale(c, "gfx90a", &rng);
  c->destroy(c);
}
END_TEST

START_TEST(hiprtc_refuses_unknown_targets) {
  rlk_compiler *c = open_or_skip(rlk_hiprtc_open, "hiprtc");
  if (!c) return;
  rlk_compile_request req = {.source = dev_source, .source_name = "scale.cu", .target = T("gfx942")};
  rlk_compile_result r;
  if (atoi(c->version) < 6) {
    /* ROCm 5.x crashes compiling gfx942: refused before hiprtc is called. */
    ck_assert(!c->supports_target(c, T("gfx942")));
    rlk_test_expect_error(c->compile(c, &req, &r), RLK_ERR_UNSUPPORTED, "gfx942", "gfx942");
  } else {
    ck_assert(c->supports_target(c, T("gfx942")));
  }
  req.target = T("gfx9999");
  ck_assert_int_eq(c->compile(c, &req, &r), RLK_ERR_UNSUPPORTED);
  compile_broken(c, "gfx90a");
  c->destroy(c);
}
END_TEST

/* ---- host compiler ----------------------------------------------------------------------- */

static const char *const host_header_names[] = {"rlk_test/export.h"};
static const char *const host_header_sources[] = {
    "#pragma once\n#define RLK_TEST_EXPORT __attribute__((visibility(\"default\")))\n"};

static const char *host_source =
    "#include <math.h>\n"
    "#include \"rlk_test/export.h\"\n"
    "static double square(double x) { return x * x; }\n"
    "RLK_TEST_EXPORT double rlk_test_poly(double x) { return RLK_TEST_A * square(x) + sqrt(x); }\n"
    "double rlk_test_hidden(double x) { return x; }\n";

static rlk_compile_request host_request(const char *target, const char *define, const char **names,
                                        size_t nnames) {
  static const char *options[1];
  options[0] = define;
  rlk_compile_request req = {.source = host_source,
                             .source_name = "poly.c",
                             .nheaders = 1,
                             .header_names = host_header_names,
                             .header_sources = host_header_sources,
                             .target = T(target),
                             .noptions = 1,
                             .options = options,
                             .nnames = nnames,
                             .names = names};
  return req;
}

START_TEST(host_compiles_and_runs) {
  rlk_compiler *c = open_or_skip(rlk_hostcc_open, "host compiler");
  if (!c) return;
  const char *target = rlk_host_target();
  ck_assert_int_eq(strncmp(target, "host-", 5), 0);
  ck_assert_str_eq(c->targets, target);
  ck_assert(c->supports_target(c, T(target)));
  ck_assert(c->supports_target(c, T("host")));
  ck_assert(!c->supports_target(c, T("sm_80")));
  ck_assert_str_eq(c->kind, "clang");
  /* clang-<version>-<16 hex digits of its identity> */
  const size_t vl = strlen(c->version);
  ck_assert_msg(strncmp(c->id, "clang-", 6) == 0 && strncmp(c->id + 6, c->version, vl) == 0 && c->id[6 + vl] == '-' &&
                    strlen(c->id + 7 + vl) == 16,
                "%s", c->id);
  ck_assert(has_option(c, "-ffp-contract=off"));

  uint64_t rng = rlk_test_seed() ^ 0x686f737463ull;
  int a = 1 + (int)(rlk_test_rand_u64(&rng) % 1000);
  char define[48];
  snprintf(define, sizeof define, "-DRLK_TEST_A=%d", a);
  const char *names[] = {"rlk_test_poly"};
  rlk_compile_request req = host_request(target, define, names, 1);
  rlk_compile_result r;
  ck_assert_msg(c->compile(c, &req, &r) == RLK_OK, "%s", rlk_last_error());
  ck_assert(is_elf(&r));
  ck_assert_uint_eq(r.nnames, 1);
  ck_assert_str_eq(r.lowered_names[0], "rlk_test_poly");

  /* The same request gives the same bytes (the private directory's name must not leak). */
  rlk_compile_result again;
  ck_assert_msg(c->compile(c, &req, &again) == RLK_OK, "%s", rlk_last_error());
  ck_assert_uint_eq(again.size, r.size);
  ck_assert(memcmp(again.binary, r.binary, r.size) == 0);
  rlk_compile_result_free(&again);

  /* Load the bytes the way the host backend will and call the function. */
  char dir[512], path[600];
  rlk_test_mkdtemp(dir, sizeof dir, "hostcc");
  snprintf(path, sizeof path, "%s/kernel.so", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, r.binary, r.size), (ssize_t)r.size);
  close(fd);
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(lib != NULL, "dlopen: %s", dlerror());
  double (*poly)(double) = NULL;
  void *sym = dlsym(lib, r.lowered_names[0]);
  ck_assert_ptr_nonnull(sym);
  memcpy(&poly, &sym, sizeof sym);
  for (int i = 0; i < 8; i++) {
    double x = 100.0 * rlk_test_rand_uniform(&rng);
    double want = (double)a * (x * x) + sqrt(x);
    double got = poly(x);
    ck_assert_msg(fabs(got - want) <= 1e-12 * fabs(want), "poly(%.17g) = %.17g, want %.17g", x, got, want);
  }
  /* -fvisibility=hidden: what the template does not export stays inside. */
  ck_assert_ptr_null(dlsym(lib, "rlk_test_hidden"));
  dlclose(lib);
  rlk_test_rmtree(dir);
  rlk_compile_result_free(&r);
  c->destroy(c);
}
END_TEST

/* Writes an executable script at `path`: the shell lines `pre`, then the compiler at `cc` run
 * with `flags` before the arguments (its --version answered by cc itself). */
static void write_wrapper(const char *path, const char *pre, const char *cc, const char *flags) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "#!/bin/sh\n%sexec %s %s \"$@\"\n", pre, cc, flags);
  ck_assert_int_eq(fclose(f), 0);
  ck_assert_int_eq(chmod(path, 0700), 0);
}

/* The compiler's identity is its key's, not its version alone: a wrapper adding flags is another
 * compiler; and the compiler runs without the variables that would change what it builds
 * unkeyed (CCC_OVERRIDE_OPTIONS, CPATH, ...). */
START_TEST(host_identity_is_keyed) {
  rlk_compiler *c = open_or_skip(rlk_hostcc_open, "host compiler");
  if (!c) return;
  char id[64];
  c->destroy(c);
  /* the compiler the default open found, by the same search */
  const char *found = NULL;
  static const char *const names[] = {"/usr/bin/clang-14", "/usr/bin/clang", NULL};
  for (const char *const *n = names; *n && !found; n++)
    if (access(*n, X_OK) == 0) found = *n;
  if (!found) {
    printf("skip (host_identity_is_keyed): no /usr/bin/clang-14 or /usr/bin/clang\n");
    return;
  }
  char dir[512], plain[700], fast[700], leak[700];
  rlk_test_mkdtemp(dir, sizeof dir, "hostcc-id");
  snprintf(plain, sizeof plain, "%s/plain-cc", dir);
  snprintf(fast, sizeof fast, "%s/fast-cc", dir);
  snprintf(leak, sizeof leak, "%s/leak-cc", dir);
  write_wrapper(plain, "", found, "");
  write_wrapper(fast, "", found, "-ffast-math");
  write_wrapper(leak, "if [ -n \"$CPATH$C_INCLUDE_PATH$CCC_OVERRIDE_OPTIONS\" ]; then echo unkeyed >&2; exit 1; fi\n",
                found, "");
  setenv("RLK_HOST_CC", plain, 1);
  ck_assert_msg(rlk_hostcc_open(&c) == RLK_OK, "%s", rlk_last_error());
  snprintf(id, sizeof id, "%s", c->id);
  c->destroy(c);
  setenv("RLK_HOST_CC", fast, 1);
  ck_assert_msg(rlk_hostcc_open(&c) == RLK_OK, "%s", rlk_last_error());
  ck_assert_msg(strcmp(id, c->id) != 0, "a wrapper adding -ffast-math has the plain one's id %s", id);
  c->destroy(c);

  setenv("RLK_HOST_CC", leak, 1);
  setenv("CPATH", "/nonexistent-include", 1);
  setenv("CCC_OVERRIDE_OPTIONS", "+-ffast-math", 1);
  ck_assert_msg(rlk_hostcc_open(&c) == RLK_OK, "%s", rlk_last_error());
  const char *names1[] = {"rlk_test_poly"};
  rlk_compile_request req = host_request(rlk_host_target(), "-DRLK_TEST_A=3", names1, 1);
  rlk_compile_result r;
  ck_assert_msg(c->compile(c, &req, &r) == RLK_OK, "the compiler saw an unkeyed variable: %s", rlk_last_error());
  rlk_compile_result_free(&r);
  c->destroy(c);
  unsetenv("CPATH");
  unsetenv("CCC_OVERRIDE_OPTIONS");
  unsetenv("RLK_HOST_CC");
  rlk_test_rmtree(dir);
}
END_TEST

START_TEST(host_reports_errors) {
  rlk_compiler *c = open_or_skip(rlk_hostcc_open, "host compiler");
  if (!c) return;
  const char *target = rlk_host_target();
  static const char *broken = "int broken(void) { return rlk_undefined_thing + ; }\n";
  rlk_compile_request req = {.source = broken, .source_name = "broken.c", .target = T(target)};
  rlk_compile_result r;
  ck_assert_int_eq(c->compile(c, &req, &r), RLK_ERR_COMPILE);
  const char *msg = rlk_last_error();
  ck_assert_msg(strstr(msg, "broken.c") && strstr(msg, "rlk_undefined_thing") && strstr(msg, "error"),
                "message: %s", msg);
  ck_assert_ptr_null(r.binary);

  /* A requested symbol the object does not export is caught at compile time. */
  const char *hidden[] = {"rlk_test_hidden"};
  rlk_compile_request h = host_request(target, "-DRLK_TEST_A=1", hidden, 1);
  rlk_test_expect_error(c->compile(c, &h, &r), RLK_ERR_COMPILE, "rlk_test_hidden", "rlk_test_hidden");

  /* Requests that could reach outside the private directory or the command line's intent. */
  const char *names[] = {"rlk_test_poly"};
  rlk_compile_request bad = host_request(target, "-o/tmp/rlk-test-escape.so", names, 1);
  ck_assert_int_eq(c->compile(c, &bad, &r), RLK_ERR_INVALID_ARGUMENT);
  bad = host_request(target, "-DRLK_TEST_A=1", names, 1);
  static const char *const up[] = {"../escape.h"};
  bad.header_names = up;
  ck_assert_int_eq(c->compile(c, &bad, &r), RLK_ERR_INVALID_ARGUMENT);
  const char *not_c[] = {"rlk test"};
  bad = host_request(target, "-DRLK_TEST_A=1", not_c, 1);
  ck_assert_int_eq(c->compile(c, &bad, &r), RLK_ERR_INVALID_ARGUMENT);
  bad = host_request("host-nonesuch", "-DRLK_TEST_A=1", names, 1);
  ck_assert_int_eq(c->compile(c, &bad, &r), RLK_ERR_UNSUPPORTED);
  c->destroy(c);
}
END_TEST

START_TEST(host_missing_compiler) {
  expect_open_unavailable(rlk_hostcc_open, "RLK_HOST_CC", "rlk-no-such-compiler", "RLK_HOST_CC");
  rlk_compiler *c = NULL;
  /* A compiler that is not clang is refused. */
  setenv("RLK_HOST_CC", "/bin/true", 1);
  rlk_test_expect_error(rlk_hostcc_open(&c), RLK_ERR_UNAVAILABLE, "not clang", "rlk_hostcc_open");
  /* With no clang on PATH the message says how to install one. */
  unsetenv("RLK_HOST_CC");
  char *old = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
  setenv("PATH", "/nonexistent", 1);
  rlk_test_expect_error(rlk_hostcc_open(&c), RLK_ERR_UNAVAILABLE, "apt-get install clang", "rlk_hostcc_open");
  if (old) setenv("PATH", old, 1);
  free(old);
}
END_TEST

static int count_dir_entries(const char *path) {
  DIR *d = opendir(path);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) n += de->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Whether a process is gone (a zombie nobody has reaped yet counts as gone). */
static int process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *paren = strrchr(buf, ')');
  return paren && paren[1] == ' ' && paren[2] == 'Z';
}

/* A process killed with SIGKILL mid-compile leaves no compiler running and no work directory
 * (the guard between it and the compiler removes it); one left by a dead process (a guard killed
 * too) is removed by the next process that opens the host compiler. */
START_TEST(host_compiler_dies_with_its_parent) {
  char dir[512], script[600], pidfile[600], tmp[600];
  rlk_test_mkdtemp(dir, sizeof dir, "ccdeath");
  snprintf(script, sizeof script, "%s/fake-clang", dir);
  snprintf(pidfile, sizeof pidfile, "%s/pid", dir);
  snprintf(tmp, sizeof tmp, "%s/tmp", dir);
  ck_assert_int_eq(mkdir(tmp, 0700), 0);
  FILE *f = fopen(script, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f,
          "#!/bin/sh\n"
          "if [ \"$1\" = --version ]; then echo 'clang version 14.0.6'; exit 0; fi\n"
          "echo $$ > '%s.tmp' && mv '%s.tmp' '%s'\n"
          "exec sleep 120\n",
          pidfile, pidfile, pidfile);
  fclose(f);
  ck_assert_int_eq(chmod(script, 0700), 0);
  pid_t child = rlk_test_fork();
  if (child == 0) {
    setenv("RLK_HOST_CC", script, 1);
    setenv("TMPDIR", tmp, 1);
    rlk_compiler *c = NULL;
    if (rlk_hostcc_open(&c) != RLK_OK) _exit(1);
    const char *names[] = {"rlk_test_poly"};
    rlk_compile_request req = host_request(rlk_host_target(), "-DRLK_TEST_A=1", names, 1);
    rlk_compile_result r;
    c->compile(c, &req, &r); /* blocks in the fake compiler */
    _exit(2);
  }
  pid_t compiler = 0;
  for (int i = 0; i < 1000 && compiler <= 0; i++) {
    FILE *p = fopen(pidfile, "r");
    if (p) {
      long v = 0;
      if (fscanf(p, "%ld", &v) == 1) compiler = (pid_t)v;
      fclose(p);
    }
    if (compiler <= 0) usleep(10000);
  }
  ck_assert_msg(compiler > 0, "the fake compiler never started");
  ck_assert_int_eq(kill(child, SIGKILL), 0);
  int status = 0;
  ck_assert_int_eq(waitpid(child, &status, 0), child);
  int gone = 0;
  for (int i = 0; i < 500 && !gone; i++) {
    gone = process_gone(compiler);
    if (!gone) usleep(10000);
  }
  if (!gone) kill(compiler, SIGKILL);
  ck_assert_msg(gone, "the compiler (pid %ld) outlived the process that started it", (long)compiler);

  /* The killed process's work directory goes with it: its compile's guard removes it. */
  int left = 1;
  for (int i = 0; i < 500 && left; i++) {
    left = count_dir_entries(tmp);
    if (left) usleep(10000);
  }
  ck_assert_msg(left == 0, "the killed process's work directory is still under %s", tmp);
  /* one an older version left behind is removed by the next open */
  char stale[700];
  snprintf(stale, sizeof stale, "%s/rlk-cc-999999999-abcdef", tmp);
  ck_assert_int_eq(mkdir(stale, 0700), 0);
  setenv("RLK_HOST_CC", script, 1);
  setenv("TMPDIR", tmp, 1);
  rlk_compiler *c = NULL;
  ck_assert_int_eq(rlk_hostcc_open(&c), RLK_OK);
  c->destroy(c);
  unsetenv("RLK_HOST_CC");
  unsetenv("TMPDIR");
  ck_assert_int_eq(count_dir_entries(tmp), 0);
}
END_TEST

/* ---- dynlib ------------------------------------------------------------------------------ */

START_TEST(dynlib_names_missing_symbols) {
  double (*cosine)(double) = NULL;
  void (*absent)(void) = NULL;
  memset(&absent, 0xa5, sizeof absent); /* must come back NULL */
  const char *const candidates[] = {"librlk-no-such-library.so.1", "libm.so.6"};
  rlk_dynlib_symbol required[] = {{"cos", &cosine, 0}, {"rlk_no_such_symbol", &absent, 0}};
  rlk_dynlib lib;
  ck_assert_int_eq(rlk_dynlib_open(&lib, "libm", candidates, 2, required, 2), RLK_ERR_UNAVAILABLE);
  ck_assert_ptr_null(lib.handle);
  const char *msg = rlk_last_error();
  ck_assert_msg(strstr(msg, "rlk_no_such_symbol") && strstr(msg, "librlk-no-such-library.so.1"), "%s", msg);

  required[1].optional = 1;
  ck_assert_int_eq(rlk_dynlib_open(&lib, "libm", candidates, 2, required, 2), RLK_OK);
  ck_assert_str_eq(lib.path, "libm.so.6");
  ck_assert_ptr_nonnull(cosine);
  ck_assert_ptr_null(absent);
  uint64_t rng = rlk_test_seed();
  double x = rlk_test_rand_uniform(&rng);
  ck_assert(cosine(x) == cos(x));
  rlk_dynlib_symbol more[] = {{"rlk_no_such_symbol", &absent, 0}};
  rlk_test_expect_error(rlk_dynlib_resolve(&lib, "libm", more, 1), RLK_ERR_UNAVAILABLE, "rlk_no_such_symbol",
                        "rlk_dynlib_resolve");
  rlk_dynlib_close(&lib);
  ck_assert_ptr_null(lib.handle);
  rlk_dynlib_close(&lib);
}
END_TEST

/* ---- shared helpers ---------------------------------------------------------------------- */

START_TEST(target_lists_match_whole_words) {
  ck_assert(rlk_target_list_has("sm_80 sm_90 sm_90a", "sm_90"));
  ck_assert(rlk_target_list_has("sm_80 sm_90 sm_90a", "sm_90a"));
  ck_assert(rlk_target_list_has("sm_80 sm_90 sm_90a", "sm_80"));
  ck_assert(!rlk_target_list_has("sm_80 sm_90 sm_90a", "sm_9"));
  ck_assert(!rlk_target_list_has("sm_80 sm_90 sm_90a", "sm_90 "));
  ck_assert(!rlk_target_list_has("sm_80 sm_90 sm_90a", "m_80"));
  ck_assert(!rlk_target_list_has("sm_80 sm_90 sm_90a", ""));
  ck_assert(!rlk_target_list_has("", "sm_80"));
}
END_TEST

START_TEST(long_logs_are_cut_to_their_head) {
  uint64_t rng = rlk_test_seed() ^ 0x6c6f67ull;
  size_t len = RLK_COMPILE_LOG_EXCERPT + 1000 + rlk_test_rand_u64(&rng) % 20000;
  char *log = malloc(len + 1);
  ck_assert_ptr_nonnull(log);
  for (size_t i = 0; i < len; i++) log[i] = (char)('a' + rlk_test_rand_u64(&rng) % 26);
  memcpy(log, "first error", 11);
  log[len] = '\0';
  rlk_compiler fake = {.kind = "nvrtc"};
  rlk_compile_request req = {.source = "", .source_name = "x.cu", .target = T("sm_80")};
  ck_assert_int_eq(rlk_compile_error(&fake, &req, NULL, log), RLK_ERR_COMPILE);
  const char *msg = rlk_last_error();
  ck_assert_msg(strncmp(msg, "nvrtc: x.cu for sm_80: first error", 34) == 0, "%.80s", msg);
  char more[64];
  snprintf(more, sizeof more, "[... %zu more bytes of log]", len - RLK_COMPILE_LOG_EXCERPT);
  ck_assert_ptr_nonnull(strstr(msg, more));
  ck_assert_uint_lt(strlen(msg), RLK_COMPILE_LOG_EXCERPT + 200);
  /* A short log is kept whole, after the detail. */
  ck_assert_int_eq(rlk_compile_error(&fake, &req, "status 3", "one line\n\n"), RLK_ERR_COMPILE);
  ck_assert_str_eq(rlk_last_error(), "nvrtc: x.cu for sm_80: status 3\none line");
  free(log);
}
END_TEST

Suite *compiler_suite(void) {
  Suite *s = suite_create("compiler");
  rlk_test_add_case(s, "compiler", 120, TESTS(dynlib_names_missing_symbols, target_lists_match_whole_words,
      long_logs_are_cut_to_their_head, nvrtc_opens, nvrtc_compiles_templates,
      nvrtc_compiles_ptx_for_compute_targets, nvrtc_reports_errors, nvrtc_explicit_library_must_exist,
      hiprtc_compiles, hiprtc_refuses_unknown_targets, host_compiles_and_runs, host_identity_is_keyed, host_reports_errors,
      host_missing_compiler, host_compiler_dies_with_its_parent));
  return s;
}
