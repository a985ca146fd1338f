/* linear_logprob_bwd.c - the fused head's backward, rlk_linear_logprob_backward: its kernels'
 * templates and choice, validation, the blocks of rows and their launches; the sm_90a kernel's
 * template, tensor maps and launch serve the token chunks too (linear_logprob_bwd.h).
 *
 * Backward kernels (templates/cuda/linear_logprob_bwd.cuh, templates/host/linear_logprob_bwd.c):
 * per vocabulary chunk, in order, linear_logprob_bwd_dz (recomputed logits -> dz in the
 * workspace), _dh (the f32 grad_hidden sum: grad_hidden itself when that is f32, else in the
 * workspace) and _dw (grad_weight rows of the chunk); then, for a 16-bit grad_hidden, _dh_out
 * writes it from the sum. On sm_90a, when tensor maps can describe hidden and
 * weight, linear_logprob_bwd_sm90 (templates/cuda/linear_logprob_bwd_sm90.cuh) runs the same
 * three products per chunk by TMA + wgmma, dz in the inputs' 16-bit dtype. The host runs
 * linear_logprob_bwd_host (fp64). */
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/invariant.h"
#include "ops/linear_logprob_bwd.h"
#include "ops/linear_logprob_fwd.h"
#include "ops/linear_logprob_op.h"
#include "ops/linear_logprob_plan.h"
#include "ops/linear_logprob_rows.h"
#include "ops/ops.h"
#include "runtime/record.h"
#include "common/linear_logprob_params.h"

/* The kernels' arguments (templates/common/linear_logprob_params.h). */
RLK_PARAMS_DECLARE(ll_bwd_host_args, RLK_LL_BWD_HOST_PARAMS, RLK_LL_BWD_HOST_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_bwd_dz_args, RLK_LL_BWD_DZ_PARAMS, RLK_LL_BWD_DZ_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_bwd_dh_args, RLK_LL_BWD_DH_PARAMS, RLK_LL_BWD_DH_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_bwd_dw_args, RLK_LL_BWD_DW_PARAMS, RLK_LL_BWD_DW_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ll_bwd_dh_out_args, RLK_LL_BWD_DH_OUT_PARAMS, RLK_LL_BWD_DH_OUT_PARAMS_SIZE);

#define LL_N(a) (sizeof(a) / sizeof((a)[0]))

static const char *const ll_grad_names[] = RLK_PARAMS_ENUM_NAMES(RLK_FLOAT_DTS);

static const rlk_value_decl *const ll_dz_params[] = {
    RLK_PARAM_CHOICE("hidden", rlk_ll_dt_names, 1, 2),
    &rlk_ll_labels,
    &rlk_ll_entropy,
};
static const rlk_value_decl *const ll_dh_params[] = {
    RLK_PARAM_CHOICE("hidden", rlk_ll_dt_names, 1, 2),
};
static const rlk_value_decl *const ll_dw_params[] = {
    RLK_PARAM_CHOICE("hidden", rlk_ll_dt_names, 1, 2),
    RLK_PARAM_CHOICE("gw", ll_grad_names, 0, 2),
};
static const rlk_value_decl *const ll_dh_out_params[] = {
    RLK_PARAM_CHOICE("gh", ll_grad_names, 0, 2),
};
static const rlk_value_decl *const ll_bwd_host_params[] = {
    RLK_PARAM_CHOICE("hidden", rlk_ll_dt_names, 1, 2),
    &rlk_ll_labels,
    RLK_PARAM_CHOICE("gh", ll_grad_names, 0, 2),
    RLK_PARAM_CHOICE("gw", ll_grad_names, 0, 2),
    &rlk_ll_entropy,
};

#define LL_BWD_CUDA "cuda/linear_logprob_bwd.cuh"
static const rlk_template ll_dz_tmpl = {"linear_logprob", "linear_logprob_bwd_dz", LL_BWD_CUDA, NULL,
                                        LL_N(ll_dz_params), ll_dz_params};
static const rlk_template ll_dh_tmpl = {"linear_logprob", "linear_logprob_bwd_dh", LL_BWD_CUDA, NULL,
                                        LL_N(ll_dh_params), ll_dh_params};
static const rlk_template ll_dw_tmpl = {"linear_logprob", "linear_logprob_bwd_dw", LL_BWD_CUDA, NULL,
                                        LL_N(ll_dw_params), ll_dw_params};
static const rlk_template ll_dh_out_tmpl = {"linear_logprob", "linear_logprob_bwd_dh_out", LL_BWD_CUDA,
                                            NULL, LL_N(ll_dh_out_params), ll_dh_out_params};
static const rlk_template ll_bwd_host_tmpl = {"linear_logprob", "linear_logprob_bwd_host", NULL,
                                              "host/linear_logprob_bwd.c", LL_N(ll_bwd_host_params),
                                              ll_bwd_host_params};

/* sm_90a: one kernel, the product chosen by kind (linear_logprob_bwd.h). */
static const rlk_value_decl *const ll_bwd_sm90_params[] = {
    RLK_PARAM_INT("kind", 0, 5),
    RLK_PARAM_CHOICE("hidden", rlk_ll_dt_names, 1, 2),
    &rlk_ll_labels,
    &rlk_ll_entropy,
    RLK_PARAM_CHOICE("gw", ll_grad_names, 0, 2),
};
const rlk_template rlk_ll_bwd_sm90_tmpl = {"linear_logprob", "linear_logprob_bwd_sm90",
                                           "cuda/linear_logprob_bwd_sm90.cuh", NULL,
                                           LL_N(ll_bwd_sm90_params), ll_bwd_sm90_params,
                                           RLK_TARGET_WGMMA | RLK_TARGET_TMA};

/* The sm_90a backward's shared memory: LL_BWD_SM90_SMEM, with the staging (..._STAGED) for the
 * kernels whose outputs leave by TMA (dz always, dh and dw where a map describes theirs). */

/* The backward's workspace at most when the call chooses the chunk: dz of a chunk, and the f32
 * grad_hidden sum for a 16-bit grad_hidden (0.28 GiB, under the 0.3 GiB a trainer budgets beside
 * its activations). */
#define LL_BWD_WORKSPACE_BYTES ((int64_t)288 << 20)
/* The narrowest dz chunk a block of rows is sized for: 1024 columns keep the grad_weight product
 * of a chunk (1024 x H tiles of 128 x 256) near a wave of an H200's multiprocessors at H 4096. */
#define LL_BWD_BLOCK_COLS 1024
static int64_t ll_bwd_budget = LL_BWD_WORKSPACE_BYTES; /* rlk_ll_bwd_set_budget */
void rlk_ll_bwd_set_budget(int64_t bytes) { ll_bwd_budget = bytes > 0 ? bytes : LL_BWD_WORKSPACE_BYTES; }

rlk_status rlk_ll_bwd_specs(const rlk_context *ctx, const rlk_ll_bwd_config *c, rlk_kernel_spec *specs, size_t *n) {
  *n = 0;
  rlk_status st;
  if (ctx->kind != RLK_BACKEND_HOST && c->sm90) {
    rlk_kernel_spec dz = {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_DZ, c->hidden, c->labels, c->entropy, 0}};
    specs[(*n)++] = dz;
    if (c->gh >= 0) {
      rlk_kernel_spec dh = {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_DH, c->hidden, RLK_I32, 0, 0}},
                      out = {&ll_dh_out_tmpl, {c->gh}};
      specs[(*n)++] = dh;
      if (c->gh > 0) specs[(*n)++] = out;
    }
    if (c->gw >= 0) {
      rlk_kernel_spec dw = {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_DW, c->hidden, RLK_I32, 0, c->gw}};
      specs[(*n)++] = dw;
    }
  } else if (ctx->kind == RLK_BACKEND_HOST) {
    rlk_kernel_spec s = {&ll_bwd_host_tmpl, {c->hidden, c->labels, c->gh < 0 ? 0 : c->gh, c->gw < 0 ? 0 : c->gw, c->entropy}};
    specs[(*n)++] = s;
  } else {
    rlk_kernel_spec dz = {&ll_dz_tmpl, {c->hidden, c->labels, c->entropy}};
    specs[(*n)++] = dz;
    if (c->gh >= 0) {
      rlk_kernel_spec dh = {&ll_dh_tmpl, {c->hidden}}, out = {&ll_dh_out_tmpl, {c->gh}};
      specs[(*n)++] = dh;
      if (c->gh > 0) specs[(*n)++] = out;
    }
    if (c->gw >= 0) {
      rlk_kernel_spec dw = {&ll_dw_tmpl, {c->hidden, c->gw}};
      specs[(*n)++] = dw;
    }
  }
  for (size_t i = 0; i < *n; i++)
    if ((st = rlk_spec_validate(&specs[i]))) return st;
  return RLK_OK;
}

typedef rlk_ll_head ll_head;

/* A backward call: the head, the gradients' strides, the kernels' configuration, the chunk; a row
 * selection, the caller's hidden row stride and where the gathered rows (and on the host the
 * gradient rows of the selection) lie in the workspace. */
typedef struct ll_bwd_call {
  rlk_op_call op;
  ll_head h;
  int64_t lse_s, glp_s, ent_s, gent_s, ghs, gws, chunk;
  int group; /* the sm_90a tile order's rows of tiles */
  rlk_ll_bwd_config c;
  size_t dh_bytes, dz_bytes;
  int64_t block; /* the GPU's rows a block (all of them in one when they fit) */
  rlk_ll_rows r;
  int64_t hidden_stride;
  size_t gathered_at, rows_grad_at, scratch_at; /* scratch_at: the host kernel's fp64 sums */
} ll_bwd_call;

rlk_tma_desc_request rlk_ll_tma_req(const void *base, rlk_dtype dt, int64_t rows, int64_t cols, int64_t stride,
                                    uint32_t box_rows) {
  rlk_tma_desc_request r;
  memset(&r, 0, sizeof r);
  r.base = base;
  r.dtype = dt;
  r.rows = (uint64_t)rows;
  r.cols = (uint64_t)cols;
  r.row_stride = (uint64_t)stride;
  r.box_rows = box_rows;
  r.box_cols = LL_SM90_BK;
  r.swizzle = 128;
  return r;
}

rlk_tma_desc_request rlk_ll_tma_req_f32(void *base, int64_t rows, int64_t cols, int64_t stride) {
  rlk_tma_desc_request r = rlk_ll_tma_req(base, RLK_F32, rows, cols, stride, 64);
  r.box_cols = 32;
  return r;
}

int rlk_ll_tma_ok(const rlk_tma_desc_request *r) {
  if (rlk_tma_check(r) == RLK_OK) return 1;
  rlk_error_clear();
  return 0;
}

/* A gradient output, given (rlk_ll_check_matrix_of's checks) and [rows, cols]: its row stride, and
 * its float code in *dt. */
static rlk_status ll_check_grad(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t rows, int64_t cols,
                                int64_t *stride, int *dt) {
  rlk_status st;
  int64_t r, c;
  if ((st = rlk_ll_check_matrix_of(t, what, dtypes, &r, &c, stride))) return st;
  if (r != rows || c != cols)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld], expected [%lld, %lld]", what, (long long)r,
                     (long long)c, (long long)rows, (long long)cols);
  *dt = rlk_op_float_dt(t->dtype);
  return RLK_OK;
}

/* Whether the sm_90a backward can run: the target, and tensor maps for hidden (the rows the
 * products read: the caller's, or a selection's gathered ones) and weight in the boxes it reads
 * (K-major and MN-major). */
static int ll_bwd_sm90_ok(const rlk_context *ctx, const rlk_linear_logprob_backward_args *a, const rlk_tensor *hidden,
                          const ll_bwd_call *k) {
  if (!rlk_ll_wgmma_target(ctx)) return 0;
  const rlk_tma_desc_request r[4] = {
      rlk_ll_tma_req(hidden->data, hidden->dtype, k->h.N, k->h.H, k->h.hs, LL_SM90_BM),
      rlk_ll_tma_req(hidden->data, hidden->dtype, k->h.N, k->h.H, k->h.hs, 64),
      rlk_ll_tma_req(a->weight.data, a->weight.dtype, k->h.V, k->h.H, k->h.ws, LL_SM90_BN),
      rlk_ll_tma_req(a->weight.data, a->weight.dtype, k->h.V, k->h.H, k->h.ws, 64)};
  for (int i = 0; i < 4; i++)
    if (rlk_tma_check(&r[i]) != RLK_OK) {
      rlk_debug("linear_logprob backward: no tensor map for %s (%s); the portable kernels run",
                i < 2 ? "hidden" : "weight", rlk_last_error());
      rlk_error_clear();
      return 0;
    }
  return 1;
}

/* A backward's `grad` setting (0 f32, 1 the inputs' dtype): grad_weight's, else grad_hidden's. */
static int ll_bwd_grad_line(const rlk_ll_bwd_config *c) { return (c->gw >= 0 ? c->gw : c->gh) > 0; }

static rlk_status ll_bwd_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_linear_logprob_backward_args *a = args;
  ll_bwd_call *k = (ll_bwd_call *)call;
  rlk_status st;
  if ((st = rlk_ll_check_head(&a->hidden, &a->weight, a->rows.data ? NULL : &a->labels, a->temperature, &k->h)))
    return st;
  k->hidden_stride = k->h.hs;
  if ((st = rlk_ll_rows_check(&a->rows, &a->labels, &k->h, &k->r))) return st;
  const rlk_tensor planned = k->r.data ? rlk_ll_rows_planned(&a->hidden, &k->r) : a->hidden;
  if (k->r.data) k->h.hs = k->r.pitch;
  /* grad_hidden keeps hidden's shape */
  const int64_t gh_rows = k->r.data ? k->r.all : k->h.N;
  const uint32_t f32 = RLK_DTYPE_BIT(RLK_F32);
  if ((st = rlk_check_vector(&a->lse, "lse", f32, k->h.N, 0, &k->lse_s))) return st;
  if (a->grad_logp.data && (st = rlk_check_vector(&a->grad_logp, "grad_logp", f32, k->h.N, 0, &k->glp_s)))
    return st;
  if (a->grad_entropy.data) {
    if ((st = rlk_check_vector(&a->grad_entropy, "grad_entropy", f32, k->h.N, 0, &k->gent_s))) return st;
    if (!a->entropy.data)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "entropy: required with grad_entropy (E_p[z] = lse - entropy)");
    if ((st = rlk_check_vector(&a->entropy, "entropy", f32, k->h.N, 0, &k->ent_s))) return st;
  }
  if (!a->grad_logp.data && !a->grad_entropy.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad_logp and grad_entropy: give at least one");
  if (!a->grad_hidden.data && !a->grad_weight.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad_hidden and grad_weight: give at least one");
  const uint32_t gdt = f32 | RLK_DTYPE_BIT(a->hidden.dtype);
  k->c.gh = k->c.gw = -1;
  if (a->grad_hidden.data &&
      (st = ll_check_grad(&a->grad_hidden, "grad_hidden", gdt, gh_rows, k->h.H, &k->ghs, &k->c.gh)))
    return st;
  if (a->grad_weight.data &&
      (st = ll_check_grad(&a->grad_weight, "grad_weight", gdt, k->h.V, k->h.H, &k->gws, &k->c.gw)))
    return st;
  if ((st = rlk_check_status(&a->status))) return st;
  if (a->threshold.data) {
    if (a->shard) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "threshold: kept-set replay has no shard form");
    if ((st = rlk_check_vector(&a->threshold, "threshold", f32, k->h.N, 1, NULL))) return st;
  }
  if ((st = rlk_check_flag(a->accumulate, "accumulate"))) return st;
  if ((st = rlk_check_flag(a->shard, "shard"))) return st;
  if (!a->shard && a->vocab_start != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "vocab_start: %lld without shard 1",
                     (long long)a->vocab_start);
  if ((st = rlk_check_vocab_start(a->vocab_start))) return st;
  if (a->chunk < 0 || a->chunk % LL_TILE)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "chunk: %d is not 0 or a positive multiple of 64", a->chunk);
  if (a->group < 0 || a->group > RLK_LL_BWD_GROUP_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "group: %d is not 0 (the default) or 1 to %d", a->group,
                     RLK_LL_BWD_GROUP_MAX);
  k->c.hidden = rlk_ll_dt_code(a->hidden.dtype);
  k->c.labels = a->labels.dtype;
  k->c.entropy = a->grad_entropy.data != NULL;
  /* one line per gradient dtype the call writes (grad_hidden and grad_weight may differ): the f32
   * one here, the other recorded by the launch */
  rlk_ll_line(&call->vals, 1, a->hidden.dtype, a->labels.dtype, k->c.entropy, !(k->c.gh == 0 || k->c.gw == 0),
              RLK_LINEAR_LOGPROB_AUTO, 0);
  if (k->r.data) rlk_op_values_set(&call->vals, RLK_LL_S_ROWS, rlk_ll_rows_line(&k->r));
  if (ctx->kind == RLK_BACKEND_HOST) {
    /* a selection: its gathered rows, and the rows of grad_hidden the host kernel writes (the
     * gathered call's, from what the selected rows held when accumulating) */
    if (k->r.data) {
      k->gathered_at = 0;
      k->rows_grad_at = rlk_ll_rows_bytes(k->h.N, k->r.pitch, 2);
      call->workspace = k->rows_grad_at + (k->c.gh >= 0 ? rlk_ll_rows_bytes(k->h.N, k->h.H,
                                                                            rlk_dtype_size(a->grad_hidden.dtype))
                                                          : 0);
    }
    /* then the kernel's fp64 sums: N H with grad_hidden, and H */
    int64_t sums = 0;
    if (__builtin_mul_overflow(a->grad_hidden.data ? k->h.N : 0, k->h.H, &sums) ||
        __builtin_add_overflow(sums, k->h.H, &sums) || (uint64_t)sums > SIZE_MAX / 16)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_linear_logprob_backward: the host path's fp64 sums of N = %lld "
                       "rows by H = %lld outgrow a size", (long long)k->h.N, (long long)k->h.H);
    k->scratch_at = (call->workspace + 255u) & ~(size_t)255u;
    call->workspace = k->scratch_at + (size_t)sums * sizeof(double);
    return rlk_ll_bwd_specs(ctx, &k->c, call->specs, &call->nspecs);
  }
  int asked_chunk = a->chunk, group = a->group;
  if (!asked_chunk && !group)
    rlk_ll_tuned_bwd(ctx, a->hidden.dtype, a->labels.dtype, k->c.entropy, ll_bwd_grad_line(&k->c), k->h.H, k->h.V,
                     k->h.N, &asked_chunk, &group);
  k->group = group ? group : RLK_LL_BWD_GROUP;
  /* sm_90a: dz in 16 bits, chunks of whole 256-column tiles (the dz tile's width) */
  k->c.sm90 = ll_bwd_sm90_ok(ctx, a, &planned, k);
  if (!k->c.sm90 && rlk_ll_wgmma_target(ctx) && rlk_invariant())
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "hidden, weight: no tensor map describes them (16-byte aligned, row strides a multiple of 8 "
                     "elements), and the portable kernels they would fall back to round dz and sum in another "
                     "order; RLK_INVARIANT=1 refuses the fallback");
  const int64_t tile = k->c.sm90 ? LL_SM90_BN : LL_TILE, dzs = k->c.sm90 ? 2 : 4;
  /* an f32 grad_hidden is its own sum (but for a selection's, which scatter writes by row); a
   * 16-bit one needs the sum in the workspace */
  const int64_t sum_row = k->c.gh > 0 || (k->c.gh == 0 && k->r.data) ? 4 * k->h.H : 0;
  /* the rows go in blocks whose sums and a dz of LL_BWD_BLOCK_COLS columns fit the budget (all in
   * one while they do), so that the workspace follows a block, not N; a selection's gathered rows
   * come beside the budget, so that it blocks and chunks as the call on its gathered rows does */
  k->block = rlk_ll_bwd_block_rows(k->h.N, sum_row, dzs * LL_BWD_BLOCK_COLS, ll_bwd_budget);
  const int64_t R = k->block;
  k->dh_bytes = rlk_ll_align256((size_t)(R * sum_row));
  const size_t gathered = k->r.data ? rlk_ll_rows_bytes(R, k->r.pitch, 2) : 0;
  /* dz within what the sum leaves of the budget; the sm_90a kernels' width from their cost model
   * (whole waves of tiles), the portable ones' the fewest chunks cut evenly */
  rlk_ll_chunk_problem cp = {R, k->h.H, k->h.V, k->c.gh >= 0, k->c.gw >= 0, ctx->target.multiprocessors, 0};
  const int64_t chunk = rlk_ll_bwd_chunk(asked_chunk, k->h.V, tile, ll_bwd_budget - (int64_t)k->dh_bytes, dzs * R,
                                         k->c.sm90 ? &cp : NULL);
  k->chunk = chunk;
  k->dz_bytes = rlk_ll_align256((size_t)(R * chunk * dzs));
  k->gathered_at = k->dh_bytes + k->dz_bytes;
  call->workspace = k->gathered_at + gathered;
  return rlk_ll_bwd_specs(ctx, &k->c, call->specs, &call->nspecs);
}

RLK_API void rlk_linear_logprob_backward_args_init(rlk_linear_logprob_backward_args *args) {
  static const rlk_linear_logprob_backward_args defaults = {.temperature = 1.0f, .ignore_index = -100};
  if (args) *args = defaults;
}

/* The per-row inputs every backward kernel's arguments share (the host kernel, the portable dz,
 * linear_logprob_bwd_sm90), set from rlk_linear_logprob_backward's locals in one place. */
#define LL_BWD_ROW_INPUTS(x)                                                                         \
  do {                                                                                               \
    (x).labels = labels, (x).label_stride = k->h.ls, (x).V = V, (x).ignore_index = a->ignore_index;  \
    (x).lse = lse, (x).lse_s = k->lse_s, (x).g_lp = glp, (x).glp_s = k->glp_s;                       \
    (x).entropy = ent, (x).ent_s = k->ent_s, (x).g_ent = gent, (x).gent_s = k->gent_s;               \
    (x).status = status, (x).vocab_start = a->vocab_start;                                           \
    (x).temperature = a->temperature, (x).shard = a->shard;                                          \
    (x).threshold = thr;                                                                             \
  } while (0)

/* grad_hidden (+)= the f32 sum dh of the workspace. */
static rlk_status ll_bwd_dh_out(rlk_context *ctx, const rlk_kernel_spec *spec, const float *dh, int64_t N,
                                int64_t H, void *gh, int64_t ghs, int accumulate, void *stream) {
  const ll_bwd_dh_out_args o = {
      .dh = dh, .N = N, .H = H, .grad_hidden = gh, .gh_stride = ghs, .accumulate = accumulate};
  rlk_launch_dims d = rlk_op_grid((uint64_t)((N * H + LL_THREADS - 1) / LL_THREADS), 1, 1, LL_THREADS, 0);
  return rlk_context_launch_params(ctx, spec, &d, stream, &o);
}

rlk_status rlk_ll_bwd_sm90_launch(rlk_context *ctx, const rlk_kernel_spec *spec, ll_bwd_sm90_args *g, size_t smem,
                                  void *stream) {
  const int64_t tm = (g->M + LL_SM90_BM - 1) / LL_SM90_BM, tn = (g->Nn + LL_SM90_BN - 1) / LL_SM90_BN;
  if (tm * tn > INT32_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "linear_logprob_backward: %lld x %lld output tiles are too many",
                     (long long)tm, (long long)tn);
  g->tiles_m = (int)tm, g->tiles_n = (int)tn;
  const int64_t sms = ctx->target.multiprocessors > 0 ? ctx->target.multiprocessors : 1;
  const rlk_launch_dims d = rlk_op_grid((uint64_t)(tm * tn < sms ? tm * tn : sms), 1, 1, LL_SM90_THREADS, smem);
  return rlk_context_launch_params(ctx, spec, &d, stream, g);
}

/* The host's one fp64 kernel over every row (a selection's rows gathered first, and its grad_hidden
 * rows written by row after). */
static rlk_status ll_bwd_host(rlk_context *ctx, const rlk_linear_logprob_backward_args *a, const ll_bwd_call *k,
                              const rlk_kernel_spec *spec, void *stream) {
  rlk_status st;
  const void *hidden = a->hidden.data, *weight = a->weight.data, *labels = a->labels.data;
  const int64_t N = k->h.N, V = k->h.V, H = k->h.H;
  const float *lse = (const float *)a->lse.data, *glp = (const float *)a->grad_logp.data,
              *ent = k->c.entropy ? (const float *)a->entropy.data : NULL, *gent = (const float *)a->grad_entropy.data,
              *thr = (const float *)a->threshold.data;
  void *gh = a->grad_hidden.data, *gw = a->grad_weight.data;
  int *status = (int *)a->status.data;
  /* a selection's grad_hidden rows as the gathered call writes them (from the rows' held values
   * when accumulating), then written by row */
  void *rows_gh = gh;
  int64_t rows_ghs = k->ghs;
  if (k->r.data) {
    void *gathered = (char *)a->workspace + k->gathered_at;
    if ((st = rlk_ll_gather(ctx, &k->r, k->c.hidden, hidden, k->hidden_stride, H, 0, N, gathered, k->r.pitch, status,
                            stream)))
      return st;
    hidden = gathered;
    if (gh) {
      rows_gh = (char *)a->workspace + k->rows_grad_at;
      rows_ghs = H;
      if (a->accumulate &&
          (st = rlk_ll_gather(ctx, &k->r, k->c.gh, gh, k->ghs, H, 0, N, rows_gh, H, status, stream)))
        return st;
    }
  }
  ll_bwd_host_args h = {0};
  LL_BWD_ROW_INPUTS(h);
  h.hidden = hidden, h.h_stride = k->h.hs, h.weight = weight, h.w_stride = k->h.ws, h.N = N, h.H = H;
  h.grad_hidden = rows_gh, h.gh_stride = rows_ghs, h.grad_weight = gw, h.gw_stride = k->gws;
  h.accumulate = a->accumulate;
  h.scratch = (double *)((char *)a->workspace + k->scratch_at);
  rlk_launch_dims d = rlk_op_grid(1, 1, 1, 1, 0);
  if ((st = rlk_context_launch_params(ctx, spec, &d, stream, &h))) return st;
  return rows_gh != gh ? rlk_ll_scatter(ctx, &k->r, k->c.gh, rows_gh, H, H, gh, k->ghs, 0, !a->accumulate, stream)
                       : RLK_OK;
}

/* Row r0 of a per-row f32 input `stride` apart (NULL stays NULL). */
static const float *ll_row_at(const void *p, int64_t r0, int64_t stride) {
  return p ? (const float *)p + r0 * stride : NULL;
}

/* One block of the GPU backward, rows [r0, r0 + N) (the call's selected rows with a selection):
 * the chunks of the vocabulary in order: dz of the chunk (recomputed logits), the f32 sum of the
 * block's grad_hidden rows, grad_weight's rows of the chunk (written by the first block unless
 * accumulating, added to by the others); then the block's grad_hidden rows from their sum (a
 * 16-bit one's, or a selection's by row). */
static rlk_status ll_bwd_block(rlk_context *ctx, const rlk_linear_logprob_backward_args *a, const ll_bwd_call *k,
                               const rlk_kernel_spec *specs, size_t nspecs, int64_t r0, int64_t N, void *stream) {
  rlk_status st;
  const int64_t V = k->h.V, H = k->h.H;
  const void *weight = a->weight.data;
  const void *labels = (const char *)a->labels.data + (size_t)(r0 * k->h.ls) * rlk_dtype_size(a->labels.dtype);
  const float *lse = ll_row_at(a->lse.data, r0, k->lse_s), *glp = ll_row_at(a->grad_logp.data, r0, k->glp_s),
              *ent = k->c.entropy ? ll_row_at(a->entropy.data, r0, k->ent_s) : NULL,
              *gent = ll_row_at(a->grad_entropy.data, r0, k->gent_s), *thr = ll_row_at(a->threshold.data, r0, 1);
  void *gh = a->grad_hidden.data, *gw = a->grad_weight.data;
  int *status = (int *)a->status.data;
  /* the products read the block's rows: a selection's gathered into the workspace */
  const void *hidden = k->r.data ? (const void *)((char *)a->workspace + k->gathered_at)
                                  : (const void *)((const char *)a->hidden.data + (size_t)(r0 * k->h.hs) * 2u);
  if (k->r.data && (st = rlk_ll_gather(ctx, &k->r, k->c.hidden, a->hidden.data, k->hidden_stride, H, r0, N,
                                       (void *)hidden, k->r.pitch, status, stream)))
    return st;
  const int gw_add = a->accumulate || r0 > 0;
  /* the f32 grad_hidden sum: grad_hidden's rows themselves (its row stride; the first chunk adds to
   * them only when accumulating), or the workspace's (rows of H, converted by dh_out or, for a
   * selection, written by row at the end: an f32 selection's sum starts from what its rows held
   * when accumulating, as the gathered call's does) */
  const int dh_direct = k->c.gh == 0 && !k->r.data, seeded = gh && k->r.data && k->c.gh == 0 && a->accumulate;
  float *dh = !gh ? NULL : dh_direct ? (float *)gh + r0 * k->ghs : (float *)a->workspace;
  const int64_t dhs = dh_direct ? k->ghs : H;
  const int dh_add_first = (dh_direct || seeded) && a->accumulate;
  if (seeded && (st = rlk_ll_gather(ctx, &k->r, RLK_DT_F32, gh, k->ghs, H, r0, N, dh, H, status, stream))) return st;
  float *dz = (float *)((char *)a->workspace + k->dh_bytes);
  const rlk_kernel_spec *s_dz = &specs[0], *s_dh = gh ? &specs[1] : NULL,
                        *s_out = gh && !dh_direct && !k->r.data ? &specs[2] : NULL, *s_dw = gw ? &specs[nspecs - 1] : NULL;
  const int64_t Vc = k->chunk;
  if (k->c.sm90) {
    const rlk_dtype dt = a->hidden.dtype;
    rlk_tensor_map m_hk, m_wk, m_wmn, m_hmn, m_zk, m_zmn, m_dh;
    const rlk_tma_desc_request r_hk = rlk_ll_tma_req(hidden, dt, N, H, k->h.hs, LL_SM90_BM),
                               r_wk = rlk_ll_tma_req(weight, dt, V, H, k->h.ws, LL_SM90_BN),
                               r_wmn = rlk_ll_tma_req(weight, dt, V, H, k->h.ws, 64),
                               r_hmn = rlk_ll_tma_req(hidden, dt, N, H, k->h.hs, 64);
    if ((st = rlk_context_tensor_map(ctx, &r_hk, &m_hk)) ||
        (st = rlk_context_tensor_map(ctx, &r_wk, &m_wk)) ||
        (s_dh && (st = rlk_context_tensor_map(ctx, &r_wmn, &m_wmn))) ||
        (s_dw && (st = rlk_context_tensor_map(ctx, &r_hmn, &m_hmn))))
      return st;
    /* dh's sum and grad_weight leave through shared staging and TMA where a map describes them */
    const rlk_tma_desc_request r_dh = rlk_ll_tma_req_f32(dh, N, H, dhs);
    /* a 16-bit grad_weight that is added to keeps the register path */
    const int dh_staged = s_dh && rlk_ll_tma_ok(&r_dh), gw_staged = s_dw && (k->c.gw == 0 || !gw_add);
    if (dh_staged && (st = rlk_context_tensor_map(ctx, &r_dh, &m_dh))) return st;
    ll_bwd_sm90_args g = {0};
    LL_BWD_ROW_INPUTS(g);
    g.group = k->group;
    for (int64_t c0 = 0; c0 < V; c0 += Vc) {
      const int64_t nv = V - c0 < Vc ? V - c0 : Vc;
      g.c0 = c0;
      /* dz [N][nv] of this chunk (pitch Vc), as the next products' A operand both ways */
      const rlk_tma_desc_request r_zk = rlk_ll_tma_req(dz, dt, N, nv, Vc, LL_SM90_BM),
                                 r_zmn = rlk_ll_tma_req(dz, dt, N, nv, Vc, 64);
      if ((st = rlk_context_tensor_map(ctx, &r_zmn, &m_zmn)) ||
          (s_dh && (st = rlk_context_tensor_map(ctx, &r_zk, &m_zk))))
        return st;
      /* the third map is the output's: dz's (64 x 64 boxes), dh's or grad_weight's when staged (any
       * map otherwise, unread); the fourth is unread */
      g.M = N, g.Nn = nv, g.K = H, g.out = dz, g.out_stride = Vc, g.accumulate = 0, g.staged = 0;
      g.map_a = m_hk, g.map_b = m_wk, g.map_c = m_zmn, g.map_d = m_zmn;
      if ((st = rlk_ll_bwd_sm90_launch(ctx, s_dz, &g, LL_BWD_SM90_SMEM_STAGED, stream))) return st;
      if (s_dh) {
        g.M = N, g.Nn = H, g.K = nv, g.out = dh, g.out_stride = dhs, g.accumulate = c0 > 0 || dh_add_first;
        g.staged = dh_staged;
        g.map_a = m_zk, g.map_b = m_wmn, g.map_c = dh_staged ? m_dh : m_zmn, g.map_d = m_zmn;
        if ((st = rlk_ll_bwd_sm90_launch(ctx, s_dh, &g, dh_staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM,
                                         stream)))
          return st;
      }
      if (s_dw) {
        /* this chunk's rows of grad_weight: a map of their own */
        const rlk_tma_desc_request r_gw =
            k->c.gw == 0 ? rlk_ll_tma_req_f32((float *)gw + c0 * k->gws, nv, H, k->gws)
                         : rlk_ll_tma_req((uint16_t *)gw + c0 * k->gws, a->grad_weight.dtype, nv, H, k->gws, 64);
        g.staged = gw_staged && rlk_ll_tma_ok(&r_gw);
        g.map_a = m_zmn, g.map_b = m_hmn, g.map_c = m_zmn, g.map_d = m_zmn;
        if (g.staged && (st = rlk_context_tensor_map(ctx, &r_gw, &g.map_c))) return st;
        g.M = nv, g.Nn = H, g.K = N, g.out = gw, g.out_stride = k->gws, g.accumulate = gw_add;
        if ((st = rlk_ll_bwd_sm90_launch(ctx, s_dw, &g, g.staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM, stream)))
          return st;
      }
    }
  } else {
    const uint64_t rb = (uint64_t)((N + LL_TILE - 1) / LL_TILE);
    const uint64_t hb = (uint64_t)((H + LL_TILE - 1) / LL_TILE);
    for (int64_t c0 = 0; c0 < V; c0 += Vc) {
      const int64_t nv = V - c0 < Vc ? V - c0 : Vc;
      const uint64_t vb = (uint64_t)((nv + LL_TILE - 1) / LL_TILE);
      ll_bwd_dz_args z = {0};
      LL_BWD_ROW_INPUTS(z);
      z.hidden = hidden, z.h_stride = k->h.hs, z.weight = weight, z.w_stride = k->h.ws;
      z.N = N, z.H = H, z.c0 = c0, z.Vc = Vc, z.dz = dz;
      rlk_launch_dims d = rlk_op_grid(rb, vb, 1, LL_THREADS, 0);
      if ((st = rlk_context_launch_params(ctx, s_dz, &d, stream, &z))) return st;
      /* the two products of the chunk share their first arguments (RLK_LL_CHUNK_PRODUCT) */
      if (s_dh) {
        const ll_bwd_dh_args h = {.dz = dz, .Vc = Vc, .nv = nv, .c0 = c0, .N = N, .H = H,
                                  .weight = weight, .w_stride = k->h.ws,
                                  .dh = dh, .dh_stride = dhs, .beta = c0 || dh_add_first ? 1.0f : 0.0f};
        d = rlk_op_grid(rb, hb, 1, LL_THREADS, 0);
        if ((st = rlk_context_launch_params(ctx, s_dh, &d, stream, &h))) return st;
      }
      if (s_dw) {
        const ll_bwd_dw_args w = {.dz = dz, .Vc = Vc, .nv = nv, .c0 = c0, .N = N, .H = H,
                                  .hidden = hidden, .h_stride = k->h.hs,
                                  .grad_weight = gw, .gw_stride = k->gws, .accumulate = gw_add};
        d = rlk_op_grid(vb, hb, 1, LL_THREADS, 0);
        if ((st = rlk_context_launch_params(ctx, s_dw, &d, stream, &w))) return st;
      }
    }
  }
  if (!gh) return RLK_OK;
  if (k->r.data) {
    /* the block's part of the selection, by row: the first block writes 0 over every row not in
     * it (the later blocks' rows are written again by their own), the others only their rows */
    rlk_ll_rows part = k->r;
    part.data = (const char *)k->r.data + (size_t)(r0 * k->r.stride) * rlk_dtype_size(k->r.dtype);
    part.n = N;
    return rlk_ll_scatter(ctx, &part, k->c.gh, dh, H, H, gh, k->ghs, a->accumulate && k->c.gh > 0,
                          !a->accumulate && r0 == 0, stream);
  }
  return s_out ? ll_bwd_dh_out(ctx, s_out, dh, N, H, (char *)gh + (size_t)(r0 * k->ghs) * rlk_dtype_size(a->grad_hidden.dtype),
                               k->ghs, a->accumulate, stream)
               : RLK_OK;
}

/* The host's one kernel, or the GPU's blocks of rows in order (one block while the workspace
 * holds all rows' sums and a chunk's dz). */
static rlk_status ll_bwd_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  const rlk_linear_logprob_backward_args *a = args;
  const ll_bwd_call *k = (const ll_bwd_call *)call;
  rlk_status st;
  if (rlk_record_enabled() && (k->c.gh == 0 || k->c.gw == 0) && (k->c.gh > 0 || k->c.gw > 0)) {
    rlk_op_values same = call->vals;
    same.v[RLK_LL_S_GRAD] = 1;
    rlk_record_op(&rlk_op_linear_logprob, &same);
  }
  if (ctx->kind == RLK_BACKEND_HOST) return ll_bwd_host(ctx, a, k, &call->specs[0], stream);
  for (int64_t r0 = 0; r0 < k->h.N; r0 += k->block) {
    const int64_t n = k->h.N - r0 < k->block ? k->h.N - r0 : k->block;
    if ((st = ll_bwd_block(ctx, a, k, call->specs, call->nspecs, r0, n, stream))) return st;
  }
  return RLK_OK;
}

static const rlk_arg_field ll_bwd_fields[] = {
    RLK_ARG_IN(rlk_linear_logprob_backward_args, hidden),       RLK_ARG_IN(rlk_linear_logprob_backward_args, weight),
    RLK_ARG_IN(rlk_linear_logprob_backward_args, labels),       RLK_ARG_IN(rlk_linear_logprob_backward_args, lse),
    RLK_ARG_IN(rlk_linear_logprob_backward_args, grad_logp),    RLK_ARG_IN(rlk_linear_logprob_backward_args, grad_entropy),
    RLK_ARG_IN(rlk_linear_logprob_backward_args, entropy),      RLK_ARG_OUT(rlk_linear_logprob_backward_args, grad_hidden),
    RLK_ARG_OUT(rlk_linear_logprob_backward_args, grad_weight), RLK_ARG_OUT(rlk_linear_logprob_backward_args, status),
    RLK_ARG_IN(rlk_linear_logprob_backward_args, rows),         RLK_ARG_IN(rlk_linear_logprob_backward_args, threshold)};

static const rlk_op_entry ll_bwd_entry = {
    .name = "rlk_linear_logprob_backward", .op = &rlk_op_linear_logprob, .call_size = sizeof(ll_bwd_call),
    RLK_OP_FIELDS(ll_bwd_fields), .workspace = RLK_OP_WORKSPACE(rlk_linear_logprob_backward_args, 16),
    .validate = ll_bwd_validate, .launch = ll_bwd_launch};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_linear_logprob_backward, rlk_linear_logprob_backward_args, ll_bwd_entry)
