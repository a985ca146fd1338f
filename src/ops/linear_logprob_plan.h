/* linear_logprob_plan.h - how rlk_linear_logprob cuts its work when the call leaves it to it: the
 * forward's vocabulary splits and the backward's sm_90a chunk width, both from the whole waves of
 * blocks a launch takes. */
#ifndef RLK_LINEAR_LOGPROB_PLAN_H
#define RLK_LINEAR_LOGPROB_PLAN_H

#include <stdint.h>

#define RLK_LL_SPLIT_COLS 256 /* a forward split covers a multiple of this many columns */

/* The forward's vocabulary split: `asked` splits (capped at the 256-column tiles), or with 0 the
 * fewest splits that reach the least (waves x tiles per split) for `row_blocks` blocks of rows on
 * `slots` concurrently resident blocks. Writes the splits and the columns each covers. */
void rlk_ll_fwd_splits(int64_t V, int64_t row_blocks, int64_t slots, int asked, int64_t *splits,
                       int64_t *cols_per_split);

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

/* rlk_linear_policy_loss's token chunks (sm_90a): the rows of a chunk (a multiple of 64, from
 * half of `widest` to `widest`, at most N rounded up to 64) that minimize the same model over the
 * chunk's three launches: the logits (rows x V, K = H), dh (rows x H, K = V) and dw (V x H,
 * K = rows), dw at least as long as its read-modify-write of an f32 grad_weight (8 bytes an
 * element each chunk, at about 2.8 MB a tile's K step). With no multiprocessor count known, the
 * widest cut evenly. */
int64_t rlk_ll_token_chunk(int64_t N, int64_t H, int64_t V, int grad_hidden, int grad_weight, int multiprocessors,
                           int64_t widest);

#endif
