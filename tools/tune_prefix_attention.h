/* tune_prefix_attention.h - rlk-tune's inputs, calls and output checks of prefix_attention
 * (tune_op.h). A record's key gives the heads and the layout's (bucketed) means: the problem is
 * P prompts of `prefix` tokens with `group` responses of `response` tokens each, P the whole
 * number of prompts nearest to the line's token count. Random q, k, v (and grad_out); the
 * backward's out and lse come from the default forward. Sampled token rows of every output are
 * compared with the default's, relative to the largest value of each. */
#ifndef RLK_TUNE_PREFIX_ATTENTION_H
#define RLK_TUNE_PREFIX_ATTENTION_H

#include "tune_op.h"

typedef struct pa_problem {
  int bwd;
  rlk_dtype dtype;
  int64_t D, Hq, Hkv, G, Lp, Lr, P, T;
} pa_problem;

static int pa_problem_of(const rlk_tune_record *key, int64_t tokens, void *problem, char *why, size_t size) {
  pa_problem *p = problem;
  p->bwd = key_is(key, "pass", "bwd");
  p->dtype = key_dtype(key, "dtype");
  const char *const names[6] = {"head_dim", "q_heads", "kv_heads", "group", "prefix", "response"};
  int64_t *const dst[6] = {&p->D, &p->Hq, &p->Hkv, &p->G, &p->Lp, &p->Lr};
  for (int i = 0; i < 6; i++) *dst[i] = key_int(key, names[i]);
  const int64_t per_prompt = p->Lp + p->G * p->Lr;
  if (!p->dtype || p->D <= 0 || p->Hq <= 0 || p->Hkv <= 0 || p->Lr <= 0 || per_prompt <= 0 || tokens <= 0) {
    snprintf(why, size, "cannot read the problem from '%s'", key->shape);
    return -1;
  }
  p->P = (tokens + per_prompt / 2) / per_prompt;
  if (p->P < 1) p->P = 1;
  p->T = p->P * per_prompt;
  if (p->P > 65535 || p->T > INT32_MAX) {
    snprintf(why, size, "'%s' at %" PRId64 " tokens: %" PRId64 " prompts of %" PRId64 " tokens is too large", key->shape,
             tokens, p->P, per_prompt);
    return -1;
  }
  return 0;
}

static char *pa_input_line(const void *problem) {
  const pa_problem *p = problem;
  if (!p->bwd) return NULL;
  return xasprintf("prefix_attention pass=fwd dtype=%s head_dim=%" PRId64, rlk_dtype_name(p->dtype), p->D);
}

/* One input set: q, k, v (and grad_out) random; out and lse (the backward's from the default
 * forward); the backward's gradients. */
typedef struct pa_set {
  void *q, *k, *v, *dout, *out, *dq, *dk, *dv;
  float *lse;
} pa_set;

typedef struct pa_bench {
  rlk_context *ctx;
  pa_problem p;
  int32_t *host_seq, *host_grp;
  void *seq, *grp; /* their device copies */
  int nsets;
  pa_set set[MAX_ROTATE];
  void *work;
  size_t work_bytes;
  int64_t rows[MAX_CHECK_ROWS]; /* sampled tokens */
  int nrows;
  /* the sampled rows of the outputs: [0] the default's, [1] a candidate's; per output o, nrows
   * rows of pa_out_width(o) values */
  void *kept[2][4];
} pa_bench;

/* The compared outputs: fwd out (Hq x D) and lse (Hq); bwd dq (Hq x D), dk and dv (Hkv x D). */
static int pa_nout(const pa_problem *p) { return p->bwd ? 3 : 2; }

static int64_t pa_out_width(const pa_problem *p, int o) {
  if (!p->bwd) return o == 0 ? p->Hq * p->D : p->Hq;
  return (o == 0 ? p->Hq : p->Hkv) * p->D;
}

static rlk_dtype pa_out_dtype(const pa_problem *p, int o) { return !p->bwd && o == 1 ? RLK_F32 : p->dtype; }

static void *pa_out_ptr(const pa_bench *b, const pa_set *t, int o) {
  if (!b->p.bwd) return o == 0 ? t->out : (void *)t->lse;
  return o == 0 ? t->dq : o == 1 ? t->dk : t->dv;
}

static const char *pa_out_name(const pa_problem *p, int o) {
  static const char *const fwd[] = {"out", "lse"}, *const bwd[] = {"grad_q", "grad_k", "grad_v"};
  return p->bwd ? bwd[o] : fwd[o];
}

/* Frees a bench and all it holds (NULL: nothing). */
static void pa_destroy(void *bench) {
  pa_bench *b = bench;
  if (!b) return;
  for (int s = 0; s < b->nsets; s++) {
    pa_set *t = &b->set[s];
    void *const all[] = {t->q, t->k, t->v, t->dout, t->out, t->dq, t->dk, t->dv, t->lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) rlk_free(b->ctx, all[i]);
  }
  rlk_free(b->ctx, b->seq);
  rlk_free(b->ctx, b->grp);
  rlk_free(b->ctx, b->work);
  free(b->host_seq);
  free(b->host_grp);
  for (int r = 0; r < 2; r++)
    for (int o = 0; o < 4; o++) free(b->kept[r][o]);
  free(b);
}

/* A candidate's settings ("variant=mma fwd_stages=3", "" for the default) as a call's tuning. */
static rlk_prefix_attention_tuning pa_tuning_of(const char *settings) {
  rlk_prefix_attention_tuning t;
  memset(&t, 0, sizeof t);
  char line[512], v[64];
  snprintf(line, sizeof line, " %s", settings);
  if (setting_of(line, "variant", v, sizeof v))
    t.variant = !strcmp(v, "portable") ? RLK_PREFIX_ATTENTION_VARIANT_PORTABLE
                : !strcmp(v, "mma")    ? RLK_PREFIX_ATTENTION_VARIANT_MMA
                : !strcmp(v, "wgmma")  ? RLK_PREFIX_ATTENTION_VARIANT_WGMMA
                                       : RLK_PREFIX_ATTENTION_VARIANT_AUTO;
  setting_int(settings, "fwd_stages", &t.fwd_stages);
  setting_int(settings, "dkdv_stages", &t.dkdv_stages);
  setting_int(settings, "dq_stages", &t.dq_stages);
  return t;
}

static rlk_prefix_attention_layout pa_layout(const pa_bench *b) {
  const pa_problem *p = &b->p;
  rlk_prefix_attention_layout l;
  memset(&l, 0, sizeof l);
  const int64_t S = p->P * (p->G + 1);
  l.seq_offsets = rlk_tensor_1d(b->seq, RLK_I32, S + 1);
  l.group_offsets = rlk_tensor_1d(b->grp, RLK_I32, p->P + 1);
  l.host_seq_offsets = b->host_seq;
  l.host_group_offsets = b->host_grp;
  l.num_segments = S;
  l.num_prompts = p->P;
  return l;
}

static rlk_tensor pa_heads(void *data, rlk_dtype d, int64_t T, int64_t H, int64_t D) {
  rlk_tensor t = rlk_tensor_2d(data, d, T, H * D, H * D);
  t.ndim = 3;
  t.shape[0] = T;
  t.shape[1] = H;
  t.shape[2] = D;
  t.strides[0] = H * D;
  t.strides[1] = D;
  t.strides[2] = 1;
  return t;
}

static void pa_forward_args(const pa_bench *b, const pa_set *t, rlk_prefix_attention_args *a) {
  const pa_problem *p = &b->p;
  rlk_prefix_attention_args_init(a);
  a->q = pa_heads(t->q, p->dtype, p->T, p->Hq, p->D);
  a->k = pa_heads(t->k, p->dtype, p->T, p->Hkv, p->D);
  a->v = pa_heads(t->v, p->dtype, p->T, p->Hkv, p->D);
  a->layout = pa_layout(b);
  a->out = pa_heads(t->out, p->dtype, p->T, p->Hq, p->D);
  a->lse = rlk_tensor_2d(t->lse, RLK_F32, p->T, p->Hq, p->Hq);
}

static void pa_backward_args(const pa_bench *b, const pa_set *t, const char *settings,
                             rlk_prefix_attention_backward_args *a) {
  const pa_problem *p = &b->p;
  rlk_prefix_attention_args f; /* the forward's q, k, v, layout, out and lse */
  pa_forward_args(b, t, &f);
  rlk_prefix_attention_backward_args_init(a);
  a->q = f.q;
  a->k = f.k;
  a->v = f.v;
  a->layout = f.layout;
  a->out = f.out;
  a->lse = f.lse;
  a->grad_out = pa_heads(t->dout, p->dtype, p->T, p->Hq, p->D);
  a->grad_q = pa_heads(t->dq, p->dtype, p->T, p->Hq, p->D);
  a->grad_k = pa_heads(t->dk, p->dtype, p->T, p->Hkv, p->D);
  a->grad_v = pa_heads(t->dv, p->dtype, p->T, p->Hkv, p->D);
  a->workspace = b->work;
  a->workspace_bytes = b->work_bytes;
  a->tuning = pa_tuning_of(settings);
}

static rlk_status pa_call(void *bench, int s, const char *settings) {
  pa_bench *b = bench;
  pa_set *t = &b->set[s];
  if (b->p.bwd) {
    rlk_prefix_attention_backward_args a;
    pa_backward_args(b, t, settings, &a);
    return rlk_prefix_attention_backward(b->ctx, &a, NULL);
  }
  rlk_prefix_attention_args a;
  pa_forward_args(b, t, &a);
  a.tuning = pa_tuning_of(settings);
  return rlk_prefix_attention(b->ctx, &a, NULL);
}

static rlk_status pa_setup(rlk_context *ctx, const void *problem, uint64_t seed, double l2, void **bench, char *why,
                           size_t whysize) {
  pa_bench *b = xrealloc(NULL, sizeof *b);
  memset(b, 0, sizeof *b);
  *bench = b;
  b->ctx = ctx;
  b->p = *(const pa_problem *)problem;
  const pa_problem *p = &b->p;
  /* the layout */
  const int64_t S = p->P * (p->G + 1);
  b->host_seq = xrealloc(NULL, (size_t)(S + 1) * sizeof *b->host_seq);
  b->host_grp = xrealloc(NULL, (size_t)(p->P + 1) * sizeof *b->host_grp);
  int64_t tok = 0, seg = 0;
  b->host_seq[0] = 0;
  for (int64_t q = 0; q < p->P; q++) {
    b->host_grp[q] = (int32_t)seg;
    for (int64_t g = 0; g <= p->G; g++) {
      tok += g ? p->Lr : p->Lp;
      b->host_seq[++seg] = (int32_t)tok;
    }
  }
  b->host_grp[p->P] = (int32_t)S;
  TRY("allocating device memory", rlk_malloc(ctx, (size_t)(S + 1) * 4, &b->seq));
  TRY("allocating device memory", rlk_malloc(ctx, (size_t)(p->P + 1) * 4, &b->grp));
  TRY("uploading the layout", rlk_memcpy_to_device(ctx, b->seq, b->host_seq, (size_t)(S + 1) * 4));
  TRY("uploading the layout", rlk_memcpy_to_device(ctx, b->grp, b->host_grp, (size_t)(p->P + 1) * 4));
  /* the sets */
  const size_t nq = (size_t)(p->T * p->Hq * p->D), nkv = (size_t)(p->T * p->Hkv * p->D);
  const double set_bytes = 2.0 * (double)(nq + 2 * nkv) * (p->bwd ? 2.0 : 1.0) + (double)nq * 2.0 + 4.0 * (double)(p->T * p->Hq);
  b->nsets = set_bytes <= l2 ? (int)fmin(MAX_ROTATE, ceil(2.0 * l2 / set_bytes)) : 1;
  uint64_t rng = seed;
  rlk_status st = RLK_OK;
  for (int s = 0; s < b->nsets && !st; s++) {
    pa_set *t = &b->set[s];
    if (!st) st = upload_random16(ctx, &t->q, p->dtype, nq, &rng, -1.0, 1.0, why, whysize);
    if (!st) st = upload_random16(ctx, &t->k, p->dtype, nkv, &rng, -1.0, 1.0, why, whysize);
    if (!st) st = upload_random16(ctx, &t->v, p->dtype, nkv, &rng, -1.0, 1.0, why, whysize);
    if (!st) st = alloc_dev(ctx, nq * 2, &t->out, why, whysize);
    if (!st) st = alloc_dev(ctx, (size_t)(p->T * p->Hq) * 4, (void **)&t->lse, why, whysize);
    if (!st && p->bwd) {
      st = upload_random16(ctx, &t->dout, p->dtype, nq, &rng, -1.0, 1.0, why, whysize);
      if (!st) st = alloc_dev(ctx, nq * 2, &t->dq, why, whysize);
      if (!st) st = alloc_dev(ctx, nkv * 2, &t->dk, why, whysize);
      if (!st) st = alloc_dev(ctx, nkv * 2, &t->dv, why, whysize);
      rlk_prefix_attention_args a; /* the backward's out and lse: the default forward */
      pa_forward_args(b, t, &a);
      if (!st && (st = rlk_prefix_attention(ctx, &a, NULL)))
        snprintf(why, whysize, "the default forward (the backward's out and lse): %s", rlk_last_error());
    }
  }
  if (st) return st;
  TRY("synchronizing", rlk_stream_synchronize(ctx, NULL));
  b->nrows = p->T < MAX_CHECK_ROWS ? (int)p->T : MAX_CHECK_ROWS;
  for (int r = 0; r < b->nrows; r++)
    b->rows[r] = b->nrows == 1 ? 0 : (int64_t)((double)r * (double)(p->T - 1) / (double)(b->nrows - 1));
  for (int k = 0; k < 2; k++)
    for (int o = 0; o < pa_nout(p); o++)
      b->kept[k][o] = xrealloc(NULL, (size_t)b->nrows * (size_t)pa_out_width(p, o) * rlk_dtype_size(pa_out_dtype(p, o)));
  return RLK_OK;
}

static int pa_nsets(const void *bench) { return ((const pa_bench *)bench)->nsets; }

static rlk_status pa_checked_call(void *bench, const char *settings, int reference, char *why, size_t whysize) {
  pa_bench *b = bench;
  const pa_problem *p = &b->p;
  pa_set *t = &b->set[0];
  if (p->bwd) { /* the workspace this candidate's kernels need (timed calls reuse it) */
    rlk_prefix_attention_backward_args a;
    pa_backward_args(b, t, settings, &a);
    size_t need = 0;
    TRY("the workspace size", rlk_prefix_attention_backward_workspace_size(b->ctx, &a, &need));
    const rlk_status st = grow_workspace(b->ctx, need, &b->work, &b->work_bytes, why, whysize);
    if (st) return st;
  }
  for (int o = 0; o < pa_nout(p); o++)
    TRY("poisoning the outputs", rlk_memset(b->ctx, pa_out_ptr(b, t, o), 0xff,
                                            (size_t)p->T * (size_t)pa_out_width(p, o) * rlk_dtype_size(pa_out_dtype(p, o))));
  TRY("the checked call", pa_call(b, 0, settings));
  TRY("synchronizing after the checked call", rlk_stream_synchronize(b->ctx, NULL));
  for (int o = 0; o < pa_nout(p); o++) {
    const size_t row = (size_t)pa_out_width(p, o) * rlk_dtype_size(pa_out_dtype(p, o));
    for (int r = 0; r < b->nrows; r++)
      TRY("reading the outputs", rlk_memcpy_to_host(b->ctx, (char *)b->kept[reference ? 0 : 1][o] + (size_t)r * row,
                                                    (const char *)pa_out_ptr(b, t, o) + (size_t)b->rows[r] * row, row));
  }
  return RLK_OK;
}

/* The candidate's sampled rows against the default's: each output's largest difference over its
 * largest value, relative to the tolerance (1/32 for 16-bit outputs: the two may round P and
 * dS differently; 1e-4 for lse). NaN (an output not written) never agrees. */
static double pa_check(void *bench, char *where, size_t size) {
  pa_bench *b = bench;
  const pa_problem *p = &b->p;
  double err = 0;
  for (int o = 0; o < pa_nout(p); o++) {
    const rlk_dtype d = pa_out_dtype(p, o);
    const size_t n = (size_t)b->nrows * (size_t)pa_out_width(p, o);
    double scale = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(value_at(b->kept[0][o], d, i)));
    for (size_t i = 0; i < n; i++) {
      const double g = value_at(b->kept[1][o], d, i), e = value_at(b->kept[0][o], d, i);
      const double diff = isnan(g) || isnan(e) ? (isnan(g) && isnan(e) ? 0 : INFINITY) : fabs(g - e);
      if (diff > worst || (isinf(diff) && !isinf(worst))) {
        worst = diff;
        at = i;
      }
    }
    const double tol = d == RLK_F32 ? 1e-4 : 1.0 / 32;
    const double rel = worst / (tol * scale + 1e-30);
    if (rel > err) {
      err = rel;
      snprintf(where, size, "%s[%zu] = %.6g, the default's %.6g (largest |value| %.4g)", pa_out_name(p, o), at,
               value_at(b->kept[1][o], d, at), value_at(b->kept[0][o], d, at), scale);
    }
  }
  return err;
}

static const tune_op tune_op_prefix_attention = {"prefix_attention", sizeof(pa_problem), pa_problem_of, pa_input_line,
                                                 pa_setup,           pa_nsets,           pa_call,       pa_checked_call,
                                                 pa_check,           pa_destroy};

#endif
