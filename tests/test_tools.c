/* test_tools.c - the command-line tools as a user runs them: each case starts the built
 * programs (RLK_TEST_BIN_DIR) as child processes with a private cache environment and checks
 * their exit status and output. */
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "rlk.h"
#include "suites.h"
#include "test_util.h"

/* The tools' JSON writers, tested directly below (tool_util.h wants the name a tool prints). */
static const char *prog = "test_tools";
#include "../tools/tool_util.h"

/* The configurations the demo runs with its defaults (grpo, group size 4, f32 scores, a bool
 * mask broadcast to tokens), so a tree precompiled from them serves the demo with RLK_JIT=0. */
#define DEMO_CONFIG "group_advantage mode=grpo group_size=4 scores=f32 broadcast=1 mask=bool"
/* A small sweep for the shard and merge cases; the mode varies fastest, so shard 0/2 of it
 * (items 0 and 2) holds only grpo kernels and shard 1/2 only rloo ones. */
#define SMALL_SWEEP "group_advantage group_size=4,8 mode=grpo,rloo scores=f32"

/* The integer that starts the last non-empty line of out, or -1. */
static long last_line_value(const char *out) {
  size_t n = strlen(out);
  while (n > 0 && out[n - 1] == '\n') n--;
  if (n == 0) return -1;
  size_t b = n;
  while (b > 0 && out[b - 1] != '\n') b--;
  return strtol(out + b, NULL, 10);
}

/* The full keys of a tree, sorted, one per line (rlk-cache list --keys). */
static char *tree_keys(const char *root, int *count) {
  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", root, "list", "--keys"));
  expect_status(r, 0, "rlk-cache list --keys");
  int n = 0;
  for (const char *p = r.out; *p; p++)
    if (*p == '\n') n++;
  /* every line is one 64-hex-digit key */
  const char *p = r.out;
  for (int i = 0; i < n; i++) {
    const char *nl = strchr(p, '\n');
    ck_assert_msg(nl - p == 64, "not a key line in:\n%s", r.out);
    p = nl + 1;
  }
  /* sort the lines so two trees compare as sets */
  char **lines = calloc((size_t)n + 1, sizeof *lines);
  ck_assert(lines);
  char *save = NULL;
  int k = 0;
  for (char *t = strtok_r(r.out, "\n", &save); t && k < n; t = strtok_r(NULL, "\n", &save))
    lines[k++] = t;
  for (int i = 1; i < k; i++)
    for (int j = i; j > 0 && strcmp(lines[j - 1], lines[j]) > 0; j--) {
      char *tmp = lines[j];
      lines[j] = lines[j - 1];
      lines[j - 1] = tmp;
    }
  char *joined = calloc((size_t)k * 65 + 1, 1);
  ck_assert(joined);
  for (int i = 0; i < k; i++) {
    strcat(joined, lines[i]);
    strcat(joined, "\n");
  }
  free(lines);
  rlk_test_tool_free(&r);
  if (count) *count = k;
  return joined;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_msg(f != NULL, "cannot write %s", path);
  fputs(text, f);
  ck_assert(fclose(f) == 0);
}

/* ---- cases -------------------------------------------------------------------------- */

START_TEST(help_and_usage_errors) {
  static const char *const tools[] = {"rlk-cache", "rlk-precompile", "rlk-demo"};
  for (size_t i = 0; i < 3; i++) {
    rlk_test_tool_run r = rlk_test_run_tool(NULL, tools[i], ARGS("--help"));
    expect_status(r, 0, tools[i]);
    ck_assert_msg(strstr(r.out, "usage:") != NULL, "%s --help prints no usage:\n%s", tools[i], r.out);
    rlk_test_tool_free(&r);
    r = rlk_test_run_tool(NULL, tools[i], ARGS("--no-such-option"));
    expect_status(r, 2, tools[i]);
    ck_assert_msg(strstr(r.out, "--no-such-option") != NULL, "the message does not name the option:\n%s",
                  r.out);
    rlk_test_tool_free(&r);
  }
  char dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, "usage");
  const char *const *bad[] = {
      ARGS("--root", dir),                          /* no command */
      ARGS("--root", dir, "frobnicate"),            /* unknown command */
      ARGS("--root", dir, "prune"),                 /* no limit */
      ARGS("--root", dir, "prune", "--max-size", "12X"),
      ARGS("--root", dir, "prune", "--max-age", "-3"),
      ARGS("--root", dir, "prune", "--max-size", "nan"), /* strtod's other numbers */
      ARGS("--root", dir, "prune", "--max-size", "inf"),
      ARGS("--root", dir, "prune", "--max-age", "nan"),
      ARGS("--root", dir, "prune", "--max-size", "0x10"),
      ARGS("--root", dir, "clear"),                 /* no --yes */
      ARGS("--root", dir, "list", "--repair"),      /* option of another command */
      ARGS("--root"),
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-cache", bad[i]);
    expect_status(r, 2, "rlk-cache bad usage");
    rlk_test_tool_free(&r);
  }
  const char *const *bad_pre[] = {
      ARGS("--targets", "host"),                                 /* nothing to compile */
      ARGS("--sweep", "group_advantage mode=grpo"),              /* no targets */
      ARGS("--targets", "sm_90a", "--sweep", "no_such_op a=1"),  /* unknown op */
      ARGS("--targets", "vax", "--sweep", "group_advantage mode=grpo"),
      ARGS("--targets", "host", "--sweep", "group_advantage mode"),
      ARGS("--targets", "host", "--sweep", "group_advantage mode=grpo,", "--dry-run"),
      ARGS("--targets", "host", "--sweep", "group_advantage mode=grpo", "--shard", "2/2"),
      ARGS("--targets", "host", "--sweep", "group_advantage mode=grpo", "-j", "0"),
      ARGS("--targets", "host", "--config", "/nonexistent/rlk.conf"),
      ARGS("merge", dir),                                        /* no --out */
      ARGS("merge", "--out", dir),                               /* no shard */
  };
  for (size_t i = 0; i < sizeof bad_pre / sizeof bad_pre[0]; i++) {
    rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-precompile", bad_pre[i]);
    expect_status(r, 2, "rlk-precompile bad usage");
    rlk_test_tool_free(&r);
  }
  /* a value given to an option that takes none is said so, by the option's name; the sampler's
   * benchmark refuses what it cannot time before it touches a device */
  const struct {
    const char *tool, *what;
    const char *const *args;
    int status;
    const char *says; /* NULL: anything */
  } said[] = {
      {"rlk-cache", "list --json=1", ARGS("--root", "/nonexistent", "list", "--json=1"), 2, "--json takes no value"},
      {"rlk-precompile", "--dry-run=1", ARGS("--dry-run=1"), 2, "--dry-run takes no value"},
      {"rlk-demo", "--group-size 1", ARGS("--group-size", "1"), 2, NULL},
      {"rlk-demo", "--backend quantum", ARGS("--backend", "quantum"), 2, NULL},
      {"rlk-bench-sample", "--help", ARGS("--help"), 0, "--row-split"},
      {"rlk-bench-sample", "--row-split 3", ARGS("--row-split", "3"), 2, "--row-split"},
      {"rlk-bench-sample", "--case nucleus", ARGS("--case", "nucleus"), 2, "plain-split"},
  };
  rlk_test_tool_run r;
  for (size_t i = 0; i < sizeof said / sizeof said[0]; i++) {
    r = rlk_test_run_tool(NULL, said[i].tool, said[i].args);
    expect_status(r, said[i].status, said[i].what);
    ck_assert_msg(!said[i].says || strstr(r.out, said[i].says), "%s %s does not say '%s':\n%s", said[i].tool,
                  said[i].what, said[i].says, r.out);
    rlk_test_tool_free(&r);
  }
  /* the ops and their parameters */
  r = rlk_test_run_tool(NULL, "rlk-precompile", ARGS("--list-ops"));
  expect_status(r, 0, "rlk-precompile --list-ops");
  ck_assert_msg(strstr(r.out, "group_advantage") != NULL, "%s", r.out);
  ck_assert_msg(strstr(r.out, "mode") != NULL, "no parameter help:\n%s", r.out);
  rlk_test_tool_free(&r);
}
END_TEST

START_TEST(dry_run_expands_sweeps) {
  char dir[1024], conf[1100];
  rlk_test_mkdtemp(dir, sizeof dir, "dry");
  snprintf(conf, sizeof conf, "%s/sweep.conf", dir);
  /* 2 x 2 = 4 lines from the first, the third repeats one of them, comments and blanks */
  write_file(conf,
             "# a comment\n"
             "group_advantage mode=grpo,rloo group_size=4,8   # trailing comment\n"
             "\n"
             "   \t\n"
             "group_advantage mode=grpo group_size=4\n");
  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-precompile",
                            ARGS("--dry-run", "--config", conf, "--sweep",
                                 "group_advantage mode=mean-only group_size=4,8,16 unbiased=0,1",
                                 "--targets", "host sm_90a,gfx90a"));
  expect_status(r, 0, "dry run");
  /* (4 + 6) configurations x 3 targets */
  ck_assert_int_eq(rlk_test_last_value(r.out, "dry run: "), 30);
  static const rlk_test_line_count dry_lines[] = {
      {"group_advantage ", 30}, {"sm_90a", 10}, {"mode=grpo group_size=8", 3}, {"group_size=16 unbiased=1", 3}};
  rlk_test_expect_line_counts(r.out, dry_lines, sizeof dry_lines / sizeof dry_lines[0], "dry run");
  rlk_test_tool_free(&r);

  /* shards partition the 12 items: 0/2 takes 6, 1/5 indices 1, 6 and 11 */
  static const struct {
    const char *shard;
    long items;
  } shards[] = {{"0/2", 6}, {"1/5", 3}};
  for (size_t i = 0; i < sizeof shards / sizeof shards[0]; i++) {
    r = rlk_test_run_tool(NULL, "rlk-precompile",
                          ARGS("--dry-run", "--config", conf, "--targets", "host sm_90a gfx90a", "--shard",
                               shards[i].shard));
    expect_status(r, 0, shards[i].shard);
    ck_assert_int_eq(rlk_test_last_value(r.out, "dry run: "), shards[i].items);
    rlk_test_tool_free(&r);
  }
  rlk_test_rmtree(dir);
}
END_TEST

/* Finds one binary file (kernel.* other than the metadata) under a tree. */
static char found_binary[2048];
static size_t tree_prefix; /* the length of the tree's own path, so only the layout below counts */
static int find_binary(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  const char *base = path + ftw->base;
  if (flag == FTW_F && !strncmp(base, "kernel.", 7) && strcmp(base, "kernel.meta") != 0 &&
      !strstr(path + tree_prefix, "/tmp/")) {
    snprintf(found_binary, sizeof found_binary, "%s", path);
    return 1;
  }
  return 0;
}

START_TEST(precompile_host_serves_demo_without_jit) {
  char tree[1024], user[1024], empty[1024];
  rlk_test_mkdtemp(tree, sizeof tree, "precompiled");
  rlk_test_mkdtemp(user, sizeof user, "user-cache");
  rlk_test_mkdtemp(empty, sizeof empty, "empty-cache");
  char cache_env[1100], ro_env[1100];
  snprintf(cache_env, sizeof cache_env, "RLK_CACHE_DIR=%s", user);
  snprintf(ro_env, sizeof ro_env, "RLK_CACHE_RO_DIRS=%s", tree);

  rlk_test_tool_run r = rlk_test_run_tool(ENV(cache_env), "rlk-precompile",
                            ARGS("--out", tree, "--targets", "host", "-j", "2", "--sweep",
                                 DEMO_CONFIG, "--sweep",
                                 "group_advantage mode=rloo,mean-only group_size=4 scores=f32"));
  expect_status(r, 0, "rlk-precompile host -j 2");
  ck_assert_msg(strstr(r.out, "done: 3 items, 0 failed") != NULL, "%s", r.out);
  ck_assert_int_eq(rlk_test_count_lines(r.out, "] host"), 3); /* one progress line per item */
  rlk_test_tool_free(&r);

  int nkeys = 0;
  free(tree_keys(tree, &nkeys));
  ck_assert_int_ge(nkeys, 3);
  /* nothing went to the user's cache */
  int nuser = -1;
  free(tree_keys(user, &nuser));
  ck_assert_int_eq(nuser, 0);

  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "list"));
  expect_status(r, 0, "rlk-cache list");
  ck_assert_int_eq(rlk_test_count_lines(r.out, "group_advantage"), nkeys);
  ck_assert_int_eq(rlk_test_count_lines(r.out, "host-"), nkeys);
  ck_assert_int_eq(last_line_value(r.out), nkeys); /* the "N entries, SIZE" footer */
  rlk_test_tool_free(&r);

  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "sizes"));
  expect_status(r, 0, "rlk-cache sizes");
  ck_assert_int_eq(rlk_test_last_value(r.out, "total: "), nkeys);
  ck_assert_msg(strstr(r.out, "by family:") && strstr(r.out, "by target:"), "%s", r.out);
  ck_assert_int_ge(rlk_test_count_lines(r.out, "group_advantage"), 1);
  rlk_test_tool_free(&r);

  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "verify"));
  expect_status(r, 0, "rlk-cache verify");
  ck_assert_int_eq(rlk_test_last_value(r.out, "verify: "), nkeys);
  ck_assert_msg(strstr(r.out, " 0 bad") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);

  /* The demo, from the read-only tree only, with compiling disabled. */
  r = rlk_test_run_tool(ENV("RLK_JIT=0", ro_env, cache_env), "rlk-demo", ARGS("--backend", "host"));
  expect_status(r, 0, "rlk-demo from the precompiled tree with RLK_JIT=0");
  ck_assert_int_eq(rlk_test_last_value(r.out, "compiles="), 0);
  ck_assert_int_ge(rlk_test_last_value(r.out, "disk_hits="), 1);
  ck_assert_int_ge(rlk_test_last_value(r.out, "memory_hits="), 1);
  ck_assert_int_eq(rlk_test_last_value(r.out, "misses="), 0);
  ck_assert_msg(strstr(r.out, "\nok\n") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  /* ... and it wrote nothing to the writable cache */
  free(tree_keys(user, &nuser));
  ck_assert_int_eq(nuser, 0);

  /* The same with an empty cache: the error names the missing configuration. */
  snprintf(cache_env, sizeof cache_env, "RLK_CACHE_DIR=%s", empty);
  r = rlk_test_run_tool(ENV("RLK_JIT=0", cache_env), "rlk-demo", ARGS("--backend", "host"));
  expect_status(r, 1, "rlk-demo with RLK_JIT=0 and an empty cache");
  ck_assert_msg(strstr(r.out, "RLK_JIT=0") && strstr(r.out, "group_advantage"),
                "the error does not name the missing configuration:\n%s", r.out);
  rlk_test_tool_free(&r);

  /* A corrupt binary is found by verify, and --repair quarantines it. */
  found_binary[0] = '\0';
  tree_prefix = strlen(tree);
  nftw(tree, find_binary, 32, FTW_PHYS);
  ck_assert_msg(found_binary[0], "no kernel binary under %s", tree);
  FILE *f = fopen(found_binary, "r+b");
  ck_assert(f != NULL);
  int c = fgetc(f);
  ck_assert(c != EOF);
  fseek(f, 0, SEEK_SET);
  fputc(c ^ 0x5a, f);
  ck_assert(fclose(f) == 0);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "verify"));
  expect_status(r, 1, "rlk-cache verify with a corrupt entry");
  ck_assert_msg(strstr(r.out, " 1 bad") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "verify", "--repair"));
  expect_status(r, 0, "rlk-cache verify --repair");
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "verify"));
  expect_status(r, 0, "rlk-cache verify after the repair");
  ck_assert_int_eq(rlk_test_last_value(r.out, "verify: "), nkeys - 1);
  rlk_test_tool_free(&r);

  /* prune to one byte empties the tree */
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "prune", "--max-size", "1"));
  expect_status(r, 0, "rlk-cache prune --max-size 1");
  ck_assert_int_eq(rlk_test_last_value(r.out, "removed "), nkeys - 1);
  rlk_test_tool_free(&r);
  free(tree_keys(tree, &nkeys));
  ck_assert_int_eq(nkeys, 0);
  rlk_test_rmtrees(ARGS(tree, user, empty));
}
END_TEST

/* RLK_JIT_RECORD: the runs append each configuration they used once; precompiling from that
 * file serves the same runs with RLK_JIT=0 and no compile. */
START_TEST(recorded_configurations_precompile_what_runs) {
  char tree[1024], user[1024], fresh[1024], rec[1100];
  rlk_test_mkdtemp(tree, sizeof tree, "recorded");
  rlk_test_mkdtemp(user, sizeof user, "record-cache");
  rlk_test_mkdtemp(fresh, sizeof fresh, "record-fresh");
  snprintf(rec, sizeof rec, "%s/record.conf", user);
  char cache_env[1100], rec_env[1200], ro_env[1100], fresh_env[1100];
  snprintf(cache_env, sizeof cache_env, "RLK_CACHE_DIR=%s", user);
  snprintf(rec_env, sizeof rec_env, "RLK_JIT_RECORD=%s", rec);
  snprintf(ro_env, sizeof ro_env, "RLK_CACHE_RO_DIRS=%s", tree);
  snprintf(fresh_env, sizeof fresh_env, "RLK_CACHE_DIR=%s", fresh);

  /* two runs of one configuration and one of another: two lines */
  static const char *const modes[] = {"grpo", "grpo", "rloo"};
  for (int i = 0; i < 3; i++) {
    rlk_test_tool_run r = rlk_test_run_tool(ENV(cache_env, rec_env), "rlk-demo",
                                            ARGS("--backend", "host", "--mode", modes[i]));
    expect_status(r, 0, "rlk-demo recording");
    rlk_test_tool_free(&r);
  }
  FILE *f = fopen(rec, "r");
  ck_assert_msg(f != NULL, "no record at %s", rec);
  char line[1024];
  int lines = 0, grpo = 0, rloo = 0;
  while (fgets(line, sizeof line, f)) {
    lines++;
    ck_assert_msg(!strncmp(line, "group_advantage ", 16), "record line: %s", line);
    grpo += strstr(line, "mode=grpo") != NULL;
    rloo += strstr(line, "mode=rloo") != NULL;
  }
  fclose(f);
  ck_assert_int_eq(lines, 2);
  ck_assert_int_eq(grpo, 1);
  ck_assert_int_eq(rloo, 1);

  rlk_test_tool_run r = rlk_test_run_tool(ENV(cache_env), "rlk-precompile",
                                          ARGS("--out", tree, "--targets", "host", "--config", rec));
  expect_status(r, 0, "rlk-precompile --config <record>");
  ck_assert_msg(strstr(r.out, "done: 2 items, 0 failed") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);

  for (int i = 1; i < 3; i++) {
    r = rlk_test_run_tool(ENV("RLK_JIT=0", ro_env, fresh_env), "rlk-demo", ARGS("--backend", "host", "--mode", modes[i]));
    expect_status(r, 0, "rlk-demo from the recorded precompile with RLK_JIT=0");
    ck_assert_int_eq(rlk_test_last_value(r.out, "compiles="), 0);
    ck_assert_int_eq(rlk_test_last_value(r.out, "misses="), 0);
    ck_assert_msg(strstr(r.out, "\nok\n") != NULL, "%s", r.out);
    rlk_test_tool_free(&r);
  }
  /* a whole GRPO step (sample, logprob forward and backward, advantages, policy loss) */
  char rec2[1100], rec2_env[1200], tree2[1024], fresh2[1024], ro2_env[1100], fresh2_env[1100];
  snprintf(rec2, sizeof rec2, "%s/record2.conf", user);
  snprintf(rec2_env, sizeof rec2_env, "RLK_JIT_RECORD=%s", rec2);
  rlk_test_mkdtemp(tree2, sizeof tree2, "recorded2");
  rlk_test_mkdtemp(fresh2, sizeof fresh2, "record-fresh2");
  snprintf(ro2_env, sizeof ro2_env, "RLK_CACHE_RO_DIRS=%s", tree2);
  snprintf(fresh2_env, sizeof fresh2_env, "RLK_CACHE_DIR=%s", fresh2);
  static const char *const step_args[] = {"--backend", "host", "--prompts", "2", "--group", "2", "--tokens", "8",
                                          "--vocab", "64", "--seed", "5", NULL};
  r = rlk_test_run_tool(ENV(cache_env, rec2_env), "rlk-grpo-step", step_args);
  expect_status(r, 0, "rlk-grpo-step recording");
  ck_assert_msg(strstr(r.out, "\nok\n") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(ENV(cache_env), "rlk-precompile", ARGS("--out", tree2, "--targets", "host", "--config", rec2));
  expect_status(r, 0, "rlk-precompile --config <the step's record>");
  ck_assert_msg(strstr(r.out, "done: 5 items, 0 failed") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(ENV("RLK_JIT=0", ro2_env, fresh2_env), "rlk-grpo-step", step_args);
  expect_status(r, 0, "rlk-grpo-step from its recorded precompile with RLK_JIT=0");
  ck_assert_int_eq(rlk_test_last_value(r.out, "compiles="), 0);
  ck_assert_int_eq(rlk_test_last_value(r.out, "misses="), 0);
  rlk_test_tool_free(&r);
  rlk_test_rmtrees(ARGS(tree2, fresh2));

  /* an unwritable record is reported, never a failure of the run */
  r = rlk_test_run_tool(ENV(cache_env, "RLK_JIT_RECORD=/nonexistent-dir/record.conf"), "rlk-demo",
                        ARGS("--backend", "host"));
  expect_status(r, 0, "rlk-demo with an unwritable record");
  ck_assert_msg(strstr(r.out, "RLK_JIT_RECORD") != NULL, "no warning:\n%s", r.out);
  rlk_test_tool_free(&r);
  rlk_test_rmtrees(ARGS(tree, user, fresh));
}
END_TEST

START_TEST(shards_merge_to_the_full_set) {
  char full[1024], s0[1024], s1[1024], merged[1024];
  rlk_test_mkdtemp(full, sizeof full, "full");
  rlk_test_mkdtemp(s0, sizeof s0, "shard0");
  rlk_test_mkdtemp(s1, sizeof s1, "shard1");
  rlk_test_mkdtemp(merged, sizeof merged, "merged");
  snprintf(merged + strlen(merged), sizeof merged - strlen(merged), "/new"); /* merge creates it */

  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-precompile",
                            ARGS("--out", full, "--targets", "host", "-j", "2", "--sweep", SMALL_SWEEP));
  expect_status(r, 0, "unsharded precompile");
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-precompile",
                   ARGS("--out", s0, "--targets", "host", "-j", "1", "--sweep", SMALL_SWEEP,
                        "--shard", "0/2"));
  expect_status(r, 0, "shard 0/2");
  ck_assert_msg(strstr(r.out, "done: 2 items, 0 failed") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-precompile",
                   ARGS("--out", s1, "--targets", "host", "--sweep", SMALL_SWEEP, "--shard", "1/2",
                        "-q"));
  expect_status(r, 0, "shard 1/2");
  ck_assert_msg(strstr(r.out, "done: 2 items, 0 failed") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);

  r = rlk_test_run_tool(NULL, "rlk-precompile", ARGS("merge", "--out", merged, s0, s1));
  expect_status(r, 0, "merge");
  ck_assert_msg(strstr(r.out, " 0 bad") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  /* merge leaves <out>/tmp, as the cache does: another process publishing into the tree may be
   * about to stage in it, even while it is empty. Nothing of merge's own is left there. */
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s/tmp", merged);
  struct stat st;
  ck_assert_msg(stat(tmp, &st) == 0 && S_ISDIR(st.st_mode), "merge removed %s", tmp);
  ck_assert_msg(rmdir(tmp) == 0, "%s is not empty after the merge", tmp);
  ck_assert_int_eq(mkdir(tmp, 0700), 0);

  int nfull = 0, nmerged = 0, n0 = 0, n1 = 0;
  char *kfull = tree_keys(full, &nfull), *kmerged = tree_keys(merged, &nmerged);
  free(tree_keys(s0, &n0));
  free(tree_keys(s1, &n1));
  ck_assert_int_gt(nfull, 0);
  ck_assert_int_gt(n0, 0);
  ck_assert_int_gt(n1, 0);
  ck_assert_int_lt(n0, nfull);
  ck_assert_str_eq(kmerged, kfull);
  free(kfull);
  free(kmerged);

  /* merging again copies nothing and changes nothing */
  r = rlk_test_run_tool(NULL, "rlk-precompile", ARGS("merge", "--out", merged, s0, s1));
  expect_status(r, 0, "second merge");
  ck_assert_msg(strstr(r.out, " 0 entries copied") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", merged, "verify"));
  expect_status(r, 0, "verify merged");
  ck_assert_int_eq(rlk_test_last_value(r.out, "verify: "), nfull);
  rlk_test_tool_free(&r);

  /* clear without --yes refuses and keeps everything; with --yes empties */
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", merged, "clear"));
  expect_status(r, 2, "clear without --yes");
  rlk_test_tool_free(&r);
  free(tree_keys(merged, &nmerged));
  ck_assert_int_eq(nmerged, nfull);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", merged, "clear", "--yes"));
  expect_status(r, 0, "clear --yes");
  rlk_test_tool_free(&r);
  free(tree_keys(merged, &nmerged));
  ck_assert_int_eq(nmerged, 0);
  rlk_test_rmtrees(ARGS(full, s0, s1));
  *strrchr(merged, '/') = '\0';
  rlk_test_rmtree(merged);
}
END_TEST

START_TEST(failures_are_reported) {
  char tree[1024], manifest[1100];
  rlk_test_mkdtemp(tree, sizeof tree, "failing");
  snprintf(manifest, sizeof manifest, "%s.manifest", tree);
  /* one good and one bad item, in two workers: the bad one's message comes back through the
   * worker's pipe, and the run fails */
  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-precompile",
                            ARGS("--out", tree, "--targets", "host", "-j", "2", "--manifest", manifest,
                                 "--sweep", "group_advantage mode=grpo,no_such_mode group_size=4"));
  expect_status(r, 1, "rlk-precompile with a bad value");
  ck_assert_msg(strstr(r.out, "no_such_mode") && strstr(r.out, "invalid argument"), "%s", r.out);
  ck_assert_msg(strstr(r.out, "done: 2 items, 1 failed") != NULL, "%s", r.out);
  ck_assert_int_eq(rlk_test_count_lines(r.out, "FAILED"), 1);
  rlk_test_tool_free(&r);
  FILE *f = fopen(manifest, "r");
  ck_assert_msg(f != NULL, "no manifest written");
  char text[4096] = "";
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  ck_assert_int_eq(rlk_test_count_lines(text, "\tok"), 1);
  ck_assert_int_eq(rlk_test_count_lines(text, "\tfailed"), 1);
  unlink(manifest);
  int nkeys = 0;
  free(tree_keys(tree, &nkeys));
  ck_assert_int_ge(nkeys, 1); /* the good item was still published */

  /* an output root that cannot be created */
  char bad_out[1100];
  snprintf(bad_out, sizeof bad_out, "%s/file", tree);
  write_file(bad_out, "not a directory\n");
  strcat(bad_out, "/cache");
  r = rlk_test_run_tool(NULL, "rlk-precompile",
                   ARGS("--out", bad_out, "--targets", "host", "--sweep", "group_advantage mode=grpo"));
  expect_status(r, 1, "rlk-precompile into an impossible root");
  ck_assert_msg(strstr(r.out, bad_out) != NULL, "the message does not name the root:\n%s", r.out);
  rlk_test_tool_free(&r);
  rlk_test_rmtree(tree);
}
END_TEST

START_TEST(precompile_for_a_gpu_target_without_a_gpu) {
  /* NVRTC compiles for any target on a CPU-only machine; skip only when it is absent. */
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_CUDA;
  o.compile_only = 1;
  o.target = "sm_90a";
  char probe[1024];
  rlk_test_mkdtemp(probe, sizeof probe, "probe");
  o.cache_dir = probe;
  rlk_context *ctx = NULL;
  rlk_status st = rlk_context_create(&ctx, &o);
  if (st != RLK_OK) {
    printf("skip (tools: precompile for sm_90a): no NVRTC: %s\n", rlk_last_error());
    fflush(stdout);
    rlk_test_rmtree(probe);
    return;
  }
  rlk_context_destroy(ctx);
  rlk_test_rmtree(probe);

  char tree[1024];
  rlk_test_mkdtemp(tree, sizeof tree, "sm90a");
  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-precompile",
                            ARGS("--out", tree, "--targets", "sm_90a", "-j", "2", "--sweep",
                                 "group_advantage mode=grpo,rloo group_size=8 scores=f32"));
  expect_status(r, 0, "rlk-precompile sm_90a -j 2");
  ck_assert_msg(strstr(r.out, "done: 2 items, 0 failed") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "list"));
  expect_status(r, 0, "rlk-cache list sm_90a");
  int n = rlk_test_count_lines(r.out, "sm_90a");
  ck_assert_int_ge(n, 2);
  ck_assert_int_eq(rlk_test_count_lines(r.out, "nvrtc"), n);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "verify"));
  expect_status(r, 0, "rlk-cache verify sm_90a");
  rlk_test_tool_free(&r);

  rlk_test_rmtree(tree);
}
END_TEST

/* Malformed configuration input fails loudly: a NUL byte never cuts a line short, and a line
 * whose cross product is enormous is refused at once instead of expanding for hours. */
START_TEST(config_lines_are_bounded_and_whole) {
  char dir[1024], conf[1100];
  rlk_test_mkdtemp(dir, sizeof dir, "badconf");
  snprintf(conf, sizeof conf, "%s/nul.conf", dir);
  static const char text[] = "group_advantage mode=grpo group_size=4\0 group_size=16\n";
  FILE *f = fopen(conf, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(text, 1, sizeof text - 1, f), sizeof text - 1);
  fclose(f);
  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-precompile",
                                          ARGS("--dry-run", "--config", conf, "--targets", "host"));
  expect_status(r, 2, "config with a NUL byte");
  ck_assert_ptr_nonnull(strstr(r.out, "NUL"));
  rlk_test_tool_free(&r);

  /* 10^12 configurations: refused before any is built. */
  const char *big = "group_advantage group_size=1,2,3,4,5,6,7,8,9,10 eps=1,2,3,4,5,6,7,8,9,10 "
                    "unbiased=1,2,3,4,5,6,7,8,9,10 mode=1,2,3,4,5,6,7,8,9,10 "
                    "scores=1,2,3,4,5,6,7,8,9,10 singleton=1,2,3,4,5,6,7,8,9,10 "
                    "a=1,2,3,4,5,6,7,8,9,10 b=1,2,3,4,5,6,7,8,9,10 c=1,2,3,4,5,6,7,8,9,10 "
                    "d=1,2,3,4,5,6,7,8,9,10 e=1,2,3,4,5,6,7,8,9,10 f=1,2,3,4,5,6,7,8,9,10";
  double t0 = rlk_now();
  r = rlk_test_run_tool(NULL, "rlk-precompile", ARGS("--dry-run", "--sweep", big, "--targets", "host"));
  expect_status(r, 2, "an enormous sweep");
  ck_assert_ptr_nonnull(strstr(r.out, "expands to more than"));
  ck_assert_msg(rlk_now() - t0 < 10, "the refusal took %.1f s", rlk_now() - t0);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-tune", ARGS("--dry-run", "--backend", "host", "--sweep", big));
  ck_assert_int_ne(r.status, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "expands to more than"));
  rlk_test_tool_free(&r);
  rlk_test_rmtree(dir);
}
END_TEST

/* prune on a tree it may not delete from says so and fails; it never reports success. */
START_TEST(prune_that_cannot_delete_fails) {
  char root[1024];
  int as_root = geteuid() == 0;
  if (as_root) {
    snprintf(root, sizeof root, "/tmp/rlk-test-prune-XXXXXX"); /* reachable by the other user */
    ck_assert_ptr_nonnull(mkdtemp(root));
    ck_assert_int_eq(chmod(root, 0755), 0);
  } else {
    rlk_test_mkdtemp(root, sizeof root, "prune");
  }
  rlk_test_tool_run r = rlk_test_run_tool(ENV(NULL), "rlk-precompile",
                                          ARGS("--out", root, "--targets", "host", "--sweep",
                                               "group_advantage mode=grpo,rloo group_size=4"));
  expect_status(r, 0, "precompile");
  rlk_test_tool_free(&r);
  char cmd[4096];
  int status;
  if (as_root) {
    /* Everything stays readable to the other user, nothing writable. */
    snprintf(cmd, sizeof cmd, "chmod -R a+rX,go-w '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
    pid_t pid = rlk_test_fork();
    if (pid == 0) {
      if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
      char bin[2048];
      snprintf(bin, sizeof bin, "%s/rlk-cache", rlk_test_bin_dir());
      int out = open("/dev/null", O_WRONLY);
      dup2(out, 1);
      dup2(out, 2);
      execl(bin, bin, "--root", root, "prune", "--max-size", "1", (char *)NULL);
      _exit(78);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
      printf("skip (prune without permission): cannot switch to uid 65534\n");
      rlk_test_rmtree(root);
      return;
    }
    ck_assert_msg(WEXITSTATUS(status) != 0, "prune reported success on a tree it cannot change");
  } else {
    snprintf(cmd, sizeof cmd, "chmod -R a-w '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
    r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", root, "prune", "--max-size", "1"));
    ck_assert_msg(r.status != 0, "prune reported success on a tree it cannot change:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "could not be removed"));
    rlk_test_tool_free(&r);
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
  }
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", root, "list"));
  expect_status(r, 0, "list");
  ck_assert_int_ge(rlk_test_count_lines(r.out, "group_advantage"), 1);
  rlk_test_tool_free(&r);
  rlk_test_rmtree(root);
}
END_TEST

/* Moves the last_used stamp of every entry of a tree two hours back, so the cache's eviction
 * no longer spares them as fresh. */
static int age_last_used(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  if (flag == FTW_F && !strcmp(path + ftw->base, "last_used")) {
    struct timespec t[2] = {{sb->st_mtime - 7200, 0}, {sb->st_mtime - 7200, 0}};
    ck_assert_msg(utimensat(AT_FDCWD, path, t, 0) == 0, "cannot age %s", path);
  }
  return 0;
}

/* A precompile's output tree keeps every kernel: the cache's size cap, which evicts the least
 * recently used entries of a user's cache, does not apply to it. */
START_TEST(precompile_ignores_the_size_cap) {
  char tree[1024];
  rlk_test_mkdtemp(tree, sizeof tree, "capped");
  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-precompile",
                            ARGS("--out", tree, "--targets", "host", "-j", "1", "--sweep",
                                 "group_advantage mode=grpo group_size=4,8 scores=f32"));
  expect_status(r, 0, "rlk-precompile without a cap");
  rlk_test_tool_free(&r);
  int before = 0;
  free(tree_keys(tree, &before));
  ck_assert_int_ge(before, 2);
  /* entries of an earlier run, as in a long run or a tree filled in steps */
  ck_assert_int_eq(nftw(tree, age_last_used, 32, FTW_PHYS), 0);

  r = rlk_test_run_tool(ENV("RLK_CACHE_MAX_BYTES=1"), "rlk-precompile",
                        ARGS("--out", tree, "--targets", "host", "-j", "1", "--sweep",
                             "group_advantage mode=rloo group_size=4,8 scores=f32"));
  expect_status(r, 0, "rlk-precompile with RLK_CACHE_MAX_BYTES=1");
  ck_assert_msg(strstr(r.out, "done: 2 items, 0 failed") != NULL, "%s", r.out);
  int after = 0;
  free(tree_keys(tree, &after));
  ck_assert_msg(after == 2 * before, "%d entries kept of %d:\n%s", after, 2 * before, r.out);
  ck_assert_msg(strstr(r.out, "ignoring RLK_CACHE_MAX_BYTES=1") != NULL, "no note of the cap:\n%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "verify"));
  expect_status(r, 0, "rlk-cache verify");
  ck_assert_int_eq(rlk_test_last_value(r.out, "verify: "), after);
  rlk_test_tool_free(&r);
  rlk_test_rmtree(tree);
}
END_TEST

/* A path longer than a tool takes is a usage error naming its option, and nothing is done: cut
 * to the buffer's size, dir////...////gone would be dir itself. */
START_TEST(long_paths_are_refused) {
  char victim[1024], fresh[1024], db[1100];
  rlk_test_mkdtemp(victim, sizeof victim, "victim");
  rlk_test_mkdtemp(fresh, sizeof fresh, "fresh");
  snprintf(db, sizeof db, "%s/tune.db", victim);
  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-precompile",
                                          ARGS("--out", victim, "--targets", "host", "--sweep", DEMO_CONFIG));
  expect_status(r, 0, "precompile the victim");
  rlk_test_tool_free(&r);
  int nkeys = 0;
  free(tree_keys(victim, &nkeys));
  ck_assert_int_ge(nkeys, 1);

  /* dir, 4200 slashes, then a name that does not exist */
  char long_victim[5400], long_fresh[5400], long_db[5400];
  const struct {
    char *buf;
    const char *dir;
  } longs[] = {{long_victim, victim}, {long_fresh, fresh}, {long_db, db}};
  for (size_t i = 0; i < 3; i++) {
    size_t n = (size_t)snprintf(longs[i].buf, 1100, "%s", longs[i].dir);
    memset(longs[i].buf + n, '/', 4200);
    snprintf(longs[i].buf + n + 4200, 100, "gone");
  }
  const struct {
    const char *tool, *what, *option;
    const char *const *args;
  } cases[] = {
      {"rlk-cache", "clear --yes", "--root", ARGS("--root", long_victim, "clear", "--yes")},
      {"rlk-cache", "list", "--root", ARGS("--root", long_victim, "list")},
      {"rlk-precompile", "--out", "--out", ARGS("--out", long_fresh, "--targets", "host", "--sweep", DEMO_CONFIG)},
      {"rlk-precompile", "merge --out", "--out", ARGS("merge", "--out", long_fresh, victim)},
      {"rlk-tune", "--db --merge", "--db", ARGS("--db", long_db, "--merge", db)},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    r = rlk_test_run_tool(NULL, cases[i].tool, cases[i].args);
    /* the output holds the path: only its start goes into a failure's message */
    ck_assert_msg(r.status == 2 && strstr(r.out, cases[i].option) && strstr(r.out, "bytes long"),
                  "%s %s: exit status %d, not a usage error naming %s as too long:\n%.300s", cases[i].tool,
                  cases[i].what, r.status, cases[i].option, r.out);
    rlk_test_tool_free(&r);
  }
  /* nothing was removed from the victim, nothing written to the fresh tree */
  int now = 0;
  free(tree_keys(victim, &now));
  ck_assert_int_eq(now, nkeys);
  free(tree_keys(fresh, &now));
  ck_assert_int_eq(now, 0);
  rlk_test_rmtrees(ARGS(victim, fresh));
}
END_TEST

/* Output that could not be written is a failure (exit status 1, said on stderr), never success:
 * standard output on /dev/full, and the benchmarks' --json FILE. */
START_TEST(lost_output_fails) {
  static const char *const tools[] = {"rlk-cache", "rlk-precompile", "rlk-tune", "rlk-demo", "rlk-grpo-step",
                                      "rlk-bench", "rlk-bench-advantage-scan", "rlk-bench-linear-logprob",
                                      "rlk-bench-logprob", "rlk-bench-policy-loss", "rlk-bench-sample"};
  rlk_test_tool_run r;
  for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++) {
    r = rlk_test_run_tool_to("/dev/full", NULL, tools[i], ARGS("--help"));
    expect_status(r, 1, tools[i]);
    ck_assert_msg(strstr(r.out, "writing standard output"), "%s --help > /dev/full says:\n%s", tools[i], r.out);
    rlk_test_tool_free(&r);
  }
  char dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, "lost");
  const struct {
    const char *tool, *what;
    const char *const *args;
  } cases[] = {
      {"rlk-cache", "list", ARGS("--root", dir, "list")},
      {"rlk-cache", "--json list", ARGS("--root", dir, "--json", "list")},
      {"rlk-cache", "sizes", ARGS("--root", dir, "sizes")},
      {"rlk-precompile", "--dry-run", ARGS("--dry-run", "--targets", "host", "--sweep", SMALL_SWEEP)},
      {"rlk-precompile", "--dry-run --json", ARGS("--dry-run", "--json", "--targets", "host", "--sweep", SMALL_SWEEP)},
      {"rlk-precompile", "--list-ops", ARGS("--list-ops")},
      {"rlk-tune", "--list-candidates", ARGS("--list-candidates")},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    r = rlk_test_run_tool_to("/dev/null", NULL, cases[i].tool, cases[i].args);
    expect_status(r, 0, cases[i].what); /* what fails below is the writing alone */
    rlk_test_tool_free(&r);
    r = rlk_test_run_tool_to("/dev/full", NULL, cases[i].tool, cases[i].args);
    expect_status(r, 1, cases[i].what);
    ck_assert_msg(strstr(r.out, "writing standard output: "), "%s %s > /dev/full says:\n%s", cases[i].tool,
                  cases[i].what, r.out);
    rlk_test_tool_free(&r);
  }
  static const char *const benches[] = {"rlk-bench", "rlk-bench-policy-loss"};
  for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++) {
    r = rlk_test_run_tool_to("/dev/null", NULL, benches[i], ARGS("--backend", "host", "--iters", "1", "--json", "/dev/full"));
    expect_status(r, 1, benches[i]);
    ck_assert_msg(strstr(r.out, "writing /dev/full: "), "%s --json /dev/full says:\n%s", benches[i], r.out);
    rlk_test_tool_free(&r);
  }
  rlk_test_rmtree(dir);
}
END_TEST

/* ---- a strict JSON reader (RFC 8259), independent of the tools' writers ---------------------- */

static const char *json_skip_value(const char *p, int depth);

static const char *json_skip_space(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

/* One character of a string body that is not an escape: well-formed UTF-8, decoded and checked
 * for overlong forms, surrogates and the Unicode range. Past it, or NULL. */
static const char *json_skip_char(const char *p) {
  const unsigned char *u = (const unsigned char *)p;
  if (u[0] < 0x20) return NULL; /* raw control characters (and the string's end) are not allowed */
  if (u[0] < 0x80) return p + 1;
  int n = u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 0;
  if (n == 0 || u[0] >= 0xF8) return NULL;
  unsigned long cp = u[0] & (0x7Fu >> n);
  for (int i = 1; i < n; i++) {
    if ((u[i] & 0xC0) != 0x80) return NULL;
    cp = cp << 6 | (u[i] & 0x3Fu);
  }
  static const unsigned long least[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return NULL;
  return p + n;
}

static const char *json_skip_string(const char *p) {
  if (*p++ != '"') return NULL;
  while (p && *p != '"') {
    if (*p != '\\') {
      p = json_skip_char(p);
    } else if (p[1] == 'u') {
      for (int i = 2; i < 6; i++)
        if (!isxdigit((unsigned char)p[i])) return NULL;
      p += 6;
    } else {
      p = p[1] && strchr("\"\\/bfnrt", p[1]) ? p + 2 : NULL;
    }
  }
  return p ? p + 1 : NULL;
}

static const char *json_skip_number(const char *p) {
  if (*p == '-') p++;
  if (*p == '0') p++;
  else if (*p >= '1' && *p <= '9') while (isdigit((unsigned char)*p)) p++;
  else return NULL;
  if (*p == '.') {
    if (!isdigit((unsigned char)*++p)) return NULL;
    while (isdigit((unsigned char)*p)) p++;
  }
  if (*p == 'e' || *p == 'E') {
    if (*++p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p)) return NULL;
    while (isdigit((unsigned char)*p)) p++;
  }
  return p;
}

/* The members of an object (close '}') or the elements of an array (close ']'). */
static const char *json_skip_items(const char *p, char close, int depth) {
  p = json_skip_space(p + 1);
  if (*p == close) return p + 1;
  for (;;) {
    if (close == '}') {
      p = json_skip_string(p);
      if (!p || *(p = json_skip_space(p)) != ':') return NULL;
      p++;
    }
    if (!(p = json_skip_value(p, depth + 1))) return NULL;
    p = json_skip_space(p);
    if (*p == close) return p + 1;
    if (*p != ',') return NULL;
    p = json_skip_space(p + 1);
  }
}

static const char *json_skip_value(const char *p, int depth) {
  p = json_skip_space(p);
  if (depth > 64) return NULL;
  if (*p == '{' || *p == '[') return json_skip_items(p, *p == '{' ? '}' : ']', depth);
  if (*p == '"') return json_skip_string(p);
  static const char *const words[] = {"true", "false", "null"};
  for (size_t i = 0; i < 3; i++)
    if (!strncmp(p, words[i], strlen(words[i]))) return p + strlen(words[i]);
  return json_skip_number(p);
}

/* Whether s is one JSON value and nothing else (but white space). */
static int json_valid(const char *s) {
  const char *end = json_skip_value(s, 0);
  return end && *json_skip_space(end) == '\0';
}

/* out is one JSON object: it starts with '{', ends with "}\n", parses, and nothing else was printed. */
static void expect_json_document(const char *out, const char *what) {
  size_t n = strlen(out);
  ck_assert_msg(n > 2 && out[0] == '{' && out[n - 2] == '}' && out[n - 1] == '\n' && json_valid(out),
                "%s: not one JSON document:\n%s", what, out);
}

/* What a JSON writer of tool_util.h writes, as a string (the caller frees it). */
#define JSON_TEXT(call)                       \
  ({                                          \
    char *text_ = NULL;                       \
    size_t size_ = 0;                         \
    FILE *f = open_memstream(&text_, &size_); \
    ck_assert_ptr_nonnull(f);                 \
    call;                                     \
    ck_assert_int_eq(fclose(f), 0);           \
    text_;                                    \
  })

/* JSON strings from any bytes: well-formed UTF-8 as it is, every byte of anything else as U+FFFD,
 * control characters escaped; numbers that JSON cannot hold (inf, nan) as null. */
START_TEST(json_writers_always_parse) {
  static const struct {
    const char *in, *out;
  } strings[] = {
      {"plain", "\"plain\""},
      {"q\"b\\s\nn\x01\x1f\x7f", "\"q\\\"b\\\\s\\nn\\u0001\\u001f\\u007f\""},
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""},
      {"a\xff", "\"a\\ufffd\""},                          /* never a UTF-8 byte */
      {"\x80x", "\"\\ufffdx\""},                          /* a stray continuation byte */
      {"cut\xe2\x82", "\"cut\\ufffd\\ufffd\""},             /* a character cut at the end */
      {"\xc0\xaf", "\"\\ufffd\\ufffd\""},                   /* an overlong '/' */
      {"\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\""},         /* a surrogate */
      {"\xf4\x90\x80\x80", "\"\\ufffd\\ufffd\\ufffd\\ufffd\""}, /* past U+10FFFF */
      {"\xe9t\xe9", "\"\\ufffdt\\ufffd\""},                   /* Latin-1 */
  };
  for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
    char *text = JSON_TEXT(json_string(f, strings[i].in));
    ck_assert_str_eq(text, strings[i].out);
    ck_assert_msg(json_valid(text), "not a JSON string: %s", text);
    free(text);
  }
  static const struct {
    double v;
    const char *fmt, *out;
  } numbers[] = {{1.5, "%.4g", "1.5"},      {-0.25, "%.6f", "-0.250000"}, {1e300, "%g", "1e+300"},
                 {INFINITY, "%.4g", "null"}, {-INFINITY, "%.6f", "null"},  {NAN, "%.4g", "null"}};
  for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) {
    char *text = JSON_TEXT(json_number(f, numbers[i].fmt, numbers[i].v));
    ck_assert_str_eq(text, numbers[i].out);
    free(text);
  }
  char *text = JSON_TEXT((fputs("{\"a\": 1", f), json_number_member(f, "max_error", "%.4g", NAN), fputs("}", f)));
  ck_assert_str_eq(text, "{\"a\": 1, \"max_error\": null}");
  ck_assert(json_valid(text));
  free(text);
  /* the reader itself refuses what the writers must never write */
  static const char *const bad[] = {"{\"a\": inf}", "{\"a\": nan}", "\"\xff\"", "\"\x01\"", "[1,]", "{} {}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) ck_assert_msg(!json_valid(bad[i]), "%s", bad[i]);
}
END_TEST

/* makes dir and its parents */
static void make_dirs(const char *path) {
  char buf[2048];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    mkdir(buf, 0700);
    *p = '/';
  }
  ck_assert_msg(mkdir(buf, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", buf, strerror(errno));
}

/* An entry whose names are not UTF-8 (its metadata unreadable, it lists by its path's names): the
 * tool's JSON still parses, with U+FFFD for those bytes. */
START_TEST(json_lists_any_name) {
  char root[1024], entry[2048], meta[2100];
  rlk_test_mkdtemp(root, sizeof root, "json-names");
  snprintf(entry, sizeof entry, "%s/v1/cc\xff/t\x01/fam\xc3\xa9\xe2\x82/ab/ab%062d", root, 0);
  make_dirs(entry);
  snprintf(meta, sizeof meta, "%s/kernel.meta", entry);
  write_file(meta, "not metadata\n");
  static const char *const commands[] = {"list", "sizes"};
  for (size_t i = 0; i < 2; i++) {
    rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", root, "--json", commands[i]));
    expect_status(r, 0, commands[i]);
    expect_json_document(r.out, commands[i]);
    ck_assert_msg(strstr(r.out, "fam\xc3\xa9\\ufffd\\ufffd") && strstr(r.out, "t\\u0001") &&
                      (i || strstr(r.out, "\"compiler\": \"cc\\ufffd\"")),
                  "%s:\n%s", commands[i], r.out);
    rlk_test_tool_free(&r);
  }
  rlk_test_rmtree(root);
}
END_TEST

START_TEST(json_outputs) {
  char dir[1024], tree[1100];
  rlk_test_mkdtemp(dir, sizeof dir, "json");
  snprintf(tree, sizeof tree, "%s/tree", dir);
  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-precompile",
                                          ARGS("--targets", "host", "--sweep", SMALL_SWEEP, "--out", tree,
                                               "-j", "2", "--json"));
  expect_status(r, 0, "rlk-precompile --json");
  expect_json_document(r.out, "rlk-precompile --json");
  ck_assert_msg(strstr(r.out, "\"items\": 4, \"failed\": 0, \"kernels\": 4, \"compiled\": 4, \"cached\": 0")
                    != NULL, "%s", r.out);
  ck_assert_int_eq(rlk_test_count_lines(r.out, "{\"index\": "), 4);
  ck_assert_msg(strstr(r.out, "\"configuration\": \"group_advantage group_size=8 mode=rloo scores=f32\"") != NULL,
                "%s", r.out);
  rlk_test_tool_free(&r);
  /* a second run finds every kernel in the tree */
  r = rlk_test_run_tool(NULL, "rlk-precompile",
                        ARGS("--targets", "host", "--sweep", SMALL_SWEEP, "--out", tree, "--json"));
  expect_status(r, 0, "rlk-precompile --json again");
  ck_assert_msg(strstr(r.out, "\"compiled\": 0, \"cached\": 4") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-precompile",
                        ARGS("--targets", "host", "--sweep", SMALL_SWEEP, "--dry-run", "--json"));
  expect_status(r, 0, "rlk-precompile --dry-run --json");
  expect_json_document(r.out, "rlk-precompile --dry-run --json");
  ck_assert_msg(strstr(r.out, "\"count\": 4") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);

  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("list", "--root", tree, "--json"));
  expect_status(r, 0, "rlk-cache list --json");
  expect_json_document(r.out, "rlk-cache list --json");
  ck_assert_int_eq(rlk_test_count_lines(r.out, "  {\"key\": "), 4);
  ck_assert_msg(strstr(r.out, "\"count\": 4") != NULL && strstr(r.out, "\"family\": \"group_advantage\"") != NULL,
                "%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--json", "--root", tree, "sizes"));
  expect_status(r, 0, "rlk-cache sizes --json");
  expect_json_document(r.out, "rlk-cache sizes --json");
  ck_assert_msg(strstr(r.out, "\"by_family\": {\"group_advantage\": {\"entries\": 4") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "verify", "--json"));
  expect_status(r, 0, "rlk-cache verify --json");
  expect_json_document(r.out, "rlk-cache verify --json");
  ck_assert_msg(strstr(r.out, "\"entries\": 4, \"bad\": 0") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-cache", ARGS("--root", tree, "clear", "--yes", "--json"));
  expect_status(r, 0, "rlk-cache clear --json");
  ck_assert_msg(strstr(r.out, "\"cleared\": true") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  rlk_test_rmtree(dir);
}
END_TEST

Suite *tools_suite(void) {
  Suite *s = suite_create("tools");
  /* These run compilers in child processes. */
  rlk_test_add_case(s, "tools", 300, TESTS(help_and_usage_errors, dry_run_expands_sweeps,
      precompile_host_serves_demo_without_jit, recorded_configurations_precompile_what_runs,
      shards_merge_to_the_full_set, failures_are_reported, precompile_for_a_gpu_target_without_a_gpu,
      config_lines_are_bounded_and_whole, prune_that_cannot_delete_fails, json_outputs,
      precompile_ignores_the_size_cap, long_paths_are_refused, lost_output_fails, json_writers_always_parse,
      json_lists_any_name));
  return s;
}
