/* rlk_float_dtype.h - a floating-point tensor's dtype as a template value ("f32", "f16", "bf16"):
 * the logits of logprob, logprob_shard and sample, the hidden states, heads and gradients of
 * linear_logprob and linear_divergence (a head is f16 or bf16). A kernel's element type follows
 * it; the op maps an rlk_dtype to it (rlk_op_float_dt, src/ops/ops.h). */
#ifndef RLK_FLOAT_DTYPE_H
#define RLK_FLOAT_DTYPE_H

#include "rlk_params.h"

#define RLK_FLOAT_DTS(X)  \
  X(RLK_DT_F32, "f32")    \
  X(RLK_DT_F16, "f16")    \
  X(RLK_DT_BF16, "bf16")
RLK_PARAMS_ENUM(RLK_FLOAT_DTS);

#endif
