/* advantage_scan.h - argument checks shared by the per-token sequence ops (advantage_scan.c:
 * GAE, discounted returns, reverse cumulative sums; masked_whiten.c; token_kl.c). */
#ifndef RLK_OPS_ADVANTAGE_SCAN_H
#define RLK_OPS_ADVANTAGE_SCAN_H

#include <stdint.h>

#include "ops/ops.h"

/* Mask kinds as the templates see them (the index of each in rlk_seq_mask_names). */
enum { RLK_SEQ_MASK_NONE = 0, RLK_SEQ_MASK_BOOL = 1, RLK_SEQ_MASK_I32 = 2, RLK_SEQ_MASK_F32 = 3 };

/* "none", "bool", "i32", "f32", NULL. */
extern const char *const rlk_seq_mask_names[];

/* The mask kind of an (optional, already checked) mask tensor. */
int rlk_seq_mask_kind(const rlk_tensor *mask);

/* A required or optional [B, T] tensor of one of `dtypes` with contiguous rows (row stride >= T,
 * any when B == 1). An absent optional tensor is fine. */
rlk_status rlk_seq_check_rows(const rlk_tensor *t, const char *what, int required, uint32_t dtypes,
                              int64_t B, int64_t T);

/* The row stride to pass to a kernel (T when B == 1: the stride is then arbitrary). */
int64_t rlk_seq_row_stride(const rlk_tensor *t, int64_t B, int64_t T);

#endif
