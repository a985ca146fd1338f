/* token_baseline_ref.c - see token_baseline_ref.h. Works on per-row tables of the timesteps
 * (the columns, or in compact mode each row's valid tokens in order), so both modes share one
 * baseline loop. */
#include "ref/token_baseline_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_i64(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* The flat index of row b's k-th timestep, with its mask as the baseline weighs it in *mt (1 in
 * compact mode, where every timestep is a valid token): -1 when b has no k-th timestep or it is
 * masked out. */
static int64_t baseline_token(const tb_ref_problem *p, const int64_t *col, const int64_t *steps, int64_t b,
                              int64_t k, double *mt) {
  if (k >= steps[b]) return -1;
  const int64_t i = b * p->T + col[b * p->T + k];
  *mt = p->compact ? 1.0 : (p->mask ? p->mask[i] : 1.0);
  return *mt == 0.0 ? -1 : i;
}

int tb_ref_compute(const tb_ref_problem *p, tb_ref_result *out) {
  const int64_t B = p->B, T = p->T, n = B * T;
  if (p->offsets[0] != 0 || p->offsets[p->num_groups] != B) return -1;
  for (int64_t g = 0; g < p->num_groups; g++)
    if (p->offsets[g + 1] <= p->offsets[g]) return -1;
  double *W = calloc((size_t)n, sizeof *W), *absW = calloc((size_t)n, sizeof *absW),
         *absG = calloc((size_t)n, sizeof *absG);
  /* timestep tables: column of row b's k-th timestep, and its count */
  int64_t *col = malloc((size_t)n * sizeof *col), *steps = malloc((size_t)B * sizeof *steps),
          *lens = malloc((size_t)B * sizeof *lens);
  for (int64_t b = 0; b < B; b++) {
    const double *m = p->mask ? p->mask + b * T : NULL;
    double acc = 0, aacc = 0;
    lens[b] = 0;
    for (int64_t t = 0; t < T; t++) {
      const double mt = m ? m[t] : 1.0;
      if (mt != 0.0) {
        const int64_t i = b * T + t;
        double w = 1.0 - 2.0 * exp(p->old_logp[i]) + p->sum_pi_sq[i];
        if (p->isw) w *= p->isw[i] * p->isw[i];
        acc += w * mt;
        aacc += fabs(w * mt);
        col[b * T + lens[b]++] = t;
      }
      W[b * T + t] = acc;
      absW[b * T + t] = aacc;
    }
    acc = aacc = 0;
    for (int64_t t = T - 1; t >= 0; t--) {
      const double mt = m ? m[t] : 1.0;
      if (mt != 0.0) {
        acc += p->rewards[b * T + t] * mt;
        aacc += fabs(p->rewards[b * T + t] * mt);
      }
      out->ret[b * T + t] = acc;
      absG[b * T + t] = aacc;
    }
    if (!p->compact) {
      steps[b] = T;
      for (int64_t t = 0; t < T; t++) col[b * T + t] = t;
    } else {
      steps[b] = lens[b];
    }
  }
  for (int64_t i = 0; i < n; i++) {
    out->adv[i] = 0;
    out->mag[i] = 0;
  }

  int64_t *members = malloc((size_t)B * sizeof *members), *sorted = malloc((size_t)B * sizeof *sorted);
  for (int64_t g = 0; g < p->num_groups; g++) {
    int64_t N = 0;
    for (int64_t b = p->offsets[g]; b < p->offsets[g + 1]; b++)
      if (!p->compact || lens[b] > 0) members[N++] = b;
    /* the tail rule: the unique longest member, from the second-longest length on */
    int64_t tail_member = -1, tail_from = 0;
    if (p->zero_tail && N >= 2) {
      for (int64_t j = 0; j < N; j++) sorted[j] = lens[members[j]];
      qsort(sorted, (size_t)N, sizeof *sorted, cmp_i64);
      const int64_t mx = sorted[N - 1], second = sorted[N - 2];
      int64_t count = 0;
      for (int64_t j = 0; j < N; j++)
        if (lens[members[j]] == mx) {
          count++;
          tail_member = members[j];
        }
      if (count == 1 && mx > second)
        tail_from = second;
      else
        tail_member = -1;
    }
    int64_t kmax = 0;
    for (int64_t j = 0; j < N; j++) kmax = steps[members[j]] > kmax ? steps[members[j]] : kmax;
    for (int64_t k = 0; k < kmax; k++) {
      double num = 0, den = 0, anum = 0, aden = 0;
      for (int64_t j = 0; j < N; j++) {
        double mt;
        const int64_t i = baseline_token(p, col, steps, members[j], k, &mt);
        if (i < 0) continue;
        num += out->ret[i] * W[i] * mt;
        den += W[i] * mt;
        anum += fabs(out->ret[i] * W[i] * mt);
        aden += fabs(W[i] * mt);
      }
      const double base = N >= 2 ? num / (den + p->eps) : 0.0;
      /* the baseline's error: the terms' errors (each G and W off by their absolute sums)
       * through the ratio */
      double berr = 0;
      if (N >= 2) {
        for (int64_t j = 0; j < N; j++) {
          double mt;
          const int64_t i = baseline_token(p, col, steps, members[j], k, &mt);
          if (i < 0) continue;
          berr += fabs(mt) * (fabs(out->ret[i] - base) * absW[i] + fabs(W[i]) * absG[i]);
        }
        berr = (berr + anum + fabs(base) * aden) / fabs(den + p->eps);
      }
      for (int64_t j = 0; j < N; j++) {
        const int64_t b = members[j];
        if (k >= steps[b]) continue;
        const int64_t i = b * T + col[b * T + k];
        const double mt = p->mask ? p->mask[i] : 1.0;
        if (mt == 0.0) continue;
        const int tail = b == tail_member && k >= tail_from;
        const double bb = tail ? 0.0 : base;
        out->adv[i] = (out->ret[i] - bb) * mt;
        out->mag[i] = fabs(mt) * (absG[i] + fabs(out->ret[i]) + (tail ? 0.0 : berr + fabs(base)));
      }
    }
  }
  free(W);
  free(absW);
  free(absG);
  free(col);
  free(steps);
  free(lens);
  free(members);
  free(sorted);
  return 0;
}
