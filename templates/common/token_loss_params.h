/* token_loss_params.h - what the arguments of the fused token losses share (policy_loss_params.h,
 * value_loss_params.h): the token layouts, the per-token streams of a call, and how the
 * aggregation's divisor reaches the kernels. Used by templates/cuda/token_loss.cuh,
 * templates/host/token_loss_host.h and src/ops/token_loss.h. */
#ifndef RLK_TOKEN_LOSS_PARAMS_H
#define RLK_TOKEN_LOSS_PARAMS_H

#include "rlk_params.h"

/* Threads per block of every kernel of a call (grad_scale sums the count's partials with a
 * stride of that many), 4-token chunks a thread of the token pass loads at once (f32), and the
 * blocks of the pass that must fit on one multiprocessor together (the launch bound; the op
 * launches at most that many per multiprocessor, so a grid-stride block never waits for a
 * second wave). */
#define RLK_TL_BLOCK 256
#define RLK_TL_UNROLL 2
#define RLK_TL_BLOCKS_PER_SM 2

/* The token layout, a template value of the main and count passes (their "layout" parameter):
 * [B, T] rows, or [N] packed sequences with i32 or i64 seq_offsets. */
#define RLK_TL_LAYOUTS(X)                \
  X(TL_LAYOUT_PADDED, "padded")          \
  X(TL_LAYOUT_PACKED_I32, "packed-i32")  \
  X(TL_LAYOUT_PACKED_I64, "packed-i64")
RLK_PARAMS_ENUM(RLK_TL_LAYOUTS);

/* How the aggregation's divisor reaches the kernels (tl_norm.kind): a host number folded into
 * c_grad, a device scalar (f32 or f64) every block reads, or this call's mask count, summed by a
 * count pass into the workspace. */
#define RLK_TL_NORM_KINDS(X)   \
  X(TL_NORM_VALUE, "value")    \
  X(TL_NORM_F32, "f32")        \
  X(TL_NORM_F64, "f64")        \
  X(TL_NORM_COUNT, "count")
RLK_PARAMS_ENUM(RLK_TL_NORM_KINDS);

/* The token streams of a call with NIN inputs and NOUT outputs. Padded: stream k of row r
 * starts at in[k] + r * in_stride[k] (elements); packed: at in[k] + offsets[r]. cols is T
 * (padded) or N (packed); tiles_per_row and tile cut a padded row into work items. An op's
 * params header declares its streams struct from this list. */
#define RLK_TL_STREAMS(F, S_, NIN, NOUT)                                   \
  F(S_, const void *, in, 0, [NIN])                                        \
  F(S_, void *, out, 8 * (NIN), [NOUT])                                    \
  F(S_, long long, in_stride, 8 * ((NIN) + (NOUT)), [NIN])                 \
  F(S_, long long, out_stride, 8 * (2 * (NIN) + (NOUT)), [NOUT])           \
  F(S_, const void *, mask, 16 * ((NIN) + (NOUT)))                         \
  F(S_, long long, mask_stride, 16 * ((NIN) + (NOUT)) + 8)                 \
  F(S_, const void *, offsets, 16 * ((NIN) + (NOUT)) + 16)                 \
  F(S_, long long, rows, 16 * ((NIN) + (NOUT)) + 24)                       \
  F(S_, long long, cols, 16 * ((NIN) + (NOUT)) + 32)                       \
  F(S_, long long, tiles_per_row, 16 * ((NIN) + (NOUT)) + 40)              \
  F(S_, long long, tile, 16 * ((NIN) + (NOUT)) + 48)
#define RLK_TL_STREAMS_SIZE(NIN, NOUT) (16 * ((NIN) + (NOUT)) + 56)

/* The aggregation's divisor: with TL_NORM_VALUE the kernels use c_grad as it is; otherwise
 * c_grad is the numerator, divided by the scalar at value (TL_NORM_F32, TL_NORM_F64, in device
 * memory) or by the sum of the count pass's partials counts[num_counts] (TL_NORM_COUNT). */
#define RLK_TL_NORM(F, S_)               \
  F(S_, const void *, value, 0)          \
  F(S_, double *, counts, 8)             \
  F(S_, long long, kind, 16)             \
  F(S_, long long, num_counts, 24)
RLK_PARAMS_DECLARE(tl_norm, RLK_TL_NORM, 32);

/* Where a loss lands, from byte o (a multiple of 8): the loss, the metrics, and the blocks'
 * partials [num_partials][NACC] f64 that the finish kernel folds into them. */
#define RLK_TL_RESULTS(F, S_, o)               \
  F(S_, void *, loss, (o))                     \
  F(S_, void *, metrics, (o) + 8)              \
  F(S_, double *, partials, (o) + 16)          \
  F(S_, long long, num_partials, (o) + 24)

/* The code path's row aggregation, layout and mask kind (template values on a GPU, read by the
 * host kernel), from byte o (a multiple of 8). */
#define RLK_TL_ROW_SHAPE(F, S_, o)             \
  F(S_, long long, seqmean, (o))               \
  F(S_, long long, layout, (o) + 8)            \
  F(S_, long long, mask_kind, (o) + 16)

#endif
