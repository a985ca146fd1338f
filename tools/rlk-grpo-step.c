/*
 * rlk-grpo-step - one GRPO training step on the best backend present, op by op, each checked
 * against a plain double-precision computation:
 *
 *   sample       a group of responses per prompt: a token at each position, from logits
 *   logprob      the sampled tokens' log-probs (bitwise the sampler's) and the entropy
 *   advantages   GRPO group advantages of random rewards, broadcast over each response's tokens
 *   policy loss  PPO with verl's clips, token-mean: the loss and d loss / d logp
 *   backward     d loss / d logits through the log-softmax
 *
 * and what the kernel cache did: each op runs twice, the first call compiling or loading its
 * kernels, the second served from memory. Built only on the public API (include/rlk.h).
 * Exit status: 0 success, 1 a failure or an error above tolerance, 2 a usage error.
 */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

static const char *prog = "rlk-grpo-step";

#include "tool_util.h"

#define TOL 2e-4 /* f32 kernels against fp64 references, relative to the values' scale */

static void usage(FILE *out) {
  fprintf(out,
          "usage: %s [--backend auto|cuda|hip|host] [--prompts P] [--group G] [--tokens T]\n"
          "       [--vocab V] [--seed S]\n"
          "\n"
          "One GRPO step (sample, log-probs and entropy, group advantages, policy loss and its\n"
          "gradient, the log-prob backward) on random logits, each op checked against fp64 and\n"
          "timed on its first call (compile or cache load) and warm. Defaults: 4 prompts x 4\n"
          "responses x 32 tokens, vocabulary 1000.\n",
          prog);
}

/* log-sum-exp of a row in fp64. */
static double row_lse(const float *x, long V) {
  double m = -INFINITY, s = 0;
  for (long j = 0; j < V; j++) m = x[j] > m ? x[j] : m;
  for (long j = 0; j < V; j++) s += exp((double)x[j] - m);
  return m + log(s);
}

typedef struct op_row {
  const char *name;
  double first_ms, warm_ms, err;
  uint64_t compiles, disk_hits, memory_hits;
} op_row;

static op_row rows[8];
static int nrows;

typedef rlk_status (*op_fn)(rlk_context *ctx, const void *args);

static rlk_status call_logprob(rlk_context *c, const void *a) { return rlk_logprob(c, a, NULL); }
static rlk_status call_logprob_bwd(rlk_context *c, const void *a) { return rlk_logprob_backward(c, a, NULL); }
static rlk_status call_sample(rlk_context *c, const void *a) { return rlk_sample(c, a, NULL); }
static rlk_status call_adv(rlk_context *c, const void *a) { return rlk_group_advantage(c, a, NULL); }
static rlk_status call_loss(rlk_context *c, const void *a) { return rlk_policy_loss(c, a, NULL); }

/* Runs an op twice (first call, then warm), recording times and what the cache did. */
static rlk_status run_op(rlk_context *ctx, const char *name, op_fn fn, const void *args) {
  op_row *r = &rows[nrows++];
  r->name = name;
  rlk_counters c0, c1;
  rlk_context_counters(ctx, &c0);
  for (int call = 0; call < 2; call++) {
    double t0 = now_s();
    rlk_status st = fn(ctx, args);
    if (!st) st = rlk_stream_synchronize(ctx, NULL);
    if (st) return lib_error(name, st), st;
    double ms = (now_s() - t0) * 1e3;
    if (call == 0) r->first_ms = ms;
    else r->warm_ms = ms;
  }
  rlk_context_counters(ctx, &c1);
  r->compiles = c1.compiles - c0.compiles;
  r->disk_hits = c1.disk_hits - c0.disk_hits;
  r->memory_hits = c1.memory_hits - c0.memory_hits;
  return RLK_OK;
}

/* Device buffers; NULL-safe frees at the end. */
static void *dev[16];
static int ndev;

static void *dalloc(rlk_context *ctx, size_t bytes) {
  void *p = NULL;
  rlk_status st = rlk_malloc(ctx, bytes ? bytes : 16, &p);
  if (st) {
    lib_error("rlk_malloc", st);
    return NULL;
  }
  dev[ndev++] = p;
  return p;
}

static int tool_main(int argc, char **argv) {
  rlk_backend backend = RLK_BACKEND_AUTO;
  long P = 4, G = 4, T = 32, V = 1000;
  uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  static const struct option longopts[] = {
      {"backend", required_argument, NULL, 'b'}, {"prompts", required_argument, NULL, 'P'},
      {"group", required_argument, NULL, 'G'},   {"tokens", required_argument, NULL, 'T'},
      {"vocab", required_argument, NULL, 'V'},   {"seed", required_argument, NULL, 's'},
      {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
  opterr = 0;
  for (int c; (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1;) {
    long x = 0;
    switch (c) {
      case 'b':
        if (parse_backend(optarg, &backend)) return usage_error("--backend: '%s' is not auto, cuda, hip or host", optarg);
        break;
      case 'P':
        if (parse_int(optarg, 1, 1024, &P)) return usage_error("bad --prompts '%s' (1 to 1024)", optarg);
        break;
      case 'G':
        if (parse_int(optarg, 2, 256, &G)) return usage_error("bad --group '%s' (2 to 256)", optarg);
        break;
      case 'T':
        if (parse_int(optarg, 1, 4096, &T)) return usage_error("bad --tokens '%s' (1 to 4096)", optarg);
        break;
      case 'V':
        if (parse_int(optarg, 2, 1 << 18, &V)) return usage_error("bad --vocab '%s' (2 to 262144)", optarg);
        break;
      case 's':
        if (parse_int(optarg, 0, LONG_MAX, &x)) return usage_error("bad --seed '%s'", optarg);
        seed = (uint64_t)x;
        break;
      case 'h': usage(stdout); return 0;
      default: return getopt_error(c, argv);
    }
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
  const long B = P * G, N = B * T;
  if ((long long)N * V > (1ll << 28)) return usage_error("N x V = %ld x %ld is too large for a demo", N, V);

  rlk_context *ctx;
  rlk_device_info info;
  int rc = tool_context(backend, &ctx, &info);
  if (rc) return rc;
  rlk_status st;
  printf("rlk %s GRPO step: %ld prompts x %ld responses x %ld tokens, vocabulary %ld, seed %" PRIu64 "\n",
         rlk_version_string(), P, G, T, V, seed);
  printf("backend %s, device %s, target %s, %s\n", rlk_backend_name(rlk_context_backend(ctx)), info.name,
         info.target, info.compiler);

  rc = 1;
  const size_t nv = (size_t)N * (size_t)V;
  float *h_logits = xrealloc(NULL, nv * sizeof(float));
  float *h_logp = xrealloc(NULL, (size_t)N * sizeof(float)), *h_lp2 = xrealloc(NULL, (size_t)N * sizeof(float));
  float *h_ent = xrealloc(NULL, (size_t)N * sizeof(float)), *h_lse = xrealloc(NULL, (size_t)N * sizeof(float));
  float *h_old = xrealloc(NULL, (size_t)N * sizeof(float)), *h_tok_adv = xrealloc(NULL, (size_t)N * sizeof(float));
  float *h_scores = xrealloc(NULL, (size_t)B * sizeof(float)), *h_adv = xrealloc(NULL, (size_t)B * sizeof(float));
  float *h_grad = xrealloc(NULL, (size_t)N * sizeof(float)), *h_dlogits = xrealloc(NULL, nv * sizeof(float));
  float h_loss = 0;
  int64_t *h_tokens = xrealloc(NULL, (size_t)N * sizeof(int64_t));
  uint8_t *h_mask = xrealloc(NULL, (size_t)N);
  double *lse = xrealloc(NULL, (size_t)N * sizeof(double));
  uint64_t rs = seed;
  for (size_t i = 0; i < nv; i++) h_logits[i] = (float)(4.0 * rng_uniform(&rs) - 2.0);
  for (long b = 0; b < B; b++) {
    h_scores[b] = (float)rng_uniform(&rs);
    long len = 1 + (long)(rng_uniform(&rs) * (double)T);
    for (long t = 0; t < T; t++) h_mask[b * T + t] = t < len;
  }
  for (long i = 0; i < N; i++) lse[i] = row_lse(h_logits + (size_t)i * V, V);

  float *d_logits = dalloc(ctx, nv * sizeof(float)), *d_dlogits = dalloc(ctx, nv * sizeof(float));
  int64_t *d_tokens = dalloc(ctx, (size_t)N * sizeof(int64_t));
  float *d_logp = dalloc(ctx, (size_t)N * 4), *d_lp2 = dalloc(ctx, (size_t)N * 4), *d_lse = dalloc(ctx, (size_t)N * 4);
  float *d_ent = dalloc(ctx, (size_t)N * 4), *d_old = dalloc(ctx, (size_t)N * 4), *d_tok_adv = dalloc(ctx, (size_t)N * 4);
  float *d_scores = dalloc(ctx, (size_t)B * 4), *d_adv = dalloc(ctx, (size_t)B * 4), *d_grad = dalloc(ctx, (size_t)N * 4);
  float *d_loss = dalloc(ctx, 4), *d_metrics = dalloc(ctx, RLK_POLICY_LOSS_METRICS * 4);
  uint8_t *d_mask = dalloc(ctx, (size_t)N);
  if (ndev != 15) goto done;
  if ((st = rlk_memcpy_to_device(ctx, d_logits, h_logits, nv * sizeof(float))) ||
      (st = rlk_memcpy_to_device(ctx, d_scores, h_scores, (size_t)B * 4)) ||
      (st = rlk_memcpy_to_device(ctx, d_mask, h_mask, (size_t)N))) {
    lib_error("copying inputs", st);
    goto done;
  }
  const rlk_tensor logits = rlk_tensor_2d(d_logits, RLK_F32, N, V, V);

  /* 1. sample a token at every position of every response (temperature 1, top-k 50) */
  rlk_sample_args sa;
  rlk_sample_args_init(&sa);
  sa.logits = logits;
  sa.temperature = 1.0f;
  sa.top_k = 50;
  sa.seed = seed;
  sa.tokens = rlk_tensor_1d(d_tokens, RLK_I64, N);
  sa.logp = rlk_tensor_1d(d_logp, RLK_F32, N);
  if (run_op(ctx, "sample", call_sample, &sa)) goto done;
  rlk_memcpy_to_host(ctx, h_tokens, d_tokens, (size_t)N * sizeof(int64_t));
  rlk_memcpy_to_host(ctx, h_logp, d_logp, (size_t)N * 4);
  double err = 0;
  for (long i = 0; i < N; i++) {
    const int64_t k = h_tokens[i];
    if (k < 0 || k >= V) {
      fprintf(stderr, "%s: sampled token %" PRId64 " outside [0, %ld)\n", prog, k, V);
      goto done;
    }
    /* top-k 50: the token is among the 50 largest logits of its row */
    long above = 0;
    for (long j = 0; j < V; j++) above += h_logits[(size_t)i * V + j] > h_logits[(size_t)i * V + k];
    if (above >= 50) err = INFINITY;
    err = fmax(err, fabs(h_logp[i] - (h_logits[(size_t)i * V + k] - lse[i])));
  }
  rows[nrows - 1].err = err;

  /* 2. the sampled tokens' log-probs and entropy */
  rlk_logprob_args la;
  rlk_logprob_args_init(&la);
  la.logits = logits;
  la.labels = rlk_tensor_1d(d_tokens, RLK_I64, N);
  la.logp = rlk_tensor_1d(d_lp2, RLK_F32, N);
  la.lse = rlk_tensor_1d(d_lse, RLK_F32, N);
  la.entropy = rlk_tensor_1d(d_ent, RLK_F32, N);
  if (run_op(ctx, "logprob + entropy", call_logprob, &la)) goto done;
  rlk_memcpy_to_host(ctx, h_lp2, d_lp2, (size_t)N * 4);
  rlk_memcpy_to_host(ctx, h_ent, d_ent, (size_t)N * 4);
  rlk_memcpy_to_host(ctx, h_lse, d_lse, (size_t)N * 4);
  err = 0;
  long same = 0;
  for (long i = 0; i < N; i++) {
    const float *x = h_logits + (size_t)i * V;
    double H = 0;
    for (long j = 0; j < V; j++) {
      double lp = x[j] - lse[i];
      H -= exp(lp) * lp;
    }
    same += memcmp(&h_lp2[i], &h_logp[i], sizeof(float)) == 0;
    err = fmax(err, fmax(fabs(h_lp2[i] - (x[h_tokens[i]] - lse[i])), fabs(h_ent[i] - H) / fmax(1.0, H)));
  }
  rows[nrows - 1].err = err;

  /* 3. GRPO advantages of the responses' rewards, broadcast over their tokens */
  rlk_group_advantage_args ga;
  rlk_group_advantage_args_init(&ga);
  ga.scores = rlk_tensor_1d(d_scores, RLK_F32, B);
  ga.group_size = G;
  ga.advantages = rlk_tensor_1d(d_adv, RLK_F32, B);
  ga.mask = rlk_tensor_2d(d_mask, RLK_BOOL, B, T, T);
  ga.token_advantages = rlk_tensor_2d(d_tok_adv, RLK_F32, B, T, T);
  if (run_op(ctx, "group advantages", call_adv, &ga)) goto done;
  rlk_memcpy_to_host(ctx, h_adv, d_adv, (size_t)B * 4);
  rlk_memcpy_to_host(ctx, h_tok_adv, d_tok_adv, (size_t)N * 4);
  err = 0;
  for (long g0 = 0; g0 < B; g0 += G) {
    double m = 0, ss = 0;
    for (long i = g0; i < g0 + G; i++) m += h_scores[i];
    m /= (double)G;
    for (long i = g0; i < g0 + G; i++) ss += (h_scores[i] - m) * (h_scores[i] - m);
    const double sd = sqrt(ss / (double)(G - 1));
    for (long i = g0; i < g0 + G; i++) {
      const double want = (h_scores[i] - m) / (sd + ga.eps);
      err = fmax(err, fabs(h_adv[i] - want));
      for (long t = 0; t < T; t++) err = fmax(err, fabs(h_tok_adv[i * T + t] - (h_mask[i * T + t] ? want : 0.0)));
    }
  }
  rows[nrows - 1].err = err;

  /* 4. the PPO loss (verl's defaults: clip 0.2, dual clip 3, token-mean) against old log-probs
   * a little off the current ones, and its gradient */
  double ntok = 0;
  for (long i = 0; i < N; i++) {
    h_old[i] = h_lp2[i] + (float)(0.3 * (rng_uniform(&rs) - 0.5));
    ntok += h_mask[i];
  }
  rlk_memcpy_to_device(ctx, d_old, h_old, (size_t)N * 4);
  rlk_policy_loss_args pa;
  rlk_policy_loss_args_init(&pa);
  pa.logp = rlk_tensor_2d(d_lp2, RLK_F32, B, T, T);
  pa.old_logp = rlk_tensor_2d(d_old, RLK_F32, B, T, T);
  pa.advantages = rlk_tensor_2d(d_tok_adv, RLK_F32, B, T, T);
  pa.mask = rlk_tensor_2d(d_mask, RLK_BOOL, B, T, T);
  pa.token_normalizer = ntok;
  pa.loss = rlk_tensor_1d(d_loss, RLK_F32, 1);
  pa.grad_logp = rlk_tensor_2d(d_grad, RLK_F32, B, T, T);
  pa.metrics = rlk_tensor_1d(d_metrics, RLK_F32, RLK_POLICY_LOSS_METRICS);
  size_t ws = 0;
  if ((st = rlk_policy_loss_workspace_size(ctx, &pa, &ws))) {
    lib_error("rlk_policy_loss_workspace_size", st);
    goto done;
  }
  pa.workspace = ws ? dalloc(ctx, ws) : NULL;
  pa.workspace_bytes = ws;
  if (ws && !pa.workspace) goto done;
  if (run_op(ctx, "policy loss + grad", call_loss, &pa)) goto done;
  rlk_memcpy_to_host(ctx, &h_loss, d_loss, 4);
  rlk_memcpy_to_host(ctx, h_grad, d_grad, (size_t)N * 4);
  double loss = 0, gerr = 0;
  for (long i = 0; i < N; i++) {
    const double A = h_tok_adv[i], r = exp((double)h_lp2[i] - h_old[i]);
    const double l1 = -A * r, l2 = -A * fmin(fmax(r, 1.0 - pa.clip_low), 1.0 + pa.clip_high);
    double l = fmax(l1, l2), g = l1 >= l2 ? -A * r : 0.0;
    if (A < 0 && -A * pa.dual_clip < l) l = -A * pa.dual_clip, g = 0.0;
    if (!h_mask[i]) l = g = 0.0;
    loss += l / ntok;
    gerr = fmax(gerr, fabs(h_grad[i] - g / ntok) * ntok);
  }
  rows[nrows - 1].err = fmax(fabs(h_loss - loss) / fmax(1.0, fabs(loss)), gerr);

  /* 5. through the log-softmax: d loss / d logits = g (onehot - softmax) */
  rlk_logprob_backward_args ba;
  rlk_logprob_backward_args_init(&ba);
  ba.logits = logits;
  ba.labels = la.labels;
  ba.lse = la.lse;
  ba.grad_logp = rlk_tensor_1d(d_grad, RLK_F32, N);
  ba.grad_logits = rlk_tensor_2d(d_dlogits, RLK_F32, N, V, V);
  if (run_op(ctx, "logprob backward", call_logprob_bwd, &ba)) goto done;
  rlk_memcpy_to_host(ctx, h_dlogits, d_dlogits, nv * sizeof(float));
  err = 0;
  for (long i = 0; i < N; i++) {
    const double g = h_grad[i] * ntok; /* scaled to O(1) so the tolerance is relative */
    for (long j = 0; j < V; j++) {
      const double want = g * ((j == h_tokens[i]) - exp((double)h_logits[(size_t)i * V + j] - lse[i]));
      err = fmax(err, fabs(h_dlogits[(size_t)i * V + j] * ntok - want));
    }
  }
  rows[nrows - 1].err = err;

  printf("\n%-20s %12s %10s %9s %10s %12s %10s\n", "op", "first call", "warm", "compiles", "disk hits",
         "memory hits", "max error");
  int bad = 0;
  for (int i = 0; i < nrows; i++) {
    printf("%-20s %9.3f ms %7.3f ms %9" PRIu64 " %10" PRIu64 " %12" PRIu64 " %10.2g\n", rows[i].name, rows[i].first_ms,
           rows[i].warm_ms, rows[i].compiles, rows[i].disk_hits, rows[i].memory_hits, rows[i].err);
    bad |= !(rows[i].err <= TOL);
  }
  printf("\nloss %.6f over %.0f tokens; sampled log-probs equal to rlk_logprob's bitwise: %ld of %ld\n", (double)h_loss,
         ntok, same, N);
  rlk_counters c;
  rlk_context_counters(ctx, &c);
  printf("counters: calls=%" PRIu64 " memory_hits=%" PRIu64 " disk_hits=%" PRIu64 " misses=%" PRIu64
         " compiles=%" PRIu64 " compile_seconds=%.3f\n",
         c.calls, c.memory_hits, c.disk_hits, c.misses, c.compiles, c.compile_seconds);
  if (bad || same != N) {
    fprintf(stderr, "%s: a result is off its reference by more than %.0e%s\n", prog, TOL,
            same != N ? " (or a sampled log-prob differs from rlk_logprob's)" : "");
  } else {
    printf("ok\n");
    rc = 0;
  }
done:
  for (int i = 0; i < ndev; i++) rlk_free(ctx, dev[i]);
  free(h_logits), free(h_logp), free(h_lp2), free(h_ent), free(h_lse), free(h_old), free(h_tok_adv);
  free(h_scores), free(h_adv), free(h_grad), free(h_dlogits), free(h_tokens), free(h_mask), free(lse);
  rlk_context_destroy(ctx);
  return rc;
}

int main(int argc, char **argv) { return tool_exit(tool_main(argc, argv)); }
