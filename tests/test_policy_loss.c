/* test_policy_loss.c - rlk_policy_loss and rlk_value_loss against the fp64 references of
 * tests/ref/policy_loss_ref.c: the rlk contract for every mode, KL estimator, aggregation,
 * layout and mask kind; each trainer's formula (verl, TRL, OpenRLHF) reproduced by rlk with the
 * right arguments; gradients against finite differences in fp64 (the real host kernel, f64);
 * edge cases; bitwise repeatability; argument validation; the precompile plan. GPU cases
 * (RLK_TEST_GPU=1) rerun the contract checks on CUDA against the same references. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/ops.h"
#include "ref/policy_loss_ref.h"
#include "suites.h"
#include "test_util.h"

/* ---------------------------------------------------------------------------------- */
/* A problem: its shape, layout, data and the rlk arguments                             */
/* ---------------------------------------------------------------------------------- */

typedef struct pl_case {
  rlk_dtype dtype;       /* f32 / f64 */
  int packed;            /* 0: [B, T] padded; 1: [N] + offsets */
  rlk_dtype offsets_dtype;
  int64_t B, T;          /* padded: rows x T; packed: B sequences of at most T tokens */
  const int64_t *lens;   /* packed lengths (NULL: random in [0, T], some 0 and 1) */
  int64_t pad_in, pad_out; /* padded: extra elements per row of the inputs / the outputs */
  int misalign;          /* packed: buffers start one element past 16-byte alignment */
  rlk_dtype mask_dtype;  /* RLK_DTYPE_INVALID: no mask */
  double masked;         /* fraction of tokens masked out */
  int empty_rows;        /* every fourth row fully masked */
  int adv_seq, has_ref, has_ent, has_isw, metrics;
  double spread;         /* scale of logp - old_logp */
  double ref_spread;     /* scale of logp - ref_logp */
  int zero_adv;          /* advantages 0 */
  int nan_masked;        /* masked tokens hold NaN inputs */
  int binary_mask;       /* f32 / i32 masks hold only 0 and 1 */
  plref_params p;        /* mode, numbers, aggregation (normalizers set by the test or here) */
  int auto_norm;         /* set the normalizers from the data (local counts, times 1.25) */
  int norm_form;         /* how the normalizers are passed (NORM_*) */
} pl_case;

/* How a case passes its normalizers: numbers, device scalars (f32 [1] or f64 0-d, the numbers
 * left 0), or neither (token-mean then divides by the call's mask count, seq-mean by B). */
enum { NORM_NUMBER = 0, NORM_T32 = 1, NORM_T64 = 2, NORM_NONE = 3 };

static const char *mode_names[] = {"ppo", "gspo", "cispo", "sapo", "reinforce", "geo_mean"};
static const char *kl_names[] = {"k1", "abs", "k2", "k3"};
static const char *agg_names[] = {"token-mean", "token-sum", "seq-mean-token-sum",
                                  "seq-mean-token-mean", "seq-mean-token-sum-norm"};

static void describe(const pl_case *c, char *buf, size_t size) {
  snprintf(buf, size,
           "%s %s%s B=%lld T=%lld mask=%s masked=%.2f adv=%s ref=%d ent=%d isw=%d mode=%s "
           "clip=[%g,%g] dual=%g lr=[%g,%g] kl=%s st=%d kl_coef=%g klclamp=[%g,%g] ent_coef=%g "
           "agg=%s norms=%g/%g/%g scale=%g seed=%llu",
           rlk_dtype_name(c->dtype), c->packed ? "packed-" : "padded",
           c->packed ? rlk_dtype_name(c->offsets_dtype) : "", (long long)c->B, (long long)c->T,
           c->mask_dtype ? rlk_dtype_name(c->mask_dtype) : "none", c->masked,
           c->adv_seq ? "seq" : "token", c->has_ref, c->has_ent, c->has_isw,
           mode_names[c->p.mode], c->p.clip_low, c->p.clip_high, c->p.dual_clip, c->p.lr_min,
           c->p.lr_max, kl_names[c->p.kl], c->p.kl_st, c->p.kl_coef, c->p.kl_in, c->p.kl_out,
           c->p.ent_coef, agg_names[c->p.agg], c->p.token_norm, c->p.seq_norm, c->p.norm_scale,
           c->p.loss_scale, (unsigned long long)rlk_test_seed());
}

/* verl's actor defaults, token-mean, f32, padded with a bool mask. */
static pl_case base_case(int64_t B, int64_t T) {
  return (pl_case){.dtype = RLK_F32, .offsets_dtype = RLK_I64, .B = B, .T = T, .mask_dtype = RLK_BOOL,
      .masked = 0.25, .metrics = 1, .spread = 0.3, .ref_spread = 0.3, .auto_norm = 1,
      .p = {.mode = RLK_POLICY_PPO, .clip_low = 0.2, .clip_high = 0.28, .dual_clip = 3.0, .lr_min = -20,
            .lr_max = 20, .tau_pos = 1.0, .tau_neg = 1.05, .kl = RLK_KL_K3, .kl_coef = 0, .kl_in = 20,
            .kl_out = 10, .agg = RLK_AGG_TOKEN_MEAN, .loss_scale = 1, .bound_g = 1}};
}

/* Generated data: dense fp64 [B, T] views (what the references read; packed rows are padded
 * with mask 0) and the device-layout host copies. */
typedef struct pl_data {
  int64_t B, T, N;        /* N: packed tokens, or B * stride_in for padded */
  int64_t *offs;          /* [B + 1] packed offsets */
  int64_t *len;           /* [B] tokens of each row */
  int64_t sin, sout;      /* padded row strides */
  double *lp, *old, *adv, *ref, *ent, *isw, *mask; /* dense */
  void *h[7];             /* device-layout copies: lp old adv ref ent isw mask */
  size_t hbytes[7];
} pl_data;

enum { D_LP = 0, D_OLD, D_ADV, D_REF, D_ENT, D_ISW, D_MASK };

/* Element index of (row, t) in the device layout of inputs (out = 0) or outputs (out = 1). */
static int64_t dev_index(const pl_case *c, const pl_data *d, int64_t row, int64_t t, int out) {
  if (c->packed) return d->offs[row] + t;
  return row * (out ? d->sout : d->sin) + t;
}

static double draw_mask(uint64_t *rng, const pl_case *c) {
  if (rlk_test_rand_uniform(rng) < c->masked) return 0.0;
  switch (c->mask_dtype) {
  case RLK_I32: return c->binary_mask || rlk_test_rand_uniform(rng) < 0.7 ? 1.0 : 2.0;
  case RLK_F32: return c->binary_mask ? 1.0 : 0.25 + 1.5 * rlk_test_rand_uniform(rng);
  default: return 1.0;
  }
}

/* Is x within a relative margin of a kink at k? */
static int near(double x, double k) {
  return isfinite(k) && fabs(x - k) <= 1e-4 * (1.0 + fabs(k));
}

/* Would f32 rounding put token i on the other side of a kink (a clamp bound, a clip bound, the
 * dual clip)? Such draws are redrawn: the kernel's f32 decision and the fp64 reference's would
 * differ, and the gradient with them. */
static int token_near_kink(const pl_case *c, double lp, double old, double ref, double A) {
  const plref_params *p = &c->p;
  const double d = lp - old;
  if (near(d, p->lr_min) || near(d, p->lr_max)) return 1;
  const double r = exp(d < p->lr_min ? p->lr_min : (d > p->lr_max ? p->lr_max : d));
  if (near(r, 1.0 - p->clip_low) || near(r, 1.0 + p->clip_high)) return 1;
  if (p->dual_clip > 1 && near(r, p->dual_clip)) return 1;
  if (fabs(A) < 1e-3 && A != 0) return 1;
  if (c->has_ref) {
    const double e = lp - ref;
    if (near(e, p->kl_in) || near(e, -p->kl_in)) return 1;
    const double ec = e < -p->kl_in ? -p->kl_in : (e > p->kl_in ? p->kl_in : e);
    const double v = p->kl == 0 ? ec : p->kl == 1 ? fabs(ec) : p->kl == 2 ? 0.5 * ec * ec
                                                                          : exp(-ec) + ec - 1;
    if (near(v, p->kl_out) || near(v, -p->kl_out)) return 1;
  }
  return 0;
}

/* The dtype's rounding of v. */
static double round_to(rlk_dtype d, double v) { return d == RLK_F32 ? (double)(float)v : v; }

static void data_free(pl_data *d) {
  free(d->offs);
  free(d->len);
  free(d->lp);
  free(d->old);
  free(d->adv);
  free(d->ref);
  free(d->ent);
  free(d->isw);
  free(d->mask);
  for (int k = 0; k < 7; k++) free(d->h[k]);
  memset(d, 0, sizeof *d);
}

/* Draws a problem. Values are rounded to the dtype before the dense copies are kept, so the
 * references see exactly what the kernel reads. */
static void data_make(const pl_case *c, uint64_t *rng, pl_data *d) {
  memset(d, 0, sizeof *d);
  const int64_t B = c->B, T = c->T;
  d->B = B;
  d->T = T;
  d->len = calloc((size_t)B, sizeof *d->len);
  d->offs = calloc((size_t)B + 1, sizeof *d->offs);
  for (int64_t b = 0; b < B; b++) {
    if (!c->packed)
      d->len[b] = T;
    else if (c->lens)
      d->len[b] = c->lens[b];
    else {
      const double u = rlk_test_rand_uniform(rng);
      d->len[b] = u < 0.1 ? 0 : (u < 0.2 ? 1 : (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)(T + 1)));
    }
    if (c->packed && !c->lens && b == B - 1 && d->offs[b] == 0 && d->len[b] == 0)
      d->len[b] = 1; /* tensors are never empty: N >= 1 */
    d->offs[b + 1] = d->offs[b] + d->len[b];
  }
  d->sin = T + c->pad_in;
  d->sout = T + c->pad_out;
  const int64_t n_in = c->packed ? d->offs[B] : (B - 1) * d->sin + T;
  d->N = n_in;
  const int64_t dense = B * T;
  double **dn[7] = {&d->lp, &d->old, &d->adv, &d->ref, &d->ent, &d->isw, &d->mask};
  for (int k = 0; k < 7; k++) *dn[k] = calloc((size_t)(dense ? dense : 1), sizeof(double));
  const int present[7] = {1, 1, 1, c->has_ref, c->has_ent, c->has_isw, c->mask_dtype != RLK_DTYPE_INVALID};
  const rlk_dtype dt[7] = {c->dtype, c->dtype, c->dtype, c->dtype, c->dtype, c->dtype, c->mask_dtype};
  const int shift = c->packed && c->misalign ? 1 : 0;
  for (int k = 0; k < 7; k++) {
    if (!present[k]) continue;
    const int64_t elems = (k == D_ADV && c->adv_seq) ? B : n_in;
    d->hbytes[k] = (size_t)(elems + shift) * rlk_dtype_size(dt[k]);
    d->h[k] = malloc(d->hbytes[k] ? d->hbytes[k] : 1);
    memset(d->h[k], 0xff, d->hbytes[k]); /* NaN where nothing is written (padding) */
  }
  for (int64_t b = 0; b < B; b++) {
    const int empty = c->empty_rows && b % 4 == 1;
    const double aseq = c->zero_adv ? 0.0 : round_to(c->dtype, rlk_test_rand_normal(rng));
    if (c->adv_seq) {
      d->adv[b] = aseq;
      rlk_test_store(d->h[D_ADV], c->dtype, b + shift, aseq);
    }
    for (int64_t t = 0; t < d->len[b]; t++) {
      const int64_t i = b * T + t, j = dev_index(c, d, b, t, 0) + shift;
      double m = 1.0;
      if (present[D_MASK]) {
        m = empty ? 0.0 : draw_mask(rng, c);
        rlk_test_store(d->h[D_MASK], c->mask_dtype, j, m);
        m = rlk_test_load(d->h[D_MASK], c->mask_dtype, j);
      }
      double lp, old, ref = 0, A;
      int tries = 0;
      do {
        lp = round_to(c->dtype, -2.0 + 0.8 * rlk_test_rand_normal(rng));
        old = round_to(c->dtype, lp - c->spread * rlk_test_rand_normal(rng));
        if (c->has_ref) ref = round_to(c->dtype, lp - c->ref_spread * rlk_test_rand_normal(rng));
        A = c->adv_seq ? aseq : (c->zero_adv ? 0.0 : round_to(c->dtype, rlk_test_rand_normal(rng)));
      } while (++tries < 50 && token_near_kink(c, lp, old, ref, A));
      const double ent = round_to(c->dtype, 0.5 + rlk_test_rand_uniform(rng));
      const double isw = round_to(c->dtype, 0.5 + rlk_test_rand_uniform(rng));
      const int poison = m == 0.0 && c->nan_masked;
      const double vals[6] = {lp, old, A, ref, ent, isw};
      for (int k = 0; k < 6; k++) {
        if (!present[k] || (k == D_ADV && c->adv_seq)) continue;
        rlk_test_store(d->h[k], c->dtype, j, poison ? NAN : vals[k]);
      }
      d->lp[i] = lp;
      d->old[i] = old;
      if (!c->adv_seq) d->adv[i] = A;
      d->ref[i] = ref;
      d->ent[i] = ent;
      d->isw[i] = isw;
      d->mask[i] = m;
    }
  }
}

/* The contract reference's view of the data. */
static plref_batch ref_batch(const pl_case *c, const pl_data *d) {
  plref_batch b;
  memset(&b, 0, sizeof b);
  b.B = d->B;
  b.T = d->T;
  b.lp = d->lp;
  b.old = d->old;
  b.adv = d->adv;
  b.adv_seq = c->adv_seq;
  b.mask = d->mask;
  b.ref = c->has_ref ? d->ref : NULL;
  b.ent = c->has_ent ? d->ent : NULL;
  b.isw = c->has_isw ? d->isw : NULL;
  return b;
}

/* Normalizers from the data: the local counts, scaled so that a kernel that counted for itself
 * instead of using them would be caught. */
static void auto_norms(pl_case *c, const pl_data *d) {
  double n = 0;
  for (int64_t i = 0; i < d->B * d->T; i++) n += d->mask[i];
  c->p.token_norm = 1.25 * (n > 0 ? n : 1);
  c->p.seq_norm = 1.25 * (double)d->B;
  c->p.norm_scale = (double)(d->T > 0 ? d->T : 1);
}

/* What a call produced, copied back in fp64. */
typedef struct pl_result {
  double loss;
  double metrics[RLK_POLICY_LOSS_METRICS];
  double *grad;     /* dense [B, T] */
  double *grad_ent; /* dense [B, T] */
  void *raw_grad;   /* the device-layout outputs as returned (bitwise comparisons) */
  size_t raw_bytes;
  void *raw_scalars;
} pl_result;

static void result_free(pl_result *r) {
  free(r->grad);
  free(r->grad_ent);
  free(r->raw_grad);
  free(r->raw_scalars);
  memset(r, 0, sizeof *r);
}

/* Fills the rlk arguments for a case over uploaded buffers. */
static void fill_args(const pl_case *c, const pl_data *d, void *const dv[7], void *offs_d,
                      rlk_policy_loss_args *a) {
  rlk_policy_loss_args_init(a);
  const int shift = c->packed && c->misalign ? 1 : 0;
  const size_t es = rlk_dtype_size(c->dtype);
#define DEVP(k) (dv[k] ? (void *)((char *)dv[k] + (size_t)shift * \
                          (k == D_MASK ? rlk_dtype_size(c->mask_dtype) : es)) : NULL)
  rlk_tensor t[7];
  memset(t, 0, sizeof t);
  for (int k = 0; k < 7; k++) {
    if (!dv[k]) continue;
    const rlk_dtype dt = k == D_MASK ? c->mask_dtype : c->dtype;
    if (k == D_ADV && c->adv_seq)
      t[k] = rlk_tensor_1d(DEVP(k), dt, d->B);
    else if (c->packed)
      t[k] = rlk_tensor_1d(DEVP(k), dt, d->offs[d->B]);
    else
      t[k] = rlk_tensor_2d(DEVP(k), dt, d->B, d->T, d->sin);
  }
#undef DEVP
  a->logp = t[D_LP];
  a->old_logp = t[D_OLD];
  a->advantages = t[D_ADV];
  a->seq_advantages = c->adv_seq;
  a->ref_logp = t[D_REF];
  a->entropy = t[D_ENT];
  a->rollout_is_weights = t[D_ISW];
  a->mask = t[D_MASK];
  if (c->packed) a->seq_offsets = rlk_tensor_1d(offs_d, c->offsets_dtype, d->B + 1);
  a->mode = c->p.mode;
  a->clip_low = c->p.clip_low;
  a->clip_high = c->p.clip_high;
  a->dual_clip = c->p.dual_clip;
  a->log_ratio_min = c->p.lr_min;
  a->log_ratio_max = c->p.lr_max;
  a->sapo_tau_pos = c->p.tau_pos;
  a->sapo_tau_neg = c->p.tau_neg;
  a->kl_estimator = c->p.kl;
  a->kl_coef = c->p.kl_coef;
  a->kl_input_clamp = c->p.kl_in;
  a->kl_output_clamp = c->p.kl_out;
  a->kl_straight_through = c->p.kl_st;
  a->entropy_coef = c->p.ent_coef;
  a->agg = c->p.agg;
  a->token_normalizer = c->p.token_norm;
  a->seq_normalizer = c->p.seq_norm;
  a->norm_scale = c->p.norm_scale;
  a->loss_scale = c->p.loss_scale;
  a->seq_ratio_grad = c->p.seq_grad;
  a->clamp_bound_grad = c->p.bound_g;
}

/* Puts a case's normalizers into the arguments as its form says; bufs get what was uploaded
 * (freed by the caller). */
static void set_norms(rlk_context *ctx, int form, double tn, double sn, double *tn_out,
                      double *sn_out, rlk_tensor *tt, rlk_tensor *st, void *bufs[2]) {
  bufs[0] = bufs[1] = NULL;
  if (form == NORM_NUMBER) {
    *tn_out = tn;
    *sn_out = sn;
    return;
  }
  *tn_out = *sn_out = 0;
  if (form == NORM_NONE) return;
  const double v[2] = {tn, sn};
  for (int k = 0; k < 2; k++) {
    rlk_tensor *t = k ? st : tt;
    if (form == NORM_T32) {
      const float f = (float)v[k];
      bufs[k] = rlk_test_dev_upload(ctx, &f, sizeof f);
      *t = rlk_tensor_1d(bufs[k], RLK_F32, 1);
    } else {
      bufs[k] = rlk_test_dev_upload(ctx, &v[k], sizeof v[k]);
      memset(t, 0, sizeof *t);
      t->data = bufs[k];
      t->dtype = RLK_F64;
      t->ndim = 0;
    }
  }
}

/* The per-token gradient `name` a call wrote at g (c's output layout, `shift` elements in) as
 * dense [B, T] doubles (malloc'd; padding 0); fails on a token left unwritten and, with
 * `padding`, on padding between rows that was written. */
static double *read_token_grad(const pl_case *c, const pl_data *d, const void *g, int shift, int padding,
                               const char *name, const char *what) {
  double *dense = calloc((size_t)(d->B * d->T > 0 ? d->B * d->T : 1), sizeof(double));
  ck_assert_ptr_nonnull(dense);
  for (int64_t b = 0; b < d->B; b++) {
    for (int64_t t = 0; t < d->len[b]; t++) {
      const int64_t j = dev_index(c, d, b, t, 1) + shift;
      ck_assert_msg(!rlk_test_is_poison(g, c->dtype, j), "%s: %s[%lld, %lld] not written", what, name, (long long)b,
                    (long long)t);
      dense[b * d->T + t] = rlk_test_load(g, c->dtype, j);
    }
    if (padding && !c->packed && b + 1 < d->B)
      for (int64_t t = d->T; t < d->sout; t++)
        ck_assert_msg(rlk_test_is_poison(g, c->dtype, b * d->sout + t), "%s: %s padding [%lld, %lld] written", what,
                      name, (long long)b, (long long)t);
  }
  return dense;
}

/* Runs rlk_policy_loss on ctx for a case and data; outputs poisoned first; checks that every
 * token's gradient was written and no padding was; returns the results in fp64. */
static void pl_call_case(rlk_context *ctx, const pl_case *c, const pl_data *d, pl_result *res) {
  memset(res, 0, sizeof *res);
  char what[1024];
  describe(c, what, sizeof what);
  void *dv[7] = {0};
  for (int k = 0; k < 7; k++)
    if (d->h[k]) dv[k] = rlk_test_dev_upload(ctx, d->h[k], d->hbytes[k]);
  void *offs_d = c->packed ? rlk_test_upload_offsets(ctx, c->offsets_dtype, d->offs, d->B + 1) : NULL;
  const size_t es = rlk_dtype_size(c->dtype);
  const int shift = c->packed && c->misalign ? 1 : 0;
  const int64_t n_out = c->packed ? d->offs[d->B] : (d->B - 1) * d->sout + d->T;
  const size_t gbytes = (size_t)(n_out + shift) * es;
  void *g_d = rlk_test_dev_alloc(ctx, gbytes), *ge_d = NULL;
  ck_assert_int_eq(rlk_memset(ctx, g_d, 0xff, gbytes), RLK_OK);
  const int want_gent = c->p.ent_coef != 0;
  if (want_gent) {
    ge_d = rlk_test_dev_alloc(ctx, gbytes);
    ck_assert_int_eq(rlk_memset(ctx, ge_d, 0xff, gbytes), RLK_OK);
  }
  const size_t sbytes = (size_t)(1 + RLK_POLICY_LOSS_METRICS) * es;
  void *s_d = rlk_test_dev_alloc(ctx, sbytes);
  ck_assert_int_eq(rlk_memset(ctx, s_d, 0xff, sbytes), RLK_OK);

  rlk_policy_loss_args a;
  fill_args(c, d, dv, offs_d, &a);
  void *nb[2];
  set_norms(ctx, c->norm_form, c->p.token_norm, c->p.seq_norm, &a.token_normalizer,
            &a.seq_normalizer, &a.token_normalizer_tensor, &a.seq_normalizer_tensor, nb);
  a.loss = rlk_tensor_1d(s_d, c->dtype, 1);
  if (c->metrics) a.metrics = rlk_tensor_1d((char *)s_d + es, c->dtype, RLK_POLICY_LOSS_METRICS);
  if (c->packed) {
    a.grad_logp = rlk_tensor_1d((char *)g_d + shift * es, c->dtype, d->offs[d->B]);
    if (want_gent) a.grad_entropy = rlk_tensor_1d((char *)ge_d + shift * es, c->dtype, d->offs[d->B]);
  } else {
    a.grad_logp = rlk_tensor_2d(g_d, c->dtype, d->B, d->T, d->sout);
    if (want_gent) a.grad_entropy = rlk_tensor_2d(ge_d, c->dtype, d->B, d->T, d->sout);
  }
  size_t ws = 0;
  rlk_status st = rlk_policy_loss_workspace_size(ctx, &a, &ws);
  ck_assert_msg(st == RLK_OK, "%s: workspace size: %s", what, rlk_last_error());
  void *w_d = NULL;
  if (ws) {
    w_d = rlk_test_dev_alloc(ctx, ws);
    ck_assert_int_eq(rlk_memset(ctx, w_d, 0xff, ws), RLK_OK);
  }
  a.workspace = w_d;
  a.workspace_bytes = ws;
  rlk_test_expect_call_done(ctx, rlk_policy_loss(ctx, &a, NULL), what);

  void *g = malloc(gbytes), *ge = want_gent ? malloc(gbytes) : NULL, *s = malloc(sbytes);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, g, g_d, gbytes), RLK_OK);
  if (ge) ck_assert_int_eq(rlk_memcpy_to_host(ctx, ge, ge_d, gbytes), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, s, s_d, sbytes), RLK_OK);

  /* every token written; padding between rows untouched */
  res->grad = read_token_grad(c, d, g, shift, 1, "grad_logp", what);
  res->grad_ent = ge ? read_token_grad(c, d, ge, shift, 0, "grad_entropy", what)
                     : calloc((size_t)(d->B * d->T > 0 ? d->B * d->T : 1), sizeof(double));
  if (shift) ck_assert_msg(rlk_test_is_poison(g, c->dtype, 0), "%s: element before grad_logp written", what);
  res->loss = rlk_test_load(s, c->dtype, 0);
  for (int k = 0; k < RLK_POLICY_LOSS_METRICS; k++)
    res->metrics[k] = c->metrics ? rlk_test_load(s, c->dtype, 1 + k) : NAN;
  if (!c->metrics)
    for (int k = 0; k < RLK_POLICY_LOSS_METRICS; k++)
      ck_assert_msg(rlk_test_is_poison(s, c->dtype, 1 + k), "%s: metrics written though absent", what);
  res->raw_grad = g;
  res->raw_bytes = gbytes;
  res->raw_scalars = s;
  free(ge);
  for (int k = 0; k < 7; k++) rlk_free(ctx, dv[k]);
  rlk_free(ctx, offs_d);
  rlk_free(ctx, g_d);
  rlk_free(ctx, ge_d);
  rlk_free(ctx, s_d);
  rlk_free(ctx, w_d);
  rlk_free(ctx, nb[0]);
  rlk_free(ctx, nb[1]);
}

/* Tolerances. Per token: f64 a few hundred ulps, f32 a few ulps of each factor (exp, products)
 * relative to the token's term. Sums: that, plus accumulation (f32 partial sums on a GPU),
 * relative to the sum of the terms' magnitudes. */
static double tol_token(const pl_case *c) { return c->dtype == RLK_F64 ? 1e-11 : 4e-6; }
static double tol_sum(const pl_case *c) { return c->dtype == RLK_F64 ? 1e-11 : 2e-5; }

/* Compares a result with the contract reference. */
static void check_against_ref(const pl_case *c, const pl_data *d, const pl_result *res) {
  char what[1024];
  describe(c, what, sizeof what);
  const int64_t dense = d->B * d->T;
  plref_batch b = ref_batch(c, d);
  plref_out o;
  memset(&o, 0, sizeof o);
  o.grad_lp = calloc((size_t)(dense ? dense : 1), sizeof(double));
  o.grad_ent = calloc((size_t)(dense ? dense : 1), sizeof(double));
  o.grad_abs = calloc((size_t)(dense ? dense : 1), sizeof(double));
  ck_assert_int_eq(plref_rlk(&b, &c->p, &o), 0);

  const double rel = tol_token(c), acc = tol_sum(c);
  for (int64_t bb = 0; bb < d->B; bb++)
    for (int64_t t = 0; t < d->len[bb]; t++) {
      const int64_t i = bb * d->T + t;
      const double got = res->grad[i], want = o.grad_lp[i];
      if (d->mask[i] == 0) {
        ck_assert_msg(got == 0.0, "%s: grad_logp[%lld, %lld] = %g under a zero mask", what,
                      (long long)bb, (long long)t, got);
        if (c->p.ent_coef != 0)
          ck_assert_msg(res->grad_ent[i] == 0.0, "%s: grad_entropy[%lld, %lld] = %g under a zero mask",
                        what, (long long)bb, (long long)t, res->grad_ent[i]);
        continue;
      }
      /* the policy and KL parts may cancel: relative to the parts' sizes */
      const double tol = rel * o.grad_abs[i] + 1e-300;
      ck_assert_msg(fabs(got - want) <= tol,
                    "%s: grad_logp[%lld, %lld] = %.12g, reference %.12g (lp %.9g old %.9g ref "
                    "%.9g A %.9g, tol %.3g)",
                    what, (long long)bb, (long long)t, got, want, d->lp[i], d->old[i], d->ref[i],
                    c->adv_seq ? d->adv[bb] : d->adv[i], tol);
      if (c->p.ent_coef != 0) {
        const double ge = res->grad_ent[i], gw = o.grad_ent[i];
        ck_assert_msg(fabs(ge - gw) <= rel * fabs(gw) + 1e-300,
                      "%s: grad_entropy[%lld, %lld] = %.12g, reference %.12g", what, (long long)bb,
                      (long long)t, ge, gw);
      }
    }
  const double loss_tol = acc * o.loss_abs + 1e-300;
  ck_assert_msg(fabs(res->loss - o.loss) <= loss_tol, "%s: loss = %.15g, reference %.15g (tol %.3g)",
                what, res->loss, o.loss, loss_tol);
  if (c->metrics)
    for (int k = 0; k < RLK_POLICY_LOSS_METRICS; k++) {
      const double mt = acc * o.metrics_abs[k] + 1e-300;
      ck_assert_msg(fabs(res->metrics[k] - o.metrics[k]) <= mt,
                    "%s: metrics[%d] = %.15g, reference %.15g (tol %.3g)", what, k, res->metrics[k],
                    o.metrics[k], mt);
    }
  free(o.grad_lp);
  free(o.grad_ent);
  free(o.grad_abs);
}

/* One case end to end: data, call, reference. */
static void run_case(rlk_context *ctx, pl_case c, uint64_t *rng) {
  pl_data d;
  data_make(&c, rng, &d);
  if (c.auto_norm) auto_norms(&c, &d);
  pl_result r;
  pl_call_case(ctx, &c, &d, &r);
  check_against_ref(&c, &d, &r);
  result_free(&r);
  data_free(&d);
}

/* ---------------------------------------------------------------------------------- */
/* Families of cases, run on any context                                               */
/* ---------------------------------------------------------------------------------- */

/* Every mode, both dtypes, with clip-higher and dual clip, a k3 KL and an entropy bonus. */
static void cases_modes(rlk_context *ctx, uint64_t *rng) {
  for (int mode = 0; mode < 5; mode++)
    for (int f64 = 0; f64 < 2; f64++) {
      pl_case c = base_case(13, 37 + 4 * f64);
      c.dtype = f64 ? RLK_F64 : RLK_F32;
      c.p.mode = mode;
      c.has_ref = 1;
      c.p.kl_coef = 0.05;
      c.has_ent = 1;
      c.p.ent_coef = f64 ? 0.01 : 0;
      c.has_isw = mode != RLK_POLICY_GSPO && f64;
      c.adv_seq = mode == RLK_POLICY_GSPO || mode == RLK_POLICY_SAPO;
      c.p.agg = mode == RLK_POLICY_GSPO || mode == RLK_POLICY_SAPO ? RLK_AGG_SEQ_MEAN_TOKEN_MEAN
                                                                   : RLK_AGG_TOKEN_MEAN;
      c.spread = 0.25;
      if (mode == RLK_POLICY_GSPO) c.p.lr_min = -INFINITY, c.p.lr_max = 10;
      if (mode == RLK_POLICY_CISPO) c.p.clip_low = INFINITY, c.p.clip_high = 4.0 * f64 + 0.28 * !f64;
      run_case(ctx, c, rng);
      /* without a dual clip, without a KL term, no metrics */
      c.p.dual_clip = 0;
      c.has_ref = 0;
      c.p.kl_coef = 0;
      c.metrics = f64;
      run_case(ctx, c, rng);
    }
  /* GSPO through the sequence mean (per-token advantages, weights, both clip bound
   * conventions), and GMPO (per-token and per-sequence advantages, a token-mean aggregation) */
  for (int f64 = 0; f64 < 2; f64++) {
    pl_case c = base_case(11, 29 + 2 * f64);
    c.dtype = f64 ? RLK_F64 : RLK_F32;
    c.p.mode = RLK_POLICY_GSPO;
    c.p.seq_grad = RLK_SEQ_RATIO_THROUGH_MEAN;
    c.p.lr_min = -INFINITY;
    c.p.lr_max = 10;
    c.has_isw = 1;
    c.has_ref = f64;
    c.p.kl_coef = 0.05 * f64;
    c.p.bound_g = f64 ? 0.0 : 0.5;
    c.spread = 0.25;
    run_case(ctx, c, rng);
    c.p.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
    c.adv_seq = 1;
    run_case(ctx, c, rng);
    c = base_case(11, 29 + 2 * f64);
    c.dtype = f64 ? RLK_F64 : RLK_F32;
    c.p.mode = RLK_POLICY_GEO_MEAN;
    c.p.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
    c.p.lr_min = -INFINITY;
    c.p.lr_max = INFINITY;
    c.p.clip_low = 0.4;
    c.p.clip_high = 0.4;
    c.has_ref = 1;
    c.p.kl_coef = 0.05;
    c.spread = 0.4;
    run_case(ctx, c, rng);
    c.adv_seq = 1;
    c.p.agg = RLK_AGG_TOKEN_MEAN;
    run_case(ctx, c, rng);
  }
}

/* Every KL estimator, with and without the clamps and the straight-through gradient. */
static void cases_kl(rlk_context *ctx, uint64_t *rng) {
  for (int kl = 0; kl < 4; kl++)
    for (int v = 0; v < 4; v++) {
      pl_case c = base_case(7, 29);
      c.dtype = v % 2 ? RLK_F64 : RLK_F32;
      c.has_ref = 1;
      c.ref_spread = 3.0; /* reaches the clamps */
      c.p.kl = kl;
      c.p.kl_coef = 0.1 + 0.2 * v;
      c.p.kl_st = v >= 2;
      c.p.kl_in = v == 1 ? INFINITY : 2.5;
      c.p.kl_out = v == 3 ? INFINITY : 1.5;
      c.p.mode = v == 2 ? RLK_POLICY_REINFORCE : RLK_POLICY_PPO;
      run_case(ctx, c, rng);
    }
}

/* Every aggregation on every layout and mask kind, per-token and per-sequence advantages. */
static void cases_agg_layouts(rlk_context *ctx, uint64_t *rng) {
  static const rlk_dtype masks[] = {RLK_DTYPE_INVALID, RLK_BOOL, RLK_I32, RLK_F32};
  int k = 0;
  for (int agg = 0; agg < 5; agg++)
    for (int layout = 0; layout < 3; layout++, k++) {
      pl_case c = base_case(1 + (int64_t)(rlk_test_rand_u64(rng) % 17), 1 + (int64_t)(rlk_test_rand_u64(rng) % 70));
      c.dtype = k % 3 == 1 ? RLK_F64 : RLK_F32;
      c.p.agg = agg;
      c.packed = layout > 0;
      c.offsets_dtype = layout == 1 ? RLK_I32 : RLK_I64;
      c.mask_dtype = masks[k % 4];
      c.adv_seq = k % 2;
      c.pad_in = layout == 0 && k % 3 == 0 ? 5 : 0;
      c.pad_out = layout == 0 && k % 4 == 1 ? 3 : 0;
      c.misalign = layout > 0 && k % 2;
      c.has_ref = k % 3 != 2;
      c.p.kl_coef = c.has_ref ? 0.02 : 0;
      c.p.kl = k % 4;
      c.has_ent = 1;
      c.p.ent_coef = 0.003;
      c.p.loss_scale = k % 5 == 0 ? 4.0 : 1.0;
      c.p.mode = k % 5;
      c.nan_masked = 1;
      run_case(ctx, c, rng);
    }
}

/* Edge cases: all-masked sequences and batches, single-token sequences, zero advantages, huge
 * log-ratios that hit the clamps, uneven (packed) sequence lengths, B = 1, T = 1. */
static void cases_edges(rlk_context *ctx, uint64_t *rng) {
  for (int mode = 0; mode < 5; mode++) {
    pl_case c = base_case(9, 11);
    c.p.mode = mode;
    c.empty_rows = 1;
    c.p.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
    c.has_ref = 1;
    c.p.kl_coef = 0.1;
    run_case(ctx, c, rng);
    /* the whole batch masked: loss 0, metrics 0, gradients 0 */
    c.masked = 1.0;
    c.p.agg = RLK_AGG_TOKEN_MEAN;
    run_case(ctx, c, rng);
    /* zero advantages */
    c.masked = 0.2;
    c.zero_adv = 1;
    c.dtype = RLK_F64;
    run_case(ctx, c, rng);
    /* huge log-ratios: clamped at +-20 (and at +-2 for a tight clamp) */
    c.zero_adv = 0;
    c.spread = 25.0;
    c.ref_spread = 40.0;
    run_case(ctx, c, rng);
    c.p.lr_min = -2, c.p.lr_max = 2, c.p.kl_in = 3, c.p.kl_out = 2;
    c.dtype = RLK_F32;
    run_case(ctx, c, rng);
  }
  /* single-token sequences, empty ones, uneven lengths; B = 1 and T = 1 */
  static const int64_t lens[] = {1, 1, 0, 5, 1, 0, 64, 3, 1, 17, 2, 0};
  for (int v = 0; v < 4; v++) {
    pl_case c = base_case(12, 64);
    c.packed = 1;
    c.lens = lens;
    c.offsets_dtype = v % 2 ? RLK_I32 : RLK_I64;
    c.p.mode = v == 1 ? RLK_POLICY_GSPO : RLK_POLICY_PPO;
    c.p.agg = v < 2 ? RLK_AGG_SEQ_MEAN_TOKEN_MEAN : RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM;
    c.mask_dtype = v == 3 ? RLK_DTYPE_INVALID : RLK_F32;
    c.adv_seq = v == 1;
    run_case(ctx, c, rng);
  }
  pl_case c = base_case(1, 1);
  run_case(ctx, c, rng);
  c = base_case(1, 300);
  c.p.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
  c.p.mode = RLK_POLICY_GSPO;
  run_case(ctx, c, rng);
  c = base_case(40, 1);
  c.mask_dtype = RLK_DTYPE_INVALID;
  c.p.agg = RLK_AGG_TOKEN_SUM;
  run_case(ctx, c, rng);
}

/* Two calls on the same inputs give bitwise the same outputs. */
static void cases_repeat(rlk_context *ctx, uint64_t *rng) {
  for (int v = 0; v < 4; v++) {
    pl_case c = base_case(33, v < 2 ? 300 : 40);
    c.p.mode = v;
    c.has_ref = 1;
    c.p.kl_coef = 0.05;
    c.has_ent = 1;
    c.p.ent_coef = 0.01;
    c.packed = v == 3;
    c.p.agg = v % 2 ? RLK_AGG_SEQ_MEAN_TOKEN_MEAN : RLK_AGG_TOKEN_MEAN;
    c.mask_dtype = v == 2 ? RLK_F32 : RLK_BOOL;
    pl_data d;
    data_make(&c, rng, &d);
    auto_norms(&c, &d);
    pl_result r1, r2;
    pl_call_case(ctx, &c, &d, &r1);
    pl_call_case(ctx, &c, &d, &r2);
    ck_assert_msg(r1.raw_bytes == r2.raw_bytes && memcmp(r1.raw_grad, r2.raw_grad, r1.raw_bytes) == 0,
                  "mode %s: grad_logp differs between runs", mode_names[v]);
    ck_assert_msg(memcmp(r1.raw_scalars, r2.raw_scalars, (1 + RLK_POLICY_LOSS_METRICS) * 4) == 0,
                  "mode %s: loss or metrics differ between runs", mode_names[v]);
    check_against_ref(&c, &d, &r1);
    result_free(&r1);
    result_free(&r2);
    data_free(&d);
  }
}

/* ---------------------------------------------------------------------------------- */
/* Gradients against finite differences (host kernel, f64)                             */
/* ---------------------------------------------------------------------------------- */

/* Central differences of the loss in logp (and entropy) at a few tokens, against the kernel's
 * gradient. The data keeps every token away from a kink. */
static void fd_check(rlk_context *ctx, pl_case c, uint64_t *rng) {
  char what[1024];
  c.dtype = RLK_F64;
  describe(&c, what, sizeof what);
  pl_data d;
  data_make(&c, rng, &d);
  if (c.auto_norm) auto_norms(&c, &d);
  pl_result base;
  pl_call_case(ctx, &c, &d, &base);
  check_against_ref(&c, &d, &base);
  /* the loss's rounding scale */
  double loss_abs;
  {
    plref_batch rb = ref_batch(&c, &d);
    plref_out o;
    memset(&o, 0, sizeof o);
    o.grad_lp = calloc((size_t)(d.B * d.T), sizeof(double));
    ck_assert_int_eq(plref_rlk(&rb, &c.p, &o), 0);
    loss_abs = o.loss_abs;
    free(o.grad_lp);
  }
  int checked = 0;
  for (int tries = 0; tries < 200 && checked < 10; tries++) {
    const int64_t b = (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)d.B);
    if (d.len[b] == 0) continue;
    const int64_t t = (int64_t)(rlk_test_rand_u64(rng) % (uint64_t)d.len[b]);
    const int64_t i = b * d.T + t, j = dev_index(&c, &d, b, t, 0) + (c.packed && c.misalign);
    if (d.mask[i] == 0) continue;
    for (int which = 0; which < (c.has_ent && c.p.ent_coef != 0 ? 2 : 1); which++) {
      double *dense = which ? d.ent : d.lp;
      void *h = d.h[which ? D_ENT : D_LP];
      const double x0 = dense[i], h0 = 1e-6 * fmax(1.0, fabs(x0));
      double L[2];
      for (int s = 0; s < 2; s++) {
        rlk_test_store(h, RLK_F64, j, x0 + (s ? h0 : -h0));
        pl_result r;
        pl_call_case(ctx, &c, &d, &r);
        L[s] = r.loss;
        result_free(&r);
      }
      rlk_test_store(h, RLK_F64, j, x0);
      const double fd = (L[1] - L[0]) / (2 * h0);
      const double g = which ? base.grad_ent[i] : base.grad[i];
      /* truncation O(h^2) relative to g, rounding of the two losses over 2 h */
      const double tol = 1e-6 * fabs(g) + 64 * DBL_EPSILON * loss_abs / h0 + 1e-12;
      ck_assert_msg(fabs(fd - g) <= tol,
                    "%s: d loss / d %s[%lld, %lld]: kernel %.12g, finite differences %.12g", what,
                    which ? "entropy" : "logp", (long long)b, (long long)t, g, fd);
    }
    checked++;
  }
  ck_assert_msg(checked > 0, "%s: no token to check", what);
  result_free(&base);
  data_free(&d);
}

static void cases_finite_differences(rlk_context *ctx, uint64_t *rng) {
  /* ppo: clip-higher, dual clip, k3 with both clamps active for some tokens, entropy bonus,
   * importance weights, token-mean */
  pl_case c = base_case(6, 23);
  c.has_ref = 1;
  c.ref_spread = 2.0;
  c.p.kl_coef = 0.3;
  c.p.kl_in = 1.5;
  c.p.kl_out = 1.0;
  c.has_ent = 1;
  c.p.ent_coef = 0.02;
  c.has_isw = 1;
  c.spread = 0.5;
  fd_check(ctx, c, rng);
  /* a tight log-ratio clamp (zero gradients where it holds), k2, token-sum */
  c = base_case(5, 17);
  c.p.lr_min = -0.2, c.p.lr_max = 0.25;
  c.has_ref = 1;
  c.p.kl = RLK_KL_K2;
  c.p.kl_coef = 0.5;
  c.p.agg = RLK_AGG_TOKEN_SUM;
  c.p.loss_scale = 0.5;
  fd_check(ctx, c, rng);
  /* sapo, k1, per-sequence means, packed with f32 weights */
  c = base_case(7, 19);
  c.p.mode = RLK_POLICY_SAPO;
  c.has_ref = 1;
  c.p.kl = RLK_KL_K1;
  c.p.kl_coef = 0.2;
  c.p.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
  c.packed = 1;
  c.mask_dtype = RLK_F32;
  c.spread = 1.0;
  fd_check(ctx, c, rng);
  /* reinforce, abs, Dr. GRPO normalization, i32 mask */
  c = base_case(6, 15);
  c.p.mode = RLK_POLICY_REINFORCE;
  c.has_ref = 1;
  c.p.kl = RLK_KL_ABS;
  c.p.kl_coef = 0.7;
  c.p.agg = RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM;
  c.mask_dtype = RLK_I32;
  fd_check(ctx, c, rng);
  /* gspo with per-sequence advantages: the straight-through gradient is the true one; a log
   * ratio clamp that holds for some sequences */
  c = base_case(8, 21);
  c.p.mode = RLK_POLICY_GSPO;
  c.adv_seq = 1;
  c.p.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
  c.p.lr_min = -INFINITY, c.p.lr_max = 0.05;
  c.spread = 0.6;
  c.packed = 1;
  fd_check(ctx, c, rng);
  c.p.agg = RLK_AGG_TOKEN_MEAN;
  c.packed = 0;
  c.p.lr_max = 10;
  fd_check(ctx, c, rng);
}

/* ---------------------------------------------------------------------------------- */
/* Each trainer's formula, reproduced by rlk                                            */
/* ---------------------------------------------------------------------------------- */

enum { TR_VERL = 0, TR_TRL = 1, TR_OPENRLHF = 2 };

/* rlk's metric indices that a trainer reference reports, -1 terminated. */
typedef struct trainer_check {
  int trainer;
  const void *cfg;
  const int *metrics;
  double rtol; /* f64 agreement (verl's 1e-8 in its means allows 1e-7) */
  const char *label;
} trainer_check;

static void compare_trainer(rlk_context *ctx, pl_case c, uint64_t *rng, const trainer_check *tc,
                            void (*setup)(pl_case *, const pl_data *, const void *)) {
  char what[1200], desc[1024];
  c.binary_mask = 1;
  c.nan_masked = 0;
  c.auto_norm = 0;
  setup(&c, NULL, tc->cfg); /* the streams and numbers, before the data is drawn */
  pl_data d;
  data_make(&c, rng, &d);
  setup(&c, &d, tc->cfg); /* the normalizers, from the data */
  describe(&c, desc, sizeof desc);
  snprintf(what, sizeof what, "%s vs rlk (%s)", tc->label, desc);
  pl_result r;
  pl_call_case(ctx, &c, &d, &r);

  const int64_t dense = d.B * d.T;
  plref_batch b = ref_batch(&c, &d);
  plref_out o, k;
  memset(&o, 0, sizeof o);
  memset(&k, 0, sizeof k);
  o.grad_lp = calloc((size_t)dense, sizeof(double));
  o.grad_ent = calloc((size_t)dense, sizeof(double));
  k.grad_lp = calloc((size_t)dense, sizeof(double));
  k.grad_abs = calloc((size_t)dense, sizeof(double));
  int rc = tc->trainer == TR_VERL  ? plref_verl(&b, tc->cfg, &o)
         : tc->trainer == TR_TRL   ? plref_trl(&b, tc->cfg, &o)
                                   : plref_openrlhf(&b, tc->cfg, &o);
  ck_assert_msg(rc == 0, "%s: the reference refused the problem", what);
  ck_assert_int_eq(plref_rlk(&b, &c.p, &k), 0); /* scales for the tolerances */
  const double rtol = c.dtype == RLK_F64 ? tc->rtol : fmax(tc->rtol, 2e-5);
  ck_assert_msg(fabs(r.loss - o.loss) <= rtol * k.loss_abs + 1e-300,
                "%s: loss = %.15g, trainer %.15g", what, r.loss, o.loss);
  for (int64_t bb = 0; bb < d.B; bb++)
    for (int64_t t = 0; t < d.len[bb]; t++) {
      const int64_t i = bb * d.T + t;
      ck_assert_msg(fabs(r.grad[i] - o.grad_lp[i]) <= rtol * k.grad_abs[i] + 1e-300,
                    "%s: grad_logp[%lld, %lld] = %.15g, trainer %.15g", what, (long long)bb,
                    (long long)t, r.grad[i], o.grad_lp[i]);
      if (c.p.ent_coef != 0)
        ck_assert_msg(fabs(r.grad_ent[i] - o.grad_ent[i]) <= rtol * fabs(o.grad_ent[i]) + 1e-300,
                      "%s: grad_entropy[%lld, %lld] = %.15g, trainer %.15g", what, (long long)bb,
                      (long long)t, r.grad_ent[i], o.grad_ent[i]);
    }
  for (int j = 0; tc->metrics && tc->metrics[j] >= 0; j++) {
    const int m = tc->metrics[j];
    ck_assert_msg(fabs(r.metrics[m] - o.metrics[m]) <= 1e-7 * (fabs(o.metrics[m]) + k.metrics_abs[m]) + 1e-12,
                  "%s: metrics[%d] = %.15g, trainer %.15g", what, m, r.metrics[m], o.metrics[m]);
  }
  free(o.grad_lp);
  free(o.grad_ent);
  free(k.grad_lp);
  free(k.grad_abs);
  result_free(&r);
  data_free(&d);
}

static double mask_total(const pl_data *d) {
  double n = 0;
  for (int64_t i = 0; i < d->B * d->T; i++) n += d->mask[i];
  return n;
}

static int tl_agg_index(const char *name) {
  for (int i = 0; i < 5; i++)
    if (!strcmp(agg_names[i], name)) return i;
  ck_abort_msg("unknown aggregation %s", name);
  return -1;
}

/* verl: how its configuration maps onto rlk's arguments. */
static void setup_verl(pl_case *c, const pl_data *d, const void *cfgp) {
  plref_verl_cfg *cfg = (plref_verl_cfg *)cfgp;
  if (d) {
    cfg->batch_num_tokens = 1.5 * mask_total(d) + 1;
    cfg->global_batch_size = 1.5 * (double)d->B;
  }
  const char *m = cfg->loss_mode;
  c->p.mode = !strcmp(m, "vanilla") ? RLK_POLICY_PPO
            : !strcmp(m, "gspo")    ? RLK_POLICY_GSPO
            : !strcmp(m, "cispo")   ? RLK_POLICY_CISPO
            : !strcmp(m, "sapo")    ? RLK_POLICY_SAPO
                                    : RLK_POLICY_REINFORCE;
  c->p.clip_low = cfg->clip_ratio_low;
  c->p.clip_high = cfg->clip_ratio_high;
  c->p.dual_clip = c->p.mode == RLK_POLICY_GSPO ? 0 : cfg->clip_ratio_c; /* gspo: none */
  c->p.lr_min = c->p.mode == RLK_POLICY_GSPO ? -INFINITY : -20;
  c->p.lr_max = c->p.mode == RLK_POLICY_GSPO ? 10 : 20;
  c->p.tau_pos = cfg->tau_pos;
  c->p.tau_neg = cfg->tau_neg;
  c->p.agg = tl_agg_index(cfg->loss_agg_mode);
  c->p.loss_scale = cfg->dp_size;
  c->p.token_norm = cfg->batch_num_tokens;
  c->p.seq_norm = cfg->global_batch_size;
  c->p.norm_scale = cfg->loss_scale_factor;
  c->has_ref = cfg->use_kl_loss;
  c->p.kl_coef = cfg->use_kl_loss ? cfg->kl_loss_coef : 0;
  const char *k = cfg->kl_loss_type;
  c->p.kl_st = k[strlen(k) - 1] == '+';
  c->p.kl = !strncmp(k, "abs", 3) ? RLK_KL_ABS
          : (!strncmp(k, "mse", 3) || !strncmp(k, "k2", 2)) ? RLK_KL_K2
          : (!strncmp(k, "low_var_kl", 10) || !strncmp(k, "k3", 2)) ? RLK_KL_K3
                                                                   : RLK_KL_K1;
  c->p.kl_in = c->p.kl == RLK_KL_K3 ? 20 : INFINITY;
  c->p.kl_out = c->p.kl == RLK_KL_K3 ? 10 : INFINITY;
  c->p.ent_coef = c->has_ent ? cfg->entropy_coeff : 0;
}

static void setup_trl(pl_case *c, const pl_data *d, const void *cfgp) {
  plref_trl_cfg *cfg = (plref_trl_cfg *)cfgp;
  const double n = d ? mask_total(d) : 1;
  const double B = d ? (double)d->B : 1;
  cfg->num_items_in_batch = 2.0 * n + 3;
  cfg->num_processes = 2;
  cfg->max_completion_length = d ? (double)d->T : 1;
  const char *lt = cfg->loss_type;
  c->p.lr_min = -INFINITY;
  c->p.lr_max = INFINITY;
  c->p.dual_clip = 0;
  c->p.mode = cfg->sequence_level ? RLK_POLICY_GSPO : RLK_POLICY_PPO;
  c->p.clip_low = cfg->epsilon_low;
  c->p.clip_high = cfg->epsilon_high;
  c->p.loss_scale = 1.0 / cfg->gradient_accumulation_steps;
  if (!strcmp(lt, "grpo") || !strcmp(lt, "sapo")) {
    c->p.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
    c->p.seq_norm = B;
  } else if (!strcmp(lt, "bnpo")) {
    c->p.agg = RLK_AGG_TOKEN_MEAN;
    c->p.token_norm = n < 1 ? 1 : n;
  } else if (!strcmp(lt, "dr_grpo")) {
    c->p.agg = RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM;
    c->p.seq_norm = B;
    c->p.norm_scale = cfg->max_completion_length;
  } else { /* dapo, cispo: the whole generation batch's tokens per process */
    c->p.agg = RLK_AGG_TOKEN_MEAN;
    c->p.token_norm = cfg->num_items_in_batch / cfg->num_processes;
    c->p.loss_scale = 1.0;
  }
  if (!strcmp(lt, "cispo")) {
    c->p.mode = RLK_POLICY_CISPO;
    c->p.clip_low = INFINITY;              /* one-sided */
    c->p.clip_high = cfg->epsilon_high - 1; /* TRL's epsilon_high is the bound itself */
  }
  if (!strcmp(lt, "sapo")) {
    c->p.mode = RLK_POLICY_SAPO;
    c->p.tau_pos = cfg->sapo_temperature_pos;
    c->p.tau_neg = cfg->sapo_temperature_neg;
  }
  c->has_ref = cfg->beta != 0;
  c->p.kl = RLK_KL_K3;
  c->p.kl_coef = cfg->beta;
  c->p.kl_in = c->p.kl_out = INFINITY;
  c->p.kl_st = 0;
  c->has_ent = 0;
  c->p.ent_coef = 0;
}

static void setup_openrlhf(pl_case *c, const pl_data *d, const void *cfgp) {
  plref_openrlhf_cfg *cfg = (plref_openrlhf_cfg *)cfgp;
  if (d) cfg->global_tokens = 3.0 * mask_total(d) + 1;
  c->p.mode = RLK_POLICY_PPO;
  c->p.lr_min = -20;
  c->p.lr_max = 20;
  c->p.clip_low = cfg->clip_eps_low;
  c->p.clip_high = cfg->clip_eps_high;
  c->p.dual_clip = cfg->dual_clip;
  if (cfg->token_level_loss) {
    c->p.agg = RLK_AGG_TOKEN_MEAN;
    c->p.token_norm = cfg->global_tokens;
  } else {
    c->p.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
    c->p.seq_norm = d ? (double)d->B : 1;
  }
  c->p.loss_scale = 1;
  c->has_ref = cfg->use_kl_loss;
  c->p.kl_coef = cfg->use_kl_loss ? cfg->kl_coef : 0;
  c->p.kl = !strcmp(cfg->kl_estimator, "k1") ? RLK_KL_K1
          : !strcmp(cfg->kl_estimator, "k2") ? RLK_KL_K2
                                             : RLK_KL_K3;
  c->p.kl_in = INFINITY;
  c->p.kl_out = 10;
  c->p.kl_st = 0;
  c->p.ent_coef = c->has_ent ? cfg->entropy_loss_coef : 0;
}

static const int verl_metrics_clip[] = {RLK_PL_METRIC_CLIPFRAC, RLK_PL_METRIC_CLIPFRAC_LOWER,
                                        RLK_PL_METRIC_APPROX_KL, -1};
static const int verl_metrics_gspo[] = {RLK_PL_METRIC_CLIPFRAC, RLK_PL_METRIC_APPROX_KL_RAW, -1};
static const int verl_metrics_kl[] = {RLK_PL_METRIC_APPROX_KL, -1};
static const int trl_metrics[] = {RLK_PL_METRIC_CLIPFRAC, RLK_PL_METRIC_CLIP_LOW,
                                  RLK_PL_METRIC_CLIP_HIGH, -1};

static void cases_verl(rlk_context *ctx, uint64_t *rng, rlk_dtype dtype) {
  static const char *modes[] = {"vanilla", "gspo", "cispo", "sapo", "gpg"};
  static const char *aggs[] = {"token-mean", "token-sum", "seq-mean-token-sum",
                               "seq-mean-token-mean", "seq-mean-token-sum-norm"};
  static const char *kls[] = {"low_var_kl", "kl", "abs", "mse", "k3+", "low_var_kl+", "k1", "k2"};
  int k = 0;
  for (int m = 0; m < 5; m++)
    for (int a = 0; a < 5; a++, k++) {
      /* gspo and sapo force seq-mean-token-mean on the policy term: the whole loss agrees with
       * rlk's single aggregation when the configured one is that too */
      const int forced = m == 1 || m == 3;
      if (forced && a != 3) continue;
      plref_verl_cfg cfg = {modes[m], 0.2, k % 2 ? 0.28 : 0.2, k % 3 ? 3.0 : 10.0, 1.0, 1.05,
                            aggs[a], k % 4 ? 1.0 : 4.0, 0, 0, (double)(32 + k), k % 3 != 1,
                            0.001 * (1 + k), kls[k % 8], 0.01};
      pl_case c = base_case(9, 33);
      c.dtype = dtype;
      c.adv_seq = m == 1;
      c.has_ent = k % 2;
      c.has_isw = m != 1 && k % 3 == 0;
      c.ref_spread = 1.0;
      c.spread = 0.3;
      c.packed = k % 5 == 2;
      c.mask_dtype = k % 7 == 3 ? RLK_I32 : RLK_BOOL;
      trainer_check tc = {TR_VERL, &cfg,
                          m == 0 ? verl_metrics_clip
                          : m == 1 ? verl_metrics_gspo
                          : m == 4 ? NULL /* gpg reports no ratio metrics */
                                   : verl_metrics_kl,
                          1e-7, "verl"};
      compare_trainer(ctx, c, rng, &tc, setup_verl);
    }
}

static void cases_trl(rlk_context *ctx, uint64_t *rng, rlk_dtype dtype) {
  static const char *types[] = {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"};
  for (int t = 0; t < 6; t++)
    for (int v = 0; v < 2; v++) {
      plref_trl_cfg cfg = {types[t], 0.2, v ? 0.28 : 0.2, v ? 0.04 : 0.0, 0, 1.0, 1.05,
                           0, 0, 0, v ? 2.0 : 1.0};
      if (t == 4) cfg.epsilon_high = 5.0;
      pl_case c = base_case(8, 31);
      c.dtype = dtype;
      c.adv_seq = 1; /* TRL's advantages are per sequence */
      c.ref_spread = 0.5;
      c.packed = v;
      trainer_check tc = {TR_TRL, &cfg, t < 4 ? trl_metrics : NULL, 1e-10, "TRL"};
      compare_trainer(ctx, c, rng, &tc, setup_trl);
    }
  /* importance_sampling_level="sequence" (GSPO) with the grpo and dapo aggregations, at the
   * GSPO paper's clip range (3e-4, 4e-4): sequence ratios sit close to the clip bounds, so only
   * in f64, where the kernel's and the reference's decisions agree (f32 GSPO is checked against
   * the contract with wider ranges) */
  for (int v = 0; v < 2 && dtype == RLK_F64; v++) {
    plref_trl_cfg cfg = {v ? "dapo" : "grpo", 3e-4, 4e-4, 0.0, 1, 1.0, 1.05, 0, 0, 0, 1.0};
    pl_case c = base_case(10, 25);
    c.dtype = dtype;
    c.adv_seq = 1;
    c.spread = 0.002;
    trainer_check tc = {TR_TRL, &cfg, trl_metrics, 1e-10, "TRL (sequence level)"};
    compare_trainer(ctx, c, rng, &tc, setup_trl);
  }
}

static void cases_openrlhf(rlk_context *ctx, uint64_t *rng, rlk_dtype dtype) {
  static const char *ests[] = {"k1", "k2", "k3"};
  for (int v = 0; v < 6; v++) {
    plref_openrlhf_cfg cfg = {"ppo", 0.2, v % 2 ? 0.28 : 0.2, v % 3 ? 3.0 : 0.0, v < 3, 0,
                              v % 2 == 0, 0.01 * (v + 1), ests[v % 3], 0.005};
    pl_case c = base_case(7, 27);
    c.dtype = dtype;
    c.has_ent = v % 2;
    c.ref_spread = 3.0; /* the +-10 clamp holds for some k2 tokens */
    c.packed = v == 4;
    trainer_check tc = {TR_OPENRLHF, &cfg, NULL, 1e-10, "OpenRLHF"};
    compare_trainer(ctx, c, rng, &tc, setup_openrlhf);
  }
}

/* The normalizers the reference divides by for a form: an f32 scalar is rounded to f32;
 * without normalizers, the call's own counts (the mask's weight, B). */
static void norms_for_form(int form, const pl_data *d, double *tn, double *sn) {
  if (form == NORM_T32) {
    *tn = (double)(float)*tn;
    *sn = (double)(float)*sn;
  } else if (form == NORM_NONE) {
    double n = 0;
    for (int64_t i = 0; i < d->B * d->T; i++)
      if (d->mask[i] != 0) n += d->mask[i];
    *tn = n > 0 ? n : 1; /* nothing counts: every term is 0 whatever the divisor */
    *sn = (double)d->B;
  }
}

/* Every way of passing the normalizers (device scalars f32 [1] / f64 0-d, none: the call's
 * counts) on every aggregation, layout and mask kind: against the reference, and bitwise the
 * call with the same divisor given as a number (the kernels divide by the same double), except
 * seq-mean-token-sum-norm, whose divisor is then applied in another order. */
static void cases_normalizers(rlk_context *ctx, uint64_t *rng) {
  static const rlk_dtype masks[] = {RLK_BOOL, RLK_F32, RLK_I32, RLK_DTYPE_INVALID};
  int k = 0;
  for (int form = NORM_T32; form <= NORM_NONE; form++)
    for (int agg = 0; agg < 5; agg++)
      for (int layout = 0; layout < 3; layout++, k++) {
        const int big = k % 7 == 3;
        pl_case c = base_case(big ? 61 : 1 + (int64_t)(rlk_test_rand_u64(rng) % 19),
                              big ? 1500 : 1 + (int64_t)(rlk_test_rand_u64(rng) % 90));
        c.dtype = k % 3 == 1 ? RLK_F64 : RLK_F32;
        c.p.agg = agg;
        c.packed = layout > 0;
        c.offsets_dtype = layout == 1 ? RLK_I32 : RLK_I64;
        c.mask_dtype = masks[k % 4];
        c.empty_rows = k % 5 == 2;
        c.masked = k % 11 == 5 ? 1.0 : 0.3;
        c.has_ref = k % 2;
        c.p.kl_coef = c.has_ref ? 0.05 : 0;
        c.p.mode = k % 5;
        /* gspo in f64 under fractional f32 weights differs from the reference by ~1e-8 whatever
         * the normalizer (a matter of the mode, not of the divisor) */
        c.binary_mask = c.p.mode == RLK_POLICY_GSPO;
        c.p.loss_scale = k % 4 == 0 ? 2.0 : 1.0;
        c.nan_masked = 1;
        pl_data d;
        data_make(&c, rng, &d);
        auto_norms(&c, &d);
        norms_for_form(form, &d, &c.p.token_norm, &c.p.seq_norm);
        pl_case n = c; /* the same divisors, as numbers */
        c.norm_form = form;
        pl_result r, rn;
        pl_call_case(ctx, &c, &d, &r);
        check_against_ref(&c, &d, &r);
        pl_call_case(ctx, &n, &d, &rn);
        if (agg != RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM) {
          char what[1024];
          describe(&c, what, sizeof what);
          ck_assert_msg(!memcmp(r.raw_grad, rn.raw_grad, r.raw_bytes), "%s: normalizer form %d: "
                        "gradients differ from the number's", what, form);
          ck_assert_msg(!memcmp(r.raw_scalars, rn.raw_scalars,
                                (1 + RLK_POLICY_LOSS_METRICS) * rlk_dtype_size(c.dtype)),
                        "%s: normalizer form %d: loss or metrics differ from the number's", what, form);
        }
        result_free(&r);
        result_free(&rn);
        data_free(&d);
      }
}

/* ---------------------------------------------------------------------------------- */
/* Value loss                                                                          */
/* ---------------------------------------------------------------------------------- */

/* The policy case's shape fields serve the value loss: lp -> values, old -> old values,
 * adv -> returns. */
typedef struct vl_case {
  pl_case s;   /* dtype, layout, shape, mask */
  double clip;
  int agg;
  double token_norm, seq_norm, norm_scale, loss_scale;
} vl_case;

static vl_case vl_base(int64_t B, int64_t T) {
  return (vl_case){.s = base_case(B, T), .clip = 0.5, .agg = RLK_AGG_TOKEN_MEAN, .loss_scale = 1};
}

static void vl_make(const vl_case *v, uint64_t *rng, pl_data *d) {
  pl_case c = v->s;
  c.has_ref = c.has_ent = c.has_isw = 0;
  c.adv_seq = 0;
  c.spread = 0.4;
  c.p.dual_clip = 0;
  c.p.clip_low = c.p.clip_high = INFINITY;
  data_make(&c, rng, d);
  /* redraw as values, old values and returns, away from the clip's kinks */
  const int shift = c.packed && c.misalign;
  for (int64_t b = 0; b < d->B; b++)
    for (int64_t t = 0; t < d->len[b]; t++) {
      const int64_t i = b * d->T + t, j = dev_index(&c, d, b, t, 0) + shift;
      double val, old, ret;
      int tries = 0;
      for (;;) {
        val = round_to(c.dtype, rlk_test_rand_normal(rng));
        old = round_to(c.dtype, val + 0.6 * rlk_test_rand_normal(rng));
        ret = round_to(c.dtype, val + rlk_test_rand_normal(rng));
        const double dv = val - old;
        const double vc = isinf(v->clip) ? val : old + fmax(-v->clip, fmin(v->clip, dv));
        const double a = (val - ret) * (val - ret), bb = (vc - ret) * (vc - ret);
        if (++tries > 50 || (!near(fabs(dv), v->clip) && !(vc != val && near(a, bb)))) break;
      }
      if (!(c.nan_masked && d->mask[i] == 0)) {
        rlk_test_store(d->h[D_LP], c.dtype, j, val);
        rlk_test_store(d->h[D_OLD], c.dtype, j, old);
        rlk_test_store(d->h[D_ADV], c.dtype, j, ret);
      }
      d->lp[i] = val;
      d->old[i] = old;
      d->adv[i] = ret;
    }
}

typedef struct vl_result {
  double loss, metrics[RLK_VALUE_LOSS_METRICS];
  double *grad;
  void *raw;
  size_t raw_bytes;
  void *raw_scalars;
} vl_result;

static void vl_call(rlk_context *ctx, const vl_case *v, const pl_data *d, vl_result *res) {
  const pl_case *c = &v->s;
  memset(res, 0, sizeof *res);
  char what[512];
  snprintf(what, sizeof what, "value loss %s %s B=%lld T=%lld mask=%s clip=%g agg=%s seed=%llu",
           rlk_dtype_name(c->dtype), c->packed ? "packed" : "padded", (long long)c->B,
           (long long)c->T, c->mask_dtype ? rlk_dtype_name(c->mask_dtype) : "none", v->clip,
           agg_names[v->agg], (unsigned long long)rlk_test_seed());
  void *dv[7] = {0};
  for (int k = 0; k < 7; k++)
    if (d->h[k] && (k <= D_ADV || k == D_MASK)) dv[k] = rlk_test_dev_upload(ctx, d->h[k], d->hbytes[k]);
  void *offs_d = c->packed ? rlk_test_upload_offsets(ctx, c->offsets_dtype, d->offs, d->B + 1) : NULL;
  const size_t es = rlk_dtype_size(c->dtype);
  const int shift = c->packed && c->misalign;
  const int64_t n_out = c->packed ? d->offs[d->B] : (d->B - 1) * d->sout + d->T;
  const size_t gbytes = (size_t)(n_out + shift) * es;
  void *g_d = rlk_test_dev_alloc(ctx, gbytes);
  ck_assert_int_eq(rlk_memset(ctx, g_d, 0xff, gbytes), RLK_OK);
  const size_t sbytes = (size_t)(1 + RLK_VALUE_LOSS_METRICS) * es;
  void *s_d = rlk_test_dev_alloc(ctx, sbytes);
  ck_assert_int_eq(rlk_memset(ctx, s_d, 0xff, sbytes), RLK_OK);

  rlk_policy_loss_args pa;
  fill_args(c, d, dv, offs_d, &pa); /* the tensors, in the policy's field names */
  rlk_value_loss_args a;
  rlk_value_loss_args_init(&a);
  a.values = pa.logp;
  a.old_values = pa.old_logp;
  a.returns = pa.advantages;
  a.mask = pa.mask;
  a.seq_offsets = pa.seq_offsets;
  a.clip = v->clip;
  a.agg = v->agg;
  void *nb[2];
  set_norms(ctx, c->norm_form, v->token_norm, v->seq_norm, &a.token_normalizer, &a.seq_normalizer,
            &a.token_normalizer_tensor, &a.seq_normalizer_tensor, nb);
  a.norm_scale = v->norm_scale;
  a.loss_scale = v->loss_scale;
  a.loss = rlk_tensor_1d(s_d, c->dtype, 1);
  a.metrics = rlk_tensor_1d((char *)s_d + es, c->dtype, RLK_VALUE_LOSS_METRICS);
  a.grad_values = c->packed ? rlk_tensor_1d((char *)g_d + shift * es, c->dtype, d->offs[d->B])
                            : rlk_tensor_2d(g_d, c->dtype, d->B, d->T, d->sout);
  size_t ws = 0;
  ck_assert_msg(rlk_value_loss_workspace_size(ctx, &a, &ws) == RLK_OK, "%s: %s", what, rlk_last_error());
  void *w_d = ws ? rlk_test_dev_alloc(ctx, ws) : NULL;
  a.workspace = w_d;
  a.workspace_bytes = ws;
  rlk_status st = rlk_value_loss(ctx, &a, NULL);
  ck_assert_msg(st == RLK_OK, "%s: %s", what, rlk_last_error());
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  void *g = malloc(gbytes), *s = malloc(sbytes);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, g, g_d, gbytes), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, s, s_d, sbytes), RLK_OK);
  res->grad = read_token_grad(c, d, g, shift, 1, "grad_values", what);
  res->loss = rlk_test_load(s, c->dtype, 0);
  for (int k = 0; k < RLK_VALUE_LOSS_METRICS; k++) res->metrics[k] = rlk_test_load(s, c->dtype, 1 + k);
  res->raw = g;
  res->raw_bytes = gbytes;
  res->raw_scalars = s;
  for (int k = 0; k < 7; k++) rlk_free(ctx, dv[k]);
  rlk_free(ctx, offs_d);
  rlk_free(ctx, g_d);
  rlk_free(ctx, s_d);
  rlk_free(ctx, w_d);
  rlk_free(ctx, nb[0]);
  rlk_free(ctx, nb[1]);
}

static void vl_result_free(vl_result *r) {
  free(r->grad);
  free(r->raw);
  free(r->raw_scalars);
  memset(r, 0, sizeof *r);
}

static vlref_batch vl_ref_batch(const pl_data *d) {
  vlref_batch b = {d->B, d->T, d->lp, d->old, d->adv, d->mask};
  return b;
}

/* Checks a value-loss result against the contract reference. */
static void vl_check(const vl_case *v, const pl_data *d, const vl_result *r) {
  const int64_t dense = d->B * d->T;
  vlref_batch b = vl_ref_batch(d);
  vlref_out o;
  o.grad_v = calloc((size_t)(dense ? dense : 1), sizeof(double));
  ck_assert_int_eq(vlref_rlk(&b, v->clip, v->agg, v->token_norm, v->seq_norm, v->norm_scale,
                             v->loss_scale, &o), 0);
  const int f64 = v->s.dtype == RLK_F64;
  const double rel = f64 ? 1e-11 : 4e-6, acc = f64 ? 1e-11 : 2e-5;
  double labs = 0, n = 0;
  for (int64_t i = 0; i < dense; i++) {
    if (d->mask[i] == 0) continue;
    const double e1 = d->lp[i] - d->adv[i], e2 = fabs(d->lp[i] - d->old[i]) + fabs(d->old[i] - d->adv[i]);
    labs += fabs(d->mask[i]) * (e1 * e1 + e2 * e2);
    n += fabs(d->mask[i]);
  }
  double K = v->loss_scale;
  if (v->agg == 0) K /= v->token_norm;
  if (v->agg == 2 || v->agg == 3) K /= v->seq_norm;
  if (v->agg == 4) K /= v->seq_norm * v->norm_scale;
  for (int64_t bb = 0; bb < d->B; bb++)
    for (int64_t t = 0; t < d->len[bb]; t++) {
      const int64_t i = bb * d->T + t;
      if (d->mask[i] == 0) {
        ck_assert_msg(r->grad[i] == 0.0, "value loss: grad_values[%lld, %lld] = %g under a zero mask",
                      (long long)bb, (long long)t, r->grad[i]);
        continue;
      }
      /* the gradient's terms: v - R and the clipped v_clip - R */
      const double scale = fabs(K * d->mask[i]) * (fabs(d->lp[i]) + fabs(d->old[i]) + fabs(d->adv[i]) + 1);
      ck_assert_msg(fabs(r->grad[i] - o.grad_v[i]) <= rel * scale,
                    "value loss (%s, agg %s, clip %g): grad_values[%lld, %lld] = %.15g, reference %.15g",
                    rlk_dtype_name(v->s.dtype), agg_names[v->agg], v->clip, (long long)bb,
                    (long long)t, r->grad[i], o.grad_v[i]);
    }
  ck_assert_msg(fabs(r->loss - o.loss) <= acc * fabs(K) * labs + 1e-300,
                "value loss (%s, agg %s, clip %g): loss %.15g, reference %.15g",
                rlk_dtype_name(v->s.dtype), agg_names[v->agg], v->clip, r->loss, o.loss);
  const double msc[4] = {1, 3, labs / (n ? n : 1), n};
  for (int k = 0; k < RLK_VALUE_LOSS_METRICS; k++)
    ck_assert_msg(fabs(r->metrics[k] - o.metrics[k]) <= acc * msc[k] + 1e-300,
                  "value loss: metrics[%d] = %.15g, reference %.15g", k, r->metrics[k], o.metrics[k]);
  free(o.grad_v);
}

static void vl_auto_norms(vl_case *v, const pl_data *d) {
  double n = 0;
  for (int64_t i = 0; i < d->B * d->T; i++) n += d->mask[i];
  v->token_norm = 1.25 * (n > 0 ? n : 1);
  v->seq_norm = 1.5 * (double)d->B;
  v->norm_scale = (double)d->T;
}

static void vl_run(rlk_context *ctx, vl_case v, uint64_t *rng) {
  pl_data d;
  vl_make(&v, rng, &d);
  vl_auto_norms(&v, &d);
  norms_for_form(v.s.norm_form, &d, &v.token_norm, &v.seq_norm);
  vl_result r;
  vl_call(ctx, &v, &d, &r);
  vl_check(&v, &d, &r);
  vl_result_free(&r);
  data_free(&d);
}

/* Every aggregation, layout, mask kind and dtype; no clipping; empty sequences. */
static void cases_value(rlk_context *ctx, uint64_t *rng) {
  static const rlk_dtype masks[] = {RLK_DTYPE_INVALID, RLK_BOOL, RLK_I32, RLK_F32};
  int k = 0;
  for (int agg = 0; agg < 5; agg++)
    for (int layout = 0; layout < 3; layout++, k++) {
      vl_case v = vl_base(1 + (int64_t)(rlk_test_rand_u64(rng) % 13), 1 + (int64_t)(rlk_test_rand_u64(rng) % 50));
      v.agg = agg;
      v.s.dtype = k % 2 ? RLK_F64 : RLK_F32;
      v.s.packed = layout > 0;
      v.s.offsets_dtype = layout == 1 ? RLK_I32 : RLK_I64;
      v.s.mask_dtype = masks[k % 4];
      v.s.pad_in = layout == 0 && k % 3 == 0 ? 3 : 0;
      v.s.pad_out = layout == 0 && k % 2 ? 6 : 0;
      v.s.misalign = layout > 0 && k % 3 == 1;
      v.s.empty_rows = k % 4 == 3;
      v.s.nan_masked = 1;
      v.clip = k % 5 == 4 ? INFINITY : (k % 2 ? 0.2 : 0.5);
      v.loss_scale = k % 3 == 2 ? 2.0 : 1.0;
      vl_run(ctx, v, rng);
    }
  vl_case v = vl_base(6, 8);
  v.s.masked = 1.0; /* everything masked */
  vl_run(ctx, v, rng);
  /* the normalizers as device scalars, or none (the call's counts) */
  for (int form = NORM_T32; form <= NORM_NONE; form++)
    for (int agg = 0; agg < 5; agg++, k++) {
      vl_case w = vl_base(k % 3 == 0 ? 45 : 1 + (int64_t)(rlk_test_rand_u64(rng) % 13),
                          k % 3 == 0 ? 1100 : 1 + (int64_t)(rlk_test_rand_u64(rng) % 50));
      w.agg = agg;
      w.s.norm_form = form;
      w.s.dtype = k % 2 ? RLK_F64 : RLK_F32;
      w.s.packed = k % 3 == 1;
      w.s.mask_dtype = masks[(k + form) % 4];
      w.s.empty_rows = k % 4 == 3;
      w.s.nan_masked = 1;
      w.loss_scale = k % 3 == 2 ? 2.0 : 1.0;
      vl_run(ctx, w, rng);
    }
}

/* verl's compute_value_loss and OpenRLHF's ValueLoss, reproduced by rlk (f64). */
static void cases_value_trainers(rlk_context *ctx, uint64_t *rng) {
  for (int a = 0; a < 5; a++) {
    vl_case v = vl_base(9, 21);
    v.s.dtype = RLK_F64;
    v.s.binary_mask = 1;
    v.s.packed = a == 2;
    v.agg = a;
    pl_data d;
    vl_make(&v, rng, &d);
    double n = 0;
    for (int64_t i = 0; i < d.B * d.T; i++) n += d.mask[i];
    const double dp = a == 1 ? 2.0 : 1.0, bnt = 1.5 * n + 1, gbs = 1.5 * (double)d.B, lsf = 40;
    /* verl: 0.5 * agg_loss(...) * dp_size with these normalizers */
    v.token_norm = bnt;
    v.seq_norm = gbs;
    v.norm_scale = lsf;
    v.loss_scale = dp;
    vl_result r;
    vl_call(ctx, &v, &d, &r);
    vlref_batch b = vl_ref_batch(&d);
    vlref_out o;
    o.grad_v = calloc((size_t)(d.B * d.T), sizeof(double));
    ck_assert_int_eq(vlref_verl(&b, v.clip, agg_names[a], dp, bnt, gbs, lsf, &o), 0);
    const double rt = a == 3 ? 1e-7 : 1e-10;
    ck_assert_msg(fabs(r.loss - o.loss) <= rt * (fabs(o.loss) + 1e-3), "verl value loss (%s): %.15g vs %.15g",
                  agg_names[a], r.loss, o.loss);
    double gmax = 0;
    for (int64_t i = 0; i < d.B * d.T; i++) gmax = fmax(gmax, fabs(o.grad_v[i]));
    for (int64_t i = 0; i < d.B * d.T; i++)
      ck_assert_msg(fabs(r.grad[i] - o.grad_v[i]) <= rt * gmax + 1e-300,
                    "verl value loss (%s): grad %lld %.15g vs %.15g", agg_names[a], (long long)i,
                    r.grad[i], o.grad_v[i]);
    ck_assert_msg(fabs(r.metrics[RLK_VL_METRIC_CLIPFRAC] - o.metrics[0]) <= 1e-7,
                  "verl vf_clipfrac %.15g vs %.15g", r.metrics[0], o.metrics[0]);
    vl_result_free(&r);
    /* OpenRLHF: token mean over the local tokens */
    if (a == 0) {
      v.token_norm = n;
      v.loss_scale = 1;
      vl_call(ctx, &v, &d, &r);
      ck_assert_int_eq(vlref_openrlhf(&b, v.clip, &o), 0);
      ck_assert_msg(fabs(r.loss - o.loss) <= 1e-10 * (fabs(o.loss) + 1e-3), "OpenRLHF value loss: %.15g vs %.15g",
                    r.loss, o.loss);
      for (int64_t i = 0; i < d.B * d.T; i++)
        ck_assert_msg(fabs(r.grad[i] - o.grad_v[i]) <= 1e-10 * gmax * 2 + 1e-300,
                      "OpenRLHF value loss: grad %lld %.15g vs %.15g", (long long)i, r.grad[i], o.grad_v[i]);
      vl_result_free(&r);
    }
    free(o.grad_v);
    data_free(&d);
  }
}

/* Finite differences of the value loss (f64) and bitwise repeatability. */
static void cases_value_fd_repeat(rlk_context *ctx, uint64_t *rng) {
  for (int a = 0; a < 5; a += 3) {
    vl_case v = vl_base(5, 13);
    v.s.dtype = RLK_F64;
    v.agg = a;
    v.s.packed = a == 3;
    v.s.mask_dtype = RLK_F32;
    pl_data d;
    vl_make(&v, rng, &d);
    vl_auto_norms(&v, &d);
    vl_result base, again;
    vl_call(ctx, &v, &d, &base);
    vl_check(&v, &d, &base);
    vl_call(ctx, &v, &d, &again);
    ck_assert_msg(memcmp(base.raw, again.raw, base.raw_bytes) == 0 &&
                      memcmp(base.raw_scalars, again.raw_scalars, 8 * (1 + RLK_VALUE_LOSS_METRICS)) == 0,
                  "value loss differs between runs");
    vl_result_free(&again);
    int checked = 0;
    for (int64_t b = 0; b < d.B && checked < 8; b++)
      for (int64_t t = 0; t < d.len[b] && checked < 8; t += 3) {
        const int64_t i = b * d.T + t, j = dev_index(&v.s, &d, b, t, 0) + (v.s.packed && v.s.misalign);
        if (d.mask[i] == 0) continue;
        const double x0 = d.lp[i], h = 1e-6;
        double L[2];
        for (int s = 0; s < 2; s++) {
          rlk_test_store(d.h[D_LP], RLK_F64, j, x0 + (s ? h : -h));
          vl_result r;
          vl_call(ctx, &v, &d, &r);
          L[s] = r.loss;
          vl_result_free(&r);
        }
        rlk_test_store(d.h[D_LP], RLK_F64, j, x0);
        const double fd = (L[1] - L[0]) / (2 * h);
        ck_assert_msg(fabs(fd - base.grad[i]) <= 1e-6 * fabs(base.grad[i]) + 1e-9,
                      "value loss d/dv[%lld, %lld]: kernel %.12g, finite differences %.12g",
                      (long long)b, (long long)t, base.grad[i], fd);
        checked++;
      }
    ck_assert_int_gt(checked, 0);
    vl_result_free(&base);
    data_free(&d);
  }
}

/* ---------------------------------------------------------------------------------- */
/* Host backend                                                                        */
/* ---------------------------------------------------------------------------------- */

RLK_HOST_CASE(modes)
RLK_HOST_CASE(kl)
RLK_HOST_CASE(agg_layouts)
RLK_HOST_CASE(edges)
RLK_HOST_CASE(repeat)
RLK_HOST_CASE(finite_differences)
RLK_HOST_CASE(value)
RLK_HOST_CASE(normalizers)
RLK_HOST_CASE(value_trainers)
RLK_HOST_CASE(value_fd_repeat)

/* The trainers in fp64 (the real host kernel in f64) and in f32. */
#define HOST_TRAINER(name) RLK_HOST_TEST(name, cases_##name(ctx, &rng, RLK_F64); cases_##name(ctx, &rng, RLK_F32))

HOST_TRAINER(verl)
HOST_TRAINER(trl)
HOST_TRAINER(openrlhf)

START_TEST(args_init_defaults) {
  rlk_policy_loss_args a;
  memset(&a, 0x5a, sizeof a);
  rlk_policy_loss_args_init(&a);
  ck_assert_int_eq(a.mode, RLK_POLICY_PPO);
  ck_assert(a.clip_low == 0.2 && a.clip_high == 0.2 && a.dual_clip == 3.0);
  ck_assert(a.log_ratio_min == -20.0 && a.log_ratio_max == 20.0);
  ck_assert(a.sapo_tau_pos == 1.0 && a.sapo_tau_neg == 1.05);
  ck_assert_int_eq(a.kl_estimator, RLK_KL_K3);
  ck_assert(a.kl_coef == 0.0 && a.kl_input_clamp == 20.0 && a.kl_output_clamp == 10.0);
  ck_assert_int_eq(a.kl_straight_through, 0);
  ck_assert(a.entropy_coef == 0.0);
  ck_assert_int_eq(a.agg, RLK_AGG_TOKEN_MEAN);
  ck_assert(a.token_normalizer == 0.0 && a.seq_normalizer == 0.0 && a.loss_scale == 1.0);
  ck_assert_ptr_null(a.logp.data);
  ck_assert_ptr_null(a.workspace);
  rlk_policy_loss_args_init(NULL);
  rlk_value_loss_args v;
  memset(&v, 0x5a, sizeof v);
  rlk_value_loss_args_init(&v);
  ck_assert(v.clip == 0.5 && v.loss_scale == 1.0 && v.agg == RLK_AGG_TOKEN_MEAN);
  ck_assert_ptr_null(v.values.data);
  rlk_value_loss_args_init(NULL);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Argument validation                                                                 */
/* ---------------------------------------------------------------------------------- */

typedef struct bad_fx {
  float lp[24], old[24], adv[24], ref[24], ent[24], grad[24], gent[24], s[16], adv4[4], m32[24];
  uint8_t mask[24];
  int64_t offs[4];
  double lp64[24];
  rlk_policy_loss_args a;
} bad_fx;

static void bad_reset(bad_fx *f) {
  for (int i = 0; i < 24; i++) {
    f->lp[i] = -1.0f - 0.01f * (float)i;
    f->old[i] = f->lp[i] + 0.05f;
    f->adv[i] = (float)(i % 3) - 1.0f;
    f->ref[i] = f->lp[i] - 0.02f;
    f->ent[i] = 0.7f;
    f->mask[i] = (uint8_t)(i % 5 != 0);
  }
  memset(f->grad, 0xff, sizeof f->grad);
  memset(f->s, 0xff, sizeof f->s);
  f->offs[0] = 0;
  f->offs[1] = 10;
  f->offs[2] = 10;
  f->offs[3] = 24;
  rlk_policy_loss_args_init(&f->a);
  f->a.logp = rlk_tensor_2d(f->lp, RLK_F32, 4, 6, 6);
  f->a.old_logp = rlk_tensor_2d(f->old, RLK_F32, 4, 6, 6);
  f->a.advantages = rlk_tensor_2d(f->adv, RLK_F32, 4, 6, 6);
  f->a.mask = rlk_tensor_2d(f->mask, RLK_BOOL, 4, 6, 6);
  f->a.grad_logp = rlk_tensor_2d(f->grad, RLK_F32, 4, 6, 6);
  f->a.loss = rlk_tensor_1d(f->s, RLK_F32, 1);
  f->a.token_normalizer = 19;
}

/* The fixture (static: too large for the stack), reset. */
static bad_fx *bad_fresh(void) {
  static bad_fx fx;
  bad_reset(&fx);
  return &fx;
}

static void expect_bad(rlk_context *ctx, bad_fx *f, rlk_status want, const char *arg, const char *label) {
  rlk_test_expect_error(rlk_policy_loss(ctx, &f->a, NULL), want, arg, label);
  rlk_test_expect_untouched(f->grad, RLK_F32, 24, "grad_logp", label);
  rlk_test_expect_untouched(f->s, RLK_F32, 1, "loss", label);
  bad_reset(f);
}

START_TEST(bad_arguments) {
  rlk_context *ctx = rlk_test_host_context();
  bad_fx *f = bad_fresh();
  ck_assert_msg(rlk_policy_loss(ctx, &f->a, NULL) == RLK_OK, "%s", rlk_last_error());
  bad_reset(f);
  rlk_test_expect_error(rlk_policy_loss(NULL, &f->a, NULL), RLK_ERR_INVALID_ARGUMENT, "ctx", "rlk_policy_loss");
  rlk_test_expect_error(rlk_policy_loss(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT, "args", "rlk_policy_loss");
  size_t ws = 7;
  ck_assert_int_eq(rlk_policy_loss_workspace_size(ctx, &f->a, &ws), RLK_OK);
  ck_assert_uint_eq(ws, 0); /* the host needs none */
  ck_assert_int_eq(rlk_policy_loss_workspace_size(ctx, &f->a, NULL), RLK_ERR_INVALID_ARGUMENT);

  /* layout and streams */
  f->a.logp.data = NULL;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "logp", "absent logp");
  f->a.logp.dtype = RLK_BF16;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "logp", "bf16 logp");
  f->a.logp = rlk_tensor_2d(f->lp, RLK_F32, 4, 6, 5);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "logp", "overlapping rows");
  f->a.old_logp = rlk_tensor_2d(f->old, RLK_F32, 4, 5, 6);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "old_logp", "old_logp shape");
  f->a.old_logp.data = NULL;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "old_logp", "absent old_logp");
  f->a.old_logp = rlk_tensor_2d(f->lp64, RLK_F64, 4, 6, 6);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "old_logp", "mixed dtypes");
  f->a.advantages = rlk_tensor_1d(f->adv, RLK_F32, 4);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "advantages", "1-D advantages without seq_advantages");
  f->a.seq_advantages = 1;
  f->a.advantages = rlk_tensor_1d(f->adv, RLK_F32, 3);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "advantages", "per-sequence advantages of the wrong length");
  f->a.mask = rlk_tensor_2d(f->mask, RLK_I64, 3, 6, 6);
  f->a.mask.shape[0] = 4;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "mask", "i64 mask");
  f->a.mask = rlk_tensor_2d(f->mask, RLK_BOOL, 4, 5, 6);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "mask", "mask shape");
  f->a.seq_offsets = rlk_tensor_1d(f->offs, RLK_I64, 4);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "seq_offsets", "offsets with a padded layout");
  f->a.ref_logp = rlk_tensor_2d(f->ref, RLK_F32, 4, 7, 7);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "ref_logp", "ref_logp shape");
  f->a.rollout_is_weights = rlk_tensor_2d(f->ref, RLK_F32, 2, 6, 6);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "rollout_is_weights", "weights shape");
  /* a field the settings leave unread (grad_entropy without entropy_coef) is still compared with
   * the others for overlap: it must be a tensor, not read past its four dimensions */
  f->a.grad_entropy = rlk_tensor_2d(f->ref, RLK_F32, 4, 6, 6);
  f->a.grad_entropy.ndim = 5;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "grad_entropy", "an unread output of 5 dimensions");

  /* packed */
#define PACKED(stmt, arg, label)                                        \
  do {                                                                  \
    f->a.logp = rlk_tensor_1d(f->lp, RLK_F32, 24);                       \
    f->a.old_logp = rlk_tensor_1d(f->old, RLK_F32, 24);                  \
    f->a.advantages = rlk_tensor_1d(f->adv, RLK_F32, 24);                \
    f->a.mask = rlk_tensor_1d(f->mask, RLK_BOOL, 24);                    \
    f->a.grad_logp = rlk_tensor_1d(f->grad, RLK_F32, 24);                \
    f->a.seq_offsets = rlk_tensor_1d(f->offs, RLK_I64, 4);               \
    stmt;                                                               \
    expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, arg, label);           \
  } while (0)
  PACKED(f->a.seq_offsets.data = NULL, "seq_offsets", "packed without offsets");
  PACKED(f->a.seq_offsets.dtype = RLK_F32, "seq_offsets", "f32 offsets");
  PACKED(f->a.seq_offsets.shape[0] = 1, "seq_offsets", "no sequence");
  PACKED(f->offs[0] = 1, "seq_offsets", "first offset not 0");
  PACKED(f->offs[3] = 23, "seq_offsets", "last offset not N");
  PACKED((f->offs[1] = 12, f->offs[2] = 11), "seq_offsets", "decreasing offsets");
  PACKED(f->a.mask = rlk_tensor_1d(f->mask, RLK_BOOL, 23), "mask", "packed mask length");
  PACKED(f->a.grad_logp = rlk_tensor_2d(f->grad, RLK_F32, 4, 6, 6), "grad_logp", "2-D grad with packed");
  PACKED((f->a.seq_advantages = 1, f->a.advantages = rlk_tensor_1d(f->adv, RLK_F32, 4)), "advantages",
         "per-sequence advantages: 4 for 3 sequences");
  PACKED(f->a.logp.strides[0] = 2, "logp", "strided packed logp");
  /* packed, valid: empty sequence in the middle */
  f->a.logp = rlk_tensor_1d(f->lp, RLK_F32, 24);
  f->a.old_logp = rlk_tensor_1d(f->old, RLK_F32, 24);
  f->a.advantages = rlk_tensor_1d(f->adv, RLK_F32, 24);
  f->a.mask = rlk_tensor_1d(f->mask, RLK_BOOL, 24);
  f->a.grad_logp = rlk_tensor_1d(f->grad, RLK_F32, 24);
  f->a.seq_offsets = rlk_tensor_1d(f->offs, RLK_I64, 4);
  ck_assert_msg(rlk_policy_loss(ctx, &f->a, NULL) == RLK_OK, "%s", rlk_last_error());
  bad_reset(f);

  /* numbers */
  f->a.mode = (rlk_policy_loss_mode)6;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "mode", "mode 6");
  f->a.mode = RLK_POLICY_GEO_MEAN;
  f->a.rollout_is_weights = f->a.old_logp;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "rollout_is_weights", "geo_mean with weights");
  f->a.clip_low = -0.1;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "clip_low", "negative clip_low");
  f->a.clip_high = NAN;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "clip_high", "NaN clip_high");
  f->a.dual_clip = NAN;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "dual_clip", "NaN dual clip");
  f->a.log_ratio_min = 1;
  f->a.log_ratio_max = -1;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "log_ratio", "empty log-ratio range");
  f->a.mode = RLK_POLICY_SAPO;
  f->a.sapo_tau_neg = 0;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "sapo_tau_neg", "zero tau");
  f->a.kl_estimator = (rlk_kl_estimator)4;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "kl_estimator", "estimator 4");
  f->a.kl_coef = 0.1;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "ref_logp", "kl_coef without ref_logp");
  f->a.kl_input_clamp = 0;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "kl_input_clamp", "zero input clamp");
  f->a.kl_output_clamp = -1;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "kl_output_clamp", "negative output clamp");
  f->a.entropy_coef = 0.01;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "entropy", "entropy_coef without entropy");
  f->a.entropy_coef = 0.01;
  f->a.entropy = rlk_tensor_2d(f->ent, RLK_F32, 4, 6, 6);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "grad_entropy", "entropy_coef without grad_entropy");
  f->a.agg = (rlk_loss_agg)5;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "agg", "agg 5");
  f->a.token_normalizer = -1;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_normalizer", "negative token normalizer");
  f->a.token_normalizer = NAN;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_normalizer", "NaN token normalizer");
  /* a normalizer tensor: a f32 / f64 scalar, and not beside a number */
  f->a.token_normalizer = 0;
  f->a.token_normalizer_tensor = rlk_tensor_1d(f->lp, RLK_F32, 2);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_normalizer_tensor", "normalizer of 2 elements");
  f->a.token_normalizer = 0;
  f->a.token_normalizer_tensor = rlk_tensor_1d(f->lp, RLK_I32, 1);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_normalizer_tensor", "i32 normalizer");
  f->a.token_normalizer = 0; /* a 0-d one is checked as the element it is: aligned to its dtype */
  f->a.token_normalizer_tensor = (rlk_tensor){(char *)f->lp64 + 4, RLK_F64, 0, {0}, {0}};
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "aligned", "misaligned 0-d normalizer");
  f->a.token_normalizer_tensor = rlk_tensor_1d(f->lp, RLK_F32, 1);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_normalizer_tensor", "tensor and number");
  f->a.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
  f->a.seq_normalizer = -4;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "seq_normalizer", "negative sequence normalizer");
  f->a.agg = RLK_AGG_SEQ_MEAN_TOKEN_SUM;
  f->a.seq_normalizer_tensor = rlk_tensor_2d(f->lp64, RLK_F64, 1, 1, 1);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "seq_normalizer_tensor", "2-D normalizer");
  f->a.agg = RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM;
  f->a.seq_normalizer = 4;
  f->a.norm_scale = -2;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "norm_scale", "negative norm scale");
  f->a.loss_scale = INFINITY;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "loss_scale", "infinite loss scale");

  /* outputs */
  f->a.loss.data = NULL;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "loss", "absent loss");
  f->a.loss = rlk_tensor_1d(f->lp64, RLK_F64, 1);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "loss", "f64 loss for f32 inputs");
  f->a.grad_logp.data = NULL;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "grad_logp", "absent grad_logp");
  f->a.metrics = rlk_tensor_1d(f->s, RLK_F32, RLK_POLICY_LOSS_METRICS - 1);
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "metrics", "short metrics");

  /* value loss */
  rlk_value_loss_args v;
  rlk_value_loss_args_init(&v);
  v.values = rlk_tensor_2d(f->lp, RLK_F32, 4, 6, 6);
  v.old_values = rlk_tensor_2d(f->old, RLK_F32, 4, 6, 6);
  v.returns = rlk_tensor_2d(f->adv, RLK_F32, 4, 6, 6);
  v.grad_values = rlk_tensor_2d(f->grad, RLK_F32, 4, 6, 6);
  v.loss = rlk_tensor_1d(f->s, RLK_F32, 1);
  v.token_normalizer = 24;
  ck_assert_msg(rlk_value_loss(ctx, &v, NULL) == RLK_OK, "%s", rlk_last_error());
  v.clip = 0;
  rlk_test_expect_error(rlk_value_loss(ctx, &v, NULL), RLK_ERR_INVALID_ARGUMENT, "clip", "rlk_value_loss");
  v.clip = NAN;
  ck_assert_int_eq(rlk_value_loss(ctx, &v, NULL), RLK_ERR_INVALID_ARGUMENT);
  v.clip = INFINITY;
  ck_assert_int_eq(rlk_value_loss(ctx, &v, NULL), RLK_OK);
  v.returns.data = NULL;
  rlk_test_expect_error(rlk_value_loss(ctx, &v, NULL), RLK_ERR_INVALID_ARGUMENT, "returns", "rlk_value_loss");
  v.returns = rlk_tensor_2d(f->adv, RLK_F32, 4, 6, 6);
  v.token_normalizer = -1;
  rlk_test_expect_error(rlk_value_loss(ctx, &v, NULL), RLK_ERR_INVALID_ARGUMENT, "token_normalizer", "rlk_value_loss");
  rlk_context_destroy(ctx);

  /* a compile-only context checks the arguments, then refuses to launch */
  ctx = rlk_test_compile_only_host_context();
  bad_reset(f);
  f->a.token_normalizer = -1;
  expect_bad(ctx, f, RLK_ERR_INVALID_ARGUMENT, "token_normalizer", "compile-only, bad normalizer");
  expect_bad(ctx, f, RLK_ERR_UNSUPPORTED, "", "compile-only");
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

/* Precompiling a configuration builds what the call looks up: the call compiles nothing. */
START_TEST(plan_matches_call) {
  rlk_context *ctx = rlk_test_fresh_host_context();
  int n = 0;
  ck_assert_msg(rlk_precompile(ctx, "policy_loss dtype=f64 mode=gspo layout=packed offsets=i32", &n) == RLK_OK,
                "%s", rlk_last_error());
  ck_assert_int_eq(n, 1);
  ck_assert_msg(rlk_precompile(ctx, "value_loss dtype=f64 mask=f32", &n) == RLK_OK, "%s", rlk_last_error());
  ck_assert_int_eq(n, 1);
  const uint64_t before = rlk_test_compiles(ctx);
  ck_assert_uint_eq(before, 2);
  uint64_t rng = rlk_test_seed() + 99;
  pl_case c = base_case(5, 9);
  c.dtype = RLK_F64;
  c.p.mode = RLK_POLICY_GSPO;
  c.packed = 1;
  c.offsets_dtype = RLK_I32;
  run_case(ctx, c, &rng);
  vl_case v = vl_base(4, 6);
  v.s.dtype = RLK_F64;
  v.s.mask_dtype = RLK_F32;
  vl_run(ctx, v, &rng);
  ck_assert_msg(rlk_test_compiles(ctx) == before, "the calls compiled %llu more kernels",
                (unsigned long long)(rlk_test_compiles(ctx) - before));
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(plan_rejects_bad_settings) {
  static const char *const bad[][2] = {
      {"policy_loss mode=grpo", "mode"},         {"policy_loss kl=k4", "kl"},
      {"policy_loss kl_st=2", "kl_st"},          {"policy_loss agg=mean", "agg"},
      {"policy_loss layout=ragged", "layout"},   {"policy_loss offsets=i32", "offsets"},
      {"policy_loss mask=f64", "mask"},          {"policy_loss adv=group", "adv"},
      {"policy_loss entropy=yes", "entropy"},    {"policy_loss is=true", "is"},
      {"policy_loss dtype=bf16", "dtype"},       {"policy_loss colour=blue", "colour"},
      {"value_loss agg=sum", "agg"},             {"value_loss dtype=f16", "dtype"},
      {"value_loss offsets=i64", "offsets"},     {"value_loss clip=0.2", "clip"},
  };
  rlk_test_expect_bad_lines(bad, sizeof bad / sizeof bad[0]);
  static const char *pnames[] = {"dtype", "mode", "kl", "kl_st", "agg", "layout", "offsets", "mask", "adv", "entropy", "is"};
  for (size_t i = 0; i < sizeof pnames / sizeof pnames[0]; i++)
    ck_assert_msg(strstr(rlk_precompile_help("policy_loss"), pnames[i]) != NULL, "help lacks %s", pnames[i]);
  static const char *vnames[] = {"dtype", "agg", "layout", "offsets", "mask"};
  for (size_t i = 0; i < sizeof vnames / sizeof vnames[0]; i++)
    ck_assert_msg(strstr(rlk_precompile_help("value_loss"), vnames[i]) != NULL, "help lacks %s", vnames[i]);
}
END_TEST

/* The main kernels' specs of every sample line, for a CUDA compile-only context. */
static void sample_specs(rlk_context *ctx, const rlk_op_desc *op, void (*visit)(const rlk_kernel_spec *, void *),
                         void *user) {
  for (size_t i = 0; op->samples[i]; i++) {
    const char *line = op->samples[i];
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t ns = 0;
    ck_assert_msg(rlk_test_plan_line(op, ctx, line, specs, &ns) == RLK_OK, "%s: %s", line, rlk_last_error());
    for (size_t k = 0; k < ns; k++) visit(&specs[k], user);
  }
}

typedef struct coverage {
  int dtype[8], mode[6], kl[5], st[2], seqmean[2], layout[3], mask[4], advseq[2], ent[3], isw[2];
  int reduce, vl_main, vl_reduce;
} coverage;

static void cover(const rlk_kernel_spec *s, void *user) {
  coverage *c = user;
  if (!strcmp(s->tmpl->entry, "policy_loss_main")) {
    c->dtype[s->values[0]]++;
    c->mode[s->values[1]]++;
    c->kl[s->values[2]]++;
    c->st[s->values[3]]++;
    c->seqmean[s->values[4]]++;
    c->layout[s->values[5]]++;
    c->mask[s->values[6]]++;
    c->advseq[s->values[7]]++;
    c->ent[s->values[8]]++;
    c->isw[s->values[9]]++;
  } else if (!strcmp(s->tmpl->entry, "policy_loss_reduce")) {
    c->reduce++;
  } else if (!strcmp(s->tmpl->entry, "value_loss_main")) {
    c->vl_main++;
    c->seqmean[s->values[1]]++;
    c->layout[s->values[2]]++;
    c->mask[s->values[3]]++;
  } else if (!strcmp(s->tmpl->entry, "value_loss_reduce")) {
    c->vl_reduce++;
  }
}

/* The samples reach every mode, estimator, layout, mask kind, dtype and optional stream. */
START_TEST(samples_cover_every_variant) {
  rlk_context *ctx = rlk_test_compile_only_cuda_context("sm_90a", "policy_loss samples coverage");
  if (!ctx) return;
  coverage c;
  memset(&c, 0, sizeof c);
  sample_specs(ctx, &rlk_op_policy_loss, cover, &c);
  sample_specs(ctx, &rlk_op_value_loss, cover, &c);
  ck_assert(c.dtype[RLK_F32] && c.dtype[RLK_F64]);
  for (int i = 0; i < 5; i++) ck_assert_msg(c.mode[i] && c.kl[i], "mode/kl %d", i);
  ck_assert_msg(c.mode[RLK_POLICY_GEO_MEAN], "mode geo_mean");
  for (int i = 0; i < 2; i++) ck_assert(c.st[i] && c.seqmean[i] && c.advseq[i] && c.isw[i]);
  for (int i = 0; i < 3; i++) ck_assert(c.layout[i] && c.ent[i]);
  for (int i = 0; i < 4; i++) ck_assert(c.mask[i]);
  ck_assert(c.reduce && c.vl_main && c.vl_reduce);
  rlk_context_destroy(ctx);
}
END_TEST

RLK_SAMPLES_CASE("policy_loss/value_loss", &rlk_op_policy_loss, &rlk_op_value_loss)

/* ---------------------------------------------------------------------------------- */
/* Trainer conventions, each on a problem small enough to work out by hand               */
/* ---------------------------------------------------------------------------------- */

/* One padded f64 call of T tokens per row on the host (mask from m, token-sum, loss_scale 1). */
static void pl_small(rlk_context *ctx, rlk_policy_loss_args *a, int64_t B, int64_t T,
                     double *lp, double *old, double *adv, unsigned char *m, double *loss,
                     double *grad, double *metrics) {
  a->logp = rlk_tensor_2d(lp, RLK_F64, B, T, T);
  a->old_logp = rlk_tensor_2d(old, RLK_F64, B, T, T);
  a->advantages = a->seq_advantages ? rlk_tensor_1d(adv, RLK_F64, B)
                                    : rlk_tensor_2d(adv, RLK_F64, B, T, T);
  a->mask = rlk_tensor_2d(m, RLK_BOOL, B, T, T);
  a->loss = rlk_tensor_1d(loss, RLK_F64, 1);
  a->grad_logp = rlk_tensor_2d(grad, RLK_F64, B, T, T);
  a->metrics = rlk_tensor_1d(metrics, RLK_F64, RLK_POLICY_LOSS_METRICS);
  ck_assert_msg(rlk_policy_loss(ctx, a, NULL) == RLK_OK, "%s", rlk_last_error());
}

START_TEST(host_trainer_conventions) {
  rlk_context *ctx = rlk_test_host_context();
  double loss, grad[6], mt[RLK_POLICY_LOSS_METRICS];
  rlk_policy_loss_args a;

  /* A ratio exactly on the clip bound (r = 1 = 1 + clip_high, A = 1): torch.maximum splits the
   * gradient between the two terms, and the clamped one passes clamp_bound_grad of its half. */
  {
    double lp[1] = {-1.0}, old[1] = {-1.0}, adv[1] = {1.0};
    unsigned char m[1] = {1};
    const double bg[3] = {1.0, 0.0, 0.5}, want[3] = {-1.0, -0.5, -0.75};
    for (int k = 0; k < 3; k++) {
      rlk_policy_loss_args_init(&a);
      a.clip_high = 0.0;
      a.agg = RLK_AGG_TOKEN_SUM;
      a.clamp_bound_grad = bg[k];
      pl_small(ctx, &a, 1, 1, lp, old, adv, m, &loss, grad, mt);
      ck_assert_msg(fabs(grad[0] - want[k]) < 1e-15, "bound grad %g: %.17g, want %g", bg[k],
                    grad[0], want[k]);
    }
    rlk_policy_loss_args_init(&a);
    a.clamp_bound_grad = 1.5;
    a.token_normalizer = 1;
    a.logp = rlk_tensor_2d(lp, RLK_F64, 1, 1, 1);
    a.old_logp = a.logp;
    a.advantages = a.logp;
    a.loss = rlk_tensor_1d(&loss, RLK_F64, 1);
    a.grad_logp = rlk_tensor_2d(grad, RLK_F64, 1, 1, 1);
    rlk_test_expect_error(rlk_policy_loss(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT, "clamp_bound_grad",
                          "rlk_policy_loss");
  }

  /* GSPO applies the dual clip: one sequence, A = -1, s = e^1.5 > c = 3: the term is -A c. */
  {
    double lp[2] = {-0.5, -1.0}, old[2] = {-2.0, -2.5}, adv[1] = {-1.0};
    unsigned char m[2] = {1, 1};
    rlk_policy_loss_args_init(&a);
    a.mode = RLK_POLICY_GSPO;
    a.seq_advantages = 1;
    a.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
    a.seq_normalizer = 1;
    pl_small(ctx, &a, 1, 2, lp, old, adv, m, &loss, grad, mt);
    ck_assert_msg(fabs(loss - 3.0) < 1e-15, "gspo dual clip: loss %.17g, want 3", loss);
    ck_assert_msg(grad[0] == 0 && grad[1] == 0, "gspo dual clip: gradient %g %g", grad[0], grad[1]);
    ck_assert_msg(mt[RLK_PL_METRIC_CLIPFRAC_LOWER] == 1.0, "clipfrac_lower %g",
                  mt[RLK_PL_METRIC_CLIPFRAC_LOWER]);
    a.dual_clip = 0; /* verl's gspo: none */
    pl_small(ctx, &a, 1, 2, lp, old, adv, m, &loss, grad, mt);
    ck_assert_msg(fabs(loss - exp(1.5)) < 1e-14, "gspo without dual clip: loss %.17g", loss);
  }

  /* GSPO's gradient with per-token advantages: straight through each token gets its own
   * -A_t s w_t; through the mean every token gets m_t / n * s * sum_j w_j (-A_j) (here 0). */
  {
    double lp[2] = {-1.0, -2.0}, old[2] = {-1.125, -1.875}, adv[2] = {1.0, -1.0};
    unsigned char m[2] = {1, 1};
    rlk_policy_loss_args_init(&a);
    a.mode = RLK_POLICY_GSPO;
    a.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
    a.seq_normalizer = 1;
    pl_small(ctx, &a, 1, 2, lp, old, adv, m, &loss, grad, mt);
    ck_assert_msg(fabs(grad[0] + 0.5) < 1e-15 && fabs(grad[1] - 0.5) < 1e-15,
                  "straight through: %g %g", grad[0], grad[1]);
    a.seq_ratio_grad = RLK_SEQ_RATIO_THROUGH_MEAN;
    pl_small(ctx, &a, 1, 2, lp, old, adv, m, &loss, grad, mt);
    ck_assert_msg(fabs(grad[0]) < 1e-15 && fabs(grad[1]) < 1e-15, "through the mean: %g %g",
                  grad[0], grad[1]);
    adv[1] = 3.0; /* both positive, inside the clip: -(1 + 3) / 2 / 2 each */
    pl_small(ctx, &a, 1, 2, lp, old, adv, m, &loss, grad, mt);
    ck_assert_msg(fabs(grad[0] + 1.0) < 1e-15 && fabs(grad[1] + 1.0) < 1e-15,
                  "through the mean: %g %g", grad[0], grad[1]);
  }

  /* The raw approximate KL beside the clamped one (|log-ratio| > 20), and per-sequence clip
   * fractions (every sequence counted, an empty one included). */
  {
    double lp[6] = {-1.0, 0, -2.0, 0, 0, 0}, old[6] = {-26.0, 0, -1.0, 0, 0, 0};
    double adv[3] = {1.0, -1.0, 1.0};
    unsigned char m[6] = {1, 0, 1, 0, 0, 0};
    rlk_policy_loss_args_init(&a);
    a.agg = RLK_AGG_TOKEN_SUM;
    a.seq_advantages = 1;
    pl_small(ctx, &a, 3, 2, lp, old, adv, m, &loss, grad, mt);
    ck_assert_msg(fabs(mt[RLK_PL_METRIC_APPROX_KL] - (-20.0 + 1.0) / 2) < 1e-14, "approx_kl %g",
                  mt[RLK_PL_METRIC_APPROX_KL]);
    ck_assert_msg(fabs(mt[RLK_PL_METRIC_APPROX_KL_RAW] - (-25.0 + 1.0) / 2) < 1e-14,
                  "approx_kl_raw %g", mt[RLK_PL_METRIC_APPROX_KL_RAW]);
    a.mode = RLK_POLICY_GSPO;
    a.log_ratio_max = 10;
    pl_small(ctx, &a, 3, 2, lp, old, adv, m, &loss, grad, mt);
    /* row 0: s = e^10 > hi, A > 0; row 1: s = e^-1 < lo, A < 0; row 2: empty */
    ck_assert_msg(fabs(mt[RLK_PL_METRIC_SEQ_CLIP_LOW] - 1.0 / 3) < 1e-15 &&
                      fabs(mt[RLK_PL_METRIC_SEQ_CLIP_HIGH] - 1.0 / 3) < 1e-15,
                  "per-sequence clip fractions %g %g", mt[RLK_PL_METRIC_SEQ_CLIP_LOW],
                  mt[RLK_PL_METRIC_SEQ_CLIP_HIGH]);
    ck_assert_msg(mt[RLK_PL_METRIC_CLIP_LOW] == 0.5 && mt[RLK_PL_METRIC_CLIP_HIGH] == 0.5,
                  "per-token clip fractions %g %g", mt[RLK_PL_METRIC_CLIP_LOW],
                  mt[RLK_PL_METRIC_CLIP_HIGH]);
  }

  /* GMPO's log-space bounds are clip_low and clip_high themselves: a log-ratio of exactly 0.2
   * sits on the bound 0.2 (not past (1 + 0.2) - 1 = 0.19999999999999996), and one of 1e-18 is
   * inside a bound of 1e-17 (which 1 + 1e-17 would round away). One sequence, A = 1, the second
   * token's log-ratio 0: s = exp(d0 / 2), the term -s, each token's weight 1/2; min(d, dc) ties
   * and passes (1 + bound gradient) / 2 of the gradient on the bound, all of it inside. */
  {
    const double clip[3] = {0.2, 0.2, 1e-17}, d0[3] = {0.2, 0.2, 1e-18}, bg[3] = {1.0, 0.0, 1.0};
    for (int k = 0; k < 3; k++) {
      double lp[2] = {d0[k], 0.0}, old[2] = {0.0, 0.0}, adv[1] = {1.0};
      unsigned char m[2] = {1, 1};
      rlk_policy_loss_args_init(&a);
      a.mode = RLK_POLICY_GEO_MEAN;
      a.seq_advantages = 1;
      a.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
      a.seq_normalizer = 1;
      a.clip_low = a.clip_high = clip[k];
      a.clamp_bound_grad = bg[k];
      pl_small(ctx, &a, 1, 2, lp, old, adv, m, &loss, grad, mt);
      const double s = exp(d0[k] / 2), g0 = k == 1 ? 0.5 : 1.0;
      ck_assert_msg(fabs(loss + s) < 1e-15, "gmpo %d: loss %.17g, want %.17g", k, loss, -s);
      ck_assert_msg(fabs(grad[0] + 0.5 * s * g0) < 1e-15 && fabs(grad[1] + 0.5 * s) < 1e-15,
                    "gmpo %d: gradient %.17g %.17g, want %.17g %.17g", k, grad[0], grad[1], -0.5 * s * g0,
                    -0.5 * s);
      ck_assert_msg(mt[RLK_PL_METRIC_CLIPFRAC] == 0.0, "gmpo %d: clipfrac %g", k, mt[RLK_PL_METRIC_CLIPFRAC]);
    }
  }

  /* The value clip on its bound (v - v_old = clip): verl's clip_by_value splits the clip's
   * gradient (the default, 0.5), torch.clamp with number bounds stops it (0), a closed range
   * passes it (1); the max of the two equal squares splits between them. */
  {
    double v[2] = {0.75, -0.25}, vo[2] = {0.25, 0.25}, R[2] = {2.0, -1.5}, vl, g[2],
           vm[RLK_VALUE_LOSS_METRICS];
    unsigned char m[2] = {1, 1};
    const double bg[3] = {0.5, 0.0, 1.0};
    for (int k = 0; k < 3; k++) {
      rlk_value_loss_args va;
      rlk_value_loss_args_init(&va);
      va.agg = RLK_AGG_TOKEN_SUM;
      if (k) va.clamp_bound_grad = bg[k];
      va.values = rlk_tensor_2d(v, RLK_F64, 2, 1, 1);
      va.old_values = rlk_tensor_2d(vo, RLK_F64, 2, 1, 1);
      va.returns = rlk_tensor_2d(R, RLK_F64, 2, 1, 1);
      va.mask = rlk_tensor_2d(m, RLK_BOOL, 2, 1, 1);
      va.loss = rlk_tensor_1d(&vl, RLK_F64, 1);
      va.grad_values = rlk_tensor_2d(g, RLK_F64, 2, 1, 1);
      va.metrics = rlk_tensor_1d(vm, RLK_F64, RLK_VALUE_LOSS_METRICS);
      ck_assert_msg(rlk_value_loss(ctx, &va, NULL) == RLK_OK, "%s", rlk_last_error());
      for (int i = 0; i < 2; i++) {
        const double e = v[i] - R[i], want = 0.5 * (e + bg[k] * e);
        ck_assert_msg(fabs(g[i] - want) < 1e-15, "value bound grad %g: [%d] %.17g, want %.17g",
                      bg[k], i, g[i], want);
      }
    }
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* CUDA (RLK_TEST_GPU=1)                                                               */
/* ---------------------------------------------------------------------------------- */

static rlk_context *cuda_context(void) { return rlk_test_cuda_context("policy_loss"); }

/* RLK_TEST_ONLY=<substring>: only the GPU families whose name contains it (a quick rerun). */
static int gpu_family_selected(const char *name) {
  const char *only = getenv("RLK_TEST_ONLY");
  return !only || !*only || strstr(name, only) != NULL;
}

#define GPU_CASE(name) \
  RLK_GPU_TEST("policy_loss", name, if (gpu_family_selected(#name)) cases_##name(ctx, &rng))

GPU_CASE(modes)
GPU_CASE(kl)
GPU_CASE(agg_layouts)
GPU_CASE(edges)
GPU_CASE(repeat)
GPU_CASE(value)
GPU_CASE(normalizers)

#define GPU_TRAINER(name) \
  RLK_GPU_TEST("policy_loss", name, cases_##name(ctx, &rng, RLK_F64); cases_##name(ctx, &rng, RLK_F32))

GPU_TRAINER(verl)
GPU_TRAINER(trl)
GPU_TRAINER(openrlhf)

/* Large shapes: the benchmark's 1024 x 4096 (many items per block, every vector path), long
 * packed sequences, a workspace that is too small; each against the reference, twice bitwise. */
START_TEST(gpu_large) {
  if (!rlk_test_gpu_enabled("policy_loss")) return;
  rlk_context *ctx = cuda_context();
  if (!ctx) return;
  uint64_t rng = rlk_test_seed() ^ 0x5eed;
  pl_case c = base_case(1024, 4096);
  c.has_ref = 1;
  c.p.kl_coef = 0.001;
  c.masked = 0.3;
  pl_data d;
  data_make(&c, &rng, &d);
  auto_norms(&c, &d);
  pl_result r1, r2;
  pl_call_case(ctx, &c, &d, &r1);
  pl_call_case(ctx, &c, &d, &r2);
  check_against_ref(&c, &d, &r1);
  ck_assert_msg(memcmp(r1.raw_grad, r2.raw_grad, r1.raw_bytes) == 0 &&
                    memcmp(r1.raw_scalars, r2.raw_scalars, 4 * (1 + RLK_POLICY_LOSS_METRICS)) == 0,
                "1024 x 4096: outputs differ between runs");
  result_free(&r1);
  result_free(&r2);
  data_free(&d);
  /* too small a workspace is refused before anything runs */
  {
    rlk_policy_loss_args a;
    float buf[64];
    rlk_policy_loss_args_init(&a);
    void *dbuf = rlk_test_dev_alloc(ctx, 64 * 64 * 4 * 6);
    a.logp = rlk_tensor_2d(dbuf, RLK_F32, 64, 64, 64);
    a.old_logp = a.advantages = a.grad_logp = a.logp;
    a.loss = rlk_tensor_1d(dbuf, RLK_F32, 1);
    a.token_normalizer = 1;
    size_t ws = 0;
    ck_assert_int_eq(rlk_policy_loss_workspace_size(ctx, &a, &ws), RLK_OK);
    ck_assert_uint_gt(ws, 0);
    a.workspace = dbuf;
    a.workspace_bytes = ws - 8;
    rlk_test_expect_error(rlk_policy_loss(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT, "workspace", "rlk_policy_loss");
    (void)buf;
    rlk_free(ctx, dbuf);
  }
  c = base_case(37, 9000);
  c.packed = 1;
  c.p.mode = RLK_POLICY_GSPO;
  c.p.agg = RLK_AGG_SEQ_MEAN_TOKEN_MEAN;
  c.adv_seq = 1;
  run_case(ctx, c, &rng);
  c.p.mode = RLK_POLICY_PPO;
  c.misalign = 1;
  c.dtype = RLK_F64;
  run_case(ctx, c, &rng);
  rlk_context_destroy(ctx);
}
END_TEST

/* Read-only inputs may be broadcast views (a stride of 0): advantages [B] expanded over the
 * tokens (verl passes A[:, None].expand(B, T)) and a mask row shared by every sequence give
 * what their materialized copies give, bit for bit (the same per-token arithmetic); an output
 * with a stride of 0 is refused. */
START_TEST(broadcast_inputs) {
  rlk_context *ctx = rlk_test_host_context();
  enum { B = 3, T = 5 };
  uint64_t rng = rlk_test_seed();
  float lp[B * T], old[B * T], A[B], Afull[B * T], m[T], mfull[B * T];
  for (int i = 0; i < B * T; i++) {
    lp[i] = (float)(-2.0 * rlk_test_rand_uniform(&rng));
    old[i] = lp[i] + (float)(0.4 * (rlk_test_rand_uniform(&rng) - 0.5));
  }
  for (int b = 0; b < B; b++) A[b] = (float)rlk_test_rand_normal(&rng);
  for (int t = 0; t < T; t++) m[t] = t < 4 ? 1.0f : 0.0f;
  for (int i = 0; i < B * T; i++) Afull[i] = A[i / T], mfull[i] = m[i % T];
  float loss[2], g[2][B * T];
  static uint8_t ws[1 << 16] __attribute__((aligned(16)));
  for (int form = 0; form < 2; form++) {
    rlk_policy_loss_args a;
    rlk_policy_loss_args_init(&a);
    a.logp = rlk_tensor_2d(lp, RLK_F32, B, T, T);
    a.old_logp = rlk_tensor_2d(old, RLK_F32, B, T, T);
    a.advantages = form ? rlk_tensor_2d(A, RLK_F32, B, T, 1) : rlk_tensor_2d(Afull, RLK_F32, B, T, T);
    if (form) a.advantages.strides[1] = 0;
    a.mask = form ? rlk_tensor_2d(m, RLK_F32, B, T, 0) : rlk_tensor_2d(mfull, RLK_F32, B, T, T);
    a.loss = rlk_tensor_1d(&loss[form], RLK_F32, 1);
    a.grad_logp = rlk_tensor_2d(g[form], RLK_F32, B, T, T);
    a.workspace = ws;
    a.workspace_bytes = sizeof ws;
    ck_assert_msg(rlk_policy_loss(ctx, &a, NULL) == RLK_OK, "form %d: %s", form, rlk_last_error());
    if (form) {
      rlk_policy_loss_args bad = a;
      bad.grad_logp = rlk_tensor_2d(g[1], RLK_F32, B, T, 0);
      rlk_test_expect_error(rlk_policy_loss(ctx, &bad, NULL), RLK_ERR_INVALID_ARGUMENT, "grad_logp", "rlk_policy_loss");
    }
  }
  ck_assert_msg(memcmp(&loss[0], &loss[1], sizeof loss[0]) == 0, "loss %.9g vs %.9g", loss[0], loss[1]);
  ck_assert_msg(memcmp(g[0], g[1], sizeof g[0]) == 0, "grad_logp differs");
  rlk_context_destroy(ctx);
}
END_TEST

Suite *policy_loss_suite(void) {
  Suite *s = suite_create("policy_loss");
  rlk_test_add_case(s, "host", 120, TESTS(args_init_defaults, broadcast_inputs, host_modes, host_kl,
      host_agg_layouts, host_edges, host_repeat, host_finite_differences, host_verl, host_trl, host_openrlhf,
      host_value, host_value_trainers, host_value_fd_repeat, host_normalizers, host_trainer_conventions,
      bad_arguments));

  rlk_test_add_case(s, "plan", 300, TESTS(plan_matches_call, plan_rejects_bad_settings,
      samples_cover_every_variant, samples_compile_every_target));

  rlk_test_add_case(s, "gpu", 300, TESTS(gpu_modes, gpu_kl, gpu_agg_layouts, gpu_edges, gpu_repeat, gpu_value,
      gpu_normalizers, gpu_verl, gpu_trl, gpu_openrlhf, gpu_large));
  return s;
}
