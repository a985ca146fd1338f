/* context.h - the rlk_context behind the public handle, and the launch helper ops use. */
#ifndef RLK_CONTEXT_H
#define RLK_CONTEXT_H

#include "backend/backend.h"
#include "jit/cache.h"
#include "jit/compiler.h"
#include "jit/jit.h"
#include "rlk.h"
#include "tune/tune_table.h"

struct rlk_context {
  rlk_backend kind;
  rlk_backend_impl *backend; /* NULL on a compile-only context */
  rlk_compiler *compiler;
  rlk_cache *cache;
  rlk_jit *jit;
  rlk_device_info info;
  rlk_target target; /* typed: what compilers, keys and ops read (info.target is its name) */
  int compile_only;
  rlk_tune_table *tune; /* the tuning database as this context sees it (RLK_TUNE, RLK_TUNE_DB) */
};

struct rlk_event {
  rlk_context *ctx;
  void *impl;
};

/* Looks up (or builds) the kernel of `spec` and launches it on `stream` with its one argument
 * struct at `params` (templates/common/<op>_params.h, tensor maps included), which the launch
 * copies: the struct may change for the next launch at once. */
rlk_status rlk_context_launch_params(rlk_context *ctx, const rlk_kernel_spec *spec, const rlk_launch_dims *dims,
                                     void *stream, const void *params);

/* Encodes a 2-D tiled tensor map (128 bytes at out128) for a launch on this context's device:
 * the backend's tensor_map_encode (CUDA), RLK_ERR_UNSUPPORTED where the backend has none. */
rlk_status rlk_context_tensor_map(const rlk_context *ctx, const rlk_tma_desc_request *req, void *out128);

/* RLK_ERR_UNSUPPORTED when the context cannot launch (compile-only). */
rlk_status rlk_context_require_device(const rlk_context *ctx, const char *what);

#endif
