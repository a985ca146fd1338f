/* linear_logprob_gather.c - host form of rlk::linear_logprob_gather (templates/cuda/
 * linear_logprob_rows.cuh): the selected rows rows[first + j] of src into out [n][pitch], a row
 * of NaN and LP_STATUS_BAD_ROW for an index outside [0, src_rows) or not greater than the one
 * before it, columns [H, pitch) 0. Parameters: RLK_P_DT (the elements' RLK_DT_* code), RLK_P_ROWS
 * (int32_t or int64_t). */
#include <math.h>

#include "rlk_host_grad.h"
#include "linear_logprob_params.h"

RLK_PARAMS_DECLARE(ll_gather_params, RLK_LL_GATHER_PARAMS, RLK_LL_GATHER_PARAMS_SIZE);

RLK_HOST_KERNEL rlk_linear_logprob_gather(void **args) {
  const ll_gather_params *p_ = (const ll_gather_params *)args[0];
  const RLK_P_ROWS *rows = (const RLK_P_ROWS *)p_->rows;
  const rlk_i64 rs = p_->rows_stride, H = p_->H, pitch = p_->pitch;
  const size_t es = RLK_P_DT == RLK_DT_F32 ? 4 : 2;
  for (rlk_i64 j = 0; j < p_->n; j++) {
    const rlk_i64 i = p_->first + j, r = (rlk_i64)rows[i * rs];
    const int ok = r >= 0 && r < p_->src_rows && (i == 0 || (rlk_i64)rows[(i - 1) * rs] < r);
    char *out = (char *)p_->out + (size_t)(j * pitch) * es;
    if (ok) {
      memcpy(out, (const char *)p_->src + (size_t)(r * p_->src_stride) * es, (size_t)H * es);
    } else {
      for (rlk_i64 c = 0; c < H; c++) rlk_grad_put(out, RLK_P_DT, c, NAN);
      if (p_->status) *p_->status |= LP_STATUS_BAD_ROW;
    }
    memset(out + (size_t)H * es, 0, (size_t)(pitch - H) * es);
  }
}
