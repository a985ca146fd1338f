/* ops.h - the op families' shared pieces: argument validation helpers and the table that
 * rlk_precompile uses to turn a configuration line into kernel specs through the same
 * variant selection a real call makes. */
#ifndef RLK_OPS_H
#define RLK_OPS_H

#include <stddef.h>

#include "core/context.h"
#include "jit/template.h"
#include "rlk.h"

#define RLK_OP_MAX_KERNELS 8

typedef struct rlk_op_config_pair {
  const char *name;
  const char *value;
} rlk_op_config_pair;

typedef struct rlk_op_desc {
  const char *name; /* "group_advantage" */
  const char *help; /* "name: values (default)" lines */
  /* Turns name=value pairs into the kernel specs the op would launch on `ctx`. Unknown names
   * or values: RLK_ERR_INVALID_ARGUMENT naming them. */
  rlk_status (*plan)(const rlk_context *ctx, size_t npairs, const rlk_op_config_pair *pairs,
                     rlk_kernel_spec *specs, size_t *nspecs);
  /* Configuration lines that together reach every kernel variant family of the op (every
   * entry, dtype, mode and code path); the tests compile all of them for every target. */
  const char *const *samples;
  /* Tuning candidates (NULL if none): settings, each appended to a configuration line, that a
   * sweep tool times against each other on a device. Valid on every target: a setting a target
   * cannot honour falls back to its default there (equal specs then time alike). */
  const char *const *candidates;
  /* The tuning database key of a configuration (NULL for an op without candidates): from
   * settings that name one pass and tokens=, the canonical shape (rlk_tune_record.shape, the
   * same string the op's calls look up, defaults spelled out) and the token bucket. A setting
   * that is not part of a key (a tuning setting, pass=both) is RLK_ERR_INVALID_ARGUMENT. */
  rlk_status (*tune_key)(size_t npairs, const rlk_op_config_pair *pairs, char *shape, size_t size,
                         int64_t *tokens);
} rlk_op_desc;

/* Every op family that can be precompiled, NULL-terminated. */
extern const rlk_op_desc *const rlk_op_table[];

#define RLK_OP_CONFIG_MAX_PAIRS 32

/* Splits a configuration line ("op name=value ...") into its op and settings. *line receives a
 * copy of the text that the pairs point into (the caller frees it, also on error). Errors are
 * RLK_ERR_INVALID_ARGUMENT messages prefixed with `who`: an empty line, an unknown op, a setting
 * that is not name=value or is given twice. */
rlk_status rlk_op_config_parse(const char *who, const char *config, char **line, const rlk_op_desc **op,
                               rlk_op_config_pair *pairs, size_t *npairs);

extern const rlk_op_desc rlk_op_group_advantage;
extern const rlk_op_desc rlk_op_policy_loss;
extern const rlk_op_desc rlk_op_value_loss;
extern const rlk_op_desc rlk_op_gae;
extern const rlk_op_desc rlk_op_discounted_returns;
extern const rlk_op_desc rlk_op_reverse_cumsum;
extern const rlk_op_desc rlk_op_masked_whiten;
extern const rlk_op_desc rlk_op_logprob;
extern const rlk_op_desc rlk_op_sample;

/* The row layout of rlk_logprob's vector forward kernel on ctx for logits of that dtype and rows
 * of V elements, with its tuning requests `block` and `unroll` (0: the defaults): the threads per
 * row and the vectors per chunk that fix how a row's sums are rounded. A kernel that computes a
 * row with thread_row_state over this layout (templates/cuda/logprob_common.cuh) gets
 * rlk_logprob's bits. */
rlk_status rlk_logprob_vec_layout(const rlk_context *ctx, rlk_dtype logits, int64_t V, int block,
                                  int unroll, int *seg, int *unroll_out);

/* A configuration line's integer setting: `value` in [lo, hi] (decimal), written to *out;
 * RLK_ERR_INVALID_ARGUMENT naming the setting otherwise. */
rlk_status rlk_op_parse_int(const char *name, const char *value, int64_t lo, int64_t hi, int64_t *out);

/* Validation helpers: each returns RLK_ERR_INVALID_ARGUMENT with "<what>: <problem>". */
rlk_status rlk_check_tensor(const rlk_tensor *t, const char *what, int required);
rlk_status rlk_check_dtype(const rlk_tensor *t, const char *what, uint32_t allowed_mask);
rlk_status rlk_check_ndim(const rlk_tensor *t, const char *what, int ndim_min, int ndim_max);
rlk_status rlk_check_contiguous(const rlk_tensor *t, const char *what);

#define RLK_DTYPE_BIT(d) (1u << (unsigned)(d))

#endif
