/* sample.h - what other calls of the ops layer use of rlk_sample (sample.c). */
#ifndef RLK_OPS_SAMPLE_H
#define RLK_OPS_SAMPLE_H

#include "core/core.h"

/* rlk_sample's checks of `args`, without launching anything (its tensors' data are not read):
 * RLK_OK where rlk_sample(ctx, args) would run. */
rlk_status rlk_sample_check(rlk_context *ctx, const rlk_sample_args *args);

#endif
