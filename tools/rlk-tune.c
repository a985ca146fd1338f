/*
 * rlk-tune - shape-sweep tuning: for each op configuration of a sweep, compile every tuning
 * candidate the op declares, time each on the device against the default, check its outputs
 * against the default's, and record the winner in the tuning database that op calls consult.
 *
 *   rlk-tune --op logprob --vocab 151936,128256 --tokens 4096,16384 [--dtype bf16] [--entropy 0,1]
 *            [--pass fwd,bwd] [--labels i64] [--grad same] [--set NAME=LIST]... [OPTIONS]
 *   rlk-tune (--config FILE | --sweep LINE | --pending)... [OPTIONS]
 *   rlk-tune --list | --merge FILE...
 *
 * A sweep line is a configuration line of rlk-precompile (comma lists expand to their cross
 * product) that also names the token count: "logprob pass=fwd,bwd logits=bf16 entropy=0,1
 * vocab=151936 tokens=4096,16384". Each expanded line with one pass is one configuration (pass
 * both, or none, stands for fwd and bwd). The ops it can time are those with an implementation of
 * tune_op.h (inputs, calls and output checks through the public API): logprob
 * (tune_logprob.h) and prefix_attention (tune_prefix_attention.h).
 *
 * How a run goes:
 *   1. a child process opens the device (so that this process never initializes a GPU runtime
 *      before it forks) and reports what it is;
 *   2. each configuration's default and candidates are planned to their kernels' cache keys
 *      (rlk_precompile_keys): candidates with the same kernels as an earlier one are timed once
 *      (unless they set what changes calls but not kernels: rlk_tune_runtime_settings);
 *   3. every distinct kernel set is compiled into the kernel cache by worker processes (-j);
 *   4. a timing process takes the configurations in turn: fresh random non-zero inputs (several
 *      sets, rotated, when one fits in the L2), the default's outputs as the reference, then per
 *      candidate one checked call (outputs poisoned first, compared with the reference within a
 *      tolerance: a candidate that disagrees is rejected and never wins), then rounds in which
 *      every variant that passed is called once between device events (warm-up rounds first), round
 *      i starting at variant i, so drift and the clocks a variant leaves behind touch them alike;
 *      each one's median counts. A candidate whose call fails (or hangs:
 *      --timeout) ends the timing process, since a device fault can poison its context; a new one
 *      takes over at the next candidate, and that candidate is not run again in this run;
 *   5. each configuration's record (every candidate's median, the default's, the winner) is merged
 *      into the database as soon as it is complete, and a line is printed; a table closes the run.
 * A candidate wins only when its median and its fastest call both beat the default's by more than
 * --min-gain percent.
 * The tool's own calls run with RLK_TUNE=off, so "the default" is always the guaranteed default.
 *
 * Built only on the public API (include/rlk.h). Exit status: 0 success, 1 a configuration could
 * not be tuned or recorded, 2 a usage error.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rlk.h"

static const char *prog = "rlk-tune";

#include "tool_util.h"
#include "tool_config.h"
#include "tool_pool.h"
#include "tune_op.h"

#define MAX_RESTARTS 64 /* timing processes started after failures */

static void usage(FILE *out) {
  fprintf(out,
          "usage: %s --op OP [--vocab LIST] --tokens LIST [--dtype LIST] [--labels LIST] [--entropy LIST]\n"
          "                [--pass LIST] [--grad LIST] [--set NAME=LIST]... [OPTIONS]\n"
          "       %s (--config FILE | --sweep LINE | --pending)... [OPTIONS]\n"
          "       %s --list [--db FILE]\n"
          "       %s --merge FILE... [--db FILE] [--dry-run]\n"
          "\n"
          "Times every tuning candidate of each configuration against the op's default on this\n"
          "device and records the winners in the tuning database, which op calls then consult\n"
          "(RLK_TUNE=use, the default).\n"
          "\n"
          "what to sweep (combinable; every LIST is comma-separated):\n"
          "  --op OP           an op with tuning candidates (see --list-candidates)\n"
          "  --vocab, --tokens, --dtype (the logits), --labels, --entropy, --pass, --grad\n"
          "                    logprob's settings: vocab=, tokens= (N, required), logits=, labels=,\n"
          "                    entropy=, pass= (fwd, bwd; default both), grad=\n"
          "  --set NAME=LIST   any other setting of the op's configuration lines\n"
          "  --config FILE     sweep lines, one per line, '#' comments: rlk-precompile's\n"
          "                    configuration lines with tokens=, e.g.\n"
          "                    logprob pass=fwd,bwd logits=bf16 entropy=0,1 vocab=151936,50257 tokens=4096,16384\n"
          "  --sweep LINE      one sweep line (repeatable)\n"
          "  --pending         the configurations that op calls under RLK_TUNE=tune found missing\n"
          "                    (<db>.pending) on this device\n"
          "\n"
          "options:\n"
          "  --db FILE         the tuning database (default: RLK_TUNE_DB, else <cache root>/tune.db)\n"
          "  --backend B       auto (default), cuda, hip or host\n"
          "  --device N        device ordinal (default 0)\n"
          "  --target T        with --dry-run and no device: the target to plan for (sm_90a, gfx90a)\n"
          "  -j, --jobs N      compile workers (default: RLK_JIT_WORKERS, else the number of CPUs)\n"
          "  --warmup N        untimed rounds, each calling every checked variant once (default 5)\n"
          "  --iters N         timed rounds; each variant's median counts (default 50)\n"
          "  --l2-mb MB        rotate input sets when one fits in this much cache (default 60)\n"
          "  --min-gain PCT    a candidate's median and fastest call must beat the default's by more\n"
          "                    than this (default 1)\n"
          "  --timeout S       no progress for S seconds fails the candidate being checked, or the\n"
          "                    configuration whose rounds are running (default 120)\n"
          "  --exclude TEXT    leave out candidates whose settings contain TEXT (repeatable)\n"
          "  --time-duplicates also time candidates that plan to the same kernels as an earlier one\n"
          "                    (they never win: their spread shows the timing noise)\n"
          "  --seed N          the inputs' random seed (default: from the clock)\n"
          "  --json FILE       also write the results as JSON\n"
          "  -n, --dry-run     list what would be compiled and timed; no device needed (host, or\n"
          "                    --target), nothing compiled, timed or written. With --merge: how many\n"
          "                    records each file would give, nothing merged\n"
          "  --list-candidates print the candidates each op declares\n"
          "  -q, --quiet       no per-kernel compile lines\n"
          "  -h, --help        this help\n"
          "\n"
          "exit status: 0 success, 1 a configuration failed, 2 usage error\n",
          prog, prog, prog, prog);
}

/* ---- the command line ---------------------------------------------------------------- */

typedef struct options {
  const char *op, *db_arg, *json, *target;
  strlist sets;      /* "name=LIST" from --vocab ... and --set */
  strlist config_files, sweeps, merges, excludes;
  int pending, list, list_candidates, dry_run, quiet, time_duplicates;
  rlk_backend backend;
  long device, jobs, warmup, iters, l2_mb, timeout;
  double min_gain;
  uint64_t seed;
  int seed_given;
} options;

/* the defaults the usage names */
static options opt = {.backend = RLK_BACKEND_AUTO, .warmup = 5, .iters = 50, .l2_mb = 60, .timeout = 120,
                      .min_gain = 1.0};

/* ---- the model: configurations and their variants ------------------------------------ */

typedef enum vstate { V_PENDING = 0, V_DONE = 1 } vstate;

typedef struct tune_variant {
  char *settings;  /* "" for the default */
  char *keys;      /* the kernels' cache keys (rlk_precompile_keys) */
  int same_as;     /* -1: distinct; else the earlier variant with the same kernels */
  /* results */
  int state;
  rlk_tune_result result;
  double median_ms, min_ms, max_ms, max_err;
  char *note;
} tune_variant;

typedef struct config {
  char *line;        /* one pass, tokens=N */
  char *kernel_line; /* the line without tokens= (what the kernels depend on) */
  char *input_line, *input_keys; /* a backward's: the default forward that makes its inputs */
  rlk_tune_record key;
  int64_t tokens; /* the line's token count (its bucket is in key) */
  const tune_op *op;
  void *prob; /* op->problem_size bytes */
  tune_variant *v;        /* v[0]: the default */
  int nv;
  int failed, finished, recorded;
  char *error;
  double default_ms, best_ms;
  int winner;        /* index into v; 0: the default */
} config;

static config *cfgs;
static size_t ncfgs;
static rlk_device_info info;
static char db_path[4096];
static char cache_dir[4096];

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0 || !s) {
    fprintf(stderr, "%s: out of memory\n", prog);
    exit(1);
  }
  return s;
}

/* The line without its `name=` setting. */
static char *without_setting(const char *line, const char *name) {
  strlist w = {0};
  split_words(line, 0, &w);
  size_t n = strlen(name);
  char *out = xrealloc(NULL, strlen(line) + 1);
  out[0] = '\0';
  for (size_t i = 0; i < w.n; i++) {
    if (i && !strncmp(w.v[i], name, n) && w.v[i][n] == '=') continue;
    if (out[0]) strcat(out, " ");
    strcat(out, w.v[i]);
  }
  strlist_free(&w);
  return out;
}

#include "tune_linear_logprob.h"
#include "tune_logprob.h"
#include "tune_prefix_attention.h"

/* The ops rlk-tune can time, NULL-terminated. */
static const tune_op *const tune_ops[] = {&tune_op_logprob, &tune_op_prefix_attention, &tune_op_linear_logprob, NULL};

static const tune_op *tune_op_named(const char *name) {
  for (size_t i = 0; tune_ops[i]; i++)
    if (!strcmp(tune_ops[i]->name, name)) return tune_ops[i];
  return NULL;
}

/* Adds one expanded line (one pass, or both: then one configuration per pass). */
static int add_line(const char *line, strlist *lines) {
  char v[32], op[64];
  const char *pass = setting_of(line, "pass", v, sizeof v);
  snprintf(op, sizeof op, "%.*s", (int)strcspn(line, " "), line);
  if (!tune_op_named(op)) {
    strlist_push(lines, xstrdup(line)); /* other ops are refused when their key is made */
    return 0;
  }
  if (pass && strcmp(pass, "both")) {
    strlist_push(lines, xstrdup(line));
    return 0;
  }
  char *base = without_setting(line, "pass");
  strlist_push(lines, xasprintf("%s pass=fwd", base));
  strlist_push(lines, xasprintf("%s pass=bwd", base));
  free(base);
  return 0;
}

/* ---- the device, probed in a child ---------------------------------------------------- */

typedef struct probe_result {
  rlk_status status;
  rlk_backend backend;
  rlk_device_info info;
  char cache_dir[4096];
  char error[1024];
} probe_result;

static void probe_child(int fd, void *arg) {
  (void)arg;
  probe_result res;
  memset(&res, 0, sizeof res);
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = opt.backend;
  o.device = (int)opt.device;
  rlk_context *ctx = NULL;
  res.status = rlk_context_create(&ctx, &o);
  if (res.status == RLK_OK) {
    res.backend = rlk_context_backend(ctx);
    rlk_context_device_info(ctx, &res.info);
    const char *dir = rlk_context_cache_dir(ctx);
    if (strlen(dir) < sizeof res.cache_dir) {
      memcpy(res.cache_dir, dir, strlen(dir) + 1);
    } else { /* cut short it would name another directory */
      res.status = RLK_ERR_INVALID_ARGUMENT;
      snprintf(res.error, sizeof res.error, "the kernel cache root is longer than %zu bytes: %.200s...",
               sizeof res.cache_dir - 1, dir);
    }
    rlk_context_destroy(ctx);
  } else {
    snprintf(res.error, sizeof res.error, "%s", rlk_last_error());
  }
  _exit(write_all(fd, &res, sizeof res) ? 1 : 0);
}

/* Opens the device in a child process (this one never initializes a device runtime before it
 * forks) and reports what it is. */
static probe_result probe_device(void) {
  probe_result res;
  memset(&res, 0, sizeof res);
  int fd = -1;
  pid_t pid = pool_spawn(&fd, probe_child, NULL);
  size_t got = 0;
  while (pid > 0 && got < sizeof res) {
    ssize_t k = read(fd, (char *)&res + got, sizeof res - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
  }
  if (pid > 0) {
    close(fd);
    int ws = 0;
    waitpid(pid, &ws, 0);
  }
  if (pid < 0 || got != sizeof res) {
    memset(&res, 0, sizeof res);
    res.status = RLK_ERR_INTERNAL;
    snprintf(res.error, sizeof res.error, "the device probe %s", pid < 0 ? "could not start" : "died");
  }
  return res;
}

/* A compile-only context for planning (or, on the host, a host context), made in this process:
 * it opens a compiler, never a device runtime. */
static rlk_status planning_context(rlk_backend backend, const char *target, rlk_context **ctx) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = backend;
  o.compile_only = 1;
  o.target = backend == RLK_BACKEND_HOST ? NULL : target;
  return rlk_context_create(ctx, &o);
}

/* ---- planning ------------------------------------------------------------------------- */

/* Whether settings ("group=16 chunk=8192") set any of the space-separated names. */
static int names_any(const char *settings, const char *names) {
  strlist w = {0}, n = {0};
  split_words(settings, 0, &w);
  split_words(names, 0, &n);
  int any = 0;
  for (size_t i = 0; i < w.n && !any; i++) {
    char *eq = strchr(w.v[i], '=');
    if (eq) *eq = '\0';
    for (size_t j = 0; j < n.n && !any; j++) any = !strcmp(w.v[i], n.v[j]);
  }
  strlist_free(&w);
  strlist_free(&n);
  return any;
}

static int plan_configs(rlk_context *ctx) {
  int rc = 0;
  for (size_t i = 0; i < ncfgs; i++) {
    config *c = &cfgs[i];
    /* what changes this configuration's calls but not its kernels: a candidate that sets it is
     * its own, whatever its keys */
    const char *runtime_names = rlk_tune_runtime_settings(ctx, c->kernel_line);
    for (int k = 0; k < c->nv; k++) {
      tune_variant *v = &c->v[k];
      char *line = *v->settings ? xasprintf("%s %s", c->kernel_line, v->settings) : xstrdup(c->kernel_line);
      char keys[65 * 8 + 1];
      int n = 0;
      rlk_status st = rlk_precompile_keys(ctx, line, keys, sizeof keys, &n);
      if (st) {
        if (k == 0) {
          c->failed = 1;
          c->error = xasprintf("planning the default (%s): %s", line, rlk_last_error());
          rc = 1;
        }
        v->state = V_DONE;
        v->result = RLK_TUNE_FAILED;
        v->note = xasprintf("cannot be planned: %s", rlk_last_error());
      } else {
        v->keys = xstrdup(keys);
        const int runtime = k > 0 && names_any(v->settings, runtime_names);
        for (int j = 0; j < k && v->same_as < 0 && !runtime; j++)
          if (c->v[j].keys && !strcmp(c->v[j].keys, keys)) v->same_as = c->v[j].same_as >= 0 ? c->v[j].same_as : j;
      }
      free(line);
    }
    if ((c->input_line = c->op->input_line(c->prob))) {
      char keys[65 * 8 + 1];
      if (rlk_precompile_keys(ctx, c->input_line, keys, sizeof keys, NULL) == RLK_OK) c->input_keys = xstrdup(keys);
    }
  }
  return rc;
}

/* ---- compiling (worker processes) ----------------------------------------------------- */

typedef struct compile_item {
  char *line;
  size_t config;
  int variant;
  int status, kernels, compiles;
  char *message;
} compile_item;

static compile_item *citems;
static size_t ncitems, cdone, cfailed;
static long ccompiled;

typedef struct compile_state {
  rlk_context *ctx;
  rlk_status status;
  char error[1024];
} compile_state;

static rlk_backend run_backend;

static void *compile_worker_open(void *user) {
  (void)user;
  compile_state *s = xrealloc(NULL, sizeof *s);
  memset(s, 0, sizeof *s);
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = run_backend;
  /* the host backend needs no device, so a host context compiles and loads like a user's */
  o.compile_only = run_backend != RLK_BACKEND_HOST;
  o.target = run_backend != RLK_BACKEND_HOST ? info.target : NULL;
  o.cache_dir = cache_dir;
  s->status = rlk_context_create(&s->ctx, &o);
  if (s->status) snprintf(s->error, sizeof s->error, "creating a compile context: %s", rlk_last_error());
  return s;
}

static void compile_worker_close(void *user, void *state) {
  (void)user;
  compile_state *s = state;
  rlk_context_destroy(s->ctx);
  free(s);
}

static void compile_run(void *user, void *state, size_t i, pool_report *r, char *msg) {
  (void)user;
  compile_state *s = state;
  double t0 = now_s();
  if (!s->ctx) {
    r->status = (int32_t)s->status;
    snprintf(msg, POOL_MAX_MSG, "%s", s->error);
    return;
  }
  rlk_counters before, after;
  rlk_context_counters(s->ctx, &before);
  int kernels = 0;
  rlk_status st = rlk_precompile(s->ctx, citems[i].line, &kernels);
  rlk_context_counters(s->ctx, &after);
  r->status = (int32_t)st;
  r->count[0] = kernels;
  r->count[1] = (int32_t)(after.compiles - before.compiles);
  r->seconds = now_s() - t0;
  if (st) snprintf(msg, POOL_MAX_MSG, "%s", rlk_last_error());
}

/* The status line on a terminal: the compile phase's items, then the configurations timed. */
static progress bar;

static void compile_done(void *user, const pool_report *r, const char *msg) {
  (void)user;
  progress_clear(&bar);
  compile_item *it = &citems[r->item];
  it->status = r->status;
  it->kernels = r->count[0];
  it->compiles = r->count[1];
  cdone++;
  ccompiled += r->count[1];
  if (r->status) {
    cfailed++;
    it->message = xstrdup(msg);
    printf("[compile %zu/%zu] %s  FAILED: %s\n", cdone, ncitems, it->line, msg);
  } else if (!opt.quiet) {
    printf("[compile %zu/%zu] %s  %d kernel%s, %d compiled  %.2f s\n", cdone, ncitems, it->line, r->count[0],
           r->count[0] == 1 ? "" : "s", r->count[1], r->seconds);
  }
  fflush(stdout);
  progress_show(&bar, cdone, "compiling");
}

/* The distinct kernel sets of every configuration, one compile item each. */
static void collect_compile_items(void) {
  strlist seen = {0};
  for (size_t i = 0; i < ncfgs; i++) {
    config *c = &cfgs[i];
    if (c->failed) continue;
    for (int k = 0; k < c->nv; k++) {
      tune_variant *v = &c->v[k];
      if (!v->keys || v->same_as >= 0 || strlist_has(&seen, v->keys)) continue;
      strlist_push(&seen, xstrdup(v->keys));
      citems = xrealloc(citems, (ncitems + 1) * sizeof *citems);
      compile_item *it = &citems[ncitems++];
      memset(it, 0, sizeof *it);
      it->line = *v->settings ? xasprintf("%s %s", c->kernel_line, v->settings) : xstrdup(c->kernel_line);
      it->config = i;
      it->variant = k;
    }
    if (c->input_keys && !strlist_has(&seen, c->input_keys)) {
      strlist_push(&seen, xstrdup(c->input_keys));
      citems = xrealloc(citems, (ncitems + 1) * sizeof *citems);
      compile_item *it = &citems[ncitems++];
      memset(it, 0, sizeof *it);
      it->line = xstrdup(c->input_line);
      it->config = i;
      it->variant = -1; /* the inputs' forward: the timing process would compile it otherwise */
    }
  }
  strlist_free(&seen);
}

/* Variants whose kernels failed to compile fail (a default that failed fails its configuration). */
static void apply_compile_failures(void) {
  for (size_t n = 0; n < ncitems; n++) {
    if (!citems[n].status || citems[n].variant < 0) continue; /* a failed input forward fails at setup */
    const char *keys = cfgs[citems[n].config].v[citems[n].variant].keys;
    for (size_t i = 0; i < ncfgs; i++)
      for (int k = 0; k < cfgs[i].nv; k++) {
        tune_variant *v = &cfgs[i].v[k];
        if (!v->keys || strcmp(v->keys, keys) || v->state == V_DONE) continue;
        v->state = V_DONE;
        v->result = RLK_TUNE_FAILED;
        v->note = xasprintf("does not compile: %s", citems[n].message ? citems[n].message : "");
        if (k == 0 && !cfgs[i].failed) {
          cfgs[i].failed = 1;
          cfgs[i].error = xasprintf("the default does not compile: %s", citems[n].message ? citems[n].message : "");
        }
      }
  }
}

/* ---- the timing process --------------------------------------------------------------- */

/* What the timing process says; TM_PROGRESS only shows that the device is making progress (the
 * parent's --timeout counts from the last message of any kind). */
enum { TM_SETUP = 1, TM_START = 2, TM_RESULT = 3, TM_CONFIG_FAILED = 4, TM_PROGRESS = 5 };

typedef struct tmsg {
  int32_t type;
  int32_t config, variant;
  int32_t result;
  double median_ms, min_ms, max_ms, max_err;
  uint32_t msglen;
} tmsg;

static int send_msg(int fd, int type, size_t c, int k, int result, const double *t, double err, const char *msg) {
  tmsg m;
  memset(&m, 0, sizeof m);
  m.type = type;
  m.config = (int32_t)c;
  m.variant = k;
  m.result = result;
  if (t) {
    m.median_ms = t[0];
    m.min_ms = t[1];
    m.max_ms = t[2];
  }
  m.max_err = err;
  m.msglen = msg ? (uint32_t)strlen(msg) : 0;
  return write_all(fd, &m, sizeof m) || (m.msglen && write_all(fd, msg, m.msglen)) ? -1 : 0;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median, min and max of n samples (sorted in place). */
static void summarize(double *samples, long n, double *t) {
  qsort(samples, (size_t)n, sizeof *samples, cmp_double);
  t[0] = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  t[1] = samples[0];
  t[2] = samples[n - 1];
}

/* The timing round of the variants that passed their check: --warmup rounds, then --iters
 * rounds, each calling every variant once (input sets rotated) between its own events, so that
 * clock or thermal drift over the round touches every variant alike; round i starts at variant
 * i. t[3 * j] = {median, min, max} of run[j]. */
static rlk_status time_round(rlk_context *ctx, void *b, const config *c, const int *run, int nrun, double *t, int fd,
                             char *why, size_t whysize) {
  const long iters = opt.iters;
  const int nsets = c->op->nsets(b);
  rlk_event **ev = xrealloc(NULL, (size_t)nrun * 2 * (size_t)iters * sizeof *ev);
  double *samples = xrealloc(NULL, (size_t)iters * sizeof *samples);
  long made = 0;
  rlk_status st = RLK_OK;
  for (; made < (long)nrun * 2 * iters && !st; made++) st = rlk_event_create(ctx, &ev[made]);
  if (st) {
    made--;
    snprintf(why, whysize, "creating events: %s: %s", rlk_status_string(st), rlk_last_error());
  }
  int s = 0;
  for (long i = 0; !st && i < opt.warmup; i++)
    for (int j = 0; j < nrun && !st; j++, s = (s + 1) % nsets)
      if ((st = c->op->call(b, s, c->v[run[j]].settings)))
        snprintf(why, whysize, "a warm-up call of %s: %s", run[j] ? c->v[run[j]].settings : "the default",
                 rlk_last_error());
  for (long i = 0; !st && i < iters; i++) {
    if (i % 16 == 0) send_msg(fd, TM_PROGRESS, 0, 0, 0, NULL, 0, NULL); /* the launches go on */
    /* round i starts at variant i: each one follows every other equally often, so that one
     * whose power draw differs much (and the clocks after it) favours none of them */
    for (int jj = 0; jj < nrun && !st; jj++, s = (s + 1) % nsets) {
      const int j = (int)((i + jj) % nrun);
      rlk_event **e = &ev[((size_t)j * (size_t)iters + (size_t)i) * 2];
      st = rlk_event_record(e[0], NULL);
      if (!st) st = c->op->call(b, s, c->v[run[j]].settings);
      if (!st) st = rlk_event_record(e[1], NULL);
      if (st)
        snprintf(why, whysize, "a timed call of %s: %s", run[j] ? c->v[run[j]].settings : "the default",
                 rlk_last_error());
    }
  }
  for (int j = 0; j < nrun && !st; j++) {
    send_msg(fd, TM_PROGRESS, 0, 0, 0, NULL, 0, NULL); /* the device got this far */
    for (long i = 0; i < iters && !st; i++) {
      rlk_event **e = &ev[((size_t)j * (size_t)iters + (size_t)i) * 2];
      float ms = 0;
      if ((st = rlk_event_elapsed_ms(e[0], e[1], &ms)))
        snprintf(why, whysize, "reading the events (the calls' completion): %s", rlk_last_error());
      samples[i] = ms;
    }
    if (!st) summarize(samples, iters, &t[3 * j]);
  }
  if (!st) /* events are destroyed only while the context is sound */
    for (long i = 0; i < made; i++) rlk_event_destroy(ev[i]);
  free(ev);
  free(samples);
  return st;
}

/* Times one configuration's undone variants: the default's outputs as the reference, one checked
 * call per candidate (a failure ends the process: 3), then one timing round of all that passed.
 * Returns 0 to go on, 3 when the context may be unusable. */
static int time_config(rlk_context *ctx, size_t ci, int fd) {
  config *c = &cfgs[ci];
  const tune_op *op = c->op;
  char why[2048] = "";
  send_msg(fd, TM_SETUP, ci, 0, 0, NULL, 0, NULL);
  void *b = NULL;
  rlk_status st = op->setup(ctx, c->prob, opt.seed + 0x9e3779b97f4a7c15ull * (ci + 1), (double)opt.l2_mb * 1048576.0,
                            &b, why, sizeof why);
  if (st) {
    send_msg(fd, TM_CONFIG_FAILED, ci, 0, 0, NULL, 0, why);
    op->destroy(b);
    return st == RLK_ERR_OUT_OF_MEMORY || st == RLK_ERR_INVALID_ARGUMENT ? 0 : 3;
  }
  /* the reference: the default's outputs */
  if ((st = op->checked_call(b, "", 1, why, sizeof why))) {
    send_msg(fd, TM_CONFIG_FAILED, ci, 0, 0, NULL, 0, why);
    op->destroy(b);
    return 3;
  }
  int *run = xrealloc(NULL, (size_t)c->nv * sizeof *run);
  double *err = xrealloc(NULL, (size_t)c->nv * sizeof *err);
  int nrun = 0;
  for (int k = 0; k < c->nv; k++) {
    tune_variant *v = &c->v[k];
    if (v->state == V_DONE || (v->same_as >= 0 && !opt.time_duplicates)) continue;
    double e = 0;
    if (k > 0) {
      send_msg(fd, TM_START, ci, k, 0, NULL, 0, NULL);
      if ((st = op->checked_call(b, v->settings, 0, why, sizeof why))) {
        send_msg(fd, TM_RESULT, ci, k, RLK_TUNE_FAILED, NULL, 0, why);
        op->destroy(b);
        free(run);
        free(err);
        return 3;
      }
      char where[256] = "";
      e = op->check(b, where, sizeof where);
      if (!(e <= 1.0)) {
        snprintf(why, sizeof why, "its outputs disagree with the default's: %s (%.3g x the tolerance)", where, e);
        send_msg(fd, TM_RESULT, ci, k, RLK_TUNE_REJECTED, NULL, e, why);
        continue;
      }
    }
    err[nrun] = e;
    run[nrun++] = k;
  }
  /* the timing round: a failure there is the configuration's (variant -1) */
  send_msg(fd, TM_START, ci, -1, 0, NULL, 0, NULL);
  double *t = xrealloc(NULL, (size_t)(nrun ? nrun : 1) * 3 * sizeof *t);
  st = time_round(ctx, b, c, run, nrun, t, fd, why, sizeof why);
  if (st) {
    send_msg(fd, TM_CONFIG_FAILED, ci, 0, 0, NULL, 0, why);
  } else {
    char note[96];
    const int nsets = op->nsets(b);
    snprintf(note, sizeof note, "%d input set%s, timed in rounds with %d variant%s", nsets, nsets == 1 ? "" : "s",
             nrun, nrun == 1 ? "" : "s");
    for (int j = 0; j < nrun; j++) send_msg(fd, TM_RESULT, ci, run[j], RLK_TUNE_TIMED, &t[3 * j], err[j], note);
  }
  op->destroy(b);
  free(run);
  free(err);
  free(t);
  return st ? 3 : 0;
}

/* The timing process: a device context of its own, every configuration not finished yet. */
static void timing_main(int fd, void *arg) {
  (void)arg;
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = run_backend;
  o.device = (int)opt.device;
  rlk_context *ctx = NULL;
  rlk_status st = rlk_context_create(&ctx, &o);
  if (st) {
    char why[1200];
    snprintf(why, sizeof why, "opening the device for timing: %s", rlk_last_error());
    for (size_t i = 0; i < ncfgs; i++)
      if (!cfgs[i].finished && !cfgs[i].failed) send_msg(fd, TM_CONFIG_FAILED, i, 0, 0, NULL, 0, why);
    _exit(0);
  }
  int rc = 0;
  for (size_t i = 0; i < ncfgs && !rc; i++)
    if (!cfgs[i].finished && !cfgs[i].failed) rc = time_config(ctx, i, fd);
  /* after a failure the context may be poisoned: leave without touching it again */
  if (rc) _exit(rc);
  rlk_context_destroy(ctx);
  _exit(0);
}

/* ---- results -------------------------------------------------------------------------- */

static int record_failures;

/* A variant is done: its result, times and largest error. */
static void variant_done(tune_variant *v, rlk_tune_result result, double median_ms, double min_ms, double max_ms,
                         double max_err) {
  v->state = V_DONE;
  v->result = result;
  v->median_ms = median_ms;
  v->min_ms = min_ms;
  v->max_ms = max_ms;
  v->max_err = max_err;
}

/* Copies the results of a variant's kernel twin. */
static void settle_duplicates(config *c) {
  for (int k = 1; k < c->nv; k++) {
    tune_variant *v = &c->v[k];
    if (v->same_as < 0 || v->state == V_DONE) continue;
    const tune_variant *o = &c->v[v->same_as];
    variant_done(v, o->result, o->median_ms, o->min_ms, o->max_ms, o->max_err);
    v->note = xasprintf("the same kernels as %s", v->same_as ? c->v[v->same_as].settings : "the default");
  }
}

/* A configuration is finished: its winner, its record, its line. */
static void finish_config(size_t ci) {
  config *c = &cfgs[ci];
  if (c->finished) return;
  c->finished = 1;
  settle_duplicates(c);
  if (!c->failed && c->v[0].result != RLK_TUNE_TIMED) {
    c->failed = 1;
    if (!c->error) c->error = xasprintf("the default was not timed: %s", c->v[0].note ? c->v[0].note : "");
  }
  size_t done = 0;
  for (size_t i = 0; i < ncfgs; i++) done += cfgs[i].finished;
  progress_clear(&bar);
  if (c->failed) {
    printf("[%zu/%zu] %s  FAILED: %s\n", done, ncfgs, c->line, c->error ? c->error : "");
    fflush(stdout);
    record_failures++;
    progress_show(&bar, done, "timing");
    return;
  }
  c->default_ms = c->v[0].median_ms;
  c->winner = 0;
  double best = c->default_ms;
  for (int k = 1; k < c->nv; k++) {
    const tune_variant *v = &c->v[k];
    if (v->same_as >= 0 || v->result != RLK_TUNE_TIMED) continue;
    /* the fastest call too: where the clocks switch between two states during the rounds, the
     * medians can differ by the share of fast-state calls alone (seen on an H200: a candidate
     * 10% ahead by median, every variant's fastest call the same) */
    const double keep = 1.0 - opt.min_gain / 100.0;
    if (v->median_ms < best && v->median_ms < c->default_ms * keep && v->min_ms < c->v[0].min_ms * keep) {
      best = v->median_ms;
      c->winner = k;
    }
  }
  c->best_ms = best;
  int timed = 0, same = 0, rejected = 0, failed = 0;
  for (int k = 1; k < c->nv; k++) {
    const tune_variant *v = &c->v[k];
    if (v->same_as >= 0 && !opt.time_duplicates) same++;
    else if (v->result == RLK_TUNE_TIMED) timed++;
    else if (v->result == RLK_TUNE_REJECTED) rejected++;
    else failed++;
  }
  rlk_tune_record r = c->key;
  rlk_tune_record_set_env(&r, &info);
  snprintf(r.winner, sizeof r.winner, "%s", c->v[c->winner].settings);
  r.default_ms = c->default_ms;
  r.best_ms = c->best_ms;
  r.created = (int64_t)time(NULL);
  r.ntimings = 0;
  for (int k = 1; k < c->nv && r.ntimings < RLK_TUNE_MAX_TIMINGS; k++) {
    rlk_tune_timing *t = &r.timings[r.ntimings++];
    snprintf(t->settings, sizeof t->settings, "%s", c->v[k].settings);
    t->result = c->v[k].result;
    t->median_ms = c->v[k].result == RLK_TUNE_TIMED ? c->v[k].median_ms : 0;
  }
  rlk_status st = rlk_tune_db_record(db_path, &r, 1);
  c->recorded = st == RLK_OK;
  printf("[%zu/%zu] %s: default %.4f ms, best %.4f ms (%s), x%.3f; %d timed, %d same kernels, %d rejected, "
         "%d failed%s\n",
         done, ncfgs, c->line, c->default_ms, c->best_ms, c->winner ? c->v[c->winner].settings : "the default",
         c->best_ms > 0 ? c->default_ms / c->best_ms : 1.0, timed, same, rejected, failed,
         st ? "; NOT RECORDED" : "");
  for (int k = 1; k < c->nv; k++)
    if (c->v[k].result != RLK_TUNE_TIMED && (c->v[k].same_as < 0 || opt.time_duplicates))
      printf("    %s %s: %s\n", c->v[k].settings, c->v[k].result == RLK_TUNE_REJECTED ? "rejected" : "failed",
             c->v[k].note ? c->v[k].note : "");
  fflush(stdout);
  if (st) {
    lib_error("recording the result", st);
    record_failures++;
  }
  progress_show(&bar, done, "timing");
}

/* Finishes every configuration whose variants are all done. */
static void finish_ready(void) {
  for (size_t i = 0; i < ncfgs; i++) {
    config *c = &cfgs[i];
    if (c->finished) continue;
    int ready = c->failed;
    if (!ready) {
      ready = 1;
      for (int k = 0; k < c->nv && ready; k++)
        ready = c->v[k].state == V_DONE || (c->v[k].same_as >= 0 && !opt.time_duplicates);
    }
    if (ready) finish_config(i);
  }
}

static void fail_variant(size_t ci, int k, const char *why) {
  config *c = &cfgs[ci];
  tune_variant *v = &c->v[k];
  if (v->state == V_DONE) return;
  v->state = V_DONE;
  v->result = RLK_TUNE_FAILED;
  free(v->note);
  v->note = xstrdup(why);
  if (k == 0 && !c->failed) {
    c->failed = 1;
    c->error = xasprintf("the default failed: %s", why);
  }
}

/* A candidate whose call failed on the device (a fault there poisons the context, and each one
 * costs a new timing process) is not run again in this run: its later configurations record it
 * as failed with the first failure's reason. */
static void fail_candidate_everywhere(size_t ci, int k, const char *why) {
  if (k <= 0) return;
  for (size_t i = ci + 1; i < ncfgs; i++) {
    config *c = &cfgs[i];
    if (c->finished || c->failed || k >= c->nv || c->v[k].state == V_DONE) continue;
    if (strcmp(c->v[k].settings, cfgs[ci].v[k].settings)) continue;
    if (c->v[k].same_as >= 0 && !opt.time_duplicates) continue; /* not run anyway */
    char *note = xasprintf("not run: it failed in %s: %s", cfgs[ci].line, why);
    fail_variant(i, k, note);
    free(note);
  }
}

static void on_message(const tmsg *m, const char *text, long *setup, long *inflight_c, int *inflight_v) {
  if (m->type == TM_PROGRESS || m->config < 0 || (size_t)m->config >= ncfgs) return;
  config *c = &cfgs[m->config];
  switch (m->type) {
  case TM_SETUP:
    *setup = m->config;
    *inflight_c = -1;
    break;
  case TM_START: /* variant -1: the configuration's timing round */
    *setup = -1;
    *inflight_c = m->config;
    *inflight_v = m->variant;
    break;
  case TM_CONFIG_FAILED:
    *setup = -1;
    *inflight_c = -1;
    if (!c->failed) {
      c->failed = 1;
      c->error = xstrdup(text);
    }
    break;
  case TM_RESULT:
    if (m->variant < 0 || m->variant >= c->nv) return;
    *inflight_c = -1;
    if (m->result == RLK_TUNE_FAILED) {
      fail_variant((size_t)m->config, m->variant, text);
      fail_candidate_everywhere((size_t)m->config, m->variant, text);
    } else {
      tune_variant *v = &c->v[m->variant];
      variant_done(v, (rlk_tune_result)m->result, m->median_ms, m->min_ms, m->max_ms, m->max_err);
      free(v->note);
      v->note = xstrdup(text);
    }
    break;
  default:
    break;
  }
  finish_ready();
}

static int work_left(void) {
  for (size_t i = 0; i < ncfgs; i++)
    if (!cfgs[i].finished && !cfgs[i].failed) return 1;
  return 0;
}

/* Runs timing processes until every configuration is finished, restarting after failures. */
static void run_timing(void) {
  int restarts = 0;
  while (work_left()) {
    int fd = -1;
    pid_t pid = pool_spawn(&fd, timing_main, NULL);
    if (pid < 0) break;
    long setup = -1, inflight_c = -1;
    int inflight_v = -1, killed = 0;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    double last = now_s();
    for (;;) {
      struct pollfd pfd = {fd, POLLIN, 0};
      int k = poll(&pfd, 1, 1000);
      if (k < 0 && errno == EINTR) continue;
      if (k == 0) {
        if (now_s() - last > (double)opt.timeout) {
          kill(pid, SIGKILL);
          killed = 1;
          break;
        }
        continue;
      }
      if (cap - len < 65536) {
        cap = cap ? cap * 2 : 131072;
        buf = xrealloc(buf, cap);
      }
      ssize_t got = read(fd, buf + len, cap - len);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      len += (size_t)got;
      last = now_s();
      size_t off = 0;
      for (;;) {
        tmsg m;
        if (len - off < sizeof m) break;
        memcpy(&m, buf + off, sizeof m);
        if (m.msglen > 65536) m.msglen = 0;
        if (len - off < sizeof m + m.msglen) break;
        char *text = xrealloc(NULL, m.msglen + 1);
        memcpy(text, buf + off + sizeof m, m.msglen);
        text[m.msglen] = '\0';
        on_message(&m, text, &setup, &inflight_c, &inflight_v);
        free(text);
        off += sizeof m + m.msglen;
      }
      memmove(buf, buf + off, len - off);
      len -= off;
    }
    close(fd);
    free(buf);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    char why[256];
    if (killed)
      snprintf(why, sizeof why, "no progress for %ld s: the timing process was killed (--timeout)", opt.timeout);
    else if (WIFSIGNALED(ws))
      snprintf(why, sizeof why, "the timing process was killed by signal %d", WTERMSIG(ws));
    else
      snprintf(why, sizeof why, "the timing process exited with status %d (a failed call may leave the device "
               "context unusable, so a new process takes over)", WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    if (inflight_c >= 0 && inflight_v < 0 && !cfgs[inflight_c].failed) {
      cfgs[inflight_c].failed = 1;
      cfgs[inflight_c].error = xasprintf("its timing round: %s", why);
    } else if (inflight_c >= 0) {
      fail_variant((size_t)inflight_c, inflight_v, why);
      fail_candidate_everywhere((size_t)inflight_c, inflight_v, why);
    }
    if (setup >= 0 && !cfgs[setup].failed) {
      cfgs[setup].failed = 1;
      cfgs[setup].error = xasprintf("preparing its inputs and the default's outputs: %s", why);
    }
    finish_ready();
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0 && !killed && work_left()) {
      /* a clean exit with work left: nothing more can be done (every configuration was tried) */
      for (size_t i = 0; i < ncfgs; i++)
        if (!cfgs[i].finished && !cfgs[i].failed) {
          cfgs[i].failed = 1;
          cfgs[i].error = xstrdup("the timing process ended without timing it");
        }
      finish_ready();
      break;
    }
    if (work_left() && ++restarts > MAX_RESTARTS) {
      for (size_t i = 0; i < ncfgs; i++)
        if (!cfgs[i].finished && !cfgs[i].failed) {
          cfgs[i].failed = 1;
          cfgs[i].error = xasprintf("not timed: %d timing processes failed", MAX_RESTARTS);
        }
      finish_ready();
      break;
    }
  }
}

/* ---- output ------------------------------------------------------------------------- */

static const char *result_name(const tune_variant *v) {
  if (v->same_as >= 0 && !opt.time_duplicates) return "same";
  return v->result == RLK_TUNE_TIMED ? "timed" : v->result == RLK_TUNE_REJECTED ? "rejected" : "failed";
}

static int write_json(const char *path) {
  FILE *f = tool_json_begin(path, &info);
  if (!f) return 1;
  fprintf(f, "  \"multiprocessors\": %d, \"db\": ", info.multiprocessors);
  json_string(f, db_path);
  fprintf(f, ", \"warmup\": %ld, \"iters\": %ld", opt.warmup, opt.iters);
  json_number_member(f, "min_gain_pct", "%g", opt.min_gain);
  fprintf(f, ", \"seed\": %" PRIu64 ",\n  \"configs\": [\n", opt.seed);
  for (size_t i = 0; i < ncfgs; i++) {
    const config *c = &cfgs[i];
    fprintf(f, "    {\"line\": ");
    json_string(f, c->line);
    fprintf(f, ", \"op\": ");
    json_string(f, c->key.op);
    fprintf(f, ", \"shape\": ");
    json_string(f, c->key.shape);
    fprintf(f, ", \"tokens\": %" PRId64 ", \"rows\": %" PRId64 ", \"status\": \"%s\"", c->key.tokens, c->tokens,
            c->failed ? "failed" : "ok");
    if (c->failed) {
      fprintf(f, ", \"error\": ");
      json_string(f, c->error);
    } else {
      json_number_member(f, "default_ms", "%.6f", c->default_ms);
      json_number_member(f, "best_ms", "%.6f", c->best_ms);
      json_number_member(f, "speedup", "%.4f", c->best_ms > 0 ? c->default_ms / c->best_ms : 1.0);
      fprintf(f, ", \"winner\": ");
      json_string(f, c->v[c->winner].settings);
      fprintf(f, ", \"recorded\": %s", c->recorded ? "true" : "false");
    }
    fprintf(f, ",\n     \"candidates\": [\n");
    for (int k = 0; k < c->nv; k++) {
      const tune_variant *v = &c->v[k];
      fprintf(f, "       {\"settings\": ");
      json_string(f, k ? v->settings : "default");
      fprintf(f, ", \"result\": \"%s\"", result_name(v));
      if (v->same_as >= 0) {
        fprintf(f, ", \"same_kernels_as\": ");
        json_string(f, v->same_as ? c->v[v->same_as].settings : "default");
      }
      if (v->result == RLK_TUNE_TIMED && v->state == V_DONE) {
        json_number_member(f, "median_ms", "%.6f", v->median_ms);
        json_number_member(f, "min_ms", "%.6f", v->min_ms);
        json_number_member(f, "max_ms", "%.6f", v->max_ms);
      }
      if (k && v->result != RLK_TUNE_FAILED && v->state == V_DONE) json_number_member(f, "max_error", "%.4g", v->max_err);
      fprintf(f, ", \"note\": ");
      json_string(f, v->note);
      fprintf(f, "}%s\n", k + 1 < c->nv ? "," : "");
    }
    fprintf(f, "     ]}%s\n", i + 1 < ncfgs ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  return close_written(f, path);
}

static void print_table(void) {
  int w = 6;
  for (size_t i = 0; i < ncfgs; i++) {
    int n = (int)strlen(cfgs[i].key.shape) + 2 + snprintf(NULL, 0, "N=%" PRId64, cfgs[i].tokens);
    if (n > w) w = n;
  }
  printf("\n%-*s  %10s  %10s  %7s  %s\n", w, "config", "default ms", "best ms", "speedup", "winner");
  for (size_t i = 0; i < ncfgs; i++) {
    const config *c = &cfgs[i];
    char name[400];
    snprintf(name, sizeof name, "%s  N=%" PRId64, c->key.shape, c->tokens);
    if (c->failed)
      printf("%-*s  %10s  %10s  %7s  FAILED: %s\n", w, name, "-", "-", "-", c->error ? c->error : "");
    else
      printf("%-*s  %10.4f  %10.4f  %7.3f  %s\n", w, name, c->default_ms, c->best_ms,
             c->best_ms > 0 ? c->default_ms / c->best_ms : 1.0, c->winner ? c->v[c->winner].settings : "(default)");
  }
  fflush(stdout);
}

static void print_dry_run(void) {
  size_t distinct = 0, timed = 0;
  strlist keys = {0};
  for (size_t i = 0; i < ncfgs; i++) {
    const config *c = &cfgs[i];
    printf("[%zu/%zu] %s  (bucket %" PRId64 ")%s%s\n", i + 1, ncfgs, c->line, c->key.tokens, c->failed ? "  FAILS: " : "",
           c->failed ? c->error : "");
    for (int k = 0; k < c->nv; k++) {
      const tune_variant *v = &c->v[k];
      const char *name = k ? v->settings : "default";
      if (v->state == V_DONE)
        printf("    %-44s %s\n", name, v->note ? v->note : "fails");
      else if (v->same_as >= 0)
        printf("    %-44s same kernels as %s\n", name, v->same_as ? c->v[v->same_as].settings : "the default");
      else {
        int n = 1;
        for (const char *q = v->keys; (q = strchr(q, ' ')); q++) n++;
        printf("    %-44s %d kernel%s, timed\n", name, n, n == 1 ? "" : "s");
        timed++;
        strlist words = {0};
        split_words(v->keys, 0, &words);
        for (size_t j = 0; j < words.n; j++)
          if (!strlist_has(&keys, words.v[j])) strlist_push(&keys, xstrdup(words.v[j]));
        strlist_free(&words);
      }
    }
    if (c->input_line) printf("    (and the forward that makes its inputs: %s)\n", c->input_line);
  }
  for (size_t i = 0; i < ncfgs; i++) {
    if (!cfgs[i].input_keys || cfgs[i].failed) continue;
    if (!strlist_has(&keys, cfgs[i].input_keys)) strlist_push(&keys, xstrdup(cfgs[i].input_keys));
  }
  distinct = keys.n;
  strlist_free(&keys);
  printf("dry run: %zu configuration%s on %s (%s, %s); %zu variants to time, %zu compile item%s, %zu distinct "
         "kernel%s; database %s; nothing compiled, timed or written\n",
         ncfgs, ncfgs == 1 ? "" : "s", info.name, info.target, info.compiler, timed, ncitems, ncitems == 1 ? "" : "s",
         distinct, distinct == 1 ? "" : "s", db_path);
}

/* ---- --list and --merge --------------------------------------------------------------- */

static int list_record(const rlk_tune_record *r, void *user) {
  strlist *rows = user;
  strlist_push(rows, xasprintf("%s\t%s\t%" PRId64 "\t%s\t%s\t%d\t%.4f\t%.4f\tx%.3f\t%s", r->op, r->shape, r->tokens,
                               r->target, r->device, r->multiprocessors, r->default_ms, r->best_ms,
                               r->best_ms > 0 ? r->default_ms / r->best_ms : 1.0, r->winner[0] ? r->winner : "(default)"));
  return 0;
}

/* The records as a table, each column as wide as its widest cell. */
static int list_db(void) {
  strlist rows = {0};
  strlist_push(&rows, xstrdup("op\tshape\ttokens\ttarget\tdevice\tsms\tdefault ms\tbest ms\tspeedup\twinner"));
  size_t bad = 0;
  rlk_status st = rlk_tune_db_walk(db_path, list_record, &rows, &bad);
  if (st) {
    strlist_free(&rows);
    return lib_error("reading the tuning database", st);
  }
  enum { COLS = 10 };
  int width[COLS] = {0};
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < rows.n; i++) {
      strlist cells = {0};
      const char *p = rows.v[i];
      for (const char *tab; (tab = strchr(p, '\t')); p = tab + 1) {
        char *cell = xrealloc(NULL, (size_t)(tab - p) + 1);
        memcpy(cell, p, (size_t)(tab - p));
        cell[tab - p] = '\0';
        strlist_push(&cells, cell);
      }
      strlist_push(&cells, xstrdup(p));
      for (size_t k = 0; k < cells.n && k < COLS; k++) {
        const int w = (int)strlen(cells.v[k]);
        if (pass == 0 && w > width[k]) width[k] = w;
        if (pass == 1) printf("%-*s%s", k + 1 < cells.n ? width[k] : 0, cells.v[k], k + 1 < cells.n ? "  " : "\n");
      }
      strlist_free(&cells);
    }
  printf("%zu record%s in %s\n", rows.n - 1, rows.n == 2 ? "" : "s", db_path);
  strlist_free(&rows);
  return bad ? 1 : 0;
}

/* ---- --merge under --dry-run: what it would take, nothing written ---------------------- */

typedef struct record_list {
  rlk_tune_record *v;
  size_t n, cap;
} record_list;

static int push_record(const rlk_tune_record *r, void *user) {
  record_list *l = user;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    l->v = xrealloc(l->v, l->cap * sizeof *l->v);
  }
  l->v[l->n++] = *r;
  return 0;
}

static int same_key(const rlk_tune_record *a, const rlk_tune_record *b) {
  return a->tokens == b->tokens && a->multiprocessors == b->multiprocessors && !strcmp(a->op, b->op) &&
         !strcmp(a->shape, b->shape) && !strcmp(a->target, b->target) && !strcmp(a->device, b->device) &&
         !strcmp(a->runtime, b->runtime) && !strcmp(a->compiler, b->compiler);
}

/* The index of the record of r's key in l: its last line's, the one a reader takes; l->n when
 * there is none. */
static size_t find_key(const record_list *l, const rlk_tune_record *r) {
  for (size_t i = l->n; i-- > 0;)
    if (same_key(&l->v[i], r)) return i;
  return l->n;
}

/* Applies to `db` (the database's records, in memory) what rlk_tune_db_merge would do with the
 * file `from`: a key's record is taken when db has none or one created no later. Counts them in
 * *taken. 0, or 1 with a message when `from` is missing or not a tuning database (as a merge
 * would fail). */
static int preview_merge(record_list *db, const char *from, size_t *taken) {
  *taken = 0;
  if (access(from, F_OK) != 0) {
    fprintf(stderr, "%s: merging %s: %s\n", prog, from, strerror(errno));
    return 1;
  }
  record_list src = {0};
  size_t bad = 0;
  rlk_status st = rlk_tune_db_walk(from, push_record, &src, &bad);
  int rc = 0;
  if (st) {
    rc = lib_error("reading the database to merge", st);
  } else if (bad && src.n == 0) {
    fprintf(stderr, "%s: merging %s: not a tuning database (%zu line%s skipped, no record read)\n", prog, from,
            bad, bad == 1 ? "" : "s");
    rc = 1;
  }
  for (size_t i = 0; !rc && i < src.n; i++) {
    if (find_key(&src, &src.v[i]) != i) continue; /* a later line of the key is its record */
    const size_t j = find_key(db, &src.v[i]);
    if (j == db->n) {
      push_record(&src.v[i], db);
      (*taken)++;
    } else if (src.v[i].created >= db->v[j].created) {
      db->v[j] = src.v[i];
      (*taken)++;
    }
  }
  free(src.v);
  return rc;
}

/* --merge: each file into the database, in order; under --dry-run only what each would take. */
static int merge_all(void) {
  record_list db = {0};
  rlk_status st;
  if (opt.dry_run && (st = rlk_tune_db_walk(db_path, push_record, &db, NULL))) {
    free(db.v);
    return lib_error("reading the tuning database", st);
  }
  int rc = 0;
  for (size_t i = 0; !rc && i < opt.merges.n; i++) {
    size_t taken = 0;
    if (opt.dry_run) {
      if ((rc = preview_merge(&db, opt.merges.v[i], &taken))) break;
      printf("dry run: merging %s into %s would take %zu record%s; nothing written\n", opt.merges.v[i], db_path,
             taken, taken == 1 ? "" : "s");
    } else {
      if ((st = rlk_tune_db_merge(db_path, opt.merges.v[i], &taken))) {
        rc = lib_error("merging", st);
        break;
      }
      printf("merged %s into %s: %zu record%s taken\n", opt.merges.v[i], db_path, taken, taken == 1 ? "" : "s");
    }
  }
  free(db.v);
  return rc;
}

/* ---- main ----------------------------------------------------------------------------- */

static int pending_visit(const rlk_tune_record *r, void *user) {
  strlist *lines = user;
  rlk_tune_record env;
  rlk_tune_record_init(&env);
  rlk_tune_record_set_env(&env, &info);
  if (strcmp(r->target, env.target) || strcmp(r->device, env.device) || r->multiprocessors != env.multiprocessors ||
      strcmp(r->runtime, env.runtime) || strcmp(r->compiler, env.compiler)) {
    printf("pending, for another environment (%s, %s, %d SMs, rlk %s, %s): %s %s tokens=%" PRId64 "\n", r->target,
           r->device, r->multiprocessors, r->runtime, r->compiler, r->op, r->shape, r->tokens);
    return 0;
  }
  strlist_push(lines, xasprintf("%s %s tokens=%" PRId64, r->op, r->shape, r->tokens));
  return 0;
}

static strlist excluded_told; /* "op candidate" lines printed */

/* The candidates op declares, less those --exclude names (each printed once). */
static void op_candidates(const char *op, strlist *out) {
  strlist *told = &excluded_told;
  const char *src = rlk_tune_candidates(op);
  for (const char *p = src; *p;) {
    const size_t n = strcspn(p, "\n");
    char *c = xrealloc(NULL, n + 1);
    memcpy(c, p, n);
    c[n] = '\0';
    p += n + (p[n] == '\n');
    int excluded = 0;
    for (size_t k = 0; k < opt.excludes.n && !excluded; k++) excluded = strstr(c, opt.excludes.v[k]) != NULL;
    if (!excluded) {
      strlist_push(out, c);
      continue;
    }
    char *note = xasprintf("%s %s", op, c);
    if (!strlist_has(told, note)) {
      printf("candidate excluded: %s\n", note);
      strlist_push(told, note);
    } else {
      free(note);
    }
    free(c);
  }
}

/* Turns the expanded lines into configurations; 0, or 2 on a line that is not a key. */
static int build_configs(const strlist *lines) {
  cfgs = xrealloc(NULL, (lines->n ? lines->n : 1) * sizeof *cfgs);
  for (size_t i = 0; i < lines->n; i++) {
    config c;
    memset(&c, 0, sizeof c);
    rlk_tune_record_init(&c.key);
    rlk_status st = rlk_tune_record_set_key(&c.key, lines->v[i]);
    if (st) return usage_error("'%s': %s", lines->v[i], rlk_last_error());
    int dup = 0;
    for (size_t j = 0; j < ncfgs && !dup; j++)
      dup = cfgs[j].key.tokens == c.key.tokens && !strcmp(cfgs[j].key.op, c.key.op) &&
            !strcmp(cfgs[j].key.shape, c.key.shape);
    if (dup) continue; /* the same key (e.g. N in one bucket): the first line stands */
    if (!(c.op = tune_op_named(c.key.op)))
      return usage_error("'%s': rlk-tune has no inputs for %s", lines->v[i], c.key.op);
    char n[32], why[512];
    setting_of(lines->v[i], "tokens", n, sizeof n);
    c.prob = xrealloc(NULL, c.op->problem_size);
    memset(c.prob, 0, c.op->problem_size);
    cfgs[ncfgs++] = c; /* freed with the others from here on */
    config *cp = &cfgs[ncfgs - 1];
    cp->tokens = strtoll(n, NULL, 10);
    if (c.op->problem_of(&c.key, cp->tokens, cp->prob, why, sizeof why)) return usage_error("%s", why);
    strlist cands = {0};
    op_candidates(c.key.op, &cands);
    if (cands.n >= RLK_TUNE_MAX_TIMINGS) {
      strlist_free(&cands);
      return usage_error("%s: more than %d candidates", c.key.op, RLK_TUNE_MAX_TIMINGS - 1);
    }
    cp->line = xasprintf("%s %s tokens=%s", c.key.op, c.key.shape, n);
    cp->kernel_line = xasprintf("%s %s", c.key.op, c.key.shape);
    cp->nv = 1 + (int)cands.n;
    cp->v = xrealloc(NULL, (size_t)cp->nv * sizeof *cp->v);
    memset(cp->v, 0, (size_t)cp->nv * sizeof *cp->v);
    for (int k = 0; k < cp->nv; k++) {
      cp->v[k].settings = xstrdup(k ? cands.v[k - 1] : "");
      cp->v[k].same_as = -1;
    }
    strlist_free(&cands);
  }
  return 0;
}

static void free_all(void) {
  for (size_t i = 0; i < ncfgs; i++) {
    for (int k = 0; k < cfgs[i].nv; k++) {
      free(cfgs[i].v[k].settings);
      free(cfgs[i].v[k].keys);
      free(cfgs[i].v[k].note);
    }
    free(cfgs[i].v);
    free(cfgs[i].line);
    free(cfgs[i].kernel_line);
    free(cfgs[i].input_line);
    free(cfgs[i].input_keys);
    free(cfgs[i].error);
    free(cfgs[i].prob);
  }
  free(cfgs);
  for (size_t i = 0; i < ncitems; i++) {
    free(citems[i].line);
    free(citems[i].message);
  }
  free(citems);
  strlist_free(&excluded_told);
  strlist_free(&opt.sets);
  strlist_free(&opt.config_files);
  strlist_free(&opt.sweeps);
  strlist_free(&opt.merges);
  strlist_free(&opt.excludes);
}

static int parse_args(int argc, char **argv) {
  /* the shorthands for --set NAME=LIST, in the order of `shorthands` (option values 300 + k) */
  static const char *const shorthands[] = {"vocab", "tokens", "logits", "labels", "entropy", "pass", "grad"};
  enum { OPT_SHORT = 300, OPT_TIME_DUPLICATES = 256, OPT_PENDING, OPT_LIST, OPT_LIST_CANDIDATES, OPT_OP, OPT_SET,
         OPT_CONFIG, OPT_SWEEP, OPT_MERGE, OPT_EXCLUDE, OPT_DB, OPT_JSON, OPT_TARGET, OPT_BACKEND, OPT_DEVICE,
         OPT_WARMUP, OPT_ITERS, OPT_L2_MB, OPT_TIMEOUT, OPT_MIN_GAIN, OPT_SEED };
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'},
      {"dry-run", no_argument, NULL, 'n'},
      {"quiet", no_argument, NULL, 'q'},
      {"jobs", required_argument, NULL, 'j'},
      {"time-duplicates", no_argument, NULL, OPT_TIME_DUPLICATES},
      {"pending", no_argument, NULL, OPT_PENDING},
      {"list", no_argument, NULL, OPT_LIST},
      {"list-candidates", no_argument, NULL, OPT_LIST_CANDIDATES},
      {"op", required_argument, NULL, OPT_OP},
      {"set", required_argument, NULL, OPT_SET},
      {"config", required_argument, NULL, OPT_CONFIG},
      {"sweep", required_argument, NULL, OPT_SWEEP},
      {"merge", required_argument, NULL, OPT_MERGE},
      {"exclude", required_argument, NULL, OPT_EXCLUDE},
      {"db", required_argument, NULL, OPT_DB},
      {"json", required_argument, NULL, OPT_JSON},
      {"target", required_argument, NULL, OPT_TARGET},
      {"backend", required_argument, NULL, OPT_BACKEND},
      {"device", required_argument, NULL, OPT_DEVICE},
      {"warmup", required_argument, NULL, OPT_WARMUP},
      {"iters", required_argument, NULL, OPT_ITERS},
      {"l2-mb", required_argument, NULL, OPT_L2_MB},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
      {"min-gain", required_argument, NULL, OPT_MIN_GAIN},
      {"seed", required_argument, NULL, OPT_SEED},
      {"vocab", required_argument, NULL, OPT_SHORT + 0},
      {"tokens", required_argument, NULL, OPT_SHORT + 1},
      {"dtype", required_argument, NULL, OPT_SHORT + 2},
      {"labels", required_argument, NULL, OPT_SHORT + 3},
      {"entropy", required_argument, NULL, OPT_SHORT + 4},
      {"pass", required_argument, NULL, OPT_SHORT + 5},
      {"grad", required_argument, NULL, OPT_SHORT + 6},
      {NULL, 0, NULL, 0}};
  static const tool_nonempty nonempty[] = {
      {OPT_OP, "--op needs an op name"},
      {OPT_CONFIG, "--config needs a file"},
      {OPT_MERGE, "--merge needs a database file"},
      {OPT_EXCLUDE, "--exclude needs some text"},
      {OPT_DB, "--db needs a file"},
      {OPT_JSON, "--json needs a file"},
      {OPT_TARGET, "--target needs a target (sm_90a, gfx90a)"}};
  opterr = 0;
  for (int c; (c = getopt_long(argc, argv, ":hnqj:", longopts, NULL)) != -1;) {
    const char *val = optarg;
    long x = 0;
    const int empty = empty_value_error(c, val, nonempty, sizeof nonempty / sizeof nonempty[0]);
    if (empty) return empty;
    if (c >= OPT_SHORT && c < OPT_SHORT + (int)(sizeof shorthands / sizeof shorthands[0])) {
      if (!*val) return usage_error("%s needs a comma list", argv[optind - 1]);
      strlist_push(&opt.sets, xasprintf("%s=%s", shorthands[c - OPT_SHORT], val));
      continue;
    }
    switch (c) {
      case 'h': usage(stdout); return -1;
      case 'n': opt.dry_run = 1; break;
      case 'q': opt.quiet = 1; break;
      case OPT_TIME_DUPLICATES: opt.time_duplicates = 1; break;
      case OPT_PENDING: opt.pending = 1; break;
      case OPT_LIST: opt.list = 1; break;
      case OPT_LIST_CANDIDATES: opt.list_candidates = 1; break;
      case OPT_OP: opt.op = val; break;
      case OPT_SET:
        if (!strchr(val, '=') || val[0] == '=') return usage_error("--set needs NAME=LIST");
        strlist_push(&opt.sets, xstrdup(val));
        break;
      case OPT_CONFIG: strlist_push(&opt.config_files, xstrdup(val)); break;
      case OPT_SWEEP: strlist_push(&opt.sweeps, xstrdup(val)); break;
      case OPT_MERGE: strlist_push(&opt.merges, xstrdup(val)); break;
      case OPT_EXCLUDE: strlist_push(&opt.excludes, xstrdup(val)); break;
      case OPT_DB: {
        const int rc = path_arg(db_path, sizeof db_path, "--db", val);
        if (rc) return rc;
        opt.db_arg = val;
        break;
      }
      case OPT_JSON: opt.json = val; break;
      case OPT_TARGET: opt.target = val; break;
      case OPT_BACKEND:
        if (parse_backend(val, &opt.backend)) return usage_error("--backend: '%s' is not auto, cuda, hip or host", val);
        break;
      case OPT_DEVICE:
        if (parse_int(val, 0, 1024, &opt.device)) return usage_error("--device needs an ordinal");
        break;
      case 'j':
        if (parse_int(val, 1, 1024, &opt.jobs)) return usage_error("-j needs a number of workers from 1 to 1024");
        break;
      case OPT_WARMUP:
        if (parse_int(val, 0, 100000, &opt.warmup)) return usage_error("--warmup needs a count from 0");
        break;
      case OPT_ITERS:
        if (parse_int(val, 1, 100000, &opt.iters)) return usage_error("--iters needs a count from 1");
        break;
      case OPT_L2_MB:
        if (parse_int(val, 0, 1 << 20, &opt.l2_mb)) return usage_error("--l2-mb needs megabytes");
        break;
      case OPT_TIMEOUT:
        if (parse_int(val, 1, 86400, &opt.timeout)) return usage_error("--timeout needs seconds from 1");
        break;
      case OPT_MIN_GAIN: {
        /* decimal digits and a point only: strtod would also read "" as 0 and take spaces,
         * signs, hexadecimal, inf and nan */
        char *end = NULL;
        const int decimal = val[0] && strspn(val, "0123456789.") == strlen(val) && strpbrk(val, "0123456789");
        errno = 0;
        opt.min_gain = decimal ? strtod(val, &end) : -1;
        if (!decimal || errno || *end || !(opt.min_gain >= 0 && opt.min_gain < 100))
          return usage_error("--min-gain needs a percentage in [0, 100), not '%s'", val);
        break;
      }
      case OPT_SEED:
        if (parse_int(val, 0, LONG_MAX, &x)) return usage_error("--seed needs a non-negative integer");
        opt.seed = (uint64_t)x;
        opt.seed_given = 1;
        break;
      default: return getopt_error(c, argv);
    }
  }
  if (optind < argc) return usage_error("unexpected argument '%s' (sweep lines go in --sweep)", argv[optind]);
  if (opt.sets.n && !opt.op) return usage_error("--vocab, --tokens, ... and --set need --op");
  return 0;
}

static int tool_main(int argc, char **argv) {
  int rc = parse_args(argc, argv);
  if (rc) {
    free_all();
    return rc < 0 ? 0 : rc;
  }
  if (opt.list_candidates) {
    strlist ops = {0};
    split_words(rlk_precompile_ops(), 0, &ops);
    for (size_t i = 0; i < ops.n; i++)
      if (*rlk_tune_candidates(ops.v[i])) printf("%s\n%s", ops.v[i], rlk_tune_candidates(ops.v[i]));
    strlist_free(&ops);
    free_all();
    return 0;
  }
  rlk_status st;
  if (!opt.db_arg && (st = rlk_tune_db_path(db_path, sizeof db_path))) { /* --db: parse_args copied it */
    free_all();
    return lib_error("finding the tuning database", st);
  }
  if (opt.merges.n && (rc = merge_all())) {
    free_all();
    return rc;
  }
  if (opt.list) {
    rc = list_db();
    free_all();
    return rc;
  }
  if (!opt.op && !opt.config_files.n && !opt.sweeps.n && !opt.pending) {
    const int merged = opt.merges.n > 0;
    free_all();
    if (merged) return 0;
    return usage_error("nothing to tune: give --op with its settings, --config, --sweep or --pending");
  }
  /* the tool's own calls and plans must see the guaranteed defaults, never the database */
  setenv("RLK_TUNE", "off", 1);

  /* the sweep: expanded lines, one pass each */
  strlist ops = {0}, expanded = {0}, lines = {0};
  split_words(rlk_precompile_ops(), 0, &ops);
  if (opt.op) {
    char *line = xstrdup(opt.op);
    for (size_t i = 0; i < opt.sets.n; i++) {
      char *l2 = xasprintf("%s %s", line, opt.sets.v[i]);
      free(line);
      line = l2;
    }
    char why[512];
    if (expand_line(line, &ops, &expanded, why, sizeof why)) rc = usage_error("%s", why);
    free(line);
  }
  for (size_t i = 0; !rc && i < opt.sweeps.n; i++) {
    char why[512];
    if (expand_line(opt.sweeps.v[i], &ops, &expanded, why, sizeof why))
      rc = usage_error("--sweep \"%s\": %s", opt.sweeps.v[i], why);
  }
  for (size_t i = 0; !rc && i < opt.config_files.n; i++) rc = read_config_file(opt.config_files.v[i], &ops, &expanded);
  for (size_t i = 0; !rc && i < expanded.n; i++) add_line(expanded.v[i], &lines);
  strlist_free(&ops);
  strlist_free(&expanded);

  /* the device */
  probe_result pr;
  memset(&pr, 0, sizeof pr);
  if (!rc) {
    pr = probe_device();
    if (pr.status != RLK_OK) {
      if (!opt.dry_run) {
        fprintf(stderr, "%s: opening the %s device: %s: %s\n", prog, rlk_backend_name(opt.backend),
                rlk_status_string(pr.status), pr.error);
        rc = 1;
      } else {
        const char *target = opt.target ? opt.target : getenv("RLK_ARCH");
        if (!target && opt.backend != RLK_BACKEND_HOST && opt.backend != RLK_BACKEND_AUTO) {
          fprintf(stderr, "%s: no %s device here (%s): a dry run needs --target\n", prog,
                  rlk_backend_name(opt.backend), pr.error);
          rc = 2;
        } else {
          /* with no backend named, the target's own (the host's when there is none) */
          pr.backend = opt.backend != RLK_BACKEND_AUTO ? opt.backend
                       : target                    ? rlk_target_backend(target)
                                                   : RLK_BACKEND_HOST;
          rlk_context *ctx = NULL;
          if ((st = planning_context(pr.backend, target, &ctx))) {
            rc = lib_error("creating a compile-only context", st);
          } else {
            rlk_context_device_info(ctx, &pr.info);
            rlk_context_destroy(ctx);
          }
        }
      }
    } else if (opt.target && strcmp(opt.target, pr.info.target)) {
      printf("note: --target %s ignored: the device's target is %s\n", opt.target, pr.info.target);
    }
  }
  if (!rc) {
    info = pr.info;
    run_backend = pr.backend;
    memcpy(cache_dir, pr.cache_dir, sizeof cache_dir); /* the same size: nothing is cut */
    if (opt.pending) {
      size_t bad = 0;
      strlist pend = {0};
      if ((st = rlk_tune_pending_walk(db_path, pending_visit, &pend, &bad))) rc = lib_error("reading the pending list", st);
      for (size_t i = 0; i < pend.n; i++) add_line(pend.v[i], &lines);
      if (!rc && !pend.n) printf("nothing pending for this device in %s%s\n", db_path, ".pending");
      strlist_free(&pend);
    }
  }
  if (!rc) rc = build_configs(&lines);
  strlist_free(&lines);
  if (!rc && ncfgs == 0) {
    free_all();
    return 0;
  }
  if (!rc && !opt.seed_given) opt.seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();

  /* plan every variant to its kernels */
  if (!rc) {
    rlk_context *pctx = NULL;
    if ((st = planning_context(run_backend, info.target, &pctx))) {
      rc = lib_error("creating a planning context", st);
    } else {
      plan_configs(pctx);
      rlk_context_destroy(pctx);
      collect_compile_items();
    }
  }
  if (!rc && opt.dry_run) {
    print_dry_run();
    free_all();
    return 0;
  }
  if (!rc) {
    size_t ncand = 0;
    for (size_t i = 0; i < ncfgs; i++) ncand += (size_t)cfgs[i].nv - 1;
    printf("%s on %s (%s, %s, %d multiprocessors): %zu configuration%s, %zu candidates in all; warm-up %ld, %ld "
           "timed calls each; seed %" PRIu64 "; database %s\n",
           prog, info.name, info.target, info.compiler, info.multiprocessors, ncfgs, ncfgs == 1 ? "" : "s", ncand,
           opt.warmup, opt.iters, opt.seed, db_path);
    fflush(stdout);
    /* compile first, in worker processes */
    if (!cache_dir[0]) {
      printf("note: the kernel cache keeps nothing (RLK_CACHE_MODE, or an unusable root): the timing process "
             "compiles the kernels itself\n");
    } else {
      long jobs = opt.jobs;
      const char *w = getenv("RLK_JIT_WORKERS");
      if (!jobs && w && *w && parse_int(w, 1, 1024, &jobs)) jobs = 0;
      if (!jobs) jobs = sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
      if ((size_t)jobs > ncitems) jobs = (long)(ncitems ? ncitems : 1);
      double t0 = now_s();
      const pool_ops ops_ = {NULL, compile_worker_open, compile_run, compile_worker_close, compile_done};
      progress_start(&bar, ncitems);
      pool_run(ncitems, (int)jobs, &ops_);
      progress_clear(&bar);
      printf("compiled: %zu item%s, %ld kernel%s compiled (the rest cached), %zu failed, in %.1f s with %ld "
             "worker%s\n",
             ncitems, ncitems == 1 ? "" : "s", ccompiled, ccompiled == 1 ? "" : "s", cfailed, now_s() - t0, jobs,
             jobs == 1 ? "" : "s");
      fflush(stdout);
      apply_compile_failures();
    }
    /* then time, configuration by configuration */
    progress_start(&bar, ncfgs);
    finish_ready();
    run_timing();
    progress_clear(&bar);
    print_table();
    if (opt.json && write_json(opt.json)) rc = 1;
    if (record_failures) rc = 1;
    printf("%zu configuration%s, %d failed; records in %s\n", ncfgs, ncfgs == 1 ? "" : "s", record_failures, db_path);
  }
  free_all();
  return rc;
}

int main(int argc, char **argv) { return tool_exit(tool_main(argc, argv)); }
