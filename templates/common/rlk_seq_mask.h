/* rlk_seq_mask.h - the kind of a per-token mask, a template value of every op that takes one
 * (its "mask" setting and parameter): none (every token counts), or the mask's dtype. A bool or i32
 * mask counts a token where it is nonzero; an f32 mask also weights it. */
#ifndef RLK_SEQ_MASK_H
#define RLK_SEQ_MASK_H

#include "rlk_params.h"

#define RLK_SEQ_MASK_KINDS(X)       \
  X(RLK_SEQ_MASK_NONE, "none")      \
  X(RLK_SEQ_MASK_BOOL, "bool")      \
  X(RLK_SEQ_MASK_I32, "i32")        \
  X(RLK_SEQ_MASK_F32, "f32")
RLK_PARAMS_ENUM(RLK_SEQ_MASK_KINDS);

#endif
