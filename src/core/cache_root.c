/* cache_root.c - where the runtime keeps its files by default: the kernel cache's writable root,
 * beside which the tuning database lives. In core because both the cache (jit) and the tuning
 * database (tune) start from it. */
#include <stdlib.h>

#include "core/core.h"

rlk_status rlk_cache_default_root(char *buf, size_t size) {
  if (!buf || size == 0) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_cache_default_root: no buffer");
  buf[0] = '\0';
  const char *dir = rlk_env("RLK_CACHE_DIR");
  int n;
  if (dir) {
    n = rlk_format(buf, size, "%s", dir);
  } else {
    /* XDG_CACHE_HOME and HOME are not the runtime's variables: read as the system sets them.
     * The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored. */
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (xdg && xdg[0] == '/')
      n = rlk_format(buf, size, "%s/rlk", xdg);
    else if (home && home[0] == '/')
      n = rlk_format(buf, size, "%s/.cache/rlk", home);
    else
      return rlk_error(RLK_ERR_CACHE, "kernel cache: no root (HOME is not set); set RLK_CACHE_DIR");
  }
  if (n < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "kernel cache: root path longer than %zu bytes", size - 1);
  return RLK_OK;
}
