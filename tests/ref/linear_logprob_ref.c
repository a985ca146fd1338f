/* linear_logprob_ref.c - see linear_logprob_ref.h. */
#include "linear_logprob_ref.h"

#include <string.h>

static double ref_half(uint16_t b, int is_f16) {
  if (is_f16) {
    _Float16 h;
    memcpy(&h, &b, sizeof h);
    return (double)h;
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
  for (int64_t v = 0; v < V; v++) {
    const uint16_t *w = weight + v * ws;
    double s = 0.0;
    for (int64_t k = 0; k < H; k++) s += ref_half(h[k], is_f16) * ref_half(w[k], is_f16);
    x[v] = s;
  }
  lp_ref_forward(x, V, temperature, label, ignore_index, out, bad);
}
