/* test_template.c - parameter schemas: range checks, canonical text, name expressions, defines,
 * and the embedded template sources. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "jit/template.h"
#include "suites.h"
#include "test_util.h"

static const char *const modes[] = {"grpo", "rloo", NULL};
static const rlk_value_decl params[] = {
    {.name = "scores", .kind = RLK_VALUE_DTYPE, .dtypes = (1u << RLK_F32) | (1u << RLK_BF16)},
    {.name = "mode", .kind = RLK_VALUE_CHOICE, .max = 1, .choices = modes},
    {.name = "block", .kind = RLK_VALUE_INT, .min = 32, .max = 1024, .pow2 = 1},
    {.name = "unbiased", .kind = RLK_VALUE_FLAG},
    {.name = "g", .kind = RLK_VALUE_INT, .min = 0, .max = 1024},
};
static const rlk_value_decl *const param_list[] = {&params[0], &params[1], &params[2], &params[3], &params[4]};
static const rlk_template tmpl = {.family = "fam", .entry = "kern", .cuda_source = "cuda/x.cuh",
                                  .host_source = "host/x.c", .nparams = 5, .params = param_list};

static rlk_kernel_spec good_spec(void) {
  rlk_kernel_spec s = {.tmpl = &tmpl, .values = {RLK_BF16, 1, 128, 1, 16}};
  return s;
}

START_TEST(validates_ranges) {
  rlk_kernel_spec s = good_spec();
  ck_assert_int_eq(rlk_spec_validate(&s), RLK_OK);
  s.values[2] = 96; /* not a power of two */
  rlk_test_expect_error(rlk_spec_validate(&s), RLK_ERR_INVALID_ARGUMENT, "block", "rlk_spec_validate");
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
  /* an enum declared over part of its choices takes only those; a decl past them is the schema's */
  static const char *const dts[] = {"f32", "bf16", "f16", NULL};
  rlk_value_decl narrow = {.name = "dt", .kind = RLK_VALUE_CHOICE, .min = 1, .max = 2, .choices = dts};
  const rlk_value_decl *const narrow_list[] = {&narrow};
  const rlk_template nt = {.family = "fam", .entry = "narrow", .cuda_source = "cuda/x.cuh", .nparams = 1,
                           .params = narrow_list};
  rlk_kernel_spec n = {.tmpl = &nt, .values = {2}};
  ck_assert_int_eq(rlk_spec_validate(&n), RLK_OK);
  n.values[0] = 0;
  rlk_test_expect_error(rlk_spec_validate(&n), RLK_ERR_INVALID_ARGUMENT, "bf16 to f16", "rlk_spec_validate");
  int64_t parsed = -1;
  ck_assert_int_eq(rlk_param_parse(&narrow, "f32", &parsed), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_param_parse(&narrow, "f16", &parsed), RLK_OK);
  ck_assert_int_eq(parsed, 2);
  narrow.max = 3;
  n.values[0] = 1;
  rlk_test_expect_error(rlk_spec_validate(&n), RLK_ERR_INTERNAL, "declares choices 1 to 3 of 3", "rlk_spec_validate");
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
  ck_assert_ptr_null(rlk_sources_find(host, "cuda/rlk_prelude.cuh"));
  /* both sets hold templates/common, and every file of a set has a name of its own */
  ck_assert_ptr_nonnull(rlk_sources_find(cuda, "common/rlk_params.h"));
  ck_assert_ptr_nonnull(rlk_sources_find(host, "common/rlk_params.h"));
  for (size_t i = 0; i < cuda->count; i++) {
    ck_assert_msg(rlk_sources_in_set(cuda->files[i].name, "cuda"), "%s in the cuda set", cuda->files[i].name);
    for (size_t k = 0; k < i; k++)
      ck_assert_str_ne(rlk_sources_basename(cuda->files[i].name), rlk_sources_basename(cuda->files[k].name));
  }
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

/* Writes <dir>/<name> with `text`. */
static void put_file(const char *dir, const char *name, const char *text) {
  char path[2048];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* RLK_TEMPLATE_DIR: every file of the folder and of common/ counts however many there are, a
 * subdirectory is no file (the key does not change because of one), and a file that cannot be
 * read, or one whose name another file of the set has, is an error. Sources are read once per
 * process, so each case runs in a child. */
enum { TDIR_PLAIN, TDIR_FIFO, TDIR_SAME_NAME };
static int template_dir_child(const char *root, int nfiles, int fault) {
  setenv("RLK_TEMPLATE_DIR", root, 1);
  const rlk_source_set *host = NULL;
  rlk_status st = rlk_sources_get("host", &host);
  if (fault == TDIR_FIFO) return st == RLK_ERR_IO && strstr(rlk_last_error(), "not a regular file") ? 0 : 10;
  if (fault == TDIR_SAME_NAME) return st == RLK_ERR_IO && strstr(rlk_last_error(), "share a name") ? 0 : 15;
  if (st != RLK_OK || host->count != (size_t)nfiles + 1) return 11;
  char name[64];
  snprintf(name, sizeof name, "host/f%03d.h", nfiles - 1);
  if (!rlk_sources_find(host, name) || rlk_sources_find(host, "host/sub")) return 12;
  if (!rlk_sources_find(host, "common/shared.h")) return 16;
  /* The digest is that of the files alone. */
  rlk_source_file *files = calloc((size_t)nfiles + 1, sizeof *files);
  char (*names)[32] = calloc((size_t)nfiles, sizeof *names);
  if (!files || !names) return 13;
  for (int i = 0; i < nfiles; i++) {
    snprintf(names[i], sizeof names[i], "host/f%03d.h", i);
    files[i].name = names[i];
    files[i].text = "int x;\n";
    files[i].size = 7;
  }
  files[nfiles].name = "common/shared.h";
  files[nfiles].text = "int s;\n";
  files[nfiles].size = 7;
  char hex[65];
  rlk_sources_digest(files, (size_t)nfiles + 1, hex);
  return strcmp(hex, host->digest) == 0 ? 0 : 14;
}

START_TEST(template_dir_reads_every_file) {
  for (int c = TDIR_PLAIN; c <= TDIR_SAME_NAME; c++) {
    char root[1024], dir[1100], sub[1200];
    rlk_test_mkdtemp(root, sizeof root, "tdir");
    snprintf(dir, sizeof dir, "%s/cuda", root);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(dir, sizeof dir, "%s/common", root);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    put_file(dir, "shared.h", "int s;\n");
    if (c == TDIR_SAME_NAME) put_file(dir, "f007.h", "int x;\n");
    snprintf(dir, sizeof dir, "%s/host", root);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    const int nfiles = 300; /* well past any fixed table */
    for (int i = 0; i < nfiles; i++) {
      char name[32];
      snprintf(name, sizeof name, "f%03d.h", i);
      put_file(dir, name, "int x;\n");
    }
    snprintf(sub, sizeof sub, "%s/sub", dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    put_file(sub, "inner.h", "int y;\n");
    if (c == TDIR_FIFO) {
      snprintf(sub, sizeof sub, "%s/pipe.h", dir);
      ck_assert_int_eq(mkfifo(sub, 0600), 0);
    }
    pid_t pid = rlk_test_fork();
    if (pid == 0) {
      alarm(20);
      _exit(template_dir_child(root, nfiles, c));
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "case %d: child status %d", c,
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    rlk_test_rmtree(root);
  }
}
END_TEST

Suite *template_suite(void) {
  Suite *s = suite_create("template");
  rlk_test_add_case(s, "schema", 0, TESTS(validates_ranges, spells_values, parses_values, embedded_sources,
      template_dir_reads_every_file));
  return s;
}
