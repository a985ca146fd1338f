/* sample.h - what other calls of the ops layer use of rlk_sample (sample.c). */
#ifndef RLK_OPS_SAMPLE_H
#define RLK_OPS_SAMPLE_H

#include "core/core.h"

/* rlk_sample's checks of `args`, without launching anything (its tensors' data are not read):
 * RLK_OK where rlk_sample(ctx, args) would run. */
rlk_status rlk_sample_check(rlk_context *ctx, const rlk_sample_args *args);

/* The per-row settings and outputs of `args` for `rows` rows, whose dimension messages call `dim`
 * (rlk_sample's "B", rlk_linear_sample's "M"): what rlk_sample_check checks of them. */
rlk_status rlk_sample_check_rows(const rlk_sample_args *args, int64_t rows, const char *dim);

/* The longest vocabulary rlk_sample takes (rlk.h: V < 2^23). */
#define RLK_SAMPLE_MAX_V (((int64_t)1 << 23) - 1)

#endif
