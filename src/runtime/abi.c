/* abi.c - the sizes of the public structs and the values of the public enums, for bindings that
 * mirror them in another language.
 *
 * One row per struct of include/rlk.h that a caller fills or reads (the ops' come from
 * runtime/op_list.h). A binding compares its own layout's size with the row before it passes a
 * struct in, so a package built against one header never hands a struct of the wrong size to a
 * library built from another. For each enum of the header a row, then one row per constant of
 * it, the value taken from the constant itself (a constant renamed or removed does not compile;
 * python/tests/test_abi.py checks that every constant of the header has its row, under its
 * enum). */
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
  const char *type; /* an enum's row: its typedef name, or NULL for an unnamed enum */
  const char *name; /* a constant's row: its name (NULL in an enum's row) */
  int value;
} abi_enum_row;

#define ENUM(type) {#type, NULL, 0}
#define UNNAMED_ENUM {NULL, NULL, 0}
#define VALUE(constant) {NULL, #constant, (int)(constant)}

static const abi_enum_row abi_enum_rows[] = {
    ENUM(rlk_status), VALUE(RLK_OK), VALUE(RLK_ERR_INVALID_ARGUMENT), VALUE(RLK_ERR_UNSUPPORTED),
        VALUE(RLK_ERR_UNAVAILABLE), VALUE(RLK_ERR_COMPILE), VALUE(RLK_ERR_JIT_DISABLED), VALUE(RLK_ERR_CACHE),
        VALUE(RLK_ERR_BACKEND), VALUE(RLK_ERR_OUT_OF_MEMORY), VALUE(RLK_ERR_IO), VALUE(RLK_ERR_TIMEOUT),
        VALUE(RLK_ERR_INTERNAL),
    ENUM(rlk_backend), VALUE(RLK_BACKEND_AUTO), VALUE(RLK_BACKEND_CUDA), VALUE(RLK_BACKEND_HIP),
        VALUE(RLK_BACKEND_HOST),
    ENUM(rlk_log_level), VALUE(RLK_LOG_DEFAULT), VALUE(RLK_LOG_ERROR), VALUE(RLK_LOG_WARN), VALUE(RLK_LOG_INFO),
        VALUE(RLK_LOG_DEBUG),
    ENUM(rlk_dtype), VALUE(RLK_DTYPE_INVALID), VALUE(RLK_F32), VALUE(RLK_F16), VALUE(RLK_BF16), VALUE(RLK_F64),
        VALUE(RLK_I32), VALUE(RLK_I64), VALUE(RLK_BOOL),
    ENUM(rlk_advantage_mode), VALUE(RLK_ADV_GRPO), VALUE(RLK_ADV_MEAN_ONLY), VALUE(RLK_ADV_RLOO),
        VALUE(RLK_ADV_BATCH_STD), VALUE(RLK_ADV_OPO), VALUE(RLK_ADV_PASSK), VALUE(RLK_ADV_PASSK_UNSCALED),
    ENUM(rlk_singleton_policy), VALUE(RLK_SINGLETON_MEAN0_STD1), VALUE(RLK_SINGLETON_ZERO),
    ENUM(rlk_nan_scores), VALUE(RLK_NAN_SCORES_PROPAGATE), VALUE(RLK_NAN_SCORES_UNSCORABLE),
    ENUM(rlk_loss_agg), VALUE(RLK_AGG_TOKEN_MEAN), VALUE(RLK_AGG_TOKEN_SUM), VALUE(RLK_AGG_SEQ_MEAN_TOKEN_SUM),
        VALUE(RLK_AGG_SEQ_MEAN_TOKEN_MEAN), VALUE(RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM),
    ENUM(rlk_policy_loss_mode), VALUE(RLK_POLICY_PPO), VALUE(RLK_POLICY_GSPO), VALUE(RLK_POLICY_CISPO),
        VALUE(RLK_POLICY_SAPO), VALUE(RLK_POLICY_REINFORCE), VALUE(RLK_POLICY_GEO_MEAN),
    ENUM(rlk_seq_ratio_grad), VALUE(RLK_SEQ_RATIO_STRAIGHT_THROUGH), VALUE(RLK_SEQ_RATIO_THROUGH_MEAN),
    ENUM(rlk_kl_estimator), VALUE(RLK_KL_K1), VALUE(RLK_KL_ABS), VALUE(RLK_KL_K2), VALUE(RLK_KL_K3),
    UNNAMED_ENUM, VALUE(RLK_PL_METRIC_CLIPFRAC), VALUE(RLK_PL_METRIC_CLIPFRAC_LOWER),
        VALUE(RLK_PL_METRIC_CLIP_LOW), VALUE(RLK_PL_METRIC_CLIP_HIGH), VALUE(RLK_PL_METRIC_APPROX_KL),
        VALUE(RLK_PL_METRIC_KL_MEAN), VALUE(RLK_PL_METRIC_ENTROPY_MEAN), VALUE(RLK_PL_METRIC_RATIO_MAX),
        VALUE(RLK_PL_METRIC_RATIO_MIN), VALUE(RLK_PL_METRIC_PG_LOSS), VALUE(RLK_PL_METRIC_KL_LOSS),
        VALUE(RLK_PL_METRIC_ENTROPY_LOSS), VALUE(RLK_PL_METRIC_MASK_SUM), VALUE(RLK_PL_METRIC_APPROX_KL_RAW),
        VALUE(RLK_PL_METRIC_SEQ_CLIP_LOW), VALUE(RLK_PL_METRIC_SEQ_CLIP_HIGH), VALUE(RLK_POLICY_LOSS_METRICS),
    UNNAMED_ENUM, VALUE(RLK_VL_METRIC_CLIPFRAC), VALUE(RLK_VL_METRIC_VALUE_MEAN),
        VALUE(RLK_VL_METRIC_ERROR_MEAN), VALUE(RLK_VL_METRIC_MASK_SUM), VALUE(RLK_VALUE_LOSS_METRICS),
    ENUM(rlk_scan_algo), VALUE(RLK_SCAN_AUTO), VALUE(RLK_SCAN_ROW_WARP), VALUE(RLK_SCAN_ROW_BLOCK),
    ENUM(rlk_gae_masked), VALUE(RLK_GAE_MASKED_SKIP), VALUE(RLK_GAE_MASKED_ZERO),
    ENUM(rlk_returns_masked), VALUE(RLK_RETURNS_MASKED_RESET), VALUE(RLK_RETURNS_MASKED_ZERO),
        VALUE(RLK_RETURNS_MASKED_CARRY),
    ENUM(rlk_whiten_eps), VALUE(RLK_WHITEN_EPS_ADD), VALUE(RLK_WHITEN_EPS_CLAMP),
    ENUM(rlk_whiten_masked), VALUE(RLK_WHITEN_MASKED_APPLY), VALUE(RLK_WHITEN_MASKED_ZERO),
    ENUM(rlk_logprob_variant), VALUE(RLK_LOGPROB_VARIANT_AUTO), VALUE(RLK_LOGPROB_VARIANT_VEC),
        VALUE(RLK_LOGPROB_VARIANT_BULK), VALUE(RLK_LOGPROB_VARIANT_TMA),
    ENUM(rlk_linear_logprob_variant), VALUE(RLK_LINEAR_LOGPROB_AUTO), VALUE(RLK_LINEAR_LOGPROB_WGMMA),
        VALUE(RLK_LINEAR_LOGPROB_TILED),
    ENUM(rlk_linear_policy_loss_path), VALUE(RLK_LPL_AUTO), VALUE(RLK_LPL_RECOMPUTE),
        VALUE(RLK_LPL_TOKEN_CHUNKS),
    ENUM(rlk_divergence_mode), VALUE(RLK_DIVERGENCE_FORWARD_KL), VALUE(RLK_DIVERGENCE_REVERSE_KL),
        VALUE(RLK_DIVERGENCE_JSD),
    ENUM(rlk_prefix_attention_variant), VALUE(RLK_PREFIX_ATTENTION_VARIANT_AUTO),
        VALUE(RLK_PREFIX_ATTENTION_VARIANT_PORTABLE), VALUE(RLK_PREFIX_ATTENTION_VARIANT_MMA),
        VALUE(RLK_PREFIX_ATTENTION_VARIANT_WGMMA),
    ENUM(rlk_tune_result), VALUE(RLK_TUNE_TIMED), VALUE(RLK_TUNE_REJECTED), VALUE(RLK_TUNE_FAILED),
};

const char *rlk_abi_enum_constant(size_t i, const char **type, int *value) {
  const char *enum_type = NULL;
  for (size_t r = 0; r < sizeof abi_enum_rows / sizeof abi_enum_rows[0]; r++) {
    const abi_enum_row *row = &abi_enum_rows[r];
    if (!row->name) {
      enum_type = row->type;
    } else if (i-- == 0) {
      if (type) *type = enum_type;
      if (value) *value = row->value;
      return row->name;
    }
  }
  return NULL;
}
