/* test_util.c - shared test helpers. */
#include "test_util.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ops/ops.h"

extern char **environ;

static char tmp_root[1024];
static uint64_t run_seed;

int rlk_test_setup_env(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tmp_root, sizeof tmp_root, "%s/rlk-test-XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(tmp_root)) {
    perror("mkdtemp");
    return -1;
  }
  char path[1200];
  snprintf(path, sizeof path, "%s/cache", tmp_root);
  mkdir(path, 0700);
  setenv("RLK_CACHE_DIR", path, 1);
  snprintf(path, sizeof path, "%s/locks", tmp_root);
  mkdir(path, 0700);
  setenv("RLK_LOCK_DIR", path, 1);
  /* RLK_TEST_RO_CACHE: kernels precompiled for this run with workers (make test-gpu) */
  const char *ro = getenv("RLK_TEST_RO_CACHE");
  if (ro && *ro)
    setenv("RLK_CACHE_RO_DIRS", ro, 1);
  else
    unsetenv("RLK_CACHE_RO_DIRS");
  unsetenv("RLK_JIT");
  unsetenv("RLK_CACHE_MODE");
  unsetenv("RLK_CACHE_MAX_BYTES");
  /* the tuning database defaults to <cache root>/tune.db: the run's own */
  unsetenv("RLK_TUNE_DB");
  unsetenv("RLK_TUNE");
  unsetenv("RLK_LOGPROB_VARIANT");
  const char *seed = getenv("RLK_TEST_SEED");
  run_seed = seed ? strtoull(seed, NULL, 0) : ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)getpid();
  printf("rlk tests: seed %llu (RLK_TEST_SEED to repeat), scratch %s\n", (unsigned long long)run_seed, tmp_root);
  fflush(stdout);
  return 0;
}

void rlk_test_teardown_env(void) {
  if (tmp_root[0] && !getenv("RLK_TEST_KEEP")) rlk_test_rmtree(tmp_root);
}

const char *rlk_test_tmpdir(void) { return tmp_root; }

void rlk_test_mkdtemp(char *buf, size_t size, const char *stem) {
  const int n = snprintf(buf, size, "%s/%s-XXXXXX", tmp_root, stem ? stem : "d");
  ck_assert_msg(n > 0 && (size_t)n < size, "rlk_test_mkdtemp: a %zu-byte buffer is too small", size);
  ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp %s failed", buf);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)ftw;
  if (flag == FTW_DP || flag == FTW_D) {
    chmod(path, 0700);
    rmdir(path);
  } else {
    unlink(path);
  }
  return 0;
}

void rlk_test_rmtree(const char *path) {
  /* make every directory writable first so read-only test trees can be removed */
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s' 2>/dev/null", path);
  if (system(cmd) != 0) { /* best effort */
  }
  nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS);
}

void rlk_test_rmtrees(const char *const *paths) {
  for (; *paths; paths++) rlk_test_rmtree(*paths);
}

int rlk_test_gpu_enabled(const char *what) {
  const char *g = getenv("RLK_TEST_GPU");
  if (!g || strcmp(g, "1") != 0) {
    printf("skip (%s): GPU cases need RLK_TEST_GPU=1 (make test-gpu) and a CUDA device\n", what);
    fflush(stdout);
    return 0;
  }
  return 1;
}

uint64_t rlk_test_seed(void) { return run_seed; }

uint64_t rlk_test_rand_u64(uint64_t *s) {
  /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double rlk_test_rand_uniform(uint64_t *s) { return (double)(rlk_test_rand_u64(s) >> 11) * 0x1.0p-53; }

double rlk_test_rand_normal(uint64_t *s) {
  double u1 = rlk_test_rand_uniform(s), u2 = rlk_test_rand_uniform(s);
  if (u1 < 1e-300) u1 = 1e-300;
  return __builtin_sqrt(-2.0 * __builtin_log(u1)) * __builtin_cos(6.283185307179586 * u2);
}

double rlk_test_rand_unit(uint64_t *s) { return 1.7320508075688772 * (2.0 * rlk_test_rand_uniform(s) - 1.0); }

double rlk_test_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

const char *rlk_test_bin_dir(void) {
  const char *d = getenv("RLK_TEST_BIN_DIR");
  return d && *d ? d : "build/bin";
}

uint64_t rlk_test_compiles(rlk_context *ctx) {
  rlk_counters c;
  ck_assert_int_eq(rlk_context_counters(ctx, &c), RLK_OK);
  return c.compiles;
}

rlk_context *rlk_test_compile_only_host_context(void) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_HOST;
  o.compile_only = 1;
  rlk_context *ctx = NULL;
  rlk_status st = rlk_context_create(&ctx, &o);
  ck_assert_msg(st == RLK_OK, "compile-only host context: %s: %s", rlk_status_string(st), rlk_last_error());
  return ctx;
}

rlk_context *rlk_test_compile_only_context(rlk_backend backend, const char *target, const char *what) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = backend;
  o.compile_only = 1;
  o.target = target;
  rlk_context *ctx = NULL;
  if (rlk_context_create(&ctx, &o) != RLK_OK) {
    printf("skip (%s): no compile-only %s context for %s: %s\n", what, rlk_backend_name(backend),
           target ? target : "host", rlk_last_error());
    return NULL;
  }
  return ctx;
}

rlk_context *rlk_test_compile_only_cuda_context(const char *target, const char *what) {
  return rlk_test_compile_only_context(RLK_BACKEND_CUDA, target, what);
}

rlk_context *rlk_test_context_at(rlk_backend backend, const char *cache_dir) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = backend;
  o.cache_dir = cache_dir;
  rlk_context *ctx = NULL;
  rlk_status st = rlk_context_create(&ctx, &o);
  ck_assert_msg(st == RLK_OK, "%s context: %s: %s", rlk_backend_name(backend), rlk_status_string(st),
                rlk_last_error());
  return ctx;
}

rlk_context *rlk_test_child_host_context(const char *cache_dir) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_HOST;
  o.cache_dir = cache_dir;
  rlk_context *ctx = NULL;
  return rlk_context_create(&ctx, &o) == RLK_OK ? ctx : NULL;
}

rlk_context *rlk_test_host_context(void) { return rlk_test_context_at(RLK_BACKEND_HOST, NULL); }

rlk_context *rlk_test_fresh_host_context(void) {
  char dir[1100]; /* the scratch root and "/plan-XXXXXX" */
  rlk_test_mkdtemp(dir, sizeof dir, "plan");
  return rlk_test_context_at(RLK_BACKEND_HOST, dir);
}

rlk_context *rlk_test_precompiled_host_context(const char *line, int kernels) {
  rlk_context *ctx = rlk_test_fresh_host_context();
  int n = 0;
  ck_assert_msg(rlk_precompile(ctx, line, &n) == RLK_OK, "%s: %s", line, rlk_last_error());
  ck_assert_int_eq(n, kernels);
  ck_assert_uint_eq(rlk_test_compiles(ctx), (uint64_t)kernels);
  return ctx;
}

void rlk_test_expect_compiled_none(rlk_context *ctx, uint64_t before, const char *what) {
  const uint64_t after = rlk_test_compiles(ctx);
  ck_assert_msg(after == before, "%s: the calls compiled %llu more kernels", what, (unsigned long long)(after - before));
  rlk_context_destroy(ctx);
}

pid_t rlk_test_fork(void) {
  fflush(NULL);
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  return pid;
}

void rlk_test_race_children(int n, int (*run)(int i, const void *arg), const void *arg, const char *what) {
  pid_t *pids = malloc((size_t)n * sizeof *pids);
  ck_assert_ptr_nonnull(pids);
  int gate[2];
  ck_assert_int_eq(pipe(gate), 0);
  for (int i = 0; i < n; i++) {
    pids[i] = rlk_test_fork();
    if (pids[i] == 0) {
      close(gate[1]);
      char c;
      while (read(gate[0], &c, 1) > 0) {
      }
      _exit(run(i, arg));
    }
  }
  close(gate[0]);
  close(gate[1]); /* everyone starts at once */
  for (int i = 0; i < n; i++) {
    int status = 0;
    ck_assert_int_eq(waitpid(pids[i], &status, 0), pids[i]);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s %d failed (%d)", what, i,
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  free(pids);
}

void rlk_test_expect_call_done(rlk_context *ctx, rlk_status st, const char *what) {
  ck_assert_msg(st == RLK_OK, "%s: %s: %s", what, rlk_status_string(st), rlk_last_error());
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
}

void rlk_test_expect_error(rlk_status st, rlk_status want, const char *arg, const char *label) {
  ck_assert_msg(st == want, "%s: status %s, expected %s (%s)", label, rlk_status_string(st), rlk_status_string(want),
                rlk_last_error());
  ck_assert_msg(strstr(rlk_last_error(), arg) != NULL, "%s: message '%s' does not name '%s'", label,
                rlk_last_error(), arg);
}

void rlk_test_expect_bad_lines(const char *const (*bad)[2], size_t n) {
  rlk_context *ctx = rlk_test_host_context();
  for (size_t i = 0; i < n; i++) {
    rlk_test_expect_error(rlk_precompile(ctx, bad[i][0], NULL), RLK_ERR_INVALID_ARGUMENT, bad[i][1], bad[i][0]);
  }
  rlk_context_destroy(ctx);
}

size_t rlk_test_split_line(const char *line, char *copy, size_t size, rlk_op_config_pair *pairs) {
  const char *sp = strchr(line, ' ');
  snprintf(copy, size, "%s", sp ? sp + 1 : "");
  size_t np = 0;
  char *save = NULL;
  for (char *tok = strtok_r(copy, " ", &save); tok && np < 16; tok = strtok_r(NULL, " ", &save)) {
    char *eq = strchr(tok, '=');
    ck_assert_ptr_nonnull(eq);
    *eq = '\0';
    pairs[np].name = tok;
    pairs[np].value = eq + 1;
    np++;
  }
  return np;
}

rlk_status rlk_test_plan_line(const rlk_op_desc *op, const rlk_context *ctx, const char *line, rlk_kernel_spec *specs,
                              size_t *n) {
  char copy[1024];
  rlk_op_config_pair pairs[16];
  const size_t np = rlk_test_split_line(line, copy, sizeof copy, pairs);
  return rlk_op_plan(op, ctx, np, pairs, specs, n);
}

/* ---- compiling every sample configuration of some ops for every target ------------- */


/* The targets every op's samples compile for: the host, CUDA sm_80 (fallback paths) and
 * sm_90a (Hopper), sm_100a and sm_120a (datacenter and consumer Blackwell: no wgmma, so the
 * kernels they get are the fallbacks, which NVRTC must accept for them), HIP gfx90a and gfx1030
 * (RDNA, in wave64 mode). `make test` takes the host and sm_90a (`in_default`: the compiler the
 * developer loop needs and the arch with the most kernels), so it stays quick on two cores;
 * RLK_TEST_TARGETS names others ("all", or a comma list of names: `make test-targets`, which CI
 * also runs, takes sm_80, sm_100a, sm_120a, gfx90a and gfx1030). */
static const struct {
  rlk_backend backend;
  const char *target;
  int in_default;
} sample_targets[] = {{RLK_BACKEND_HOST, NULL, 1},
                      {RLK_BACKEND_CUDA, "sm_80", 0},
                      {RLK_BACKEND_CUDA, "sm_90a", 1},
                      {RLK_BACKEND_CUDA, "sm_100a", 0},
                      {RLK_BACKEND_CUDA, "sm_120a", 0},
                      {RLK_BACKEND_HIP, "gfx90a", 0},
                      {RLK_BACKEND_HIP, "gfx1030", 0}};
enum { N_SAMPLE_TARGETS = sizeof sample_targets / sizeof sample_targets[0] };

/* Whether RLK_TEST_TARGETS (or the default set) selects target i; an unknown name fails. */
static int sample_target_selected(int i) {
  const char *sel = getenv("RLK_TEST_TARGETS");
  if (!sel || !*sel) return sample_targets[i].in_default;
  if (!strcmp(sel, "all")) return 1;
  int hit = 0;
  char copy[256];
  snprintf(copy, sizeof copy, "%s", sel);
  char *save = NULL;
  for (char *w = strtok_r(copy, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
    int known = 0;
    for (int k = 0; k < N_SAMPLE_TARGETS; k++) {
      const char *name = sample_targets[k].target ? sample_targets[k].target : "host";
      known |= !strcmp(w, name);
      hit |= k == i && !strcmp(w, name);
    }
    ck_assert_msg(known, "RLK_TEST_TARGETS: unknown target '%s' (host, sm_80, sm_90a, sm_100a, sm_120a, gfx90a, gfx1030, all)",
                  w);
  }
  return hit;
}

/* One target, in a child process (no Check assertions here): writes "ok ...", "skip ..." or
 * "fail ..." into msg. */
static void compile_samples_for(const char *label, const rlk_op_desc *const *ops, size_t nops,
                                rlk_backend backend, const char *target, char *msg, size_t size) {
  const char *name = target ? target : "host";
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = backend;
  o.compile_only = backend != RLK_BACKEND_HOST;
  o.target = target;
  rlk_context *ctx = NULL;
  rlk_status st = rlk_context_create(&ctx, &o);
  if (st == RLK_ERR_UNAVAILABLE || st == RLK_ERR_UNSUPPORTED) {
    snprintf(msg, size, "skip (%s samples for %s): %s", label, name, rlk_last_error());
    return;
  }
  if (st != RLK_OK) {
    snprintf(msg, size, "fail %s context: %s", name, rlk_last_error());
    return;
  }
  int total = 0;
  for (size_t k = 0; k < nops; k++)
    for (size_t i = 0; ops[k]->samples && ops[k]->samples[i]; i++) {
      int n = 0;
      st = rlk_precompile(ctx, ops[k]->samples[i], &n);
      if (st != RLK_OK || n <= 0) {
        snprintf(msg, size, "fail %s: %s: %s", name, ops[k]->samples[i], rlk_last_error());
        rlk_context_destroy(ctx);
        return;
      }
      total += n;
    }
  rlk_counters c;
  rlk_context_counters(ctx, &c);
  snprintf(msg, size, "ok %s samples for %s: %d kernels (%llu compiled in %.1f s, %llu from disk)", label,
           name, total, (unsigned long long)c.compiles, c.compile_seconds, (unsigned long long)c.disk_hits);
  rlk_context_destroy(ctx);
}

/* Reads target i's child's message, reaps it and checks what it says. */
static void collect_samples_child(int i, pid_t pid, int fd) {
  char msg[2048];
  size_t len = 0;
  ssize_t r;
  while (len + 1 < sizeof msg && (r = read(fd, msg + len, sizeof msg - 1 - len)) > 0) len += (size_t)r;
  msg[len] = '\0';
  close(fd);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  const char *name = sample_targets[i].target ? sample_targets[i].target : "host";
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: child failed (%d): %s", name, status, msg);
  ck_assert_msg(strncmp(msg, "ok", 2) == 0 || strncmp(msg, "skip", 4) == 0, "%s: %s", name, msg);
  /* the host compiler is part of every supported setup: it must not be skipped */
  if (sample_targets[i].backend == RLK_BACKEND_HOST) ck_assert_msg(msg[0] == 'o', "%s", msg);
  printf("%s\n", msg);
}

/* Children compiling at once: RLK_TEST_COMPILE_JOBS, else half the CPUs (make test runs two
 * suites per two CPUs; more compilers than cores only thrash). */
static int compile_jobs(void) {
  const char *v = getenv("RLK_TEST_COMPILE_JOBS");
  if (v && atoi(v) > 0) return atoi(v);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n >= 4 ? (int)(n / 2) : 1;
}

void rlk_test_compile_samples(const char *label, const rlk_op_desc *const *ops, size_t nops) {
  pid_t pids[N_SAMPLE_TARGETS];
  int fds[N_SAMPLE_TARGETS], order[N_SAMPLE_TARGETS]; /* order: targets in the order started */
  const int jobs = compile_jobs();
  int started = 0, done = 0;
  for (int i = 0; i < N_SAMPLE_TARGETS; i++) {
    if (!sample_target_selected(i)) continue;
    if (started - done >= jobs) {
      const int k = order[done++];
      collect_samples_child(k, pids[k], fds[k]);
    }
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0) {
      close(p[0]);
      char msg[2048];
      compile_samples_for(label, ops, nops, sample_targets[i].backend, sample_targets[i].target, msg,
                          sizeof msg);
      ssize_t w = write(p[1], msg, strlen(msg));
      _exit(w > 0 ? 0 : 3);
    }
    close(p[1]);
    fds[i] = p[0];
    order[started++] = i;
  }
  while (done < started) {
    const int k = order[done++];
    collect_samples_child(k, pids[k], fds[k]);
  }
  fflush(stdout);
}

/* ---- running the built tools ---------------------------------------------------------- */

void rlk_test_tool_free(rlk_test_tool_run *r) {
  free(r->out);
  r->out = NULL;
}

static int env_overridden(const char *entry, const char *const *env) {
  size_t n = strcspn(entry, "=");
  for (size_t i = 0; env && env[i]; i++) {
    const char *name = env[i][0] == '!' ? env[i] + 1 : env[i];
    size_t m = strcspn(name, "=");
    if (m == n && !strncmp(entry, name, n)) return 1;
  }
  return 0;
}

rlk_test_tool_run rlk_test_run_tool(const char *const *env, const char *tool, const char *const *args) {
  return rlk_test_run_tool_to(NULL, env, tool, args);
}

rlk_test_tool_run rlk_test_run_tool_to(const char *stdout_path, const char *const *env, const char *tool,
                                       const char *const *args) {
  static const char *const base_unset[] = {"!RLK_CACHE_RO_DIRS", "!RLK_JIT", "!RLK_CACHE_MODE",
                                           "!RLK_CACHE_MAX_BYTES", "!RLK_TUNE", NULL};
  rlk_test_tool_run r = {-1, NULL};
  char path[2048];
  snprintf(path, sizeof path, "%s/%s", rlk_test_bin_dir(), tool);
  ck_assert_msg(access(path, X_OK) == 0, "%s is not built (make tools; RLK_TEST_BIN_DIR=%s)", path,
                rlk_test_bin_dir());

  size_t nenv = 0, nargs = 0, nover = 0;
  while (environ[nenv]) nenv++;
  while (args && args[nargs]) nargs++;
  while (env && env[nover]) nover++;
  char **envp = calloc(nenv + nover + 1, sizeof *envp);
  char **argv = calloc(nargs + 2, sizeof *argv);
  ck_assert(envp && argv);
  size_t k = 0;
  for (size_t i = 0; i < nenv; i++)
    if (!env_overridden(environ[i], env) && !env_overridden(environ[i], base_unset))
      envp[k++] = environ[i];
  for (size_t i = 0; i < nover; i++)
    if (env[i][0] != '!') envp[k++] = (char *)env[i];
  envp[k] = NULL;
  argv[0] = path;
  for (size_t i = 0; i < nargs; i++) argv[i + 1] = (char *)args[i];
  argv[nargs + 1] = NULL;

  int p[2];
  ck_assert(pipe(p) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ck_assert(pid >= 0);
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    int out = stdout_path ? open(stdout_path, O_WRONLY) : p[1];
    if (out < 0) _exit(126);
    dup2(out, 1);
    dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    execve(path, argv, envp);
    _exit(127);
  }
  close(p[1]);
  size_t len = 0, cap = 4096;
  char *buf = malloc(cap);
  ck_assert(buf);
  for (;;) {
    if (cap - len < 1024) {
      cap *= 2;
      buf = realloc(buf, cap);
      ck_assert(buf);
    }
    ssize_t n = read(p[0], buf + len, cap - len - 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
  }
  buf[len] = '\0';
  close(p[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = buf;
  free(envp);
  free(argv);
  return r;
}

TCase *rlk_test_add_case(Suite *s, const char *name, double timeout, const TTest *const *tests) {
  TCase *tc = tcase_create(name);
  if (timeout > 0) tcase_set_timeout(tc, timeout);
  for (size_t i = 0; tests[i]; i++) tcase_add_test(tc, tests[i]);
  suite_add_tcase(s, tc);
  return tc;
}

int rlk_test_count_lines(const char *out, const char *needle) {
  int n = 0;
  const char *p = out;
  while (*p) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    char *line = strndup(p, len);
    if (line && strstr(line, needle)) n++;
    free(line);
    p += len + (nl ? 1 : 0);
  }
  return n;
}

void rlk_test_expect_line_counts(const char *out, const rlk_test_line_count *counts, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++) {
    const int got = rlk_test_count_lines(out, counts[i].needle);
    ck_assert_msg(got == counts[i].lines, "%s: %d lines with '%s', expected %d; output:\n%s", what, got,
                  counts[i].needle, counts[i].lines, out);
  }
}

long rlk_test_last_value(const char *out, const char *name) {
  const char *p = out, *last = NULL;
  while ((p = strstr(p, name))) last = p++;
  if (!last) return -1;
  return strtol(last + strlen(name), NULL, 10);
}

rlk_context *rlk_test_cuda_context(const char *what) {
  if (!rlk_test_gpu_enabled(what)) return NULL;
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_CUDA;
  rlk_context *ctx = NULL;
  /* RLK_TEST_GPU=1 says a device is here: a context that cannot be made is a failure, never a
   * skip (a skip would let every GPU case pass on a machine whose driver is broken) */
  const rlk_status st = rlk_context_create(&ctx, &o);
  ck_assert_msg(st == RLK_OK, "%s: RLK_TEST_GPU=1 but no CUDA context: %s: %s", what, rlk_status_string(st),
                rlk_last_error());
  return ctx;
}

int rlk_test_is_poison(const void *base, rlk_dtype d, int64_t i) {
  const size_t n = rlk_dtype_size(d);
  const unsigned char *p = (const unsigned char *)base + (size_t)i * n;
  for (size_t k = 0; k < n; k++)
    if (p[k] != 0xff) return 0;
  return 1;
}

void rlk_test_expect_untouched(const void *base, rlk_dtype d, int64_t n, const char *what, const char *label) {
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(rlk_test_is_poison(base, d, i), "%s: %s written (element %lld)", label, what, (long long)i);
}

void *rlk_test_dev_alloc(rlk_context *ctx, size_t bytes) {
  void *p = NULL;
  rlk_status st = rlk_malloc(ctx, bytes > 16 ? bytes : 16, &p);
  ck_assert_msg(st == RLK_OK, "rlk_malloc(%zu): %s", bytes, rlk_last_error());
  /* poisoned: an output a kernel leaves unwritten reads NaN (or -1), never what an earlier
   * allocation of the same size held */
  st = rlk_memset(ctx, p, 0xff, bytes > 16 ? bytes : 16);
  ck_assert_msg(st == RLK_OK, "rlk_memset(%zu): %s", bytes, rlk_last_error());
  return p;
}

void rlk_test_workspace(rlk_context *ctx, rlk_status size_status, const size_t *bytes, void **ws, size_t *ws_bytes) {
  ck_assert_msg(size_status == RLK_OK, "workspace size: %s", rlk_last_error());
  *ws = *bytes ? rlk_test_dev_alloc(ctx, *bytes) : NULL;
  *ws_bytes = *bytes;
}

void *rlk_test_dev_upload(rlk_context *ctx, const void *src, size_t bytes) {
  void *p = rlk_test_dev_alloc(ctx, bytes);
  ck_assert_int_eq(rlk_memcpy_to_device(ctx, p, src, bytes), RLK_OK);
  return p;
}

void *rlk_test_put(rlk_context *ctx, const void *src, size_t bytes) {
  if (rlk_context_backend(ctx) != RLK_BACKEND_HOST) return rlk_test_dev_upload(ctx, src, bytes);
  void *p = malloc(bytes ? bytes : 1);
  ck_assert(p);
  memcpy(p, src, bytes);
  return p;
}

void *rlk_test_poisoned(rlk_context *ctx, size_t bytes) {
  void *h = malloc(bytes ? bytes : 1);
  ck_assert(h);
  memset(h, 0xff, bytes);
  void *p = rlk_test_put(ctx, h, bytes);
  free(h);
  return p;
}

void rlk_test_get(rlk_context *ctx, void *dst, const void *src, size_t bytes) {
  if (rlk_context_backend(ctx) == RLK_BACKEND_HOST)
    memcpy(dst, src, bytes);
  else
    ck_assert_int_eq(rlk_memcpy_to_host(ctx, dst, src, bytes), RLK_OK);
}

void rlk_test_drop(rlk_context *ctx, void *p) {
  if (rlk_context_backend(ctx) == RLK_BACKEND_HOST)
    free(p);
  else
    rlk_free(ctx, p);
}

/* A [B, T] tensor of dtype d with rows S apart, filled with `fill` (padding included), uploaded
 * with dense[b * T + t] at its place; dense is then replaced by what the dtype stored. */
void *rlk_test_upload_offsets(rlk_context *ctx, rlk_dtype d, const int64_t *offs, int64_t n) {
  if (d != RLK_I32) return rlk_test_dev_upload(ctx, offs, (size_t)n * sizeof *offs);
  int32_t *o32 = malloc((size_t)n * sizeof *o32);
  ck_assert_ptr_nonnull(o32);
  for (int64_t i = 0; i < n; i++) o32[i] = (int32_t)offs[i];
  void *dev = rlk_test_dev_upload(ctx, o32, (size_t)n * sizeof *o32);
  free(o32);
  return dev;
}

int64_t rlk_test_random_group_sizes(uint64_t *rng, int64_t B, int64_t max, int64_t *sizes) {
  int64_t n = 0, left = B;
  while (left > 0) {
    int64_t s = 1 + (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)max);
    if (rlk_test_rand_uniform(rng) < 0.15) s = 1;
    if (s > left) s = left;
    sizes[n++] = s;
    left -= s;
  }
  return n;
}

rlk_tensor rlk_test_block_row(void *block, rlk_dtype d, int64_t i, int64_t n) {
  return rlk_tensor_1d((char *)block + (size_t)(i * n) * rlk_dtype_size(d), d, n);
}

rlk_tensor rlk_test_tensor_3d(void *data, rlk_dtype dt, int64_t a, int64_t b, int64_t c) {
  const int64_t shape[3] = {a, b, c}, strides[3] = {b * c, c, 1};
  rlk_tensor t = rlk_tensor_1d(data, dt, a * b * c);
  t.ndim = 3;
  memcpy(t.shape, shape, sizeof shape);
  memcpy(t.strides, strides, sizeof strides);
  return t;
}

void *rlk_test_upload_rows(rlk_context *ctx, rlk_dtype d, int64_t B, int64_t T, int64_t S, double fill,
                           double *dense) {
  const size_t es = rlk_dtype_size(d), elems = (size_t)((B - 1) * S + T);
  void *h = malloc(elems * es);
  for (size_t i = 0; i < elems; i++) rlk_test_store(h, d, (int64_t)i, fill);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      rlk_test_store(h, d, b * S + t, dense[b * T + t]);
      dense[b * T + t] = rlk_test_load(h, d, b * S + t);
    }
  void *p = rlk_test_dev_upload(ctx, h, elems * es);
  free(h);
  return p;
}

double rlk_test_store(void *base, rlk_dtype d, int64_t i, double v) {
  if (d == RLK_F64) {
    ((double *)base)[i] = v;
    return v;
  }
  if (d == RLK_I32) {
    ((int32_t *)base)[i] = (int32_t)v;
    return (double)(int32_t)v;
  }
  if (d == RLK_I64) {
    ((int64_t *)base)[i] = (int64_t)v;
    return (double)(int64_t)v;
  }
  if (d == RLK_BOOL) {
    ((uint8_t *)base)[i] = (uint8_t)(v != 0);
    return v != 0 ? 1.0 : 0.0;
  }
  const float f = (float)v;
  if (d == RLK_F32) {
    ((float *)base)[i] = f;
    return (double)f;
  }
  if (d == RLK_BF16) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
      u = (u >> 16) | 0x40u;
    else
      u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    ((uint16_t *)base)[i] = (uint16_t)u;
    const uint32_t w = u << 16;
    float g;
    memcpy(&g, &w, sizeof g);
    return (double)g;
  }
  ck_assert_msg(d == RLK_F16, "rlk_test_store: dtype %d", (int)d);
  const _Float16 h = (_Float16)f;
  memcpy((uint16_t *)base + i, &h, sizeof h);
  return (double)h;
}

double rlk_test_load(const void *base, rlk_dtype d, int64_t i) {
  switch (d) {
  case RLK_F64:
    return ((const double *)base)[i];
  case RLK_F32:
    return ((const float *)base)[i];
  case RLK_I32:
    return ((const int32_t *)base)[i];
  case RLK_I64:
    return (double)((const int64_t *)base)[i];
  case RLK_BOOL:
    return ((const uint8_t *)base)[i] != 0;
  case RLK_BF16: {
    const uint32_t w = (uint32_t)((const uint16_t *)base)[i] << 16;
    float g;
    memcpy(&g, &w, sizeof g);
    return g;
  }
  case RLK_F16: {
    _Float16 h;
    memcpy(&h, (const uint16_t *)base + i, sizeof h);
    return (double)h;
  }
  default:
    ck_abort_msg("rlk_test_load: dtype %d", (int)d);
    return NAN;
  }
}

/* ---- RLK_JIT_RECORD ----------------------------------------------------------------- */

static char record_path[1100]; /* the scratch root and "/record-XXXXXX/record.conf" */

rlk_context *rlk_test_recording_host_context(void) {
  const char *fork_env = getenv("CK_FORK");
  if (fork_env && !strcmp(fork_env, "no")) {
    printf("skip (record): RLK_JIT_RECORD is read once a process; CK_FORK=no shares it between tests\n");
    fflush(stdout);
    return NULL;
  }
  char dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, "record");
  ck_assert(snprintf(record_path, sizeof record_path, "%s/record.conf", dir) < (int)sizeof record_path);
  setenv("RLK_JIT_RECORD", record_path, 1);
  return rlk_test_host_context();
}

void rlk_test_record_expect(rlk_context *ctx, const char *const *prefixes) {
  const char *path = record_path;
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "no record at %s", path);
  char line[1024];
  int found[16] = {0}, n = 0;
  while (prefixes[n]) n++;
  ck_assert_int_le(n, 16);
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    for (int i = 0; i < n; i++) found[i] |= !strncmp(line, prefixes[i], strlen(prefixes[i]));
    int kernels = 0;
    ck_assert_msg(rlk_precompile(ctx, line, &kernels) == RLK_OK && kernels > 0, "recorded line '%s': %s", line,
                  rlk_last_error());
  }
  fclose(f);
  for (int i = 0; i < n; i++) ck_assert_msg(found[i], "%s: no line starts with '%s'", path, prefixes[i]);
}
