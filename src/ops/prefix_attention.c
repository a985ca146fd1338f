/* prefix_attention.c - prefix-shared attention for GRPO groups: validation of the packed layout,
 * kernel selection, launches (forward and backward).
 *
 * Kernels (templates/cuda/prefix_attention.cuh, templates/host/prefix_attention_*.c):
 *   pattn_fwd           portable: a warp per (query row, head), every CUDA arch and HIP; on the
 *                       host, the fp64 reference path
 *   pattn_fwd_mma       CUDA sm_80+: mma.sync m16n8k16, 64-row query tiles; the group's response
 *                       rows are stacked so one tile of them reads each prefix K/V tile once
 *   pattn_fwd_sm90      CUDA sm_90a: the same tiling with 128-row query tiles, TMA copies and
 *                       wgmma (templates/cuda/prefix_attention_sm90.cuh)
 *   pattn_bwd_prep      GPU (but sm_90a): delta[i, h] = dO[i, h] . O[i, h] into the workspace
 *   pattn_bwd_dkdv      portable: a warp per key and key head, looping over every query (all
 *                       query heads of the key head) that sees it: dk, dv written once
 *   pattn_bwd_dkdv_mma  a block per key tile and query head, looping over every query tile that
 *                       sees it; with GQA it writes f32 partials to the workspace, and
 *   pattn_bwd_dkdv_sm90 sm_90a: the same with 128-key tiles, TMA and wgmma
 *   pattn_bwd_reduce    sums them over the group's query heads in order
 *   pattn_bwd_dq(_mma)  GPU: a block per query tile (the forward's tiling): dq written once
 *   pattn_bwd_dq_sm90   sm_90a: the same with 128-row query tiles, 64-key tiles, TMA and wgmma;
 *                       it computes delta itself and writes it for pattn_bwd_dkdv_sm90, which runs
 *                       after it (the sm_90a backward has no prep pass)
 *   pattn_bwd           host: the whole backward in fp64
 * No atomics anywhere: every output element is summed by one thread in a fixed order.
 *
 * Grid of the tiled kernels: y = prompt, x = tile of the prompt (its prefix's and its stacked
 * response rows' tiles in one index: prompt_tile in the template; blocks past a prompt's tiles
 * return at once), z = head; the sm_90a dk/dv kernel has key heads in x, tiles in y and prompts
 * in z. The host layout arrays give the most tiles a prompt has.
 * RLK_PREFIX_ATTENTION_VARIANT=portable|mma|wgmma forces a GPU path (mma needs sm_80+, wgmma
 * sm_90a; each falls back to the next one down), as does the call's tuning.variant. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/ops.h"
#include "tune/tune_db.h"
#include "tune/tune_table.h"
#include "common/prefix_attention_params.h"

enum {
  PA_VARIANT_AUTO = RLK_PREFIX_ATTENTION_VARIANT_AUTO,
  PA_VARIANT_PORTABLE = RLK_PREFIX_ATTENTION_VARIANT_PORTABLE,
  PA_VARIANT_MMA = RLK_PREFIX_ATTENTION_VARIANT_MMA,
  PA_VARIANT_WGMMA = RLK_PREFIX_ATTENTION_VARIANT_WGMMA
};
enum { PA_PASS_FWD = 0, PA_PASS_BWD = 1, PA_PASS_BOTH = 2 };

static const char *const pa_dt_names[] = RLK_PARAMS_ENUM_NAMES(RLK_PA_DTYPES);
static const char *const pa_variant_names[] = {"auto", "portable", "mma", "wgmma", NULL}; /* by PA_VARIANT_* */
static const char *const pa_pass_names[] = {"fwd", "bwd", "both", NULL};

static const rlk_value_decl pa_dtype = RLK_DECL_CHOICES("dtype", pa_dt_names); /* the setting's too */

static const rlk_value_decl *const pa_params[] = {
    &pa_dtype,
    RLK_PARAM_POW2("head_dim", 64, 128),
};
/* The sm_90a kernels': also their ring's depth. */
static const rlk_value_decl *const pa_sm90_params[] = {
    &pa_dtype,
    RLK_PARAM_POW2("head_dim", 64, 128),
    RLK_PARAM_INT("stages", 2, 4),
};

#define PA_N(a) (sizeof(a) / sizeof((a)[0]))
#define PA_CUDA "cuda/prefix_attention.cuh"

static const rlk_template pa_fwd_tmpl = {"prefix_attention", "pattn_fwd", PA_CUDA,
                                         "host/prefix_attention_fwd.c", PA_N(pa_params), pa_params};
static const rlk_template pa_fwd_mma_tmpl = {"prefix_attention", "pattn_fwd_mma", PA_CUDA, NULL,
                                             PA_N(pa_params), pa_params};
static const rlk_template pa_fwd_sm90_tmpl = {"prefix_attention", "pattn_fwd_sm90", "cuda/prefix_attention_sm90.cuh",
                                              NULL, PA_N(pa_sm90_params), pa_sm90_params, RLK_TARGET_WGMMA | RLK_TARGET_TMA};
static const rlk_template pa_dkdv_sm90_tmpl = {"prefix_attention", "pattn_bwd_dkdv_sm90",
                                               "cuda/prefix_attention_sm90.cuh", NULL, PA_N(pa_sm90_params),
                                               pa_sm90_params, RLK_TARGET_WGMMA | RLK_TARGET_TMA};
static const rlk_template pa_dq_sm90_tmpl = {"prefix_attention", "pattn_bwd_dq_sm90", "cuda/prefix_attention_sm90.cuh",
                                             NULL, PA_N(pa_sm90_params), pa_sm90_params, RLK_TARGET_WGMMA | RLK_TARGET_TMA};
static const rlk_template pa_bwd_host_tmpl = {"prefix_attention", "pattn_bwd", NULL,
                                              "host/prefix_attention_bwd.c", PA_N(pa_params), pa_params};
static const rlk_template pa_prep_tmpl = {"prefix_attention", "pattn_bwd_prep", PA_CUDA, NULL,
                                          PA_N(pa_params), pa_params};
static const rlk_template pa_dkdv_tmpl = {"prefix_attention", "pattn_bwd_dkdv", PA_CUDA, NULL,
                                          PA_N(pa_params), pa_params};
static const rlk_template pa_dq_tmpl = {"prefix_attention", "pattn_bwd_dq", PA_CUDA, NULL,
                                        PA_N(pa_params), pa_params};
static const rlk_template pa_dkdv_mma_tmpl = {"prefix_attention", "pattn_bwd_dkdv_mma", PA_CUDA, NULL,
                                              PA_N(pa_params), pa_params};
static const rlk_template pa_reduce_tmpl = {"prefix_attention", "pattn_bwd_reduce", PA_CUDA, NULL,
                                            PA_N(pa_params), pa_params};
static const rlk_template pa_dq_mma_tmpl = {"prefix_attention", "pattn_bwd_dq_mma", PA_CUDA, NULL,
                                            PA_N(pa_params), pa_params};

/* The kernels' tiles and blocks: PA_SM90_*, PA_TILE, PA_MMA_THREADS, PA_PORTABLE_WARPS and
 * PA_PASS_THREADS (prefix_attention_params.h). */
/* Shared memory of the mma kernels: 16-bit tiles of PA_TILE rows of D + 8 elements (padded
 * rows: conflict-free fragment loads), plus per-row floats and bounds. */
static size_t pa_tile_bytes(int D) { return (size_t)PA_TILE * (size_t)(D + 8) * 2u; }
static size_t pa_fwd_smem(int D) { return 5 * pa_tile_bytes(D); }                  /* Q, 2 x (K, V) */
static size_t pa_dkdv_smem(int D) { return 6 * pa_tile_bytes(D) + PA_TILE * 24u; } /* K V, 2 x (Q dO) */
static size_t pa_dq_smem(int D) { return 6 * pa_tile_bytes(D); }                   /* Q dO, 2 x (K V) */
/* The sm_90a forward (templates/cuda/prefix_attention_sm90.cuh: pa_sm90): TMA boxes of 64 head-dim
 * columns (64 rows of Q, 128 of K and V), two stages of K and V by default (the fwd_stages
 * setting), plus the alignment. */
#define PA_SM90_STAGES 2
/* Dynamic shared memory a block of the sm_90a kernels may ask for: an SM's 227 KB less 1 KB for
 * the static barriers (the dk/dv kernel's per-row arrays take 3 KB more at four stages, where its
 * dynamic part stays under 200 KB). */
#define PA_SM90_SMEM_MAX ((size_t)PA_SM90_SMEM_LIMIT - 1024)
/* the backward's key tiles are the forward's query tiles in size: one count of a prompt's tiles
 * (pa_shape.tiles[1]) sizes every sm_90a grid */
_Static_assert(PA_SM90_BM == PA_SM90_BN, "sm_90a query and key tiles of one size");
static size_t pa_sm90_smem(int D, int stages) {
  return (size_t)D * 2u * (PA_SM90_BM + 2u * (size_t)stages * PA_SM90_BN) + PA_SM90_ALIGN;
}
/* Its dk, dv kernel (pa_sm90_bwd): key tiles (K and V), query tiles (Q and dO) in four stages by
 * default (dkdv_stages). */
#define PA_SM90_DKDV_STAGES 4
static size_t pa_sm90_dkdv_smem(int D, int stages) {
  return (size_t)D * 2u * (2u * PA_SM90_BN + 2u * (size_t)stages * PA_SM90_BQ) + PA_SM90_ALIGN;
}
/* Its dq kernel (pa_sm90_dq): query tiles (Q and dO), key tiles in three stages by default
 * (dq_stages). */
#define PA_SM90_DQ_STAGES 3
static size_t pa_sm90_dq_smem(int D, int stages) {
  return (size_t)D * 2u * (2u * PA_SM90_BM + 2u * (size_t)stages * PA_SM90_DQ_BN) + PA_SM90_ALIGN;
}

/* ---------------------------------------------------------------------------------- */
/* Selection (shared by calls and precompiling)                                        */
/* ---------------------------------------------------------------------------------- */

/* The settings of a configuration line (the table is with the plan, below): what the selection
 * reads. */
enum {
  PA_S_PASS, PA_S_DTYPE, PA_S_HEAD_DIM, PA_S_VARIANT, PA_S_FWD_STAGES, PA_S_DKDV_STAGES, PA_S_DQ_STAGES,
  PA_S_Q_HEADS, PA_S_KV_HEADS, PA_S_GROUP, PA_S_PREFIX, PA_S_RESPONSE, PA_S_TOKENS, PA_NSETTINGS
};

typedef struct pa_plan {
  int variant; /* the forward that runs: PA_VARIANT_PORTABLE, _MMA or _WGMMA (the host: PORTABLE) */
  int tiled;   /* the backward runs the tiled kernels (prep, dk/dv, reduce with GQA, dq): mma's, or
                * for WGMMA the sm_90a dk/dv and dq */
  int fwd_stages, dkdv_stages, dq_stages; /* the sm_90a kernels' ring depths (WGMMA) */
  rlk_kernel_spec fwd, prep, dkdv, reduce, dq, bwd_host;
} pa_plan;

static atomic_int pa_env_variant = -1;

static int pa_env_override(void) {
  return rlk_env_choice(&pa_env_variant, "RLK_PREFIX_ATTENTION_VARIANT", pa_variant_names, PA_VARIANT_AUTO);
}

static void pa_spec(rlk_kernel_spec *s, const rlk_template *t, int64_t dtype, int64_t D, int stages) {
  memset(s, 0, sizeof *s);
  s->tmpl = t;
  s->values[0] = dtype;
  s->values[1] = D;
  if (t->nparams > 2) s->values[2] = stages; /* the sm_90a kernels' ring (pa_sm90_params) */
}

/* An sm_90a ring's depth: the one asked for when it is 2..4 and fits, else the default. */
static int pa_stages(int64_t asked, int def, int D, size_t (*smem)(int D, int stages)) {
  return asked >= 2 && asked <= 4 && smem(D, (int)asked) <= PA_SM90_SMEM_MAX ? (int)asked : def;
}

/* The kernels of a configuration (dtype, head_dim, variant and ring depths asked for; unaligned:
 * a tensor is not 16-byte aligned, so the mma kernels' 16-byte copies cannot run). */
static rlk_status pa_select(const rlk_context *ctx, const rlk_op_values *s, int unaligned, pa_plan *p) {
  memset(p, 0, sizeof *p);
  const int64_t dtype = s->v[PA_S_DTYPE], D = s->v[PA_S_HEAD_DIM] ? 128 : 64;
  int variant = s->v[PA_S_VARIANT] ? (int)s->v[PA_S_VARIANT] : pa_env_override();
  /* 16-byte aligned tensors: the mma kernels' 16-byte copies, the tensor maps of wgmma's */
  const int mma_ok = ctx->kind != RLK_BACKEND_HOST && rlk_target_cuda_sm(&ctx->target) >= 80 && !unaligned;
  const int wgmma_ok = mma_ok && ctx->kind == RLK_BACKEND_CUDA && (ctx->target.features & RLK_TARGET_WGMMA) != 0;
  if (ctx->kind == RLK_BACKEND_HOST)
    variant = PA_VARIANT_PORTABLE;
  else if (variant == PA_VARIANT_AUTO)
    variant = wgmma_ok ? PA_VARIANT_WGMMA : mma_ok ? PA_VARIANT_MMA : PA_VARIANT_PORTABLE;
  if (variant == PA_VARIANT_WGMMA && !wgmma_ok) {
    rlk_debug("prefix_attention: the wgmma variant needs CUDA sm_90a and 16-byte aligned tensors; trying mma");
    variant = PA_VARIANT_MMA;
  }
  if (variant == PA_VARIANT_MMA && !mma_ok) {
    rlk_debug("prefix_attention: the mma variant needs CUDA sm_80+ and 16-byte aligned tensors; running the "
              "portable kernels");
    variant = PA_VARIANT_PORTABLE;
  }
  p->variant = variant;
  p->tiled = variant != PA_VARIANT_PORTABLE;
  if (variant == PA_VARIANT_WGMMA) {
    p->fwd_stages = pa_stages(s->v[PA_S_FWD_STAGES], PA_SM90_STAGES, (int)D, pa_sm90_smem);
    p->dkdv_stages = pa_stages(s->v[PA_S_DKDV_STAGES], PA_SM90_DKDV_STAGES, (int)D, pa_sm90_dkdv_smem);
    p->dq_stages = pa_stages(s->v[PA_S_DQ_STAGES], PA_SM90_DQ_STAGES, (int)D, pa_sm90_dq_smem);
  }
  const int wg = variant == PA_VARIANT_WGMMA;
  pa_spec(&p->fwd, wg ? &pa_fwd_sm90_tmpl : variant == PA_VARIANT_MMA ? &pa_fwd_mma_tmpl : &pa_fwd_tmpl, dtype, D,
          p->fwd_stages);
  pa_spec(&p->prep, &pa_prep_tmpl, dtype, D, 0);
  pa_spec(&p->dkdv, wg ? &pa_dkdv_sm90_tmpl : p->tiled ? &pa_dkdv_mma_tmpl : &pa_dkdv_tmpl, dtype, D,
          p->dkdv_stages);
  pa_spec(&p->reduce, &pa_reduce_tmpl, dtype, D, 0);
  pa_spec(&p->dq, wg ? &pa_dq_sm90_tmpl : p->tiled ? &pa_dq_mma_tmpl : &pa_dq_tmpl, dtype, D, p->dq_stages);
  pa_spec(&p->bwd_host, &pa_bwd_host_tmpl, dtype, D, 0);
  return rlk_spec_validate(&p->fwd);
}

/* ---------------------------------------------------------------------------------- */
/* Validation                                                                          */
/* ---------------------------------------------------------------------------------- */

/* What a call's tensors and layout come to. */
typedef struct pa_shape {
  int64_t T, Hq, Hkv, D, P, S;
  /* the most tiles of a prompt (its prefix's plus its responses' rows, each part in whole tiles):
   * tiles[0] of PA_TILE rows (the mma kernels), tiles[1] of PA_SM90_BM = PA_SM90_BN (sm_90a); a
   * grid's x (sm_90a dk/dv: y) spans them, the prompts in the next dimension (prompt_tile in the
   * templates) */
  int64_t tiles[2];
  int64_t prefix_tokens; /* the prompts' prefixes together (the rest are response tokens) */
  rlk_dtype dtype;
  const int32_t *seq, *grp; /* what the kernels read */
} pa_shape;

/* What a tuning record's key says of a call: its heads and its layout's means (bucketed in the
 * key), and T. */
typedef struct pa_tune_problem {
  int64_t Hq, Hkv, group, prefix, response, T;
} pa_tune_problem;

#define PA_DTYPES (RLK_DTYPE_BIT(RLK_BF16) | RLK_DTYPE_BIT(RLK_F16))

/* A [T, H, D] tensor; *H receives H (D and T checked against *D and T when non-zero). */
static rlk_status pa_check_qkv(const rlk_tensor *t, const char *what, int64_t *T, int64_t *H, int64_t *D) {
  rlk_status st;
  if ((st = rlk_check_tensor_of(t, what, PA_DTYPES, 3, 3)) || (st = rlk_check_contiguous(t, what)))
    return st;
  if (*T && t->shape[0] != *T)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: %lld tokens, q has %lld", what, (long long)t->shape[0],
                     (long long)*T);
  if (*D && t->shape[2] != *D)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: head dim %lld, q has %lld", what, (long long)t->shape[2],
                     (long long)*D);
  *T = t->shape[0];
  *H = t->shape[1];
  *D = t->shape[2];
  return RLK_OK;
}

/* An output or saved tensor of exactly `shape` (ndim 2 or 3) and dtype. */
static rlk_status pa_check_like(const rlk_tensor *t, const char *what, rlk_dtype dtype, int ndim,
                                int64_t d0, int64_t d1, int64_t d2) {
  rlk_status st;
  if ((st = rlk_check_tensor_of(t, what, RLK_DTYPE_BIT(dtype), ndim, ndim)) ||
      (st = rlk_check_contiguous(t, what)))
    return st;
  const int64_t want[3] = {d0, d1, d2};
  for (int i = 0; i < ndim; i++)
    if (t->shape[i] != want[i]) {
      if (ndim == 2)
        return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld], expected [%lld, %lld]", what,
                         (long long)t->shape[0], (long long)t->shape[1], (long long)d0, (long long)d1);
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                       what, (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                       (long long)d0, (long long)d1, (long long)d2);
    }
  return RLK_OK;
}

static rlk_status pa_check_offsets_tensor(const rlk_tensor *t, const char *what, int64_t n) {
  rlk_status st;
  if ((st = rlk_check_tensor_of(t, what, RLK_DTYPE_BIT(RLK_I32), 1, 1)) || (st = rlk_check_contiguous(t, what)))
    return st;
  if (t->shape[0] != n)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: shape [%lld], expected [%lld]", what,
                     (long long)t->shape[0], (long long)n);
  return RLK_OK;
}

/* The layout against T tokens: every offset is read from the host arrays. */
static rlk_status pa_check_layout(const rlk_context *ctx, const rlk_prefix_attention_layout *l, int64_t T,
                                  pa_shape *s) {
  const int64_t P = l->num_prompts, S = l->num_segments;
  if (P < 1) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "layout.num_prompts: %lld, expected >= 1", (long long)P);
  if (S < P || S > INT32_MAX - 1)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "layout.num_segments: %lld, expected from num_prompts (%lld) to 2^31 - 2", (long long)S,
                     (long long)P);
  const int32_t *seq = l->host_seq_offsets, *grp = l->host_group_offsets;
  if (!seq) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "layout.host_seq_offsets: NULL");
  if (!grp) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "layout.host_group_offsets: NULL");
  if (grp[0] != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "layout.group_offsets[0]: %d, expected 0", (int)grp[0]);
  for (int64_t p = 0; p < P; p++)
    if (grp[p + 1] <= grp[p])
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "layout.group_offsets[%lld]: %d is not above group_offsets[%lld] = %d (a prompt has "
                       "at least its prefix segment)",
                       (long long)(p + 1), (int)grp[p + 1], (long long)p, (int)grp[p]);
  if (grp[P] != S)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "layout.group_offsets[%lld]: %d, expected num_segments = %lld",
                     (long long)P, (int)grp[P], (long long)S);
  if (seq[0] != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "layout.seq_offsets[0]: %d, expected 0", (int)seq[0]);
  int64_t tiles[2] = {0, 0}, prefix_tokens = 0;
  for (int64_t p = 0; p < P; p++) {
    for (int64_t sg = grp[p]; sg < grp[p + 1]; sg++) {
      const int prefix = sg == grp[p];
      if (seq[sg + 1] < seq[sg] || (!prefix && seq[sg + 1] == seq[sg]))
        return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                         "layout.seq_offsets[%lld]: %d after seq_offsets[%lld] = %d: %s of prompt %lld has a "
                         "%s length",
                         (long long)(sg + 1), (int)seq[sg + 1], (long long)sg, (int)seq[sg],
                         prefix ? "the prefix" : "a response", (long long)p,
                         seq[sg + 1] < seq[sg] ? "negative" : "zero");
    }
    const int64_t lp = seq[grp[p] + 1] - seq[grp[p]], ls = seq[grp[p + 1]] - seq[grp[p] + 1];
    prefix_tokens += lp;
    for (int i = 0; i < 2; i++) {
      const int64_t tile = i ? PA_SM90_BM : PA_TILE, n = (lp + tile - 1) / tile + (ls + tile - 1) / tile;
      if (n > tiles[i]) tiles[i] = n;
    }
  }
  if (seq[S] != T)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "layout.seq_offsets[%lld]: %d, expected T = %lld (q's tokens)",
                     (long long)S, (int)seq[S], (long long)T);
  rlk_status st;
  const int host = ctx->kind == RLK_BACKEND_HOST;
  if (!host || l->seq_offsets.data) {
    if ((st = pa_check_offsets_tensor(&l->seq_offsets, "layout.seq_offsets", S + 1))) return st;
  }
  if (!host || l->group_offsets.data) {
    if ((st = pa_check_offsets_tensor(&l->group_offsets, "layout.group_offsets", P + 1))) return st;
  }
  s->P = P;
  s->S = S;
  s->tiles[0] = tiles[0];
  s->tiles[1] = tiles[1];
  s->prefix_tokens = prefix_tokens;
  s->seq = host ? seq : (const int32_t *)l->seq_offsets.data;
  s->grp = host ? grp : (const int32_t *)l->group_offsets.data;
  return RLK_OK;
}

static rlk_status pa_check_inputs(const rlk_context *ctx, const rlk_tensor *q, const rlk_tensor *k,
                                  const rlk_tensor *v, const rlk_prefix_attention_layout *l, float scale,
                                  pa_shape *s) {
  memset(s, 0, sizeof *s);
  rlk_status st;
  int64_t T = 0, D = 0, Hk2 = 0;
  if ((st = pa_check_qkv(q, "q", &T, &s->Hq, &D))) return st;
  if ((st = pa_check_qkv(k, "k", &T, &s->Hkv, &D))) return st;
  if ((st = pa_check_qkv(v, "v", &T, &Hk2, &D))) return st;
  if (k->dtype != q->dtype || v->dtype != q->dtype)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "k, v: dtypes %s, %s differ from q's %s", rlk_dtype_name(k->dtype),
                     rlk_dtype_name(v->dtype), rlk_dtype_name(q->dtype));
  if (Hk2 != s->Hkv)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "v: %lld heads, k has %lld", (long long)Hk2, (long long)s->Hkv);
  if (D != 64 && D != 128)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "q: head dim %lld is not 64 or 128", (long long)D);
  if (s->Hq % s->Hkv != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "q, k: %lld query heads are not a multiple of %lld key heads",
                     (long long)s->Hq, (long long)s->Hkv);
  if (T > INT32_MAX || s->Hq > 65535)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "q: %lld tokens x %lld heads: at most 2^31 - 1 tokens and 65535 heads",
                     (long long)T, (long long)s->Hq);
  if (!(scale >= 0.0f) || isinf(scale))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "scale: %g must be finite and >= 0 (0: 1/sqrt(D))", (double)scale);
  s->T = T;
  s->D = D;
  s->dtype = q->dtype;
  return pa_check_layout(ctx, l, T, s);
}

/* A call's tuning fields: each 0 or in its range. */
static rlk_status pa_check_tuning(const rlk_prefix_attention_tuning *t) {
  rlk_status st = rlk_check_enum((int)t->variant, "tuning.variant", PA_VARIANT_AUTO, PA_VARIANT_WGMMA,
                                 "rlk_prefix_attention_variant");
  if (st) return st;
  const int depth[3] = {t->fwd_stages, t->dkdv_stages, t->dq_stages};
  static const char *const names[3] = {"fwd_stages", "dkdv_stages", "dq_stages"};
  for (int i = 0; i < 3; i++)
    if (depth[i] && (depth[i] < 2 || depth[i] > 4))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "tuning.%s: %d is not 0 (the default) or 2 to 4", names[i],
                       depth[i]);
  return RLK_OK;
}

static int pa_unaligned(const void *const *ptrs, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((uintptr_t)ptrs[i] % 16) return 1;
  return 0;
}

static unsigned pa_warp(const rlk_context *ctx) { return (unsigned)ctx->target.warp_size; }

static float pa_scale(float scale, int64_t D) { return scale > 0.0f ? scale : (float)(1.0 / sqrt((double)D)); }

/* ---------------------------------------------------------------------------------- */
/* The calls                                                                           */
/* ---------------------------------------------------------------------------------- */

static void pa_tuned(const rlk_context *ctx, int pass, const pa_tune_problem *t, rlk_op_values *s);
static pa_tune_problem pa_call_problem(const pa_shape *s);

/* The tensor maps of the sm_90a kernels: q (and grad_out when given) as [T, Hq * D] in boxes of
 * 64 rows, k and v as [T, Hkv * D] in boxes of kv_rows rows (the kernel's key tile); boxes 64
 * columns wide (a 64-column block of one head), 128-byte swizzle. maps[0..3]: q, k, v, grad_out
 * (the fields of the kernel's argument struct they go to). */
static rlk_status pa_sm90_maps(const rlk_context *ctx, const pa_shape *s, const void *q, const void *k,
                               const void *v, const void *dout, uint32_t kv_rows, rlk_tensor_map *const maps[4]) {
  const uint64_t T = (uint64_t)s->T, cq = (uint64_t)(s->Hq * s->D), ckv = (uint64_t)(s->Hkv * s->D);
  const rlk_tma_desc_request req[4] = {{q, s->dtype, T, cq, cq, 64, 64, 128},
                                       {k, s->dtype, T, ckv, ckv, kv_rows, 64, 128},
                                       {v, s->dtype, T, ckv, ckv, kv_rows, 64, 128},
                                       {dout, s->dtype, T, cq, cq, 64, 64, 128}};
  for (int i = 0; i < (dout ? 4 : 3); i++) {
    rlk_status st = rlk_context_tensor_map(ctx, &req[i], maps[i]);
    if (st) return st;
  }
  return RLK_OK;
}

RLK_API void rlk_prefix_attention_args_init(rlk_prefix_attention_args *args) {
  if (args) memset(args, 0, sizeof *args);
}

RLK_API void rlk_prefix_attention_backward_args_init(rlk_prefix_attention_backward_args *args) {
  if (args) memset(args, 0, sizeof *args);
}

/* A call of either pass: its shape, its kernels and the argument the sm_90a kernels take, whose
 * `pass` every other kernel of the pass takes. */
typedef struct pa_call {
  rlk_op_call op;
  pa_shape s;
  pa_plan p;
  union {
    pa_fwd_sm90_args f;
    pa_bwd_sm90_args b;
  } k;
} pa_call;
_Static_assert(_Alignof(pa_call) <= RLK_OP_CALL_ALIGN, "the call driver holds a call's state aligned for it");

/* The kernels of a call's pass: the configuration asked for (call->vals; with none, the tuning
 * database's winner for the call's problem), then as the line of what runs (the variant, a ring
 * depth that is not the default): unaligned tensors run the portable kernels whatever was asked. */
static rlk_status pa_choose(const rlk_context *ctx, pa_call *c, int pass, int unaligned) {
  rlk_op_values asked = c->op.vals;
  const pa_tune_problem t = pa_call_problem(&c->s);
  pa_tuned(ctx, pass, &t, &asked);
  rlk_status st = pa_select(ctx, &asked, unaligned, &c->p);
  if (!st && pass == PA_PASS_BWD && c->p.variant == PA_VARIANT_WGMMA && c->s.tiles[1] > 65535) {
    /* the sm_90a dk/dv grid has key tiles in y (65535 at most); the mma kernels have them in x */
    asked.v[PA_S_VARIANT] = PA_VARIANT_MMA;
    st = pa_select(ctx, &asked, unaligned, &c->p);
  }
  if (st) return st;
  rlk_op_values *v = &c->op.vals;
  rlk_op_values_init(&rlk_op_prefix_attention, v);
  rlk_op_values_set(v, PA_S_PASS, pass);
  rlk_op_values_set(v, PA_S_DTYPE, asked.v[PA_S_DTYPE]);
  rlk_op_values_set(v, PA_S_HEAD_DIM, asked.v[PA_S_HEAD_DIM]);
  rlk_op_values_set(v, PA_S_VARIANT, c->p.variant);
  if (c->p.variant == PA_VARIANT_WGMMA) {
    if (pass == PA_PASS_FWD && c->p.fwd_stages != PA_SM90_STAGES) rlk_op_values_set(v, PA_S_FWD_STAGES, c->p.fwd_stages);
    if (pass == PA_PASS_BWD && c->p.dkdv_stages != PA_SM90_DKDV_STAGES)
      rlk_op_values_set(v, PA_S_DKDV_STAGES, c->p.dkdv_stages);
    if (pass == PA_PASS_BWD && c->p.dq_stages != PA_SM90_DQ_STAGES) rlk_op_values_set(v, PA_S_DQ_STAGES, c->p.dq_stages);
  }
  return RLK_OK;
}

/* The configuration a call asks for: its dtype, head dim and tuning (checked first). */
static rlk_status pa_asked(rlk_op_values *v, int pass, const pa_shape *s, const rlk_prefix_attention_tuning *t) {
  rlk_status st = pa_check_tuning(t);
  if (st) return st;
  rlk_op_values_set(v, PA_S_PASS, pass);
  rlk_op_values_set(v, PA_S_DTYPE, s->dtype == RLK_BF16 ? PA_DT_BF16 : PA_DT_F16);
  rlk_op_values_set(v, PA_S_HEAD_DIM, s->D == 128);
  rlk_op_values_set(v, PA_S_VARIANT, t->variant);
  rlk_op_values_set(v, PA_S_FWD_STAGES, t->fwd_stages);
  rlk_op_values_set(v, PA_S_DKDV_STAGES, t->dkdv_stages);
  rlk_op_values_set(v, PA_S_DQ_STAGES, t->dq_stages);
  return RLK_OK;
}

/* On the host backend the kernels read the layout's host arrays while they write: those arrays
 * share no byte with what the call writes (n written tensors, and the workspace). */
static rlk_status pa_host_arrays_apart(const rlk_context *ctx, const rlk_prefix_attention_layout *l, const pa_shape *s,
                                       const rlk_arg_ref *written, size_t n, void *workspace, size_t ws_bytes) {
  if (ctx->kind != RLK_BACKEND_HOST) return RLK_OK;
  const rlk_tensor seq = rlk_tensor_1d((void *)l->host_seq_offsets, RLK_I32, s->S + 1),
                   grp = rlk_tensor_1d((void *)l->host_group_offsets, RLK_I32, s->P + 1),
                   ws = rlk_workspace_tensor(workspace, ws_bytes);
  rlk_arg_ref refs[8] = {{&seq, "layout.host_seq_offsets", 0, NULL}, {&grp, "layout.host_group_offsets", 0, NULL},
                         {&ws, "workspace", 1, NULL}};
  size_t m = 3;
  for (size_t i = 0; i < n && m < sizeof refs / sizeof refs[0]; i++) refs[m++] = written[i];
  return rlk_check_no_overlap(refs, m);
}

static rlk_status pa_fwd_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_prefix_attention_args *a = args;
  pa_call *c = (pa_call *)call;
  pa_shape *s = &c->s;
  rlk_status st = pa_check_inputs(ctx, &a->q, &a->k, &a->v, &a->layout, a->scale, s);
  if (st) return st;
  if ((st = pa_check_like(&a->out, "out", s->dtype, 3, s->T, s->Hq, s->D))) return st;
  if (a->lse.data && (st = pa_check_like(&a->lse, "lse", RLK_F32, 2, s->T, s->Hq, 0))) return st;
  const rlk_arg_ref written[] = {{&a->out, "out", 1, NULL}, {&a->lse, "lse", 1, NULL}};
  if ((st = pa_host_arrays_apart(ctx, &a->layout, s, written, 2, NULL, 0))) return st;
  if ((st = pa_asked(&call->vals, PA_PASS_FWD, s, &a->tuning))) return st;
  pa_fwd_args *f = &c->k.f.pass;
  f->q = a->q.data;
  f->k = a->k.data;
  f->v = a->v.data;
  f->seq = s->seq;
  f->grp = s->grp;
  f->P = s->P;
  f->T = s->T;
  f->out = a->out.data;
  f->lse = (float *)a->lse.data;
  f->Hq = (int32_t)s->Hq;
  f->Hkv = (int32_t)s->Hkv;
  f->scale = pa_scale(a->scale, s->D);
  return RLK_OK;
}

static rlk_status pa_fwd_select(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_prefix_attention_args *a = args;
  const void *const ptrs[] = {a->q.data, a->k.data, a->v.data, a->out.data};
  pa_call *c = (pa_call *)call;
  rlk_status st = pa_choose(ctx, c, PA_PASS_FWD, pa_unaligned(ptrs, 4));
  if (st) return st;
  if (c->p.tiled && c->s.P > 65535)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "layout.num_prompts: %lld prompts exceed the grid's 65535",
                     (long long)c->s.P);
  call->specs[0] = c->p.fwd;
  call->nspecs = 1;
  return RLK_OK;
}

/* The sm_90a forward takes its tensor maps in its struct ahead of the pass's (read by TMA where
 * they lie in parameter space). */
static rlk_status pa_fwd_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  const rlk_prefix_attention_args *a = args;
  pa_call *c = (pa_call *)call;
  const pa_shape *s = &c->s;
  const pa_plan *p = &c->p;
  rlk_status st;
  if (p->variant == PA_VARIANT_WGMMA) {
    pa_fwd_sm90_args *f = &c->k.f;
    rlk_tensor_map *const maps[4] = {&f->map_q, &f->map_k, &f->map_v, NULL};
    if ((st = pa_sm90_maps(ctx, s, a->q.data, a->k.data, a->v.data, NULL, PA_SM90_BN, maps))) return st;
    rlk_launch_dims d = rlk_op_grid((uint64_t)s->tiles[1], (uint64_t)s->P, (uint64_t)s->Hq, PA_SM90_THREADS,
                                    pa_sm90_smem((int)s->D, p->fwd_stages));
    return rlk_context_launch_params(ctx, &p->fwd, &d, stream, f);
  }
  rlk_launch_dims d;
  if (ctx->kind == RLK_BACKEND_HOST)
    d = rlk_op_grid(1, 1, 1, 1, 0);
  else if (p->variant == PA_VARIANT_MMA)
    d = rlk_op_grid((uint64_t)s->tiles[0], (uint64_t)s->P, (uint64_t)s->Hq, PA_MMA_THREADS, pa_fwd_smem((int)s->D));
  else
    d = rlk_op_grid((uint64_t)((s->T + PA_PORTABLE_WARPS - 1) / PA_PORTABLE_WARPS), (uint64_t)s->Hq, 1,
                    PA_PORTABLE_WARPS * pa_warp(ctx), 0);
  return rlk_context_launch_params(ctx, &p->fwd, &d, stream, &c->k.f.pass);
}

static const rlk_arg_field pa_fwd_fields[] = {
    RLK_ARG_IN(rlk_prefix_attention_args, q), RLK_ARG_IN(rlk_prefix_attention_args, k),
    RLK_ARG_IN(rlk_prefix_attention_args, v), RLK_ARG_OUT(rlk_prefix_attention_args, out),
    RLK_ARG_OUT(rlk_prefix_attention_args, lse), RLK_ARG_IN(rlk_prefix_attention_args, layout.seq_offsets),
    RLK_ARG_IN(rlk_prefix_attention_args, layout.group_offsets)};

static const rlk_op_entry pa_fwd_entry = {
    .name = "rlk_prefix_attention", .op = &rlk_op_prefix_attention, .call_size = sizeof(pa_call),
    RLK_OP_FIELDS(pa_fwd_fields), .validate = pa_fwd_validate, .select = pa_fwd_select, .launch = pa_fwd_launch};

RLK_OP_DEFINE_CALL(rlk_prefix_attention, rlk_prefix_attention_args, pa_fwd_entry)

/* A backward call: its shape, the kernels that run it (they size the workspace) and their
 * argument. */
static rlk_status pa_bwd_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_prefix_attention_backward_args *a = args;
  pa_call *c = (pa_call *)call;
  pa_shape *s = &c->s;
  rlk_status st = pa_check_inputs(ctx, &a->q, &a->k, &a->v, &a->layout, a->scale, s);
  if (st) return st;
  if ((st = pa_check_like(&a->out, "out", s->dtype, 3, s->T, s->Hq, s->D))) return st;
  if ((st = pa_check_like(&a->lse, "lse", RLK_F32, 2, s->T, s->Hq, 0))) return st;
  if ((st = pa_check_like(&a->grad_out, "grad_out", s->dtype, 3, s->T, s->Hq, s->D))) return st;
  if ((st = pa_check_like(&a->grad_q, "grad_q", s->dtype, 3, s->T, s->Hq, s->D))) return st;
  if ((st = pa_check_like(&a->grad_k, "grad_k", s->dtype, 3, s->T, s->Hkv, s->D))) return st;
  if ((st = pa_check_like(&a->grad_v, "grad_v", s->dtype, 3, s->T, s->Hkv, s->D))) return st;
  const void *const ptrs[] = {a->q.data,        a->k.data,      a->v.data,      a->out.data,
                              a->grad_out.data, a->grad_q.data, a->grad_k.data, a->grad_v.data};
  if ((st = pa_asked(&call->vals, PA_PASS_BWD, s, &a->tuning))) return st;
  if ((st = pa_choose(ctx, c, PA_PASS_BWD, pa_unaligned(ptrs, 8)))) return st;
  const pa_plan *p = &c->p;
  /* the tiled kernels' grids hold the prompts in y or z (the portable ones' do not), as the
   * forward's: said here, so that the workspace-size query refuses too */
  if (ctx->kind != RLK_BACKEND_HOST && p->tiled && s->P > 65535)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "layout.num_prompts: %lld prompts exceed the grid's 65535",
                     (long long)s->P);
  if (ctx->kind == RLK_BACKEND_HOST) {
    call->workspace = (size_t)(2 * s->T * s->Hkv * s->D) * sizeof(double);
    call->specs[call->nspecs++] = p->bwd_host;
  } else {
    /* delta, then with GQA the mma kernels' per-query-head f32 partial dk, dv (pa_partials in
     * the template; the portable and sm_90a dk/dv kernels sum the group's heads themselves) */
    const int partials = s->Hq > s->Hkv && p->variant == PA_VARIANT_MMA;
    call->workspace =
        (size_t)(((s->T * s->Hq + 3) & ~(int64_t)3) + (partials ? 2 * s->T * s->Hq * s->D : 0)) * sizeof(float);
  }
  const rlk_arg_ref written[] = {
      {&a->grad_q, "grad_q", 1, NULL}, {&a->grad_k, "grad_k", 1, NULL}, {&a->grad_v, "grad_v", 1, NULL}};
  if ((st = pa_host_arrays_apart(ctx, &a->layout, s, written, 3, a->workspace, a->workspace ? call->workspace : 0)))
    return st;
  pa_bwd_args *b = &c->k.b.pass;
  b->q = a->q.data;
  b->k = a->k.data;
  b->v = a->v.data;
  b->o = a->out.data;
  b->dout = a->grad_out.data;
  b->lse = (const float *)a->lse.data;
  b->work = a->workspace;
  b->seq = s->seq;
  b->grp = s->grp;
  b->P = s->P;
  b->T = s->T;
  b->dq = a->grad_q.data;
  b->dk = a->grad_k.data;
  b->dv = a->grad_v.data;
  b->Hq = (int32_t)s->Hq;
  b->Hkv = (int32_t)s->Hkv;
  b->scale = pa_scale(a->scale, s->D);
  return RLK_OK;
}

/* Every kernel of the backward takes the pass's argument, the sm_90a ones after their tensor maps.
 * The sm_90a ones: dq first (it computes each row's delta on the way and writes it for dk/dv: no
 * prep pass), then dk/dv, a block per (key head, key tile, prompt); the mma kernels: prep, dk/dv,
 * the GQA reduce, dq. */
static rlk_status pa_bwd_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  const rlk_prefix_attention_backward_args *a = args;
  pa_call *c = (pa_call *)call;
  const pa_shape *s = &c->s;
  const pa_plan *p = &c->p;
  rlk_status st;
  const pa_bwd_args *pass = &c->k.b.pass;
  if (ctx->kind == RLK_BACKEND_HOST) {
    rlk_launch_dims d = rlk_op_grid(1, 1, 1, 1, 0);
    return rlk_context_launch_params(ctx, &p->bwd_host, &d, stream, pass);
  }
  if (p->variant == PA_VARIANT_WGMMA) {
    pa_bwd_sm90_args *b = &c->k.b;
    rlk_tensor_map *const maps[4] = {&b->map_q, &b->map_k, &b->map_v, &b->map_do};
    if ((st = pa_sm90_maps(ctx, s, a->q.data, a->k.data, a->v.data, a->grad_out.data, PA_SM90_DQ_BN, maps)))
      return st;
    rlk_launch_dims d = rlk_op_grid((uint64_t)s->tiles[1], (uint64_t)s->P, (uint64_t)s->Hq, PA_SM90_THREADS,
                                    pa_sm90_dq_smem((int)s->D, p->dq_stages));
    if ((st = rlk_context_launch_params(ctx, &p->dq, &d, stream, b))) return st;
    /* the launch took its copy: the maps again with dk/dv's key tile */
    if ((st = pa_sm90_maps(ctx, s, a->q.data, a->k.data, a->v.data, a->grad_out.data, PA_SM90_BN, maps))) return st;
    /* prompts slowest, then key tiles, a prompt's heaviest first (at most 65535 key tiles: pa_choose) */
    d = rlk_op_grid((uint64_t)s->Hkv, (uint64_t)s->tiles[1], (uint64_t)s->P, PA_SM90_THREADS,
                    pa_sm90_dkdv_smem((int)s->D, p->dkdv_stages));
    return rlk_context_launch_params(ctx, &p->dkdv, &d, stream, b);
  }
  const unsigned warp = pa_warp(ctx);
  const uint64_t rows_per_block = PA_PASS_THREADS / warp; /* a warp per row */
  rlk_launch_dims d = rlk_op_grid((uint64_t)((s->T * s->Hq + rows_per_block - 1) / rows_per_block), 1, 1,
                                  PA_PASS_THREADS, 0);
  if ((st = rlk_context_launch_params(ctx, &p->prep, &d, stream, pass))) return st;
  if (p->tiled) {
    const uint64_t tiles = (uint64_t)s->tiles[0];
    d = rlk_op_grid(tiles, (uint64_t)s->P, (uint64_t)s->Hq, PA_MMA_THREADS, pa_dkdv_smem((int)s->D));
    if ((st = rlk_context_launch_params(ctx, &p->dkdv, &d, stream, pass))) return st;
    if (s->Hq > s->Hkv) {
      d = rlk_op_grid((uint64_t)((s->T * s->Hkv * s->D + PA_PASS_THREADS - 1) / PA_PASS_THREADS), 1, 1,
                      PA_PASS_THREADS, 0);
      if ((st = rlk_context_launch_params(ctx, &p->reduce, &d, stream, pass))) return st;
    }
    d = rlk_op_grid(tiles, (uint64_t)s->P, (uint64_t)s->Hq, PA_MMA_THREADS, pa_dq_smem((int)s->D));
    return rlk_context_launch_params(ctx, &p->dq, &d, stream, pass);
  }
  const uint64_t by = (uint64_t)((s->T + PA_PORTABLE_WARPS - 1) / PA_PORTABLE_WARPS);
  d = rlk_op_grid(by, (uint64_t)s->Hkv, 1, PA_PORTABLE_WARPS * warp, 0);
  if ((st = rlk_context_launch_params(ctx, &p->dkdv, &d, stream, pass))) return st;
  d = rlk_op_grid(by, (uint64_t)s->Hq, 1, PA_PORTABLE_WARPS * warp, 0);
  return rlk_context_launch_params(ctx, &p->dq, &d, stream, pass);
}

static const rlk_arg_field pa_bwd_fields[] = {
    RLK_ARG_IN(rlk_prefix_attention_backward_args, q),        RLK_ARG_IN(rlk_prefix_attention_backward_args, k),
    RLK_ARG_IN(rlk_prefix_attention_backward_args, v),        RLK_ARG_IN(rlk_prefix_attention_backward_args, out),
    RLK_ARG_IN(rlk_prefix_attention_backward_args, lse),      RLK_ARG_IN(rlk_prefix_attention_backward_args, grad_out),
    RLK_ARG_OUT(rlk_prefix_attention_backward_args, grad_q), RLK_ARG_OUT(rlk_prefix_attention_backward_args, grad_k),
    RLK_ARG_OUT(rlk_prefix_attention_backward_args, grad_v),
    RLK_ARG_IN(rlk_prefix_attention_backward_args, layout.seq_offsets),
    RLK_ARG_IN(rlk_prefix_attention_backward_args, layout.group_offsets)};

static const rlk_op_entry pa_bwd_entry = {
    .name = "rlk_prefix_attention_backward", .op = &rlk_op_prefix_attention, .call_size = sizeof(pa_call),
    RLK_OP_FIELDS(pa_bwd_fields), .workspace = RLK_OP_WORKSPACE(rlk_prefix_attention_backward_args, 16),
    .validate = pa_bwd_validate, .launch = pa_bwd_launch};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_prefix_attention_backward, rlk_prefix_attention_backward_args, pa_bwd_entry)

/* ---------------------------------------------------------------------------------- */
/* Precompile plan                                                                     */
/* ---------------------------------------------------------------------------------- */

static const char *const pa_head_dim_names[] = {"64", "128", NULL};

#define PA_KEY_DOC "a tuning key's (with q_heads, kv_heads, group, prefix, response and tokens)"

static const rlk_op_setting pa_settings[PA_NSETTINGS] = {
    [PA_S_PASS] = RLK_SET_CHOICE("pass", pa_pass_names, PA_PASS_BOTH, "pattn_fwd* pattn_bwd*",
                                 "the kernels to build"),
    [PA_S_DTYPE] = RLK_SET(pa_dtype, PA_DT_BF16, "pattn_*.dtype", "of q, k, v and the outputs"),
    [PA_S_HEAD_DIM] = RLK_SET_CHOICE("head_dim", pa_head_dim_names, 1, "pattn_*.head_dim", "D"),
    [PA_S_VARIANT] = RLK_SET_CHOICE("variant", pa_variant_names, PA_VARIANT_AUTO, "pattn_fwd* pattn_bwd*",
                                    "mma is CUDA sm_80+, wgmma sm_90a; elsewhere the portable kernels run"),
    [PA_S_FWD_STAGES] = RLK_SET_INT("fwd_stages", 0, 0, 4, "pattn_fwd_sm90.stages",
                                    "wgmma forward's K/V stages, 0 for the default (2); a depth that does not fit "
                                    "runs the default"),
    [PA_S_DKDV_STAGES] = RLK_SET_INT("dkdv_stages", 0, 0, 4, "pattn_bwd_dkdv_sm90.stages",
                                     "wgmma dk/dv kernel's Q/dO stages, 0 for the default (4)"),
    [PA_S_DQ_STAGES] = RLK_SET_INT("dq_stages", 0, 0, 4, "pattn_bwd_dq_sm90.stages",
                                   "wgmma dq kernel's K/V stages, 0 for the default (3)"),
    [PA_S_Q_HEADS] = RLK_SET_INT("q_heads", 0, 1, 65535, "", "Hq, " PA_KEY_DOC),
    [PA_S_KV_HEADS] = RLK_SET_INT("kv_heads", 0, 1, 65535, "", "Hkv, " PA_KEY_DOC),
    [PA_S_GROUP] = RLK_SET_BUCKETED("group", -1, 0, INT32_MAX, "responses per prompt, " PA_KEY_DOC),
    [PA_S_PREFIX] = RLK_SET_BUCKETED("prefix", -1, 0, INT32_MAX, "prefix tokens per prompt, " PA_KEY_DOC),
    [PA_S_RESPONSE] = RLK_SET_BUCKETED("response", 0, 1, INT32_MAX, "tokens per response, " PA_KEY_DOC),
    [PA_S_TOKENS] = RLK_SET_BUCKETED("tokens", 0, 1, INT32_MAX,
                                "T, " PA_KEY_DOC "; with all of them and no tuning settings, the plan is the "
                                "tuning database's winner for them on this context"),
};

/* ---- tuning ---- */

/* The tuning settings, in the order of a winner's values (rlk_tune_entry_values). */
enum { PA_TUNE_VARIANT, PA_TUNE_FWD_STAGES, PA_TUNE_DKDV_STAGES, PA_TUNE_DQ_STAGES, PA_NTUNE };
static const int pa_tuning[PA_NTUNE] = {PA_S_VARIANT, PA_S_FWD_STAGES, PA_S_DKDV_STAGES, PA_S_DQ_STAGES};

/* What a sweep tool times against the default (each valid on every target: a setting a target
 * cannot honour falls back, and identical kernels time alike). Not variant=mma: on sm_90a it ran
 * 3-4x slower than wgmma at every shape swept (H200), elsewhere it is the default. */
static const char *const pa_candidates[] = {"fwd_stages=3", "fwd_stages=4", "dkdv_stages=2", "dkdv_stages=3",
                                            "dq_stages=2",  "dq_stages=4",  NULL};

static int pa_parse_tuning(const char *settings, int64_t values[RLK_TUNE_VALUES]) {
  return rlk_op_tuning_values(&rlk_op_prefix_attention, pa_tuning, PA_NTUNE, settings, values);
}

static int pa_tuning_given(const rlk_op_values *s) {
  return s->v[PA_S_VARIANT] || s->v[PA_S_FWD_STAGES] || s->v[PA_S_DKDV_STAGES] || s->v[PA_S_DQ_STAGES];
}

static int pa_tune_shape(int pass, int dtype, int D, const pa_tune_problem *t, char *buf, size_t size) {
  return rlk_format(buf, size, "pass=%s dtype=%s head_dim=%d q_heads=%lld kv_heads=%lld group=%lld prefix=%lld "
                    "response=%lld", pa_pass_names[pass], pa_dt_names[dtype], D, (long long)t->Hq,
                    (long long)t->Hkv, (long long)rlk_tune_bucket(t->group), (long long)rlk_tune_bucket(t->prefix),
                    (long long)rlk_tune_bucket(t->response));
}

/* The tuning settings of s from the tuning database's winner for this problem, when s asks for
 * none (and RLK_PREFIX_ATTENTION_VARIANT is unset); a winner that does not parse is warned about
 * once and the default runs. */
/* The environment lets calls read the database: RLK_PREFIX_ATTENTION_VARIANT forces no variant. */
static int pa_reads_tuning(void) { return pa_env_override() == PA_VARIANT_AUTO; }

static void pa_tuned(const rlk_context *ctx, int pass, const pa_tune_problem *t, rlk_op_values *s) {
  if (pa_tuning_given(s) || !pa_reads_tuning()) return;
  char shape[256];
  int64_t v[RLK_TUNE_VALUES];
  if (pa_tune_shape(pass, (int)s->v[PA_S_DTYPE], s->v[PA_S_HEAD_DIM] ? 128 : 64, t, shape, sizeof shape) < 0 ||
      !rlk_op_tuned(ctx, &rlk_op_prefix_attention, shape, t->T, pa_parse_tuning, v))
    return;
  for (int i = 0; i < PA_NTUNE; i++) s->v[pa_tuning[i]] = v[i];
}

/* A call's problem as its tuning key sees it. */
static pa_tune_problem pa_call_problem(const pa_shape *s) {
  const int64_t responses = s->S - s->P, rtokens = s->T - s->prefix_tokens;
  pa_tune_problem t = {s->Hq, s->Hkv, (responses + s->P / 2) / s->P, (s->prefix_tokens + s->P / 2) / s->P,
                       responses ? (rtokens + responses / 2) / responses : 0, s->T};
  return t;
}

/* A configuration line's problem: 1 when it names all of it. */
static int pa_line_problem(const rlk_op_values *s, pa_tune_problem *t) {
  for (int k = PA_S_Q_HEADS; k <= PA_S_TOKENS; k++)
    if (!RLK_OP_GIVEN(s, k)) return 0;
  pa_tune_problem p = {s->v[PA_S_Q_HEADS], s->v[PA_S_KV_HEADS], s->v[PA_S_GROUP],
                       s->v[PA_S_PREFIX], s->v[PA_S_RESPONSE], s->v[PA_S_TOKENS]};
  *t = p;
  return 1;
}

/* The tuning database key of plan settings: one pass, the whole problem, no tuning settings. */
static rlk_status pa_tune_key(const rlk_op_values *s, char *shape, size_t size, int64_t *tokens) {
  const int pass = (int)s->v[PA_S_PASS];
  if (pass == PA_PASS_BOTH)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "pass: a tuning key names one pass, fwd or bwd");
  pa_tune_problem t;
  if (!pa_line_problem(s, &t))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "q_heads, kv_heads, group, prefix, response, tokens: a tuning key needs all of them");
  if (t.Hq % t.Hkv)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "q_heads: %lld is not a multiple of kv_heads %lld", (long long)t.Hq,
                     (long long)t.Hkv);
  if (pa_tuning_given(s))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "variant, fwd_stages, dkdv_stages, dq_stages: a tuning key holds no tuning settings");
  if (pa_tune_shape(pass, (int)s->v[PA_S_DTYPE], s->v[PA_S_HEAD_DIM] ? 128 : 64, &t, shape, size) < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "prefix_attention: the shape does not fit %zu bytes", size);
  *tokens = rlk_tune_bucket(t.T);
  return RLK_OK;
}

static rlk_status pa_plan_line(const rlk_context *ctx, const rlk_op_values *s, rlk_kernel_spec *specs,
                               size_t *nspecs) {
  rlk_op_values asked = *s;
  const int pass = (int)s->v[PA_S_PASS];
  pa_tune_problem t;
  if (pass != PA_PASS_BOTH && pa_line_problem(s, &t)) pa_tuned(ctx, pass, &t, &asked);
  pa_plan p;
  rlk_status st = pa_select(ctx, &asked, 0, &p);
  if (st) return st;
  size_t n = 0;
  if (pass != PA_PASS_BWD) specs[n++] = p.fwd;
  if (pass != PA_PASS_FWD) {
    if (ctx->kind == RLK_BACKEND_HOST) {
      specs[n++] = p.bwd_host;
    } else {
      if (p.variant == PA_VARIANT_WGMMA) { /* dq computes delta (no prep); dk/dv sums the GQA heads (no reduce) */
        specs[n++] = p.dq;
        specs[n++] = p.dkdv;
      } else {
        specs[n++] = p.prep;
        specs[n++] = p.dkdv;
        if (p.tiled) specs[n++] = p.reduce;
        specs[n++] = p.dq;
      }
    }
  }
  *nspecs = n;
  return RLK_OK;
}

static const char *const pa_samples[] = {
    "prefix_attention pass=both dtype=bf16 head_dim=128",
    "prefix_attention pass=both dtype=f16 head_dim=64 variant=mma",
    "prefix_attention pass=both dtype=bf16 head_dim=64 variant=portable",
    "prefix_attention pass=both dtype=f16 head_dim=128 variant=portable",
    /* the wgmma kernels' other ring depths (elsewhere the default kernels above) */
    "prefix_attention pass=both dtype=bf16 head_dim=64 fwd_stages=4 dkdv_stages=2 dq_stages=4",
    "prefix_attention pass=both dtype=f16 head_dim=128 fwd_stages=3 dkdv_stages=3 dq_stages=2",
    NULL};

/* A call's recorded line: the variant RLK_PREFIX_ATTENTION_VARIANT forced where it asked for
 * auto. */
static void pa_recorded(rlk_op_values *s) {
  if (!s->v[PA_S_VARIANT]) s->v[PA_S_VARIANT] = pa_env_override();
}

const rlk_op_desc rlk_op_prefix_attention = {
    .name = "prefix_attention", .settings = pa_settings, .nsettings = PA_NSETTINGS, .plan = pa_plan_line,
    .samples = pa_samples, .candidates = pa_candidates, .tune_key = pa_tune_key, .recorded = pa_recorded,
    .reads_tuning = pa_reads_tuning};
