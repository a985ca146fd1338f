/* test_template.c - parameter schemas: range checks, canonical text, name expressions, defines,
 * and the embedded template sources. */
#include <check.h>
#include <string.h>

#include "jit/template.h"
#include "suites.h"

static const char *const modes[] = {"grpo", "rloo", NULL};
static const rlk_param_decl params[] = {
    {.name = "scores", .kind = RLK_PARAM_DTYPE, .dtype_mask = (1u << RLK_F32) | (1u << RLK_BF16)},
    {.name = "mode", .kind = RLK_PARAM_ENUM, .choices = modes},
    {.name = "block", .kind = RLK_PARAM_INT, .min = 32, .max = 1024, .pow2 = 1},
    {.name = "unbiased", .kind = RLK_PARAM_BOOL},
    {.name = "g", .kind = RLK_PARAM_INT, .min = 0, .max = 1024},
};
static const rlk_template tmpl = {.family = "fam", .entry = "kern", .cuda_source = "cuda/x.cuh",
                                  .host_source = "host/x.c", .nparams = 5, .params = params};

static rlk_kernel_spec good_spec(void) {
  rlk_kernel_spec s = {.tmpl = &tmpl, .values = {RLK_BF16, 1, 128, 1, 16}};
  return s;
}

START_TEST(validates_ranges) {
  rlk_kernel_spec s = good_spec();
  ck_assert_int_eq(rlk_spec_validate(&s), RLK_OK);
  s.values[2] = 96; /* not a power of two */
  ck_assert_int_eq(rlk_spec_validate(&s), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rlk_last_error(), "block"));
  s = good_spec();
  s.values[2] = 2048;
  ck_assert_int_eq(rlk_spec_validate(&s), RLK_ERR_INVALID_ARGUMENT);
  s = good_spec();
  s.values[0] = RLK_F64; /* not in the mask */
  ck_assert_int_eq(rlk_spec_validate(&s), RLK_ERR_INVALID_ARGUMENT);
  s = good_spec();
  s.values[1] = 2; /* past the last choice */
  ck_assert_int_eq(rlk_spec_validate(&s), RLK_ERR_INVALID_ARGUMENT);
  s = good_spec();
  s.values[3] = 2;
  ck_assert_int_eq(rlk_spec_validate(&s), RLK_ERR_INVALID_ARGUMENT);
  s = good_spec();
  s.values[4] = -1;
  ck_assert_int_eq(rlk_spec_validate(&s), RLK_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(spells_values) {
  rlk_kernel_spec s = good_spec();
  char buf[512];
  ck_assert_int_eq(rlk_spec_params_text(&s, buf, sizeof buf), RLK_OK);
  /* sorted by name, canonical spellings */
  ck_assert_str_eq(buf, "block=128 g=16 mode=rloo scores=bf16 unbiased=1");
  ck_assert_int_eq(rlk_spec_name_expression(&s, buf, sizeof buf), RLK_OK);
  ck_assert_str_eq(buf, "rlk::kern<rlk::bf16, 1, 128, true, 16>");
  char defs[RLK_MAX_PARAMS][96];
  size_t n = 0;
  ck_assert_int_eq(rlk_spec_host_defines(&s, defs, &n), RLK_OK);
  ck_assert_uint_eq(n, 5);
  ck_assert_str_eq(defs[0], "-DRLK_P_BLOCK=128");
  ck_assert_str_eq(defs[3], "-DRLK_P_SCORES=uint16_t");
  /* an invalid spec never produces text */
  s.values[2] = 3;
  ck_assert_int_eq(rlk_spec_name_expression(&s, buf, sizeof buf), RLK_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(parses_values) {
  int64_t v = -1;
  ck_assert_int_eq(rlk_param_parse(&params[0], "bf16", &v), RLK_OK);
  ck_assert_int_eq(v, RLK_BF16);
  ck_assert_int_eq(rlk_param_parse(&params[0], "f64", &v), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_param_parse(&params[1], "rloo", &v), RLK_OK);
  ck_assert_int_eq(v, 1);
  ck_assert_int_eq(rlk_param_parse(&params[1], "ppo", &v), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_param_parse(&params[4], "17", &v), RLK_OK);
  ck_assert_int_eq(v, 17);
  ck_assert_int_eq(rlk_param_parse(&params[4], "17x", &v), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_param_parse(&params[4], "5000", &v), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_param_parse(&params[3], "true", &v), RLK_OK);
  ck_assert_int_eq(v, 1);
  /* no caller string can reach generated code: a value with code in it is refused */
  ck_assert_int_eq(rlk_param_parse(&params[4], "1>; evil<", &v), RLK_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(embedded_sources) {
  const rlk_source_set *cuda = NULL, *host = NULL;
  ck_assert_int_eq(rlk_sources_get("cuda", &cuda), RLK_OK);
  ck_assert_int_eq(rlk_sources_get("host", &host), RLK_OK);
  ck_assert_uint_gt(cuda->count, 0);
  ck_assert_uint_gt(host->count, 0);
  ck_assert_uint_eq(strlen(cuda->digest), 64);
  /* the embedded digest is the digest of the embedded files */
  char hex[65];
  rlk_sources_digest(cuda->files, cuda->count, hex);
  ck_assert_str_eq(hex, cuda->digest);
  ck_assert_str_ne(cuda->digest, host->digest);
  ck_assert_ptr_nonnull(rlk_sources_find(cuda, "cuda/rlk_prelude.cuh"));
  ck_assert_ptr_null(rlk_sources_find(cuda, "cuda/nope.cuh"));
  ck_assert_int_eq(rlk_sources_get("nope", &cuda), RLK_ERR_INTERNAL);
  /* a changed file changes the digest */
  rlk_source_file copy[128];
  size_t n = host->count < 128 ? host->count : 128;
  memcpy(copy, host->files, n * sizeof copy[0]);
  copy[0].size = copy[0].size - 1;
  rlk_sources_digest(copy, n, hex);
  ck_assert_str_ne(hex, host->digest);
}
END_TEST

Suite *template_suite(void) {
  Suite *s = suite_create("template");
  TCase *tc = tcase_create("schema");
  tcase_add_test(tc, validates_ranges);
  tcase_add_test(tc, spells_values);
  tcase_add_test(tc, parses_values);
  tcase_add_test(tc, embedded_sources);
  suite_add_tcase(s, tc);
  return s;
}
