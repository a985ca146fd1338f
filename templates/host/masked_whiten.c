/* masked_whiten.c - host form of the whitening op (templates/cuda/masked_whiten.cuh does it in two
 * launches on a GPU): two passes over the valid elements in fp64, row by row in t order (the sum,
 * then the squared deviations from the mean as defined), then the transform in the data type.
 * Arguments as rlk::masked_whiten_apply; the partials are not used (the whole batch is here).
 * Parameter: RLK_P_DTYPE (float or double). Flags as MW_FLAG_* (src/ops/masked_whiten.c). */
#include "advantage_scan_common.h"

typedef RLK_P_DTYPE ts;

enum { MW_FLAG_UNBIASED = 1, MW_FLAG_EPS_CLAMP = 2, MW_FLAG_KEEP_MEAN = 4, MW_FLAG_NO_STD = 8,
       MW_FLAG_MASKED_ZERO = 16 };

RLK_HOST_KERNEL rlk_masked_whiten(void **args) {
  const ts *x = RLK_ARG(const ts *, 0);
  const rlk_i64 xs = RLK_ARG(rlk_i64, 1);
  const void *mask = RLK_ARG(const void *, 2);
  const rlk_i64 ms = RLK_ARG(rlk_i64, 3);
  const int kind = RLK_ARG(int, 4);
  ts *out = RLK_ARG(ts *, 5);
  const rlk_i64 os = RLK_ARG(rlk_i64, 6);
  const rlk_i64 B = RLK_ARG(rlk_i64, 7), T = RLK_ARG(rlk_i64, 8);
  const double eps = RLK_ARG(double, 11);
  const double count_eps = RLK_ARG(double, 12);
  const int flags = RLK_ARG(int, 13);
  double *stats = RLK_ARG(double *, 14);
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
