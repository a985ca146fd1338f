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
#include "runtime/record.h"
#include "common/masked_whiten_params.h"

/* The kernels' arguments (templates/common/masked_whiten_params.h); the host kernel takes the
 * apply's. */
RLK_PARAMS_DECLARE(mw_stats_kernel_args, RLK_MW_STATS_PARAMS, RLK_MW_STATS_PARAMS_SIZE);
RLK_PARAMS_DECLARE(mw_apply_kernel_args, RLK_MW_APPLY_PARAMS, RLK_MW_APPLY_PARAMS_SIZE);

#define MW_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))
#define MW_MASK_DTYPES (RLK_DTYPE_BIT(RLK_BOOL) | RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_F32))
#define MW_BLOCK 512       /* threads per block in both GPU launches */
#define MW_MAX_PARTIALS 1024
#define MW_BLOCKS_PER_SM 4 /* stats blocks per multiprocessor (2048 threads) */

/* Run-time flags, as the templates read them (mw::FLAG_* / MW_FLAG_*). */
enum { MW_FLAG_UNBIASED = 1, MW_FLAG_EPS_CLAMP = 2, MW_FLAG_KEEP_MEAN = 4, MW_FLAG_NO_STD = 8,
       MW_FLAG_MASKED_ZERO = 16 };

static const rlk_param_decl mw_params[] = {
    {"dtype", RLK_PARAM_DTYPE, 0, 0, 0, MW_DTYPES, NULL},
};

static const rlk_template mw_stats_tmpl = {"masked_whiten", "masked_whiten_stats",
                                           "cuda/masked_whiten.cuh", NULL, 1, mw_params};
static const rlk_template mw_apply_tmpl = {"masked_whiten", "masked_whiten_apply",
                                           "cuda/masked_whiten.cuh", NULL, 1, mw_params};
static const rlk_template mw_host_tmpl = {"masked_whiten", "masked_whiten", NULL,
                                          "host/masked_whiten.c", 1, mw_params};

/* ---------------------------------------------------------------------------------- */
/* Variant selection (shared by calls, the workspace query and precompiling)           */
/* ---------------------------------------------------------------------------------- */

typedef struct mw_plan {
  rlk_kernel_spec stats, apply; /* the host runs `apply` alone (the whole-batch kernel) */
  int has_stats;
  int64_t partials;              /* stats blocks = partials in the workspace (GPU) */
  rlk_launch_dims stats_dims, apply_dims;
} mw_plan;

static void mw_dims(rlk_launch_dims *d, int64_t grid, unsigned block) {
  memset(d, 0, sizeof *d);
  d->grid[0] = (unsigned)(grid > 0 ? grid : 1);
  d->grid[1] = d->grid[2] = 1;
  d->block[0] = block;
  d->block[1] = d->block[2] = 1;
}

/* GPU: stats over min(chunks, 4 x SMs, 1024) blocks of 512 threads (chunks of 512 x K flat
 * elements, K = 32 bytes / element), apply over min(chunks, 8 x SMs); host: one kernel. With an
 * unknown shape (n == 0) only the specs are filled. */
static rlk_status mw_select(rlk_backend kind, int multiprocessors, rlk_dtype dtype, int64_t n,
                            mw_plan *p) {
  memset(p, 0, sizeof *p);
  rlk_status st;
  if (kind == RLK_BACKEND_HOST) {
    p->apply.tmpl = &mw_host_tmpl;
    p->apply.values[0] = dtype;
    mw_dims(&p->apply_dims, 1, 1);
    return rlk_spec_validate(&p->apply);
  }
  p->has_stats = 1;
  p->stats.tmpl = &mw_stats_tmpl;
  p->stats.values[0] = dtype;
  p->apply.tmpl = &mw_apply_tmpl;
  p->apply.values[0] = dtype;
  if (n > 0) {
    const int64_t K = 32 / (int64_t)rlk_dtype_size(dtype);
    const int64_t chunks = (n + MW_BLOCK * K - 1) / (MW_BLOCK * K);
    const int64_t sms = multiprocessors > 0 ? multiprocessors : 1;
    int64_t parts = sms * MW_BLOCKS_PER_SM;
    if (parts > MW_MAX_PARTIALS) parts = MW_MAX_PARTIALS;
    if (parts > chunks) parts = chunks;
    int64_t apply = 2 * sms * MW_BLOCKS_PER_SM;
    if (apply > chunks) apply = chunks;
    if (apply > 65535) apply = 65535;
    p->partials = parts;
    mw_dims(&p->stats_dims, parts, MW_BLOCK);
    mw_dims(&p->apply_dims, apply, MW_BLOCK);
  }
  if ((st = rlk_spec_validate(&p->stats))) return st;
  return rlk_spec_validate(&p->apply);
}

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

static const char *const mw_eps_names[] = {"add", "clamp", NULL};
static const char *const mw_masked_names[] = {"apply", "zero", NULL};

enum { MW_S_DTYPE, MW_S_MASK, MW_S_UNBIASED, MW_S_EPS_MODE, MW_S_SHIFT_MEAN, MW_S_NORMALIZE_STD, MW_S_MASKED, MW_NSETTINGS };

static const rlk_op_setting mw_settings[MW_NSETTINGS] = {
    [MW_S_DTYPE] = RLK_SET_DTYPE("dtype", RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64), RLK_F32,
                                 "masked_whiten_stats.dtype masked_whiten_apply.dtype", "of x and out"),
    [MW_S_MASK] = RLK_SET_CHOICE("mask", rlk_seq_mask_names, 1, "", "the mask's dtype"),
    [MW_S_UNBIASED] = RLK_SET_FLAG("unbiased", 1, "", "variance with N - 1"),
    [MW_S_EPS_MODE] = RLK_SET_CHOICE("eps_mode", mw_eps_names, 0, "", "eps added to the variance or as its floor"),
    [MW_S_SHIFT_MEAN] = RLK_SET_FLAG("shift_mean", 1, "", "subtract the mean"),
    [MW_S_NORMALIZE_STD] = RLK_SET_FLAG("normalize_std", 1, "", "divide by the std"),
    [MW_S_MASKED] = RLK_SET_CHOICE("masked", mw_masked_names, 0, "", "masked outputs transformed or zeroed"),
};

static rlk_status mw_plan_config(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                                 size_t *nspecs) {
  mw_plan p;
  rlk_status st = mw_select(ctx->kind, 0, (rlk_dtype)s->v[MW_S_DTYPE], 0, &p);
  if (st) return st;
  size_t n = 0;
  if (p.has_stats) specs[n++] = p.stats;
  specs[n++] = p.apply;
  *nspecs = n;
  return RLK_OK;
}

static const char *const mw_samples[] = {"masked_whiten dtype=f32", "masked_whiten dtype=f64", NULL};

const rlk_op_desc rlk_op_masked_whiten = {
    .name = "masked_whiten",
    .settings = mw_settings,
    .nsettings = MW_NSETTINGS,
    .plan = mw_plan_config,
    .samples = mw_samples,
};

/* ---------------------------------------------------------------------------------- */
/* The call                                                                            */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_masked_whiten_args_init(rlk_masked_whiten_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  args->eps = 1e-8;
  args->eps_mode = RLK_WHITEN_EPS_ADD;
  args->unbiased = 1;
  args->count_eps = 1e-8;
  args->shift_mean = 1;
  args->normalize_std = 1;
  args->masked = RLK_WHITEN_MASKED_APPLY;
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
  return RLK_OK;
}

/* A tensor of x's layout kind, seen as [B, T]: 1-D tensors become one row. A 1-D tensor keeps
 * its own length, so one shorter or longer than x fails the row check that follows. */
static rlk_tensor mw_as_rows(const rlk_tensor *t) {
  if (!t->data || t->ndim != 1) return *t;
  return rlk_tensor_2d(t->data, t->dtype, 1, t->shape[0], t->shape[0]);
}

static rlk_status mw_validate(const rlk_masked_whiten_args *a, int64_t *B, int64_t *T,
                              rlk_tensor *x, rlk_tensor *mask, rlk_tensor *out) {
  rlk_status st;
  if ((st = mw_shape(&a->x, "x", B, T))) return st;
  if ((st = rlk_check_dtype(&a->x, "x", MW_DTYPES))) return st;
  *x = mw_as_rows(&a->x);
  if ((st = rlk_seq_check_rows(x, "x", 1, MW_DTYPES, *B, *T))) return st;
  if (a->mask.data) {
    if ((st = rlk_check_tensor(&a->mask, "mask", 1))) return st;
    if (a->mask.ndim != a->x.ndim)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "mask: %d dimensions, x has %d", (int)a->mask.ndim,
                       (int)a->x.ndim);
    if (a->mask.ndim == 1 && (st = rlk_check_contiguous(&a->mask, "mask"))) return st;
  }
  *mask = mw_as_rows(&a->mask);
  if ((st = rlk_seq_check_rows(mask, "mask", 0, MW_MASK_DTYPES, *B, *T))) return st;
  if ((st = rlk_check_tensor(&a->out, "out", 1))) return st;
  if (a->out.ndim != a->x.ndim)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "out: %d dimensions, x has %d", (int)a->out.ndim,
                     (int)a->x.ndim);
  if (a->out.ndim == 1 && (st = rlk_check_contiguous(&a->out, "out"))) return st;
  *out = mw_as_rows(&a->out);
  if ((st = rlk_seq_check_rows(out, "out", 1, RLK_DTYPE_BIT(a->x.dtype), *B, *T))) return st;
  static const rlk_arg_field fields[] = {
      RLK_ARG_IN(rlk_masked_whiten_args, x), RLK_ARG_IN(rlk_masked_whiten_args, mask),
      RLK_ARG_INPLACE(rlk_masked_whiten_args, out, "x"), RLK_ARG_OUT(rlk_masked_whiten_args, stats)};
  if ((st = rlk_check_arg_fields(fields, sizeof fields / sizeof fields[0], a, a->workspace, a->workspace_bytes)))
    return st;
  if (!(a->eps >= 0.0) || !isfinite(a->eps))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "eps: %g must be finite and >= 0", a->eps);
  if (!(a->count_eps >= 0.0) || !isfinite(a->count_eps))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "count_eps: %g must be finite and >= 0", a->count_eps);
  if ((int)a->eps_mode < RLK_WHITEN_EPS_ADD || (int)a->eps_mode > RLK_WHITEN_EPS_CLAMP)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "eps_mode: %d is not an rlk_whiten_eps", (int)a->eps_mode);
  if ((int)a->masked < RLK_WHITEN_MASKED_APPLY || (int)a->masked > RLK_WHITEN_MASKED_ZERO)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "masked: %d is not an rlk_whiten_masked",
                     (int)a->masked);
  if (a->stats.data) {
    const rlk_tensor *s = &a->stats;
    if ((st = rlk_check_tensor(s, "stats", 1)) || (st = rlk_check_dtype(s, "stats", RLK_DTYPE_BIT(RLK_F64))) ||
        (st = rlk_check_ndim(s, "stats", 1, 1)) || (st = rlk_check_contiguous(s, "stats")))
      return st;
    if (s->shape[0] != 3)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "stats: shape [%lld], expected [3]",
                       (long long)s->shape[0]);
  }
  return RLK_OK;
}

RLK_API rlk_status rlk_masked_whiten_workspace_size(rlk_context *ctx,
                                                    const rlk_masked_whiten_args *args,
                                                    size_t *bytes) {
  if (bytes) *bytes = 0;
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_masked_whiten_workspace_size: ctx is NULL");
  if (!args) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_masked_whiten_workspace_size: args is NULL");
  if (!bytes) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_masked_whiten_workspace_size: bytes is NULL");
  int64_t B, T;
  rlk_status st = mw_shape(&args->x, "x", &B, &T);
  if (st) return st;
  if ((st = rlk_check_dtype(&args->x, "x", MW_DTYPES))) return st;
  mw_plan p;
  if ((st = mw_select(ctx->kind, ctx->target.multiprocessors, args->x.dtype, B * T, &p))) return st;
  *bytes = (size_t)p.partials * 3 * sizeof(double);
  return RLK_OK;
}

RLK_API rlk_status rlk_masked_whiten(rlk_context *ctx, const rlk_masked_whiten_args *a, void *stream) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_masked_whiten: ctx is NULL");
  if (!a) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_masked_whiten: args is NULL");
  int64_t B, T;
  rlk_tensor x, mask, out;
  rlk_status st = mw_validate(a, &B, &T, &x, &mask, &out);
  if (st) return st;
  mw_plan p;
  if ((st = mw_select(ctx->kind, ctx->target.multiprocessors, x.dtype, B * T, &p))) return st;
  if (rlk_record_enabled()) {
    rlk_op_values s;
    rlk_op_values_init(&rlk_op_masked_whiten, &s);
    rlk_op_values_set(&s, MW_S_DTYPE, x.dtype);
    rlk_record_op(&rlk_op_masked_whiten, &s);
  }
  const size_t need = (size_t)p.partials * 3 * sizeof(double);
  if (need > 0) {
    if (!a->workspace || a->workspace_bytes < need)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "workspace: %zu bytes at %p, %zu needed (rlk_masked_whiten_workspace_size)",
                       a->workspace_bytes, a->workspace, need);
    if ((uintptr_t)a->workspace % 8 != 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "workspace: not 8-byte aligned");
  }
  if ((st = rlk_context_require_device(ctx, "rlk_masked_whiten"))) return st;

  mw_apply_kernel_args k;
  memset(&k, 0, sizeof k);
  k.x = x.data;
  k.xs = rlk_seq_row_stride(&x, B, T);
  k.mask = mask.data;
  k.ms = k.mask ? rlk_seq_row_stride(&mask, B, T) : T;
  k.mask_kind = rlk_seq_mask_kind(&mask);
  k.out = out.data;
  k.os = rlk_seq_row_stride(&out, B, T);
  k.B = B;
  k.T = T;
  double *partials = need ? (double *)a->workspace : NULL;
  k.partials = partials;
  k.nparts = (int)p.partials;
  k.eps = a->eps;
  k.count_eps = a->count_eps;
  k.flags = (a->unbiased ? MW_FLAG_UNBIASED : 0) |
            (a->eps_mode == RLK_WHITEN_EPS_CLAMP ? MW_FLAG_EPS_CLAMP : 0) |
            (a->shift_mean ? 0 : MW_FLAG_KEEP_MEAN) | (a->normalize_std ? 0 : MW_FLAG_NO_STD) |
            (a->masked == RLK_WHITEN_MASKED_ZERO ? MW_FLAG_MASKED_ZERO : 0);
  k.stats = (double *)a->stats.data;
  if (p.has_stats) {
    mw_stats_kernel_args s;
    memset(&s, 0, sizeof s);
    s.x = k.x;
    s.xs = k.xs;
    s.mask = k.mask;
    s.ms = k.ms;
    s.mask_kind = k.mask_kind;
    s.B = B;
    s.T = T;
    s.partials = partials;
    void *sargs[] = {&s};
    if ((st = rlk_context_launch(ctx, &p.stats, &p.stats_dims, stream, sargs))) return st;
  }
  void *aargs[] = {&k};
  return rlk_context_launch(ctx, &p.apply, &p.apply_dims, stream, aargs);
}
