/* op_call.h - the generic call driver (op_call.c): what every public op entry does, once.
 *
 * An op's entry (rlk_token_kl, rlk_logprob_backward, ...) is an rlk_op_entry: its name, its
 * configuration-line family, its args struct's tensor fields and workspace, and three functions
 * of the op: validate (every argument; the call's configuration values, sizes and workspace),
 * params (a kernel's argument struct) and dims (its launch shape). The driver does the rest: the
 * NULL checks, the workspace checks, the overlap check over the fields, the device check, the
 * kernels from the op's plan over the call's values (the function rlk_precompile goes through,
 * so a recorded line builds what the call ran), RLK_JIT_RECORD, and the launches. */
#ifndef RLK_RUNTIME_OP_CALL_H
#define RLK_RUNTIME_OP_CALL_H

#include <stddef.h>

#include "rlk.h"
#include "runtime/context.h"
#include "runtime/op.h"
#include "runtime/overlap.h"

/* A call being made: what the driver and the op share. The op keeps its own state in a struct
 * whose first member is this one (the driver holds it: at most RLK_OP_CALL_BYTES, aligned to
 * RLK_OP_CALL_ALIGN, which a kernel argument struct with a tensor map needs), which its
 * functions reach by a cast. */
#define RLK_OP_CALL_BYTES 16384
#define RLK_OP_CALL_ALIGN 64

typedef struct rlk_op_call {
  rlk_op_values vals; /* the call's configuration (validate sets every setting a recording spells) */
  size_t workspace;   /* the workspace bytes the call needs (validate; 0: none) */
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS]; /* the kernels, in launch order */
  size_t nspecs;
} rlk_op_call;

/* Where an args struct keeps its workspace (void *workspace; size_t workspace_bytes) and the
 * alignment a call needs of it; align 0: the struct has none. */
typedef struct rlk_op_workspace {
  size_t data, bytes, align;
} rlk_op_workspace;

#define RLK_OP_WORKSPACE(type, alignment) {offsetof(type, workspace), offsetof(type, workspace_bytes), alignment}

/* An entry's tensor fields: a table of RLK_ARG_IN / RLK_ARG_OUT / RLK_ARG_INPLACE rows. */
#define RLK_OP_FIELDS(table) .fields = (table), .nfields = sizeof(table) / sizeof((table)[0])

typedef struct rlk_op_entry {
  const char *name;       /* the public function, "rlk_token_kl": the prefix of its messages */
  const rlk_op_desc *op;  /* the configuration-line family of its calls (plan, RLK_JIT_RECORD); NULL
                           * for a call made of other calls, which record their own */
  size_t call_size;       /* sizeof the op's call struct (zeroed before validate; at most
                           * RLK_OP_CALL_BYTES) */
  const rlk_arg_field *fields;
  size_t nfields;
  rlk_op_workspace workspace;
  /* Checks every argument and fills the call: vals (rlk_op_values_set for every setting the
   * configuration has), workspace, and the op's own state. It may choose the kernels itself
   * (specs, nspecs) when the call's sizes depend on them. */
  rlk_status (*validate)(const rlk_context *ctx, const void *args, rlk_op_call *call);
  /* The workspace bytes from what they depend on alone (the shape), for an op whose
   * <entry>_workspace_size is documented to need less than a whole call; NULL: validate's. */
  rlk_status (*size)(const rlk_context *ctx, const void *args, size_t *bytes);
  /* The kernels (NULL: op->plan over call->vals, unless validate chose them). */
  rlk_status (*select)(const rlk_context *ctx, const void *args, rlk_op_call *call);
  /* Kernel i's argument struct (kept in the op's state), completed for its launch. */
  const void *(*params)(const rlk_context *ctx, const void *args, rlk_op_call *call, size_t i);
  /* Without params: where in the op's call struct the one argument struct every kernel takes as
   * validate left it lies (offsetof(<call struct>, <member>), past the rlk_op_call it starts
   * with). */
  size_t params_at;
  /* Kernel i's launch shape; d arrives as one thread of one block. */
  void (*dims)(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d);
  /* Instead of params and dims, for an op whose launches are more than one per kernel: runs them. */
  rlk_status (*launch)(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream);
} rlk_op_entry;

/* The call of entry e on `args`. */
rlk_status rlk_op_run(const rlk_op_entry *e, rlk_context *ctx, const void *args, void *stream);

/* <entry>_workspace_size: the bytes of workspace the call of `args` needs (validate's), 0 on an
 * error. */
rlk_status rlk_op_workspace_size(const rlk_op_entry *e, rlk_context *ctx, const void *args, size_t *bytes);

/* The public functions of an entry (declared and documented in rlk.h): `fn` runs a call of
 * `type` args through `entry`; RLK_OP_DEFINE_CALL_AND_SIZE adds fn##_workspace_size, for an
 * args struct with a workspace. */
#define RLK_OP_DEFINE_CALL(fn, type, entry)                                      \
  RLK_API rlk_status fn(rlk_context *ctx, const type *args, void *stream) {      \
    return rlk_op_run(&(entry), ctx, args, stream);                              \
  }
#define RLK_OP_DEFINE_CALL_AND_SIZE(fn, type, entry)                                        \
  RLK_API rlk_status fn##_workspace_size(rlk_context *ctx, const type *args, size_t *bytes) { \
    return rlk_op_workspace_size(&(entry), ctx, args, bytes);                               \
  }                                                                                         \
  RLK_OP_DEFINE_CALL(fn, type, entry)

#endif
