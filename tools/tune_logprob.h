/* tune_logprob.h - rlk-tune's inputs, calls and output checks of logprob (tune_op.h): random
 * logits and labels, the forward (logp, lse, entropy compared) or the backward from the default
 * forward's lse (sampled rows of grad_logits compared). */
#ifndef RLK_TUNE_LOGPROB_H
#define RLK_TUNE_LOGPROB_H

#include "tune_op.h"

/* What a logprob configuration is, from its canonical shape. */
typedef struct lp_problem {
  int bwd, entropy;
  rlk_dtype logits, labels, grad;
  int64_t N, V;
} lp_problem;

/* A logprob problem from a record's canonical shape and N. 0, or -1 with why. */
static int lp_problem_of(const rlk_tune_record *key, int64_t N, void *problem, char *why, size_t size) {
  lp_problem *p = problem;
  logprob_key_settings(key, &p->bwd, &p->entropy, &p->labels);
  p->logits = key_dtype(key, "logits");
  p->grad = p->logits;
  if (key_is(key, "grad", "f32")) p->grad = RLK_F32;
  p->V = key_int(key, "vocab");
  p->N = N;
  if (!p->logits || !p->labels || p->V <= 0 || N <= 0) {
    snprintf(why, size, "cannot read the problem from '%s'", key->shape);
    return -1;
  }
  return 0;
}

typedef struct lp_set {
  void *logits, *labels, *grad;
  float *logp, *lse, *ent, *glp, *gent;
} lp_set;

typedef struct lp_bench {
  rlk_context *ctx;
  lp_problem p;
  size_t es, ges, ls;
  int nsets;
  lp_set set[MAX_ROTATE];
  int32_t *status;
  /* the default's outputs on set 0 */
  float *ref[3];            /* fwd: logp, lse, entropy */
  int64_t rows[MAX_CHECK_ROWS];
  int nrows;
  void *ref_grad, *got_grad; /* bwd: the checked rows */
  float *got[3];
} lp_bench;

/* Frees a bench and all it holds (NULL: nothing). */
static void lp_op_destroy(void *bench) {
  lp_bench *b = bench;
  if (!b) return;
  for (int s = 0; s < b->nsets; s++) {
    lp_set *t = &b->set[s];
    rlk_free(b->ctx, t->logits);
    rlk_free(b->ctx, t->labels);
    rlk_free(b->ctx, t->grad);
    rlk_free(b->ctx, t->logp);
    rlk_free(b->ctx, t->lse);
    rlk_free(b->ctx, t->ent);
    rlk_free(b->ctx, t->glp);
    rlk_free(b->ctx, t->gent);
  }
  rlk_free(b->ctx, b->status);
  for (int k = 0; k < 3; k++) {
    free(b->ref[k]);
    free(b->got[k]);
  }
  free(b->ref_grad);
  free(b->got_grad);
  free(b);
}

/* Parses candidate settings into the args' tuning fields. */
static void lp_tuning_of(const char *settings, rlk_logprob_variant *variant, int *block, int *unroll, int *stages) {
  *variant = RLK_LOGPROB_VARIANT_AUTO;
  *block = *unroll = *stages = 0;
  strlist w = {0};
  split_words(settings, 0, &w);
  for (size_t i = 0; i < w.n; i++) {
    char *eq = strchr(w.v[i], '=');
    if (!eq) continue;
    *eq = '\0';
    const char *v = eq + 1;
    if (!strcmp(w.v[i], "variant"))
      *variant = !strcmp(v, "vec")    ? RLK_LOGPROB_VARIANT_VEC
                 : !strcmp(v, "bulk") ? RLK_LOGPROB_VARIANT_BULK
                 : !strcmp(v, "tma")  ? RLK_LOGPROB_VARIANT_TMA
                                      : RLK_LOGPROB_VARIANT_AUTO;
    else if (!strcmp(w.v[i], "block"))
      *block = atoi(v);
    else if (!strcmp(w.v[i], "unroll"))
      *unroll = atoi(v);
    else if (!strcmp(w.v[i], "stages"))
      *stages = atoi(v);
  }
  strlist_free(&w);
}

/* One call on input set s with the given tuning settings ("" for the default). */
static rlk_status lp_call(lp_bench *b, int s, const char *settings, int forward_for_bwd) {
  const lp_problem *p = &b->p;
  lp_set *t = &b->set[s];
  rlk_logprob_args a;
  rlk_logprob_args_init(&a);
  a.logits = rlk_tensor_2d(t->logits, p->logits, p->N, p->V, p->V);
  a.labels = rlk_tensor_1d(t->labels, p->labels, p->N);
  a.logp = rlk_tensor_1d(t->logp, RLK_F32, p->N);
  a.lse = rlk_tensor_1d(t->lse, RLK_F32, p->N);
  if (p->entropy) a.entropy = rlk_tensor_1d(t->ent, RLK_F32, p->N);
  a.status = rlk_tensor_1d(b->status, RLK_I32, 1);
  lp_tuning_of(settings, &a.variant, &a.block, &a.unroll, &a.stages);
  if (!p->bwd || forward_for_bwd) return rlk_logprob(b->ctx, &a, NULL);
  rlk_logprob_backward_args g;
  rlk_logprob_backward_args_init(&g);
  g.variant = a.variant; /* the settings tune both passes alike */
  g.block = a.block;
  g.unroll = a.unroll;
  g.stages = a.stages;
  g.grad_logp = rlk_tensor_1d(t->glp, RLK_F32, p->N);
  if (p->entropy) g.grad_entropy = rlk_tensor_1d(t->gent, RLK_F32, p->N);
  g.grad_logits = rlk_tensor_2d(t->grad, p->grad, p->N, p->V, p->V);
  /* and reads the forward's inputs, lse and entropy */
  g.logits = a.logits;
  g.labels = a.labels;
  g.lse = a.lse;
  g.entropy = a.entropy;
  g.status = a.status;
  return rlk_logprob_backward(b->ctx, &g, NULL);
}

/* Fresh random inputs: nsets sets (several, rotated, when one fits in the L2), and for a
 * backward the forward's lse and entropy of each set. */
static rlk_status lp_bench_setup(rlk_context *ctx, const lp_problem *p, uint64_t seed, double l2, lp_bench *b,
                                 char *why, size_t whysize) {
  memset(b, 0, sizeof *b);
  b->ctx = ctx;
  b->p = *p;
  b->es = rlk_dtype_size(p->logits);
  b->ges = rlk_dtype_size(p->grad);
  b->ls = rlk_dtype_size(p->labels);
  const size_t elems = (size_t)p->N * (size_t)p->V;
  const double set_bytes = (double)elems * (double)(b->es + (p->bwd ? b->ges : 0)) + (double)p->N * 24.0;
  b->nsets = set_bytes <= l2 ? (int)fmin(MAX_ROTATE, ceil(2.0 * l2 / set_bytes)) : 1;
  if (b->nsets < 1) b->nsets = 1;
  uint64_t rng = seed;
  TRY("allocating device memory", rlk_malloc(ctx, 4, (void **)&b->status));
  const size_t chunk = elems < RANDOM_CHUNK ? elems : RANDOM_CHUNK + 7; /* not a whole number of rows */
  void *h = xrealloc(NULL, chunk * b->es);
  int64_t *labels = xrealloc(NULL, (size_t)p->N * sizeof *labels);
  int32_t *labels32 = xrealloc(NULL, (size_t)p->N * sizeof *labels32);
  rlk_status st = RLK_OK;
  for (int s = 0; s < b->nsets && !st; s++) {
    lp_set *t = &b->set[s];
    for (size_t i = 0; i < chunk; i++) {
      double u = 0;
      for (int k = 0; k < 4; k++) u += rng_uniform(&rng);
      store_nonzero(h, p->logits, i, (u - 2.0) * 3.0);
    }
    if ((st = alloc_dev(ctx, elems * b->es, &t->logits, why, whysize))) break;
    for (size_t off = 0; off < elems && !st; off += chunk) {
      const size_t n = elems - off < chunk ? elems - off : chunk;
      st = rlk_memcpy_to_device(ctx, (char *)t->logits + off * b->es, h, n * b->es);
      if (st) snprintf(why, whysize, "uploading the logits: %s", rlk_last_error());
    }
    for (int64_t i = 0; i < p->N; i++) {
      labels[i] = (int64_t)(rng_next(&rng) % (uint64_t)p->V);
      labels32[i] = (int32_t)labels[i];
    }
    if (!st) st = alloc_dev(ctx, (size_t)p->N * b->ls, &t->labels, why, whysize);
    if (!st && rlk_memcpy_to_device(ctx, t->labels, p->labels == RLK_I64 ? (void *)labels : (void *)labels32,
                                    (size_t)p->N * b->ls)) {
      st = RLK_ERR_BACKEND;
      snprintf(why, whysize, "uploading the labels: %s", rlk_last_error());
    }
    if (!st) st = alloc_dev(ctx, (size_t)p->N * 4, (void **)&t->logp, why, whysize);
    if (!st) st = alloc_dev(ctx, (size_t)p->N * 4, (void **)&t->lse, why, whysize);
    if (!st) st = alloc_dev(ctx, (size_t)p->N * 4, (void **)&t->ent, why, whysize);
    if (!st && p->bwd) {
      st = upload_floats(ctx, &t->glp, (size_t)p->N, &rng, 0.5, 1.5, why, whysize);
      if (!st) st = upload_floats(ctx, &t->gent, (size_t)p->N, &rng, -1.0, 1.0, why, whysize);
      if (!st) st = alloc_dev(ctx, elems * b->ges, &t->grad, why, whysize);
    }
  }
  free(h);
  free(labels);
  free(labels32);
  if (st) return st;
  TRY("clearing the status word", rlk_memset(ctx, b->status, 0, 4));
  if (p->bwd) /* the backward's lse and entropy come from the default forward of each set */
    for (int s = 0; s < b->nsets; s++) TRY("the default forward (the backward's lse)", lp_call(b, s, "", 1));
  TRY("synchronizing", rlk_stream_synchronize(ctx, NULL));
  b->nrows = p->N < MAX_CHECK_ROWS ? (int)p->N : MAX_CHECK_ROWS;
  for (int r = 0; r < b->nrows; r++)
    b->rows[r] = b->nrows == 1 ? 0 : (int64_t)((double)r * (double)(p->N - 1) / (double)(b->nrows - 1));
  return RLK_OK;
}

/* Poisons set 0's outputs, runs one call there and fetches what is compared. */
static rlk_status lp_checked_call(lp_bench *b, const char *settings, float **out, void *grad_rows, char *why,
                                  size_t whysize) {
  const lp_problem *p = &b->p;
  lp_set *t = &b->set[0];
  if (!p->bwd) {
    TRY("poisoning the outputs", rlk_memset(b->ctx, t->logp, 0xff, (size_t)p->N * 4));
    TRY("poisoning the outputs", rlk_memset(b->ctx, t->lse, 0xff, (size_t)p->N * 4));
    TRY("poisoning the outputs", rlk_memset(b->ctx, t->ent, 0xff, (size_t)p->N * 4));
  } else {
    TRY("poisoning the outputs", rlk_memset(b->ctx, t->grad, 0xff, (size_t)p->N * (size_t)p->V * b->ges));
  }
  TRY("the checked call", lp_call(b, 0, settings, 0));
  TRY("synchronizing after the checked call", rlk_stream_synchronize(b->ctx, NULL));
  if (!p->bwd) {
    float *src[3] = {t->logp, t->lse, t->ent};
    for (int k = 0; k < (p->entropy ? 3 : 2); k++)
      TRY("reading the outputs", rlk_memcpy_to_host(b->ctx, out[k], src[k], (size_t)p->N * 4));
  } else {
    const size_t row = (size_t)p->V * b->ges;
    for (int r = 0; r < b->nrows; r++)
      TRY("reading the gradient", rlk_memcpy_to_host(b->ctx, (char *)grad_rows + (size_t)r * row, (char *)t->grad + (size_t)b->rows[r] * row,
                             row));
  }
  return RLK_OK;
}

/* Checks one candidate's outputs against the reference; its error relative to the tolerance. */
static double lp_check_outputs(lp_bench *b, char *where, size_t size) {
  const lp_problem *p = &b->p;
  double err = 0;
  if (p->bwd)
    return compare(b->got_grad, b->ref_grad, p->grad, (size_t)b->nrows * (size_t)p->V, rtol_of(p->grad), where, size,
                   "grad_logits (checked rows)");
  static const char *const names[3] = {"logp", "lse", "entropy"};
  for (int o = 0; o < (p->entropy ? 3 : 2); o++) {
    char w[256];
    double e = compare(b->got[o], b->ref[o], RLK_F32, (size_t)p->N, rtol_of(RLK_F32), w, sizeof w, names[o]);
    if (e > err) {
      err = e;
      snprintf(where, size, "%s", w);
    }
  }
  return err;
}

/* ---- the tune_op interface ---- */

static char *lp_input_line(const void *problem) {
  const lp_problem *p = problem;
  if (!p->bwd) return NULL;
  return xasprintf("logprob pass=fwd logits=%s labels=%s entropy=%d vocab=%" PRId64, rlk_dtype_name(p->logits),
                   rlk_dtype_name(p->labels), p->entropy, p->V);
}

static rlk_status lp_op_setup(rlk_context *ctx, const void *problem, uint64_t seed, double l2, void **bench,
                              char *why, size_t size) {
  lp_bench *b = xrealloc(NULL, sizeof *b);
  *bench = b;
  rlk_status st = lp_bench_setup(ctx, problem, seed, l2, b, why, size);
  if (st) return st;
  const lp_problem *p = &b->p;
  for (int k = 0; k < 3; k++) {
    b->ref[k] = xrealloc(NULL, (size_t)p->N * 4);
    b->got[k] = xrealloc(NULL, (size_t)p->N * 4);
  }
  if (p->bwd) {
    const size_t grad_bytes = (size_t)b->nrows * (size_t)p->V * b->ges;
    b->ref_grad = xrealloc(NULL, grad_bytes);
    b->got_grad = xrealloc(NULL, grad_bytes);
  }
  return RLK_OK;
}

static int lp_op_nsets(const void *bench) { return ((const lp_bench *)bench)->nsets; }

static rlk_status lp_op_call(void *bench, int set, const char *settings) { return lp_call(bench, set, settings, 0); }

static rlk_status lp_op_checked_call(void *bench, const char *settings, int reference, char *why, size_t size) {
  lp_bench *b = bench;
  return lp_checked_call(b, settings, reference ? b->ref : b->got, reference ? b->ref_grad : b->got_grad, why, size);
}

static double lp_op_check(void *bench, char *where, size_t size) { return lp_check_outputs(bench, where, size); }

static const tune_op tune_op_logprob = {"logprob",       sizeof(lp_problem), lp_problem_of,      lp_input_line,
                                        lp_op_setup,     lp_op_nsets,        lp_op_call,         lp_op_checked_call,
                                        lp_op_check,     lp_op_destroy};

#endif
