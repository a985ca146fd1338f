/* sample_ref.c - see sample_ref.h. Plain fp64 with a full sort: the obvious way, independent of
 * the kernels' thresholds and fixed-point masses. */
#include "ref/sample_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../templates/host/rlk_host_philox.h"

typedef struct ref_item {
  double x;
  int64_t j;
} ref_item;

static int by_value_desc(const void *a, const void *b) {
  const ref_item *p = a, *q = b;
  if (p->x != q->x) return p->x > q->x ? -1 : 1;
  return p->j < q->j ? -1 : (p->j > q->j);
}

int64_t smp_ref_probs(const double *x, int64_t V, double T, int64_t top_k, double top_p, double min_p,
                      double *probs, double *margin) {
  ref_item *it = malloc((size_t)V * sizeof *it);
  int64_t n = 0;
  for (int64_t j = 0; j < V; j++) {
    probs[j] = 0.0;
    if (x[j] != -INFINITY) it[n++] = (ref_item){x[j], j};
  }
  qsort(it, (size_t)n, sizeof *it, by_value_desc);
  *margin = INFINITY;
  const double M = it[0].x;
  /* min-p and top-k: a prefix of the sorted tokens */
  int64_t keep = n;
  if (min_p > 0.0) {
    const double l2 = log2(min_p);
    int64_t m = 0;
    while (m < n && (it[m].x - M) / T / log(2.0) >= l2) m++;
    /* the elements on either side of the bound decide it */
    if (m > 0) *margin = fmin(*margin, fabs((it[m - 1].x - M) / T / log(2.0) - l2));
    if (m < n) *margin = fmin(*margin, fabs((it[m].x - M) / T / log(2.0) - l2));
    keep = m < keep ? m : keep;
  }
  if (top_k > 0 && top_k < V) {
    const double kth = top_k <= n ? it[top_k - 1].x : -INFINITY;
    int64_t m = 0;
    while (m < n && it[m].x >= kth) m++;
    keep = m < keep ? m : keep;
  }
  /* top-p over the renormalized prefix: groups of equal values, kept while the mass above < p */
  double Z = 0.0;
  for (int64_t i = 0; i < keep; i++) Z += exp((it[i].x - M) / T);
  if (top_p < 1.0) {
    double above = 0.0;
    int64_t i = 0;
    double last = 0.0; /* the mass above the last kept group */
    while (i < keep) {
      if (above >= top_p * Z) break;
      last = above;
      int64_t g = i;
      while (g < keep && it[g].x == it[i].x) above += exp((it[g++].x - M) / T);
      i = g;
    }
    /* the cut flips only if rounding moves one of the two sums around it across p Z */
    *margin = fmin(*margin, (top_p * Z - last) / Z * 1e2);
    if (i < keep) *margin = fmin(*margin, (above - top_p * Z) / Z * 1e2);
    keep = i;
  }
  double S = 0.0;
  for (int64_t i = 0; i < keep; i++) S += exp((it[i].x - M) / T);
  for (int64_t i = 0; i < keep; i++) probs[it[i].j] = exp((it[i].x - M) / T) / S;
  free(it);
  return keep;
}

void smp_ref_draw(uint64_t seed, uint64_t offset, uint64_t stream, uint64_t *r1, uint64_t *r2) {
  rlk_philox_ctr c = {{(uint32_t)offset, (uint32_t)(offset >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)}};
  const rlk_philox_ctr d = rlk_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
  *r1 = (uint64_t)d.v[0] | ((uint64_t)d.v[1] << 32);
  *r2 = (uint64_t)d.v[2] | ((uint64_t)d.v[3] << 32);
}

double smp_ref_chi2_bound(double df, double z) {
  const double a = 2.0 / (9.0 * df);
  const double t = 1.0 - a + z * sqrt(a);
  return df * t * t * t;
}
