/* test_tune.c - the tuning database: records through the file and back, merging, environments,
 * damaged files, concurrent writers, the pending list, and what logprob's variant selection makes
 * of a record (on the host, and on sm_90a through a compile-only context where NVRTC is here). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/fs.h"
#include "jit/cache.h"
#include "runtime/context.h"
#include "ops/ops.h"
#include "rlk.h"
#include "suites.h"
#include "test_util.h"
#include "tune/tune_db.h"
#include "tune/tune_table.h"

/* ---- helpers -------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A fresh database path under the run's scratch directory; RLK_TUNE_DB points at it. */
static void fresh_db(char *path, size_t size, const char *stem) {
  char dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, stem);
  snprintf(path, size, "%s/sub/tune.db", dir); /* the directory is created by the first write */
  setenv("RLK_TUNE_DB", path, 1);
}

static void write_text(const char *path, const char *text, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot write %s", path);
  ck_assert_uint_eq(fwrite(text, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = calloc(1, 1 << 20);
  ck_assert(buf);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void host_info(rlk_device_info *info) {
  rlk_context *ctx = rlk_test_host_context();
  ck_assert_int_eq(rlk_context_device_info(ctx, info), RLK_OK);
  rlk_context_destroy(ctx);
}

/* fresh_db, and the host context's environment for records. */
static rlk_device_info fresh_host_db(char *path, size_t size, const char *stem) {
  fresh_db(path, size, stem);
  rlk_device_info info;
  host_info(&info);
  return info;
}

/* A configuration line that is no tuning key, and the names its refusal must give. */
typedef struct refused_key {
  const char *line, *names;
} refused_key;

static void expect_refused_keys(const refused_key *bad, size_t n) {
  for (size_t i = 0; i < n; i++) {
    rlk_tune_record r;
    rlk_tune_record_init(&r);
    rlk_test_expect_error(rlk_tune_record_set_key(&r, bad[i].line), RLK_ERR_INVALID_ARGUMENT, bad[i].names,
                          bad[i].line);
  }
}

/* Configuration line `line` is the key of op `op`, canonical shape `shape`, token bucket `tokens`. */
static void expect_key(const char *line, const char *op, const char *shape, int64_t tokens) {
  rlk_tune_record r;
  rlk_tune_record_init(&r);
  ck_assert_msg(rlk_tune_record_set_key(&r, line) == RLK_OK, "%s: %s", line, rlk_last_error());
  ck_assert_str_eq(r.op, op);
  ck_assert_str_eq(r.shape, shape);
  ck_assert_int_eq(r.tokens, tokens);
}

/* A logprob record for `config` in environment `info` with the given winner and times. */
static rlk_tune_record make_record(const char *config, const rlk_device_info *info, const char *winner,
                                   double default_ms, double best_ms) {
  rlk_tune_record r;
  rlk_tune_record_init(&r);
  rlk_status st = rlk_tune_record_set_key(&r, config);
  ck_assert_msg(st == RLK_OK, "%s: %s", config, rlk_last_error());
  ck_assert_int_eq(rlk_tune_record_set_env(&r, info), RLK_OK);
  snprintf(r.winner, sizeof r.winner, "%s", winner);
  r.default_ms = default_ms;
  r.best_ms = best_ms;
  r.created = 1000;
  return r;
}

typedef struct collected {
  rlk_tune_record v[512];
  int n;
} collected;

static int collect(const rlk_tune_record *r, void *user) {
  collected *c = user;
  if (c->n < 512) c->v[c->n++] = *r;
  return 0;
}

static collected *walk_db(const char *db, size_t *bad) {
  collected *c = calloc(1, sizeof *c);
  ck_assert(c);
  rlk_status st = rlk_tune_db_walk(db, collect, c, bad);
  ck_assert_msg(st == RLK_OK, "walk %s: %s", db, rlk_last_error());
  return c;
}

/* The records of db (NULL: RLK_TUNE_DB's), which must be exactly n, with no damaged line. */
static collected *walk_clean_db(const char *db, int n) {
  size_t bad = 1;
  collected *c = walk_db(db, &bad);
  ck_assert_uint_eq(bad, 0);
  ck_assert_int_eq(c->n, n);
  return c;
}

/* How many records db holds. */
static int db_records(const char *db) {
  collected *c = walk_db(db, NULL);
  const int n = c->n;
  free(c);
  return n;
}

static const rlk_tune_record *find_key(const collected *c, const rlk_tune_record *key) {
  for (int i = 0; i < c->n; i++)
    if (!strcmp(c->v[i].shape, key->shape) && c->v[i].tokens == key->tokens && !strcmp(c->v[i].device, key->device) &&
        c->v[i].multiprocessors == key->multiprocessors && !strcmp(c->v[i].target, key->target) &&
        !strcmp(c->v[i].runtime, key->runtime) && !strcmp(c->v[i].compiler, key->compiler))
      return &c->v[i];
  return NULL;
}

/* Runs fn in a child whose stderr is captured; returns the text (caller frees) and the child's
 * exit status in *status. The child may not use Check's assertions: it reports through its
 * exit status. */
static char *capture_stderr(int (*fn)(void *), void *arg, int *status) {
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  pid_t pid = rlk_test_fork();
  if (pid == 0) {
    close(p[0]);
    dup2(p[1], 2);
    close(p[1]);
    int rc = fn(arg);
    fflush(stderr);
    _exit(rc);
  }
  close(p[1]);
  char *buf = calloc(1, 65536);
  ck_assert(buf);
  size_t len = 0;
  ssize_t n;
  while (len + 1 < 65536 && (n = read(p[0], buf + len, 65535 - len)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    len += (size_t)n;
  }
  close(p[0]);
  int ws = 0;
  ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
  *status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  return buf;
}

/* Host logprob calls: f32 logits [N, V] with random values, i64 labels. */
typedef struct host_call {
  int64_t N, V;
  float *logits, *logp, *lse, *ent, *glp, *grad;
  int64_t *labels;
} host_call;

static void host_call_make(host_call *h, int64_t N, int64_t V, uint64_t seed) {
  memset(h, 0, sizeof *h);
  h->N = N;
  h->V = V;
  h->logits = malloc((size_t)(N * V) * sizeof(float));
  h->grad = malloc((size_t)(N * V) * sizeof(float));
  h->labels = malloc((size_t)N * sizeof(int64_t));
  h->logp = malloc((size_t)N * sizeof(float));
  h->lse = malloc((size_t)N * sizeof(float));
  h->ent = malloc((size_t)N * sizeof(float));
  h->glp = malloc((size_t)N * sizeof(float));
  ck_assert(h->logits && h->grad && h->labels && h->logp && h->lse && h->ent && h->glp);
  uint64_t rng = seed;
  for (int64_t i = 0; i < N * V; i++) h->logits[i] = (float)(2.0 * rlk_test_rand_normal(&rng));
  for (int64_t i = 0; i < N; i++) {
    h->labels[i] = (int64_t)(rlk_test_rand_u64(&rng) % (uint64_t)V);
    h->glp[i] = 0.5f + (float)rlk_test_rand_uniform(&rng);
  }
}

static void host_call_free(host_call *h) {
  free(h->logits);
  free(h->grad);
  free(h->labels);
  free(h->logp);
  free(h->lse);
  free(h->ent);
  free(h->glp);
}

static rlk_status host_fwd(rlk_context *ctx, host_call *h, int entropy, int block) {
  rlk_logprob_args a;
  rlk_logprob_args_init(&a);
  a.logits = rlk_tensor_2d(h->logits, RLK_F32, h->N, h->V, h->V);
  a.labels = rlk_tensor_1d(h->labels, RLK_I64, h->N);
  a.logp = rlk_tensor_1d(h->logp, RLK_F32, h->N);
  a.lse = rlk_tensor_1d(h->lse, RLK_F32, h->N);
  if (entropy) a.entropy = rlk_tensor_1d(h->ent, RLK_F32, h->N);
  a.block = block;
  return rlk_logprob(ctx, &a, NULL);
}

static rlk_status host_bwd_entropy(rlk_context *ctx, host_call *h, int entropy) {
  rlk_logprob_backward_args b;
  rlk_logprob_backward_args_init(&b);
  b.logits = rlk_tensor_2d(h->logits, RLK_F32, h->N, h->V, h->V);
  b.labels = rlk_tensor_1d(h->labels, RLK_I64, h->N);
  b.lse = rlk_tensor_1d(h->lse, RLK_F32, h->N);
  b.grad_logp = rlk_tensor_1d(h->glp, RLK_F32, h->N);
  if (entropy) { /* the forward's entropy, and g_H = g_lp */
    b.entropy = rlk_tensor_1d(h->ent, RLK_F32, h->N);
    b.grad_entropy = rlk_tensor_1d(h->glp, RLK_F32, h->N);
  }
  b.grad_logits = rlk_tensor_2d(h->grad, RLK_F32, h->N, h->V, h->V);
  return rlk_logprob_backward(ctx, &b, NULL);
}

static rlk_status host_bwd(rlk_context *ctx, host_call *h) { return host_bwd_entropy(ctx, h, 0); }

static void tune_counts(rlk_context *ctx, uint64_t *hits, uint64_t *misses) {
  rlk_tune_table_counts(ctx->tune, hits, misses);
}

/* Options of a compile-only sm_90a context; 0 (with the reason printed) when NVRTC is absent, else
 * 1 with the context's device info. */
static int sm90a_options(rlk_context_options *o, rlk_device_info *info, const char *what) {
  rlk_context_options_init(o);
  o->backend = RLK_BACKEND_CUDA;
  o->compile_only = 1;
  o->target = "sm_90a";
  rlk_context *ctx = NULL;
  if (rlk_context_create(&ctx, o) != RLK_OK) {
    printf("skip (tune: %s): no NVRTC: %s\n", what, rlk_last_error());
    return 0;
  }
  ck_assert_int_eq(rlk_context_device_info(ctx, info), RLK_OK);
  rlk_context_destroy(ctx);
  return 1;
}

/* A record to store: its key line with tokens= added, winner and the two times (make_record's
 * arguments). */
typedef struct record_row {
  const char *key;
  long long tokens;
  const char *winner;
  double default_ms, best_ms;
} record_row;

/* A compile-only sm_90a context (of options *o) over a fresh database (under a directory named
 * after `stem`) that holds a record of each of rows[0..n) for sm_90a's environment; NULL (the
 * test skips, `what` names it) without NVRTC. */
static rlk_context *sm90a_context_over(rlk_context_options *o, const record_row *rows, size_t n, const char *stem,
                                       const char *what) {
  rlk_device_info info;
  if (!sm90a_options(o, &info, what)) return NULL;
  rlk_tune_record r[4];
  ck_assert_uint_le(n, sizeof r / sizeof r[0]);
  for (size_t i = 0; i < n; i++) {
    char line[512];
    snprintf(line, sizeof line, "%s tokens=%lld", rows[i].key, rows[i].tokens);
    r[i] = make_record(line, &info, rows[i].winner, rows[i].default_ms, rows[i].best_ms);
  }
  char db[1100];
  fresh_db(db, sizeof db, stem);
  ck_assert_int_eq(rlk_tune_db_record(db, r, n), RLK_OK);
  rlk_context *ctx = NULL;
  ck_assert_msg(rlk_context_create(&ctx, o) == RLK_OK, "%s", rlk_last_error());
  return ctx;
}

/* ---- records, keys and buckets -------------------------------------------------------- */

START_TEST(buckets_and_keys) {
  static const struct {
    int64_t n, bucket;
  } b[] = {{1, 1},         {2, 2},         {3, 4},         {5, 4},         {6, 8},         {4096, 4096},
           {5000, 4096},   {5792, 4096},   {5793, 8192},   {11585, 8192},  {11586, 16384}, {16384, 16384},
           {23170, 16384}, {23171, 32768}, {1 << 30, 1 << 30}};
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
    char line[128];
    snprintf(line, sizeof line, "logprob pass=fwd tokens=%lld", (long long)b[i].n);
    rlk_tune_record r;
    rlk_tune_record_init(&r);
    ck_assert_msg(rlk_tune_record_set_key(&r, line) == RLK_OK, "%s: %s", line, rlk_last_error());
    ck_assert_msg(r.tokens == b[i].bucket, "%lld rows: bucket %lld, expected %lld", (long long)b[i].n,
                  (long long)r.tokens, (long long)b[i].bucket);
  }
  /* the shape is canonical: order, defaults and irrelevant settings do not change it */
  expect_key("logprob tokens=16000 entropy=1 vocab=50257 pass=fwd grad=f32", "logprob",
             "pass=fwd logits=bf16 labels=i64 entropy=1 vocab=50257", 16384);
  expect_key("logprob  pass=bwd labels=i32 logits=f16 grad=f32 tokens=7", "logprob",
             "pass=bwd logits=f16 labels=i32 entropy=0 grad=f32 vocab=151936", 8);
  /* lines that are not a key */
  static const refused_key bad[] = {{"logprob pass=both tokens=64", "pass"},
             {"logprob tokens=64", "pass"},
             {"logprob pass=fwd", "tokens"},
             {"logprob pass=fwd tokens=0", "tokens"},
             {"logprob pass=fwd tokens=64 variant=vec", "tuning"},
             {"logprob pass=fwd tokens=64 block=256", "tuning"},
             {"logprob pass=fwd tokens=64 colour=red", "colour"},
             {"logprob pass=fwd tokens=64 kept=1", "kept"},
             {"group_advantage mode=grpo tokens=64", "no tuning candidates"},
             {"no_such_op tokens=64", "unknown op"},
             {"", "empty"}};
  expect_refused_keys(bad, sizeof bad / sizeof bad[0]);
  ck_assert_int_eq(rlk_tune_record_set_key(NULL, "logprob pass=fwd tokens=1"), RLK_ERR_INVALID_ARGUMENT);
  /* the candidates an op declares */
  const char *cands = rlk_tune_candidates("logprob");
  ck_assert_int_ge(rlk_test_count_lines(cands, "variant="), 8);
  ck_assert_int_ge(rlk_test_count_lines(cands, "variant=tma"), 1);
  ck_assert_str_eq(rlk_tune_candidates("group_advantage"), "");
  ck_assert_str_eq(rlk_tune_candidates("no_such_op"), "");
  ck_assert_str_eq(rlk_tune_candidates(NULL), "");
  /* what changes calls but not kernels: nothing on the host (sm_90a: linear_logprob_keys_...) */
  rlk_context *host = rlk_test_host_context();
  ck_assert_str_eq(rlk_tune_runtime_settings(host, "linear_logprob pass=bwd hidden=f16"), "");
  ck_assert_str_eq(rlk_tune_runtime_settings(host, "logprob pass=fwd vocab=1000"), "");
  ck_assert_str_eq(rlk_tune_runtime_settings(host, "no_such_op"), "");
  ck_assert_str_eq(rlk_tune_runtime_settings(host, NULL), "");
  ck_assert_str_eq(rlk_tune_runtime_settings(NULL, "linear_logprob pass=bwd"), "");
  rlk_context_destroy(host);
}
END_TEST

START_TEST(db_round_trip) {
  char db[1100];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-rt");
  rlk_tune_record r[3];
  r[0] = make_record("logprob pass=fwd entropy=1 vocab=151936 tokens=16384", &info,
                     "variant=bulk block=256 unroll=4 stages=3", 1.5, 1.25);
  r[0].ntimings = 3;
  snprintf(r[0].timings[0].settings, sizeof r[0].timings[0].settings, "variant=bulk block=256 unroll=4 stages=3");
  r[0].timings[0].median_ms = 1.25;
  snprintf(r[0].timings[1].settings, sizeof r[0].timings[1].settings, "variant=tma block=256 unroll=4 stages=4");
  r[0].timings[1].result = RLK_TUNE_REJECTED;
  snprintf(r[0].timings[2].settings, sizeof r[0].timings[2].settings, "variant=vec block=1024 unroll=2");
  r[0].timings[2].result = RLK_TUNE_FAILED;
  r[1] = make_record("logprob pass=bwd logits=f16 labels=i32 grad=f32 vocab=50257 tokens=4096", &info, "", 2.0,
                     2.0);
  r[2] = make_record("logprob pass=fwd logits=f32 vocab=128256 tokens=3", &info, "variant=vec block=512 unroll=8",
                     0.125, 0.0625);
  snprintf(r[2].device, sizeof r[2].device, "Some GPU = with spaces");
  r[2].created = 1764400000;
  ck_assert_msg(rlk_tune_db_record(NULL, r, 3) == RLK_OK, "%s", rlk_last_error());

  char *text = read_text(db);
  ck_assert_ptr_nonnull(text);
  ck_assert_msg(!strncmp(text, "# rlk-tune-db 1\n", 16), "no version line:\n%s", text);
  ck_assert_int_eq(rlk_test_count_lines(text, "op=logprob\t"), 3);
  {
    /* CRLF line ends read as LF; a carriage return inside a field damages its line (kept, it
     * would move to the line's end on rewriting, where it is stripped: a record that changes) */
    const size_t n = strlen(text);
    char *crlf = malloc(2 * n + 8), *inner = malloc(n + 8);
    ck_assert(crlf && inner);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      if (text[i] == '\n') crlf[k++] = '\r';
      crlf[k++] = text[i];
    }
    rlk_tune_list list = {0};
    size_t nbad = 99;
    char why[256];
    ck_assert_int_eq(rlk_tune_parse(crlf, k, RLK_TUNE_FILE_DB, &list, &nbad, why, sizeof why), 0);
    ck_assert_uint_eq(list.n, 3);
    ck_assert_uint_eq(nbad, 0);
    ck_assert_str_eq(list.v[0].timings[2].settings, "variant=vec block=1024 unroll=2");
    rlk_tune_list_free(&list);
    memcpy(inner, text, n + 1);
    char *cand = strstr(inner, "\tcand=rejected variant=tma");
    ck_assert_ptr_nonnull(cand);
    cand[strlen("\tcand=rejected variant")] = '\r';
    ck_assert_int_eq(rlk_tune_parse(inner, n, RLK_TUNE_FILE_DB, &list, &nbad, why, sizeof why), 0);
    ck_assert_uint_eq(list.n, 2);
    ck_assert_uint_eq(nbad, 1);
    rlk_tune_list_free(&list);
    free(crlf);
    free(inner);
  }
  {
    /* a field given twice damages its line: which of its values is meant cannot be told (cand
     * alone repeats) */
    const char *rec = strstr(text, "op=logprob\t");
    ck_assert_ptr_nonnull(rec);
    const int reclen = (int)strcspn(rec, "\n");
    static const char *const extra[] = {"cand=1 variant=vec block=256 unroll=2", "op=logprob", "shape=pass=bwd",
                                        "tokens=64", "sms=8", "device=other", "winner=", "default_ms=3",
                                        "best_ms=2", "created=7"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
      char line[4096];
      const int n = snprintf(line, sizeof line, "# rlk-tune-db 1\n%.*s\t%s\n", reclen, rec, extra[i]);
      ck_assert(n > 0 && n < (int)sizeof line);
      rlk_tune_list list = {0};
      size_t nbad = 99;
      char why[256];
      ck_assert_int_eq(rlk_tune_parse(line, (size_t)n, RLK_TUNE_FILE_DB, &list, &nbad, why, sizeof why), 0);
      ck_assert_msg(list.n == (i == 0) && nbad == (i != 0), "%s: %zu records, %zu bad", extra[i], list.n, nbad);
      rlk_tune_list_free(&list);
    }
  }
  free(text);

  collected *c = walk_clean_db(NULL, 3);
  for (int i = 0; i < 3; i++) {
    const rlk_tune_record *g = &c->v[i];
    ck_assert_str_eq(g->op, r[i].op);
    ck_assert_str_eq(g->shape, r[i].shape);
    ck_assert_int_eq(g->tokens, r[i].tokens);
    ck_assert_str_eq(g->target, r[i].target);
    ck_assert_str_eq(g->device, r[i].device);
    ck_assert_int_eq(g->multiprocessors, r[i].multiprocessors);
    ck_assert_str_eq(g->runtime, rlk_version_string());
    ck_assert_str_eq(g->compiler, r[i].compiler);
    ck_assert_str_eq(g->winner, r[i].winner);
    ck_assert_double_eq_tol(g->default_ms, r[i].default_ms, 1e-9);
    ck_assert_double_eq_tol(g->best_ms, r[i].best_ms, 1e-9);
    ck_assert_int_eq(g->created, r[i].created);
    ck_assert_int_eq(g->ntimings, r[i].ntimings);
    for (int k = 0; k < g->ntimings; k++) {
      ck_assert_str_eq(g->timings[k].settings, r[i].timings[k].settings);
      ck_assert_int_eq(g->timings[k].result, r[i].timings[k].result);
      ck_assert_double_eq_tol(g->timings[k].median_ms, r[i].timings[k].median_ms, 1e-9);
    }
  }
  free(c);

  /* records that would break the format are refused, and nothing is written */
  /* (and those the reader would skip: every record written is one it reads back) */
  enum { NBAD = 9 };
  rlk_tune_record bad_r[NBAD];
  for (int i = 0; i < NBAD; i++) bad_r[i] = r[1];
  snprintf(bad_r[0].device, sizeof bad_r[0].device, "tab\there");
  bad_r[1].tokens = 0;
  bad_r[2].default_ms = NAN;
  bad_r[3].ntimings = RLK_TUNE_MAX_TIMINGS + 1;
  snprintf(bad_r[4].winner, sizeof bad_r[4].winner, "a\nb");
  bad_r[5].op[0] = '\0';
  bad_r[6].created = -5;
  bad_r[7].multiprocessors = 2000000;
  bad_r[8].best_ms = 1e-320; /* printed as %.6g, a subnormal reads back out of range */
  static const char *const fields[NBAD] = {"device", "tokens", "default_ms", "ntimings", "winner", "op", "created",
                                           "multiprocessors", "best_ms"};
  for (int i = 0; i < NBAD; i++) {
    ck_assert_int_eq(rlk_tune_db_record(NULL, &bad_r[i], 1), RLK_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(rlk_last_error(), fields[i]) != NULL, "'%s' does not name %s", rlk_last_error(), fields[i]);
  }
  ck_assert_int_eq(db_records(db), 3);
  /* a missing database has no records */
  char missing[1200];
  snprintf(missing, sizeof missing, "%s.none", db);
  free(walk_clean_db(missing, 0));
  ck_assert_int_eq(rlk_tune_db_walk(db, NULL, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  /* the default path is beside the kernel cache */
  unsetenv("RLK_TUNE_DB");
  char path[1200], root[1100];
  ck_assert_int_eq(rlk_tune_db_path(path, sizeof path), RLK_OK);
  ck_assert_int_eq(rlk_cache_default_root(root, sizeof root), RLK_OK);
  strcat(root, "/tune.db");
  ck_assert_str_eq(path, root);
}
END_TEST

START_TEST(db_merge_of_runs) {
  char db[1100], other[1200];
  fresh_db(db, sizeof db, "tune-merge");
  rlk_device_info info;
  host_info(&info);
  rlk_tune_record a = make_record("logprob pass=fwd vocab=1000 tokens=64", &info, "variant=vec block=256 unroll=4", 1, 0.9);
  rlk_tune_record b = make_record("logprob pass=bwd vocab=1000 tokens=64", &info, "", 2, 2);
  rlk_tune_record run1[2] = {a, b};
  ck_assert_int_eq(rlk_tune_db_record(db, run1, 2), RLK_OK);
  /* a second run: a new winner for b's key, and a new key c */
  rlk_tune_record b2 = b, c = make_record("logprob pass=fwd vocab=2000 tokens=64", &info, "", 3, 3);
  snprintf(b2.winner, sizeof b2.winner, "variant=vec block=1024 unroll=2");
  b2.best_ms = 1.5;
  b2.created = 2000;
  rlk_tune_record run2[2] = {b2, c};
  ck_assert_int_eq(rlk_tune_db_record(db, run2, 2), RLK_OK);
  collected *got = walk_db(db, NULL);
  ck_assert_int_eq(got->n, 3);
  ck_assert_str_eq(find_key(got, &a)->winner, a.winner);
  ck_assert_str_eq(find_key(got, &b)->winner, "variant=vec block=1024 unroll=2");
  ck_assert_double_eq_tol(find_key(got, &b)->best_ms, 1.5, 1e-12);
  ck_assert_ptr_nonnull(find_key(got, &c));
  free(got);

  /* merging another file: the record created later wins a shared key */
  snprintf(other, sizeof other, "%s.other", db);
  rlk_tune_record old_a = a, new_c = c, d = make_record("logprob pass=fwd vocab=3000 tokens=128", &info, "", 4, 4);
  old_a.created = 10; /* older than a's 1000: loses */
  snprintf(old_a.winner, sizeof old_a.winner, "variant=vec block=512 unroll=2");
  new_c.created = 5000; /* newer than c: wins */
  snprintf(new_c.winner, sizeof new_c.winner, "variant=vec block=512 unroll=8");
  rlk_tune_record o[3] = {old_a, new_c, d};
  ck_assert_int_eq(rlk_tune_db_record(other, o, 3), RLK_OK);
  size_t taken = 0;
  ck_assert_msg(rlk_tune_db_merge(db, other, &taken) == RLK_OK, "%s", rlk_last_error());
  ck_assert_uint_eq(taken, 2);
  got = walk_db(db, NULL);
  ck_assert_int_eq(got->n, 4);
  ck_assert_str_eq(find_key(got, &a)->winner, a.winner);
  ck_assert_str_eq(find_key(got, &c)->winner, new_c.winner);
  ck_assert_ptr_nonnull(find_key(got, &d));
  free(got);
  /* merging a file that is not a tuning database fails and changes nothing */
  write_text(other, "hello\n", 6);
  ck_assert_int_eq(rlk_tune_db_merge(db, other, &taken), RLK_ERR_IO);
  ck_assert_ptr_nonnull(strstr(rlk_last_error(), other));
  snprintf(other, sizeof other, "%s.missing", db);
  ck_assert_int_eq(rlk_tune_db_merge(db, other, &taken), RLK_ERR_IO);
  ck_assert_int_eq(db_records(db), 4);
}
END_TEST

/* The winner a fresh host context takes from RLK_TUNE_DB for `line` ("-" when none). */
static void expect_lookup(const char *line, const char *want) {
  rlk_context *ctx = rlk_test_host_context();
  char settings[128] = "";
  int found = 0;
  ck_assert_int_eq(rlk_tune_lookup(ctx, line, settings, sizeof settings, &found), RLK_OK);
  ck_assert_msg(!strcmp(found ? settings : "-", want), "%s: took '%s', expected '%s'", line,
                found ? settings : "-", want);
  rlk_context_destroy(ctx);
}

/* Appends the file `from` (its version line becomes a comment) to `to`, as cat does. */
static void concatenate(const char *to, const char *from) {
  char *a = read_text(to), *b = read_text(from);
  ck_assert(a && b);
  size_t na = strlen(a), nb = strlen(b);
  char *joined = malloc(na + nb + 1);
  ck_assert(joined);
  memcpy(joined, a, na);
  memcpy(joined + na, b, nb + 1);
  write_text(to, joined, na + nb);
  free(joined);
  free(a);
  free(b);
}

/* A key on several lines (two databases joined with cat) is read from its last line; a writer
 * replaces that record, and keeps one record per key. */
START_TEST(db_duplicate_keys_keep_the_last) {
  char db[1100], other[1200];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-dup");
  snprintf(other, sizeof other, "%s.other", db);
  const char *line = "logprob pass=fwd logits=f32 vocab=96 tokens=8";
  const char *line_b = "logprob pass=fwd logits=f32 vocab=97 tokens=8";
  rlk_tune_record a1 = make_record(line, &info, "variant=vec block=256 unroll=2", 1, 0.5);
  rlk_tune_record b = make_record(line_b, &info, "", 1, 1);
  rlk_tune_record first[2] = {a1, b};
  ck_assert_int_eq(rlk_tune_db_record(db, first, 2), RLK_OK);
  rlk_tune_record a2 = make_record(line, &info, "variant=vec block=512 unroll=4", 1, 0.4);
  a2.created = 2000;
  ck_assert_int_eq(rlk_tune_db_record(other, &a2, 1), RLK_OK);
  concatenate(db, other);
  free(walk_clean_db(db, 3));
  expect_lookup(line, "variant=vec block=512 unroll=4"); /* the last line wins */

  /* a new record replaces the record in use, and the key's other line goes */
  rlk_tune_record a3 = make_record(line, &info, "variant=vec block=1024 unroll=8", 1, 0.3);
  a3.created = 3000;
  ck_assert_int_eq(rlk_tune_db_record(db, &a3, 1), RLK_OK);
  collected *got = walk_clean_db(db, 2);
  ck_assert_str_eq(find_key(got, &a3)->winner, a3.winner);
  ck_assert_ptr_nonnull(find_key(got, &b));
  free(got);
  expect_lookup(line, "variant=vec block=1024 unroll=8");
  expect_lookup(line_b, "");

  /* merging: each file's record of a key is its last line's. `other` holds a newer line of the
   * key, then an older one (the one a reader of it uses): the database's record (3000) wins. */
  unlink(other);
  rlk_tune_record newer = a3, older = a3;
  newer.created = 9000;
  snprintf(newer.winner, sizeof newer.winner, "variant=vec block=256 unroll=8");
  older.created = 2500;
  snprintf(older.winner, sizeof older.winner, "variant=vec block=512 unroll=8");
  char other2[1300];
  snprintf(other2, sizeof other2, "%s.2", other);
  ck_assert_int_eq(rlk_tune_db_record(other, &newer, 1), RLK_OK);
  ck_assert_int_eq(rlk_tune_db_record(other2, &older, 1), RLK_OK);
  concatenate(other, other2);
  concatenate(db, db); /* and the database has every key twice */
  free(walk_clean_db(db, 4));
  size_t taken = 9;
  ck_assert_msg(rlk_tune_db_merge(db, other, &taken) == RLK_OK, "%s", rlk_last_error());
  ck_assert_uint_eq(taken, 0);
  got = walk_clean_db(db, 2);
  ck_assert_str_eq(find_key(got, &a3)->winner, a3.winner);
  free(got);
  expect_lookup(line, "variant=vec block=1024 unroll=8");
  unlink(other);
  unlink(other2);
}
END_TEST

/* RLK_LOCK_TIMEOUT_S means for a database writer what it means for the kernel cache: fractions
 * count, and a value the cache refuses is refused, naming it, with nothing written. */
START_TEST(db_lock_timeout_as_the_cache_reads_it) {
  char db[1100], other[1200];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-timeout");
  snprintf(other, sizeof other, "%s.other", db);
  rlk_tune_record r = make_record("logprob pass=fwd logits=f32 vocab=80 tokens=8", &info, "", 1, 1);
  rlk_tune_record r2 = make_record("logprob pass=fwd logits=f32 vocab=81 tokens=8", &info, "", 1, 1);
  ck_assert_int_eq(rlk_tune_db_record(db, &r, 1), RLK_OK);
  ck_assert_int_eq(rlk_tune_db_record(other, &r2, 1), RLK_OK);
  static const char *const bad[] = {"soon", "-1", "nan", "inf", "1.5s"};
  rlk_cache_config cfg;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("RLK_LOCK_TIMEOUT_S", bad[i], 1);
    ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_ERR_INVALID_ARGUMENT);
    rlk_test_expect_error(rlk_tune_db_record(db, &r2, 1), RLK_ERR_INVALID_ARGUMENT, "RLK_LOCK_TIMEOUT_S", bad[i]);
    rlk_test_expect_error(rlk_tune_db_merge(db, other, NULL), RLK_ERR_INVALID_ARGUMENT, "RLK_LOCK_TIMEOUT_S", bad[i]);
  }
  free(walk_clean_db(db, 1));

  /* 0.5 is half a second, for the cache and the database alike */
  setenv("RLK_LOCK_TIMEOUT_S", "0.5", 1);
  ck_assert_int_eq(rlk_cache_config_from_env(&cfg, NULL), RLK_OK);
  ck_assert(cfg.lock_timeout_s == 0.5);
  int held = -1;
  ck_assert_int_eq(rlk_tune_lock(db, 0, &held), RLK_OK);
  double t0 = now_s();
  ck_assert_int_eq(rlk_tune_db_record(db, &r2, 1), RLK_ERR_TIMEOUT);
  const double waited = now_s() - t0;
  ck_assert_msg(waited >= 0.45 && waited < 5, "waited %.2f s for a 0.5 s timeout", waited);
  ck_assert_ptr_nonnull(strstr(rlk_last_error(), "RLK_LOCK_TIMEOUT_S"));
  rlk_tune_unlock(held);
  ck_assert_int_eq(rlk_tune_db_merge(db, other, NULL), RLK_OK);
  unsetenv("RLK_LOCK_TIMEOUT_S");
  free(walk_clean_db(db, 2));
}
END_TEST

/* A context uses only its own environment's records. */
START_TEST(db_other_environments_ignored) {
  char db[1100];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-env");
  const char *line = "logprob pass=fwd logits=f32 vocab=300 tokens=16";
  rlk_tune_record r[6];
  for (int i = 0; i < 6; i++) {
    char cfg[128];
    snprintf(cfg, sizeof cfg, "logprob pass=fwd logits=f32 vocab=%d tokens=16", 300 + i);
    r[i] = make_record(cfg, &info, "variant=vec block=256 unroll=2", 1, 0.5);
  }
  /* r[0] is ours; each other one differs from this environment in one field */
  snprintf(r[1].device, sizeof r[1].device, "another %.100s", info.name);
  r[2].multiprocessors = info.multiprocessors + 1;
  snprintf(r[3].runtime, sizeof r[3].runtime, "0.0.1");
  snprintf(r[4].compiler, sizeof r[4].compiler, "clang 1.0");
  snprintf(r[5].target, sizeof r[5].target, "sm_90a");
  ck_assert_int_eq(rlk_tune_db_record(db, r, 6), RLK_OK);
  rlk_context *ctx = rlk_test_host_context();
  char settings[128];
  int found = 0;
  ck_assert_int_eq(rlk_tune_lookup(ctx, line, settings, sizeof settings, &found), RLK_OK);
  ck_assert_int_eq(found, 1);
  ck_assert_str_eq(settings, "variant=vec block=256 unroll=2");
  for (int i = 1; i < 6; i++) {
    char cfg[128];
    snprintf(cfg, sizeof cfg, "logprob pass=fwd logits=f32 vocab=%d tokens=16", 300 + i);
    ck_assert_int_eq(rlk_tune_lookup(ctx, cfg, settings, sizeof settings, &found), RLK_OK);
    ck_assert_msg(found == 0, "a record of another environment (%d) was used", i);
  }
  /* the bucket is part of the key: 16 rows, not 64 */
  ck_assert_int_eq(rlk_tune_lookup(ctx, "logprob pass=fwd logits=f32 vocab=300 tokens=64", settings,
                                   sizeof settings, &found),
                   RLK_OK);
  ck_assert_int_eq(found, 0);
  ck_assert_int_eq(rlk_tune_lookup(ctx, "logprob pass=fwd logits=f32 vocab=300 tokens=20", settings,
                                   sizeof settings, &found),
                   RLK_OK);
  ck_assert_int_eq(found, 1);
  /* what a call takes: under RLK_INVARIANT=1 rlk_logprob reads no winner */
  setenv("RLK_INVARIANT", "1", 1);
  ck_assert_int_eq(rlk_tune_lookup(ctx, line, settings, sizeof settings, &found), RLK_OK);
  ck_assert_int_eq(found, 0);
  unsetenv("RLK_INVARIANT");
  ck_assert_int_eq(rlk_tune_lookup(ctx, "logprob pass=both tokens=20", settings, sizeof settings, &found),
                   RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_tune_lookup(NULL, line, settings, sizeof settings, &found), RLK_ERR_INVALID_ARGUMENT);
  rlk_context_destroy(ctx);
}
END_TEST

/* ---- damaged files -------------------------------------------------------------------- */

typedef struct damaged_run {
  const char *line; /* a configuration with a good record in the file, or NULL */
} damaged_run;

/* In a child: three contexts look up and call through a damaged database. Exit 0 when every
 * call worked and the lookups found what they should (2: a call failed, 3: a lookup was wrong). */
static int use_damaged(void *arg) {
  const damaged_run *d = arg;
  for (int k = 0; k < 3; k++) {
    rlk_context *ctx = rlk_test_child_host_context(NULL);
    if (!ctx) return 2;
    char settings[128];
    int found = 0;
    if (rlk_tune_lookup(ctx, "logprob pass=fwd logits=f32 vocab=64 tokens=8", settings, sizeof settings, &found))
      return 2;
    if (found) return 3;
    if (d->line) {
      if (rlk_tune_lookup(ctx, d->line, settings, sizeof settings, &found) || !found) return 3;
    }
    host_call h;
    host_call_make(&h, 8, 64, 7);
    rlk_status st = host_fwd(ctx, &h, 1, 0);
    host_call_free(&h);
    rlk_context_destroy(ctx);
    if (st) return 2;
  }
  return 0;
}

START_TEST(db_damaged_files_warn_once) {
  char db[1100];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-bad");
  const char *good_line = "logprob pass=fwd logits=f32 vocab=77 tokens=8";
  rlk_tune_record good = make_record(good_line, &info, "variant=vec block=256 unroll=4", 1, 0.5);
  ck_assert_int_eq(rlk_tune_db_record(db, &good, 1), RLK_OK);
  char *text = read_text(db);
  ck_assert_ptr_nonnull(text);
  const size_t len = strlen(text);
  uint64_t rng = rlk_test_seed();
  char garbage[4096];
  for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (char)(rlk_test_rand_u64(&rng) & 0xff);
  char *with_bad_lines = malloc(len + 512);
  ck_assert(with_bad_lines);
  snprintf(with_bad_lines, len + 512,
           "%sop=logprob\tshape=x\n\nnot a record at all\nop=logprob\ttokens=abc\tshape=y\n%s", text,
           "op=logprob\tshape=pass=fwd truncated");
  /* lines ended by a carriage return alone: the whole text would pass for the version line */
  char *cr_only = malloc(len + 1);
  ck_assert(cr_only);
  for (size_t i = 0; i <= len; i++) cr_only[i] = text[i] == '\n' ? '\r' : text[i];
  const struct {
    const char *name;
    const char *text;
    size_t len;
    int good_kept; /* the good record survives */
    int min_bad;
  } cases[] = {
      {"garbage", garbage, sizeof garbage, 0, 1},
      {"truncated in its last line", text, len - 5, 0, 1},
      {"truncated in the version line", text, 7, 0, 1},
      {"another version", "# rlk-tune-db 2\nop=logprob\n", 27, 0, 1},
      {"bad lines among good", with_bad_lines, strlen(with_bad_lines), 1, 4},
      {"NUL bytes", "# rlk-tune-db 1\n\0\0\0\0\n", 21, 0, 1},
      {"empty", "", 0, 0, 1},
      {"carriage returns alone", cr_only, len, 0, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_text(db, cases[i].text, cases[i].len);
    size_t bad = 0;
    collected *c = walk_db(db, &bad);
    ck_assert_msg(c->n == cases[i].good_kept, "%s: %d records", cases[i].name, c->n);
    ck_assert_msg((int)bad >= cases[i].min_bad, "%s: %zu bad lines", cases[i].name, bad);
    free(c);
    damaged_run d = {cases[i].good_kept ? good_line : NULL};
    int status = -1;
    char *err = capture_stderr(use_damaged, &d, &status);
    ck_assert_msg(status == 0, "%s: the child failed (%d):\n%s", cases[i].name, status, err);
    ck_assert_msg(rlk_test_count_lines(err, "rlk warn") == 1, "%s: expected one warning, got:\n%s",
                  cases[i].name, err);
    ck_assert_msg(strstr(err, "tuning database") != NULL, "%s: %s", cases[i].name, err);
    free(err);
  }
  /* a directory where the file should be: no crash, no records, an error only for writers */
  write_text(db, "", 0);
  unlink(db);
  ck_assert_int_eq(mkdir(db, 0700), 0);
  damaged_run d = {NULL};
  int status = -1;
  char *err = capture_stderr(use_damaged, &d, &status);
  ck_assert_msg(status == 0, "directory: the child failed (%d):\n%s", status, err);
  free(err);
  ck_assert_int_ne(rlk_tune_db_record(db, &good, 1), RLK_OK);
  rmdir(db);

  /* a writer moves a file that is not a database aside and starts a new one */
  write_text(db, garbage, sizeof garbage);
  ck_assert_int_eq(rlk_tune_db_record(db, &good, 1), RLK_OK);
  ck_assert_int_eq(db_records(db), 1);
  char dir[1100];
  snprintf(dir, sizeof dir, "%s", db);
  *strrchr(dir, '/') = '\0';
  DIR *dd = opendir(dir);
  ck_assert_ptr_nonnull(dd);
  int aside = 0, temps = 0;
  struct dirent *de;
  while ((de = readdir(dd))) {
    aside += strstr(de->d_name, "tune.db.bad-") == de->d_name;
    temps += strstr(de->d_name, ".tmp-") != NULL;
  }
  closedir(dd);
  ck_assert_int_eq(aside, 1);
  ck_assert_int_eq(temps, 0);
  /* and one whose lines end in carriage returns alone: its record is not lost unseen */
  dd = opendir(dir);
  ck_assert_ptr_nonnull(dd);
  while ((de = readdir(dd)))
    if (strstr(de->d_name, "tune.db.bad-") == de->d_name) ck_assert_int_eq(unlinkat(dirfd(dd), de->d_name, 0), 0);
  closedir(dd);
  write_text(db, cr_only, len);
  ck_assert_int_eq(rlk_tune_db_record(db, &good, 1), RLK_OK);
  ck_assert_int_eq(db_records(db), 1);
  dd = opendir(dir);
  ck_assert_ptr_nonnull(dd);
  aside = 0;
  while ((de = readdir(dd))) aside += strstr(de->d_name, "tune.db.bad-") == de->d_name;
  closedir(dd);
  ck_assert_int_eq(aside, 1);
  free(cr_only);
  free(with_bad_lines);
  free(text);
}
END_TEST

/* The tuning database sits at the kernel cache's root by default, and may be written before the
 * cache first uses the root. Whatever a writer puts there, also what it leaves when it is killed
 * between creating a file and renaming it, must not make the root a stranger's to the cache (it
 * would then work in memory only, for good). */
START_TEST(db_writer_names_leave_the_cache_root_usable) {
  char dir[1024], root[1100], db[1200];
  rlk_test_mkdtemp(dir, sizeof dir, "tune-root");
  snprintf(root, sizeof root, "%s/root", dir);
  snprintf(db, sizeof db, "%s/tune.db", root);
  ck_assert_int_eq(mkdir(root, 0700), 0);
  rlk_device_info info;
  host_info(&info);
  const int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ck_assert_int_ge(in, 0);
  ck_assert_int_ge(inotify_add_watch(in, root, IN_CREATE | IN_MOVED_TO), 0);
  /* the database, its lock, and the pending list it settles */
  rlk_tune_record r = make_record("logprob pass=fwd logits=f32 vocab=90 tokens=8", &info, "", 1, 1);
  ck_assert_int_eq(rlk_tune_pending_add(db, &r, 1.0), RLK_OK);
  ck_assert_int_eq(rlk_tune_db_record(db, &r, 1), RLK_OK);
  char names[16][256];
  int n = 0;
  union {
    struct inotify_event ev;
    char bytes[sizeof(struct inotify_event) + 512];
  } buf;
  for (ssize_t got; (got = read(in, buf.bytes, sizeof buf.bytes)) > 0;)
    for (char *p = buf.bytes; p < buf.bytes + got;) {
      const struct inotify_event *ev = (const struct inotify_event *)(void *)p;
      if (ev->len && n < 16) snprintf(names[n++], sizeof names[0], "%s", ev->name);
      p += sizeof *ev + ev->len;
    }
  close(in);
  ck_assert_int_ge(n, 4); /* tune.db.lock, the pending list, the two temporary files */
  for (int i = 0; i < n; i++) {
    char fresh[1200], file[1500];
    snprintf(fresh, sizeof fresh, "%s/fresh-%d", dir, i);
    snprintf(file, sizeof file, "%s/%s", fresh, names[i]);
    ck_assert_int_eq(mkdir(fresh, 0700), 0);
    write_text(file, "x", 1);
    rlk_context_options o;
    rlk_context_options_init(&o);
    o.backend = RLK_BACKEND_HOST;
    o.cache_dir = fresh;
    rlk_context *ctx = NULL;
    ck_assert_msg(rlk_context_create(&ctx, &o) == RLK_OK, "%s", rlk_last_error());
    ck_assert_msg(rlk_context_cache_dir(ctx)[0] != '\0',
                  "a root holding only '%s', which a tuning database writer made, is not the cache's", names[i]);
    rlk_context_destroy(ctx);
  }
}
END_TEST

/* ---- concurrent writers --------------------------------------------------------------- */

/* What the racing writers share: the database, the environment of their records and how many
 * each writes. */
typedef struct race_db {
  const char *db;
  const rlk_device_info *info;
  int records;
} race_db;

/* Writer p (rlk_test_race_children's child): its records, one per write, so that the writers'
 * read-merge-writes interleave. */
static int write_records_one_by_one(int p, const void *arg) {
  const race_db *w = arg;
  for (int k = 0; k < w->records; k++) {
    char cfg[128];
    snprintf(cfg, sizeof cfg, "logprob pass=fwd vocab=%d tokens=%d", 1000 + p, 1 << k);
    rlk_tune_record r;
    rlk_tune_record_init(&r);
    if (rlk_tune_record_set_key(&r, cfg) || rlk_tune_record_set_env(&r, w->info)) return 1;
    r.default_ms = r.best_ms = 1 + p + k;
    if (rlk_tune_db_record(w->db, &r, 1) != RLK_OK) return 2;
  }
  return 0;
}

START_TEST(db_concurrent_writers_keep_every_record) {
  enum { P = 6, K = 15 };
  char db[1100];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-race");
  const race_db w = {db, &info, K};
  rlk_test_race_children(P, write_records_one_by_one, &w, "writer");
  collected *c = walk_clean_db(db, P * K);
  for (int p = 0; p < P; p++)
    for (int k = 0; k < K; k++) {
      char cfg[128];
      snprintf(cfg, sizeof cfg, "logprob pass=fwd vocab=%d tokens=%d", 1000 + p, 1 << k);
      rlk_tune_record key = make_record(cfg, &info, "", 0, 0);
      const rlk_tune_record *got = find_key(c, &key);
      ck_assert_msg(got != NULL, "writer %d lost record %d", p, k);
      ck_assert_double_eq_tol(got->default_ms, 1 + p + k, 1e-9);
    }
  free(c);
}
END_TEST

/* ---- RLK_TUNE and the pending list ---------------------------------------------------- */

static int count_pending(const char *db, const char *shape_part) {
  collected *c = calloc(1, sizeof *c);
  ck_assert(c);
  ck_assert_int_eq(rlk_tune_pending_walk(db, collect, c, NULL), RLK_OK);
  int n = 0;
  for (int i = 0; i < c->n; i++) n += strstr(c->v[i].shape, shape_part) != NULL;
  free(c);
  return n;
}

START_TEST(tune_modes_and_pending_list) {
  char db[1100], pending[1200];
  fresh_db(db, sizeof db, "tune-modes");
  snprintf(pending, sizeof pending, "%s.pending", db);
  rlk_device_info info;
  host_info(&info);
  rlk_tune_record rec = make_record("logprob pass=fwd logits=f32 vocab=64 tokens=8", &info,
                                    "variant=vec block=512 unroll=8", 1, 0.5);
  ck_assert_int_eq(rlk_tune_db_record(db, &rec, 1), RLK_OK);
  host_call h;
  host_call_make(&h, 8, 64, rlk_test_seed());
  char settings[128];
  int found = 0;
  uint64_t hits = 0, misses = 0;

  /* use (the default): calls consult the database and write nothing */
  rlk_context *ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK);
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits, 1);
  ck_assert_int_eq(host_fwd(ctx, &h, 1, 0), RLK_OK); /* entropy: another shape, no record */
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits, 1);
  ck_assert_uint_eq(misses, 1);
  rlk_context_destroy(ctx);
  ck_assert_int_ne(access(pending, F_OK), 0);

  /* off: the database is never read */
  setenv("RLK_TUNE", "off", 1);
  ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK);
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits + misses, 0);
  ck_assert_int_eq(rlk_tune_lookup(ctx, "logprob pass=fwd logits=f32 vocab=64 tokens=8", settings,
                                   sizeof settings, &found),
                   RLK_OK);
  ck_assert_int_eq(found, 0);
  rlk_context_destroy(ctx);

  /* tune: a miss joins the pending list once, however many calls and contexts make it */
  setenv("RLK_TUNE", "tune", 1);
  for (int k = 0; k < 2; k++) {
    ctx = rlk_test_host_context();
    for (int i = 0; i < 3; i++) {
      ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK); /* a hit: not pending */
      ck_assert_int_eq(host_fwd(ctx, &h, 1, 0), RLK_OK); /* fwd + entropy: a miss */
      ck_assert_int_eq(host_bwd(ctx, &h), RLK_OK);       /* bwd: a miss */
    }
    ck_assert_int_eq(rlk_tune_lookup(ctx, "logprob pass=fwd logits=f32 vocab=999 tokens=100", settings,
                                     sizeof settings, &found),
                     RLK_OK);
    tune_counts(ctx, &hits, &misses);
    ck_assert_uint_eq(hits, 3);
    rlk_context_destroy(ctx);
  }
  ck_assert_int_eq(count_pending(db, "pass=fwd logits=f32 labels=i64 entropy=1 vocab=64"), 1);
  ck_assert_int_eq(count_pending(db, "pass=bwd logits=f32 labels=i64 entropy=0 grad=same vocab=64"), 1);
  ck_assert_int_eq(count_pending(db, "vocab=999"), 1);
  ck_assert_int_eq(count_pending(db, "entropy=0 vocab=64"), 0); /* it had a record */
  collected *c = calloc(1, sizeof *c);
  ck_assert_int_eq(rlk_tune_pending_walk(db, collect, c, NULL), RLK_OK);
  ck_assert_int_eq(c->n, 3);
  for (int i = 0; i < c->n; i++) {
    ck_assert_str_eq(c->v[i].target, info.target);
    ck_assert_str_eq(c->v[i].device, info.name);
    ck_assert_int_eq(c->v[i].tokens, 8 + (strstr(c->v[i].shape, "vocab=999") ? 120 : 0));
  }
  /* recording a key takes it off the pending list */
  rlk_tune_record done = c->v[0];
  done.default_ms = done.best_ms = 1;
  ck_assert_int_eq(rlk_tune_db_record(db, &done, 1), RLK_OK);
  free(c);
  c = calloc(1, sizeof *c);
  ck_assert_int_eq(rlk_tune_pending_walk(db, collect, c, NULL), RLK_OK);
  ck_assert_int_eq(c->n, 2);
  free(c);
  /* an unknown mode is "use" */
  setenv("RLK_TUNE", "sometimes", 1);
  ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK);
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits, 1);
  rlk_context_destroy(ctx);
  unsetenv("RLK_TUNE");
  host_call_free(&h);
}
END_TEST

/* The database is read once per context: a hit after that touches no file. */
START_TEST(db_read_once_per_context) {
  char db[1100];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-once");
  const char *line = "logprob pass=fwd logits=f32 vocab=64 tokens=8";
  rlk_tune_record rec = make_record(line, &info, "variant=vec block=256 unroll=2", 1, 0.5);
  ck_assert_int_eq(rlk_tune_db_record(db, &rec, 1), RLK_OK);
  rlk_context *ctx = rlk_test_host_context();
  char settings[128];
  int found = 0;
  ck_assert_int_eq(rlk_tune_lookup(ctx, line, settings, sizeof settings, &found), RLK_OK);
  ck_assert_int_eq(found, 1);
  unlink(db); /* gone: the context still has it */
  ck_assert_int_eq(rlk_tune_lookup(ctx, line, settings, sizeof settings, &found), RLK_OK);
  ck_assert_int_eq(found, 1);
  /* ... and a hit costs far less than reading a file would (timed loosely: sanitizers are slow) */
  host_call h;
  host_call_make(&h, 1, 8, 3);
  rlk_context_destroy(ctx);
  ck_assert_int_eq(rlk_tune_db_record(db, &rec, 1), RLK_OK);
  char small[128];
  snprintf(small, sizeof small, "logprob pass=fwd logits=f32 vocab=8 tokens=1");
  rec = make_record(small, &info, "variant=vec block=256 unroll=2", 1, 0.5);
  ck_assert_int_eq(rlk_tune_db_record(db, &rec, 1), RLK_OK);
  ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK);
  const int n = 20000;
  double t0 = now_s();
  for (int i = 0; i < n; i++) ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK);
  const double tuned = (now_s() - t0) / n;
  uint64_t hits = 0, misses = 0;
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits, (uint64_t)n + 1);
  rlk_context_destroy(ctx);
  setenv("RLK_TUNE", "off", 1);
  ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK);
  t0 = now_s();
  for (int i = 0; i < n; i++) ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK);
  const double plain = (now_s() - t0) / n;
  rlk_context_destroy(ctx);
  unsetenv("RLK_TUNE");
  printf("tune: a 1 x 8 host logprob call takes %.3f us with a database hit, %.3f us with RLK_TUNE=off\n",
         tuned * 1e6, plain * 1e6);
  ck_assert_msg(tuned - plain < 20e-6, "a database hit adds %.2f us to a call", (tuned - plain) * 1e6);
  host_call_free(&h);
}
END_TEST

/* ---- variant selection ---------------------------------------------------------------- */

/* On the host every tuning setting falls back to the one host kernel, so what is visible is
 * the lookup itself: a call without tuning of its own consults the database (and finds the
 * record of its pass, shape and bucket), a call with tuning or RLK_LOGPROB_VARIANT does not, and
 * the results are those of the default. */
START_TEST(selection_on_the_host) {
  char db[1100];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-sel");
  rlk_tune_record r[2] = {
      make_record("logprob pass=fwd logits=f32 vocab=300 tokens=37", &info, "variant=vec block=512 unroll=8", 1, 0.5),
      make_record("logprob pass=bwd logits=f32 vocab=300 tokens=37", &info, "variant=vec block=1024 unroll=2", 1, 0.5)};
  ck_assert_int_eq(r[0].tokens, 32);
  ck_assert_int_eq(rlk_tune_db_record(db, r, 2), RLK_OK);
  host_call h;
  host_call_make(&h, 37, 300, rlk_test_seed());
  rlk_context *ctx = rlk_test_host_context();
  uint64_t hits = 0, misses = 0;
  ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK);
  ck_assert_int_eq(host_bwd(ctx, &h), RLK_OK);
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits, 2);
  ck_assert_uint_eq(misses, 0);
  float *logp = malloc(37 * sizeof(float)), *grad = malloc(37 * 300 * sizeof(float));
  memcpy(logp, h.logp, 37 * sizeof(float));
  memcpy(grad, h.grad, 37 * 300 * sizeof(float));
  ck_assert_int_eq(host_fwd(ctx, &h, 0, 256), RLK_OK); /* tuning of its own: no lookup */
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits + misses, 2);
  rlk_context_destroy(ctx);
  /* the same results without the database */
  setenv("RLK_TUNE", "off", 1);
  ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK);
  ck_assert_int_eq(host_bwd(ctx, &h), RLK_OK);
  ck_assert_int_eq(memcmp(logp, h.logp, 37 * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(grad, h.grad, 37 * 300 * sizeof(float)), 0);
  rlk_context_destroy(ctx);
  unsetenv("RLK_TUNE");
  free(logp);
  free(grad);
  host_call_free(&h);
}
END_TEST

/* RLK_LOGPROB_VARIANT is a request of its own: with it set, calls do not consult the database.
 * (It is read once per process; Check runs each test in a process of its own.) */
START_TEST(variant_override_skips_the_database) {
  char db[1100];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-env-variant");
  rlk_tune_record r = make_record("logprob pass=fwd logits=f32 vocab=64 tokens=8", &info, "variant=vec block=512", 1, 1);
  ck_assert_int_eq(rlk_tune_db_record(db, &r, 1), RLK_OK);
  setenv("RLK_LOGPROB_VARIANT", "vec", 1);
  host_call h;
  host_call_make(&h, 8, 64, 11);
  rlk_context *ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h, 0, 0), RLK_OK);
  uint64_t hits = 1, misses = 1;
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits + misses, 0);
  rlk_context_destroy(ctx);
  host_call_free(&h);
  unsetenv("RLK_LOGPROB_VARIANT");
}
END_TEST

/* In a child: calls through a record whose winner cannot run; exit 0 when they all work. */
static int call_unusable_winner(void *arg) {
  (void)arg;
  rlk_context *ctx = rlk_test_child_host_context(NULL);
  if (!ctx) return 2;
  host_call h;
  host_call_make(&h, 8, 64, 5);
  for (int i = 0; i < 4; i++)
    if (host_fwd(ctx, &h, 0, 0) != RLK_OK || host_fwd(ctx, &h, 1, 0) != RLK_OK) return 3;
  host_call_free(&h);
  rlk_context_destroy(ctx);
  return 0;
}

START_TEST(unusable_winner_warns_once_and_runs_the_default) {
  char db[1100];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-unusable");
  rlk_tune_record r[2] = {
      /* not a power of two: the vector kernel refuses it */
      make_record("logprob pass=fwd logits=f32 vocab=64 tokens=8", &info, "variant=vec block=48", 1, 0.5),
      /* not logprob tuning at all */
      make_record("logprob pass=fwd logits=f32 vocab=64 entropy=1 tokens=8", &info, "colour=blue", 1, 0.5)};
  ck_assert_int_eq(rlk_tune_db_record(db, r, 2), RLK_OK);
  int status = -1;
  char *err = capture_stderr(call_unusable_winner, NULL, &status);
  ck_assert_msg(status == 0, "calls failed (%d):\n%s", status, err);
  ck_assert_msg(rlk_test_count_lines(err, "rlk warn") == 2, "expected one warning per record:\n%s", err);
  ck_assert_int_eq(rlk_test_count_lines(err, "block=48"), 1);
  ck_assert_int_eq(rlk_test_count_lines(err, "colour=blue"), 1);
  free(err);
}
END_TEST

/* The kernels a plan line builds, through the op's own plan (the selection a call makes). */
static size_t plan_op(const rlk_op_desc *d, rlk_context *ctx, const char *settings, rlk_kernel_spec *specs) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", settings);
  rlk_op_config_pair pairs[RLK_OP_CONFIG_MAX_PAIRS];
  size_t np = 0, n = 0;
  char *save = NULL;
  for (char *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
    char *eq = strchr(t, '=');
    ck_assert_ptr_nonnull(eq);
    *eq = '\0';
    pairs[np].name = t;
    pairs[np].value = eq + 1;
    np++;
  }
  rlk_status st = rlk_op_plan(d, ctx, np, pairs, specs, &n);
  ck_assert_msg(st == RLK_OK, "%s: %s", settings, rlk_last_error());
  return n;
}

static size_t plan(rlk_context *ctx, const char *settings, rlk_kernel_spec *specs) {
  return plan_op(&rlk_op_logprob, ctx, settings, specs);
}

static void keys_of(rlk_context *ctx, const char *line, char *keys, size_t size) {
  int n = 0;
  rlk_status st = rlk_precompile_keys(ctx, line, keys, size, &n);
  ck_assert_msg(st == RLK_OK && n > 0, "%s: %s", line, rlk_last_error());
}

/* On sm_90a the settings change the kernels: a record's winner is what the selection builds
 * (the plan, which is what a call runs), for its bucket only; plan keys with tokens= equal the
 * keys of the winner's explicit settings. */
START_TEST(selection_changes_the_kernels_on_sm90a) {
  static const record_row rows[] = {
      {"logprob pass=fwd logits=bf16 labels=i64 entropy=1 vocab=151936", 16384,
       "variant=bulk block=256 unroll=8 stages=3", 1.4, 1.2},
      {"logprob pass=bwd logits=bf16 labels=i64 entropy=0 vocab=151936", 4096, "variant=vec block=1024 unroll=2", 2.8,
       2.7}};
  const char *fwd = rows[0].key;
  char line[512];
  rlk_context_options o;
  rlk_context *ctx = sm90a_context_over(&o, rows, 2, "tune-sm90", "selection on sm_90a");
  if (!ctx) return;
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  /* the default, and the winner for 16384 rows (and 12000: the same bucket) */
  ck_assert_uint_eq(plan(ctx, "pass=fwd entropy=1", specs), 1);
  ck_assert_str_eq(specs[0].tmpl->entry, "logprob_fwd");
  ck_assert_uint_eq(plan(ctx, "pass=fwd entropy=1 tokens=4096", specs), 1);
  ck_assert_str_eq(specs[0].tmpl->entry, "logprob_fwd");
  for (int k = 0; k < 2; k++) {
    ck_assert_uint_eq(plan(ctx, k ? "pass=fwd entropy=1 tokens=12000" : "pass=fwd entropy=1 tokens=16384", specs), 1);
    ck_assert_str_eq(specs[0].tmpl->entry, "logprob_fwd_bulk");
    ck_assert_int_eq(specs[0].values[2], 8); /* consumer warps = block / 32 */
    ck_assert_int_eq(specs[0].values[3], 8); /* unroll */
    ck_assert_int_eq(specs[0].values[4], 3); /* stages */
  }
  /* a call's own tuning wins over the database */
  ck_assert_uint_eq(plan(ctx, "pass=fwd entropy=1 tokens=16384 variant=vec", specs), 1);
  ck_assert_str_eq(specs[0].tmpl->entry, "logprob_fwd");
  /* the backward's winner */
  ck_assert_uint_eq(plan(ctx, "pass=bwd tokens=4096", specs), 1);
  ck_assert_str_eq(specs[0].tmpl->entry, "logprob_bwd");
  ck_assert_int_eq(specs[0].values[3], 1024); /* block */
  ck_assert_int_eq(specs[0].values[5], 2);    /* unroll */
  /* keys: tokens= through the database equals the winner's explicit settings */
  char tuned[512], explicit_[512], deflt[512];
  snprintf(line, sizeof line, "%s tokens=16384", fwd);
  keys_of(ctx, line, tuned, sizeof tuned);
  snprintf(line, sizeof line, "%s %s", fwd, rows[0].winner);
  keys_of(ctx, line, explicit_, sizeof explicit_);
  keys_of(ctx, fwd, deflt, sizeof deflt);
  ck_assert_str_eq(tuned, explicit_);
  ck_assert_str_ne(tuned, deflt);
  ck_assert_uint_eq(strlen(tuned), 64);
  ck_assert_int_eq(rlk_precompile_keys(ctx, fwd, tuned, 10, NULL), RLK_ERR_INVALID_ARGUMENT);
  rlk_context_destroy(ctx);
  /* RLK_TUNE=off: the defaults */
  setenv("RLK_TUNE", "off", 1);
  ck_assert_int_eq(rlk_context_create(&ctx, &o), RLK_OK);
  snprintf(line, sizeof line, "%s tokens=16384", fwd);
  keys_of(ctx, line, tuned, sizeof tuned);
  ck_assert_str_eq(tuned, deflt);
  rlk_context_destroy(ctx);
  unsetenv("RLK_TUNE");
}
END_TEST


/* prefix_attention's keys (its heads and the layout's bucketed means) and, on sm_90a, a
 * record's winner as the plan of a line naming the whole key: the variant and the ring depths
 * that fit, for its bucket only. */
START_TEST(prefix_attention_keys_and_selection_on_sm90a) {
  static const record_row rows[] = {
      {"prefix_attention pass=fwd dtype=bf16 head_dim=128 q_heads=32 kv_heads=8 group=16 prefix=4096 response=512",
       65536, "fwd_stages=3", 1.4, 1.3},
      {"prefix_attention pass=bwd dtype=bf16 head_dim=64 q_heads=32 kv_heads=8 group=16 prefix=4096 response=512",
       65536, "dkdv_stages=2 dq_stages=4", 5.0, 4.8}};
  const char *key = rows[0].key;
  expect_key("prefix_attention response=500 prefix=3000 group=13 kv_heads=8 q_heads=32 tokens=70000 pass=fwd",
             "prefix_attention", key + strlen("prefix_attention "), 65536);
  static const refused_key bad[] = {{"prefix_attention pass=both q_heads=8 kv_heads=8 group=1 prefix=1 response=1 tokens=2", "pass"},
             {"prefix_attention pass=fwd q_heads=8 kv_heads=8 group=1 prefix=1 tokens=2", "response"},
             {"prefix_attention pass=fwd q_heads=8 kv_heads=3 group=1 prefix=1 response=1 tokens=2", "multiple"},
             {"prefix_attention pass=bwd q_heads=8 kv_heads=8 group=1 prefix=1 response=1 tokens=2 dq_stages=2",
              "tuning"},
             {"prefix_attention pass=fwd q_heads=8 kv_heads=8 group=1 prefix=1 response=1 tokens=2 variant=mma",
              "tuning"}};
  expect_refused_keys(bad, sizeof bad / sizeof bad[0]);
  ck_assert_int_ge(rlk_test_count_lines(rlk_tune_candidates("prefix_attention"), "stages="), 4);

  rlk_context_options o;
  rlk_context *ctx = sm90a_context_over(&o, rows, 2, "tune-pa-sm90", "prefix_attention selection on sm_90a");
  if (!ctx) return;
  char line[512];
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  const char *problem = "q_heads=32 kv_heads=8 group=16 prefix=4096 response=512";
  /* the default: two K/V stages; the winner for the bucket: three */
  ck_assert_uint_eq(plan_op(&rlk_op_prefix_attention, ctx, "pass=fwd", specs), 1);
  ck_assert_str_eq(specs[0].tmpl->entry, "pattn_fwd_sm90");
  ck_assert_int_eq(specs[0].values[2], 2);
  snprintf(line, sizeof line, "pass=fwd %s tokens=60000", problem);
  ck_assert_uint_eq(plan_op(&rlk_op_prefix_attention, ctx, line, specs), 1);
  ck_assert_int_eq(specs[0].values[2], 3);
  snprintf(line, sizeof line, "pass=fwd %s tokens=16384", problem); /* another bucket */
  ck_assert_uint_eq(plan_op(&rlk_op_prefix_attention, ctx, line, specs), 1);
  ck_assert_int_eq(specs[0].values[2], 2);
  /* a line's own tuning wins over the database; a depth that does not fit runs the default */
  snprintf(line, sizeof line, "pass=fwd %s tokens=65536 fwd_stages=4", problem);
  ck_assert_uint_eq(plan_op(&rlk_op_prefix_attention, ctx, line, specs), 1);
  ck_assert_int_eq(specs[0].values[2], 2); /* 4 x 64 KB of K/V and the Q tile: over 227 KB at D 128 */
  ck_assert_uint_eq(plan_op(&rlk_op_prefix_attention, ctx, "pass=fwd head_dim=64 fwd_stages=4", specs), 1);
  ck_assert_int_eq(specs[0].values[2], 4);
  snprintf(line, sizeof line, "pass=fwd %s tokens=65536 variant=mma", problem);
  ck_assert_uint_eq(plan_op(&rlk_op_prefix_attention, ctx, line, specs), 1);
  ck_assert_str_eq(specs[0].tmpl->entry, "pattn_fwd_mma");
  /* the backward's winner: dk/dv with two Q/dO stages, dq with four */
  snprintf(line, sizeof line, "pass=bwd head_dim=64 %s tokens=65536", problem);
  ck_assert_uint_eq(plan_op(&rlk_op_prefix_attention, ctx, line, specs), 2);
  ck_assert_str_eq(specs[0].tmpl->entry, "pattn_bwd_dq_sm90");
  ck_assert_int_eq(specs[0].values[2], 4);
  ck_assert_str_eq(specs[1].tmpl->entry, "pattn_bwd_dkdv_sm90");
  ck_assert_int_eq(specs[1].values[2], 2);
  ck_assert_uint_eq(plan_op(&rlk_op_prefix_attention, ctx, "pass=bwd head_dim=64", specs), 2);
  ck_assert_int_eq(specs[0].values[2], 3);
  ck_assert_int_eq(specs[1].values[2], 4);
  rlk_context_destroy(ctx);
}
END_TEST

/* linear_logprob's keys (dtypes, H and V; the backward's gradient dtype) and, on sm_90a, a
 * record's winner: the forward's ring depth as the plan of a line naming the whole key, the
 * backward's chunk in the workspace a call asks for, for the record's bucket only. */
START_TEST(linear_logprob_keys_and_selection_on_sm90a) {
  static const record_row rows[] = {
      {"linear_logprob pass=fwd hidden=bf16 labels=i64 entropy=1 hidden_size=4096 vocab=151936", 8192, "stages=3",
       14.0, 13.5},
      {"linear_logprob pass=bwd hidden=bf16 labels=i64 entropy=1 grad=same hidden_size=4096 vocab=151936", 8192,
       "chunk=8192 group=16", 50.0, 48.0}};
  const char *fkey = rows[0].key;
  expect_key("linear_logprob vocab=151936 tokens=9000 entropy=1 hidden_size=4096 pass=fwd", "linear_logprob",
             fkey + strlen("linear_logprob "), 8192);
  expect_key("linear_logprob pass=bwd grad=same hidden_size=896 vocab=32000 tokens=4096", "linear_logprob",
             "pass=bwd hidden=bf16 labels=i64 entropy=0 grad=same hidden_size=896 vocab=32000", 4096);
  static const refused_key bad[] = {{"linear_logprob pass=both hidden_size=8 vocab=9 tokens=2", "pass"},
             {"linear_logprob pass=fwd hidden_size=8 tokens=2", "vocab"},
             {"linear_logprob pass=fwd hidden_size=8 vocab=9 tokens=2 stages=3", "tuning"},
             {"linear_logprob pass=bwd hidden_size=8 vocab=9 tokens=2 group=4", "tuning"},
             {"linear_logprob pass=fwd hidden_size=8 vocab=9 tokens=2 variant=tiled", "variant"}};
  expect_refused_keys(bad, sizeof bad / sizeof bad[0]);
  ck_assert_int_ge(rlk_test_count_lines(rlk_tune_candidates("linear_logprob"), "stages="), 2);
  ck_assert_int_ge(rlk_test_count_lines(rlk_tune_candidates("linear_logprob"), "group="), 2);

  rlk_context_options o;
  rlk_context *ctx = sm90a_context_over(&o, rows, 2, "tune-ll-sm90", "linear_logprob selection on sm_90a");
  if (!ctx) return;
  char line[512];
  /* what changes its calls but not its kernels here */
  ck_assert_str_eq(rlk_tune_runtime_settings(ctx, "linear_logprob pass=bwd hidden=f16"), "chunk group");
  ck_assert_str_eq(rlk_tune_runtime_settings(ctx, "linear_logprob pass=bwd variant=tiled"), "chunk");
  ck_assert_str_eq(rlk_tune_runtime_settings(ctx, "linear_logprob pass=fwd"), "splits");
  ck_assert_str_eq(rlk_tune_runtime_settings(ctx, "linear_logprob pass=sideways"), "");
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  /* the forward: four stages by default, the winner's three for the key's bucket */
  ck_assert_uint_ge(plan_op(&rlk_op_linear_logprob, ctx, "pass=fwd entropy=1", specs), 1);
  ck_assert_str_eq(specs[0].tmpl->entry, "linear_logprob_fwd_sm90");
  ck_assert_int_eq(specs[0].values[2], 4);
  const char *problem = "hidden_size=4096 vocab=151936";
  snprintf(line, sizeof line, "pass=fwd entropy=1 %s tokens=8000", problem);
  ck_assert_uint_ge(plan_op(&rlk_op_linear_logprob, ctx, line, specs), 1);
  ck_assert_int_eq(specs[0].values[2], 3);
  snprintf(line, sizeof line, "pass=fwd entropy=1 %s tokens=1024", problem); /* another bucket */
  ck_assert_uint_ge(plan_op(&rlk_op_linear_logprob, ctx, line, specs), 1);
  ck_assert_int_eq(specs[0].values[2], 4);
  snprintf(line, sizeof line, "pass=fwd entropy=1 %s tokens=8192 stages=2", problem); /* the line's own */
  ck_assert_uint_ge(plan_op(&rlk_op_linear_logprob, ctx, line, specs), 1);
  ck_assert_int_eq(specs[0].values[2], 2);

  /* the backward: the winner's chunk sizes the workspace (dz of 8192 columns, 16-bit, and the
   * f32 grad_hidden sum), a call's own chunk wins, another bucket has the default's */
  static _Alignas(256) unsigned char fake[256];
  rlk_linear_logprob_backward_args b;
  rlk_linear_logprob_backward_args_init(&b);
  const int64_t N = 8192, H = 4096, V = 151936;
  b.hidden = rlk_tensor_2d(fake, RLK_BF16, N, H, H);
  b.weight = rlk_tensor_2d(fake, RLK_BF16, V, H, H);
  b.labels = rlk_tensor_1d(fake, RLK_I64, N);
  b.lse = rlk_tensor_1d(fake, RLK_F32, N);
  b.grad_logp = rlk_tensor_1d(fake, RLK_F32, N);
  b.grad_entropy = rlk_tensor_1d(fake, RLK_F32, N);
  b.entropy = rlk_tensor_1d(fake, RLK_F32, N);
  b.grad_hidden = rlk_tensor_2d(fake, RLK_BF16, N, H, H);
  b.grad_weight = rlk_tensor_2d(fake, RLK_BF16, V, H, H);
  size_t bytes = 0;
  const size_t dh = (size_t)(N * H) * 4;
  ck_assert_int_eq(rlk_linear_logprob_backward_workspace_size(ctx, &b, &bytes), RLK_OK);
  ck_assert_uint_eq(bytes, dh + (size_t)(N * 8192) * 2);
  b.chunk = 1024;
  ck_assert_int_eq(rlk_linear_logprob_backward_workspace_size(ctx, &b, &bytes), RLK_OK);
  ck_assert_uint_eq(bytes, dh + (size_t)(N * 1024) * 2);
  b.chunk = 0;
  b.group = 4; /* a setting of the call's own: no database */
  ck_assert_int_eq(rlk_linear_logprob_backward_workspace_size(ctx, &b, &bytes), RLK_OK);
  /* the call's choice: the sum and dz within 288 MiB, 15 chunks of 10240 columns */
  ck_assert_uint_eq(bytes, dh + (size_t)(N * 10240) * 2);
  ck_assert_uint_eq(bytes, (size_t)288 << 20);
  /* an f32 grad_hidden holds its own sum: dz alone, 9 chunks of 16896 (not 8 of 18432 and a
   * short one) */
  b.grad_hidden.dtype = RLK_F32;
  ck_assert_int_eq(rlk_linear_logprob_backward_workspace_size(ctx, &b, &bytes), RLK_OK);
  ck_assert_uint_eq(bytes, (size_t)(N * 16896) * 2);
  b.grad_hidden.dtype = RLK_BF16;
  b.group = 0;
  b.hidden.shape[0] = b.labels.shape[0] = b.lse.shape[0] = b.grad_logp.shape[0] = 2048;
  b.grad_entropy.shape[0] = b.entropy.shape[0] = b.grad_hidden.shape[0] = 2048;
  ck_assert_int_eq(rlk_linear_logprob_backward_workspace_size(ctx, &b, &bytes), RLK_OK);
  ck_assert_uint_eq(bytes, (size_t)(2048 * H) * 4 + (size_t)2048 * 50688 * 2); /* 3 chunks */
  rlk_context_destroy(ctx);
}
END_TEST

/* ---- the tools: rlk-tune, and rlk-precompile --tune-db -------------------------------- */

static int count_entry(const rlk_cache_entry *e, void *user) {
  (void)e;
  ++*(int *)user;
  return 0;
}

/* Committed entries of a cache tree (0 for a tree that does not exist). */
static int cache_entries(const char *root) {
  int n = 0;
  if (access(root, F_OK) == 0) ck_assert_int_eq(rlk_cache_walk(root, count_entry, &n), RLK_OK);
  return n;
}

START_TEST(rlk_tune_usage_and_dry_run) {
  const struct {
    const char *const *args;
    const char *names;
  } bad[] = {
      {ARGS("--no-such-option"), "--no-such-option"},
      {ARGS("--backend", "quantum"), "quantum"},
      {ARGS("--vocab", "100"), "--op"},
      {ARGS("--op", "logprob", "--vocab", "100"), "tokens"},
      {ARGS("--op", "logprob", "--tokens", "8", "--dtype", "f64"), "logits"},
      {ARGS("--sweep", "group_advantage mode=grpo tokens=4"), "no tuning candidates"},
      {ARGS("--sweep", "logprob pass=fwd tokens=8 block=256"), "tuning"},
      {ARGS("--iters", "0", "--op", "logprob", "--tokens", "8"), "--iters"},
      {ARGS("--min-gain", "x"), "--min-gain"},
      {ARGS("--min-gain", "", "--op", "logprob", "--tokens", "8"), "--min-gain"},
      {ARGS("--min-gain", "0x5", "--op", "logprob", "--tokens", "8"), "--min-gain"},
      {ARGS("--min-gain", " 5", "--op", "logprob", "--tokens", "8"), "--min-gain"},
      {(const char *const[]){NULL}, "nothing to tune"},
      {ARGS("--config", "/nonexistent/sweep.conf"), "/nonexistent/sweep.conf"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-tune", bad[i].args);
    expect_status(r, 2, bad[i].names);
    ck_assert_msg(strstr(r.out, bad[i].names) != NULL, "the message does not name %s:\n%s", bad[i].names, r.out);
    rlk_test_tool_free(&r);
  }
  /* rlk-precompile's database options */
  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-precompile", ARGS("--tune-all-envs", "--sweep", "logprob", "--targets", "host"));
  expect_status(r, 2, "rlk-precompile --tune-all-envs without --tune-db");
  ck_assert_ptr_nonnull(strstr(r.out, "--tune-db"));
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-precompile", ARGS("--tune-db", "/nonexistent/tune.db"));
  expect_status(r, 2, "rlk-precompile --tune-db of a missing file");
  ck_assert_ptr_nonnull(strstr(r.out, "/nonexistent/tune.db"));
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-tune", ARGS("--help"));
  expect_status(r, 0, "rlk-tune --help");
  ck_assert_ptr_nonnull(strstr(r.out, "usage:"));
  rlk_test_tool_free(&r);
  r = rlk_test_run_tool(NULL, "rlk-tune", ARGS("--list-candidates"));
  expect_status(r, 0, "rlk-tune --list-candidates");
  ck_assert_int_eq(rlk_test_count_lines(r.out, "variant="), rlk_test_count_lines(rlk_tune_candidates("logprob"), "variant=") +
                                                                rlk_test_count_lines(rlk_tune_candidates("prefix_attention"), "variant="));
  rlk_test_tool_free(&r);

  /* a dry run on the host: 2 vocabularies x 2 buckets (64 and 70 rows share one) x 2 entropy x 2
   * passes; nothing compiled, timed or written */
  char dir[1024], cache[1100], db[1100], cache_env[1200], conf[1100];
  rlk_test_mkdtemp(dir, sizeof dir, "tune-dry");
  snprintf(cache, sizeof cache, "%s/cache", dir);
  snprintf(db, sizeof db, "%s/tune.db", dir);
  snprintf(cache_env, sizeof cache_env, "RLK_CACHE_DIR=%s", cache);
  r = rlk_test_run_tool(ENV(cache_env), "rlk-tune",
                        ARGS("--dry-run", "--backend", "host", "--op", "logprob", "--vocab", "1000,2000", "--tokens",
                             "16,64,70", "--dtype", "f32", "--entropy", "0,1", "--db", db));
  expect_status(r, 0, "rlk-tune --dry-run");
  ck_assert_int_eq(rlk_test_last_value(r.out, "dry run: "), 16);
  static const rlk_test_line_count dry_lines[] = {
      {"/16] logprob pass=", 16}, {"/16] logprob pass=bwd", 8}, {"[compile", 0}, {"tokens=70", 0}};
  rlk_test_expect_line_counts(r.out, dry_lines, sizeof dry_lines / sizeof dry_lines[0], "rlk-tune --dry-run");
  /* on the host every candidate plans to the default's one kernel */
  ck_assert_int_eq(rlk_test_count_lines(r.out, "same kernels as the default"),
                   16 * rlk_test_count_lines(rlk_tune_candidates("logprob"), "variant="));
  rlk_test_tool_free(&r);
  ck_assert_int_ne(access(db, F_OK), 0);
  ck_assert_int_eq(cache_entries(cache), 0);

  /* a spec file says the same as flags */
  snprintf(conf, sizeof conf, "%s/sweep.conf", dir);
  write_text(conf, "# bf16 logits\nlogprob pass=fwd logits=bf16 vocab=151936,50257 tokens=4096  # two\n", 79);
  r = rlk_test_run_tool(ENV(cache_env), "rlk-tune", ARGS("-n", "--backend", "host", "--config", conf, "--db", db));
  expect_status(r, 0, "rlk-tune --dry-run --config");
  ck_assert_int_eq(rlk_test_last_value(r.out, "dry run: "), 2);
  rlk_test_tool_free(&r);

  /* without a device, a dry run for a GPU target plans through a compile-only context */
  r = rlk_test_run_tool(ENV(cache_env), "rlk-tune",
                        ARGS("-n", "--backend", "cuda", "--target", "sm_90a", "--op", "logprob", "--tokens", "4096",
                             "--dtype", "bf16", "--db", db));
  if (r.status == 1 && strstr(r.out, "nvrtc")) {
    printf("skip (tune: dry run for sm_90a): no NVRTC:\n%s", r.out);
  } else if (strstr(r.out, "sm_90a (") || strstr(r.out, "(sm_90a,")) {
    expect_status(r, 0, "rlk-tune --dry-run for sm_90a");
    ck_assert_int_eq(rlk_test_last_value(r.out, "dry run: "), 2);
    /* the bulk and tensor-map candidates are forwards only: the backward runs the default for them */
    ck_assert_int_ge(rlk_test_count_lines(r.out, "same kernels as the default"), 8);
    ck_assert_int_ge(rlk_test_count_lines(r.out, "2 kernels, timed"), 2); /* tma and its fallback */
  }
  rlk_test_tool_free(&r);
  ck_assert_int_ne(access(db, F_OK), 0);

  /* --merge under --dry-run says what it would take and writes nothing: no database, no lock */
  char other[1100], lock[1200];
  snprintf(other, sizeof other, "%s/other.db", dir);
  snprintf(lock, sizeof lock, "%s.lock", db);
  rlk_device_info info;
  host_info(&info);
  rlk_tune_record o[2] = {make_record("logprob pass=fwd logits=f32 vocab=64 tokens=8", &info, "variant=vec block=512", 1, 0.9),
                          make_record("logprob pass=fwd logits=f32 vocab=65 tokens=8", &info, "", 1, 1)};
  ck_assert_int_eq(rlk_tune_db_record(other, o, 2), RLK_OK);
  r = rlk_test_run_tool(NULL, "rlk-tune", ARGS("--dry-run", "--merge", other, "--db", db));
  expect_status(r, 0, "rlk-tune --dry-run --merge");
  ck_assert_msg(strstr(r.out, "would take 2 records") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  ck_assert_int_ne(access(db, F_OK), 0);
  ck_assert_int_ne(access(lock, F_OK), 0);
  /* a record of the database created later keeps its key; the file is left as it was */
  rlk_tune_record newer = o[0];
  newer.created = 5000;
  ck_assert_int_eq(rlk_tune_db_record(db, &newer, 1), RLK_OK);
  char *before = read_text(db);
  r = rlk_test_run_tool(NULL, "rlk-tune", ARGS("-n", "--merge", other, "--db", db));
  expect_status(r, 0, "rlk-tune -n --merge into a database");
  ck_assert_msg(strstr(r.out, "would take 1 record;") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  char *after = read_text(db);
  ck_assert_str_eq(after, before);
  free(before);
  free(after);
  /* a file that is no database fails, as the merge would */
  r = rlk_test_run_tool(NULL, "rlk-tune", ARGS("-n", "--merge", conf, "--db", db));
  expect_status(r, 1, "rlk-tune -n --merge of a configuration file");
  ck_assert_msg(strstr(r.out, conf) && strstr(r.out, "not a tuning database"), "%s", r.out);
  rlk_test_tool_free(&r);
  /* ... and rlk-precompile --tune-db refuses it, with or without --json, compiling nothing */
  char tree[1100];
  snprintf(tree, sizeof tree, "%s/tree", dir);
  const char *const *pre[] = {ARGS("--tune-db", conf, "--out", tree),
                              ARGS("--tune-db", conf, "--out", tree, "--json")};
  for (size_t i = 0; i < 2; i++) {
    r = rlk_test_run_tool(NULL, "rlk-precompile", pre[i]);
    expect_status(r, 2, "rlk-precompile --tune-db of a configuration file");
    ck_assert_msg(strstr(r.out, conf) && strstr(r.out, "not a tuning database"), "%s", r.out);
    rlk_test_tool_free(&r);
  }
  ck_assert_int_eq(cache_entries(tree), 0);
  rlk_test_rmtree(dir);
}
END_TEST

START_TEST(rlk_tune_host_run_feeds_calls_and_precompile) {
  char dir[1024], db[1100], json[1100], tree[1100], empty[1100], db_env[1200];
  rlk_test_mkdtemp(dir, sizeof dir, "tune-run");
  snprintf(db, sizeof db, "%s/tune.db", dir);
  snprintf(json, sizeof json, "%s/tune.json", dir);
  snprintf(tree, sizeof tree, "%s/tree", dir);
  snprintf(empty, sizeof empty, "%s/empty", dir);
  snprintf(db_env, sizeof db_env, "RLK_TUNE_DB=%s", db);
  const char *cands = rlk_tune_candidates("logprob");
  const int ncand = rlk_test_count_lines(cands, "variant=");

  rlk_test_tool_run r = rlk_test_run_tool(
      NULL, "rlk-tune",
      ARGS("--backend", "host", "--sweep", "logprob pass=fwd,bwd logits=f32 labels=i64 entropy=1 vocab=1000 tokens=24",
           "--iters", "3", "--warmup", "1", "-j", "2", "--db", db, "--json", json, "--time-duplicates"));
  expect_status(r, 0, "rlk-tune on the host");
  static const rlk_test_line_count host_lines[] = {
      {"[1/2] logprob pass=", 1}, {"[2/2] logprob pass=", 1}, {"default ms", 1} /* the table */, {"FAILED", 0}};
  rlk_test_expect_line_counts(r.out, host_lines, sizeof host_lines / sizeof host_lines[0], "rlk-tune on the host");
  rlk_test_tool_free(&r);
  rlk_device_info info;
  host_info(&info);
  collected *c = walk_clean_db(db, 2);
  for (int i = 0; i < 2; i++) {
    const rlk_tune_record *g = &c->v[i];
    ck_assert_str_eq(g->op, "logprob");
    ck_assert_int_eq(g->tokens, 32);
    ck_assert_str_eq(g->target, info.target);
    ck_assert_str_eq(g->device, info.name);
    ck_assert_int_eq(g->multiprocessors, info.multiprocessors);
    ck_assert_str_eq(g->compiler, info.compiler);
    ck_assert_int_eq(g->ntimings, ncand);
    ck_assert_msg(g->default_ms > 0 && g->best_ms > 0 && g->best_ms <= g->default_ms, "%g %g", g->default_ms,
                  g->best_ms);
    /* on the host every candidate is the default's kernel: timed (--time-duplicates), never a winner */
    ck_assert_str_eq(g->winner, "");
    for (int k = 0; k < g->ntimings; k++) {
      ck_assert_int_eq(g->timings[k].result, RLK_TUNE_TIMED);
      ck_assert_msg(g->timings[k].median_ms > 0, "%s: %g", g->timings[k].settings, g->timings[k].median_ms);
      ck_assert_ptr_nonnull(strstr(cands, g->timings[k].settings));
    }
  }
  ck_assert_ptr_nonnull(strstr(c->v[0].shape, "pass=fwd"));
  ck_assert_ptr_nonnull(strstr(c->v[1].shape, "pass=bwd"));
  free(c);
  char *text = read_text(json);
  ck_assert_ptr_nonnull(text);
  ck_assert_int_eq(rlk_test_count_lines(text, "\"line\": \"logprob pass="), 2);
  ck_assert_int_eq(rlk_test_count_lines(text, "\"result\": \"timed\""), 2 * (ncand + 1));
  free(text);

  /* a later call of that configuration takes its record */
  setenv("RLK_TUNE_DB", db, 1);
  host_call h;
  host_call_make(&h, 24, 1000, rlk_test_seed());
  rlk_context *ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h, 1, 0), RLK_OK);
  ck_assert_int_eq(host_bwd_entropy(ctx, &h, 1), RLK_OK);
  uint64_t hits = 0, misses = 0;
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits, 2);
  ck_assert_uint_eq(misses, 0);
  rlk_context_destroy(ctx);

  /* precompiled from the database, the kernels those calls take are found with RLK_JIT=0 */
  r = rlk_test_run_tool(NULL, "rlk-precompile", ARGS("--tune-db", db, "--out", tree, "-j", "2"));
  expect_status(r, 0, "rlk-precompile --tune-db");
  ck_assert_ptr_nonnull(strstr(r.out, "2 records taken"));
  ck_assert_msg(strstr(r.out, ", 0 failed") != NULL, "%s", r.out);
  rlk_test_tool_free(&r);
  ck_assert_int_eq(mkdir(empty, 0700), 0);
  setenv("RLK_JIT", "0", 1);
  setenv("RLK_CACHE_RO_DIRS", tree, 1);
  setenv("RLK_CACHE_DIR", empty, 1);
  ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h, 1, 0), RLK_OK);
  ck_assert_int_eq(host_bwd_entropy(ctx, &h, 1), RLK_OK);
  rlk_counters cnt;
  ck_assert_int_eq(rlk_context_counters(ctx, &cnt), RLK_OK);
  ck_assert_uint_eq(cnt.compiles, 0);
  ck_assert_uint_eq(cnt.misses, 0);
  ck_assert_uint_eq(cnt.disk_hits, 2);
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits, 2);
  /* ... and RLK_JIT=0 is in force: a kernel the tree lacks is an error */
  ck_assert_int_eq(host_bwd_entropy(ctx, &h, 0), RLK_ERR_JIT_DISABLED);
  rlk_context_destroy(ctx);
  unsetenv("RLK_JIT");
  unsetenv("RLK_CACHE_RO_DIRS");
  char cache[1100];
  snprintf(cache, sizeof cache, "%s/cache", rlk_test_tmpdir());
  setenv("RLK_CACHE_DIR", cache, 1);

  /* RLK_TUNE=tune notes a configuration without a record; rlk-tune --pending sweeps it */
  setenv("RLK_TUNE", "tune", 1);
  host_call h2;
  host_call_make(&h2, 24, 500, rlk_test_seed() + 1);
  ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h2, 0, 0), RLK_OK);
  rlk_context_destroy(ctx);
  unsetenv("RLK_TUNE");
  ck_assert_int_eq(count_pending(db, "vocab=500"), 1);
  r = rlk_test_run_tool(ENV(db_env), "rlk-tune", ARGS("--pending", "--backend", "host", "--iters", "2", "--warmup", "0"));
  expect_status(r, 0, "rlk-tune --pending");
  ck_assert_int_eq(rlk_test_count_lines(r.out, "[1/1] logprob pass=fwd logits=f32 labels=i64 entropy=0 vocab=500"), 1);
  rlk_test_tool_free(&r);
  ck_assert_int_eq(count_pending(db, "vocab="), 0);
  ck_assert_int_eq(db_records(db), 3);
  ctx = rlk_test_host_context();
  ck_assert_int_eq(host_fwd(ctx, &h2, 0, 0), RLK_OK);
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits, 1);
  rlk_context_destroy(ctx);

  /* --list shows the records; --merge takes another database's */
  r = rlk_test_run_tool(ENV(db_env), "rlk-tune", ARGS("--list"));
  expect_status(r, 0, "rlk-tune --list");
  ck_assert_int_eq(rlk_test_count_lines(r.out, "logprob  pass="), 3);
  rlk_test_tool_free(&r);
  char other[1100];
  snprintf(other, sizeof other, "%s/other.db", dir);
  rlk_tune_record o = make_record("logprob pass=fwd logits=f16 vocab=64 tokens=8", &info, "variant=vec block=512", 1, 0.9);
  ck_assert_int_eq(rlk_tune_db_record(other, &o, 1), RLK_OK);
  r = rlk_test_run_tool(ENV(db_env), "rlk-tune", ARGS("--merge", other));
  expect_status(r, 0, "rlk-tune --merge");
  ck_assert_ptr_nonnull(strstr(r.out, "1 record taken"));
  rlk_test_tool_free(&r);
  ck_assert_int_eq(db_records(db), 4);
  host_call_free(&h);
  host_call_free(&h2);
  rlk_test_rmtree(dir);
}
END_TEST

/* Counts a tree's logprob entries for bf16 logits whose parameters hold every one of `params`. */
typedef struct entry_find {
  const char *params[4];
  int found;
} entry_find;

static int find_entry(const rlk_cache_entry *e, void *user) {
  entry_find *f = user;
  int ok = !strcmp(e->family, "logprob") && strstr(e->params, "logits=bf16") != NULL;
  for (int i = 0; i < 4 && f->params[i] && ok; i++) ok = strstr(e->params, f->params[i]) != NULL;
  f->found += ok;
  return 0;
}

/* A cluster ships tuned kernels: precompiled from the database for sm_90a, the winner a plan (a
 * call) takes is in the tree and is found with RLK_JIT=0. */
/* rlk-tune --sweep of `line` (both passes of one problem) on the host into a fresh database
 * (written to db): two records of `op` whose shapes hold `shape` at `tokens`, every candidate
 * timed, none a winner (on the host every candidate runs the default's kernel, and a winner must
 * be 50% faster: the noise of a busy machine never is). */
static void host_sweep(const char *op, const char *line, const char *shape, int64_t tokens, char *db, size_t size) {
  char dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, "tune-sweep");
  snprintf(db, size, "%s/tune.db", dir);
  const int ncand = rlk_test_count_lines(rlk_tune_candidates(op), "=");
  rlk_test_tool_run r = rlk_test_run_tool(NULL, "rlk-tune",
                                          ARGS("--backend", "host", "--sweep", line, "--iters", "2", "--warmup", "1",
                                               "-j", "2", "--db", db, "--time-duplicates", "--min-gain", "50"));
  expect_status(r, 0, line);
  ck_assert_int_eq(rlk_test_count_lines(r.out, "FAILED"), 0);
  rlk_test_tool_free(&r);
  collected *c = walk_clean_db(db, 2);
  for (int i = 0; i < 2; i++) {
    const rlk_tune_record *g = &c->v[i];
    ck_assert_str_eq(g->op, op);
    ck_assert_msg(strstr(g->shape, shape) != NULL, "'%s' lacks '%s'", g->shape, shape);
    ck_assert_int_eq(g->tokens, tokens);
    ck_assert_int_eq(g->ntimings, ncand);
    ck_assert_str_eq(g->winner, "");
    for (int k = 0; k < g->ntimings; k++) ck_assert_int_eq(g->timings[k].result, RLK_TUNE_TIMED);
  }
  free(c);
}

/* rlk-tune times prefix_attention's candidates through its own inputs (on the host every one is
 * the default's kernel), and a call whose layout buckets to the record's key takes the record. */
START_TEST(rlk_tune_host_run_of_prefix_attention) {
  char db[1100];
  host_sweep("prefix_attention",
             "prefix_attention pass=fwd,bwd dtype=bf16 head_dim=64 q_heads=4 kv_heads=2 group=3 prefix=33 response=9 "
             "tokens=120",
             "q_heads=4 kv_heads=2 group=4 prefix=32 response=8", 128, db, sizeof db);

  /* 2 prompts of 30 prefix tokens and 4 responses of 9: the same buckets, 2 hits */
  setenv("RLK_TUNE_DB", db, 1);
  rlk_context *ctx = rlk_test_host_context();
  enum { P = 2, G = 4, LP = 30, LR = 9, T = P * (LP + G * LR), HQ = 4, HKV = 2, D = 64 };
  int32_t seq[P * (G + 1) + 1], grp[P + 1];
  int n = 0, tok = 0;
  seq[0] = 0;
  for (int p = 0; p < P; p++) {
    grp[p] = n;
    for (int g = 0; g <= G; g++) seq[++n] = tok += g ? LR : LP;
  }
  grp[P] = n;
  uint16_t *buf = calloc((size_t)T * (4 * HQ + 4 * HKV) * D, 2); /* q k v out dout dq dk dv */
  ck_assert_ptr_nonnull(buf);
  for (size_t i = 0; i < (size_t)T * (HQ + 2 * HKV) * D; i++) buf[i] = (uint16_t)(0x3c00 + (i * 2654435761u) % 512);
  uint16_t *q = buf, *k = q + T * HQ * D, *v = k + T * HKV * D, *out = v + T * HKV * D, *dout = out + T * HQ * D;
  uint16_t *dq = dout + T * HQ * D, *dk = dq + T * HQ * D, *dv = dk + T * HKV * D;
  for (size_t i = 0; i < (size_t)T * HQ * D; i++) dout[i] = q[i];
  float lse[T * HQ];
  rlk_prefix_attention_layout l = {
      .host_seq_offsets = seq, .host_group_offsets = grp, .num_segments = n, .num_prompts = P};
  rlk_prefix_attention_args a;
  rlk_prefix_attention_args_init(&a);
  a.q = rlk_test_tensor_3d(q, RLK_BF16, T, HQ, D), a.out = rlk_test_tensor_3d(out, RLK_BF16, T, HQ, D);
  a.k = rlk_test_tensor_3d(k, RLK_BF16, T, HKV, D), a.v = rlk_test_tensor_3d(v, RLK_BF16, T, HKV, D);
  a.lse = rlk_tensor_2d(lse, RLK_F32, T, HQ, HQ);
  a.layout = l;
  ck_assert_msg(rlk_prefix_attention(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  rlk_prefix_attention_backward_args b;
  rlk_prefix_attention_backward_args_init(&b);
  b.q = a.q, b.k = a.k, b.v = a.v, b.out = a.out, b.lse = a.lse, b.layout = l;
  b.grad_out = rlk_test_tensor_3d(dout, RLK_BF16, T, HQ, D), b.grad_q = rlk_test_tensor_3d(dq, RLK_BF16, T, HQ, D);
  b.grad_k = rlk_test_tensor_3d(dk, RLK_BF16, T, HKV, D), b.grad_v = rlk_test_tensor_3d(dv, RLK_BF16, T, HKV, D);
  size_t need = 0;
  ck_assert_int_eq(rlk_prefix_attention_backward_workspace_size(ctx, &b, &need), RLK_OK);
  b.workspace = malloc(need);
  b.workspace_bytes = need;
  ck_assert_msg(rlk_prefix_attention_backward(ctx, &b, NULL) == RLK_OK, "%s", rlk_last_error());
  uint64_t hits = 0, misses = 0;
  tune_counts(ctx, &hits, &misses);
  ck_assert_uint_eq(hits, 3); /* the forward, the workspace size and the backward */
  ck_assert_uint_eq(misses, 0);
  rlk_context_destroy(ctx);
  unsetenv("RLK_TUNE_DB");
  free(b.workspace);
  free(buf);
}
END_TEST

START_TEST(precompile_from_the_database_for_sm90a) {
  rlk_context_options o;
  rlk_device_info info;
  if (!sm90a_options(&o, &info, "precompile from the database for sm_90a")) return;
  rlk_context *ctx = NULL;
  char dir[1024], db[1100], tree[1100], empty[1100];
  rlk_test_mkdtemp(dir, sizeof dir, "tune-ship");
  snprintf(db, sizeof db, "%s/tune.db", dir);
  snprintf(tree, sizeof tree, "%s/tree", dir);
  snprintf(empty, sizeof empty, "%s/empty", dir);
  const char *fwd = "logprob pass=fwd logits=bf16 labels=i64 entropy=1 vocab=151936";
  char line[512];
  snprintf(line, sizeof line, "%s tokens=16384", fwd);
  rlk_tune_record r = make_record(line, &info, "variant=bulk block=256 unroll=8 stages=3", 1.4, 1.2);
  rlk_tune_record other = r; /* another runtime's record: left out without --tune-all-envs */
  snprintf(other.runtime, sizeof other.runtime, "0.0.1");
  snprintf(other.winner, sizeof other.winner, "variant=bulk block=512 unroll=2 stages=4");
  rlk_tune_record both[2] = {r, other};
  ck_assert_int_eq(rlk_tune_db_record(db, both, 2), RLK_OK);
  rlk_test_tool_run t = rlk_test_run_tool(NULL, "rlk-precompile", ARGS("--tune-db", db, "--out", tree, "-j", "2"));
  expect_status(t, 0, "rlk-precompile --tune-db for sm_90a");
  ck_assert_ptr_nonnull(strstr(t.out, "1 record taken"));
  ck_assert_ptr_nonnull(strstr(t.out, "1 of other environments left out"));
  ck_assert_int_eq(rlk_test_count_lines(t.out, "] sm_90a"), 2); /* the default and the winner */
  rlk_test_tool_free(&t);
  entry_find bulk = {{"cwarps=8", "stages=3", "unroll=8", NULL}, 0};
  entry_find other_bulk = {{"cwarps=16", "stages=4", "unroll=2", NULL}, 0};
  ck_assert_int_eq(rlk_cache_walk(tree, find_entry, &bulk), RLK_OK);
  ck_assert_int_eq(rlk_cache_walk(tree, find_entry, &other_bulk), RLK_OK);
  ck_assert_int_eq(bulk.found, 1);
  ck_assert_int_eq(other_bulk.found, 0);

  ck_assert_int_eq(mkdir(empty, 0700), 0);
  setenv("RLK_TUNE_DB", db, 1);
  setenv("RLK_JIT", "0", 1);
  setenv("RLK_CACHE_RO_DIRS", tree, 1);
  setenv("RLK_CACHE_DIR", empty, 1);
  ck_assert_int_eq(rlk_context_create(&ctx, &o), RLK_OK);
  int n = 0;
  ck_assert_msg(rlk_precompile(ctx, line, &n) == RLK_OK, "%s", rlk_last_error()); /* the tuned kernel */
  ck_assert_msg(rlk_precompile(ctx, fwd, &n) == RLK_OK, "%s", rlk_last_error());  /* the default */
  ck_assert_uint_eq(rlk_test_compiles(ctx), 0);
  snprintf(line, sizeof line, "%s variant=vec block=256", fwd);
  ck_assert_int_eq(rlk_precompile(ctx, line, &n), RLK_ERR_JIT_DISABLED); /* not shipped */
  rlk_context_destroy(ctx);
  unsetenv("RLK_JIT");
  unsetenv("RLK_CACHE_RO_DIRS");
  rlk_test_rmtree(dir);
}
END_TEST

static int count_records(const rlk_tune_record *record, void *user) {
  (void)record;
  (*(int *)user)++;
  return 0;
}

/* A FIFO in the database's place (or its lock's) is refused at once: nothing blocks on it. */
START_TEST(db_fifo_never_blocks) {
  char db[1100], lock[1200];
  const rlk_device_info info = fresh_host_db(db, sizeof db, "tune-fifo");
  char dir[1100];
  snprintf(dir, sizeof dir, "%s", db);
  *strrchr(dir, '/') = '\0';
  ck_assert_int_eq(rlk_mkdirs(dir, 0700), 0);
  ck_assert_int_eq(mkfifo(db, 0600), 0);
  alarm(20); /* a hang fails the case, not the suite */
  int visits = 0;
  ck_assert_int_eq(rlk_tune_db_walk(db, count_records, &visits, NULL), RLK_ERR_IO);
  ck_assert_int_eq(visits, 0);
  ck_assert_ptr_nonnull(strstr(rlk_last_error(), "not a regular file"));
  rlk_tune_record r = make_record("logprob pass=fwd logits=f32 vocab=77 tokens=8", &info,
                                  "variant=vec block=256 unroll=4", 1, 0.5);
  ck_assert_int_ne(rlk_tune_db_record(db, &r, 1), RLK_OK);
  ck_assert_int_eq(unlink(db), 0);
  snprintf(lock, sizeof lock, "%s.lock", db);
  unlink(lock); /* made by the call above */
  ck_assert_int_eq(mkfifo(lock, 0600), 0);
  ck_assert_int_ne(rlk_tune_db_record(db, &r, 1), RLK_OK);
  ck_assert_ptr_nonnull(strstr(rlk_last_error(), "not a regular file"));
  alarm(0);
}
END_TEST

/* rlk-tune times linear_logprob's candidates through its own inputs, both passes; planning for
 * sm_90a without --time-duplicates, the backward's chunk and tile order are timed (they change its
 * calls, not its kernels) and its forward-only ring depths are not. */
START_TEST(rlk_tune_host_run_of_linear_logprob) {
  char db[1100];
  host_sweep("linear_logprob",
             "linear_logprob pass=fwd,bwd hidden=bf16 labels=i32 entropy=1 grad=same hidden_size=40 vocab=301 tokens=70",
             "hidden=bf16 labels=i32 entropy=1", 64, db, sizeof db);
  rlk_test_tool_run r = rlk_test_run_tool(
      NULL, "rlk-tune",
      ARGS("-n", "--backend", "cuda", "--target", "sm_90a", "--sweep",
           "linear_logprob pass=bwd hidden_size=4096 vocab=151936 tokens=8192"));
  if (r.status == 1 && strstr(r.out, "nvrtc")) {
    printf("skip (tune: linear_logprob dry run for sm_90a): no NVRTC:\n%s", r.out);
  } else {
    expect_status(r, 0, "rlk-tune --dry-run of linear_logprob's backward for sm_90a");
    static const char *const timed[] = {"group=4", "group=16", "group=64", "chunk=8192"};
    for (size_t i = 0; i < 4; i++) {
      const char *at = strstr(r.out, timed[i]);
      ck_assert_msg(at && strstr(at, "timed") && (!strchr(at, '\n') || strstr(at, "timed") < strchr(at, '\n')),
                    "%s is not timed:\n%s", timed[i], r.out);
    }
    ck_assert_int_eq(rlk_test_count_lines(r.out, "same kernels as the default"), 2); /* stages=2, stages=3 */
  }
  rlk_test_tool_free(&r);
}
END_TEST

Suite *tune_suite(void) {
  Suite *s = suite_create("tune");
  rlk_test_add_case(s, "db", 120, TESTS(buckets_and_keys, db_round_trip, db_merge_of_runs, db_duplicate_keys_keep_the_last,
      db_lock_timeout_as_the_cache_reads_it,
      db_other_environments_ignored, db_damaged_files_warn_once, db_writer_names_leave_the_cache_root_usable,
      db_fifo_never_blocks,
      db_concurrent_writers_keep_every_record, tune_modes_and_pending_list, db_read_once_per_context));
  rlk_test_add_case(s, "selection", 120, TESTS(selection_on_the_host, variant_override_skips_the_database,
      unusable_winner_warns_once_and_runs_the_default, selection_changes_the_kernels_on_sm90a,
      prefix_attention_keys_and_selection_on_sm90a, linear_logprob_keys_and_selection_on_sm90a));
  /* these run the tools, and compilers, in child processes */
  rlk_test_add_case(s, "tools", 300, TESTS(rlk_tune_usage_and_dry_run,
      rlk_tune_host_run_feeds_calls_and_precompile, precompile_from_the_database_for_sm90a,
      rlk_tune_host_run_of_prefix_attention, rlk_tune_host_run_of_linear_logprob));
  return s;
}
