/* linear_logprob_plan.c - the forward's records, rows and splits, the backward's chunk width and
 * the token chunks' rows (linear_logprob_plan.h). */
#include "ops/linear_logprob_plan.h"

/* the sm_90a kernels' tile: 128 rows x 256 columns, K in steps of 64 */
#define LLP_BM LL_SM90_BM
#define LLP_BN LL_SM90_BN
#define LLP_BK LL_SM90_BK
/* A launch's fixed cost in K steps of one tile (about 20 us: its start, the pipeline filling, the
 * stragglers), measured as the cost of a chunk more at whole waves on an H200. */
#define LLP_LAUNCH_STEPS 25
/* A launch's grid.y at most (CUDA's limit) */
#define LLP_MAX_GRID_Y ((int64_t)65535)

static int64_t llp_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t rlk_ll_fwd_records(int64_t V) { return llp_ceil(V, RLK_LL_RECORD_COLS); }

int64_t rlk_ll_fwd_rows(int64_t N, int64_t V, int64_t budget) {
  return rlk_ll_rows_within(N, rlk_ll_fwd_records(V) * 16, budget);
}

int64_t rlk_ll_rows_within(int64_t N, int64_t row_bytes, int64_t budget) {
  int64_t rows = budget / row_bytes / LLP_BM * LLP_BM;
  if (rows < LLP_BM) rows = LLP_BM;
  return N < rows ? N : rows;
}

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

int rlk_ll_fwd_cluster(int64_t n, int pair_sms, int multiprocessors) {
  const int64_t row_blocks = llp_ceil(n, LL_SM90_BM), last = n - (row_blocks - 1) * LL_SM90_BM;
  const int few = row_blocks >= 2 && row_blocks <= RLK_LL_FWD_PAIR_ROW_BLOCKS && row_blocks % 2 == 0;
  return few && last <= LL_SM90_BM / 2 && multiprocessors > 0 && pair_sms >= multiprocessors ? 2 : 1;
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

int64_t rlk_ll_bwd_block_rows(int64_t N, int64_t sum_row, int64_t dz_row, int64_t budget) {
  const int64_t per = sum_row + dz_row;
  if (per <= 0 || N <= budget / per) return N;
  const int64_t rows = budget / per / 128 * 128;
  return rows < 128 ? 128 : rows;
}

int64_t rlk_ll_bwd_chunk(int64_t asked, int64_t V, int64_t tile, int64_t room, int64_t column_bytes,
                         rlk_ll_chunk_problem *sm90) {
  const int64_t vpad = llp_ceil(V, tile) * tile;
  int64_t chunk = llp_ceil(asked, tile) * tile;
  if (!chunk) {
    int64_t most = room > 0 ? room / column_bytes / tile * tile : 0;
    if (most < tile) most = tile;
    if (sm90) {
      sm90->widest = most;
      chunk = rlk_ll_bwd_sm90_chunk(sm90);
    } else {
      const int64_t chunks = llp_ceil(vpad, most);
      chunk = llp_ceil(llp_ceil(vpad, chunks), tile) * tile;
    }
  }
  if (chunk > vpad) chunk = vpad;
  /* the portable kernels launch a chunk's column tiles over grid.y: 65535 of them at most */
  if (!sm90 && chunk > LLP_MAX_GRID_Y * tile) chunk = LLP_MAX_GRID_Y * tile;
  return chunk;
}

/* Bytes of grad_weight's read-modify-write that take as long as a tile's K step (H200: 3.6 TB/s
 * against about 0.8 us a step). */
#define LLP_RMW_BYTES_A_STEP ((int64_t)2850000)
#define LLP_ROWS 64

static int64_t llp_token_chunk_cost(int64_t n, int64_t H, int64_t V, int gh, int gw, int64_t sms) {
  const int64_t mt = llp_ceil(n, LLP_BM), ht = llp_ceil(H, LLP_BN);
  int64_t c = llp_launch(mt * llp_ceil(V, LLP_BN), llp_ceil(H, LLP_BK), sms);
  if (gh) c += llp_launch(mt * ht, llp_ceil(V, LLP_BK), sms);
  if (gw) {
    const int64_t work = llp_launch(llp_ceil(V, LLP_BM) * ht, llp_ceil(n, LLP_BK), sms);
    const int64_t rmw = V * H * 8 / LLP_RMW_BYTES_A_STEP + LLP_LAUNCH_STEPS;
    c += work > rmw ? work : rmw;
  }
  return c;
}

int64_t rlk_ll_token_chunk(int64_t N, int64_t H, int64_t V, int grad_hidden, int grad_weight, int multiprocessors,
                           int64_t widest) {
  const int64_t npad = llp_ceil(N > 0 ? N : 1, LLP_ROWS) * LLP_ROWS;
  if (widest > npad) widest = npad;
  widest = widest / LLP_ROWS * LLP_ROWS;
  if (widest < LLP_ROWS) widest = LLP_ROWS;
  if (multiprocessors <= 0) {
    const int64_t chunks = llp_ceil(npad, widest);
    return llp_ceil(llp_ceil(npad, chunks), LLP_ROWS) * LLP_ROWS;
  }
  int64_t best = widest, best_cost = -1;
  for (int64_t n = widest; n >= LLP_ROWS && 2 * n >= widest; n -= LLP_ROWS) {
    const int64_t full = N / n, rest = N - full * n;
    const int64_t cost = full * llp_token_chunk_cost(n, H, V, grad_hidden, grad_weight, multiprocessors) +
                         (rest ? llp_token_chunk_cost(rest, H, V, grad_hidden, grad_weight, multiprocessors) : 0);
    if (best_cost < 0 || cost < best_cost) best = n, best_cost = cost;
  }
  return best;
}
