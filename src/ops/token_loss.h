/* token_loss.h - what the fused token-loss ops (policy_loss.c, value_loss.c) share: the token
 * layouts' checks, the aggregation constant and the launch geometry of the token pass. The
 * layouts, the streams and the divisor their kernels take are declared in
 * templates/common/token_loss_params.h. */
#ifndef RLK_TOKEN_LOSS_H
#define RLK_TOKEN_LOSS_H

#include <stddef.h>
#include <stdint.h>

#include "common/token_loss_params.h"
#include "ops/ops.h"
#include "runtime/op_call.h"

extern const char *const tl_layout_names[TL_LAYOUT_PACKED_I64 + 2]; /* "padded", "packed-i32", "packed-i64" */
extern const char *const tl_agg_names[RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM + 2]; /* rlk_loss_agg order */
extern const char *const tl_packed_names[3]; /* "padded", "packed": a configuration line's layout */
/* a configuration line's normalizer: a number or a device scalar (the same kernels), or the
 * call's own mask count (a count pass first) */
enum { TL_LINE_NORM_VALUE = 0, TL_LINE_NORM_TENSOR = 1, TL_LINE_NORM_COUNT = 2 };
extern const char *const tl_normalizer_names[TL_LINE_NORM_COUNT + 2]; /* "value", "tensor", "count" */

/* The dtypes of a token-loss op's streams. */
#define TL_DTYPES (RLK_DTYPE_BIT(RLK_F32) | RLK_DTYPE_BIT(RLK_F64))
/* The template parameters of every token-loss op's count pass (the layout and a mask kind) and of
 * its reduce and host kernels (the dtype). */
extern const rlk_value_decl *const tl_count_params[2];
/* `dtype`: every token-loss kernel's, and the setting that feeds them. */
extern const rlk_value_decl tl_dtype;
extern const rlk_value_decl *const tl_dtype_params[1];

/* A call's layout, from its primary stream (logp, values), seq_offsets and mask. */
typedef struct tl_layout {
  int layout;     /* TL_LAYOUT_* */
  int64_t rows;   /* B, or S */
  int64_t cols;   /* T, or N */
  rlk_dtype dtype; /* of the primary stream: f32 or f64 */
  int mask;       /* RLK_SEQ_MASK_* */
  int64_t mask_stride;
} tl_layout;

/* Checks the primary stream (2-D: padded, 1-D: packed with offsets), the offsets (shape and
 * dtype; values too on the host backend) and the optional mask. `primary_stride` gets its row
 * stride. */
rlk_status tl_layout_check(const rlk_context *ctx, const rlk_tensor *primary, const char *pname,
                           const rlk_tensor *offsets, const rlk_tensor *mask, tl_layout *L,
                           int64_t *primary_stride);

/* Checks a per-token stream against the layout (same shape and dtype as the primary; rows
 * contiguous). Absent and not required: RLK_OK with *stride 0. */
rlk_status tl_stream_check(const tl_layout *L, const rlk_tensor *t, const char *what, int required,
                           int64_t *stride);

/* tl_stream_check, then the stream's data and row stride into a kernel's streams (in[k] and
 * in_stride[k], or out[k] and out_stride[k]): NULL and 0 for an absent one. */
rlk_status tl_stream_in(const tl_layout *L, const rlk_tensor *t, const char *what, int required, const void **data,
                        long long *stride);
rlk_status tl_stream_out(const tl_layout *L, const rlk_tensor *t, const char *what, int required, void **data,
                         long long *stride);

/* Checks a per-sequence tensor: [rows], the primary's dtype, contiguous. */
rlk_status tl_seq_check(const tl_layout *L, const rlk_tensor *t, const char *what);

/* Checks an output vector: 1-D, contiguous, `dtype`, at least n elements. */
rlk_status tl_vector_check(const rlk_tensor *t, const char *what, rlk_dtype dtype, int64_t n,
                           int required);

/* The normalizers of a call, as the args structs hold them. */
typedef struct tl_norm_args {
  int agg;
  double token_normalizer, seq_normalizer, norm_scale, loss_scale;
  const rlk_tensor *token_tensor, *seq_tensor;
} tl_norm_args;

/* Validates the aggregation and its normalizers. *c = loss_scale / the divisor of the mode
 * (see rlk_loss_agg) when the divisor is known on the host (*kind = TL_NORM_VALUE); otherwise
 * *c is the numerator (loss_scale, or loss_scale / norm_scale) and *kind, *value say what the
 * kernels divide it by: a device scalar tensor, or (token-mean without a normalizer, under a
 * mask) the mask's count. Without a mask that count and the sequence count are known here. */
rlk_status tl_norm_resolve(const tl_layout *L, const tl_norm_args *n, double *c, int *kind,
                           const void **value);

/* How the token pass is cut and launched. */
typedef struct tl_geometry {
  int64_t tiles_per_row, tile; /* padded: tokens per work item */
  int64_t items;               /* work items */
  unsigned grid;               /* blocks of the token pass: at most items, at most
                                * RLK_TL_BLOCKS_PER_SM per multiprocessor */
} tl_geometry;

/* The geometry for a backend with `multiprocessors`; whole_rows: one item per row (the op
 * needs per-row statistics). The host backend runs one kernel call (grid 1). */
void tl_geometry_for(rlk_backend kind, int multiprocessors, const tl_layout *L, int whole_rows,
                     tl_geometry *g);

/* Workspace bytes for `nacc` f64 partials per block, then (count: a mask count pass) one f64
 * per block of the count pass (0 on the host backend). */
size_t tl_workspace_bytes(rlk_backend kind, const tl_geometry *g, int nacc, int count);

/* Where the count pass's partials start in the workspace. */
size_t tl_counts_offset(const tl_geometry *g, int nacc);

/* ---- what the ops' configuration lines and calls share ---- */

/* The indexes, in an op's settings table, of the settings every token-loss op has. */
typedef struct tl_line {
  int dtype, agg, layout, offsets, mask, normalizer;
} tl_line;

/* A token-loss op's templates: on a GPU the count pass, the main pass and the reduce, which take
 * one argument struct; on the host one kernel of the dtype that does the whole call. */
typedef struct tl_templates {
  const rlk_template *count, *main, *reduce, *host;
} tl_templates;

/* The layout (TL_LAYOUT_*) a line's layout and offsets settings name; offsets without
 * layout=packed is refused. */
rlk_status tl_line_layout(const rlk_op_values *s, const tl_line *line, int *layout);

/* The kernels of a token-loss op, in launch order: on a GPU [count,] main, reduce (the count pass
 * when the normalizer is this call's mask count and there is a mask), the main pass's spec the
 * op's; on the host the one kernel. */
rlk_status tl_plan(const rlk_context *ctx, const tl_templates *t, const tl_line *line, const rlk_op_values *s,
                   const rlk_kernel_spec *main_pass, rlk_kernel_spec *specs, size_t *nspecs);

/* A token-loss call (the op's kernel argument follows it in the op's call struct). */
typedef struct tl_call {
  rlk_op_call op;
  tl_layout L;
  tl_geometry g;
  int count; /* token-mean by this call's mask count: the count pass runs first */
} tl_call;

/* Checks the aggregation and its normalizers (tl_norm_resolve) into *c_grad and `norm`, then sets
 * the call's line settings (dtype, agg, layout, offsets, mask, normalizer), its geometry (whole
 * rows: the op needs per-row sums first) and its workspace (nacc partials per block). */
rlk_status tl_call_finish(const rlk_context *ctx, tl_call *c, const tl_line *line, const tl_norm_args *n,
                          int whole_rows, int nacc, double *c_grad, tl_norm *norm);

/* Where a call's count pass keeps its partials in `workspace` (with nacc partials per block ahead
 * of them); NULL without a count pass or a workspace. */
double *tl_counts(const tl_call *c, void *workspace, int nacc);

/* The launch shape of kernel i of a token-loss call planned by tl_plan (an entry's dims). */
void tl_dims(const rlk_context *ctx, const rlk_op_call *call, size_t i, rlk_launch_dims *d);

#endif
