/* context.c - context lifetime: picks the backend, the compiler for its target and the cache,
 * and wires them into a JIT. Also the thin public wrappers over the backend (memory, events). */
#include <stdlib.h>
#include <string.h>

#include "runtime/context.h"
#include "core/core.h"

void rlk_context_options_init(rlk_context_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->backend = RLK_BACKEND_AUTO;
  o->log_level = RLK_LOG_DEFAULT;
}

/* The CPU is one device, 0: another ordinal is refused rather than read as the CPU (a caller
 * that asked for GPU 1 on a machine without one would otherwise run there unawares). */
static rlk_status host_open(int ordinal, rlk_backend_impl **out) {
  if (ordinal != 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "options.device: %d, but the host backend has one device, 0", ordinal);
  return rlk_host_backend_open(out);
}

/* Every backend: how to open it, its compiler and the template folder that compiler reads (which
 * target names are whose is core/target.c's). The automatic choice tries them in this order and
 * takes the first present (the CPU last: it always is). Adding a backend is a row here. */
typedef struct backend_row {
  rlk_backend kind;
  rlk_status (*open)(int ordinal, rlk_backend_impl **out);
  rlk_status (*open_compiler)(rlk_compiler **out);
  const char *templates; /* "cuda" or "host": the folder of templates/ its compiler reads */
} backend_row;

static const backend_row backend_rows[] = {
    {RLK_BACKEND_CUDA, rlk_cuda_backend_open, rlk_nvrtc_open, "cuda"},
    {RLK_BACKEND_HIP, rlk_hip_backend_open, rlk_hiprtc_open, "cuda"},
    {RLK_BACKEND_HOST, host_open, rlk_hostcc_open, "host"},
};
#define NROWS (sizeof backend_rows / sizeof backend_rows[0])

static const backend_row *row_of(rlk_backend kind) {
  for (size_t i = 0; i < NROWS; i++)
    if (backend_rows[i].kind == kind) return &backend_rows[i];
  return NULL;
}

static rlk_status open_backend(rlk_context *ctx, const rlk_context_options *o) {
  if (o->backend != RLK_BACKEND_AUTO) return row_of(o->backend)->open(o->device, &ctx->backend);
  /* auto: the first device runtime present, else the CPU. Only "not present here" falls
   * through: a bad ordinal or a failing driver is the caller's to see, since falling back
   * to the CPU would hand device pointers to host code. */
  rlk_status st = RLK_ERR_UNAVAILABLE;
  for (size_t i = 0; i < NROWS && st == RLK_ERR_UNAVAILABLE; i++) {
    if (i) rlk_debug("auto backend: %s unavailable: %s", rlk_backend_name(backend_rows[i - 1].kind), rlk_last_error());
    st = backend_rows[i].open(o->device, &ctx->backend);
  }
  return st;
}

rlk_status rlk_context_create(rlk_context **out, const rlk_context_options *options) {
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_context_create: out is NULL");
  *out = NULL;
  rlk_context_options o;
  if (options)
    o = *options;
  else
    rlk_context_options_init(&o);
  if ((int)o.backend < RLK_BACKEND_AUTO || (int)o.backend > RLK_BACKEND_HOST)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "options.backend: %d is not an rlk_backend", (int)o.backend);
  if (o.device < 0) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "options.device: %d is negative", o.device);
  if ((int)o.log_level < RLK_LOG_DEFAULT || (int)o.log_level > RLK_LOG_DEBUG)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "options.log_level: %d is not an rlk_log_level", (int)o.log_level);
  if (o.log_level != RLK_LOG_DEFAULT && o.log_level > rlk_log_get_level()) rlk_log_set_level(o.log_level);

  rlk_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "rlk_context_create: out of memory");
  rlk_status st;
  /* A device context takes its target from the device (the backend applies RLK_ARCH); a
   * compile-only context from the options, else RLK_ARCH. The target's kind names the backend of
   * a compile-only context left at RLK_BACKEND_AUTO. */
  const char *want = o.target ? o.target : (o.compile_only ? rlk_target_env() : NULL);
  rlk_target target;
  if (want && (st = rlk_target_parse(want, &target))) {
    rlk_error_wrap(st, o.target ? "options.target" : "RLK_ARCH");
    goto fail;
  }

  if (o.compile_only) {
    ctx->compile_only = 1;
    ctx->kind = o.backend != RLK_BACKEND_AUTO ? o.backend : want ? target.kind : RLK_BACKEND_HOST;
    if (!want && ctx->kind != RLK_BACKEND_HOST) {
      st = rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "options.target: a compile-only %s context needs a target (e.g. sm_90a, gfx90a)",
                     rlk_backend_name(ctx->kind));
      goto fail;
    }
    if (!want && (st = rlk_target_parse("host", &target))) goto fail;
    rlk_format(ctx->info.name, sizeof ctx->info.name, "(compile-only)");
    ctx->info.compile_only = 1;
  } else {
    st = open_backend(ctx, &o);
    if (st) goto fail;
    ctx->kind = ctx->backend->kind;
    ctx->info = ctx->backend->info;
    /* The device's own target (its counts and limits) unless options.target names another, which
     * keeps the device's multiprocessors. */
    if (!want || !strcmp(target.name, ctx->backend->target.name))
      target = ctx->backend->target;
    else {
      target.multiprocessors = ctx->backend->target.multiprocessors;
      memcpy(target.cluster_sms, ctx->backend->target.cluster_sms, sizeof target.cluster_sms);
    }
  }
  if (target.kind != ctx->kind) {
    st = rlk_error(RLK_ERR_UNSUPPORTED, "target %s is a %s target, not one of the %s backend", target.name,
                   rlk_backend_name(target.kind), rlk_backend_name(ctx->kind));
    goto fail;
  }
  if (ctx->kind == RLK_BACKEND_HOST && strcmp(target.name, rlk_host_target()) != 0) {
    st = rlk_error(RLK_ERR_UNSUPPORTED, "target %s: the host backend compiles only for %s", target.name,
                   rlk_host_target());
    goto fail;
  }
  ctx->target = target;
  rlk_format(ctx->info.target, sizeof ctx->info.target, "%s", target.name);

  st = row_of(ctx->kind)->open_compiler(&ctx->compiler);
  if (st) goto fail;
  if (!ctx->compiler->supports_target(ctx->compiler, &ctx->target)) {
    st = rlk_error(RLK_ERR_UNSUPPORTED, "target %s is not supported by %s (it supports: %s)", target.name,
                   ctx->compiler->id, ctx->compiler->targets);
    goto fail;
  }
  rlk_format(ctx->info.compiler, sizeof ctx->info.compiler, "%s %s", ctx->compiler->kind, ctx->compiler->version);

  rlk_cache_config cfg;
  st = rlk_cache_config_from_env(&cfg, o.cache_dir);
  if (st) goto fail;
  st = rlk_cache_open(&cfg, &ctx->cache);
  if (st) goto fail;
  st = rlk_jit_create(ctx->backend, ctx->compiler, ctx->cache, &ctx->target, row_of(ctx->kind)->templates, &ctx->jit);
  if (st) goto fail;
  st = rlk_tune_table_create(&ctx->info, &ctx->tune);
  if (st) goto fail;
  rlk_info("context: backend %s, device %s, target %s, %s, cache %s", rlk_backend_name(ctx->kind), ctx->info.name,
           ctx->target.name, ctx->info.compiler, rlk_cache_root(ctx->cache)[0] ? rlk_cache_root(ctx->cache) : "(memory)");
  *out = ctx;
  return RLK_OK;
fail:
  rlk_context_destroy(ctx);
  return st;
}

void rlk_context_destroy(rlk_context *ctx) {
  if (!ctx) return;
  rlk_tune_table_destroy(ctx->tune);
  rlk_jit_destroy(ctx->jit);
  rlk_cache_close(ctx->cache);
  if (ctx->compiler) ctx->compiler->destroy(ctx->compiler);
  if (ctx->backend) ctx->backend->destroy(ctx->backend);
  free(ctx);
}

rlk_backend rlk_context_backend(const rlk_context *ctx) { return ctx ? ctx->kind : RLK_BACKEND_AUTO; }

rlk_status rlk_context_device_info(const rlk_context *ctx, rlk_device_info *info) {
  if (!ctx || !info) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_context_device_info: NULL argument");
  *info = ctx->info;
  return RLK_OK;
}

const char *rlk_context_supported_targets(const rlk_context *ctx) {
  return (ctx && ctx->compiler) ? ctx->compiler->targets : "";
}

rlk_status rlk_context_counters(const rlk_context *ctx, rlk_counters *out) {
  if (!ctx || !out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_context_counters: NULL argument");
  rlk_jit_counters(ctx->jit, out);
  return RLK_OK;
}

void rlk_context_reset_counters(rlk_context *ctx) {
  if (ctx) rlk_jit_reset_counters(ctx->jit);
}

const char *rlk_context_cache_dir(const rlk_context *ctx) { return ctx ? rlk_cache_root(ctx->cache) : ""; }

rlk_status rlk_context_require_device(const rlk_context *ctx, const char *what) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", what);
  if (!ctx->backend)
    return rlk_error(RLK_ERR_UNSUPPORTED, "%s: the context is compile-only (no device to run on)", what);
  return RLK_OK;
}

rlk_status rlk_context_tensor_map(const rlk_context *ctx, const rlk_tma_desc_request *req, void *out128) {
  if (!ctx->backend || !ctx->backend->tensor_map_encode)
    return rlk_error(RLK_ERR_UNSUPPORTED, "tma: the backend has no tensor maps");
  return ctx->backend->tensor_map_encode(ctx->backend, req, out128);
}

rlk_status rlk_context_launch_params(rlk_context *ctx, const rlk_kernel_spec *spec, const rlk_launch_dims *dims,
                                     void *stream, const void *params) {
  void *fn = NULL;
  rlk_status st = rlk_jit_get(ctx->jit, spec, &fn);
  if (st) return st;
  void *args[1] = {(void *)params}; /* the backends' launch: the kernel's one parameter */
  return ctx->backend->launch(ctx->backend, fn, dims, stream, args);
}

/* ---- memory and events ---------------------------------------------------------- */

rlk_status rlk_malloc(rlk_context *ctx, size_t bytes, void **out) {
  rlk_status st = rlk_context_require_device(ctx, "rlk_malloc");
  if (st) return st;
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_malloc: out is NULL");
  *out = NULL;
  if (bytes == 0) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_malloc: bytes is 0");
  return ctx->backend->mem_alloc(ctx->backend, bytes, out);
}

rlk_status rlk_free(rlk_context *ctx, void *ptr) {
  if (!ptr) return RLK_OK;
  rlk_status st = rlk_context_require_device(ctx, "rlk_free");
  if (st) return st;
  return ctx->backend->mem_free(ctx->backend, ptr);
}

/* A copy between host and device by ctx's backend, for the public function `who`. */
static rlk_status memcpy_across(rlk_context *ctx, const char *who, void *dst, const void *src, size_t bytes,
                                int to_device) {
  rlk_status st = rlk_context_require_device(ctx, who);
  if (st) return st;
  if (bytes == 0) return RLK_OK;
  if (!dst || !src) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: NULL pointer", who);
  rlk_backend_impl *b = ctx->backend;
  return to_device ? b->copy_to_device(b, dst, src, bytes) : b->copy_to_host(b, dst, src, bytes);
}

rlk_status rlk_memcpy_to_device(rlk_context *ctx, void *dst, const void *src, size_t bytes) {
  return memcpy_across(ctx, "rlk_memcpy_to_device", dst, src, bytes, 1);
}

rlk_status rlk_memcpy_to_host(rlk_context *ctx, void *dst, const void *src, size_t bytes) {
  return memcpy_across(ctx, "rlk_memcpy_to_host", dst, src, bytes, 0);
}

rlk_status rlk_memset(rlk_context *ctx, void *dst, int value, size_t bytes) {
  rlk_status st = rlk_context_require_device(ctx, "rlk_memset");
  if (st) return st;
  if (bytes == 0) return RLK_OK;
  if (!dst) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_memset: dst is NULL");
  return ctx->backend->mem_set(ctx->backend, dst, value, bytes);
}

rlk_status rlk_stream_synchronize(rlk_context *ctx, void *stream) {
  rlk_status st = rlk_context_require_device(ctx, "rlk_stream_synchronize");
  if (st) return st;
  return ctx->backend->synchronize(ctx->backend, stream);
}

rlk_status rlk_event_create(rlk_context *ctx, rlk_event **out) {
  rlk_status st = rlk_context_require_device(ctx, "rlk_event_create");
  if (st) return st;
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_event_create: out is NULL");
  rlk_event *ev = calloc(1, sizeof *ev);
  if (!ev) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "rlk_event_create: out of memory");
  ev->ctx = ctx;
  st = ctx->backend->event_create(ctx->backend, &ev->impl);
  if (st) {
    free(ev);
    return st;
  }
  *out = ev;
  return RLK_OK;
}

rlk_status rlk_event_record(rlk_event *event, void *stream) {
  if (!event) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_event_record: event is NULL");
  return event->ctx->backend->event_record(event->ctx->backend, event->impl, stream);
}

rlk_status rlk_event_elapsed_ms(rlk_event *start, rlk_event *end, float *ms) {
  if (!start || !end || !ms) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_event_elapsed_ms: NULL argument");
  if (start->ctx != end->ctx)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_event_elapsed_ms: events of different contexts");
  return start->ctx->backend->event_elapsed_ms(start->ctx->backend, start->impl, end->impl, ms);
}

void rlk_event_destroy(rlk_event *event) {
  if (!event) return;
  event->ctx->backend->event_destroy(event->ctx->backend, event->impl);
  free(event);
}
