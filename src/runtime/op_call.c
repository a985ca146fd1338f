/* op_call.c - the generic call driver: the part of every op call that is the same for all (see
 * op_call.h). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "runtime/op_call.h"
#include "runtime/record.h"

/* The op's call state, held by the driver. */
typedef union call_state {
  rlk_op_call call;
  _Alignas(RLK_OP_CALL_ALIGN) unsigned char bytes[RLK_OP_CALL_BYTES];
} call_state;
_Static_assert(RLK_OP_CALL_ALIGN % _Alignof(max_align_t) == 0, "a call state is aligned for anything");

static rlk_status validate(const rlk_op_entry *e, const rlk_context *ctx, const void *args, rlk_op_call *call) {
  if (e->call_size > RLK_OP_CALL_BYTES)
    return rlk_error(RLK_ERR_INTERNAL, "%s: a call's state of %zu bytes exceeds %d", e->name, e->call_size,
                     RLK_OP_CALL_BYTES);
  memset(call, 0, e->call_size);
  if (e->op) rlk_op_values_init(e->op, &call->vals);
  return e->validate(ctx, args, call);
}

rlk_status rlk_op_workspace_size(const rlk_op_entry *e, rlk_context *ctx, const void *args, size_t *bytes) {
  if (bytes) *bytes = 0;
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s_workspace_size: ctx is NULL", e->name);
  if (!args) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s_workspace_size: args is NULL", e->name);
  if (!bytes) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s_workspace_size: bytes is NULL", e->name);
  if (e->size) {
    rlk_status st = e->size(ctx, args, bytes);
    if (st) *bytes = 0;
    return st;
  }
  call_state state;
  rlk_status st = validate(e, ctx, args, &state.call);
  if (!st) *bytes = state.call.workspace;
  return st;
}

/* The caller's workspace against what the call needs. */
static rlk_status check_workspace(const rlk_op_entry *e, const void *workspace, size_t bytes, size_t need) {
  if (!need) return RLK_OK;
  if (!workspace)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "workspace: NULL, the call needs %zu bytes (%s_workspace_size)", need,
                     e->name);
  if (bytes < need)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "workspace: %zu bytes, the call needs %zu (%s_workspace_size)", bytes,
                     need, e->name);
  if ((uintptr_t)workspace % e->workspace.align)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "workspace: not %zu-byte aligned", e->workspace.align);
  return RLK_OK;
}

rlk_status rlk_op_run(const rlk_op_entry *e, rlk_context *ctx, const void *args, void *stream) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", e->name);
  if (!args) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: args is NULL", e->name);
  const void *workspace = NULL;
  size_t bytes = 0;
  if (e->workspace.align) {
    memcpy(&workspace, (const char *)args + e->workspace.data, sizeof workspace);
    memcpy(&bytes, (const char *)args + e->workspace.bytes, sizeof bytes);
  }
  /* a misaligned workspace said as such before an op's checks read views of it */
  if (workspace && (uintptr_t)workspace % e->workspace.align)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "workspace: not %zu-byte aligned", e->workspace.align);
  call_state state;
  rlk_op_call *call = &state.call;
  rlk_status st = validate(e, ctx, args, call);
  if (st) return st;
  if ((st = check_workspace(e, workspace, bytes, call->workspace))) return st;
  if ((st = rlk_check_arg_fields(e->fields, e->nfields, args, workspace, call->workspace ? bytes : 0))) return st;
  if ((st = rlk_context_require_device(ctx, e->name))) return st;
  if (e->select)
    st = e->select(ctx, args, call);
  else if (!call->nspecs && e->op)
    st = e->op->plan(ctx, &call->vals, call->specs, &call->nspecs);
  if (st) return st;
  if (e->op && rlk_record_enabled()) rlk_record_op(e->op, &call->vals);
  if (e->launch) return e->launch(ctx, args, call, stream);
  if (!e->params && e->params_at < sizeof(rlk_op_call)) /* an entry that named neither */
    return rlk_error(RLK_ERR_INTERNAL, "%s: the entry gives no kernel arguments", e->name);
  for (size_t i = 0; i < call->nspecs; i++) {
    rlk_launch_dims d;
    memset(&d, 0, sizeof d);
    d.grid[0] = d.grid[1] = d.grid[2] = d.block[0] = d.block[1] = d.block[2] = 1;
    const void *params = e->params ? e->params(ctx, args, call, i) : (const char *)call + e->params_at;
    e->dims(ctx, call, i, &d);
    if ((st = rlk_context_launch_params(ctx, &call->specs[i], &d, stream, params))) return st;
  }
  return RLK_OK;
}
