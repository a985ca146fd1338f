/* linear_logprob_scatter.c - host form of rlk::linear_logprob_scatter (templates/cuda/
 * linear_logprob_rows.cuh): grad_hidden [N][H] by row, a selected row (binary search in rows)
 * from its row of dh (grad_hidden's dtype here: the host backward's rows as the call on the
 * gathered rows writes them), plus the value it held when `add`; a row not selected 0 when
 * `zero`, else untouched. Parameters: RLK_P_GH (grad_hidden's RLK_DT_* code), RLK_P_ROWS
 * (int32_t or int64_t). */
#include "rlk_host_grad.h"
#include "linear_logprob_params.h"

RLK_PARAMS_DECLARE(ll_scatter_params, RLK_LL_SCATTER_PARAMS, RLK_LL_SCATTER_PARAMS_SIZE);

RLK_HOST_KERNEL rlk_linear_logprob_scatter(void **args) {
  const ll_scatter_params *p_ = (const ll_scatter_params *)args[0];
  const RLK_P_ROWS *rows = (const RLK_P_ROWS *)p_->rows;
  const rlk_i64 rs = p_->rows_stride, n = p_->n, H = p_->H;
  for (rlk_i64 row = 0; row < p_->N; row++) {
    rlk_i64 lo = 0, hi = n;
    while (lo < hi) {
      const rlk_i64 mid = lo + (hi - lo) / 2;
      if ((rlk_i64)rows[mid * rs] < row)
        lo = mid + 1;
      else
        hi = mid;
    }
    const int selected = lo < n && (rlk_i64)rows[lo * rs] == row;
    const rlk_i64 o = row * p_->gh_stride, d = lo * p_->dh_pitch;
    for (rlk_i64 c = 0; c < H && (selected || p_->zero); c++) {
      const double add = selected && p_->add ? rlk_grad_get(p_->grad_hidden, RLK_P_GH, o + c) : 0.0;
      rlk_grad_put(p_->grad_hidden, RLK_P_GH, o + c, selected ? add + rlk_grad_get(p_->dh, RLK_P_GH, d + c) : 0.0);
    }
  }
}
