/* test_jit.c - the whole JIT pipeline on the host backend: in-process hits, disk hits in a new
 * context, RLK_JIT=0, read-only precompiled trees, corrupt entries, degraded roots, processes and
 * threads racing one uncached key. */
#include <check.h>
#include <grp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/ops.h"
#include "suites.h"
#include "test_util.h"

/* Runs the advantage op once on fresh scores (B = 12, G = 4) and checks one group by hand. */
static rlk_status run_op(rlk_context *ctx, int group_size) {
  enum { B = 12 };
  float scores[B], adv[B];
  uint64_t s = rlk_test_seed() ^ 0x1234;
  for (int i = 0; i < B; i++) scores[i] = (float)rlk_test_rand_normal(&s);
  rlk_group_advantage_args a;
  rlk_group_advantage_args_init(&a);
  a.scores = rlk_tensor_1d(scores, RLK_F32, B);
  a.advantages = rlk_tensor_1d(adv, RLK_F32, B);
  a.group_size = group_size;
  a.mode = RLK_ADV_MEAN_ONLY;
  rlk_status st = rlk_group_advantage(ctx, &a, NULL);
  if (st) return st;
  double mean = 0;
  for (int i = 0; i < group_size; i++) mean += scores[i];
  mean /= group_size;
  ck_assert_double_eq_tol(adv[0], scores[0] - mean, 1e-5);
  return RLK_OK;
}

static rlk_context *host_ctx_at(const char *cache_dir) { return rlk_test_context_at(RLK_BACKEND_HOST, cache_dir); }

/* A host context over a new empty cache directory (its path in dir). */
static rlk_context *host_ctx_in_new_dir(char *dir, size_t size, const char *stem) {
  rlk_test_mkdtemp(dir, size, stem);
  return host_ctx_at(dir);
}

static rlk_counters counters(rlk_context *ctx) {
  rlk_counters c;
  ck_assert_int_eq(rlk_context_counters(ctx, &c), RLK_OK);
  return c;
}

/* The counters of one group_advantage call on a new host context over cache_dir. */
static rlk_counters counters_of_one_call(const char *cache_dir) {
  rlk_context *ctx = host_ctx_at(cache_dir);
  ck_assert_msg(run_op(ctx, 4) == RLK_OK, "%s", rlk_last_error());
  rlk_counters c = counters(ctx);
  rlk_context_destroy(ctx);
  return c;
}

START_TEST(memory_then_disk_hits) {
  char dir[1024];
  rlk_context *ctx = host_ctx_in_new_dir(dir, sizeof dir, "cache");
  ck_assert_str_eq(rlk_context_cache_dir(ctx), dir);
  ck_assert_int_eq(run_op(ctx, 4), RLK_OK);
  rlk_counters c = counters(ctx);
  ck_assert_uint_ge(c.misses, 1);
  ck_assert_uint_eq(c.compiles, c.misses);
  ck_assert_uint_eq(c.disk_hits, 0);
  ck_assert(c.compile_seconds > 0);
  ck_assert_int_eq(run_op(ctx, 4), RLK_OK);
  rlk_counters c2 = counters(ctx);
  ck_assert_uint_eq(c2.compiles, c.compiles);
  ck_assert_uint_gt(c2.memory_hits, c.memory_hits);
  rlk_context_destroy(ctx);

  /* a new context (as a new process would) loads from disk and compiles nothing */
  ctx = host_ctx_at(dir);
  ck_assert_int_eq(run_op(ctx, 4), RLK_OK);
  c = counters(ctx);
  ck_assert_uint_eq(c.compiles, 0);
  ck_assert_uint_ge(c.disk_hits, 1);
  /* another group size is another specialization: a miss */
  ck_assert_int_eq(run_op(ctx, 3), RLK_OK);
  ck_assert_uint_ge(counters(ctx).compiles, 1);
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(jit_disabled_names_the_config) {
  /* every spelling of off */
  static const char *const offs[] = {"0", "off", "false", "no"};
  for (size_t i = 0; i < 4; i++) {
    char dir[1024];
    rlk_test_mkdtemp(dir, sizeof dir, "cache");
    setenv("RLK_JIT", offs[i], 1);
    rlk_context *ctx = host_ctx_at(dir);
    rlk_status st = run_op(ctx, 4);
    rlk_test_expect_error(st, RLK_ERR_JIT_DISABLED, "family=group_advantage", offs[i]);
    ck_assert_ptr_nonnull(strstr(rlk_last_error(), "target="));
    ck_assert_uint_eq(counters(ctx).compiles, 0);
    rlk_context_destroy(ctx);
    unsetenv("RLK_JIT");
  }
}
END_TEST

static int count_entries(const rlk_cache_entry *e, void *user) {
  (void)e;
  (*(int *)user)++;
  return 0;
}

START_TEST(precompiled_read_only_tree_serves_jit_off) {
  char ro[1024], rw[1024];
  rlk_test_mkdtemp(ro, sizeof ro, "ro");
  rlk_test_mkdtemp(rw, sizeof rw, "rw");
  rlk_context *ctx = host_ctx_at(ro);
  for (size_t i = 0; rlk_op_group_advantage.samples[i]; i++) {
    int n = 0;
    rlk_status st = rlk_precompile(ctx, rlk_op_group_advantage.samples[i], &n);
    ck_assert_msg(st == RLK_OK, "%s: %s", rlk_op_group_advantage.samples[i], rlk_last_error());
    ck_assert_int_gt(n, 0);
  }
  ck_assert_int_eq(rlk_precompile(ctx, "group_advantage group_size=4 mode=mean-only", NULL), RLK_OK);
  rlk_context_destroy(ctx);
  int entries = 0;
  ck_assert_int_eq(rlk_cache_walk(ro, count_entries, &entries), RLK_OK);
  ck_assert_int_gt(entries, 0);
  chmod(ro, 0500);

  setenv("RLK_CACHE_RO_DIRS", ro, 1);
  setenv("RLK_JIT", "0", 1);
  rlk_counters c = counters_of_one_call(rw);
  ck_assert_uint_eq(c.compiles, 0);
  ck_assert_uint_ge(c.disk_hits, 1);
  int rw_entries = 0;
  rlk_cache_walk(rw, count_entries, &rw_entries);
  ck_assert_int_eq(rw_entries, 0); /* nothing was copied into the writable tree */
  unsetenv("RLK_JIT");
  unsetenv("RLK_CACHE_RO_DIRS");
  chmod(ro, 0700);
}
END_TEST

static int corrupt_binary(const rlk_cache_entry *e, void *user) {
  (void)user;
  char path[2048];
  snprintf(path, sizeof path, "%s/kernel.so", e->path);
  FILE *f = fopen(path, "r+b");
  if (!f) return 0;
  fseek(f, 100, SEEK_SET);
  int c = fgetc(f);
  fseek(f, 100, SEEK_SET);
  fputc(c ^ 0x5a, f);
  fclose(f);
  return 0;
}

START_TEST(corrupt_entry_is_rebuilt) {
  char dir[1024];
  rlk_context *ctx = host_ctx_in_new_dir(dir, sizeof dir, "cache");
  ck_assert_int_eq(run_op(ctx, 4), RLK_OK);
  rlk_context_destroy(ctx);
  ck_assert_int_eq(rlk_cache_walk(dir, corrupt_binary, NULL), RLK_OK);
  rlk_counters c = counters_of_one_call(dir);
  ck_assert_uint_ge(c.rebuilt, 1);
  ck_assert_uint_ge(c.compiles, 1);
  /* and the rebuilt entry is good again */
  uint64_t n = 0, bad = 0;
  ck_assert_int_eq(rlk_cache_verify(dir, 0, &n, &bad), RLK_OK);
  ck_assert_uint_gt(n, 0);
  ck_assert_uint_eq(bad, 0);
}
END_TEST

START_TEST(unwritable_root_falls_back_to_memory) {
  /* a root below a regular file can never be created, whatever the user's privileges */
  char dir[1024], file[1100], root[1200];
  rlk_test_mkdtemp(dir, sizeof dir, "blocked");
  snprintf(file, sizeof file, "%s/file", dir);
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  snprintf(root, sizeof root, "%s/cache", file);
  rlk_context *ctx = host_ctx_at(root);
  ck_assert_str_eq(rlk_context_cache_dir(ctx), "");
  ck_assert_msg(run_op(ctx, 4) == RLK_OK, "%s", rlk_last_error());
  ck_assert_uint_eq(counters(ctx).compiles, 1);
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(world_writable_root_is_refused) {
  char dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, "open");
  chmod(dir, 0777);
  rlk_context *ctx = host_ctx_at(dir);
  ck_assert_str_eq(rlk_context_cache_dir(ctx), "");
  ck_assert_msg(run_op(ctx, 4) == RLK_OK, "%s", rlk_last_error());
  rlk_context_destroy(ctx);
  int entries = 0;
  rlk_cache_walk(dir, count_entries, &entries);
  ck_assert_int_eq(entries, 0);
}
END_TEST

/* 8 processes race one uncached key: all get a working kernel, exactly one compiles. */
START_TEST(processes_race_one_key) {
  enum { P = 8 };
  char dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, "race");
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pids[P];
  for (int i = 0; i < P; i++) {
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0) {
      close(fds[0]);
      rlk_context *ctx = rlk_test_child_host_context(dir);
      int compiles = -1;
      if (ctx && run_op(ctx, 4) == RLK_OK) {
        rlk_counters c;
        rlk_context_counters(ctx, &c);
        compiles = (int)c.compiles;
      } else {
        fprintf(stderr, "race child %d: %s\n", i, rlk_last_error());
      }
      if (write(fds[1], &compiles, sizeof compiles) != (ssize_t)sizeof compiles) _exit(3);
      _exit(compiles >= 0 ? 0 : 1);
    }
  }
  close(fds[1]);
  int total = 0, got = 0, c;
  while (read(fds[0], &c, sizeof c) == (ssize_t)sizeof c) {
    ck_assert_int_ge(c, 0);
    total += c;
    got++;
  }
  close(fds[0]);
  for (int i = 0; i < P; i++) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ck_assert_int_eq(got, P);
  ck_assert_int_eq(total, 1);
  int entries = 0;
  rlk_cache_walk(dir, count_entries, &entries);
  ck_assert_int_eq(entries, 1);
}
END_TEST

static void *thread_body(void *arg) {
  rlk_context *ctx = arg;
  for (int i = 0; i < 20; i++)
    if (run_op(ctx, 6) != RLK_OK) return (void *)1;
  return NULL;
}

START_TEST(threads_share_a_context) {
  char dir[1024];
  rlk_context *ctx = host_ctx_in_new_dir(dir, sizeof dir, "threads");
  pthread_t t[4];
  for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, thread_body, ctx), 0);
  for (int i = 0; i < 4; i++) {
    void *r = NULL;
    pthread_join(t[i], &r);
    ck_assert_ptr_null(r);
  }
  rlk_counters c = counters(ctx);
  ck_assert_uint_eq(c.compiles, 1);
  ck_assert_uint_eq(c.calls, c.memory_hits + c.disk_hits + c.misses);
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(compile_only_context_cannot_launch) {
  rlk_context *ctx = rlk_test_compile_only_host_context();
  rlk_device_info info;
  ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
  ck_assert_int_eq(info.compile_only, 1);
  ck_assert_int_eq(run_op(ctx, 4), RLK_ERR_UNSUPPORTED);
  void *p = NULL;
  ck_assert_int_eq(rlk_malloc(ctx, 16, &p), RLK_ERR_UNSUPPORTED);
  ck_assert_int_eq(rlk_precompile(ctx, "group_advantage group_size=4", NULL), RLK_OK);
  rlk_context_destroy(ctx);
}
END_TEST

/* Compiles counted by a child process that runs the op with `template_dir` as RLK_TEMPLATE_DIR
 * (NULL: the embedded templates); -1 if the op failed. Templates are read once per process, so
 * each setting gets its own process. */
static int child_compiles(const char *cache_dir, const char *template_dir) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    if (template_dir)
      setenv("RLK_TEMPLATE_DIR", template_dir, 1);
    else
      unsetenv("RLK_TEMPLATE_DIR");
    rlk_context *ctx = rlk_test_child_host_context(cache_dir);
    if (!ctx || run_op(ctx, 4) != RLK_OK) {
      fprintf(stderr, "child: %s\n", rlk_last_error());
      _exit(255);
    }
    rlk_counters c;
    rlk_context_counters(ctx, &c);
    _exit((int)c.compiles);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ck_assert(WIFEXITED(status));
  return WEXITSTATUS(status) == 255 ? -1 : WEXITSTATUS(status);
}

START_TEST(template_dir_override_changes_the_key) {
  struct stat st;
  if (stat("templates/host", &st) != 0) {
    printf("skip (jit: RLK_TEMPLATE_DIR): run from the repository root to find templates/\n");
    return;
  }
  char dir[1024], copy[1024], edited[1024], cmd[4096];
  rlk_test_mkdtemp(dir, sizeof dir, "cache");
  rlk_test_mkdtemp(copy, sizeof copy, "tpl");
  rlk_test_mkdtemp(edited, sizeof edited, "tpl-edited");
  /* common/ too: both source sets hold it */
  snprintf(cmd, sizeof cmd,
           "cp -R templates/cuda templates/host templates/common '%s' && "
           "cp -R templates/cuda templates/host templates/common '%s' && "
           "printf '/* edited */\\n' >> '%s/host/rlk_host_prelude.h'", copy, edited, edited);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_int_eq(child_compiles(dir, NULL), 1);   /* embedded: a cold compile */
  ck_assert_int_eq(child_compiles(dir, copy), 0);   /* the same files: the same digest and key */
  ck_assert_int_eq(child_compiles(dir, edited), 1); /* an edited header: a new key */
  ck_assert_int_eq(child_compiles(dir, edited), 0);
}
END_TEST

START_TEST(setting_order_does_not_change_the_key) {
  char dir[1024];
  rlk_context *ctx = host_ctx_in_new_dir(dir, sizeof dir, "order");
  ck_assert_int_eq(rlk_precompile(ctx, "group_advantage mode=rloo group_size=8 scores=f64", NULL), RLK_OK);
  ck_assert_uint_eq(counters(ctx).compiles, 1);
  rlk_context_destroy(ctx);
  ctx = host_ctx_at(dir);
  ck_assert_int_eq(rlk_precompile(ctx, "group_advantage scores=f64 group_size=8 mode=rloo", NULL), RLK_OK);
  rlk_counters c = counters(ctx);
  ck_assert_uint_eq(c.compiles, 0);
  ck_assert_uint_eq(c.disk_hits, 1);
  /* and a different value is a different key */
  ck_assert_int_eq(rlk_precompile(ctx, "group_advantage scores=f32 group_size=8 mode=rloo", NULL), RLK_OK);
  ck_assert_uint_eq(counters(ctx).compiles, 1);
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(precompile_into_nowhere_is_an_error) {
  setenv("RLK_CACHE_MODE", "memory", 1);
  rlk_context *ctx = rlk_test_compile_only_host_context();
  rlk_test_expect_error(rlk_precompile(ctx, "group_advantage group_size=4", NULL), RLK_ERR_CACHE, "discarded",
                        "rlk_precompile");
  ck_assert_uint_eq(counters(ctx).compiles, 0);
  rlk_context_destroy(ctx);
  /* a context with a device warms its in-process table instead */
  ctx = rlk_test_host_context();
  ck_assert_int_eq(rlk_precompile(ctx, "group_advantage group_size=4 mode=mean-only", NULL), RLK_OK);
  ck_assert_uint_eq(counters(ctx).compiles, 1);
  ck_assert_int_eq(run_op(ctx, 4), RLK_OK);
  ck_assert_uint_eq(counters(ctx).compiles, 1);
  ck_assert_uint_ge(counters(ctx).memory_hits, 1);
  rlk_context_destroy(ctx);
  unsetenv("RLK_CACHE_MODE");
}
END_TEST

/* precompile into `root` once its folder is read-only (after the context opened it): 0 when the
 * call fails as it must (RLK_ERR_CACHE naming the publish; with a device, the kernel still runs),
 * else which check did not hold. No ck_assert: it may run in a child under another user. */
static int precompile_unpublished(const char *root, int device) {
  rlk_context *ctx = NULL;
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_HOST, o.compile_only = !device, o.cache_dir = root;
  if (rlk_context_create(&ctx, &o) != RLK_OK) return 1;
  int bad = 0;
  if (chmod(root, 0555) != 0) bad = 2;
  rlk_status st = rlk_precompile(ctx, "group_advantage group_size=4 mode=mean-only", NULL);
  if (!bad && (st != RLK_ERR_CACHE || !strstr(rlk_last_error(), "could not publish"))) bad = 3;
  if (!bad && device && run_op(ctx, 4) != RLK_OK) bad = 4;
  /* asked again (now a hit in memory): still not in the cache, still said */
  if (!bad && rlk_precompile(ctx, "group_advantage group_size=4 mode=mean-only", NULL) != RLK_ERR_CACHE) bad = 5;
  chmod(root, 0755);
  rlk_context_destroy(ctx);
  return bad;
}

/* A kernel that precompile could not write to the cache is an error, not a success that leaves
 * the shipped tree short (the root turned read-only under the context; as root, which writes
 * anywhere, in a child under another user). */
START_TEST(precompile_that_cannot_publish_fails) {
  for (int device = 0; device < 2; device++) {
    char root[1024];
    if (geteuid() != 0) {
      rlk_test_mkdtemp(root, sizeof root, "unpublished");
      ck_assert_msg(precompile_unpublished(root, device) == 0, "device %d: %d (%s)", device,
                    precompile_unpublished(root, device), rlk_last_error());
      rlk_test_rmtree(root);
      continue;
    }
    snprintf(root, sizeof root, "/tmp/rlk-test-unpublished-XXXXXX"); /* reachable by the other user */
    ck_assert_ptr_nonnull(mkdtemp(root));
    ck_assert_int_eq(chown(root, 65534, 65534), 0);
    pid_t pid = rlk_test_fork();
    if (pid == 0) {
      if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
      _exit(precompile_unpublished(root, device));
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    rlk_test_rmtree(root);
    ck_assert(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
      printf("skip (precompile that cannot publish): cannot switch to uid 65534\n");
      return;
    }
    ck_assert_msg(WEXITSTATUS(status) == 0, "device %d: check %d did not hold", device, WEXITSTATUS(status));
  }
}
END_TEST

START_TEST(host_target_alias) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_HOST;
  o.target = "host";
  rlk_context *ctx = NULL;
  ck_assert_msg(rlk_context_create(&ctx, &o) == RLK_OK, "%s", rlk_last_error());
  rlk_device_info info;
  rlk_context_device_info(ctx, &info);
  ck_assert_ptr_nonnull(strstr(info.target, "host-"));
  rlk_context_destroy(ctx);
}
END_TEST

Suite *jit_suite(void) {
  Suite *s = suite_create("jit");
  rlk_test_add_case(s, "pipeline", 120, TESTS(memory_then_disk_hits, jit_disabled_names_the_config,
      precompiled_read_only_tree_serves_jit_off, corrupt_entry_is_rebuilt,
      unwritable_root_falls_back_to_memory, world_writable_root_is_refused, processes_race_one_key,
      threads_share_a_context, compile_only_context_cannot_launch, template_dir_override_changes_the_key,
      setting_order_does_not_change_the_key, precompile_into_nowhere_is_an_error, precompile_that_cannot_publish_fails,
      host_target_alias));
  return s;
}
