/* linear_logprob_ref.h - an fp64 reference for rlk_linear_logprob: the row's logits
 * x_v = sum_k h_k w_vk in fp64 from the stored 16-bit values, then lp_ref_forward. */
#ifndef RLK_LINEAR_LOGPROB_REF_H
#define RLK_LINEAR_LOGPROB_REF_H

#include <stdint.h>

#include "logprob_ref.h"

/* A stored 16-bit value (f16 when is_f16, else bf16) as a double, exactly; f16 through a table
 * (the compiler's software conversion costs ~10 ns, and the references convert billions). */
double ll_ref_half(uint16_t b, int is_f16);

/* One row i of hidden [N, H] (row stride hs) against weight [V, H] (row stride ws), 16-bit
 * storage (f16 when is_f16, else bf16). `x` is scratch of V doubles. */
void ll_ref_row(const uint16_t *hidden, int64_t hs, const uint16_t *weight, int64_t ws, int is_f16,
                int64_t i, int64_t V, int64_t H, double temperature, int64_t label,
                int64_t ignore_index, double *x, lp_ref_row *out, int *bad);

#endif
