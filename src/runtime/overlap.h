/* overlap.h - what a call writes shares memory with no other argument (overlap.c): the exact
 * check over tensors, and the table of an args struct's tensor fields it reads. */
#ifndef RLK_RUNTIME_OVERLAP_H
#define RLK_RUNTIME_OVERLAP_H

#include <stddef.h>
#include <stdint.h>

#include "rlk.h"

/* One tensor argument of a call, for rlk_check_no_overlap. */
typedef struct rlk_arg_ref {
  const rlk_tensor *t;        /* absent (NULL, or data NULL): skipped */
  const char *name;
  int written;                /* an output, or scratch the call writes (a workspace) */
  const rlk_tensor *in_place; /* an argument this one may be exactly (same data, dtype, shape and
                               * strides: a documented in-place form), or NULL */
} rlk_arg_ref;

/* What a call writes shares memory with no other argument: every written tensor's elements have
 * places of their own (no stride 0), and no two arguments of which one is written overlap, by
 * their elements' bytes (interleaved views of one buffer that share none are fine), except as a
 * documented in-place pair. RLK_ERR_INVALID_ARGUMENT naming both. Read-only inputs may overlap
 * each other and repeat elements (a broadcast view). */
rlk_status rlk_check_no_overlap(const rlk_arg_ref *args, size_t n);

/* Whether two tensors share any byte (absent ones share none). Exact for any strides; a layout
 * too costly to tell apart counts as overlapping. */
int rlk_tensors_overlap(const rlk_tensor *a, const rlk_tensor *b);

/* An args struct's tensor field, declared once per op in a table that rlk_check_arg_fields reads:
 * RLK_ARG_IN(rlk_policy_loss_args, logp), RLK_ARG_OUT(..., grad_logp),
 * RLK_ARG_INPLACE(rlk_masked_whiten_args, out, "x") (written, and may be exactly x). */
typedef struct rlk_arg_field {
  size_t offset;
  const char *name;
  int written;
  const char *in_place_of; /* the name of the field it may be exactly, or NULL */
} rlk_arg_field;

#define RLK_ARG_FIELDS_MAX 24
#define RLK_ARG_IN(type, field) {offsetof(type, field), #field, 0, NULL}
#define RLK_ARG_OUT(type, field) {offsetof(type, field), #field, 1, NULL}
#define RLK_ARG_INPLACE(type, field, of) {offsetof(type, field), #field, 1, of}

/* rlk_check_no_overlap over the fields of `args` and the call's workspace (written). */
rlk_status rlk_check_arg_fields(const rlk_arg_field *fields, size_t n, const void *args, const void *workspace,
                                size_t workspace_bytes);

/* A workspace of `bytes` bytes as a tensor, for rlk_check_no_overlap. */
static inline rlk_tensor rlk_workspace_tensor(void *data, size_t bytes) {
  /* the caller's count is only a bound: one past the address space (SIZE_MAX, "plenty") would
   * be a negative shape, or an end that wraps below data, and overlap nothing; what lies past
   * the end of memory is no argument's, so the count is cut there */
  const uint64_t room = (uint64_t)(UINTPTR_MAX - (uintptr_t)data);
  uint64_t n = bytes;
  if (n > room) n = room;
  if (n > (uint64_t)INT64_MAX) n = (uint64_t)INT64_MAX;
  rlk_tensor t = rlk_tensor_1d(n ? data : NULL, RLK_BOOL, (int64_t)n);
  return t;
}

#endif
