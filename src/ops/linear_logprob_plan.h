/* linear_logprob_plan.h - how rlk_linear_logprob cuts its work when the call leaves it to it: the
 * forward's records, row launches and vocabulary splits, and the backward's sm_90a chunk width.
 *
 * Batch invariance: a row's outputs (logp, lse, entropy; grad_hidden's row in the backward) are
 * bitwise the same for any N, any place of the row in the batch, any packing, token chunking,
 * workspace size or tuning database, given equal hidden states, weight, label and settings on
 * the same kernel (the sm_90a wgmma kernels, or the portable tiled ones: their in-tile K orders
 * differ, so their bits do too). What decides a row's bits, and what it depends on:
 *   - the logit x = h . w_v: one kernel's K order over H, the same for every row of a tile and
 *     every tile (wgmma m64n256k16 in steps of 64 on sm_90a; the tiled kernel's fmaf chain);
 *   - the records: one per RLK_LL_RECORD_COLS columns of a row (rlk_ll_fwd_records: from V
 *     alone), each from its 256 logits in a fixed order (ll_tile_record on sm_90a);
 *   - their merge: a warp per row, lane k taking records k, k + 32, ... then a butterfly, a tree
 *     fixed by the record count;
 *   - the backward's dz = f(x, lse, ...) element by element, and grad_hidden's row: one K chain
 *     over the whole vocabulary (the dh kernels start each vocabulary chunk from the sum so far,
 *     never from 0), so the chunk width does not enter.
 * What depended on N before, and what it depends on now:
 *   - the vocabulary split (rlk_ll_fwd_splits: whole waves of row blocks x splits) cut a row's
 *     fold into split records merged in split order: a split is now a run of whole records, a
 *     schedule only; the split count still follows N (and the device) for speed;
 *   - the split from the tuning database (a winner per token bucket): the same, no longer bits;
 *   - the backward's chunk (from N through the 288 MiB workspace budget and the cost model) cut
 *     grad_hidden's sum into chunk sums added in order: now one chain (above);
 *   - the forward's workspace held a record per split; it holds ceil(V / 256) records a row,
 *     for at most rlk_ll_fwd_rows rows at a time (row launches: rows are independent).
 * Cost on an H200 (the model; a GPU run measures it): the GEMM's tiles and waves are unchanged;
 * per tile a consumer adds a 4-lane maximum and writes 16 bytes a row (2 KB a 128-row tile beside
 * its 64 K steps of 4 MB of operands), and the combine reads 9.5 KB a row at V 151936 (78 MB at
 * N 8192: about 25 us beside the forward's 15 ms, 0.2%; at decode sizes, N <= 256, 2.4 MB and
 * about 3 us beside the 260 us that reading W takes, 1%). The backward's dh loads its 128 x 256
 * f32 accumulator tile at the start of each chunk's tile instead of reduce-adding it at the end
 * (the same bytes, read before the products instead of after them: about 1% of a dh tile's
 * 264 K steps at N 8192, H 4096, V 151936). */
#ifndef RLK_LINEAR_LOGPROB_PLAN_H
#define RLK_LINEAR_LOGPROB_PLAN_H

#include <stdint.h>

#include "common/linear_logprob_params.h"

#define RLK_LL_SPLIT_COLS 256 /* a forward split covers a multiple of this many columns */

/* A row's records: ceil(V / RLK_LL_RECORD_COLS), from V alone (their merge tree with them). */
int64_t rlk_ll_fwd_records(int64_t V);

/* The rows a forward launch takes at most: N, or as many whole 128-row blocks as keep their
 * records within `budget` bytes (at least one block). */
int64_t rlk_ll_fwd_rows(int64_t N, int64_t V, int64_t budget);

/* N, or as many whole 128-row blocks of row_bytes a row as fit `budget` bytes (at least one). */
int64_t rlk_ll_rows_within(int64_t N, int64_t row_bytes, int64_t budget);

/* The forward's vocabulary split, a schedule only (a split is a run of whole records): `asked`
 * splits (capped at the 256-column tiles), or with 0 the fewest splits that reach the least
 * (waves x tiles per split) for `row_blocks` blocks of rows on `slots` concurrently resident
 * blocks. Writes the splits and the columns each covers. */
void rlk_ll_fwd_splits(int64_t V, int64_t row_blocks, int64_t slots, int asked, int64_t *splits,
                       int64_t *cols_per_split);

/* The sm_90a forward's cluster for a launch of n rows on a device with `pair_sms`
 * multiprocessors busy in clusters of two blocks (rlk_target.cluster_sms[1]; 0 unknown): 2, pairs
 * of consecutive 128-row blocks that share each W box (multicast), where the launch is a few row
 * blocks (an even number, RLK_LL_FWD_PAIR_ROW_BLOCKS at most) whose last holds at most 64 rows,
 * and pairs keep every multiprocessor busy; else 1, each block reading W alone. Why: the blocks of
 * a split read the same W boxes, which the second finds in L2 while they keep pace; a last block
 * whose second consumer warpgroup has no rows multiplies half as much, runs ahead, and its split's
 * W comes from DRAM twice (on an H100, 129 rows took 0.93 ms alone, 0.67 ms in pairs, 256 rows
 * 0.73 ms). Blocks that keep pace gain nothing from the pair's handshakes (256 rows: 1% slower). A
 * schedule only: a block's records are the same bits either way. */
#define RLK_LL_FWD_PAIR_ROW_BLOCKS 4
int rlk_ll_fwd_cluster(int64_t n, int pair_sms, int multiprocessors);

/* The backward's shape as the chunk choice sees it: N tokens, H hidden, V vocabulary; which
 * gradients are asked for; the device's multiprocessors (one persistent block each); the widest
 * chunk the workspace allows (a multiple of 256, at least 256). */
typedef struct rlk_ll_chunk_problem {
  int64_t N, H, V;
  int grad_hidden, grad_weight;
  int multiprocessors;
  int64_t widest;
} rlk_ll_chunk_problem;

/* The chunk width (a multiple of 256, from half the widest to the widest) that minimizes a model
 * of the sm_90a backward's time: each chunk launches dz (N x width, K = H), dh (N x H, K = width)
 * and dw (width x H, K = N) over 128 x 256 tiles, and a launch takes as long as its fullest
 * multiprocessor (whole waves of tiles, a tile's time its K), plus a fixed cost a launch. A chunk
 * whose tiles leave most multiprocessors idle in a launch's last wave loses to a narrower one
 * that fills them (on an H200 at N 8192, H 4096, V 151936: 16896 or 8448 columns, whose dz and dw
 * tiles are whole waves of 132, against 10240 or 12800). With no multiprocessor count known, the
 * widest cut evenly: the fewest chunks, of even widths. */
int64_t rlk_ll_bwd_sm90_chunk(const rlk_ll_chunk_problem *p);

/* The backward's chunk width in columns of V (rlk_linear_logprob's and rlk_linear_divergence's):
 * `asked` rounded up to whole tiles when it is not 0; else within `room` bytes of dz at
 * column_bytes a column (at least one tile): on sm_90a (sm90 given, its widest set here) the cost
 * model's width, elsewhere the fewest chunks cut evenly. At most V rounded up to whole tiles, and
 * without sm90 at most 65535 tiles (the portable kernels' grid.y). */
int64_t rlk_ll_bwd_chunk(int64_t asked, int64_t V, int64_t tile, int64_t room, int64_t column_bytes,
                         rlk_ll_chunk_problem *sm90);

/* The backward's rows a block: all N while N rows of `sum_row` bytes (the f32 sum of a 16-bit
 * grad_hidden) and `dz_row` bytes (their dz in a chunk of the narrowest width the block is sized
 * for) fit `budget` bytes; else the most rows, a multiple of 128 (the sm_90a tile's; at least
 * 128), that do. The blocks run in order, each over the whole vocabulary: a row's grad_hidden is
 * its block's, with the same bits in any block; grad_weight is summed block after block. */
int64_t rlk_ll_bwd_block_rows(int64_t N, int64_t sum_row, int64_t dz_row, int64_t budget);

/* The budget rlk_linear_logprob_backward sizes its blocks and chunks by: `bytes`, or 288 MiB for
 * 0 (tests cut a call into blocks with it). */
void rlk_ll_bwd_set_budget(int64_t bytes);

/* rlk_linear_policy_loss's token chunks (sm_90a): the rows of a chunk (a multiple of 64, from
 * half of `widest` to `widest`, at most N rounded up to 64) that minimize the same model over the
 * chunk's three launches: the logits (rows x V, K = H), dh (rows x H, K = V) and dw (V x H,
 * K = rows), dw at least as long as its read-modify-write of an f32 grad_weight (8 bytes an
 * element each chunk, at about 2.8 MB a tile's K step). With no multiprocessor count known, the
 * widest cut evenly. */
int64_t rlk_ll_token_chunk(int64_t N, int64_t H, int64_t V, int grad_hidden, int grad_weight, int multiprocessors,
                           int64_t widest);

#endif
