/* check_main.c - runs every suite. RLK_TEST_SUITE=name runs one; RLK_TEST_GPU=1 enables the
 * GPU cases (they print why they skip otherwise). Each run uses a fresh private cache root.
 * `check_rlk --list` prints the suite names in the order of suites.h, the longest-running first
 * (what tools/build/run_checks.sh hands out to parallel runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"
#include "test_util.h"

typedef Suite *(*suite_fn)(void);

int main(int argc, char **argv) {
  /* the op suites first (they compile every target), so parallel runs finish together */
#define SUITE_ROW(name) {#name, name##_suite},
  static const struct {
    const char *name;
    suite_fn fn;
  } all[] = {RLK_TEST_SUITES(SUITE_ROW)};
#undef SUITE_ROW
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) printf("%s\n", all[i].name);
    return 0;
  }
  if (argc > 1) {
    fprintf(stderr, "usage: %s [--list] (RLK_TEST_SUITE=name runs one suite)\n", argv[0]);
    return 2;
  }
  if (rlk_test_setup_env() != 0) return 2;
  const char *only = getenv("RLK_TEST_SUITE");
  SRunner *runner = NULL;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    if (only && *only && strcmp(only, all[i].name) != 0) continue;
    Suite *s = all[i].fn();
    if (!runner)
      runner = srunner_create(s);
    else
      srunner_add_suite(runner, s);
  }
  if (!runner) {
    fprintf(stderr, "no suite named '%s'\n", only ? only : "");
    return 2;
  }
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  rlk_test_teardown_env();
  return failed == 0 ? 0 : 1;
}
