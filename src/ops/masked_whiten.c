/* masked_whiten.c - whitening over all valid elements of a batch: validation, the variant
 * selection shared by calls and precompiling, the workspace size, and the launches.
 *
 * GPU: two launches (templates/cuda/masked_whiten.cuh). masked_whiten_stats reduces fixed flat
 * chunks to per-block (count, mean, M2) partials in the workspace; masked_whiten_apply merges
 * them in index order in every block (the same bits everywhere) and writes the output. The
 * number of partials depends only on the shape and the device's multiprocessor count, so the
 * result is bitwise repeatable and the workspace size can be queried once.
 * Host: one launch (templates/host/masked_whiten.c), plain two-pass fp64 sums.
 *
 * Undefined statistics (no valid element; one, with the unbiased variance) cannot be reported
 * without reading device memory on the hot path: the kernels write NaN outputs instead, and the
 * optional stats output carries the count (see include/rlk.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ops/advantage_scan.h"
#include "common/masked_whiten_params.h"

#define MW_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))
#define MW_MASK_DTYPES (RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_F32))
#define MW_BLOCK 512       /* threads per block in both GPU launches */
#define MW_MAX_PARTIALS 1024
#define MW_BLOCKS_PER_SM 4 /* stats blocks per multiprocessor (2048 threads) */

static const rlk_value_decl mw_dtype = RLK_DECL_DTYPE("dtype", MW_DTYPES); /* the setting's too */
static const rlk_value_decl *const mw_params[] = {&mw_dtype};

static const rlk_template mw_stats_tmpl = {"masked_whiten", "masked_whiten_stats",
                                           "cuda/masked_whiten.cuh", NULL, 1, mw_params};
static const rlk_template mw_apply_tmpl = {"masked_whiten", "masked_whiten_apply",
                                           "cuda/masked_whiten.cuh", NULL, 1, mw_params};
static const rlk_template mw_host_tmpl = {"masked_whiten", "masked_whiten", NULL,
                                          "host/masked_whiten.c", 1, mw_params};

/* ---------------------------------------------------------------------------------- */
/* The launch (shared by calls and the workspace query)                                */
/* ---------------------------------------------------------------------------------- */

/* GPU: stats over min(chunks, 4 x SMs, 1024) blocks of 512 threads (chunks of 512 x K flat
 * elements, K = 32 bytes / element), apply over min(chunks, 8 x SMs); host: one kernel. The
 * partials (stats blocks, f64 triples in the workspace) depend only on the shape, the dtype and
 * the device. */
static void mw_blocks(const rlk_context *ctx, rlk_dtype dtype, int64_t n, int64_t *partials, int64_t *apply) {
  *partials = 0;
  *apply = 1;
  if (ctx->kind == RLK_BACKEND_HOST) return;
  const int64_t K = 32 / (int64_t)rlk_dtype_size(dtype);
  const int64_t chunks = (n + MW_BLOCK * K - 1) / (MW_BLOCK * K);
  const int64_t sms = ctx->target.multiprocessors > 0 ? ctx->target.multiprocessors : 1;
  int64_t parts = sms * MW_BLOCKS_PER_SM;
  if (parts > MW_MAX_PARTIALS) parts = MW_MAX_PARTIALS;
  if (parts > chunks) parts = chunks;
  int64_t blocks = 2 * sms * MW_BLOCKS_PER_SM;
  if (blocks > chunks) blocks = chunks;
  if (blocks > 65535) blocks = 65535;
  *partials = parts;
  *apply = blocks;
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

static const char *const mw_eps_names[] = {"add", "clamp", NULL};
static const char *const mw_masked_names[] = {"apply", "zero", NULL};

enum { MW_S_DTYPE, MW_S_MASK, MW_S_UNBIASED, MW_S_EPS_MODE, MW_S_SHIFT_MEAN, MW_S_NORMALIZE_STD, MW_S_MASKED, MW_NSETTINGS };

static const rlk_op_setting mw_settings[MW_NSETTINGS] = {
    [MW_S_DTYPE] = RLK_SET(mw_dtype, RLK_F32, "masked_whiten*.dtype", "of x and out"),
    [MW_S_MASK] = RLK_SET(rlk_seq_mask_decl, 1, "", "the mask's dtype"),
    [MW_S_UNBIASED] = RLK_SET_FLAG("unbiased", 1, "", "variance with N - 1"),
    [MW_S_EPS_MODE] = RLK_SET_CHOICE("eps_mode", mw_eps_names, 0, "", "eps added to the variance or as its floor"),
    [MW_S_SHIFT_MEAN] = RLK_SET_FLAG("shift_mean", 1, "", "subtract the mean"),
    [MW_S_NORMALIZE_STD] = RLK_SET_FLAG("normalize_std", 1, "", "divide by the std"),
    [MW_S_MASKED] = RLK_SET_CHOICE("masked", mw_masked_names, 0, "", "masked outputs transformed or zeroed"),
};

/* The kernels: on a GPU the partial statistics, then the merge and transform; on the host the
 * whole-batch kernel. */
static rlk_status mw_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs, size_t *nspecs) {
  const int64_t dtype = s->v[MW_S_DTYPE];
  size_t n = 0;
  if (ctx->kind == RLK_BACKEND_HOST) {
    specs[n++] = (rlk_kernel_spec){&mw_host_tmpl, {dtype}};
  } else {
    specs[n++] = (rlk_kernel_spec){&mw_stats_tmpl, {dtype}};
    specs[n++] = (rlk_kernel_spec){&mw_apply_tmpl, {dtype}};
  }
  return rlk_op_planned(specs, n, nspecs);
}

static const char *const mw_samples[] = {"masked_whiten dtype=f32", "masked_whiten dtype=f64", NULL};

const rlk_op_desc rlk_op_masked_whiten = {
    .name = "masked_whiten", .settings = mw_settings, .nsettings = MW_NSETTINGS, .plan = mw_plan,
    .samples = mw_samples};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_masked_whiten_args_init(rlk_masked_whiten_args *args) {
  static const rlk_masked_whiten_args defaults = {
      .eps = 1e-8, .eps_mode = RLK_WHITEN_EPS_ADD, .unbiased = 1, .count_eps = 1e-8, .shift_mean = 1,
      .normalize_std = 1, .masked = RLK_WHITEN_MASKED_APPLY};
  if (args) *args = defaults;
}

/* x as [B, T]: a 2-D tensor, or a 1-D one as a single row (its stride must then be 1). */
static rlk_status mw_shape(const rlk_tensor *x, const char *what, int64_t *B, int64_t *T) {
  rlk_status st;
  if ((st = rlk_check_tensor(x, what, 1))) return st;
  if ((st = rlk_check_ndim(x, what, 1, 2))) return st;
  if (x->ndim == 1) {
    if ((st = rlk_check_contiguous(x, what))) return st;
    *B = 1;
    *T = x->shape[0];
  } else {
    *B = x->shape[0];
    *T = x->shape[1];
  }
  /* a view of row stride 0 describes any B and T cheaply: their product must stay a count */
  int64_t n;
  if (__builtin_mul_overflow(*B, *T, &n) || n > ((int64_t)1 << 48))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: [%lld, %lld] is more than 2^48 elements", what, (long long)*B,
                     (long long)*T);
  return RLK_OK;
}

/* A tensor of x's layout kind, seen as [B, T]: 1-D tensors become one row. A 1-D tensor keeps
 * its own length, so one shorter or longer than x fails the row check that follows. */
static rlk_tensor mw_as_rows(const rlk_tensor *t) {
  if (!t->data || t->ndim != 1) return *t;
  return rlk_tensor_2d(t->data, t->dtype, 1, t->shape[0], t->shape[0]);
}

/* mask or out beside x: absent (where not required), or as many dimensions as x (contiguous
 * when 1-D), then as [B, T] rows (mw_as_rows, into *rows) of one of `dtypes`. */
static rlk_status mw_check_beside_x(const rlk_tensor *t, const char *what, int required, uint32_t dtypes,
                                    const rlk_tensor *x, int64_t B, int64_t T, rlk_tensor *rows) {
  rlk_status st;
  if (required || t->data) {
    if ((st = rlk_check_tensor(t, what, 1))) return st;
    if (t->ndim != x->ndim)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %d dimensions, x has %d", what, (int)t->ndim, (int)x->ndim);
    if (t->ndim == 1 && (st = rlk_check_contiguous(t, what))) return st;
  }
  *rows = mw_as_rows(t);
  return rlk_seq_check_rows(rows, what, required, dtypes, B, T);
}

/* A call: its launch and the kernels' arguments (the host kernel takes the apply's). */
typedef struct mw_call {
  rlk_op_call op;
  int64_t partials, apply_blocks;
  mw_stats_args stats;
  mw_apply_args apply;
} mw_call;

static rlk_status mw_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_masked_whiten_args *a = args;
  mw_call *c = (mw_call *)call;
  rlk_status st;
  int64_t B, T;
  if ((st = mw_shape(&a->x, "x", &B, &T))) return st;
  if ((st = rlk_check_dtype(&a->x, "x", MW_DTYPES))) return st;
  if ((st = rlk_check_flag(a->unbiased, "unbiased")) || (st = rlk_check_flag(a->shift_mean, "shift_mean")) ||
      (st = rlk_check_flag(a->normalize_std, "normalize_std")))
    return st;
  const rlk_tensor x = mw_as_rows(&a->x);
  if ((st = rlk_seq_check_rows(&x, "x", 1, MW_DTYPES, B, T))) return st;
  rlk_tensor mask, out;
  if ((st = mw_check_beside_x(&a->mask, "mask", 0, MW_MASK_DTYPES, &a->x, B, T, &mask)) ||
      (st = mw_check_beside_x(&a->out, "out", 1, RLK_DTYPE_BIT(a->x.dtype), &a->x, B, T, &out)))
    return st;
  if ((st = rlk_check_nonnegative(a->eps, "eps")) || (st = rlk_check_nonnegative(a->count_eps, "count_eps")))
    return st;
  if ((st = rlk_check_enum((int)a->eps_mode, "eps_mode", RLK_WHITEN_EPS_ADD, RLK_WHITEN_EPS_CLAMP, "rlk_whiten_eps")))
    return st;
  if ((st = rlk_check_enum((int)a->masked, "masked", RLK_WHITEN_MASKED_APPLY,
                           RLK_WHITEN_MASKED_ZERO, "rlk_whiten_masked")))
    return st;
  if (a->stats.data) {
    const rlk_tensor *s = &a->stats;
    if ((st = rlk_check_tensor_of(s, "stats", RLK_DTYPE_BIT(RLK_F64), 1, 1)) ||
        (st = rlk_check_contiguous(s, "stats")))
      return st;
    if (s->shape[0] != 3)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "stats: shape [%lld], expected [3]",
                       (long long)s->shape[0]);
  }
  rlk_op_values_set(&call->vals, MW_S_DTYPE, x.dtype);
  mw_blocks(ctx, x.dtype, B * T, &c->partials, &c->apply_blocks);
  call->workspace = (size_t)c->partials * 3 * sizeof(double);
  mw_apply_args *k = &c->apply;
  k->x = rlk_seq_stream(&x, B, T, &k->xs);
  k->mask = rlk_seq_stream(&mask, B, T, &k->ms);
  k->mask_kind = rlk_seq_mask_kind(&mask);
  k->out = rlk_seq_stream(&out, B, T, &k->os);
  k->B = B;
  k->T = T;
  k->partials = call->workspace ? (double *)a->workspace : NULL;
  k->nparts = (int)c->partials;
  k->eps = a->eps;
  k->count_eps = a->count_eps;
  k->flags = (a->unbiased ? MW_FLAG_UNBIASED : 0) | (a->eps_mode == RLK_WHITEN_EPS_CLAMP ? MW_FLAG_EPS_CLAMP : 0) |
             (a->shift_mean ? 0 : MW_FLAG_KEEP_MEAN) | (a->normalize_std ? 0 : MW_FLAG_NO_STD) |
             (a->masked == RLK_WHITEN_MASKED_ZERO ? MW_FLAG_MASKED_ZERO : 0);
  k->stats = (double *)a->stats.data;
  mw_stats_args *s = &c->stats;
  s->x = k->x;
  s->xs = k->xs;
  s->mask = k->mask;
  s->ms = k->ms;
  s->mask_kind = k->mask_kind;
  s->B = B;
  s->T = T;
  s->partials = call->workspace ? (double *)a->workspace : NULL;
  return RLK_OK;
}

static rlk_status mw_size(const rlk_context *ctx, const void *args, size_t *bytes) {
  const rlk_masked_whiten_args *a = args;
  int64_t B, T, partials, apply;
  rlk_status st = mw_shape(&a->x, "x", &B, &T);
  if (st) return st;
  if ((st = rlk_check_dtype(&a->x, "x", MW_DTYPES))) return st;
  mw_blocks(ctx, a->x.dtype, B * T, &partials, &apply);
  *bytes = (size_t)partials * 3 * sizeof(double);
  return RLK_OK;
}

static const void *mw_launch_params(const rlk_context *ctx, const void *args, rlk_op_call *call, size_t i) {
  (void)ctx, (void)args;
  mw_call *c = (mw_call *)call;
  return call->specs[i].tmpl == &mw_stats_tmpl ? (const void *)&c->stats : (const void *)&c->apply;
}

static void mw_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  if (ctx->kind == RLK_BACKEND_HOST) return;
  const mw_call *c = (const mw_call *)call;
  d->grid[0] = (unsigned)(call->specs[i].tmpl == &mw_stats_tmpl ? c->partials : c->apply_blocks);
  d->block[0] = MW_BLOCK;
}

static const rlk_arg_field mw_fields[] = {
    RLK_ARG_IN(rlk_masked_whiten_args, x), RLK_ARG_IN(rlk_masked_whiten_args, mask),
    RLK_ARG_INPLACE(rlk_masked_whiten_args, out, "x"), RLK_ARG_OUT(rlk_masked_whiten_args, stats)};

static const rlk_op_entry mw_entry = {
    .name = "rlk_masked_whiten", .op = &rlk_op_masked_whiten, .call_size = sizeof(mw_call), RLK_OP_FIELDS(mw_fields),
    .workspace = RLK_OP_WORKSPACE(rlk_masked_whiten_args, 8), .validate = mw_validate, .size = mw_size,
    .params = mw_launch_params, .dims = mw_dims};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_masked_whiten, rlk_masked_whiten_args, mw_entry)
