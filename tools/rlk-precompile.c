/*
 * rlk-precompile - compile a manifest of op configurations for a list of targets into a
 * cache tree, so production jobs start with every kernel already built (RLK_CACHE_RO_DIRS
 * plus RLK_JIT=0 to catch gaps).
 *
 *   rlk-precompile --out DIR --targets "sm_80 sm_90a" --config FILE [--sweep LINE]... [-j N]
 *                  [--shard i/n] [--dry-run] [--manifest FILE] [--json]
 *   rlk-precompile merge --out DIR SHARD...
 *   rlk-precompile --list-ops
 *
 * A configuration line is "op name=value ..." where a value may be a comma list; the line
 * stands for the cross product of its lists. The manifest is every configuration times
 * every target. Compiles run in worker processes (one compiler runs at a time inside a
 * process, so processes are what scale); --shard keeps the items whose index % n == i so a
 * cluster launcher can split the work, and 'merge' joins the shard trees. On a terminal a
 * status line shows how far the run is; --json writes one JSON document instead of the lines.
 *
 * Built only on the public API (include/rlk.h). Exit status: 0 success, 1 a failure, 2 a
 * usage error.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "rlk.h"

static const char *prog = "rlk-precompile";

#include "tool_util.h"
#include "tool_config.h"
#include "tool_pool.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: %s [OPTIONS] --targets \"T ...\" (--config FILE | --sweep LINE)...\n"
          "       %s [OPTIONS] --tune-db FILE [--tune-all-envs] [--targets \"T ...\"]\n"
          "       %s merge --out DIR SHARD...\n"
          "       %s --list-ops\n"
          "\n"
          "Compiles every kernel that a set of op configurations needs, for every target,\n"
          "into a cache tree (the same layout as a user cache). Deploy it read-only with\n"
          "RLK_CACHE_RO_DIRS=DIR, and run with RLK_JIT=0 to catch anything missing.\n"
          "\n"
          "options:\n"
          "  --targets \"LIST\"  targets, separated by spaces or commas: sm_XX, sm_XXa, sm_XXf,\n"
          "                    compute_XX (NVRTC), gfxNNN (hiprtc), host (the CPU compiler).\n"
          "                    No GPU is needed.\n"
          "  --config FILE     configuration lines, one per line; '#' starts a comment\n"
          "                    (repeatable; - reads standard input)\n"
          "  --sweep \"LINE\"    one configuration line (repeatable)\n"
          "  --tune-db FILE    also every record of a tuning database (rlk-tune): its default and\n"
          "                    its winner's settings, for the record's own target, so that calls\n"
          "                    that take the winner find it with RLK_JIT=0. Records of the targets\n"
          "                    given (all targets without --targets) and this runtime version.\n"
          "                    A file that is not a tuning database is a usage error.\n"
          "  --tune-all-envs   with --tune-db: every record, whatever its target or version\n"
          "                    A line is \"op name=value ...\"; a value may be a comma list,\n"
          "                    and the line expands to the cross product of its lists:\n"
          "                    \"group_advantage mode=grpo,rloo group_size=4,8\" is 4 configurations.\n"
          "  --out DIR         the cache root to write (default: the user cache root). It keeps\n"
          "                    every kernel: RLK_CACHE_MAX_BYTES (the cache's size cap) and\n"
          "                    RLK_CACHE_RO_DIRS are ignored\n"
          "  -j, --jobs N      worker processes (default: RLK_JIT_WORKERS, else the number of CPUs)\n"
          "  --shard i/n       keep only the items whose index %% n == i (0 <= i < n), so an\n"
          "                    array job splits the work, e.g. in Slurm:\n"
          "                    --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT\n"
          "  -n, --dry-run     list the expanded items, compile nothing\n"
          "  --manifest FILE   write one line per item: target, configuration, kernels, result\n"
          "  -q, --quiet       no per-item lines (a terminal still shows the status line)\n"
          "  --json            one JSON document on standard output: the totals and every\n"
          "                    item's result (with --dry-run: the items)\n"
          "  --list-ops        the ops and the parameters each configuration accepts\n"
          "  -h, --help        this help\n"
          "\n"
          "merge --out DIR SHARD...\n"
          "                    copies every committed entry of each shard tree into DIR (entries\n"
          "                    already there are kept), then verifies DIR.\n"
          "\n"
          "exit status: 0 success, 1 failure (any item failed), 2 usage error\n",
          prog, prog, prog, prog);
}

/* ---- the work ---------------------------------------------------------------------- */

typedef struct item {
  size_t index;       /* in the full manifest (what --shard splits) */
  const char *target;
  const char *config;
  /* filled in as reports arrive */
  int done;
  int status;
  int kernels;
  int compiles;
  double seconds;
  char *message;
} item;

/* One worker's contexts, one per target, made on first use. */
typedef struct target_ctx {
  const char *target;
  rlk_context *ctx;
  rlk_status status;
  char *error;
} target_ctx;

typedef struct worker {
  const char *out;
  target_ctx *tc;
  size_t ntc;
} worker;

static int same_dir(const char *a, const char *b) {
  char ra[PATH_MAX], rb[PATH_MAX];
  if (realpath(a, ra) && realpath(b, rb)) return strcmp(ra, rb) == 0;
  return strcmp(a, b) == 0;
}

static target_ctx *worker_context(worker *w, const char *target) {
  for (size_t i = 0; i < w->ntc; i++)
    if (!strcmp(w->tc[i].target, target)) return &w->tc[i];
  w->tc = xrealloc(w->tc, (w->ntc + 1) * sizeof *w->tc);
  target_ctx *t = &w->tc[w->ntc++];
  memset(t, 0, sizeof *t);
  t->target = target;
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = rlk_target_backend(target); /* AUTO for a name no backend has: the context says why */
  /* The host backend needs no device, so a host context can compile and also run. */
  o.compile_only = o.backend != RLK_BACKEND_HOST;
  /* "host" is this machine's CPU target (the library names it, e.g. host-x86_64). */
  o.target = strcmp(target, "host") ? target : NULL;
  o.cache_dir = w->out;
  char buf[1024];
  t->status = rlk_context_create(&t->ctx, &o);
  if (t->status != RLK_OK) {
    snprintf(buf, sizeof buf, "creating a %s context for %s: %s", rlk_backend_name(o.backend),
             target, rlk_last_error());
    t->error = xstrdup(buf);
    return t;
  }
  /* A cache root that cannot be written makes the library fall back to memory; the
   * kernels would then be compiled and thrown away. */
  const char *dir = rlk_context_cache_dir(t->ctx);
  if (!*dir || !same_dir(dir, w->out)) {
    snprintf(buf, sizeof buf,
             "the cache root %s is not in use (%s): check that it is writable, owned by you, "
             "and that RLK_CACHE_MODE is unset or rw",
             w->out, *dir ? dir : "the context fell back to an in-memory cache");
    t->status = RLK_ERR_CACHE;
    t->error = xstrdup(buf);
    rlk_context_destroy(t->ctx);
    t->ctx = NULL;
  }
  return t;
}

static void worker_close(worker *w) {
  for (size_t i = 0; i < w->ntc; i++) {
    rlk_context_destroy(w->tc[i].ctx);
    free(w->tc[i].error);
  }
  free(w->tc);
  w->tc = NULL;
  w->ntc = 0;
}

/* ---- the parent's bookkeeping ------------------------------------------------------ */

typedef struct run_state {
  item *items;
  size_t nitems;
  size_t finished, failed;
  long kernels, compiles;
  int quiet;
  int width;
  const char *out;
  progress bar;
} run_state;

static void *worker_open(void *user) {
  run_state *s = user;
  worker *w = xrealloc(NULL, sizeof *w);
  w->out = s->out;
  w->tc = NULL;
  w->ntc = 0;
  return w;
}

static void worker_end(void *user, void *state) {
  (void)user;
  worker_close(state);
  free(state);
}

/* Runs one item in a worker: its report and message. */
static void run_item(void *user, void *state, size_t i, pool_report *r, char *msg) {
  const item *it = &((run_state *)user)->items[i];
  double t0 = now_s();
  target_ctx *t = worker_context(state, it->target);
  if (!t->ctx) {
    r->status = (int32_t)t->status;
    snprintf(msg, POOL_MAX_MSG, "%s", t->error);
  } else {
    rlk_counters before, after;
    rlk_context_counters(t->ctx, &before);
    int kernels = 0;
    rlk_status st = rlk_precompile(t->ctx, it->config, &kernels);
    rlk_context_counters(t->ctx, &after);
    r->status = (int32_t)st;
    r->count[0] = kernels;
    r->count[1] = (int32_t)(after.compiles - before.compiles);
    if (st != RLK_OK) snprintf(msg, POOL_MAX_MSG, "%s", rlk_last_error());
  }
  r->seconds = now_s() - t0;
}

static void record(void *user, const pool_report *r, const char *msg) {
  run_state *s = user;
  item *it = &s->items[r->item];
  it->done = 1;
  it->status = r->status;
  it->kernels = r->count[0];
  it->compiles = r->count[1];
  it->seconds = r->seconds;
  it->message = r->status != RLK_OK ? xstrdup(msg) : NULL;
  s->finished++;
  progress_clear(&s->bar);
  if (r->status != RLK_OK) {
    s->failed++;
    if (!s->quiet) {
      printf("[%*zu/%zu] %-8s %s  FAILED (%.2f s)\n", s->width, s->finished, s->nitems, it->target,
             it->config, it->seconds);
      fflush(stdout);
    }
    fprintf(stderr, "%s: %s %s: %s: %s\n", prog, it->target, it->config,
            rlk_status_string((rlk_status)r->status), msg);
    fflush(stderr);
  } else {
    s->kernels += r->count[0];
    s->compiles += r->count[1];
    if (!s->quiet) {
      printf("[%*zu/%zu] %-8s %s  %d kernel%s, %d compiled  %.2f s\n", s->width, s->finished,
             s->nitems, it->target, it->config, r->count[0], r->count[0] == 1 ? "" : "s", r->count[1],
             it->seconds);
      fflush(stdout);
    }
  }
  char detail[96];
  snprintf(detail, sizeof detail, "%ld kernels, %ld compiled%s", s->kernels, s->compiles,
           s->failed ? ", some failed" : "");
  progress_show(&s->bar, s->finished, detail);
}

/* ---- files -------------------------------------------------------------------------- */

static int mkdir_p(const char *path, mode_t mode) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, mode) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(buf, mode) != 0 && errno != EEXIST) return -1;
  struct stat st;
  if (stat(buf, &st) != 0) return -1;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return -1;
  }
  return 0;
}

static void fsync_path(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

static int copy_file(const char *from, const char *to, mode_t mode) {
  int in = open(from, O_RDONLY | O_CLOEXEC);
  if (in < 0) return -1;
  int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode & 0777);
  if (out < 0) {
    close(in);
    return -1;
  }
  char buf[1 << 16];
  int rc = 0;
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      rc = -1;
      break;
    }
    if (n == 0) break;
    if (write_all(out, buf, (size_t)n)) {
      rc = -1;
      break;
    }
  }
  if (!rc && fsync(out) != 0) rc = -1;
  int e = errno;
  close(in);
  if (close(out) != 0 && !rc) rc = -1;
  errno = e;
  return rc;
}

/* Copies the regular files (and subdirectories) of `from` into the existing dir `to`. */
static int copy_tree(const char *from, const char *to) {
  DIR *d = opendir(from);
  if (!d) return -1;
  struct dirent *de;
  int rc = 0;
  while (!rc && (de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char a[PATH_MAX], b[PATH_MAX];
    if (snprintf(a, sizeof a, "%s/%s", from, de->d_name) >= (int)sizeof a ||
        snprintf(b, sizeof b, "%s/%s", to, de->d_name) >= (int)sizeof b) {
      errno = ENAMETOOLONG;
      rc = -1;
      break;
    }
    struct stat st;
    if (lstat(a, &st) != 0) {
      rc = -1;
    } else if (S_ISREG(st.st_mode)) {
      rc = copy_file(a, b, st.st_mode);
    } else if (S_ISDIR(st.st_mode)) {
      rc = mkdir(b, 0700) != 0 ? -1 : copy_tree(a, b);
      if (!rc) chmod(b, st.st_mode & 0777);
    }
  }
  closedir(d);
  return rc;
}

static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *de;
    while ((de = readdir(d))) {
      if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
      char p[PATH_MAX];
      if (snprintf(p, sizeof p, "%s/%s", path, de->d_name) >= (int)sizeof p) continue;
      struct stat st;
      if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
        remove_tree(p);
      else
        unlink(p);
    }
    closedir(d);
  }
  rmdir(path);
}

static int collect_path(const rlk_cache_entry *e, void *user) {
  strlist_push(user, xstrdup(e->path));
  return 0;
}

/* ---- merge -------------------------------------------------------------------------- */

static int cmd_merge(int argc, char **argv) {
  const char *out = NULL;
  strlist shards = {0};
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'}, {"out", required_argument, NULL, 'o'}, {NULL, 0, NULL, 0}};
  opterr = 0; /* argv[0] is "merge", as a program's name is to getopt */
  int c;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    if (c == 'h') {
      usage(stdout);
      return 0;
    } else if (c == 'o') {
      if (!*optarg) return usage_error("--out needs a directory");
      char fits[PATH_MAX];
      const int rc = path_arg(fits, sizeof fits, "--out", optarg);
      if (rc) return rc;
      out = optarg;
    } else {
      return getopt_error(c, argv);
    }
  }
  for (int i = optind; i < argc; i++) strlist_push(&shards, xstrdup(argv[i]));
  if (!out) {
    strlist_free(&shards);
    return usage_error("merge needs --out DIR");
  }
  if (shards.n == 0) return usage_error("merge needs at least one shard directory");

  int rc = 0;
  char out_rp[PATH_MAX];
  rlk_status made = rlk_cache_create_root(out);
  if (made != RLK_OK || !realpath(out, out_rp)) {
    if (made != RLK_OK) lib_error("creating the output tree", made);
    else fprintf(stderr, "%s: %s: %s\n", prog, out, strerror(errno));
    strlist_free(&shards);
    return 1;
  }
  mode_t mask = umask(0);
  umask(mask);
  char host[64] = "host";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  uint64_t copied = 0, present = 0;

  for (size_t s = 0; s < shards.n && !rc; s++) {
    char rp[PATH_MAX];
    if (!realpath(shards.v[s], rp)) {
      fprintf(stderr, "%s: shard %s: %s\n", prog, shards.v[s], strerror(errno));
      rc = 1;
      break;
    }
    if (!strcmp(rp, out_rp)) {
      fprintf(stderr, "%s: skipping shard %s: it is the output tree\n", prog, shards.v[s]);
      continue;
    }
    /* Refuse to spread a damaged shard: its bad entries would pass for good ones. */
    uint64_t nent = 0, bad = 0;
    rlk_status st = rlk_cache_verify(rp, 0, &nent, &bad);
    if (st != RLK_OK) {
      rc = lib_error("verifying a shard", st);
      break;
    }
    if (bad) {
      fprintf(stderr,
              "%s: shard %s has %" PRIu64 " bad entries of %" PRIu64
              "; run 'rlk-cache --root %s verify --repair' (or recompile the shard) first\n",
              prog, shards.v[s], bad, nent, shards.v[s]);
      rc = 1;
      break;
    }
    strlist paths = {0};
    st = rlk_cache_walk(rp, collect_path, &paths);
    if (st != RLK_OK) {
      strlist_free(&paths);
      rc = lib_error("walking a shard", st);
      break;
    }
    size_t rplen = strlen(rp);
    for (size_t k = 0; k < paths.n && !rc; k++) {
      char ep[PATH_MAX];
      if (!realpath(paths.v[k], ep) || strncmp(ep, rp, rplen) != 0 || ep[rplen] != '/') {
        fprintf(stderr, "%s: entry %s is not inside shard %s\n", prog, paths.v[k], rp);
        rc = 1;
        break;
      }
      const char *rel = ep + rplen + 1;
      char dest[PATH_MAX], parent[PATH_MAX], tmpdir[PATH_MAX], stage[PATH_MAX];
      if (snprintf(dest, sizeof dest, "%s/%s", out_rp, rel) >= (int)sizeof dest ||
          snprintf(tmpdir, sizeof tmpdir, "%s/tmp", out_rp) >= (int)sizeof tmpdir ||
          /* the cache's staging name (<...>-<pid>-XXXXXX): a run cut short leaves what its
           * sweep of tmp/ removes */
          snprintf(stage, sizeof stage, "%s/merge-%s-%ld-XXXXXX", tmpdir, host, (long)getpid()) >=
              (int)sizeof stage) {
        fprintf(stderr, "%s: path too long under %s\n", prog, out_rp);
        rc = 1;
        break;
      }
      struct stat sb;
      if (lstat(dest, &sb) == 0) {
        present++;
        continue;
      }
      snprintf(parent, sizeof parent, "%s", dest);
      *strrchr(parent, '/') = '\0';
      if (mkdir_p(parent, 0777) != 0 || (mkdir(tmpdir, 0700) != 0 && errno != EEXIST) || !mkdtemp(stage)) {
        fprintf(stderr, "%s: cannot create directories under %s: %s\n", prog, out_rp,
                strerror(errno));
        rc = 1;
        break;
      }
      if (copy_tree(ep, stage) != 0) {
        fprintf(stderr, "%s: copying %s: %s\n", prog, ep, strerror(errno));
        remove_tree(stage);
        rc = 1;
        break;
      }
      /* Staging is private (0700); a published entry gets the user's umask. */
      chmod(stage, 0777 & ~mask);
      fsync_path(stage);
      if (rename(stage, dest) != 0) {
        int e = errno;
        remove_tree(stage);
        if (e == EEXIST || e == ENOTEMPTY) {
          present++;
          continue;
        }
        fprintf(stderr, "%s: publishing %s: %s\n", prog, dest, strerror(e));
        rc = 1;
        break;
      }
      fsync_path(parent);
      copied++;
    }
    strlist_free(&paths);
  }
  /* <out>/tmp stays, as the cache's own sweep leaves it: another process publishing into this
   * tree may be about to stage in it, so removing it, even empty, could pull it from under that
   * process. What merge staged there is gone already (published, or removed on failure). */

  if (!rc) {
    uint64_t nent = 0, bad = 0;
    rlk_status st = rlk_cache_verify(out_rp, 0, &nent, &bad);
    if (st != RLK_OK) {
      rc = lib_error("verifying the merged tree", st);
    } else {
      printf("merge: %zu shard%s, %" PRIu64 " entries copied, %" PRIu64
             " already present; %s: %" PRIu64 " entries, %" PRIu64 " bad\n",
             shards.n, shards.n == 1 ? "" : "s", copied, present, out, nent, bad);
      if (bad) rc = 1;
    }
  }
  strlist_free(&shards);
  return rc;
}

/* ---- main --------------------------------------------------------------------------- */

static int list_ops(void) {
  strlist ops = {0};
  split_words(rlk_precompile_ops(), 0, &ops);
  for (size_t i = 0; i < ops.n; i++) {
    printf("%s\n", ops.v[i]);
    const char *help = rlk_precompile_help(ops.v[i]);
    const char *p = help ? help : "";
    while (*p) {
      const char *nl = strchr(p, '\n');
      size_t n = nl ? (size_t)(nl - p) : strlen(p);
      if (n) printf("  %.*s\n", (int)n, p);
      p += n + (nl ? 1 : 0);
    }
  }
  strlist_free(&ops);
  return 0;
}

/* What the command line and the configuration files expand to. File scope so that every
 * exit path of precompile_main leaves main to free it. */
static struct {
  strlist config_files, sweeps, target_words, targets, ops, configs;
  strlist tuned_targets, tuned_configs; /* from the tuning database: (target, line) pairs */
  item *items;
  size_t nitems; /* allocated items (their messages are freed) */
} g;

/* ---- the tuning database as a manifest ----------------------------------------------- */

typedef struct tuned_walk {
  int all_envs;
  size_t taken, skipped;
} tuned_walk;

static int target_matches(const char *asked, const char *target) {
  return !strcmp(asked, target) || (!strcmp(asked, "host") && !strncmp(target, "host-", 5));
}

static void add_tuned(const char *target, char *line) {
  for (size_t i = 0; i < g.tuned_configs.n; i++)
    if (!strcmp(g.tuned_targets.v[i], target) && !strcmp(g.tuned_configs.v[i], line)) {
      free(line);
      return;
    }
  strlist_push(&g.tuned_targets, xstrdup(target));
  strlist_push(&g.tuned_configs, line);
}

/* Takes a record's default and winner lines when its environment is one asked for: a target
 * among --targets (any without them) and this runtime version; every record with all_envs. */
static int take_record(const rlk_tune_record *r, void *user) {
  tuned_walk *w = user;
  int ok = w->all_envs || !strcmp(r->runtime, rlk_version_string());
  if (ok && !w->all_envs && g.targets.n) {
    ok = 0;
    for (size_t i = 0; i < g.targets.n && !ok; i++) ok = target_matches(g.targets.v[i], r->target);
  }
  if (!ok || rlk_target_backend(r->target) == RLK_BACKEND_AUTO) {
    w->skipped++;
    return 0;
  }
  w->taken++;
  const size_t n = strlen(r->op) + strlen(r->shape) + strlen(r->winner) + 3;
  char *line = xrealloc(NULL, n);
  snprintf(line, n, "%s %s", r->op, r->shape);
  add_tuned(r->target, line);
  if (r->winner[0]) {
    line = xrealloc(NULL, n);
    snprintf(line, n, "%s %s %s", r->op, r->shape, r->winner);
    add_tuned(r->target, line);
  }
  return 0;
}

/* Appends item `index` of the full manifest (target, config) to g.items when it falls in shard
 * shard_i of shard_n. */
static void add_item(size_t *nitems, size_t index, const char *target, const char *config, long shard_i,
                     long shard_n) {
  if (index % (size_t)shard_n != (size_t)shard_i) return;
  item *it = &g.items[(*nitems)++];
  memset(it, 0, sizeof *it);
  it->index = index;
  it->target = target;
  it->config = config;
}

static int precompile_main(int argc, char **argv) {
  const char *out_arg = NULL, *manifest = NULL, *tune_db = NULL;
  char out[PATH_MAX];
  int have_targets = 0, dry_run = 0, quiet = 0, want_list_ops = 0, tune_all_envs = 0, json = 0;
  long jobs = 0, shard_i = 0, shard_n = 1;

  enum { OPT_LIST_OPS = 256, OPT_TUNE_ALL_ENVS, OPT_TUNE_DB, OPT_CONFIG, OPT_SWEEP, OPT_TARGETS, OPT_OUT,
         OPT_MANIFEST, OPT_SHARD, OPT_JSON };
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'},
      {"dry-run", no_argument, NULL, 'n'},
      {"quiet", no_argument, NULL, 'q'},
      {"jobs", required_argument, NULL, 'j'},
      {"list-ops", no_argument, NULL, OPT_LIST_OPS},
      {"tune-all-envs", no_argument, NULL, OPT_TUNE_ALL_ENVS},
      {"tune-db", required_argument, NULL, OPT_TUNE_DB},
      {"config", required_argument, NULL, OPT_CONFIG},
      {"sweep", required_argument, NULL, OPT_SWEEP},
      {"targets", required_argument, NULL, OPT_TARGETS},
      {"out", required_argument, NULL, OPT_OUT},
      {"manifest", required_argument, NULL, OPT_MANIFEST},
      {"shard", required_argument, NULL, OPT_SHARD},
      {"json", no_argument, NULL, OPT_JSON},
      {NULL, 0, NULL, 0}};
  static const tool_nonempty nonempty[] = {
      {OPT_TUNE_DB, "--tune-db needs a tuning database file"},
      {OPT_CONFIG, "--config needs a file"},
      {OPT_OUT, "--out needs a directory"},
      {OPT_MANIFEST, "--manifest needs a file"}};
  opterr = 0;
  int opt;
  while ((opt = getopt_long(argc, argv, ":hnqj:", longopts, NULL)) != -1) {
    const char *val = optarg;
    const int empty = empty_value_error(opt, val, nonempty, sizeof nonempty / sizeof nonempty[0]);
    if (empty) return empty;
    switch (opt) {
      case 'h': usage(stdout); return 0;
      case 'n': dry_run = 1; break;
      case 'q': quiet = 1; break;
      case OPT_LIST_OPS: want_list_ops = 1; break;
      case OPT_TUNE_ALL_ENVS: tune_all_envs = 1; break;
      case OPT_JSON: json = 1; break;
      case OPT_TUNE_DB: tune_db = val; break;
      case OPT_CONFIG: strlist_push(&g.config_files, xstrdup(val)); break;
      case OPT_SWEEP: strlist_push(&g.sweeps, xstrdup(val)); break;
      case OPT_TARGETS:
        split_words(val, 1, &g.target_words);
        have_targets = 1;
        break;
      case OPT_OUT: {
        const int rc = path_arg(out, sizeof out, "--out", val);
        if (rc) return rc;
        out_arg = val;
        break;
      }
      case OPT_MANIFEST: manifest = val; break;
      case 'j':
        if (parse_int(val, 1, 1024, &jobs)) return usage_error("-j needs a number of workers from 1 to 1024");
        break;
      case OPT_SHARD: {
        const char *slash = strchr(val, '/');
        char num[32];
        if (!slash || (size_t)(slash - val) >= sizeof num)
          return usage_error("--shard needs i/n, e.g. --shard 0/4");
        memcpy(num, val, (size_t)(slash - val));
        num[slash - val] = '\0';
        if (parse_int(num, 0, LONG_MAX, &shard_i) || parse_int(slash + 1, 1, LONG_MAX, &shard_n) ||
            shard_i >= shard_n)
          return usage_error("bad --shard '%s': needs i/n with 0 <= i < n", val);
        break;
      }
      default: return getopt_error(opt, argv);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s' (configuration lines go in --sweep)", argv[optind]);

  if (want_list_ops) return list_ops();
  if (g.config_files.n == 0 && g.sweeps.n == 0 && !tune_db)
    return usage_error("nothing to compile: give --config FILE, --sweep LINE and/or --tune-db FILE");
  if (tune_all_envs && !tune_db) return usage_error("--tune-all-envs goes with --tune-db");
  if ((g.config_files.n || g.sweeps.n) && (!have_targets || g.target_words.n == 0))
    return usage_error("--targets is required, e.g. --targets \"sm_80 sm_90a host\"");

  for (size_t i = 0; i < g.target_words.n; i++) {
    if (rlk_target_backend(g.target_words.v[i]) == RLK_BACKEND_AUTO)
      return usage_error("--targets: %s", rlk_last_error());
    if (!strlist_has(&g.targets, g.target_words.v[i]))
      strlist_push(&g.targets, xstrdup(g.target_words.v[i]));
  }

  split_words(rlk_precompile_ops(), 0, &g.ops);
  for (size_t i = 0; i < g.config_files.n; i++) {
    int rc = read_config_file(g.config_files.v[i], &g.ops, &g.configs);
    if (rc) return rc;
  }
  for (size_t i = 0; i < g.sweeps.n; i++) {
    char why[512];
    if (expand_line(g.sweeps.v[i], &g.ops, &g.configs, why, sizeof why) != 0)
      return usage_error("--sweep \"%s\": %s", g.sweeps.v[i], why);
  }
  if (g.configs.n == 0 && !tune_db) return usage_error("the configuration files hold no configuration line");
  tuned_walk tw = {tune_all_envs, 0, 0};
  if (tune_db) {
    if (access(tune_db, R_OK) != 0) {
      fprintf(stderr, "%s: cannot read the tuning database %s: %s\n", prog, tune_db, strerror(errno));
      return 2;
    }
    size_t bad = 0;
    rlk_status st = rlk_tune_db_walk(tune_db, take_record, &tw, &bad);
    if (st != RLK_OK) return lib_error("reading the tuning database", st);
    if (bad && tw.taken + tw.skipped == 0) {
      /* the walk skips such a file with a warning; a run from it would compile nothing asked */
      fprintf(stderr, "%s: --tune-db %s: not a tuning database (%zu line%s skipped, no record read)\n", prog,
              tune_db, bad, bad == 1 ? "" : "s");
      return 2;
    }
    if (!json)
      printf("tuning database %s: %zu record%s taken (%zu kernel line%s), %zu of other environments left out%s\n",
           tune_db, tw.taken, tw.taken == 1 ? "" : "s", g.tuned_configs.n, g.tuned_configs.n == 1 ? "" : "s",
           tw.skipped, tune_all_envs || !tw.skipped ? "" : " (--tune-all-envs takes them)");
    if (bad) fprintf(stderr, "%s: %s: %zu line%s skipped\n", prog, tune_db, bad, bad == 1 ? "" : "s");
  }

  /* The manifest: every configuration for every target, target by target, then the tuning
   * database's lines for their own targets. */
  size_t total = g.targets.n * g.configs.n + g.tuned_configs.n;
  g.items = xrealloc(NULL, (total ? total : 1) * sizeof *g.items);
  size_t nitems = 0;
  for (size_t t = 0; t < g.targets.n; t++)
    for (size_t c = 0; c < g.configs.n; c++)
      add_item(&nitems, t * g.configs.n + c, g.targets.v[t], g.configs.v[c], shard_i, shard_n);
  for (size_t k = 0; k < g.tuned_configs.n; k++)
    add_item(&nitems, g.targets.n * g.configs.n + k, g.tuned_targets.v[k], g.tuned_configs.v[k], shard_i, shard_n);
  g.nitems = nitems;
  char tuned_note[96] = "";
  if (g.tuned_configs.n)
    snprintf(tuned_note, sizeof tuned_note, " + %zu from the tuning database", g.tuned_configs.n);
  char shard_note[96] = "";
  if (shard_n > 1)
    snprintf(shard_note, sizeof shard_note, ", shard %ld/%ld of %zu", shard_i, shard_n, total);

  int width = 1, rc = 0;
  for (size_t n = total; n >= 10; n /= 10) width++;

  if (dry_run && json) {
    printf("{\"dry_run\": true, \"items\": [");
    for (size_t i = 0; i < nitems; i++) {
      printf("%s\n  {\"index\": %zu, \"target\": ", i ? "," : "", g.items[i].index);
      json_string(stdout, g.items[i].target);
      printf(", \"configuration\": ");
      json_string(stdout, g.items[i].config);
      printf("}");
    }
    printf("%s], \"count\": %zu, \"configurations\": %zu, \"targets\": %zu, \"total\": %zu}\n",
           nitems ? "\n" : "", nitems, g.configs.n, g.targets.n, total);
    goto cleanup;
  }
  if (dry_run) {
    for (size_t i = 0; i < nitems; i++)
      printf("%*zu  %-8s %s\n", width, g.items[i].index, g.items[i].target, g.items[i].config);
    printf("dry run: %zu items (%zu configuration%s x %zu target%s%s%s)\n", nitems, g.configs.n,
           g.configs.n == 1 ? "" : "s", g.targets.n, g.targets.n == 1 ? "" : "s", tuned_note, shard_note);
    goto cleanup;
  }

  if (!out_arg) {
    rlk_status st = rlk_cache_default_root(out, sizeof out);
    if (st != RLK_OK) return lib_error("finding the default cache root", st);
  }
  if (mkdir_p(out, 0777) != 0) {
    fprintf(stderr, "%s: cannot create %s: %s\n", prog, out, strerror(errno));
    return 1;
  }
  /* Entries found in read-only trees would not be written to the output tree, which must
   * hold every kernel of the manifest. */
  if (getenv("RLK_CACHE_RO_DIRS")) {
    fprintf(stderr, "%s: ignoring RLK_CACHE_RO_DIRS: every kernel is written to %s\n", prog, out);
    unsetenv("RLK_CACHE_RO_DIRS");
  }
  /* The cache's size cap would evict entries of the output tree (older ones first, and this
   * run's own once they are a minute old): a cap is for a user's cache, not for a tree that
   * is shipped whole. */
  const char *cap = getenv("RLK_CACHE_MAX_BYTES");
  if (cap && *cap) {
    fprintf(stderr, "%s: ignoring RLK_CACHE_MAX_BYTES=%s: %s keeps every kernel, whatever its size\n",
            prog, cap, out);
    unsetenv("RLK_CACHE_MAX_BYTES");
  }

  if (jobs == 0) {
    const char *w = getenv("RLK_JIT_WORKERS");
    if (w && *w && parse_int(w, 1, 1024, &jobs)) {
      fprintf(stderr, "%s: RLK_JIT_WORKERS=%s is not a number in [1, 1024]\n", prog, w);
      return 2;
    }
  }
  if (jobs == 0) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    jobs = cpus > 0 ? cpus : 1;
  }
  if ((size_t)jobs > nitems) jobs = (long)(nitems ? nitems : 1);

  if (!json) {
    printf("precompiling %zu items (%zu configuration%s x %zu target%s%s%s) into %s with %ld "
           "worker%s\n",
           nitems, g.configs.n, g.configs.n == 1 ? "" : "s", g.targets.n, g.targets.n == 1 ? "" : "s",
           tuned_note, shard_note, out, jobs, jobs == 1 ? "" : "s");
    fflush(stdout);
  }

  run_state s = {g.items, nitems, 0, 0, 0, 0, quiet || json, width, out, {0}};
  const pool_ops ops = {&s, worker_open, run_item, worker_end, record};
  double t0 = now_s();
  progress_start(&s.bar, nitems);
  progress_show(&s.bar, 0, "");
  pool_run(nitems, (int)jobs, &ops);
  progress_clear(&s.bar);
  double wall = now_s() - t0;

  uint64_t nent = 0, bad = 0;
  rlk_status vst = rlk_cache_verify(out, 0, &nent, &bad);
  if (vst != RLK_OK) rc = lib_error("verifying the output tree", vst);

  if (manifest) {
    FILE *f = fopen(manifest, "w");
    if (!f) {
      fprintf(stderr, "%s: cannot write %s: %s\n", prog, manifest, strerror(errno));
      rc = 1;
    } else {
      fprintf(f, "# index\ttarget\tconfiguration\tkernels\tresult\n");
      for (size_t i = 0; i < nitems; i++)
        fprintf(f, "%zu\t%s\t%s\t%d\t%s\n", g.items[i].index, g.items[i].target, g.items[i].config,
                g.items[i].kernels, g.items[i].status == RLK_OK ? "ok" : "failed");
      if (close_written(f, manifest)) rc = 1;
    }
  }

  if (json) {
    printf("{\"out\": ");
    json_string(stdout, out);
    printf(", \"items\": %zu, \"failed\": %zu, \"kernels\": %ld, \"compiled\": %ld, \"cached\": %ld", nitems,
           s.failed, s.kernels, s.compiles, s.kernels - s.compiles);
    json_number_member(stdout, "seconds", "%.3f", wall);
    printf(", \"workers\": %ld, \"entries\": %" PRIu64 ", \"bad\": %" PRIu64 ", \"verified\": %s, \"results\": [",
           jobs, nent, bad, vst == RLK_OK ? "true" : "false");
    for (size_t i = 0; i < nitems; i++) {
      const item *it = &g.items[i];
      printf("%s\n  {\"index\": %zu, \"target\": ", i ? "," : "", it->index);
      json_string(stdout, it->target);
      printf(", \"configuration\": ");
      json_string(stdout, it->config);
      printf(", \"ok\": %s, \"kernels\": %d, \"compiled\": %d", it->status == RLK_OK ? "true" : "false",
             it->kernels, it->compiles);
      json_number_member(stdout, "seconds", "%.3f", it->seconds);
      if (it->message) {
        printf(", \"message\": ");
        json_string(stdout, it->message);
      }
      printf("}");
    }
    printf("%s]}\n", nitems ? "\n" : "");
  } else {
    printf("done: %zu items, %zu failed, %ld kernels (%ld compiled, %ld already cached) in %.2f s, "
           "%.1f kernels/s\n",
           nitems, s.failed, s.kernels, s.compiles, s.kernels - s.compiles, wall,
           wall > 0 ? (double)s.kernels / wall : 0.0);
    if (vst == RLK_OK)
      printf("cache: %s: %" PRIu64 " entries, %" PRIu64 " bad\n", out, nent, bad);
  }
  if (s.failed) {
    fprintf(stderr, "%s: %zu of %zu items failed:\n", prog, s.failed, nitems);
    for (size_t i = 0; i < nitems; i++)
      if (g.items[i].status != RLK_OK)
        fprintf(stderr, "  %s %s: %s\n", g.items[i].target, g.items[i].config,
                g.items[i].message ? g.items[i].message : "");
    rc = 1;
  }
  if (bad) rc = 1;

cleanup:
  return rc;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "merge")) return tool_exit(cmd_merge(argc - 1, argv + 1));
  int rc = precompile_main(argc, argv);
  for (size_t i = 0; i < g.nitems; i++) free(g.items[i].message);
  free(g.items);
  strlist_free(&g.ops);
  strlist_free(&g.configs);
  strlist_free(&g.targets);
  strlist_free(&g.target_words);
  strlist_free(&g.config_files);
  strlist_free(&g.sweeps);
  strlist_free(&g.tuned_targets);
  strlist_free(&g.tuned_configs);
  return tool_exit(rc);
}
