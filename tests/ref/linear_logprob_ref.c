/* linear_logprob_ref.c - see linear_logprob_ref.h. */
#include "linear_logprob_ref.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static double f16_table[65536];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static void f16_fill(void) {
  for (uint32_t b = 0; b < 65536u; b++) {
    const uint16_t u = (uint16_t)b;
    _Float16 h;
    memcpy(&h, &u, sizeof h);
    f16_table[b] = (double)h;
  }
}

double ll_ref_half(uint16_t b, int is_f16) {
  if (is_f16) {
    pthread_once(&f16_once, f16_fill);
    return f16_table[b];
  }
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return (double)f;
}

void ll_ref_row(const uint16_t *hidden, int64_t hs, const uint16_t *weight, int64_t ws, int is_f16,
                int64_t i, int64_t V, int64_t H, double temperature, int64_t label,
                int64_t ignore_index, double *x, lp_ref_row *out, int *bad) {
  const uint16_t *h = hidden + i * hs;
  double *hk = malloc((size_t)(H > 0 ? H : 1) * sizeof(double)); /* the row once, converted */
  if (!hk) {
    for (int64_t v = 0; v < V; v++) x[v] = NAN; /* shows as a mismatch */
    lp_ref_forward(x, V, temperature, label, ignore_index, out, bad);
    return;
  }
  for (int64_t k = 0; k < H; k++) hk[k] = ll_ref_half(h[k], is_f16);
  for (int64_t v = 0; v < V; v++) {
    const uint16_t *w = weight + v * ws;
    double s = 0.0;
    for (int64_t k = 0; k < H; k++) s += hk[k] * ll_ref_half(w[k], is_f16);
    x[v] = s;
  }
  free(hk);
  lp_ref_forward(x, V, temperature, label, ignore_index, out, bad);
}
