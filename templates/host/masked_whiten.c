/* masked_whiten.c - host form of the whitening op (templates/cuda/masked_whiten.cuh does it in two
 * launches on a GPU): two passes over the valid elements in fp64, row by row in t order (the sum,
 * then the squared deviations from the mean as defined), then the transform in the data type.
 * Arguments as rlk::masked_whiten_apply (masked_whiten_params.h); the partials are not used (the
 * whole batch is here).
 * Parameter: RLK_P_DTYPE (float or double). Flags as MW_FLAG_* (masked_whiten_params.h). */
#include "advantage_scan_common.h"
#include "masked_whiten_params.h"

typedef RLK_P_DTYPE ts;

RLK_HOST_KERNEL rlk_masked_whiten(void **args) {
  const mw_apply_args *p_ = (const mw_apply_args *)args[0];
  const ts *x = (const ts *)p_->x;
  const rlk_i64 xs = p_->xs;
  const void *mask = p_->mask;
  const rlk_i64 ms = p_->ms;
  const int kind = p_->mask_kind;
  ts *out = (ts *)p_->out;
  const rlk_i64 os = p_->os;
  const rlk_i64 B = p_->B, T = p_->T;
  const double eps = p_->eps;
  const double count_eps = p_->count_eps;
  const int flags = p_->flags;
  double *stats = p_->stats;
  const double nan = __builtin_nan("");

  double n = 0, sum = 0;
  for (rlk_i64 b = 0; b < B; b++)
    for (rlk_i64 t = 0; t < T; t++)
      if (seq_valid_at(mask, kind, b * ms + t)) {
        n += 1;
        sum += (double)x[b * xs + t];
      }
  double mean = sum / (n + count_eps);
  double q = 0;
  for (rlk_i64 b = 0; b < B; b++)
    for (rlk_i64 t = 0; t < T; t++)
      if (seq_valid_at(mask, kind, b * ms + t)) {
        const double d = (double)x[b * xs + t] - mean;
        q += d * d;
      }
  double var = q / (n + count_eps);
  if (flags & MW_FLAG_UNBIASED) var = n > 1 ? var * (n / (n - 1)) : nan;
  if (n == 0) {
    mean = nan;
    var = nan;
  }
  double rstd;
  if (flags & MW_FLAG_NO_STD)
    rstd = 1;
  else if (flags & MW_FLAG_EPS_CLAMP)
    rstd = 1 / rlk_sqrt(var < eps ? eps : var); /* NaN stays NaN, like a clamp */
  else
    rstd = 1 / rlk_sqrt(var + eps);
  if (n == 0) rstd = nan;
  if (stats) {
    stats[0] = mean;
    stats[1] = var;
    stats[2] = n;
  }

  const ts m = (ts)mean, r = (ts)rstd;
  for (rlk_i64 b = 0; b < B; b++)
    for (rlk_i64 t = 0; t < T; t++) {
      const int valid = seq_valid_at(mask, kind, b * ms + t);
      ts w = (x[b * xs + t] - m) * r;
      if (flags & MW_FLAG_KEEP_MEAN) w += m;
      out[b * os + t] = (!valid && (flags & MW_FLAG_MASKED_ZERO)) ? (ts)0 : w;
    }
}
