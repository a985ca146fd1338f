/* fuzz_sweep.c - the tools' configuration files (tools/tool_config.h: what rlk-precompile
 * --config and rlk-tune read): '#' comments, blank lines, comma lists expanded into the cross
 * product of their values. The input is the file. The first configurations it expands to must
 * each expand to itself alone, and go on to rlk_precompile_keys, as the tools pass them on. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *prog = "fuzz_sweep";

#include "fuzz.h"
#include "tool_util.h"
#include "tool_config.h"

#define SWEEP_CHECK_MAX 64 /* configurations of an input expanded again */
#define SWEEP_KEYS_MAX 16  /* configurations of an input whose keys are computed */

static rlk_context *ctx;
static strlist ops;
static char path[1100];
static int devnull = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fz_init(argc, argv);
  ctx = fz_planning_context("fuzz_sweep");
  split_words(rlk_precompile_ops(), 0, &ops);
  snprintf(path, sizeof path, "%s/sweep.conf", fz_scratch());
  devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  return 0;
}

/* read_config_file reports a bad line on stderr, as the tools do: quiet while it runs. */
static int read_quietly(strlist *configs) {
  fflush(stderr);
  int saved = dup(2);
  if (devnull >= 0) dup2(devnull, 2);
  int rc = read_config_file(path, &ops, configs);
  fflush(stderr);
  if (saved >= 0) {
    dup2(saved, 2);
    close(saved);
  }
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (fz_write_file(path, data, size) != 0) fz_fail("fuzz_sweep", "cannot write the scratch file");
  strlist configs = {0};
  if (read_quietly(&configs) == 0) {
    for (size_t i = 0; i < configs.n && i < SWEEP_CHECK_MAX; i++) {
      if (strchr(configs.v[i], '#') || strchr(configs.v[i], '\n'))
        fz_fail("expand_line", "an expanded configuration holds a comment or a newline");
      strlist again = {0};
      char why[512];
      if (expand_line(configs.v[i], &ops, &again, why, sizeof why) != 0 || again.n != 1 ||
          strcmp(again.v[0], configs.v[i]))
        fz_fail("expand_line", "an expanded configuration does not expand to itself");
      strlist_free(&again);
      if (i < SWEEP_KEYS_MAX) {
        char keys[65 * 8];
        int kernels = 0;
        fz_checked(rlk_precompile_keys(ctx, configs.v[i], keys, sizeof keys, &kernels), "rlk_precompile_keys");
      }
    }
  }
  strlist_free(&configs);
  return 0;
}
