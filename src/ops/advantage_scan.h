/* advantage_scan.h - argument checks shared by the per-token sequence ops (advantage_scan.c:
 * GAE, discounted returns, reverse cumulative sums; masked_whiten.c; token_kl.c). */
#ifndef RLK_OPS_ADVANTAGE_SCAN_H
#define RLK_OPS_ADVANTAGE_SCAN_H

#include <stdint.h>

#include "ops/ops.h"

/* A required or optional [B, T] tensor of one of `dtypes` with contiguous rows (row stride >= T,
 * any when B == 1). An absent optional tensor is fine. */
rlk_status rlk_seq_check_rows(const rlk_tensor *t, const char *what, int required, uint32_t dtypes,
                              int64_t B, int64_t T);

/* The row stride to pass to a kernel (T when B == 1, the stride then arbitrary, or when t is
 * absent). */
int64_t rlk_seq_row_stride(const rlk_tensor *t, int64_t B, int64_t T);
/* A [B, T] stream as a kernel takes it: its data, and its row stride (rlk_seq_row_stride) in
 * *stride (a kernel argument's field). */
void *rlk_seq_stream(const rlk_tensor *t, int64_t B, int64_t T, long long *stride);

#endif
