/* linear_logprob_plan.c - the forward's splits and the backward's chunk width
 * (linear_logprob_plan.h). */
#include "ops/linear_logprob_plan.h"

#define LLP_BM 128 /* the kernels' tile: 128 rows x 256 columns, K in steps of 64 */
#define LLP_BN 256
#define LLP_BK 64
/* A launch's fixed cost in K steps of one tile (about 20 us: its start, the pipeline filling, the
 * stragglers), measured as the cost of a chunk more at whole waves on an H200. */
#define LLP_LAUNCH_STEPS 25

static int64_t llp_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

void rlk_ll_fwd_splits(int64_t V, int64_t row_blocks, int64_t slots, int asked, int64_t *splits,
                       int64_t *cols_per_split) {
  const int64_t tiles = llp_ceil(V, RLK_LL_SPLIT_COLS);
  int64_t best = 1;
  if (asked > 0) {
    best = asked < tiles ? asked : tiles;
  } else {
    int64_t best_cost = -1;
    for (int64_t s = 1; s <= tiles && s <= 4096; s++) {
      const int64_t per = llp_ceil(tiles, s);
      const int64_t cost = llp_ceil(row_blocks * s, slots) * per; /* waves x tiles a split */
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        best = s;
      }
    }
  }
  const int64_t per = llp_ceil(tiles, best);
  *cols_per_split = per * RLK_LL_SPLIT_COLS;
  *splits = llp_ceil(tiles, per);
}

/* K steps the fullest multiprocessor takes for `tiles` tiles of `ksteps` each. */
static int64_t llp_launch(int64_t tiles, int64_t ksteps, int64_t sms) {
  return llp_ceil(tiles, sms) * ksteps + LLP_LAUNCH_STEPS;
}

/* One chunk of `nv` columns. */
static int64_t llp_chunk_cost(const rlk_ll_chunk_problem *p, int64_t nv, int64_t sms) {
  const int64_t mt = llp_ceil(p->N, LLP_BM), ht = llp_ceil(p->H, LLP_BN);
  int64_t c = llp_launch(mt * llp_ceil(nv, LLP_BN), llp_ceil(p->H, LLP_BK), sms);
  if (p->grad_hidden) c += llp_launch(mt * ht, llp_ceil(nv, LLP_BK), sms);
  if (p->grad_weight) c += llp_launch(llp_ceil(nv, LLP_BM) * ht, llp_ceil(p->N, LLP_BK), sms);
  return c;
}

int64_t rlk_ll_bwd_sm90_chunk(const rlk_ll_chunk_problem *p) {
  const int64_t vpad = llp_ceil(p->V, LLP_BN) * LLP_BN;
  int64_t widest = p->widest < LLP_BN ? LLP_BN : p->widest / LLP_BN * LLP_BN;
  if (widest > vpad) widest = vpad;
  if (p->multiprocessors <= 0) {
    const int64_t chunks = llp_ceil(vpad, widest);
    return llp_ceil(llp_ceil(vpad, chunks), LLP_BN) * LLP_BN;
  }
  const int64_t sms = p->multiprocessors;
  int64_t best = widest, best_cost = -1;
  for (int64_t w = widest; w >= LLP_BN && 2 * w >= widest; w -= LLP_BN) {
    const int64_t full = p->V / w, rest = p->V - full * w;
    const int64_t cost = full * llp_chunk_cost(p, w, sms) + (rest ? llp_chunk_cost(p, rest, sms) : 0);
    if (best_cost < 0 || cost < best_cost) best = w, best_cost = cost;
  }
  return best;
}
