/* linear_logprob_chunk.c - the sm_90a backward's chunk width (linear_logprob_chunk.h). */
#include "ops/linear_logprob_chunk.h"

#define LLC_BM 128 /* the kernels' tile: 128 rows x 256 columns, K in steps of 64 */
#define LLC_BN 256
#define LLC_BK 64
/* A launch's fixed cost in K steps of one tile (about 20 us: its start, the pipeline filling, the
 * stragglers), measured as the cost of a chunk more at whole waves on an H200. */
#define LLC_LAUNCH_STEPS 25

static int64_t llc_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* K steps the fullest multiprocessor takes for `tiles` tiles of `ksteps` each. */
static int64_t llc_launch(int64_t tiles, int64_t ksteps, int64_t sms) {
  return llc_ceil(tiles, sms) * ksteps + LLC_LAUNCH_STEPS;
}

/* One chunk of `nv` columns. */
static int64_t llc_chunk_cost(const rlk_ll_chunk_problem *p, int64_t nv, int64_t sms) {
  const int64_t mt = llc_ceil(p->N, LLC_BM), ht = llc_ceil(p->H, LLC_BN);
  int64_t c = llc_launch(mt * llc_ceil(nv, LLC_BN), llc_ceil(p->H, LLC_BK), sms);
  if (p->grad_hidden) c += llc_launch(mt * ht, llc_ceil(nv, LLC_BK), sms);
  if (p->grad_weight) c += llc_launch(llc_ceil(nv, LLC_BM) * ht, llc_ceil(p->N, LLC_BK), sms);
  return c;
}

int64_t rlk_ll_bwd_sm90_chunk(const rlk_ll_chunk_problem *p) {
  const int64_t vpad = llc_ceil(p->V, LLC_BN) * LLC_BN;
  int64_t widest = p->widest < LLC_BN ? LLC_BN : p->widest / LLC_BN * LLC_BN;
  if (widest > vpad) widest = vpad;
  if (p->multiprocessors <= 0) {
    const int64_t chunks = llc_ceil(vpad, widest);
    return llc_ceil(llc_ceil(vpad, chunks), LLC_BN) * LLC_BN;
  }
  const int64_t sms = p->multiprocessors;
  int64_t best = widest, best_cost = -1;
  for (int64_t w = widest; w >= LLC_BN && 2 * w >= widest; w -= LLC_BN) {
    const int64_t full = p->V / w, rest = p->V - full * w;
    const int64_t cost = full * llc_chunk_cost(p, w, sms) + (rest ? llc_chunk_cost(p, rest, sms) : 0);
    if (best_cost < 0 || cost < best_cost) best = w, best_cost = cost;
  }
  return best;
}
