/* abi.c - the sizes of the public structs, for bindings that mirror them in another language.
 *
 * One row per struct of include/rlk.h that a caller fills or reads. A binding compares its
 * own layout's size with the row before it passes a struct in, so a package built against one
 * header never hands a struct of the wrong size to a library built from another. */
#include <string.h>

#include "core/core.h"

typedef struct abi_row {
  const char *name;
  size_t size;
} abi_row;

#define ABI_ROW(type) {#type, sizeof(type)}

static const abi_row abi_rows[] = {
    ABI_ROW(rlk_context_options),
    ABI_ROW(rlk_device_info),
    ABI_ROW(rlk_counters),
    ABI_ROW(rlk_tensor),
    ABI_ROW(rlk_cache_entry),
    ABI_ROW(rlk_group_advantage_args),
    ABI_ROW(rlk_token_baseline_args),
    ABI_ROW(rlk_token_kl_args),
    ABI_ROW(rlk_policy_loss_args),
    ABI_ROW(rlk_value_loss_args),
    ABI_ROW(rlk_gae_args),
    ABI_ROW(rlk_discounted_returns_args),
    ABI_ROW(rlk_reverse_cumsum_args),
    ABI_ROW(rlk_masked_whiten_args),
    ABI_ROW(rlk_logprob_args),
    ABI_ROW(rlk_logprob_backward_args),
    ABI_ROW(rlk_logprob_combine_args),
    ABI_ROW(rlk_logprob_vocab_parallel_args),
    ABI_ROW(rlk_sample_args),
    ABI_ROW(rlk_linear_logprob_args),
    ABI_ROW(rlk_linear_logprob_backward_args),
    ABI_ROW(rlk_linear_policy_loss_args),
    ABI_ROW(rlk_prefix_attention_layout),
    ABI_ROW(rlk_prefix_attention_tuning),
    ABI_ROW(rlk_prefix_attention_args),
    ABI_ROW(rlk_prefix_attention_backward_args),
    ABI_ROW(rlk_tune_timing),
    ABI_ROW(rlk_tune_record),
};

size_t rlk_abi_struct_size(const char *name) {
  if (!name) return 0;
  for (size_t i = 0; i < sizeof abi_rows / sizeof abi_rows[0]; i++)
    if (!strcmp(abi_rows[i].name, name)) return abi_rows[i].size;
  return 0;
}
