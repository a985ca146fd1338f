/* value_loss_params.h - the argument of the value loss kernels (templates/cuda/value_loss.cuh,
 * templates/host/value_loss.c), filled by src/ops/value_loss.c. On a GPU seqmean, layout and
 * mask_kind are template parameters and unread; the host kernel reads them. clip is > 0 or
 * infinity; c_grad the gradient constant (or its numerator: see tl_norm); bound_g the clip's
 * gradient on its bounds. */
#ifndef RLK_VALUE_LOSS_PARAMS_H
#define RLK_VALUE_LOSS_PARAMS_H

#include "rlk_params.h"
#include "token_loss_params.h"

/* The streams: inputs and outputs by index. */
enum { VL_IN_V, VL_IN_OLD, VL_IN_RET, VL_NIN };
enum { VL_OUT_GV, VL_NOUT };

/* The accumulators, in the order of a block's partials [NACC] f64. */
enum { VL_A_LOSS, VL_A_MASK, VL_A_CLIP, VL_A_V, VL_A_ERR, VL_NACC };

#define RLK_VL_STREAMS(F, S_) RLK_TL_STREAMS(F, S_, VL_NIN, VL_NOUT)
RLK_PARAMS_DECLARE(vl_streams, RLK_VL_STREAMS, RLK_TL_STREAMS_SIZE(VL_NIN, VL_NOUT));

#define RLK_VL_PARAMS(F, S_)              \
  F(S_, vl_streams, s, 0)                 \
  RLK_TL_RESULTS(F, S_, 120)              \
  RLK_TL_ROW_SHAPE(F, S_, 152)            \
  F(S_, double, clip, 176)                \
  F(S_, double, c_grad, 184)              \
  F(S_, double, bound_g, 192)             \
  F(S_, tl_norm, norm, 200)
RLK_PARAMS_DECLARE(vl_args, RLK_VL_PARAMS, 232);

#endif
