/* op_list.h - every op, once: the op table (src/ops/op_table.c), the ABI rows of the ops' public
 * structs (abi.c) and the registration of their test suites (tests/suites.h) are made from it.
 *
 * A row is one op family, in three kinds of cell:
 *   OP(name)     its configuration-line family, const rlk_op_desc rlk_op_<name> in src/ops/
 *                (rlk_precompile, rlk_precompile_help, RLK_JIT_RECORD; rlk_precompile_ops lists
 *                them in this order)
 *   ARGS(type)   a public struct of include/rlk.h that its calls take (rlk_abi_struct_size)
 *   SUITE(name)  the Check suite that tests it, Suite *<name>_suite(void) in tests/ (the op suites
 *                run first, in this order: the rows go by their suites' running time, the longest
 *                first, so that parallel runs finish together)
 * A new op is one row: OP(foo) ARGS(rlk_foo_args) SUITE(foo). A test (tests/test_ops.c) counts the
 * op descriptors, public structs and suites the tree defines against this list. */
#ifndef RLK_RUNTIME_OP_LIST_H
#define RLK_RUNTIME_OP_LIST_H

/* clang-format off */
#define RLK_OP_LIST(OP, ARGS, SUITE)                                                                     \
  OP(sample)             ARGS(rlk_sample_args)                 SUITE(sample)                             \
  OP(prefix_attention)   ARGS(rlk_prefix_attention_args)       SUITE(prefix_attention)                   \
                         ARGS(rlk_prefix_attention_backward_args)                                        \
                         ARGS(rlk_prefix_attention_layout)                                               \
                         ARGS(rlk_prefix_attention_tuning)                                               \
  OP(policy_loss)        ARGS(rlk_policy_loss_args)            SUITE(policy_loss)                        \
  OP(value_loss)         ARGS(rlk_value_loss_args)                                                       \
  OP(group_advantage)    ARGS(rlk_group_advantage_args)        SUITE(group_advantage)                    \
  OP(linear_logprob)     ARGS(rlk_linear_logprob_args)         SUITE(linear_logprob)                     \
                         ARGS(rlk_linear_logprob_backward_args)                                          \
                         ARGS(rlk_linear_policy_loss_args)                                               \
                         ARGS(rlk_linear_sample_args)                                                    \
  OP(linear_divergence)  ARGS(rlk_linear_divergence_args)      SUITE(linear_divergence)                  \
                         ARGS(rlk_linear_divergence_backward_args)                                       \
                         ARGS(rlk_linear_divergence_combine_args)                                        \
  OP(token_baseline)     ARGS(rlk_token_baseline_args)         SUITE(token_baseline)                     \
  OP(token_kl)           ARGS(rlk_token_kl_args)               SUITE(token_kl)                           \
  OP(logprob)            ARGS(rlk_logprob_args)                SUITE(logprob)                            \
                         ARGS(rlk_logprob_backward_args)                                                 \
  OP(gae)                ARGS(rlk_gae_args)                    SUITE(advantage_scan)                     \
  OP(discounted_returns) ARGS(rlk_discounted_returns_args)                                               \
  OP(reverse_cumsum)     ARGS(rlk_reverse_cumsum_args)                                                   \
  OP(masked_whiten)      ARGS(rlk_masked_whiten_args)                                                    \
  OP(logprob_shard)      ARGS(rlk_logprob_combine_args)        SUITE(logprob_shard)                      \
                         ARGS(rlk_logprob_vocab_parallel_args)
/* clang-format on */

/* A cell a user of the list leaves out. */
#define RLK_OP_LIST_SKIP(x)

/* The op families, and the number of the list's op-descriptor cells (what rlk_op_table holds). */
#define RLK_OP_LIST_ONE(x) +1
enum { RLK_OP_COUNT = 0 RLK_OP_LIST(RLK_OP_LIST_ONE, RLK_OP_LIST_SKIP, RLK_OP_LIST_SKIP) };

#endif
