/* advantage_scan_ref.c - the fp64 references of advantage_scan_ref.h: each trainer's loop over
 * time, done for all rows at once per step as the trainers do with [B] tensors. */
#include "ref/advantage_scan_ref.h"

#include <math.h>
#include <stdlib.h>

static double mask_at(const double *mask, int64_t i) { return mask ? mask[i] : 1.0; }

void as_ref_gae_verl(int64_t B, int64_t T, const double *rewards, const double *values,
                     const double *mask, double gamma, double lam, double *adv, double *ret) {
  double *nextvalues = calloc((size_t)B, sizeof *nextvalues);
  double *lastgaelam = calloc((size_t)B, sizeof *lastgaelam);
  for (int64_t t = T - 1; t >= 0; t--) {
    for (int64_t b = 0; b < B; b++) {
      const int64_t i = b * T + t;
      const double m = mask_at(mask, i);
      const double delta = rewards[i] + gamma * nextvalues[b] - values[i];
      const double lastgaelam_ = delta + gamma * lam * lastgaelam[b];
      nextvalues[b] = values[i] * m + (1.0 - m) * nextvalues[b];
      lastgaelam[b] = lastgaelam_ * m + (1.0 - m) * lastgaelam[b];
      adv[i] = lastgaelam[b];
    }
  }
  for (int64_t i = 0; i < B * T; i++) ret[i] = adv[i] + values[i];
  free(nextvalues);
  free(lastgaelam);
}

void as_ref_gae_openrlhf(int64_t B, int64_t T, const double *rewards, const double *values,
                         const double *mask, double gamma, double lam, double *adv, double *ret) {
  double *v = malloc((size_t)(B * T) * sizeof *v), *r = malloc((size_t)(B * T) * sizeof *r);
  for (int64_t i = 0; i < B * T; i++) {
    v[i] = mask_at(mask, i) * values[i];
    r[i] = mask_at(mask, i) * rewards[i];
  }
  double *lastgaelam = calloc((size_t)B, sizeof *lastgaelam);
  for (int64_t t = T - 1; t >= 0; t--) {
    for (int64_t b = 0; b < B; b++) {
      const double nextvalues = t < T - 1 ? v[b * T + t + 1] : 0.0;
      const double delta = r[b * T + t] + gamma * nextvalues - v[b * T + t];
      lastgaelam[b] = delta + gamma * lam * lastgaelam[b];
      adv[b * T + t] = lastgaelam[b];
    }
  }
  for (int64_t i = 0; i < B * T; i++) ret[i] = adv[i] + v[i];
  free(v);
  free(r);
  free(lastgaelam);
}

void as_ref_returns_reinforce_pp(int64_t B, int64_t T, const double *rewards, const double *mask,
                                 double gamma, double *ret) {
  double *running = calloc((size_t)B, sizeof *running);
  for (int64_t t = T - 1; t >= 0; t--) {
    for (int64_t b = 0; b < B; b++) {
      running[b] = rewards[b * T + t] + gamma * running[b];
      ret[b * T + t] = running[b];
      running[b] = running[b] * mask_at(mask, b * T + t); /* reset after the end of a response */
    }
  }
  free(running);
}

void as_ref_returns_reinforce_pp_carry(int64_t B, int64_t T, const double *rewards, const double *mask,
                                       double gamma, double *ret) {
  double *running = calloc((size_t)B, sizeof *running);
  for (int64_t t = T - 1; t >= 0; t--) {
    for (int64_t b = 0; b < B; b++) {
      const double m = mask_at(mask, b * T + t), next = rewards[b * T + t] + gamma * running[b];
      ret[b * T + t] = next * m;
      running[b] = next * m + running[b] * (1.0 - m);
    }
  }
  free(running);
}

void as_ref_returns_openrlhf(int64_t B, int64_t T, const double *rewards, const double *mask,
                             double gamma, double *ret) {
  double *cumulative = calloc((size_t)B, sizeof *cumulative);
  for (int64_t t = T - 1; t >= 0; t--) {
    for (int64_t b = 0; b < B; b++) {
      cumulative[b] = mask_at(mask, b * T + t) * rewards[b * T + t] + gamma * cumulative[b];
      ret[b * T + t] = cumulative[b];
    }
  }
  free(cumulative);
}

void as_ref_remax(int64_t B, int64_t T, const double *rewards, const double *mask,
                  const double *baseline, double *ret, double *adv) {
  for (int64_t b = 0; b < B; b++) {
    /* flip, cumsum, flip */
    double acc = 0.0;
    for (int64_t k = 0; k < T; k++) {
      const int64_t t = T - 1 - k;
      acc += rewards[b * T + t] * mask_at(mask, b * T + t);
      ret[b * T + t] = acc;
    }
    if (adv)
      for (int64_t t = 0; t < T; t++) adv[b * T + t] = ret[b * T + t] - baseline[b] * mask_at(mask, b * T + t);
  }
}

/* sum(values * mask) / (sum(mask) + add) */
static double masked_mean(int64_t n, const double *v, const double *mask, double add) {
  double s = 0.0, c = 0.0;
  for (int64_t i = 0; i < n; i++) {
    s += v[i] * mask_at(mask, i);
    c += mask_at(mask, i);
  }
  return s / (c + add);
}

static double mask_sum(int64_t n, const double *mask) {
  double c = 0.0;
  for (int64_t i = 0; i < n; i++) c += mask_at(mask, i);
  return c;
}

int as_ref_whiten_verl(int64_t n, const double *x, const double *mask, int shift_mean, double *out) {
  const double mean = masked_mean(n, x, mask, 1e-8);
  double *centered = calloc((size_t)n, sizeof *centered);
  for (int64_t i = 0; i < n; i++) centered[i] = (x[i] - mean) * (x[i] - mean);
  double var = masked_mean(n, centered, mask, 1e-8);
  free(centered);
  const double msum = mask_sum(n, mask);
  if (msum == 0.0 || msum == 1.0) return -1;
  var = var * (msum / (msum - 1.0));
  const double rstd = 1.0 / sqrt(var + 1e-8);
  for (int64_t i = 0; i < n; i++) {
    out[i] = (x[i] - mean) * rstd;
    if (!shift_mean) out[i] += mean;
  }
  return 0;
}

int as_ref_whiten_trl(int64_t n, const double *x, const double *mask, int shift_mean, double *out) {
  const double msum = mask_sum(n, mask);
  if (msum == 0.0 || msum == 1.0) return -1;
  const double mean = masked_mean(n, x, mask, 0.0);
  double *centered = calloc((size_t)n, sizeof *centered);
  for (int64_t i = 0; i < n; i++) centered[i] = (x[i] - mean) * (x[i] - mean);
  const double var = masked_mean(n, centered, mask, 0.0) * (msum / (msum - 1.0));
  free(centered);
  const double rstd = 1.0 / sqrt(var + 1e-8);
  for (int64_t i = 0; i < n; i++) {
    double w = (x[i] - mean) * rstd;
    if (!shift_mean) w += mean;
    out[i] = mask_at(mask, i) == 0.0 ? 0.0 : w; /* masked_fill(padding, 0) */
  }
  return 0;
}

void as_ref_whiten_openrlhf(int64_t n, const double *x, const double *mask, int no_std_norm,
                            double *out) {
  const double num_actions = mask_sum(n, mask);
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += x[i] * mask_at(mask, i);
  const double mean = s / num_actions;
  double rstd = 1.0;
  if (!no_std_norm) {
    double q = 0.0;
    for (int64_t i = 0; i < n; i++) q += (x[i] - mean) * (x[i] - mean) * mask_at(mask, i);
    const double var = q / num_actions;
    rstd = 1.0 / sqrt(var < 1e-8 ? 1e-8 : var);
  }
  for (int64_t i = 0; i < n; i++) out[i] = (x[i] - mean) * rstd;
}

void as_ref_whiten(int64_t n, const double *x, const double *mask, const as_ref_whiten_params *p,
                   double *out, double stats[3]) {
  double N = 0.0, s = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (mask_at(mask, i) != 0.0) {
      N += 1.0;
      s += x[i];
    }
  double mean = s / (N + p->count_eps);
  double q = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (mask_at(mask, i) != 0.0) q += (x[i] - mean) * (x[i] - mean);
  double var = q / (N + p->count_eps);
  if (p->unbiased) var = N > 1.0 ? var * N / (N - 1.0) : NAN;
  if (N == 0.0) mean = var = NAN;
  double rstd;
  if (!p->normalize_std)
    rstd = 1.0;
  else if (p->eps_clamp)
    rstd = isnan(var) ? NAN : 1.0 / sqrt(var < p->eps ? p->eps : var);
  else
    rstd = 1.0 / sqrt(var + p->eps);
  if (N == 0.0) rstd = NAN;
  for (int64_t i = 0; i < n; i++) {
    double w = (x[i] - mean) * rstd;
    if (!p->shift_mean) w += mean;
    out[i] = (p->masked_zero && mask_at(mask, i) == 0.0) ? 0.0 : w;
  }
  if (stats) {
    stats[0] = mean;
    stats[1] = var;
    stats[2] = N;
  }
}
