/* op_table.c - every op family, for the runtime's precompile, help and recording: adding an
 * op is one line here (and its extern in ops.h). */
#include <stddef.h>

#include "ops/ops.h"

const rlk_op_desc *const rlk_op_table[] = {&rlk_op_group_advantage, &rlk_op_policy_loss, &rlk_op_value_loss, &rlk_op_gae, &rlk_op_discounted_returns, &rlk_op_reverse_cumsum,
                                           &rlk_op_masked_whiten, &rlk_op_logprob, &rlk_op_logprob_shard, &rlk_op_sample, &rlk_op_prefix_attention,
                                           &rlk_op_linear_logprob, &rlk_op_token_baseline,
                                           &rlk_op_token_kl, NULL};
