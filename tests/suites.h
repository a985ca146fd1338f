/* suites.h - every Check suite of the test binary: the ops' (one per row of runtime/op_list.h
 * that names one), then the other parts', the longest first. Each tests/test_*.c defines one. */
#ifndef RLK_TEST_SUITES_H
#define RLK_TEST_SUITES_H

#include <check.h>

#include "runtime/op_list.h"

#define RLK_TEST_OTHER_SUITES(SUITE)                                                                  \
  SUITE(invariance) SUITE(kept_set) SUITE(linear_logprob_rows) SUITE(linear_sample) SUITE(tools) SUITE(jit) SUITE(tune) SUITE(cache) SUITE(record) SUITE(hopper) SUITE(ops) \
  SUITE(api) SUITE(compiler) SUITE(backend) SUITE(template) SUITE(key) SUITE(sha256)

/* SUITE(name) for every suite, in the order they run. */
#define RLK_TEST_SUITES(SUITE) \
  RLK_OP_LIST(RLK_OP_LIST_SKIP, RLK_OP_LIST_SKIP, SUITE) RLK_TEST_OTHER_SUITES(SUITE)

#define RLK_TEST_SUITE_DECL(name) Suite *name##_suite(void);
RLK_TEST_SUITES(RLK_TEST_SUITE_DECL)
#undef RLK_TEST_SUITE_DECL

#endif
