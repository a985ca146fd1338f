/* ops.h - what the op families share: the op descriptors (runtime/op.h has their type and the
 * settings machinery, runtime/op_list.h their list) and argument validation helpers (checks.c). */
#ifndef RLK_OPS_H
#define RLK_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "common/rlk_float_dtype.h"
#include "common/rlk_seq_mask.h"
#include "rlk.h"
#include "runtime/context.h"
#include "runtime/op.h"
#include "runtime/op_call.h"
#include "runtime/op_list.h"

/* The op families' descriptors (runtime/op_list.h), each defined in its src/ops/ file. */
#define RLK_OP_DESC_EXTERN(name) extern const rlk_op_desc rlk_op_##name;
RLK_OP_LIST(RLK_OP_DESC_EXTERN, RLK_OP_LIST_SKIP, RLK_OP_LIST_SKIP)
#undef RLK_OP_DESC_EXTERN

/* Every op family that can be precompiled, NULL-terminated (op_table.c, which also hands it down
 * to the runtime's calls over configuration lines). */
extern const rlk_op_desc *const rlk_op_table[];

/* A launch of gx x gy x gz blocks (0 counts as 1) of `block` threads with `smem` bytes of dynamic
 * shared memory. */
static inline rlk_launch_dims rlk_op_grid(uint64_t gx, uint64_t gy, uint64_t gz, unsigned block, size_t smem) {
  return (rlk_launch_dims){.grid = {(unsigned)(gx ? gx : 1), (unsigned)(gy ? gy : 1), (unsigned)(gz ? gz : 1)},
                           .block = {block, 1, 1},
                           .shared_bytes = smem};
}

/* A float tensor's dtype as a kernel's template value (templates/common/rlk_float_dtype.h): f32,
 * f16, else bf16. */
static inline int rlk_op_float_dt(rlk_dtype d) {
  return d == RLK_F32 ? RLK_DT_F32 : d == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
}

/* The row layout of rlk_logprob's vector forward kernel on ctx for logits of that dtype and rows
 * of V elements, with its tuning requests `block` and `unroll` (0: the defaults): the threads per
 * row and the vectors per chunk that fix how a row's sums are rounded. A kernel that computes a
 * row with thread_row_state over this layout (templates/cuda/logprob_common.cuh) gets
 * rlk_logprob's bits. */
rlk_status rlk_logprob_vec_layout(const rlk_context *ctx, rlk_dtype logits, int64_t V, int block,
                                  int unroll, int *seg, int *unroll_out);

/* Validation helpers: each returns RLK_ERR_INVALID_ARGUMENT with "<what>: <problem>". */
rlk_status rlk_check_dtype(const rlk_tensor *t, const char *what, uint32_t allowed_mask);
rlk_status rlk_check_ndim(const rlk_tensor *t, const char *what, int ndim_min, int ndim_max);
rlk_status rlk_check_contiguous(const rlk_tensor *t, const char *what);
/* RLK_ERR_INVALID_ARGUMENT unless rows of `len` contiguous elements `stride` apart are a valid
 * row layout: rows that do not overlap (stride >= len), or one row repeated (stride 0, a
 * broadcast over rows, for inputs; outputs are refused by rlk_check_no_overlap). */
rlk_status rlk_check_row_stride(const char *what, int64_t rows, int64_t stride, int64_t len);

/* A required tensor of an allowed dtype with ndim_min to ndim_max dimensions. */
rlk_status rlk_check_tensor_of(const rlk_tensor *t, const char *what, uint32_t dtypes, int ndim_min, int ndim_max);

/* A required 1-D [N] tensor of an allowed dtype (contiguous when asked); writes its stride (may
 * be NULL). */
rlk_status rlk_check_vector(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t N,
                            int contiguous, int64_t *stride);
/* The same for a length n named n_name in the message ("B": a tensor a row). */
rlk_status rlk_check_vector_of(const rlk_tensor *t, const char *what, uint32_t dtypes, int64_t n,
                               const char *n_name, int contiguous, int64_t *stride);
/* A 2-D [B, T] tensor (its presence and dtype checked by the caller) whose rows are contiguous:
 * stride[1] 1 and a row stride >= T (any when B == 1). */
rlk_status rlk_check_rows(const rlk_tensor *t, const char *what, int64_t B, int64_t T);
/* The same for a 2-D tensor of any shape (its rows and row length its own); writes the row stride
 * a kernel takes (the row length for one row) where stride is not NULL. */
rlk_status rlk_check_contiguous_rows(const rlk_tensor *t, const char *what, int64_t *stride);

/* Argument values: a flag (0 or 1), a finite number, a finite number > 0 or >= 0, a number in
 * [0, 1], and a vocabulary shard's first id (in [0, 2^40]); each message names `what` and the
 * value. */
rlk_status rlk_check_flag(int value, const char *what);
rlk_status rlk_check_finite(double value, const char *what);
rlk_status rlk_check_positive(double value, const char *what);
/* A temperature: finite and at least RLK_TEMPERATURE_MIN (below it log2(e) / T overflows f32, or
 * T^2 underflows, in the kernels' scalings), or with greedy_ok exactly 0 (greedy). */
#define RLK_TEMPERATURE_MIN 0x1p-60
rlk_status rlk_check_temperature(double value, const char *what, int greedy_ok);
rlk_status rlk_check_nonnegative(double value, const char *what);
rlk_status rlk_check_unit_interval(double value, const char *what);
rlk_status rlk_check_vocab_start(int64_t vocab_start);
/* An API enum's value: in [lo, hi], else "<what>: <value> is not an <type>". */
rlk_status rlk_check_enum(int value, const char *what, int lo, int hi, const char *type);

/* An optional `status` output: absent, or an i32 [1] tensor (the word the kernels OR into). */
rlk_status rlk_check_status(const rlk_tensor *t);

/* Host-resident offsets o [count + 1] (rows of what, a 1-D i32 or i64 tensor): first 0, last
 * total (named total_name in the message), non-decreasing; increasing when nonempty. */
rlk_status rlk_check_offset_values(const rlk_tensor *o, const char *what, int64_t count, int64_t total,
                                  const char *total_name, int nonempty);

/* The groups of B sequences (the GRPO-family ops' group_size / group_offsets pair): exactly one
 * of a fixed size dividing B or offsets [num_groups + 1] (i32 or i64, contiguous, 1 <= num_groups
 * <= B). Offsets on the host (`host_values`) are read and checked in full: first 0, last B,
 * every group non-empty; device offsets cannot be read without a synchronization, and the
 * kernels clamp them. Writes *num_groups and *offsets (RLK_DTYPE_INVALID for a fixed size). */
rlk_status rlk_check_groups(int64_t group_size, const rlk_tensor *group_offsets, int64_t B,
                            int host_values, int64_t *num_groups, rlk_dtype *offsets);

/* A per-token mask's kinds (templates/common/rlk_seq_mask.h): their names, NULL-terminated, and
 * the kind of an (optional, already checked) mask tensor. Arrays of names are declared with their
 * size (the last index + 2: the last name, then NULL) so that a setting can allow them all. */
extern const char *const rlk_seq_mask_names[RLK_SEQ_MASK_F32 + 2];
/* `mask`, any of the kinds: a kernel parameter, and the setting that feeds it. */
extern const rlk_value_decl rlk_seq_mask_decl;
int rlk_seq_mask_kind(const rlk_tensor *mask);


#endif
