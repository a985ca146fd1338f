/* linear_divergence.c - the divergence of a student's next-token distribution from a teacher's,
 * from both models' hidden states and LM heads (rlk_linear_divergence), its backward and the
 * vocab-parallel combine: validation, the kernels' selection, the vocabulary split and chunks,
 * launches. The math, the stats the forward saves and the record format are in include/rlk.h.
 *
 * Forward kernels (templates/cuda/linear_divergence*.cuh, templates/host/linear_divergence_fwd.c):
 *   linear_divergence_fwd_sm90      sm_90a, heads that tensor maps describe: both heads' 128 x
 *                                   128 logit tiles by TMA + wgmma folded into the same records
 *                                   (kind 1: and the top-k lists, of z_t; kind 2: JSD's second pass)
 *   linear_divergence_fwd_tiled     every GPU target: both heads' 64 x 64 f32 logit tiles folded
 *                                   into per-(split, row) records in the workspace (top-k: and
 *                                   each split's list of its largest teacher logits)
 *   linear_divergence_combine       the records of a row in split order: lse's, the entropy, D
 *   linear_divergence_fwd_tiled     (kind 2) JSD's second pass, then linear_divergence_jsd_combine
 *   linear_divergence_topk          top-k: the set, the student's logits there, D
 *   linear_divergence_fwd_host      the host backend: fp64 throughout
 * then, when a loss is asked for, rlk_policy_loss on D (see ld_loss_args).
 *
 * Backward kernels (templates/cuda/linear_divergence_bwd.cuh, templates/host/linear_divergence_bwd.c):
 * per vocabulary chunk, in order, linear_divergence_bwd_dz (both heads' logits recomputed, dz of
 * each side asked for into the workspace), then per side the fused head's products over dz
 * (linear_logprob_bwd_dh, _dw; _dh_out at the end for a 16-bit grad_hidden). On sm_90a, where the
 * forward's does, linear_divergence_bwd_dz_sm90 writes dz in each head's 16-bit dtype and the
 * fused head's sm_90a products (linear_logprob_bwd_sm90's dh and dw kinds) follow
 * (templates/cuda/linear_divergence_bwd_sm90.cuh). The host runs linear_divergence_bwd_host (fp64).
 *
 * ld_plan turns a configuration (the settings of a precompile line, or those a call sets from
 * its arguments) into the kernels: calls and lines go through the one function. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/linear_divergence_plan.h"
#include "ops/linear_logprob_fwd.h"
#include "ops/linear_logprob_plan.h"
#include "ops/ops.h"
#include "runtime/op_call.h"
#include "runtime/record.h"
#include "common/linear_divergence_params.h"
#include "common/linear_logprob_params.h"

/* The arguments of the fused head's portable products it runs (templates/common/
 * linear_logprob_params.h; its own kernels' and the sm_90a products' are declared with their
 * lists). */
RLK_PARAMS_DECLARE(ld_dh_args, RLK_LL_BWD_DH_PARAMS, RLK_LL_BWD_DH_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ld_dw_args, RLK_LL_BWD_DW_PARAMS, RLK_LL_BWD_DW_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ld_dh_out_args, RLK_LL_BWD_DH_OUT_PARAMS, RLK_LL_BWD_DH_OUT_PARAMS_SIZE);

#define LD_N(a) (sizeof(a) / sizeof((a)[0]))
#define LD_HEAD_DTYPES (RLK_DTYPE_BIT(RLK_F16) | RLK_DTYPE_BIT(RLK_BF16))
#define LD_LABEL_DTYPES (RLK_DTYPE_BIT(RLK_I32) | RLK_DTYPE_BIT(RLK_I64))
#define LD_F32 RLK_DTYPE_BIT(RLK_F32)

/* The kernels' tiles, blocks and shared memory: LD_TILE, LD_THREADS and LD_SM90_*
 * (linear_divergence_params.h); the fused head's sm_90a products (its ll_bwd_sm90): LL_SM90_* and
 * LL_BWD_SM90_SMEM* (linear_logprob_params.h). */
#define LD_GROUP 8        /* the sm_90a tile orders' rows of tiles a group */
/* the sm_90a clusters are row blocks of one group */
_Static_assert(LD_GROUP % LD_SM90_FWD_CLUSTER_MAX == 0 && LD_GROUP % LD_SM90_DZ_CLUSTER == 0,
               "LD_GROUP: whole clusters of row blocks");
#define LD_CHUNK_SM90 LL_SM90_BN /* the sm_90a backward's chunks: whole tiles of its products */
_Static_assert(LD_RECORD == RLK_LINEAR_DIVERGENCE_PARTIAL_FIELDS, "a record: the kernels' and rlk.h's");
_Static_assert(LD_STATS == RLK_LINEAR_DIVERGENCE_STATS, "a row's statistics: the kernels' and rlk.h's");
#define LD_INDEX_MAX ((int64_t)1 << 24) /* top-k: columns kept as f32 in the stats */
/* The backward's workspace at most when the call chooses the chunk (as the fused head's). */
#define LD_BWD_WORKSPACE_BYTES ((int64_t)288 << 20)

/* The kernels' codes: labels, modes (dtypes are RLK_DT_*, f32 for gradients only). */
enum { LD_LL_DH = 1, LD_LL_DW = 2 }; /* the fused head's sm_90a product kinds (its LL_BWD_DH, _DW) */

static const char *const ld_dt_names[] = RLK_PARAMS_ENUM_NAMES(RLK_FLOAT_DTS);
static const char *const ld_label_names[] = RLK_PARAMS_ENUM_NAMES(RLK_LD_LABELS);
static const rlk_value_decl ld_labels = RLK_DECL_CHOICES("labels", ld_label_names); /* the setting's too */
static const char *const ld_kmode_names[] = RLK_PARAMS_ENUM_NAMES(RLK_LD_MODES);

/* The kernels' divergences and top-k bound are the API's. */
_Static_assert(LD_FKL == (int)RLK_DIVERGENCE_FORWARD_KL && LD_RKL == (int)RLK_DIVERGENCE_REVERSE_KL &&
                   LD_JSD == (int)RLK_DIVERGENCE_JSD,
               "linear_divergence modes: rlk_divergence_mode order");
_Static_assert(LD_TOPK_MAX == RLK_LINEAR_DIVERGENCE_TOP_K_MAX, "linear_divergence: LD_TOPK_MAX is the API's");

/* ---------------------------------------------------------------------------------- */
/* The templates                                                                       */
/* ---------------------------------------------------------------------------------- */

#define LD_FWD_CUDA "cuda/linear_divergence.cuh"
#define LD_BWD_CUDA "cuda/linear_divergence_bwd.cuh"
#define LD_FWD_SM90_CUDA "cuda/linear_divergence_sm90.cuh"
#define LD_BWD_SM90_CUDA "cuda/linear_divergence_bwd_sm90.cuh"
#define LD_SM90_NEEDS (RLK_TARGET_WGMMA | RLK_TARGET_TMA)

static const rlk_value_decl *const ld_host_params[] = {
    RLK_PARAM_CHOICE("sdt", ld_dt_names, 1, 2),
    RLK_PARAM_CHOICE("tdt", ld_dt_names, 1, 2),
    &ld_labels,
    RLK_PARAM_CHOICE("mode", ld_kmode_names, 0, 3),
};
static const rlk_value_decl *const ld_tiled_params[] = {
    RLK_PARAM_CHOICE("sdt", ld_dt_names, 1, 2),
    RLK_PARAM_CHOICE("tdt", ld_dt_names, 1, 2),
    RLK_PARAM_INT("kind", 0, 2),
};
/* the sm_90a forward's: the tiled kernel's and its cluster (row blocks sharing each W box: 1, 2
 * or 4) */
static const rlk_value_decl *const ld_fwd_sm90_params[] = {
    RLK_PARAM_CHOICE("sdt", ld_dt_names, 1, 2),
    RLK_PARAM_CHOICE("tdt", ld_dt_names, 1, 2),
    RLK_PARAM_INT("kind", 0, 2),
    RLK_PARAM_INT("cluster", 1, LD_SM90_FWD_CLUSTER_MAX),
};
static const rlk_value_decl *const ld_combine_params[] = {
    &ld_labels,
    RLK_PARAM_CHOICE("mode", ld_kmode_names, 0, 3),
};
static const rlk_value_decl *const ld_labels_params[] = {
    &ld_labels,
};
static const rlk_value_decl *const ld_topk_params[] = {
    RLK_PARAM_CHOICE("sdt", ld_dt_names, 1, 2),
    &ld_labels,
};
static const rlk_value_decl *const ld_dz_params[] = {
    RLK_PARAM_CHOICE("sdt", ld_dt_names, 1, 2),   RLK_PARAM_CHOICE("tdt", ld_dt_names, 1, 2),
    &ld_labels, RLK_PARAM_CHOICE("mode", ld_kmode_names, 0, 3),
    RLK_PARAM_FLAG("student"),       RLK_PARAM_FLAG("teacher"),
};
/* ... and sm_90a dz's: the same and its cluster (1 or 2) */
static const rlk_value_decl *const ld_dz_sm90_params[] = {
    RLK_PARAM_CHOICE("sdt", ld_dt_names, 1, 2),   RLK_PARAM_CHOICE("tdt", ld_dt_names, 1, 2),
    &ld_labels, RLK_PARAM_CHOICE("mode", ld_kmode_names, 0, 3),
    RLK_PARAM_FLAG("student"),       RLK_PARAM_FLAG("teacher"),
    RLK_PARAM_INT("cluster", 1, LD_SM90_DZ_CLUSTER),
};
/* the fused head's products over dz, instantiated from this op's source */
static const rlk_value_decl *const ld_dh_params[] = {RLK_PARAM_CHOICE("hidden", ld_dt_names, 1, 2)};
static const rlk_value_decl *const ld_dw_params[] = {RLK_PARAM_CHOICE("hidden", ld_dt_names, 1, 2),
                                              RLK_PARAM_CHOICE("gw", ld_dt_names, 0, 2)};
static const rlk_value_decl *const ld_dh_out_params[] = {RLK_PARAM_CHOICE("gh", ld_dt_names, 0, 2)};
/* ... and its sm_90a products (linear_logprob_bwd_sm90's schema: the dh and dw kinds, which read no
 * labels or entropy) */
static const rlk_value_decl *const ld_products_sm90_params[] = {
    RLK_PARAM_INT("kind", LD_LL_DH, LD_LL_DW),
    RLK_PARAM_CHOICE("hidden", ld_dt_names, 1, 2),
    RLK_PARAM_DTYPE("labels", RLK_DTYPE_BIT(RLK_I32)),
    RLK_PARAM_FLAG("entropy"),
    RLK_PARAM_CHOICE("gw", ld_dt_names, 0, 2),
};

static const rlk_template ld_fwd_host_tmpl = {"linear_divergence", "linear_divergence_fwd_host", NULL,
                                              "host/linear_divergence_fwd.c", LD_N(ld_host_params), ld_host_params};
static const rlk_template ld_bwd_host_tmpl = {"linear_divergence", "linear_divergence_bwd_host", NULL,
                                              "host/linear_divergence_bwd.c", LD_N(ld_host_params), ld_host_params};
static const rlk_template ld_combine_host_tmpl = {"linear_divergence", "linear_divergence_combine_host", NULL,
                                                  "host/linear_divergence_combine.c", LD_N(ld_combine_params),
                                                  ld_combine_params};
static const rlk_template ld_tiled_tmpl = {"linear_divergence", "linear_divergence_fwd_tiled", LD_FWD_CUDA, NULL,
                                           LD_N(ld_tiled_params), ld_tiled_params};
static const rlk_template ld_combine_tmpl = {"linear_divergence", "linear_divergence_combine", LD_FWD_CUDA, NULL,
                                             LD_N(ld_combine_params), ld_combine_params};
static const rlk_template ld_jsd_combine_tmpl = {"linear_divergence", "linear_divergence_jsd_combine", LD_FWD_CUDA,
                                                 NULL, LD_N(ld_labels_params), ld_labels_params};
static const rlk_template ld_topk_tmpl = {"linear_divergence", "linear_divergence_topk", LD_FWD_CUDA, NULL,
                                          LD_N(ld_topk_params), ld_topk_params};
static const rlk_template ld_dz_tmpl = {"linear_divergence", "linear_divergence_bwd_dz", LD_BWD_CUDA, NULL,
                                        LD_N(ld_dz_params), ld_dz_params};
static const rlk_template ld_dh_tmpl = {"linear_divergence", "linear_logprob_bwd_dh", LD_BWD_CUDA, NULL,
                                        LD_N(ld_dh_params), ld_dh_params};
static const rlk_template ld_dw_tmpl = {"linear_divergence", "linear_logprob_bwd_dw", LD_BWD_CUDA, NULL,
                                        LD_N(ld_dw_params), ld_dw_params};
static const rlk_template ld_dh_out_tmpl = {"linear_divergence", "linear_logprob_bwd_dh_out", LD_BWD_CUDA, NULL,
                                            LD_N(ld_dh_out_params), ld_dh_out_params};
/* sm_90a: the forward's kinds (the tiled kernel's schema and the cluster), dz (the portable dz's
 * schema and the cluster), the fused head's products */
static const rlk_template ld_fwd_sm90_tmpl = {"linear_divergence", "linear_divergence_fwd_sm90", LD_FWD_SM90_CUDA,
                                              NULL, LD_N(ld_fwd_sm90_params), ld_fwd_sm90_params, LD_SM90_NEEDS};
static const rlk_template ld_dz_sm90_tmpl = {"linear_divergence", "linear_divergence_bwd_dz_sm90", LD_BWD_SM90_CUDA,
                                             NULL, LD_N(ld_dz_sm90_params), ld_dz_sm90_params, LD_SM90_NEEDS};
static const rlk_template ld_products_sm90_tmpl = {"linear_divergence", "linear_logprob_bwd_sm90", LD_BWD_SM90_CUDA,
                                                   NULL, LD_N(ld_products_sm90_params), ld_products_sm90_params,
                                                   LD_SM90_NEEDS};

/* ---------------------------------------------------------------------------------- */
/* The settings and the plan (shared by calls and precompiling)                        */
/* ---------------------------------------------------------------------------------- */

static const char *const ld_pass_names[] = {"fwd", "bwd", "both", "combine", NULL};
static const char *const ld_mode_names[] = RLK_PARAMS_ENUM_NAMES(RLK_LD_DIVERGENCES);
static const char *const ld_grad_names[] = {"none", "f32", "same", NULL};
static const char *const ld_variant_names[] = {"auto", "wgmma", "tiled", NULL}; /* rlk_linear_logprob_variant */
enum { LD_PASS_FWD = 0, LD_PASS_BWD = 1, LD_PASS_BOTH = 2, LD_PASS_COMBINE = 3 };
enum { LD_GRAD_NONE = 0, LD_GRAD_F32 = 1, LD_GRAD_SAME = 2 };

enum {
  LD_S_PASS, LD_S_STUDENT, LD_S_TEACHER, LD_S_LABELS, LD_S_MODE, LD_S_TOPK, LD_S_SHARD, LD_S_GRAD,
  LD_S_TEACHER_GRAD, LD_S_VARIANT, LD_NSETTINGS
};

static const rlk_op_setting ld_settings[LD_NSETTINGS] = {
    [LD_S_PASS] = RLK_SET_CHOICE("pass", ld_pass_names, LD_PASS_BOTH, "linear_divergence_*",
                                 "the kernels to build (combine: rlk_linear_divergence_combine's)"),
    [LD_S_STUDENT] = RLK_SET_DTYPE("student", LD_HEAD_DTYPES, RLK_BF16, "linear_divergence_*.sdt",
                                   "the student head's dtype"),
    [LD_S_TEACHER] = RLK_SET_DTYPE("teacher", LD_HEAD_DTYPES, RLK_BF16, "linear_divergence_*.tdt",
                                   "the teacher head's dtype"),
    [LD_S_LABELS] = RLK_SET(ld_labels, LD_LAB_NONE, "linear_divergence_*.labels",
                            "the labels' dtype (none: no ignored rows)"),
    [LD_S_MODE] = RLK_SET_CHOICE("mode", ld_mode_names, LD_FKL, "linear_divergence_*.mode",
                                 "the divergence (rlk_divergence_mode)"),
    [LD_S_TOPK] = RLK_SET_FLAG("topk", 0, "linear_divergence_*.mode linear_divergence_fwd_tiled.kind",
                               "the teacher's top-k approximation (forward-kl)"),
    [LD_S_SHARD] = RLK_SET_FLAG("shard", 0, "", "the forward's shard form (a record a row); no other kernel"),
    [LD_S_GRAD] = RLK_SET_CHOICE("grad", ld_grad_names, LD_GRAD_F32, "linear_divergence_bwd_dz*.student linear_logprob_bwd_*",
                                 "the student's gradients' dtype (same: its head's)"),
    [LD_S_TEACHER_GRAD] = RLK_SET_CHOICE("teacher_grad", ld_grad_names, LD_GRAD_NONE,
                                         "linear_divergence_bwd_dz*.teacher linear_logprob_bwd_*",
                                         "the teacher's gradients' dtype (none: a frozen teacher)"),
    [LD_S_VARIANT] = RLK_SET_CHOICE("variant", ld_variant_names, RLK_LINEAR_LOGPROB_AUTO, "linear_divergence_*",
                                    "wgmma: the sm_90a kernels (elsewhere the portable ones run); "
                                    "tiled: the portable ones only"),
};

static int ld_code(int64_t dtype) { return dtype == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16; }

/* sm_90a exactly: wgmma needs the arch-specific target. */
static int ld_wgmma_target(const rlk_context *ctx) {
  return ctx->kind == RLK_BACKEND_CUDA && (ctx->target.features & RLK_TARGET_WGMMA) != 0;
}

/* Whether a configuration has sm_90a kernels here: the target, not the tiled variant. A call runs
 * them where tensor maps also describe its heads. */
static int ld_sm90_line(const rlk_context *ctx, const rlk_op_values *s) {
  return ld_wgmma_target(ctx) && s->v[LD_S_VARIANT] != RLK_LINEAR_LOGPROB_TILED;
}

/* The forward's cluster: linear_divergence_plan.h. dz: pairs where the row blocks are even or
 * many (an odd few would carry a block of no rows). */
#define LD_SM90_QUAD_SMS_PCT 85
int rlk_ld_sm90_fwd_cluster(const rlk_target *t, int64_t row_blocks, int top_k) {
  if (row_blocks < RLK_LD_SM90_CLUSTER_ROWS) return 1;
  if (top_k) return 2;
  return 100 * t->cluster_sms[2] >= LD_SM90_QUAD_SMS_PCT * t->cluster_sms[1] ? LD_SM90_FWD_CLUSTER_MAX : 2;
}
static int ld_dz_cluster(int64_t row_blocks) {
  return row_blocks % LD_SM90_DZ_CLUSTER == 0 || row_blocks >= 8 ? LD_SM90_DZ_CLUSTER : 1;
}

/* The GPU forward's kernels in launch order: the GEMM and the combine, then JSD's second pass and
 * its combine, or top-k's set; cluster: 0 the portable GEMMs, else the wgmma GEMMs in clusters of
 * that many row blocks. */
static void ld_fwd_specs(int sdt, int tdt, int lab, int kmode, int cluster, rlk_kernel_spec *specs, size_t *n) {
  const rlk_template *gemm = cluster ? &ld_fwd_sm90_tmpl : &ld_tiled_tmpl;
  const rlk_kernel_spec g = {gemm, {sdt, tdt, kmode == LD_TOPK ? LD_KIND_TOPK : LD_KIND_STATS, cluster}},
                        c = {&ld_combine_tmpl, {lab, kmode}}, g2 = {gemm, {sdt, tdt, LD_KIND_JSD, cluster}},
                        c2 = {&ld_jsd_combine_tmpl, {lab}}, t = {&ld_topk_tmpl, {sdt, lab}};
  specs[(*n)++] = g;
  specs[(*n)++] = c;
  if (kmode == LD_JSD) {
    specs[(*n)++] = g2;
    specs[(*n)++] = c2;
  } else if (kmode == LD_TOPK) {
    specs[(*n)++] = t;
  }
}

/* The fused head's products for one side's gradients (grad: LD_GRAD_*; head: its dtype code):
 * dh, dh_out for a 16-bit grad_hidden, dw; sm90: its sm_90a dh and dw kinds. */
static void ld_side_specs(int head, int grad, int sm90, rlk_kernel_spec *specs, size_t *n) {
  const int gw = grad == LD_GRAD_SAME ? head : 0;
  const rlk_kernel_spec dh = {&ld_dh_tmpl, {head}}, dw = {&ld_dw_tmpl, {head, gw}}, out = {&ld_dh_out_tmpl, {head}},
                        dh90 = {&ld_products_sm90_tmpl, {LD_LL_DH, head, RLK_I32, 0, 0}},
                        dw90 = {&ld_products_sm90_tmpl, {LD_LL_DW, head, RLK_I32, 0, gw}};
  specs[(*n)++] = sm90 ? dh90 : dh;
  if (grad == LD_GRAD_SAME) specs[(*n)++] = out;
  specs[(*n)++] = sm90 ? dw90 : dw;
}

/* The GPU backward's: dz of the sides asked for, then each side's products; cluster: 0 the
 * portable kernels, else the sm_90a ones, dz in clusters of that many row blocks. */
static void ld_bwd_specs(int sdt, int tdt, int lab, int kmode, int gs, int gt, int cluster, rlk_kernel_spec *specs,
                         size_t *n) {
  const int sm90 = cluster > 0;
  const rlk_kernel_spec dz = {sm90 ? &ld_dz_sm90_tmpl : &ld_dz_tmpl,
                              {sdt, tdt, lab, kmode, gs != LD_GRAD_NONE, gt != LD_GRAD_NONE, cluster}};
  specs[(*n)++] = dz;
  if (gs != LD_GRAD_NONE) ld_side_specs(sdt, gs, sm90, specs, n);
  if (gt != LD_GRAD_NONE) ld_side_specs(tdt, gt, sm90, specs, n);
}

/* Appends the specs of `add` that the list does not hold yet. */
static void ld_add_specs(rlk_kernel_spec *specs, size_t *n, const rlk_kernel_spec *add, size_t m) {
  for (size_t j = 0; j < m; j++) {
    size_t i = 0;
    while (i < *n && memcmp(&specs[i], &add[j], sizeof add[j])) i++;
    if (i == *n) specs[(*n)++] = add[j];
  }
}

/* A configuration's kernels in launch order; sm90: the sm_90a ones where the configuration has
 * them (ld_sm90_line), in the clusters that a call of row_blocks runs, or for row_blocks 0 (a
 * line's, which may serve any call) in each cluster a call may run. */
static rlk_status ld_kernels(const rlk_context *ctx, const rlk_op_values *s, int sm90, int64_t row_blocks,
                             rlk_kernel_spec *specs, size_t *nspecs) {
  const int64_t *v = s->v;
  const int pass = (int)v[LD_S_PASS], sdt = ld_code(v[LD_S_STUDENT]), tdt = ld_code(v[LD_S_TEACHER]);
  const int lab = (int)v[LD_S_LABELS], topk = (int)v[LD_S_TOPK], kmode = topk ? LD_TOPK : (int)v[LD_S_MODE];
  const int host = ctx->kind == RLK_BACKEND_HOST;
  size_t n = 0;
  if (topk && v[LD_S_MODE] != LD_FKL)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "topk: the teacher's top-k approximation is a forward KL");
  if ((v[LD_S_SHARD] || pass == LD_PASS_COMBINE) && (topk || v[LD_S_MODE] == LD_JSD))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "shard, combine: the vocab-parallel form takes forward-kl or reverse-kl");
  sm90 = sm90 && ld_sm90_line(ctx, s);
  if (pass == LD_PASS_COMBINE) {
    const rlk_kernel_spec c = {host ? &ld_combine_host_tmpl : &ld_combine_tmpl, {lab, kmode}};
    specs[n++] = c;
  }
  if (pass == LD_PASS_FWD || pass == LD_PASS_BOTH) {
    if (host) {
      const rlk_kernel_spec f = {&ld_fwd_host_tmpl, {sdt, tdt, lab, kmode}};
      specs[n++] = f;
    } else {
      ld_fwd_specs(sdt, tdt, lab, kmode,
                   sm90 ? rlk_ld_sm90_fwd_cluster(&ctx->target, row_blocks ? row_blocks : RLK_LD_SM90_CLUSTER_ROWS, kmode == LD_TOPK) : 0,
                   specs, &n);
      if (sm90 && !row_blocks) { /* a line's: every cluster a device may choose, each kernel once */
        rlk_kernel_spec more[8];
        size_t m = 0;
        ld_fwd_specs(sdt, tdt, lab, kmode, 1, more, &m);
        if (kmode != LD_TOPK) ld_fwd_specs(sdt, tdt, lab, kmode, 2, more, &m);
        ld_add_specs(specs, &n, more, m);
      }
    }
  }
  if (pass == LD_PASS_BWD || pass == LD_PASS_BOTH) {
    const int gs = (int)v[LD_S_GRAD], gt = (int)v[LD_S_TEACHER_GRAD];
    if (gs == LD_GRAD_NONE && gt == LD_GRAD_NONE)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad, teacher_grad: both none, the backward would write nothing");
    if (host) {
      const rlk_kernel_spec b = {&ld_bwd_host_tmpl, {sdt, tdt, lab, kmode}};
      specs[n++] = b;
    } else {
      ld_bwd_specs(sdt, tdt, lab, kmode, gs, gt, sm90 ? ld_dz_cluster(row_blocks ? row_blocks : 2) : 0, specs, &n);
      if (sm90 && !row_blocks) ld_bwd_specs(sdt, tdt, lab, kmode, gs, gt, 1, specs, &n);
    }
  }
  for (size_t i = 0; i < n; i++) {
    rlk_status st = rlk_spec_validate(&specs[i]);
    if (st) return st;
  }
  /* each kernel once (a side's products are the other's when the heads share a dtype) */
  *nspecs = 0;
  ld_add_specs(specs, nspecs, specs, n);
  return RLK_OK;
}

/* A line's kernels: the sm_90a ones where it has them, and then the portable ones that a call whose
 * heads no tensor map describes runs. */
static rlk_status ld_plan(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs, size_t *nspecs) {
  rlk_status st = ld_kernels(ctx, s, 1, 0, specs, nspecs);
  if (st || !ld_sm90_line(ctx, s)) return st;
  rlk_kernel_spec portable[RLK_OP_MAX_KERNELS];
  size_t m = 0;
  if ((st = ld_kernels(ctx, s, 0, 0, portable, &m))) return st;
  ld_add_specs(specs, nspecs, portable, m);
  return RLK_OK;
}

static const char *const ld_samples[] = {
    "linear_divergence student=bf16 teacher=bf16 mode=forward-kl",
    "linear_divergence student=f16 teacher=bf16 labels=i64 mode=reverse-kl grad=same teacher_grad=f32",
    "linear_divergence student=bf16 teacher=f16 labels=i32 mode=jsd grad=f32 teacher_grad=same",
    "linear_divergence student=bf16 teacher=bf16 labels=i64 mode=forward-kl topk=1 grad=same",
    "linear_divergence pass=bwd student=f16 teacher=f16 mode=jsd grad=none teacher_grad=f32",
    "linear_divergence pass=fwd student=bf16 teacher=bf16 labels=i64 mode=reverse-kl shard=1",
    "linear_divergence pass=combine labels=i64 mode=forward-kl",
    "linear_divergence pass=combine mode=reverse-kl",
    NULL};

const rlk_op_desc rlk_op_linear_divergence = {
    .name = "linear_divergence",
    .settings = ld_settings,
    .nsettings = LD_NSETTINGS,
    .note = "The loss's kernels are policy_loss's: a line mode=reinforce with entropy=bonus and the call's layout.",
    .plan = ld_plan,
    .samples = ld_samples,
};

/* ---------------------------------------------------------------------------------- */
/* Argument checks                                                                     */
/* ---------------------------------------------------------------------------------- */

/* A [rows, cols] matrix of one of `dtypes` with contiguous rows; rows / cols < 0: any. Writes the
 * shape and the row stride. */
static rlk_status ld_check_matrix(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t rows, int64_t cols,
                                  int64_t *r, int64_t *c, int64_t *stride) {
  rlk_status st;
  if ((st = rlk_check_tensor_of(t, what, dtypes, 2, 2))) return st;
  const int64_t n = t->shape[0], h = t->shape[1];
  if (n < 1 || h < 1 || n > INT32_MAX || h > INT32_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld] is empty or too large", what, (long long)n,
                     (long long)h);
  if ((st = rlk_check_rows(t, what, rows < 0 ? n : rows, cols < 0 ? h : cols))) return st;
  *r = n, *c = h;
  *stride = n > 1 ? t->strides[0] : h;
  return RLK_OK;
}

/* The two heads of a call: [N, H] hidden and [V, H] weight each, a head's two in one dtype. */
typedef struct ld_heads {
  const rlk_tensor *t[4]; /* the call's student_hidden, student_weight, teacher_hidden, teacher_weight */
  int64_t N, V, Hs, Ht, shs, sws, ths, tws, ls;
  int sdt, tdt, lab; /* codes */
} ld_heads;

static rlk_status ld_check_heads(const rlk_tensor *sh, const rlk_tensor *sw, const rlk_tensor *th, const rlk_tensor *tw,
                                 const rlk_tensor *labels, float Ts, float Tt, ld_heads *h) {
  memset(h, 0, sizeof *h);
  rlk_status st;
  int64_t n, v, c;
  if ((st = ld_check_matrix(sh, "student_hidden", LD_HEAD_DTYPES, -1, -1, &h->N, &h->Hs, &h->shs)) ||
      (st = ld_check_matrix(sw, "student_weight", RLK_DTYPE_BIT(sh->dtype), -1, h->Hs, &h->V, &c, &h->sws)) ||
      (st = ld_check_matrix(th, "teacher_hidden", LD_HEAD_DTYPES, h->N, -1, &n, &h->Ht, &h->ths)) ||
      (st = ld_check_matrix(tw, "teacher_weight", RLK_DTYPE_BIT(th->dtype), h->V, h->Ht, &v, &c, &h->tws)))
    return st;
  if (labels->data && (st = rlk_check_vector(labels, "labels", LD_LABEL_DTYPES, h->N, 0, &h->ls))) return st;
  if ((st = rlk_check_temperature(Ts, "student_temperature", 0)) || (st = rlk_check_temperature(Tt, "teacher_temperature", 0)))
    return st;
  h->t[0] = sh, h->t[1] = sw, h->t[2] = th, h->t[3] = tw;
  h->sdt = ld_code(sh->dtype);
  h->tdt = ld_code(th->dtype);
  h->lab = !labels->data ? LD_LAB_NONE : labels->dtype == RLK_I32 ? LD_LAB_I32 : LD_LAB_I64;
  return RLK_OK;
}

/* The divergence's settings: mode, beta, top_k (vocab_start: where the weights' rows start). */
static rlk_status ld_check_mode(rlk_divergence_mode mode, double beta, int top_k, int64_t V, int64_t vocab_start) {
  rlk_status st =
      rlk_check_enum((int)mode, "mode", RLK_DIVERGENCE_FORWARD_KL, RLK_DIVERGENCE_JSD, "rlk_divergence_mode");
  if (st) return st;
  if (mode == RLK_DIVERGENCE_JSD && !(beta > 0.0 && beta < 1.0))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "beta: %g is not in (0, 1) (JSD's mixture weight; its ends are the KLs)",
                     beta);
  if (top_k < 0 || top_k > RLK_LINEAR_DIVERGENCE_TOP_K_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "top_k: %d is not 0 or 1 to %d", top_k, RLK_LINEAR_DIVERGENCE_TOP_K_MAX);
  if (top_k && mode != RLK_DIVERGENCE_FORWARD_KL)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "top_k: the teacher's top-k approximation is a forward KL");
  if (top_k > V) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "top_k: %d exceeds V = %lld", top_k, (long long)V);
  if (top_k && V + vocab_start > LD_INDEX_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "top_k: columns up to %lld do not fit the stats' f32 (2^24 at most)",
                     (long long)(V + vocab_start));
  return RLK_OK;
}

/* The settings of a forward or backward line that its heads, labels and divergence fix: the table's
 * first ones, pass to topk. */
static void ld_line_heads(rlk_op_values *v, int pass, rlk_dtype student, rlk_dtype teacher, int labels,
                          rlk_divergence_mode mode, int top_k) {
  const int64_t x[LD_S_TOPK + 1] = {[LD_S_PASS] = pass,     [LD_S_STUDENT] = student, [LD_S_TEACHER] = teacher,
                                    [LD_S_LABELS] = labels, [LD_S_MODE] = mode,       [LD_S_TOPK] = top_k > 0};
  for (int i = 0; i <= LD_S_TOPK; i++) rlk_op_values_set(v, i, x[i]);
}

/* The heads' fields every kernel argument that reads them starts with (RLK_LD_HEADS), from the
 * call's arguments `a` and their checked layout `h`. */
#define LD_SET_HEADS(x, a, h)                                                                   \
  do {                                                                                          \
    (x).s_hidden = (a)->student_hidden.data, (x).s_h_stride = (h)->shs;                         \
    (x).s_weight = (a)->student_weight.data, (x).s_w_stride = (h)->sws;                         \
    (x).t_hidden = (a)->teacher_hidden.data, (x).t_h_stride = (h)->ths;                         \
    (x).t_weight = (a)->teacher_weight.data, (x).t_w_stride = (h)->tws;                         \
    (x).s_temperature = (a)->student_temperature, (x).t_temperature = (a)->teacher_temperature; \
  } while (0)

static size_t ld_align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

/* The host kernels' fp64 scratch in the workspace: the sum of n products a[i] b[i] doubles, as
 * bytes into *bytes (heads of stride 0 describe any N, H and V: RLK_ERR_INVALID_ARGUMENT where the
 * size overflows). */
static rlk_status ld_host_scratch(const char *what, const int64_t *a, const int64_t *b, int n, size_t *bytes) {
  int64_t sum = 0, x;
  for (int i = 0; i < n; i++)
    if (__builtin_mul_overflow(a[i], b[i], &x) || __builtin_add_overflow(sum, x, &sum)) goto big;
  if (__builtin_mul_overflow(sum, (int64_t)sizeof(double), &x) || (uint64_t)x > SIZE_MAX / 2) goto big;
  *bytes = ld_align256((size_t)x);
  return RLK_OK;
big:
  return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: the host path's fp64 sums outgrow a size (N, H and V too large)", what);
}

/* A 128-byte-swizzled tensor map request over a [rows, cols] matrix, in boxes of box_rows rows by
 * 128 bytes (64 16-bit or 32 f32 columns). */
static rlk_tma_desc_request ld_tma(const void *base, rlk_dtype dt, int64_t rows, int64_t cols, int64_t stride,
                                   uint32_t box_rows) {
  rlk_tma_desc_request r;
  memset(&r, 0, sizeof r);
  r.base = base, r.dtype = dt, r.rows = (uint64_t)rows, r.cols = (uint64_t)cols, r.row_stride = (uint64_t)stride;
  r.box_rows = box_rows, r.box_cols = dt == RLK_F32 ? 32 : 64, r.swizzle = 128;
  return r;
}

/* Whether a tensor map can describe a request (else the caller takes its other path). */
static int ld_tma_ok(const rlk_tma_desc_request *r) {
  if (rlk_tma_check(r) == RLK_OK) return 1;
  rlk_error_clear();
  return 0;
}

/* Whether tensor maps describe both heads in the boxes the sm_90a kernels read: 128 rows (the
 * logits' operands), 64 (the backward's products) and a cluster's part of a W box (32 or 64: the
 * same conditions of alignment). */
static int ld_heads_tma_ok(const ld_heads *h) {
  const rlk_tensor *const *t = h->t;
  const int64_t rows[4] = {h->N, h->V, h->N, h->V}, cols[4] = {h->Hs, h->Hs, h->Ht, h->Ht};
  const int64_t strides[4] = {h->shs, h->sws, h->ths, h->tws};
  static const char *const names[4] = {"student_hidden", "student_weight", "teacher_hidden", "teacher_weight"};
  for (int i = 0; i < 4; i++)
    for (uint32_t box = LD_SM90_BN / LD_SM90_FWD_CLUSTER_MAX; box <= LD_SM90_BM; box *= 2) {
      const rlk_tma_desc_request r = ld_tma(t[i]->data, t[i]->dtype, rows[i], cols[i], strides[i], box);
      if (rlk_tma_check(&r) != RLK_OK) {
        rlk_debug("linear_divergence: no tensor map for %s (%s); the portable kernels run", names[i],
                  rlk_last_error());
        rlk_error_clear();
        return 0;
      }
    }
  return 1;
}

/* The encoded maps of both heads (the sm_90a logits' operands), into a kernel struct's map_hs,
 * map_ws, map_ht, map_wt: the hidden states in 128-row boxes, the weights in boxes of w_rows (the
 * whole B box, or a cluster's part of it). */
static rlk_status ld_head_maps(rlk_context *ctx, const ld_heads *h, uint32_t w_rows, rlk_tensor_map *const maps[4]) {
  const rlk_tensor *sh = h->t[0], *sw = h->t[1], *th = h->t[2], *tw = h->t[3];
  const rlk_tma_desc_request r[4] = {ld_tma(sh->data, sh->dtype, h->N, h->Hs, h->shs, LD_SM90_BM),
                                     ld_tma(sw->data, sw->dtype, h->V, h->Hs, h->sws, w_rows),
                                     ld_tma(th->data, th->dtype, h->N, h->Ht, h->ths, LD_SM90_BM),
                                     ld_tma(tw->data, tw->dtype, h->V, h->Ht, h->tws, w_rows)};
  rlk_status st = RLK_OK;
  for (int i = 0; i < 4 && !st; i++) st = rlk_context_tensor_map(ctx, &r[i], maps[i]);
  return st;
}

/* ---------------------------------------------------------------------------------- */
/* The forward                                                                         */
/* ---------------------------------------------------------------------------------- */

/* The divergence's defaults, alike in the forward's and the backward's arguments. */
#define LD_INIT_SETTINGS(args)                                     \
  do {                                                             \
    memset((args), 0, sizeof *(args));                             \
    (args)->student_temperature = (args)->teacher_temperature = 1.0f; \
    (args)->mode = RLK_DIVERGENCE_FORWARD_KL;                      \
    (args)->beta = 0.5;                                            \
    (args)->ignore_index = -100;                                   \
  } while (0)

RLK_API void rlk_linear_divergence_args_init(rlk_linear_divergence_args *args) {
  if (!args) return;
  LD_INIT_SETTINGS(args);
  args->agg = RLK_AGG_TOKEN_MEAN;
  args->loss_scale = 1.0;
  args->variant = RLK_LINEAR_LOGPROB_AUTO;
}

/* A forward call: its configuration, kernels, cut and workspace. */
typedef struct ld_fwd_call {
  rlk_op_call op; /* the driver's: configuration, kernels, workspace bytes */
  ld_heads h;
  int kmode, shard, loss;
  int sm90;    /* the wgmma GEMMs run */
  int cluster; /* sm90: their clusters' row blocks (rlk_ld_sm90_fwd_cluster); else 1 */
  int64_t splits, cols_per_split, row_blocks, tiles_m; /* tiles_m: the launch's row blocks (whole clusters) */
  /* workspace offsets: split records, top-k lists, the loss's zeros and scratch, rlk_policy_loss's */
  size_t off_lists, off_zeros, off_glp, off_gent, off_pl;
} ld_fwd_call;

/* The loss: rlk_policy_loss with D as its entropy term (entropy_coef -1: loss += agg(D),
 * grad_entropy = d loss / d D) beside a REINFORCE term of zero advantages, which adds 0 to the
 * loss and the gradient. Every aggregation, normalizer form and layout of rlk_loss_agg comes with
 * it. The tokens: [B, T] by a 2-D mask, packed [N] with seq_offsets, else one row of N. */
static void ld_loss_args(const rlk_linear_divergence_args *a, const ld_fwd_call *k, char *ws, rlk_policy_loss_args *pl) {
  rlk_policy_loss_args_init(pl);
  const int64_t N = k->h.N;
  int64_t B = 1, T = N;
  if (!a->seq_offsets.data && a->mask.data && a->mask.ndim == 2) B = a->mask.shape[0], T = a->mask.shape[1];
  const int packed = a->seq_offsets.data != NULL;
#define LD_VIEW(p) (packed ? rlk_tensor_1d((p), RLK_F32, N) : rlk_tensor_2d((p), RLK_F32, B, T, T))
  pl->logp = pl->old_logp = pl->entropy = LD_VIEW(a->divergence.data);
  pl->advantages = LD_VIEW(ws + k->off_zeros);
  pl->grad_logp = LD_VIEW(ws + k->off_glp);
  pl->grad_entropy = LD_VIEW(a->grad_divergence.data ? a->grad_divergence.data : ws + k->off_gent);
#undef LD_VIEW
  pl->mask = a->mask;
  if (!packed && a->mask.data && a->mask.ndim == 1) pl->mask = rlk_tensor_2d(a->mask.data, a->mask.dtype, 1, N, N);
  pl->seq_offsets = a->seq_offsets;
  pl->mode = RLK_POLICY_REINFORCE;
  pl->entropy_coef = -1.0;
  pl->agg = a->agg;
  pl->token_normalizer = a->token_normalizer;
  pl->seq_normalizer = a->seq_normalizer;
  pl->norm_scale = a->norm_scale;
  pl->loss_scale = a->loss_scale;
  pl->token_normalizer_tensor = a->token_normalizer_tensor;
  pl->seq_normalizer_tensor = a->seq_normalizer_tensor;
  pl->loss = a->loss;
  pl->workspace = ws + k->off_pl;
  pl->workspace_bytes = a->workspace_bytes > k->off_pl ? a->workspace_bytes - k->off_pl : 0;
}

/* Where a size query without a workspace places the loss's pieces: an address that is never
 * dereferenced (rlk_policy_loss_workspace_size reads no data). */
#define LD_NO_WORKSPACE ((char *)(uintptr_t)4096)

/* A failure of the loss's rlk_policy_loss, said as this call's. */
static rlk_status ld_loss_error(rlk_status st) {
  char msg[512];
  rlk_format(msg, sizeof msg, "%s", rlk_last_error());
  return rlk_error(st, "the loss (rlk_policy_loss of the divergence as its entropy term): %s", msg);
}

static rlk_status ld_fwd_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_linear_divergence_args *a = args;
  ld_fwd_call *k = (ld_fwd_call *)call;
  rlk_status st;
  ld_heads *h = &k->h;
  if ((st = ld_check_heads(&a->student_hidden, &a->student_weight, &a->teacher_hidden, &a->teacher_weight, &a->labels,
                           a->student_temperature, a->teacher_temperature, h)))
    return st;
  if ((st = ld_check_mode(a->mode, a->beta, a->top_k, h->V, a->vocab_start))) return st;
  if ((st = rlk_ll_check_variant((int)a->variant))) return st;
  if (a->splits < 0 || a->splits > 65535)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "splits: %d is not 0 (chosen) or 1 to 65535", a->splits);
  k->kmode = a->top_k ? LD_TOPK : (int)a->mode;
  k->shard = a->partials.data != NULL;
  k->loss = a->loss.data != NULL;
  const int64_t N = h->N;
  if (k->shard) {
    if (a->mode == RLK_DIVERGENCE_JSD || a->top_k)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "partials: the shard form takes the forward or reverse KL");
    if (a->divergence.data || a->stats.data || a->entropy.data || k->loss)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "divergence, stats, entropy, loss: absent in the shard form (partials is given)");
    int64_t r, c, s;
    if ((st = ld_check_matrix(&a->partials, "partials", LD_F32, N, LD_RECORD, &r, &c, &s)) ||
        (st = rlk_check_contiguous(&a->partials, "partials")))
      return st;
    if ((uintptr_t)a->partials.data % 16) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "partials: not 16-byte aligned");
    if ((st = rlk_check_vocab_start(a->vocab_start))) return st;
  } else {
    if (a->vocab_start != 0)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "vocab_start: only in the shard form (with partials)");
    int64_t r, c, s;
    if ((st = rlk_check_vector(&a->divergence, "divergence", LD_F32, N, 1, NULL)) ||
        (st = ld_check_matrix(&a->stats, "stats", LD_F32, N, LD_STATS, &r, &c, &s)) ||
        (st = rlk_check_contiguous(&a->stats, "stats")) ||
        (a->entropy.data && (st = rlk_check_vector(&a->entropy, "entropy", LD_F32, N, 1, NULL))))
      return st;
  }
  if (!k->loss && (a->grad_divergence.data || a->mask.data || a->seq_offsets.data || a->token_normalizer_tensor.data ||
                   a->seq_normalizer_tensor.data))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad_divergence, mask, seq_offsets, normalizer tensors: the loss's, "
                                               "given without loss");
  if (a->grad_divergence.data && (st = rlk_check_vector(&a->grad_divergence, "grad_divergence", LD_F32, N, 1, NULL)))
    return st;
  /* the loss's tokens are the rows: a [B, T] mask with B T = N, or [N] (contiguous: the loss reads
   * it as one row of N) */
  if (a->mask.data) {
    if ((st = rlk_check_tensor(&a->mask, "mask", 1)) || (st = rlk_check_ndim(&a->mask, "mask", 1, 2))) return st;
    int64_t tokens = a->mask.shape[0];
    if (a->mask.ndim == 2 && __builtin_mul_overflow(a->mask.shape[0], a->mask.shape[1], &tokens)) tokens = -1;
    if (tokens != N && a->mask.ndim == 2)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "mask: [%lld, %lld]; the loss's tokens are the N = %lld rows",
                       (long long)a->mask.shape[0], (long long)a->mask.shape[1], (long long)N);
    if (tokens != N)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "mask: [%lld]; the loss's tokens are the N = %lld rows",
                       (long long)a->mask.shape[0], (long long)N);
    if (a->mask.ndim == 1 && !a->seq_offsets.data && (st = rlk_check_contiguous(&a->mask, "mask"))) return st;
  }

  /* the configuration, and its kernels */
  rlk_op_values *v = &call->vals;
  ld_line_heads(v, LD_PASS_FWD, a->student_hidden.dtype, a->teacher_hidden.dtype, h->lab, a->mode, a->top_k);
  rlk_op_values_set(v, LD_S_SHARD, k->shard);
  if (a->variant != RLK_LINEAR_LOGPROB_AUTO) rlk_op_values_set(v, LD_S_VARIANT, a->variant);
  /* sm_90a: the wgmma GEMMs where tensor maps describe the heads */
  k->sm90 = ld_sm90_line(ctx, v) && ld_heads_tma_ok(h);
  if (a->variant == RLK_LINEAR_LOGPROB_WGMMA && !k->sm90 && ctx->kind != RLK_BACKEND_HOST)
    rlk_debug("linear_divergence: the wgmma kernels do not run here (%s); the portable ones do",
              !ld_wgmma_target(ctx) ? "needs sm_90a" : "no tensor map");
  /* the row blocks: of 64 rows (sm_90a: 128, one block a multiprocessor, in whole clusters of them) */
  const int64_t bm = k->sm90 ? LD_SM90_BM : LD_TILE;
  k->row_blocks = (N + bm - 1) / bm;
  k->cluster = k->sm90 ? rlk_ld_sm90_fwd_cluster(&ctx->target, k->row_blocks, k->kmode == LD_TOPK) : 1;
  k->tiles_m = (k->row_blocks + k->cluster - 1) / k->cluster * k->cluster;
  if ((st = ld_kernels(ctx, v, k->sm90, k->row_blocks, call->specs, &call->nspecs))) return st;

  /* the cut: the row blocks x vocabulary splits (top-k: at most LD_TOPK_CANDS / k, the candidates
   * the set's block ranks) */
  size_t off = 0;
  if (ctx->kind != RLK_BACKEND_HOST) {
    const int64_t sms = ctx->target.multiprocessors > 0 ? ctx->target.multiprocessors : 1;
    const int64_t most = a->top_k ? LD_TOPK_CANDS / a->top_k : INT32_MAX;
    const int asked = a->splits > most ? (int)most : a->splits;
    rlk_ll_fwd_splits(h->V, k->tiles_m, k->sm90 ? sms : 4 * sms, asked, &k->splits, &k->cols_per_split);
    if (k->splits > most)
      rlk_ll_fwd_splits(h->V, k->tiles_m, k->sm90 ? sms : 4 * sms, (int)most, &k->splits, &k->cols_per_split);
    if (k->tiles_m > INT32_MAX || k->splits > 65535 || (k->sm90 && k->tiles_m * k->splits > INT32_MAX))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "student_hidden: N = %lld rows is too many", (long long)N);
    off = ld_align256((size_t)(k->splits * N) * LD_RECORD * 4u);
    k->off_lists = off;
    if (a->top_k) off += ld_align256((size_t)(k->splits * N * a->top_k) * 8u);
  } else { /* the host: a row's two heads' logits */
    const int64_t two = 2;
    if ((st = ld_host_scratch("rlk_linear_divergence", &two, &h->V, 1, &off))) return st;
  }
  if (k->loss) {
    k->off_zeros = off;
    off += ld_align256((size_t)N * 4u);
    k->off_glp = off;
    off += ld_align256((size_t)N * 4u);
    if (!a->grad_divergence.data) {
      k->off_gent = off;
      off += ld_align256((size_t)N * 4u);
    }
    k->off_pl = off;
    rlk_policy_loss_args pl;
    ld_loss_args(a, k, a->workspace ? (char *)a->workspace : LD_NO_WORKSPACE, &pl);
    size_t pl_bytes = 0;
    if ((st = rlk_policy_loss_workspace_size((rlk_context *)ctx, &pl, &pl_bytes))) return ld_loss_error(st);
    off += pl_bytes;
  }
  call->workspace = off;
  return RLK_OK;
}

static const rlk_arg_field ld_fwd_fields[] = {
    RLK_ARG_IN(rlk_linear_divergence_args, student_hidden),
    RLK_ARG_IN(rlk_linear_divergence_args, student_weight),
    RLK_ARG_IN(rlk_linear_divergence_args, teacher_hidden),
    RLK_ARG_IN(rlk_linear_divergence_args, teacher_weight),
    RLK_ARG_IN(rlk_linear_divergence_args, labels),
    RLK_ARG_IN(rlk_linear_divergence_args, mask),
    RLK_ARG_IN(rlk_linear_divergence_args, seq_offsets),
    RLK_ARG_IN(rlk_linear_divergence_args, token_normalizer_tensor),
    RLK_ARG_IN(rlk_linear_divergence_args, seq_normalizer_tensor),
    RLK_ARG_OUT(rlk_linear_divergence_args, divergence),
    RLK_ARG_OUT(rlk_linear_divergence_args, stats),
    RLK_ARG_OUT(rlk_linear_divergence_args, entropy),
    RLK_ARG_OUT(rlk_linear_divergence_args, loss),
    RLK_ARG_OUT(rlk_linear_divergence_args, grad_divergence),
    RLK_ARG_OUT(rlk_linear_divergence_args, partials)};

/* The GPU forward's launches: the GEMM over (row blocks, splits), the combine, and JSD's second
 * pass or top-k's set. The sm_90a GEMM is one launch of row_blocks x splits blocks (the kernel
 * maps a block to its row block and split), its tensor maps in its struct after the tiled
 * kernel's fields. */
static rlk_status ld_fwd_gpu(rlk_context *ctx, const rlk_linear_divergence_args *a, const ld_fwd_call *k, void *stream) {
  const ld_heads *h = &k->h;
  char *ws = (char *)a->workspace;
  rlk_status st;
  ld_fwd_sm90_args g = {0};
  LD_SET_HEADS(g, a, h);
  g.N = h->N, g.V = h->V, g.Hs = h->Hs, g.Ht = h->Ht;
  g.cols_per_split = k->cols_per_split, g.partials = ws, g.lists = ws + k->off_lists, g.top_k = a->top_k;
  g.stats = (const float *)a->stats.data, g.vocab_start = a->vocab_start, g.beta = a->beta;
  g.tiles_m = (int)k->tiles_m, g.tiles_n = (int)k->splits, g.group = LD_GROUP;
  rlk_tensor_map *const maps[4] = {&g.map_hs, &g.map_ws, &g.map_ht, &g.map_wt};
  if (k->sm90 && (st = ld_head_maps(ctx, h, (uint32_t)(LD_SM90_BN / k->cluster), maps))) return st;
  rlk_launch_dims dg = k->sm90 ? rlk_op_grid((uint64_t)(k->tiles_m * k->splits), 1, 1, LD_SM90_THREADS, 0)
                               : rlk_op_grid((uint64_t)k->row_blocks, (uint64_t)k->splits, 1, LD_THREADS, 0);
  /* top-k: each row's list past the ring */
  if (k->sm90) dg.shared_bytes = LD_SM90_FWD_SMEM + (k->kmode == LD_TOPK ? (size_t)LD_SM90_BM * a->top_k * 8u : 0u);
  if (k->sm90) dg.cluster = (unsigned)k->cluster; /* launched as clusters: a kernel alone is a plain launch */
  /* the tiled kernel's arguments are the first fields of the sm_90a kernel's */
  if ((st = rlk_context_launch_params(ctx, &k->op.specs[0], &dg, stream, &g))) return st;
  ld_combine_args c = {0};
  c.records = ws, c.S = k->splits, c.N = h->N, c.labels = a->labels.data, c.label_stride = h->ls;
  c.ignore_index = a->ignore_index, c.divergence = (float *)a->divergence.data, c.stats = (float *)a->stats.data;
  c.entropy = (float *)a->entropy.data, c.zeros = k->loss ? (float *)(ws + k->off_zeros) : NULL;
  c.merged = (float *)a->partials.data;
  const rlk_launch_dims dr = rlk_op_grid((uint64_t)((h->N + LD_THREADS - 1) / LD_THREADS), 1, 1, LD_THREADS, 0);
  if ((st = rlk_context_launch_params(ctx, &k->op.specs[1], &dr, stream, &c))) return st;
  if (k->kmode == LD_JSD) {
    /* the second pass over the vocabulary, the lse's in stats; its sums where the records were */
    if ((st = rlk_context_launch_params(ctx, &k->op.specs[2], &dg, stream, &g))) return st;
    ld_jsd_combine_args j = {0};
    j.records = ws, j.S = k->splits, j.N = h->N, j.labels = a->labels.data, j.label_stride = h->ls;
    j.ignore_index = a->ignore_index, j.divergence = c.divergence, j.stats = c.stats, j.beta = a->beta;
    return rlk_context_launch_params(ctx, &k->op.specs[3], &dr, stream, &j);
  }
  if (k->kmode == LD_TOPK) {
    ld_topk_args t = {0};
    t.lists = ws + k->off_lists, t.S = k->splits, t.N = h->N, t.top_k = a->top_k;
    t.s_hidden = a->student_hidden.data, t.s_h_stride = h->shs, t.s_weight = a->student_weight.data;
    t.s_w_stride = h->sws, t.Hs = h->Hs, t.labels = a->labels.data, t.label_stride = h->ls;
    t.ignore_index = a->ignore_index, t.divergence = c.divergence, t.stats = c.stats;
    t.s_temperature = a->student_temperature, t.t_temperature = a->teacher_temperature, t.scaled = k->sm90;
    const rlk_launch_dims dt = rlk_op_grid((uint64_t)h->N, 1, 1, LD_THREADS, 0);
    return rlk_context_launch_params(ctx, &k->op.specs[2], &dt, stream, &t);
  }
  return RLK_OK;
}

/* The call's launches (after the driver's checks): the host's one kernel or the GPU's, then the
 * loss's rlk_policy_loss. */
static rlk_status ld_fwd_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  const rlk_linear_divergence_args *a = args;
  const ld_fwd_call *k = (const ld_fwd_call *)call;
  rlk_status st;
  if (ctx->kind == RLK_BACKEND_HOST) {
    const ld_heads *h = &k->h;
    ld_fwd_host_args f = {0};
    LD_SET_HEADS(f, a, h);
    f.labels = a->labels.data, f.label_stride = h->ls;
    f.N = h->N, f.V = h->V, f.Hs = h->Hs, f.Ht = h->Ht, f.ignore_index = a->ignore_index;
    f.divergence = (float *)a->divergence.data, f.stats = (float *)a->stats.data, f.entropy = (float *)a->entropy.data;
    f.zeros = k->loss ? (float *)((char *)a->workspace + k->off_zeros) : NULL;
    f.records = (float *)a->partials.data, f.vocab_start = a->vocab_start, f.top_k = a->top_k, f.beta = a->beta;
    f.scratch = (double *)a->workspace; /* the workspace's first part on the host */
    const rlk_launch_dims d = rlk_op_grid(1, 1, 1, 1, 0);
    st = rlk_context_launch_params(ctx, &k->op.specs[0], &d, stream, &f);
  } else {
    st = ld_fwd_gpu(ctx, a, k, stream);
  }
  if (st || !k->loss) return st;
  rlk_policy_loss_args pl;
  ld_loss_args(a, k, (char *)a->workspace, &pl);
  if ((st = rlk_policy_loss(ctx, &pl, stream))) return ld_loss_error(st);
  return RLK_OK;
}

static const rlk_op_entry ld_fwd_entry = {
    .name = "rlk_linear_divergence", .op = &rlk_op_linear_divergence, .call_size = sizeof(ld_fwd_call),
    RLK_OP_FIELDS(ld_fwd_fields), .workspace = RLK_OP_WORKSPACE(rlk_linear_divergence_args, 16),
    .validate = ld_fwd_validate, .launch = ld_fwd_launch};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_linear_divergence, rlk_linear_divergence_args, ld_fwd_entry)

/* ---------------------------------------------------------------------------------- */
/* The backward                                                                        */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_linear_divergence_backward_args_init(rlk_linear_divergence_backward_args *args) {
  if (!args) return;
  LD_INIT_SETTINGS(args);
}

/* One side's gradients: their codes (-1 absent), strides, and the f32 sum of grad_hidden (itself
 * when f32, else the workspace's at dh_off). */
typedef struct ld_side {
  int gh, gw;
  int64_t ghs, gws;
  size_t dh_off, dz_off;
} ld_side;

typedef struct ld_bwd_call {
  rlk_op_call op;        /* the driver's: the first configuration (f32 gradients where they mix), the
                          * kernels of both, workspace bytes */
  rlk_op_values second;  /* the heads' dtype's configuration where a side mixes (nvals 2) */
  int nvals;
  ld_heads h;
  int kmode;
  int sm90;       /* the wgmma kernels run */
  int dz_cluster; /* sm90: dz's clusters' row blocks (ld_dz_cluster) */
  int64_t stats_stride, g_stride, chunk;
  ld_side s, t;
} ld_bwd_call;

/* The line code of a side's gradients (LD_GRAD_*): none, f32 or its head's dtype; -1 when its
 * hidden and weight gradients differ (two lines). */
static int ld_grad_line(const ld_side *x) {
  const int h = x->gh, w = x->gw;
  if (h < 0 && w < 0) return LD_GRAD_NONE;
  const int a = h >= 0 ? h : w, b = w >= 0 ? w : h;
  if ((a == 0) != (b == 0)) return -1;
  return a == 0 ? LD_GRAD_F32 : LD_GRAD_SAME;
}

static rlk_status ld_check_grad(const rlk_tensor *t, const char *what, rlk_dtype head, int64_t rows, int64_t cols,
                                int *code, int64_t *stride) {
  *code = -1;
  if (!t->data) return rlk_check_tensor(t, what, 0);
  int64_t r, c;
  rlk_status st = ld_check_matrix(t, what, LD_F32 | RLK_DTYPE_BIT(head), rows, cols, &r, &c, stride);
  if (st) return st;
  *code = rlk_op_float_dt(t->dtype);
  return RLK_OK;
}

static rlk_status ld_bwd_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_linear_divergence_backward_args *a = args;
  ld_bwd_call *k = (ld_bwd_call *)call;
  rlk_status st;
  ld_heads *h = &k->h;
  if ((st = ld_check_heads(&a->student_hidden, &a->student_weight, &a->teacher_hidden, &a->teacher_weight, &a->labels,
                           a->student_temperature, a->teacher_temperature, h)))
    return st;
  if ((st = ld_check_mode(a->mode, a->beta, a->top_k, h->V, a->vocab_start))) return st;
  int64_t r, c;
  if ((st = ld_check_matrix(&a->stats, "stats", LD_F32, h->N, LD_STATS, &r, &c, &k->stats_stride)) ||
      (st = rlk_check_vector(&a->grad_divergence, "grad_divergence", LD_F32, h->N, 0, &k->g_stride)))
    return st;
  if ((st = ld_check_grad(&a->grad_student_hidden, "grad_student_hidden", a->student_hidden.dtype, h->N, h->Hs,
                          &k->s.gh, &k->s.ghs)) ||
      (st = ld_check_grad(&a->grad_student_weight, "grad_student_weight", a->student_hidden.dtype, h->V, h->Hs,
                          &k->s.gw, &k->s.gws)) ||
      (st = ld_check_grad(&a->grad_teacher_hidden, "grad_teacher_hidden", a->teacher_hidden.dtype, h->N, h->Ht,
                          &k->t.gh, &k->t.ghs)) ||
      (st = ld_check_grad(&a->grad_teacher_weight, "grad_teacher_weight", a->teacher_hidden.dtype, h->V, h->Ht,
                          &k->t.gw, &k->t.gws)))
    return st;
  if (k->s.gh < 0 && k->s.gw < 0 && k->t.gh < 0 && k->t.gw < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "grad_student_hidden, grad_student_weight, grad_teacher_hidden, "
                                               "grad_teacher_weight: give at least one");
  if ((st = rlk_check_flag(a->accumulate, "accumulate"))) return st;
  if ((st = rlk_check_flag(a->shard, "shard"))) return st;
  if (!a->shard && a->vocab_start != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "vocab_start: %lld without shard 1", (long long)a->vocab_start);
  if (a->shard && (a->mode == RLK_DIVERGENCE_JSD || a->top_k))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "shard: the shard form takes the forward or reverse KL");
  if ((st = rlk_check_vocab_start(a->vocab_start))) return st;
  if (a->chunk < 0 || a->chunk % LD_TILE)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "chunk: %d is not 0 or a positive multiple of 64", a->chunk);
  k->kmode = a->top_k ? LD_TOPK : (int)a->mode;

  /* the configurations: one line, or two when a side's gradients mix f32 and 16 bits */
  const int ls = ld_grad_line(&k->s), lt = ld_grad_line(&k->t);
  k->nvals = ls < 0 || lt < 0 ? 2 : 1;
  for (int i = 0; i < k->nvals; i++) {
    rlk_op_values *v = i ? &k->second : &call->vals;
    if (i) rlk_op_values_init(&rlk_op_linear_divergence, v);
    ld_line_heads(v, LD_PASS_BWD, a->student_hidden.dtype, a->teacher_hidden.dtype, h->lab, a->mode, a->top_k);
    rlk_op_values_set(v, LD_S_GRAD, ls >= 0 ? ls : i ? LD_GRAD_SAME : LD_GRAD_F32);
    rlk_op_values_set(v, LD_S_TEACHER_GRAD, lt >= 0 ? lt : i ? LD_GRAD_SAME : LD_GRAD_F32);
  }
  /* sm_90a: the wgmma kernels where tensor maps describe the heads */
  k->sm90 = ld_sm90_line(ctx, &call->vals) && ld_heads_tma_ok(h);
  const int64_t row_blocks = (h->N + LD_SM90_BM - 1) / LD_SM90_BM;
  k->dz_cluster = k->sm90 ? ld_dz_cluster(row_blocks) : 1;
  /* the kernels: the lines', each kernel once */
  for (int i = 0; i < k->nvals; i++) {
    rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
    size_t n = 0;
    if ((st = ld_kernels(ctx, i ? &k->second : &call->vals, k->sm90, row_blocks, specs, &n))) return st;
    ld_add_specs(call->specs, &call->nspecs, specs, n);
  }
  if (ctx->kind == RLK_BACKEND_HOST) { /* the fp64 sums of the gradients asked for, and N */
    const int64_t rows[5] = {a->grad_student_hidden.data ? h->N : 0, a->grad_student_weight.data ? h->V : 0,
                             a->grad_teacher_hidden.data ? h->N : 0, a->grad_teacher_weight.data ? h->V : 0, h->N};
    const int64_t cols[5] = {h->Hs, h->Hs, h->Ht, h->Ht, 1};
    return ld_host_scratch("rlk_linear_divergence_backward", rows, cols, 5, &call->workspace);
  }

  /* GPU: the chunk, and the workspace: the 16-bit grad_hidden sums, then each side's dz (f32; on
   * sm_90a the head's 16-bit dtype, in chunks of whole 256-column tiles of its products) */
  const int student = k->s.gh >= 0 || k->s.gw >= 0, teacher = k->t.gh >= 0 || k->t.gw >= 0;
  const int64_t sides = student + teacher, tile = k->sm90 ? LD_CHUNK_SM90 : LD_TILE, dzs = k->sm90 ? 2 : 4;
  /* every size below is at most 16 N (H + V) bytes (heads of stride 0 describe any N, H and V) */
  int64_t most;
  if (__builtin_mul_overflow(h->N, (h->Hs > h->Ht ? h->Hs : h->Ht) + h->V, &most) || most > ((int64_t)1 << 58))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "linear_divergence_backward: N = %lld rows by H + V = %lld columns is beyond the workspace's sizes",
                     (long long)h->N, (long long)((h->Hs > h->Ht ? h->Hs : h->Ht) + h->V));
  size_t off = 0;
  if (k->s.gh > 0) k->s.dh_off = off, off += ld_align256((size_t)(h->N * h->Hs) * 4u);
  if (k->t.gh > 0) k->t.dh_off = off, off += ld_align256((size_t)(h->N * h->Ht) * 4u);
  /* dz within what the sums leave of the budget: the fewest chunks cut evenly, or on sm_90a the
   * width whose products fill whole waves of the multiprocessors (the fused head's model, over
   * the student's products when it has gradients, else the teacher's) */
  const ld_side *x = student ? &k->s : &k->t;
  rlk_ll_chunk_problem cp = {h->N, student ? h->Hs : h->Ht, h->V, x->gh >= 0, x->gw >= 0,
                             ctx->target.multiprocessors, 0};
  const int64_t chunk = rlk_ll_bwd_chunk(a->chunk, h->V, tile, LD_BWD_WORKSPACE_BYTES - (int64_t)off,
                                         dzs * sides * h->N, k->sm90 ? &cp : NULL);
  k->chunk = chunk;
  const size_t dz_bytes = ld_align256((size_t)(h->N * chunk * dzs));
  if (k->s.gh >= 0 || k->s.gw >= 0) k->s.dz_off = off, off += dz_bytes;
  if (k->t.gh >= 0 || k->t.gw >= 0) k->t.dz_off = off, off += dz_bytes;
  call->workspace = off;
  return RLK_OK;
}

/* The backward's per-row fields after the heads (RLK_LD_BWD_ROWS). */
#define LD_SET_BWD_ROWS(x, a, k)                                                                      \
  do {                                                                                                \
    (x).labels = (a)->labels.data, (x).label_stride = (k)->h.ls, (x).N = (k)->h.N, (x).V = (k)->h.V; \
    (x).Hs = (k)->h.Hs, (x).Ht = (k)->h.Ht, (x).ignore_index = (a)->ignore_index;                    \
    (x).stats = (const float *)(a)->stats.data, (x).stats_stride = (k)->stats_stride;                \
    (x).g = (const float *)(a)->grad_divergence.data, (x).g_stride = (k)->g_stride;                  \
  } while (0)

static const rlk_arg_field ld_bwd_fields[] = {
    RLK_ARG_IN(rlk_linear_divergence_backward_args, student_hidden),
    RLK_ARG_IN(rlk_linear_divergence_backward_args, student_weight),
    RLK_ARG_IN(rlk_linear_divergence_backward_args, teacher_hidden),
    RLK_ARG_IN(rlk_linear_divergence_backward_args, teacher_weight),
    RLK_ARG_IN(rlk_linear_divergence_backward_args, labels),
    RLK_ARG_IN(rlk_linear_divergence_backward_args, stats),
    RLK_ARG_IN(rlk_linear_divergence_backward_args, grad_divergence),
    RLK_ARG_OUT(rlk_linear_divergence_backward_args, grad_student_hidden),
    RLK_ARG_OUT(rlk_linear_divergence_backward_args, grad_student_weight),
    RLK_ARG_OUT(rlk_linear_divergence_backward_args, grad_teacher_hidden),
    RLK_ARG_OUT(rlk_linear_divergence_backward_args, grad_teacher_weight)};

/* The kernel of a spec list whose template is `t` for a side (the first from `from`). */
static const rlk_kernel_spec *ld_find(const ld_bwd_call *k, size_t from, const rlk_template *t, int64_t v0) {
  for (size_t i = from; i < k->op.nspecs; i++)
    if (k->op.specs[i].tmpl == t && k->op.specs[i].values[0] == v0) return &k->op.specs[i];
  return NULL;
}

/* One side's products of a chunk: dh (+)= dz W_c, grad_weight rows = dz^T h. */
static rlk_status ld_side_chunk(rlk_context *ctx, const ld_bwd_call *k, const ld_side *x, int dt, const void *hidden,
                                int64_t hs, const void *weight, int64_t wsd, int64_t H, void *gh, void *gw,
                                char *wsp, int accumulate, int64_t c0, int64_t nv, void *stream) {
  const int64_t N = k->h.N, Vc = k->chunk;
  const float *dz = (const float *)(wsp + x->dz_off);
  const uint64_t rb = (uint64_t)((N + LD_TILE - 1) / LD_TILE), hb = (uint64_t)((H + LD_TILE - 1) / LD_TILE);
  const uint64_t vb = (uint64_t)((nv + LD_TILE - 1) / LD_TILE);
  rlk_status st;
  if (x->gh >= 0) {
    /* the f32 sum: grad_hidden itself (the first chunk adds only when accumulating), or the workspace's */
    const int direct = x->gh == RLK_DT_F32;
    ld_dh_args d = {0};
    d.dz = dz, d.Vc = Vc, d.nv = nv, d.weight = weight, d.w_stride = wsd, d.c0 = c0, d.N = N, d.H = H;
    d.dh = direct ? (float *)gh : (float *)(wsp + x->dh_off);
    d.dh_stride = direct ? x->ghs : H;
    d.beta = c0 > 0 || (direct && accumulate) ? 1.0f : 0.0f;
    const rlk_launch_dims dd = rlk_op_grid(rb, hb, 1, LD_THREADS, 0);
    if ((st = rlk_context_launch_params(ctx, ld_find(k, 1, &ld_dh_tmpl, dt), &dd, stream, &d))) return st;
  }
  if (x->gw >= 0) {
    ld_dw_args w = {0};
    w.dz = dz, w.Vc = Vc, w.nv = nv, w.hidden = hidden, w.h_stride = hs, w.c0 = c0, w.N = N, w.H = H;
    w.grad_weight = gw, w.gw_stride = x->gws, w.accumulate = accumulate;
    const rlk_launch_dims dw = rlk_op_grid(vb, hb, 1, LD_THREADS, 0);
    const rlk_kernel_spec *s = NULL;
    for (size_t i = 1; i < k->op.nspecs && !s; i++)
      if (k->op.specs[i].tmpl == &ld_dw_tmpl && k->op.specs[i].values[0] == dt && k->op.specs[i].values[1] == x->gw)
        s = &k->op.specs[i];
    if ((st = rlk_context_launch_params(ctx, s, &dw, stream, &w))) return st;
  }
  return RLK_OK;
}

/* A 16-bit grad_hidden (+)= its f32 sum. */
static rlk_status ld_side_out(rlk_context *ctx, const ld_bwd_call *k, const ld_side *x, int64_t H, void *gh,
                              char *wsp, int accumulate, void *stream) {
  if (x->gh <= 0) return RLK_OK;
  ld_dh_out_args o = {0};
  o.dh = (const float *)(wsp + x->dh_off), o.N = k->h.N, o.H = H, o.grad_hidden = gh, o.gh_stride = x->ghs;
  o.accumulate = accumulate;
  const rlk_launch_dims d = rlk_op_grid((uint64_t)((k->h.N * H + 255) / 256), 1, 1, 256, 0);
  return rlk_context_launch_params(ctx, ld_find(k, 1, &ld_dh_out_tmpl, x->gh), &d, stream, &o);
}

/* The call's kernel that is `want`, NULL if none. */
static const rlk_kernel_spec *ld_spec(const ld_bwd_call *k, const rlk_kernel_spec *want) {
  for (size_t i = 0; i < k->op.nspecs; i++)
    if (!memcmp(&k->op.specs[i], want, sizeof *want)) return &k->op.specs[i];
  return NULL;
}

/* A persistent launch over an M x Nn output of bm x bn tiles: a block a multiprocessor at most. */
static rlk_launch_dims ld_persistent(const rlk_context *ctx, int64_t tiles, size_t smem) {
  const int64_t sms = ctx->target.multiprocessors > 0 ? ctx->target.multiprocessors : 1;
  return rlk_op_grid((uint64_t)(tiles < sms ? tiles : sms), 1, 1, LD_SM90_THREADS, smem);
}

/* One of the fused head's sm_90a products (g's M x Nn over K; g's maps: map_a, map_b and, where
 * g->staged, the output's map_c), in 128 x 256 tiles. */
static rlk_status ld_product_sm90(rlk_context *ctx, const rlk_kernel_spec *spec, ll_bwd_sm90_args *g,
                                  void *stream) {
  const int64_t tm = (g->M + LL_SM90_BM - 1) / LL_SM90_BM, tn = (g->Nn + LL_SM90_BN - 1) / LL_SM90_BN;
  if (!spec) return rlk_error(RLK_ERR_INTERNAL, "linear_divergence_backward: a product's kernel was not planned");
  if (tm * tn > INT32_MAX)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "linear_divergence_backward: %lld x %lld output tiles are too many",
                     (long long)tm, (long long)tn);
  g->tiles_m = (int)tm, g->tiles_n = (int)tn, g->group = LD_GROUP;
  if (!g->staged) g->map_c = g->map_a;
  g->map_d = g->map_a; /* unread */
  const rlk_launch_dims d = ld_persistent(ctx, tm * tn, g->staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM);
  return rlk_context_launch_params(ctx, spec, &d, stream, g);
}

/* One side's sm_90a products of a chunk over its 16-bit dz: the f32 grad_hidden sum (+)= dz W_c
 * (A = dz K-major, B = W's rows from c0 MN-major) and grad_weight's rows of the chunk = dz^T h (A =
 * dz MN-major, B = h MN-major), each output leaving by TMA where a map describes it (a 16-bit
 * grad_weight that is added to from registers). */
static rlk_status ld_side_chunk_sm90(rlk_context *ctx, const ld_bwd_call *k, const ld_side *x, const rlk_tensor *hid,
                                     int64_t hs, const rlk_tensor *wt, int64_t wsd, int64_t H, const rlk_tensor *gh,
                                     const rlk_tensor *gw, char *wsp, int accumulate, int64_t c0, int64_t nv,
                                     void *stream) {
  const int64_t N = k->h.N, Vc = k->chunk;
  const rlk_dtype dt = hid->dtype;
  const int code = ld_code(dt);
  const void *dz = wsp + x->dz_off;
  ll_bwd_sm90_args g = {0};
  rlk_status st;
  if (x->gh >= 0) {
    /* the f32 sum: grad_hidden itself (the first chunk adds only when accumulating), or the workspace's */
    const int direct = x->gh == RLK_DT_F32;
    float *dh = direct ? (float *)gh->data : (float *)(wsp + x->dh_off);
    const int64_t dhs = direct ? x->ghs : H;
    const rlk_tma_desc_request ra = ld_tma(dz, dt, N, nv, Vc, LL_SM90_BM), rb = ld_tma(wt->data, dt, k->h.V, H, wsd, 64),
                               rc = ld_tma(dh, RLK_F32, N, H, dhs, 64);
    g.staged = ld_tma_ok(&rc);
    if ((st = rlk_context_tensor_map(ctx, &ra, &g.map_a)) || (st = rlk_context_tensor_map(ctx, &rb, &g.map_b)) ||
        (g.staged && (st = rlk_context_tensor_map(ctx, &rc, &g.map_c))))
      return st;
    g.M = N, g.Nn = H, g.K = nv, g.c0 = c0, g.out = dh, g.out_stride = dhs;
    g.accumulate = c0 > 0 || (direct && accumulate);
    const rlk_kernel_spec want = {&ld_products_sm90_tmpl, {LD_LL_DH, code, RLK_I32, 0, 0}};
    if ((st = ld_product_sm90(ctx, ld_spec(k, &want), &g, stream))) return st;
  }
  if (x->gw >= 0) {
    /* this chunk's rows of grad_weight: a map of their own */
    char *rows = (char *)gw->data + (size_t)(c0 * x->gws) * rlk_dtype_size(gw->dtype);
    const rlk_tma_desc_request ra = ld_tma(dz, dt, N, nv, Vc, 64), rb = ld_tma(hid->data, dt, N, H, hs, 64),
                               rc = ld_tma(rows, gw->dtype, nv, H, x->gws, 64);
    g.staged = (x->gw == RLK_DT_F32 || !accumulate) && ld_tma_ok(&rc);
    if ((st = rlk_context_tensor_map(ctx, &ra, &g.map_a)) || (st = rlk_context_tensor_map(ctx, &rb, &g.map_b)) ||
        (g.staged && (st = rlk_context_tensor_map(ctx, &rc, &g.map_c))))
      return st;
    g.M = nv, g.Nn = H, g.K = N, g.c0 = c0, g.out = gw->data, g.out_stride = x->gws, g.accumulate = accumulate;
    const rlk_kernel_spec want = {&ld_products_sm90_tmpl, {LD_LL_DW, code, RLK_I32, 0, x->gw}};
    if ((st = ld_product_sm90(ctx, ld_spec(k, &want), &g, stream))) return st;
  }
  return RLK_OK;
}

/* The sm_90a backward's chunks in order: dz of both sides asked for (16-bit, the workspace), then
 * each side's products; at the end a 16-bit grad_hidden from its sum. */
static rlk_status ld_bwd_sm90(rlk_context *ctx, const rlk_linear_divergence_backward_args *a, const ld_bwd_call *k,
                              void *stream) {
  const ld_heads *h = &k->h;
  char *wsp = (char *)a->workspace;
  const int student = k->s.gh >= 0 || k->s.gw >= 0, teacher = k->t.gh >= 0 || k->t.gw >= 0;
  rlk_status st;
  ld_bwd_dz_sm90_args z = {0};
  rlk_tensor_map *const maps[4] = {&z.map_hs, &z.map_ws, &z.map_ht, &z.map_wt};
  const int64_t cl = k->dz_cluster;
  if ((st = ld_head_maps(ctx, h, (uint32_t)(LD_SM90_BN / cl), maps))) return st;
  LD_SET_HEADS(z, a, h);
  LD_SET_BWD_ROWS(z, a, k);
  z.Vc = k->chunk, z.vocab_start = a->vocab_start, z.beta = a->beta, z.group = LD_GROUP;
  for (int64_t c0 = 0; c0 < h->V; c0 += k->chunk) {
    const int64_t nv = h->V - c0 < k->chunk ? h->V - c0 : k->chunk;
    /* dz [N][nv] of pitch chunk, each side's in its head's dtype (an unread map for a side not asked) */
    const rlk_tma_desc_request rs = ld_tma(wsp + k->s.dz_off, a->student_hidden.dtype, h->N, nv, k->chunk, 64),
                               rt = ld_tma(wsp + k->t.dz_off, a->teacher_hidden.dtype, h->N, nv, k->chunk, 64);
    if ((st = rlk_context_tensor_map(ctx, student ? &rs : &rt, &z.map_zs)) ||
        (st = rlk_context_tensor_map(ctx, teacher ? &rt : &rs, &z.map_zt)))
      return st;
    /* clusters of row blocks (ld_dz_cluster): a whole number of them, and of clusters of blocks */
    const int64_t tm = (h->N + cl * LD_SM90_BM - 1) / (cl * LD_SM90_BM) * cl,
                  tn = (nv + LD_SM90_BN - 1) / LD_SM90_BN;
    if (tm * tn > INT32_MAX)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "linear_divergence_backward: %lld x %lld dz tiles are too many",
                       (long long)tm, (long long)tn);
    z.c0 = c0, z.tiles_m = (int)tm, z.tiles_n = (int)tn;
    rlk_launch_dims d = ld_persistent(ctx, (int64_t)z.tiles_m * z.tiles_n, LD_SM90_DZ_SMEM);
    d.grid[0] = d.grid[0] < cl ? (unsigned)cl : d.grid[0] / (unsigned)cl * (unsigned)cl;
    d.cluster = (unsigned)cl;
    if ((st = rlk_context_launch_params(ctx, &k->op.specs[0], &d, stream, &z))) return st;
    if (student && (st = ld_side_chunk_sm90(ctx, k, &k->s, &a->student_hidden, h->shs, &a->student_weight, h->sws,
                                            h->Hs, &a->grad_student_hidden, &a->grad_student_weight, wsp,
                                            a->accumulate, c0, nv, stream)))
      return st;
    if (teacher && (st = ld_side_chunk_sm90(ctx, k, &k->t, &a->teacher_hidden, h->ths, &a->teacher_weight, h->tws,
                                            h->Ht, &a->grad_teacher_hidden, &a->grad_teacher_weight, wsp,
                                            a->accumulate, c0, nv, stream)))
      return st;
  }
  if ((st = ld_side_out(ctx, k, &k->s, h->Hs, a->grad_student_hidden.data, wsp, a->accumulate, stream))) return st;
  return ld_side_out(ctx, k, &k->t, h->Ht, a->grad_teacher_hidden.data, wsp, a->accumulate, stream);
}

/* The backward's launches (after the driver's checks; it recorded the first configuration). */
static rlk_status ld_bwd_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  const rlk_linear_divergence_backward_args *a = args;
  const ld_bwd_call *k = (const ld_bwd_call *)call;
  rlk_status st;
  if (k->nvals == 2 && rlk_record_enabled()) rlk_record_op(&rlk_op_linear_divergence, &k->second);
  const ld_heads *h = &k->h;
  if (ctx->kind == RLK_BACKEND_HOST) {
    ld_bwd_host_args b = {0};
    LD_SET_HEADS(b, a, h);
    LD_SET_BWD_ROWS(b, a, k);
    b.gsh = a->grad_student_hidden.data, b.gsh_stride = k->s.ghs, b.gsh_dt = k->s.gh;
    b.gsw = a->grad_student_weight.data, b.gsw_stride = k->s.gws, b.gsw_dt = k->s.gw;
    b.gth = a->grad_teacher_hidden.data, b.gth_stride = k->t.ghs, b.gth_dt = k->t.gh;
    b.gtw = a->grad_teacher_weight.data, b.gtw_stride = k->t.gws, b.gtw_dt = k->t.gw;
    b.accumulate = a->accumulate, b.vocab_start = a->vocab_start, b.beta = a->beta;
    b.scratch = (double *)a->workspace;
    const rlk_launch_dims d = rlk_op_grid(1, 1, 1, 1, 0);
    return rlk_context_launch_params(ctx, &k->op.specs[0], &d, stream, &b);
  }
  if (k->sm90) return ld_bwd_sm90(ctx, a, k, stream);
  char *wsp = (char *)a->workspace;
  const int student = k->s.gh >= 0 || k->s.gw >= 0, teacher = k->t.gh >= 0 || k->t.gw >= 0;
  ld_bwd_dz_args z = {0};
  LD_SET_HEADS(z, a, h);
  LD_SET_BWD_ROWS(z, a, k);
  z.Vc = k->chunk;
  z.dz_s = student ? (float *)(wsp + k->s.dz_off) : NULL, z.dz_t = teacher ? (float *)(wsp + k->t.dz_off) : NULL;
  z.vocab_start = a->vocab_start, z.beta = a->beta;
  const uint64_t rb = (uint64_t)((h->N + LD_TILE - 1) / LD_TILE);
  for (int64_t c0 = 0; c0 < h->V; c0 += k->chunk) {
    const int64_t nv = h->V - c0 < k->chunk ? h->V - c0 : k->chunk;
    z.c0 = c0;
    const rlk_launch_dims d = rlk_op_grid(rb, (uint64_t)((nv + LD_TILE - 1) / LD_TILE), 1, LD_THREADS, 0);
    if ((st = rlk_context_launch_params(ctx, &k->op.specs[0], &d, stream, &z))) return st;
    if (student && (st = ld_side_chunk(ctx, k, &k->s, h->sdt, a->student_hidden.data, h->shs, a->student_weight.data,
                                       h->sws, h->Hs, a->grad_student_hidden.data, a->grad_student_weight.data, wsp,
                                       a->accumulate, c0, nv, stream)))
      return st;
    if (teacher && (st = ld_side_chunk(ctx, k, &k->t, h->tdt, a->teacher_hidden.data, h->ths, a->teacher_weight.data,
                                       h->tws, h->Ht, a->grad_teacher_hidden.data, a->grad_teacher_weight.data, wsp,
                                       a->accumulate, c0, nv, stream)))
      return st;
  }
  if ((st = ld_side_out(ctx, k, &k->s, h->Hs, a->grad_student_hidden.data, wsp, a->accumulate, stream))) return st;
  return ld_side_out(ctx, k, &k->t, h->Ht, a->grad_teacher_hidden.data, wsp, a->accumulate, stream);
}

static const rlk_op_entry ld_bwd_entry = {
    .name = "rlk_linear_divergence_backward", .op = &rlk_op_linear_divergence, .call_size = sizeof(ld_bwd_call),
    RLK_OP_FIELDS(ld_bwd_fields), .workspace = RLK_OP_WORKSPACE(rlk_linear_divergence_backward_args, 16),
    .validate = ld_bwd_validate, .launch = ld_bwd_launch};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_linear_divergence_backward, rlk_linear_divergence_backward_args, ld_bwd_entry)

/* ---------------------------------------------------------------------------------- */
/* The vocab-parallel combine                                                          */
/* ---------------------------------------------------------------------------------- */

RLK_API void rlk_linear_divergence_combine_args_init(rlk_linear_divergence_combine_args *args) {
  static const rlk_linear_divergence_combine_args defaults = {.mode = RLK_DIVERGENCE_FORWARD_KL, .ignore_index = -100};
  if (args) *args = defaults;
}

static const rlk_arg_field ld_combine_fields[] = {
    RLK_ARG_IN(rlk_linear_divergence_combine_args, partials), RLK_ARG_IN(rlk_linear_divergence_combine_args, labels),
    RLK_ARG_OUT(rlk_linear_divergence_combine_args, divergence), RLK_ARG_OUT(rlk_linear_divergence_combine_args, stats),
    RLK_ARG_OUT(rlk_linear_divergence_combine_args, entropy)};

typedef struct ld_combine_call {
  rlk_op_call op;
  ld_combine_args k;
} ld_combine_call;

static rlk_status ld_combine_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  (void)ctx;
  const rlk_linear_divergence_combine_args *a = args;
  rlk_status st;
  const rlk_tensor *p = &a->partials;
  if ((st = rlk_check_tensor_of(p, "partials", LD_F32, 3, 3)) || (st = rlk_check_contiguous(p, "partials")))
    return st;
  const int64_t P = p->shape[0], N = p->shape[1];
  if (P < 1 || N < 1 || p->shape[2] != LD_RECORD)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "partials: shape [%lld, %lld, %lld], expected [P >= 1, N >= 1, %d]",
                     (long long)P, (long long)N, (long long)p->shape[2], LD_RECORD);
  if ((uintptr_t)p->data % 16) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "partials: not 16-byte aligned");
  if (a->mode != RLK_DIVERGENCE_FORWARD_KL && a->mode != RLK_DIVERGENCE_REVERSE_KL)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "mode: %d; the shard form takes the forward or reverse KL", (int)a->mode);
  int64_t ls = 0, r, c, s;
  if ((a->labels.data && (st = rlk_check_vector(&a->labels, "labels", LD_LABEL_DTYPES, N, 0, &ls))) ||
      (st = rlk_check_vector(&a->divergence, "divergence", LD_F32, N, 1, NULL)) ||
      (st = ld_check_matrix(&a->stats, "stats", LD_F32, N, LD_STATS, &r, &c, &s)) ||
      (st = rlk_check_contiguous(&a->stats, "stats")) ||
      (a->entropy.data && (st = rlk_check_vector(&a->entropy, "entropy", LD_F32, N, 1, NULL))))
    return st;
  rlk_op_values *v = &call->vals;
  rlk_op_values_set(v, LD_S_PASS, LD_PASS_COMBINE);
  rlk_op_values_set(v, LD_S_LABELS, !a->labels.data ? LD_LAB_NONE : a->labels.dtype == RLK_I32 ? LD_LAB_I32 : LD_LAB_I64);
  rlk_op_values_set(v, LD_S_MODE, a->mode);
  ld_combine_args *k = &((ld_combine_call *)call)->k;
  k->records = p->data, k->S = P, k->N = N, k->labels = a->labels.data, k->label_stride = ls;
  k->ignore_index = a->ignore_index, k->divergence = (float *)a->divergence.data, k->stats = (float *)a->stats.data;
  k->entropy = (float *)a->entropy.data;
  return RLK_OK;
}

/* A thread a row (the host: its one call). */
static void ld_combine_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d) {
  (void)i;
  if (ctx->kind == RLK_BACKEND_HOST) return;
  *d = rlk_op_grid((uint64_t)((((const ld_combine_call *)call)->k.N + LD_THREADS - 1) / LD_THREADS), 1, 1, LD_THREADS,
                   0);
}

static const rlk_op_entry ld_combine_entry = {
    .name = "rlk_linear_divergence_combine", .op = &rlk_op_linear_divergence, .call_size = sizeof(ld_combine_call),
    RLK_OP_FIELDS(ld_combine_fields), .validate = ld_combine_validate, .params_at = offsetof(ld_combine_call, k),
    .dims = ld_combine_dims};

RLK_OP_DEFINE_CALL(rlk_linear_divergence_combine, rlk_linear_divergence_combine_args, ld_combine_entry)
