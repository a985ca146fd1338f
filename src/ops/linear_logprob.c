/* linear_logprob.c - the rlk_linear_logprob op itself, what its passes share: the head's argument
 * checks (linear_logprob_fwd.h), the configuration line's settings table and the line a call
 * records, the tuning database's winners for a call's key, the precompile plan of a line's
 * kernels, its samples and the op descriptor (linear_logprob_op.h).
 *
 * The passes are files of their own: the forward and rlk_linear_logprob (linear_logprob_fwd.c), the
 * backward and rlk_linear_logprob_backward (linear_logprob_bwd.c), rlk_linear_policy_loss's token
 * chunks (linear_logprob_stored.c); how they cut their work is linear_logprob_plan.c's, a row
 * selection linear_logprob_rows.c's.
 *
 * Tuning: the forward's ring depth (stages) and split, the backward's chunk and tile order
 * (group); a call that asks for none takes the tuning database's winner for its key (ll_tuned). */
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/linear_logprob_bwd.h"
#include "ops/linear_logprob_fwd.h"
#include "ops/linear_logprob_op.h"
#include "ops/linear_logprob_rows.h"
#include "ops/linear_logprob_stored.h"
#include "ops/ops.h"
#include "tune/tune_db.h"
#include "tune/tune_table.h"
#include "common/linear_logprob_params.h"

const char *const rlk_ll_dt_names[] = RLK_PARAMS_ENUM_NAMES(RLK_FLOAT_DTS); /* f32: not a choice */
const rlk_value_decl rlk_ll_labels = RLK_DECL_DTYPE("labels", RLK_LL_LABEL_DTYPES);
const rlk_value_decl rlk_ll_entropy = RLK_DECL_FLAG("entropy");
static const char *const ll_variant_names[] = {"auto", "wgmma", "tiled", NULL};

/* The rows setting's values: no selection, or its indices' dtype. */
static const char *const ll_rows_names[] = {"none", "i32", "i64", NULL};
int rlk_ll_rows_line(const rlk_ll_rows *r) { return !r->data ? 0 : r->dtype == RLK_I32 ? 1 : 2; }
static rlk_dtype ll_rows_dtype(int64_t line) { return line == 1 ? RLK_I32 : RLK_I64; }

rlk_status rlk_ll_check_matrix_of(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t *rows, int64_t *cols,
                                  int64_t *stride) {
  rlk_status st;
  if ((st = rlk_check_tensor_of(t, what, dtypes, 2, 2))) return st;
  const int64_t n = t->shape[0], h = t->shape[1];
  if (n < 1 || h < 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld] has an empty dimension", what,
                     (long long)n, (long long)h);
  int64_t s = 0;
  if ((st = rlk_check_contiguous_rows(t, what, &s))) return st;
  if (n > INT32_MAX || h > INT32_MAX || s > ((int64_t)1 << 56) / n)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %lld rows of stride %lld are too large", what,
                     (long long)n, (long long)s);
  *rows = n;
  *cols = h;
  *stride = s;
  return RLK_OK;
}

rlk_status rlk_ll_check_matrix(const rlk_tensor *t, const char *what, int64_t *rows, int64_t *cols, int64_t *stride) {
  return rlk_ll_check_matrix_of(t, what, RLK_LL_HIDDEN_DTYPES, rows, cols, stride);
}

rlk_status rlk_ll_check_variant(int variant) {
  return rlk_check_enum(variant, "variant", RLK_LINEAR_LOGPROB_AUTO, RLK_LINEAR_LOGPROB_TILED,
                        "rlk_linear_logprob_variant");
}

rlk_status rlk_ll_check_head(const rlk_tensor *hidden, const rlk_tensor *weight, const rlk_tensor *labels,
                             float temperature, rlk_ll_head *h) {
  rlk_status st;
  int64_t wH;
  if ((st = rlk_ll_check_matrix(hidden, "hidden", &h->N, &h->H, &h->hs))) return st;
  if ((st = rlk_ll_check_matrix(weight, "weight", &h->V, &wH, &h->ws))) return st;
  if (wH != h->H)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "weight: %lld columns, hidden has H = %lld", (long long)wH,
                     (long long)h->H);
  if (weight->dtype != hidden->dtype)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "weight: dtype %s differs from hidden's %s",
                     rlk_dtype_name(weight->dtype), rlk_dtype_name(hidden->dtype));
  h->ls = 1;
  if (labels && (st = rlk_check_vector(labels, "labels", RLK_LL_LABEL_DTYPES, h->N, 0, &h->ls))) return st;
  return rlk_check_temperature(temperature, "temperature", 0);
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

/* chunks: rlk_linear_policy_loss's token chunks (sm_90a; elsewhere the kernels of both passes,
 * which that call runs there) */
static const char *const ll_pass_names[] = {"fwd", "bwd", "both", "chunks", NULL};
static const char *const ll_grad_line_names[] = {"f32", "same", NULL};

#define LL_KEY_DOC "a tuning key's (with hidden_size, vocab and tokens)"

static const rlk_op_setting ll_settings[RLK_LL_NSETTINGS] = {
    [RLK_LL_S_PASS] =
        RLK_SET_CHOICE("pass", ll_pass_names, 2, "linear_logprob_fwd_* linear_logprob_bwd_* linear_logprob_stored_dz",
                       "the kernels to build"),
    [RLK_LL_S_HIDDEN] = RLK_SET_DTYPE("hidden", RLK_LL_HIDDEN_DTYPES, RLK_BF16, "linear_logprob_*.hidden",
                                      "the dtype of hidden and weight"),
    [RLK_LL_S_LABELS] = RLK_SET(rlk_ll_labels, RLK_I64, "linear_logprob_*.labels", "the labels' dtype"),
    [RLK_LL_S_ENTROPY] =
        RLK_SET(rlk_ll_entropy, 0, "linear_logprob_*.entropy", "fwd: also the entropy; bwd: an entropy gradient"),
    [RLK_LL_S_GRAD] = RLK_SET_CHOICE("grad", ll_grad_line_names, 0, "linear_logprob_bwd_dh_out linear_logprob_bwd_*.gw",
                                     "the backward's grad_hidden and grad_weight dtype"),
    [RLK_LL_S_ROWS] =
        RLK_SET_CHOICE("rows", ll_rows_names, 0, "linear_logprob_gather linear_logprob_scatter linear_logprob_*.rows",
                       "a row selection's index dtype (none: no selection): the kernels that gather the "
                       "selected rows of hidden and write grad_hidden by row"),
    [RLK_LL_S_VARIANT] =
        RLK_SET_CHOICE("variant", ll_variant_names, RLK_LINEAR_LOGPROB_AUTO, "linear_logprob_*",
                       "wgmma: the sm_90a kernels (elsewhere tiled runs); tiled: the portable ones only"),
    [RLK_LL_S_STAGES] = RLK_SET_INT("stages", 0, 0, LL_SM90_STAGES, "linear_logprob_fwd_sm90.stages",
                                    "the sm_90a forward's operand stages, 2 to 4 (0: 4)"),
    [RLK_LL_S_SPLITS] =
        RLK_SET_INT("splits", 0, 0, 65535, "", "the forward's vocabulary splits (0: chosen); no kernel"),
    [RLK_LL_S_CHUNK] =
        RLK_SET_INT("chunk", 0, 0, INT32_MAX, "",
                    "the backward's vocabulary columns a chunk, a multiple of 64 (0: chosen); no kernel"),
    [RLK_LL_S_GROUP] = RLK_SET_INT("group", 0, 0, RLK_LL_BWD_GROUP_MAX, "",
                                   "the sm_90a backward's tile order, rows of tiles a group (0: 8); no kernel"),
    [RLK_LL_S_HIDDEN_SIZE] = RLK_SET_INT("hidden_size", 0, 1, INT32_MAX, "", "H, " LL_KEY_DOC),
    [RLK_LL_S_VOCAB] = RLK_SET_INT("vocab", 0, 1, INT32_MAX, "", "V, " LL_KEY_DOC),
    [RLK_LL_S_TOKENS] = RLK_SET_BUCKETED("tokens", 0, 1, INT32_MAX,
                                    "N, " LL_KEY_DOC "; with all of them and no tuning settings, a fwd line plans the "
                                    "tuning database's winner for them on this context"),
};

void rlk_ll_line(rlk_op_values *v, int pass, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad, int variant,
                 int stages) {
  rlk_op_values_set(v, RLK_LL_S_PASS, pass);
  rlk_op_values_set(v, RLK_LL_S_HIDDEN, hidden);
  rlk_op_values_set(v, RLK_LL_S_LABELS, labels);
  rlk_op_values_set(v, RLK_LL_S_ENTROPY, entropy);
  rlk_op_values_set(v, RLK_LL_S_GRAD, grad);
  rlk_op_values_set(v, RLK_LL_S_VARIANT, variant);
  if (stages && stages != LL_SM90_STAGES) rlk_op_values_set(v, RLK_LL_S_STAGES, stages);
}

/* ---- tuning ---- */

/* The tuning settings, in the order of a winner's values (rlk_tune_entry_values). */
enum { LL_TUNE_STAGES, LL_TUNE_SPLITS, LL_TUNE_CHUNK, LL_TUNE_GROUP, LL_NTUNE };
static const int ll_tuning[LL_NTUNE] = {RLK_LL_S_STAGES, RLK_LL_S_SPLITS, RLK_LL_S_CHUNK, RLK_LL_S_GROUP};

/* What a sweep tool times against the default (valid on every target: elsewhere than sm_90a the
 * forward's depths and the backward's tile order change nothing). A smaller backward chunk, not
 * a larger one: the default's workspace is at the 0.28 GiB budget already. */
static const char *const ll_candidates[] = {"stages=2", "stages=3", "group=4", "group=16", "group=64", "chunk=8192",
                                            NULL};

static int ll_parse_tuning(const char *settings, int64_t values[RLK_TUNE_VALUES]) {
  return rlk_op_tuning_values(&rlk_op_linear_logprob, ll_tuning, LL_NTUNE, settings, values);
}

/* A configuration's shape in the tuning database for one pass (plan syntax): the settings its
 * kernels depend on and the problem's H and V; the backward adds its gradients' dtype. */
static int ll_tune_shape(int pass, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad, int64_t H, int64_t V,
                         char *buf, size_t size) {
  char g[16] = "";
  if (pass == 1) rlk_format(g, sizeof g, " grad=%s", ll_grad_line_names[grad]);
  return rlk_format(buf, size, "pass=%s hidden=%s labels=%s entropy=%d%s hidden_size=%lld vocab=%lld",
                    ll_pass_names[pass], rlk_dtype_name(hidden), rlk_dtype_name(labels), entropy, g, (long long)H,
                    (long long)V);
}

/* 1 with the winner of `pass` for a key in v (its tuning values), or 0: no database, no record,
 * or a winner that does not parse (warned about once; the default runs). */
static int ll_tuned(const rlk_context *ctx, int pass, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad,
                    int64_t H, int64_t V, int64_t N, int64_t v[RLK_TUNE_VALUES]) {
  char shape[256];
  return ll_tune_shape(pass, hidden, labels, entropy, grad, H, V, shape, sizeof shape) >= 0 &&
         rlk_op_tuned(ctx, &rlk_op_linear_logprob, shape, N, ll_parse_tuning, v);
}

void rlk_ll_tuned_fwd(const rlk_context *ctx, rlk_dtype hidden, rlk_dtype labels, int entropy, int64_t H, int64_t V,
                      int64_t N, int *stages, int *splits) {
  int64_t v[RLK_TUNE_VALUES];
  if (!ll_tuned(ctx, 0, hidden, labels, entropy, 0, H, V, N, v)) return;
  *stages = (int)v[LL_TUNE_STAGES];
  *splits = (int)v[LL_TUNE_SPLITS];
}

void rlk_ll_tuned_bwd(const rlk_context *ctx, rlk_dtype hidden, rlk_dtype labels, int entropy, int grad, int64_t H,
                      int64_t V, int64_t N, int *chunk, int *group) {
  int64_t v[RLK_TUNE_VALUES];
  if (!ll_tuned(ctx, 1, hidden, labels, entropy, grad, H, V, N, v)) return;
  /* a chunk that is no multiple of 64 would make the call refuse what it did not ask for */
  if (v[LL_TUNE_CHUNK] % LL_TILE == 0) *chunk = (int)v[LL_TUNE_CHUNK];
  *group = (int)v[LL_TUNE_GROUP];
}

static int ll_line_key(const rlk_op_values *s) {
  return RLK_OP_GIVEN(s, RLK_LL_S_HIDDEN_SIZE) && RLK_OP_GIVEN(s, RLK_LL_S_VOCAB) && RLK_OP_GIVEN(s, RLK_LL_S_TOKENS);
}

static int ll_line_tuning_given(const rlk_op_values *s) {
  return s->v[RLK_LL_S_STAGES] || s->v[RLK_LL_S_SPLITS] || s->v[RLK_LL_S_CHUNK] || s->v[RLK_LL_S_GROUP];
}

/* The tuning database key of plan settings: one pass, hidden_size, vocab and tokens, no tuning
 * settings, the automatic variant. */
static rlk_status ll_tune_key(const rlk_op_values *s, char *shape, size_t size, int64_t *tokens) {
  const int pass = (int)s->v[RLK_LL_S_PASS];
  if (pass >= 2) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "pass: a tuning key names one pass, fwd or bwd");
  if (!ll_line_key(s))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "hidden_size, vocab, tokens: a tuning key needs all of them");
  if (ll_line_tuning_given(s))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "stages, splits, chunk, group: a tuning key holds no tuning settings");
  if (s->v[RLK_LL_S_VARIANT] != RLK_LINEAR_LOGPROB_AUTO)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "variant: a tuning key is the automatic variant's");
  if (ll_tune_shape(pass, (rlk_dtype)s->v[RLK_LL_S_HIDDEN], (rlk_dtype)s->v[RLK_LL_S_LABELS],
                    (int)s->v[RLK_LL_S_ENTROPY], (int)s->v[RLK_LL_S_GRAD], s->v[RLK_LL_S_HIDDEN_SIZE],
                    s->v[RLK_LL_S_VOCAB], shape, size) < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "linear_logprob: the shape does not fit %zu bytes", size);
  *tokens = rlk_tune_bucket(s->v[RLK_LL_S_TOKENS]);
  return RLK_OK;
}

/* A row selection's kernels (rows: the setting's value) at specs, their count: the gather of
 * hidden's rows; for the backward (bwd) also the scatter of grad_hidden (dtype code gh) and the
 * gather of its rows that an accumulating call's sum starts from (an f32 one's on a GPU, where a
 * 16-bit one's sum starts from 0 and adds it at the end; any on the host). */
static size_t ll_rows_specs(const rlk_context *ctx, int64_t rows, int hidden, int bwd, int gh,
                            rlk_kernel_spec *specs) {
  const rlk_dtype r = ll_rows_dtype(rows);
  size_t n = 0;
  specs[n++] = rlk_ll_gather_spec(hidden, r);
  if (!bwd) return n;
  if (gh != hidden && (gh == RLK_DT_F32 || ctx->kind == RLK_BACKEND_HOST)) specs[n++] = rlk_ll_gather_spec(gh, r);
  specs[n++] = rlk_ll_scatter_spec(gh, r);
  return n;
}

static rlk_status ll_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                          size_t *nspecs) {
  const int64_t hidden = rlk_ll_dt_code(s->v[RLK_LL_S_HIDDEN]), labels = s->v[RLK_LL_S_LABELS],
                entropy = s->v[RLK_LL_S_ENTROPY];
  const int tiled = s->v[RLK_LL_S_VARIANT] == RLK_LINEAR_LOGPROB_TILED;
  rlk_op_values f = *s; /* the forward's configuration: with a key and no tuning, the winner's stages */
  if (ll_line_key(s) && !ll_line_tuning_given(s) && s->v[RLK_LL_S_PASS] == 0) {
    int stages = 0, splits = 0;
    rlk_ll_tuned_fwd(ctx, (rlk_dtype)s->v[RLK_LL_S_HIDDEN], (rlk_dtype)labels, (int)entropy, s->v[RLK_LL_S_HIDDEN_SIZE],
                     s->v[RLK_LL_S_VOCAB], s->v[RLK_LL_S_TOKENS], &stages, &splits);
    f.v[RLK_LL_S_STAGES] = stages;
  }
  int pass = (int)s->v[RLK_LL_S_PASS]; /* 0 fwd, 1 bwd, 2 both, 3 chunks */
  const int grad_same = s->v[RLK_LL_S_GRAD] == 1;
  const int64_t rows = s->v[RLK_LL_S_ROWS];
  size_t n = 0;
  rlk_status st;
  if (pass == 3 && rows)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rows, pass: rlk_linear_policy_loss's token chunks select no rows");
  if (pass == 3) {
    if (rlk_ll_wgmma_target(ctx) && !tiled) {
      /* rlk_ll_stored_logits's and _grads's, row-major chunks and u^T over grad_weight: grad
       * names grad_hidden's dtype (grad_weight is f32, its slices dh-kind products) */
      const rlk_kernel_spec k[9] = {
          {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_LOGITS, hidden, labels, entropy, 0}},
          {&rlk_ll_combine_tmpl, {labels, entropy}},
          {&rlk_ll_stored_dz_tmpl, {hidden, labels, entropy}},
          {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_DH, hidden, RLK_I32, 0, grad_same ? hidden : 0}},
          {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_DW, hidden, RLK_I32, 0, 0}},
          {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_LOGITS_T, hidden, labels, entropy, 0}},
          {&rlk_ll_stored_dz_t_tmpl, {hidden, labels, entropy}},
          {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_DH_T, hidden, RLK_I32, 0, grad_same ? hidden : 0}},
          {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_DH, hidden, RLK_I32, 0, 0}}};
      const size_t nk = grad_same ? 9 : 8; /* f32 dh is the slices' kernel already */
      for (size_t i = 0; i < nk; i++) {
        if ((st = rlk_spec_validate(&k[i]))) return st;
        specs[i] = k[i];
      }
      *nspecs = nk;
      return RLK_OK;
    }
    pass = 2;
  }
  if (pass != 0) {
    const int g = grad_same ? (int)hidden : 0;
    /* sm_90a: the wgmma kernels, then the portable ones that a call without tensor maps runs */
    const int sm90 = rlk_ll_wgmma_target(ctx) && !tiled;
    rlk_ll_bwd_config b = {(int)hidden, (rlk_dtype)labels, (int)entropy, g, g, sm90};
    size_t nb = 0;
    if ((st = rlk_ll_bwd_specs(ctx, &b, specs, &nb))) return st;
    n = nb;
    if (sm90) {
      b.sm90 = 0;
      if ((st = rlk_ll_bwd_specs(ctx, &b, specs + n, &nb))) return st;
      n += nb;
    }
    if (rows) n += ll_rows_specs(ctx, rows, (int)hidden, 1, g, specs + n);
    if (pass == 1) {
      *nspecs = n;
      return RLK_OK;
    }
  }
  rlk_ll_choice ch;
  if ((st = rlk_ll_select(ctx, &f, 1, &ch))) return st;
  specs[n++] = ch.gemm;
  if (ctx->kind != RLK_BACKEND_HOST) {
    if (ch.variant == RLK_LINEAR_LOGPROB_WGMMA) {
      /* a call whose tensors no tensor map can describe runs the tiled kernel */
      rlk_ll_choice fb;
      if ((st = rlk_ll_select(ctx, &f, 0, &fb))) return st;
      specs[n++] = fb.gemm;
    }
    specs[n++] = ch.combine;
  }
  if (rows && pass == 0) n += ll_rows_specs(ctx, rows, (int)hidden, 0, 0, specs + n);
  *nspecs = n;
  return RLK_OK;
}

static const char *const ll_samples[] = {
    "linear_logprob hidden=bf16 labels=i64 entropy=1",
    "linear_logprob pass=fwd hidden=f16 labels=i32",
    "linear_logprob pass=both hidden=bf16 labels=i32 variant=tiled grad=same",
    "linear_logprob pass=bwd hidden=f16 labels=i64 entropy=1 grad=same",
    /* the sm_90a forward's other ring depths (elsewhere the default kernels above) */
    "linear_logprob pass=fwd hidden=bf16 labels=i64 entropy=1 stages=2",
    "linear_logprob pass=fwd hidden=f16 labels=i32 stages=3",
    /* rlk_linear_policy_loss's token chunks (sm_90a; elsewhere both passes' kernels) */
    "linear_logprob pass=chunks hidden=bf16 labels=i64 entropy=1",
    "linear_logprob pass=chunks hidden=f16 labels=i32 grad=same",
    /* a row selection: its gather and scatter kernels beside each pass's */
    "linear_logprob pass=both hidden=bf16 labels=i64 entropy=1 rows=i32",
    "linear_logprob pass=bwd hidden=f16 labels=i32 grad=same rows=i64",
    NULL};

/* What changes a call, not its kernels: on a GPU the forward's vocabulary split and the
 * backward's chunk, on sm_90a (the wgmma kernels) also its tile order; nothing on the host, whose
 * one fp64 kernel a call runs whole. */
static const char *ll_runtime_tuning(const rlk_context *ctx, const rlk_op_values *s) {
  if (ctx->kind == RLK_BACKEND_HOST) return NULL;
  const int sm90 = rlk_ll_wgmma_target(ctx) && s->v[RLK_LL_S_VARIANT] != RLK_LINEAR_LOGPROB_TILED;
  switch (s->v[RLK_LL_S_PASS]) {
  case 0: return "splits";
  case 1: return sm90 ? "chunk group" : "chunk";
  case 3: return sm90 ? "group" : "splits chunk";
  default: return sm90 ? "splits chunk group" : "splits chunk";
  }
}

const rlk_op_desc rlk_op_linear_logprob = {
    .name = "linear_logprob", .settings = ll_settings, .nsettings = RLK_LL_NSETTINGS, .plan = ll_plan,
    .samples = ll_samples, .candidates = ll_candidates, .tune_key = ll_tune_key, .runtime_tuning = ll_runtime_tuning};
