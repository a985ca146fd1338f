/* backend_alloc.c - the start every device backend's open shares (see backend.h). */
#include <stdlib.h>

#include "backend/backend.h"
#include "core/core.h"

rlk_status rlk_backend_alloc(const char *name, int ordinal, size_t state_size, rlk_backend_impl **out,
                             rlk_backend_impl **backend) {
  *backend = NULL;
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: out is NULL", name);
  *out = NULL;
  if (ordinal < 0) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: device ordinal %d is negative", name, ordinal);
  rlk_backend_impl *b = calloc(1, sizeof *b);
  if (b) b->impl = calloc(1, state_size);
  if (!b || !b->impl) {
    free(b);
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "%s: out of memory opening the backend", name);
  }
  *backend = b;
  return RLK_OK;
}
