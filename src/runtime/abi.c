/* abi.c - the sizes of the public structs and the values of the public enums, for bindings that
 * mirror them in another language.
 *
 * One row per struct of include/rlk.h that a caller fills or reads (the ops' come from
 * runtime/op_list.h). A binding compares its own layout's size with the row before it passes a
 * struct in, so a package built against one header never hands a struct of the wrong size to a
 * library built from another. One row per enum constant of the header, its value taken from the
 * constant itself (a constant renamed or removed does not compile; python/tests/test_abi.py
 * checks that every constant of the header has its row, under its enum). */
#include <string.h>

#include "core/core.h"
#include "runtime/op_list.h"

typedef struct abi_row {
  const char *name;
  size_t size;
} abi_row;

#define ABI_ROW(type) {#type, sizeof(type)}
#define ABI_ROW_OF_OP(type) ABI_ROW(type),

static const abi_row abi_rows[] = {
    ABI_ROW(rlk_context_options),
    ABI_ROW(rlk_device_info),
    ABI_ROW(rlk_counters),
    ABI_ROW(rlk_tensor),
    ABI_ROW(rlk_cache_entry),
    RLK_OP_LIST(RLK_OP_LIST_SKIP, ABI_ROW_OF_OP, RLK_OP_LIST_SKIP)
    ABI_ROW(rlk_tune_timing),
    ABI_ROW(rlk_tune_record),
};

size_t rlk_abi_struct_size(const char *name) {
  if (!name) return 0;
  for (size_t i = 0; i < sizeof abi_rows / sizeof abi_rows[0]; i++)
    if (!strcmp(abi_rows[i].name, name)) return abi_rows[i].size;
  return 0;
}

typedef struct abi_enum_row {
  const char *type; /* the enum's typedef name; NULL for the unnamed ones */
  const char *name;
  int value;
} abi_enum_row;

#define ABI_ENUM(type, constant) {#type, #constant, (int)(constant)}
#define ABI_CONSTANT(constant) {NULL, #constant, (int)(constant)}

static const abi_enum_row abi_enum_rows[] = {
    /* rlk_status */
    ABI_ENUM(rlk_status, RLK_OK), ABI_ENUM(rlk_status, RLK_ERR_INVALID_ARGUMENT),
    ABI_ENUM(rlk_status, RLK_ERR_UNSUPPORTED), ABI_ENUM(rlk_status, RLK_ERR_UNAVAILABLE),
    ABI_ENUM(rlk_status, RLK_ERR_COMPILE), ABI_ENUM(rlk_status, RLK_ERR_JIT_DISABLED),
    ABI_ENUM(rlk_status, RLK_ERR_CACHE), ABI_ENUM(rlk_status, RLK_ERR_BACKEND),
    ABI_ENUM(rlk_status, RLK_ERR_OUT_OF_MEMORY), ABI_ENUM(rlk_status, RLK_ERR_IO),
    ABI_ENUM(rlk_status, RLK_ERR_TIMEOUT), ABI_ENUM(rlk_status, RLK_ERR_INTERNAL),
    /* rlk_backend */
    ABI_ENUM(rlk_backend, RLK_BACKEND_AUTO), ABI_ENUM(rlk_backend, RLK_BACKEND_CUDA),
    ABI_ENUM(rlk_backend, RLK_BACKEND_HIP), ABI_ENUM(rlk_backend, RLK_BACKEND_HOST),
    /* rlk_log_level */
    ABI_ENUM(rlk_log_level, RLK_LOG_DEFAULT), ABI_ENUM(rlk_log_level, RLK_LOG_ERROR),
    ABI_ENUM(rlk_log_level, RLK_LOG_WARN), ABI_ENUM(rlk_log_level, RLK_LOG_INFO),
    ABI_ENUM(rlk_log_level, RLK_LOG_DEBUG),
    /* rlk_dtype */
    ABI_ENUM(rlk_dtype, RLK_DTYPE_INVALID), ABI_ENUM(rlk_dtype, RLK_F32),
    ABI_ENUM(rlk_dtype, RLK_F16), ABI_ENUM(rlk_dtype, RLK_BF16), ABI_ENUM(rlk_dtype, RLK_F64),
    ABI_ENUM(rlk_dtype, RLK_I32), ABI_ENUM(rlk_dtype, RLK_I64), ABI_ENUM(rlk_dtype, RLK_BOOL),
    /* rlk_advantage_mode */
    ABI_ENUM(rlk_advantage_mode, RLK_ADV_GRPO), ABI_ENUM(rlk_advantage_mode, RLK_ADV_MEAN_ONLY),
    ABI_ENUM(rlk_advantage_mode, RLK_ADV_RLOO), ABI_ENUM(rlk_advantage_mode, RLK_ADV_BATCH_STD),
    ABI_ENUM(rlk_advantage_mode, RLK_ADV_OPO), ABI_ENUM(rlk_advantage_mode, RLK_ADV_PASSK),
    ABI_ENUM(rlk_advantage_mode, RLK_ADV_PASSK_UNSCALED),
    /* rlk_singleton_policy */
    ABI_ENUM(rlk_singleton_policy, RLK_SINGLETON_MEAN0_STD1),
    ABI_ENUM(rlk_singleton_policy, RLK_SINGLETON_ZERO),
    /* rlk_nan_scores */
    ABI_ENUM(rlk_nan_scores, RLK_NAN_SCORES_PROPAGATE),
    ABI_ENUM(rlk_nan_scores, RLK_NAN_SCORES_UNSCORABLE),
    /* rlk_loss_agg */
    ABI_ENUM(rlk_loss_agg, RLK_AGG_TOKEN_MEAN), ABI_ENUM(rlk_loss_agg, RLK_AGG_TOKEN_SUM),
    ABI_ENUM(rlk_loss_agg, RLK_AGG_SEQ_MEAN_TOKEN_SUM),
    ABI_ENUM(rlk_loss_agg, RLK_AGG_SEQ_MEAN_TOKEN_MEAN),
    ABI_ENUM(rlk_loss_agg, RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM),
    /* rlk_policy_loss_mode */
    ABI_ENUM(rlk_policy_loss_mode, RLK_POLICY_PPO), ABI_ENUM(rlk_policy_loss_mode, RLK_POLICY_GSPO),
    ABI_ENUM(rlk_policy_loss_mode, RLK_POLICY_CISPO),
    ABI_ENUM(rlk_policy_loss_mode, RLK_POLICY_SAPO),
    ABI_ENUM(rlk_policy_loss_mode, RLK_POLICY_REINFORCE),
    ABI_ENUM(rlk_policy_loss_mode, RLK_POLICY_GEO_MEAN),
    /* rlk_seq_ratio_grad */
    ABI_ENUM(rlk_seq_ratio_grad, RLK_SEQ_RATIO_STRAIGHT_THROUGH),
    ABI_ENUM(rlk_seq_ratio_grad, RLK_SEQ_RATIO_THROUGH_MEAN),
    /* rlk_kl_estimator */
    ABI_ENUM(rlk_kl_estimator, RLK_KL_K1), ABI_ENUM(rlk_kl_estimator, RLK_KL_ABS),
    ABI_ENUM(rlk_kl_estimator, RLK_KL_K2), ABI_ENUM(rlk_kl_estimator, RLK_KL_K3),
    /* unnamed: the metric slots */
    ABI_CONSTANT(RLK_PL_METRIC_CLIPFRAC), ABI_CONSTANT(RLK_PL_METRIC_CLIPFRAC_LOWER),
    ABI_CONSTANT(RLK_PL_METRIC_CLIP_LOW), ABI_CONSTANT(RLK_PL_METRIC_CLIP_HIGH),
    ABI_CONSTANT(RLK_PL_METRIC_APPROX_KL), ABI_CONSTANT(RLK_PL_METRIC_KL_MEAN),
    ABI_CONSTANT(RLK_PL_METRIC_ENTROPY_MEAN), ABI_CONSTANT(RLK_PL_METRIC_RATIO_MAX),
    ABI_CONSTANT(RLK_PL_METRIC_RATIO_MIN), ABI_CONSTANT(RLK_PL_METRIC_PG_LOSS),
    ABI_CONSTANT(RLK_PL_METRIC_KL_LOSS), ABI_CONSTANT(RLK_PL_METRIC_ENTROPY_LOSS),
    ABI_CONSTANT(RLK_PL_METRIC_MASK_SUM), ABI_CONSTANT(RLK_PL_METRIC_APPROX_KL_RAW),
    ABI_CONSTANT(RLK_PL_METRIC_SEQ_CLIP_LOW), ABI_CONSTANT(RLK_PL_METRIC_SEQ_CLIP_HIGH),
    ABI_CONSTANT(RLK_POLICY_LOSS_METRICS),
    /* unnamed: the metric slots */
    ABI_CONSTANT(RLK_VL_METRIC_CLIPFRAC), ABI_CONSTANT(RLK_VL_METRIC_VALUE_MEAN),
    ABI_CONSTANT(RLK_VL_METRIC_ERROR_MEAN), ABI_CONSTANT(RLK_VL_METRIC_MASK_SUM),
    ABI_CONSTANT(RLK_VALUE_LOSS_METRICS),
    /* rlk_scan_algo */
    ABI_ENUM(rlk_scan_algo, RLK_SCAN_AUTO), ABI_ENUM(rlk_scan_algo, RLK_SCAN_ROW_WARP),
    ABI_ENUM(rlk_scan_algo, RLK_SCAN_ROW_BLOCK),
    /* rlk_gae_masked */
    ABI_ENUM(rlk_gae_masked, RLK_GAE_MASKED_SKIP), ABI_ENUM(rlk_gae_masked, RLK_GAE_MASKED_ZERO),
    /* rlk_returns_masked */
    ABI_ENUM(rlk_returns_masked, RLK_RETURNS_MASKED_RESET),
    ABI_ENUM(rlk_returns_masked, RLK_RETURNS_MASKED_ZERO),
    ABI_ENUM(rlk_returns_masked, RLK_RETURNS_MASKED_CARRY),
    /* rlk_whiten_eps */
    ABI_ENUM(rlk_whiten_eps, RLK_WHITEN_EPS_ADD), ABI_ENUM(rlk_whiten_eps, RLK_WHITEN_EPS_CLAMP),
    /* rlk_whiten_masked */
    ABI_ENUM(rlk_whiten_masked, RLK_WHITEN_MASKED_APPLY),
    ABI_ENUM(rlk_whiten_masked, RLK_WHITEN_MASKED_ZERO),
    /* rlk_logprob_variant */
    ABI_ENUM(rlk_logprob_variant, RLK_LOGPROB_VARIANT_AUTO),
    ABI_ENUM(rlk_logprob_variant, RLK_LOGPROB_VARIANT_VEC),
    ABI_ENUM(rlk_logprob_variant, RLK_LOGPROB_VARIANT_BULK),
    ABI_ENUM(rlk_logprob_variant, RLK_LOGPROB_VARIANT_TMA),
    /* rlk_linear_logprob_variant */
    ABI_ENUM(rlk_linear_logprob_variant, RLK_LINEAR_LOGPROB_AUTO),
    ABI_ENUM(rlk_linear_logprob_variant, RLK_LINEAR_LOGPROB_WGMMA),
    ABI_ENUM(rlk_linear_logprob_variant, RLK_LINEAR_LOGPROB_TILED),
    /* rlk_linear_policy_loss_path */
    ABI_ENUM(rlk_linear_policy_loss_path, RLK_LPL_AUTO),
    ABI_ENUM(rlk_linear_policy_loss_path, RLK_LPL_RECOMPUTE),
    ABI_ENUM(rlk_linear_policy_loss_path, RLK_LPL_TOKEN_CHUNKS),
    /* rlk_divergence_mode */
    ABI_ENUM(rlk_divergence_mode, RLK_DIVERGENCE_FORWARD_KL),
    ABI_ENUM(rlk_divergence_mode, RLK_DIVERGENCE_REVERSE_KL),
    ABI_ENUM(rlk_divergence_mode, RLK_DIVERGENCE_JSD),
    /* rlk_prefix_attention_variant */
    ABI_ENUM(rlk_prefix_attention_variant, RLK_PREFIX_ATTENTION_VARIANT_AUTO),
    ABI_ENUM(rlk_prefix_attention_variant, RLK_PREFIX_ATTENTION_VARIANT_PORTABLE),
    ABI_ENUM(rlk_prefix_attention_variant, RLK_PREFIX_ATTENTION_VARIANT_MMA),
    ABI_ENUM(rlk_prefix_attention_variant, RLK_PREFIX_ATTENTION_VARIANT_WGMMA),
    /* rlk_tune_result */
    ABI_ENUM(rlk_tune_result, RLK_TUNE_TIMED), ABI_ENUM(rlk_tune_result, RLK_TUNE_REJECTED),
    ABI_ENUM(rlk_tune_result, RLK_TUNE_FAILED),
};

const char *rlk_abi_enum_constant(size_t i, const char **type, int *value) {
  if (i >= sizeof abi_enum_rows / sizeof abi_enum_rows[0]) return NULL;
  if (type) *type = abi_enum_rows[i].type;
  if (value) *value = abi_enum_rows[i].value;
  return abi_enum_rows[i].name;
}
