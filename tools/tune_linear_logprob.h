/* tune_linear_logprob.h - rlk-tune's inputs, calls and output checks of linear_logprob
 * (tune_op.h). A record's key gives the pass, the dtypes, H and V; the problem is N = the line's
 * tokens rows. Random hidden, weight and labels (and upstream gradients); the backward's lse and
 * entropy come from the default forward. Compared with the default's: logp, lse (and entropy) of
 * every row, or sampled rows of grad_hidden and of grad_weight. One input set, not rotated: an LM
 * head's weight alone is larger than any cache. */
#ifndef RLK_TUNE_LINEAR_LOGPROB_H
#define RLK_TUNE_LINEAR_LOGPROB_H

#include "tune_op.h"

typedef struct ll_problem {
  int bwd, entropy;
  rlk_dtype hidden, labels, grad;
  int64_t N, H, V;
} ll_problem;

static int ll_problem_of(const rlk_tune_record *key, int64_t tokens, void *problem, char *why, size_t size) {
  ll_problem *p = problem;
  logprob_key_settings(key, &p->bwd, &p->entropy, &p->labels);
  p->hidden = key_dtype(key, "hidden");
  p->grad = key_is(key, "grad", "same") ? p->hidden : RLK_F32;
  p->H = key_int(key, "hidden_size");
  p->V = key_int(key, "vocab");
  p->N = tokens;
  if (!p->hidden || !p->labels || p->H <= 0 || p->V <= 0 || p->N <= 0) {
    snprintf(why, size, "cannot read the problem from '%s'", key->shape);
    return -1;
  }
  return 0;
}

/* The backward's lse and entropy: the default forward (entropy=1 when the key has it). */
static char *ll_input_line(const void *problem) {
  const ll_problem *p = problem;
  if (!p->bwd) return NULL;
  return xasprintf("linear_logprob pass=fwd hidden=%s labels=%s entropy=%d", rlk_dtype_name(p->hidden),
                   rlk_dtype_name(p->labels), p->entropy);
}

typedef struct ll_bench {
  rlk_context *ctx;
  ll_problem p;
  void *h, *w, *y, *gh, *gw, *work;
  float *logp, *lse, *ent, *glp, *gent;
  size_t work_bytes;
  int64_t rows[MAX_CHECK_ROWS]; /* sampled rows of grad_hidden and grad_weight */
  int nrows;
  /* kept outputs: [0] the default's, [1] a candidate's; fwd: logp, lse, entropy of every row;
   * bwd: the sampled rows of grad_hidden, then of grad_weight */
  void *kept[2][3];
} ll_bench;

/* The forward's or the backward's arguments, with a candidate's settings ("stages=3",
 * "group=16", "" for the default). */
static void ll_forward_args(const ll_bench *b, const char *settings, rlk_linear_logprob_args *a) {
  const ll_problem *p = &b->p;
  rlk_linear_logprob_args_init(a);
  a->hidden = rlk_tensor_2d(b->h, p->hidden, p->N, p->H, p->H);
  a->weight = rlk_tensor_2d(b->w, p->hidden, p->V, p->H, p->H);
  a->labels = rlk_tensor_1d(b->y, p->labels, p->N);
  a->logp = rlk_tensor_1d(b->logp, RLK_F32, p->N);
  a->lse = rlk_tensor_1d(b->lse, RLK_F32, p->N);
  if (p->entropy) a->entropy = rlk_tensor_1d(b->ent, RLK_F32, p->N);
  a->workspace = b->work;
  a->workspace_bytes = b->work_bytes;
  setting_int(settings, "stages", &a->stages);
  setting_int(settings, "splits", &a->splits);
}

static void ll_backward_args(const ll_bench *b, const char *settings, rlk_linear_logprob_backward_args *a) {
  const ll_problem *p = &b->p;
  rlk_linear_logprob_args f; /* the backward reads the forward's inputs, lse and entropy */
  ll_forward_args(b, "", &f);
  rlk_linear_logprob_backward_args_init(a);
  a->grad_logp = rlk_tensor_1d(b->glp, RLK_F32, p->N);
  if (p->entropy) a->grad_entropy = rlk_tensor_1d(b->gent, RLK_F32, p->N);
  a->grad_hidden = rlk_tensor_2d(b->gh, p->grad, p->N, p->H, p->H);
  a->grad_weight = rlk_tensor_2d(b->gw, p->grad, p->V, p->H, p->H);
  a->hidden = f.hidden;
  a->weight = f.weight;
  a->labels = f.labels;
  a->lse = f.lse;
  a->entropy = f.entropy;
  a->workspace = b->work;
  a->workspace_bytes = b->work_bytes;
  setting_int(settings, "chunk", &a->chunk);
  setting_int(settings, "group", &a->group);
}

static rlk_status ll_call(void *bench, int set, const char *settings) {
  ll_bench *b = bench;
  (void)set;
  if (b->p.bwd) {
    rlk_linear_logprob_backward_args a;
    ll_backward_args(b, settings, &a);
    return rlk_linear_logprob_backward(b->ctx, &a, NULL);
  }
  rlk_linear_logprob_args a;
  ll_forward_args(b, settings, &a);
  return rlk_linear_logprob(b->ctx, &a, NULL);
}

/* Grows the workspace to what a call with these settings needs (timed calls reuse it). */
static rlk_status ll_workspace(ll_bench *b, const char *settings, char *why, size_t whysize) {
  size_t need = 0;
  if (b->p.bwd) {
    rlk_linear_logprob_backward_args a;
    ll_backward_args(b, settings, &a);
    TRY("the workspace size", rlk_linear_logprob_backward_workspace_size(b->ctx, &a, &need));
  } else {
    rlk_linear_logprob_args a;
    ll_forward_args(b, settings, &a);
    TRY("the workspace size", rlk_linear_logprob_workspace_size(b->ctx, &a, &need));
  }
  return grow_workspace(b->ctx, need, &b->work, &b->work_bytes, why, whysize);
}

static int ll_nout(const ll_problem *p) { return p->bwd ? 2 : p->entropy ? 3 : 2; }

/* Elements and dtype of each kept output. */
static size_t ll_kept_n(const ll_bench *b) { return b->p.bwd ? (size_t)b->nrows * (size_t)b->p.H : (size_t)b->p.N; }
static rlk_dtype ll_kept_dtype(const ll_bench *b) { return b->p.bwd ? b->p.grad : RLK_F32; }

/* Frees a bench and all it holds (NULL: nothing). */
static void ll_destroy(void *bench) {
  ll_bench *b = bench;
  if (!b) return;
  void *const all[] = {b->h, b->w, b->y, b->gh, b->gw, b->work, b->logp, b->lse, b->ent, b->glp, b->gent};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) rlk_free(b->ctx, all[i]);
  for (int k = 0; k < 2; k++)
    for (int o = 0; o < 3; o++) free(b->kept[k][o]);
  free(b);
}

static rlk_status ll_setup(rlk_context *ctx, const void *problem, uint64_t seed, double l2, void **bench, char *why,
                           size_t whysize) {
  (void)l2;
  ll_bench *b = xrealloc(NULL, sizeof *b);
  memset(b, 0, sizeof *b);
  *bench = b;
  b->ctx = ctx;
  b->p = *(const ll_problem *)problem;
  const ll_problem *p = &b->p;
  uint64_t rng = seed;
  rlk_status st;
  /* logits of std ~1: hidden in [-1, 1), weight in [-1, 1) 3 / sqrt(H) */
  const double ws = 3.0 / sqrt((double)p->H);
  if ((st = upload_random16(ctx, &b->h, p->hidden, (size_t)(p->N * p->H), &rng, -1.0, 1.0, why, whysize))) return st;
  if ((st = upload_random16(ctx, &b->w, p->hidden, (size_t)(p->V * p->H), &rng, -ws, ws, why, whysize))) return st;
  const size_t ls = rlk_dtype_size(p->labels);
  void *y = xrealloc(NULL, (size_t)p->N * ls);
  for (int64_t i = 0; i < p->N; i++) {
    const int64_t lab = (int64_t)(rng_next(&rng) % (uint64_t)p->V);
    if (ls == 8)
      ((int64_t *)y)[i] = lab;
    else
      ((int32_t *)y)[i] = (int32_t)lab;
  }
  st = alloc_dev(ctx, (size_t)p->N * ls, &b->y, why, whysize);
  if (!st && (st = rlk_memcpy_to_device(ctx, b->y, y, (size_t)p->N * ls)))
    snprintf(why, whysize, "uploading labels: %s", rlk_last_error());
  free(y);
  if (st) return st;
  if ((st = alloc_dev(ctx, (size_t)p->N * 4, (void **)&b->logp, why, whysize))) return st;
  if ((st = alloc_dev(ctx, (size_t)p->N * 4, (void **)&b->lse, why, whysize))) return st;
  if ((st = alloc_dev(ctx, (size_t)p->N * 4, (void **)&b->ent, why, whysize))) return st;
  if (p->bwd) {
    if ((st = upload_floats(ctx, &b->glp, (size_t)p->N, &rng, -1.0, 1.0, why, whysize))) return st;
    if ((st = upload_floats(ctx, &b->gent, (size_t)p->N, &rng, -0.1, 0.1, why, whysize))) return st;
    const size_t gs = rlk_dtype_size(p->grad);
    if ((st = alloc_dev(ctx, (size_t)(p->N * p->H) * gs, &b->gh, why, whysize))) return st;
    if ((st = alloc_dev(ctx, (size_t)(p->V * p->H) * gs, &b->gw, why, whysize))) return st;
    /* lse and entropy: the default forward, in a workspace of its own size */
    rlk_linear_logprob_args f;
    ll_forward_args(b, "", &f);
    f.entropy = rlk_tensor_1d(b->ent, RLK_F32, p->N);
    size_t need = 0;
    TRY("the forward's workspace size", rlk_linear_logprob_workspace_size(ctx, &f, &need));
    if (need) TRY("allocating the workspace", rlk_malloc(ctx, need, &b->work));
    b->work_bytes = need;
    f.workspace = b->work;
    f.workspace_bytes = need;
    if ((st = rlk_linear_logprob(ctx, &f, NULL))) {
      snprintf(why, whysize, "the default forward (the backward's lse and entropy): %s", rlk_last_error());
      return st;
    }
  }
  if ((st = ll_workspace(b, "", why, whysize))) return st;
  TRY("synchronizing", rlk_stream_synchronize(ctx, NULL));
  /* sampled rows: the first, the last, and spread between (grad_weight's over V, grad_hidden's
   * over N: rows[r] scaled to each) */
  b->nrows = MAX_CHECK_ROWS;
  for (int r = 0; r < b->nrows; r++) b->rows[r] = r;
  for (int k = 0; k < 2; k++)
    for (int o = 0; o < ll_nout(p); o++)
      b->kept[k][o] = xrealloc(NULL, ll_kept_n(b) * rlk_dtype_size(ll_kept_dtype(b)));
  return RLK_OK;
}

static int ll_nsets(const void *bench) {
  (void)bench;
  return 1;
}

/* Row r of the sample in a matrix of `rows` rows. */
static int64_t ll_sample_row(const ll_bench *b, int r, int64_t rows) {
  return b->nrows == 1 ? 0 : (int64_t)((double)b->rows[r] * (double)(rows - 1) / (double)(b->nrows - 1));
}

static rlk_status ll_checked_call(void *bench, const char *settings, int reference, char *why, size_t whysize) {
  ll_bench *b = bench;
  const ll_problem *p = &b->p;
  rlk_status st = ll_workspace(b, settings, why, whysize);
  if (st) return st;
  void **kept = b->kept[reference ? 0 : 1];
  if (p->bwd) {
    const size_t gs = rlk_dtype_size(p->grad), row = (size_t)p->H * gs;
    TRY("poisoning the outputs", rlk_memset(b->ctx, b->gh, 0xff, (size_t)p->N * row));
    TRY("poisoning the outputs", rlk_memset(b->ctx, b->gw, 0xff, (size_t)p->V * row));
    TRY("the checked call", ll_call(b, 0, settings));
    TRY("synchronizing after the checked call", rlk_stream_synchronize(b->ctx, NULL));
    for (int r = 0; r < b->nrows; r++) {
      TRY("reading the outputs", rlk_memcpy_to_host(b->ctx, (char *)kept[0] + (size_t)r * row,
                                                    (const char *)b->gh + (size_t)ll_sample_row(b, r, p->N) * row, row));
      TRY("reading the outputs", rlk_memcpy_to_host(b->ctx, (char *)kept[1] + (size_t)r * row,
                                                    (const char *)b->gw + (size_t)ll_sample_row(b, r, p->V) * row, row));
    }
    return RLK_OK;
  }
  float *out[3] = {b->logp, b->lse, b->ent};
  for (int o = 0; o < ll_nout(p); o++)
    TRY("poisoning the outputs", rlk_memset(b->ctx, out[o], 0xff, (size_t)p->N * 4));
  TRY("the checked call", ll_call(b, 0, settings));
  TRY("synchronizing after the checked call", rlk_stream_synchronize(b->ctx, NULL));
  for (int o = 0; o < ll_nout(p); o++)
    TRY("reading the outputs", rlk_memcpy_to_host(b->ctx, kept[o], out[o], (size_t)p->N * 4));
  return RLK_OK;
}

/* The candidate's outputs against the default's: logp, lse, entropy to 1e-4 relative; sampled
 * gradient rows to 1/64 (bf16) or 1/256 (f16) of their size (tune_op.h's compare), the same kernels
 * summing in a different order at most. */
static double ll_check(void *bench, char *where, size_t size) {
  ll_bench *b = bench;
  static const char *const fwd[] = {"logp", "lse", "entropy"}, *const bwd[] = {"grad_hidden rows", "grad_weight rows"};
  double worst = 0;
  for (int o = 0; o < ll_nout(&b->p); o++) {
    char at[200];
    const rlk_dtype d = ll_kept_dtype(b);
    const double e = compare(b->kept[1][o], b->kept[0][o], d, ll_kept_n(b), rtol_of(d), at, sizeof at,
                             b->p.bwd ? bwd[o] : fwd[o]);
    if (e > worst) {
      worst = e;
      snprintf(where, size, "%s", at);
    }
  }
  return worst;
}

static const tune_op tune_op_linear_logprob = {"linear_logprob", sizeof(ll_problem), ll_problem_of,   ll_input_line,
                                               ll_setup,         ll_nsets,           ll_call,         ll_checked_call,
                                               ll_check,         ll_destroy};

#endif
