/* suites.h - every Check suite of the test binary. Each tests/test_*.c defines one. */
#ifndef RLK_TEST_SUITES_H
#define RLK_TEST_SUITES_H

#include <check.h>

Suite *sha256_suite(void);
Suite *key_suite(void);
Suite *cache_suite(void);
Suite *template_suite(void);
Suite *compiler_suite(void);
Suite *backend_suite(void);
Suite *jit_suite(void);
Suite *api_suite(void);
Suite *ops_suite(void);
Suite *group_advantage_suite(void);
Suite *policy_loss_suite(void);
Suite *advantage_scan_suite(void);
Suite *logprob_suite(void);
Suite *logprob_shard_suite(void);
Suite *sample_suite(void);
Suite *prefix_attention_suite(void);
Suite *tune_suite(void);
Suite *tools_suite(void);
Suite *hopper_suite(void);
Suite *linear_logprob_suite(void);
Suite *token_baseline_suite(void);
Suite *token_kl_suite(void);
Suite *record_suite(void);

#endif
