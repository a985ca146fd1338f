/* invariant.c - RLK_INVARIANT (invariant.h). */
#include "ops/invariant.h"

#include <string.h>

#include "core/core.h"

int rlk_invariant(void) {
  const char *e = rlk_env("RLK_INVARIANT");
  return e && !strcmp(e, "1");
}
