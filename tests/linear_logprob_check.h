/* linear_logprob_check.h - what the fused-head suites (test_linear_logprob.c,
 * test_linear_logprob_rows.c, and the kept-set and invariance suites' fused cases) share: inputs
 * whose logits every path computes exactly, the bounds the arithmetic allows the forward's
 * outputs against the fp64 reference (ref/linear_logprob_ref.h), and a policy loss over a head's
 * rows. */
#ifndef RLK_TEST_LINEAR_LOGPROB_CHECK_H
#define RLK_TEST_LINEAR_LOGPROB_CHECK_H

#include <stdint.h>

#include "ref/logprob_ref.h"
#include "rlk.h"

#define LL_U 0x1p-24 /* f32's unit roundoff (round to nearest) */

/* The inputs lie on a grid whose products sum exactly in f32, in any order and under any
 * truncation: h = a / 4, w = b step (a, b integers, |a| <= 7, |b| <= 63, step a power of two), so
 * every product and partial sum of a logit is a multiple of step / 4 below 441 H step / 4, which
 * f32 holds exactly while 441 H < 2^20 (four bits to spare below 2^24 for an accumulator that
 * keeps fewer). The logits are then exact on every path, and what is left to bound is the fold of
 * exponentials below (and in the backward what dz and the sums over it round). step puts the
 * logits' spread near `scale` (a's deviation 4.32 / 4, b's 36.7). */
double ll_grid_step(int64_t H, double scale);
double ll_grid_h(uint64_t *rng);
double ll_grid_w(uint64_t *rng, double step);

/* A bound on the relative error of a row's sum of exponentials s (and of q, the sum of p z, within
 * twice it) as the GPU kernels fold exact logits over V columns into a record per 256 columns
 * (linear_logprob_plan.h), each rounding at most u relative to the partial sum it lands in (every
 * term is positive, so a partial sum is at most s):
 *   a record, the larger of the two kernels': sm_90a's ll_tile_record adds a lane's 64 values in
 *     two chains of 32, then s0 + s1 and the four lanes by butterfly (one maximum for all: no
 *     rebase), 35 u; the tiled kernel folds four 64-column tiles, each a thread's 4 values in two
 *     chains, s0 + s1 and a rebase (a multiply, and ex2.approx's error, taken as 8 u: 2^-21, the
 *     instruction's is about 2^-22) when the maximum moved, 4 (2 + 1 + 1 + 8) = 48 u, then its 16
 *     lanes by 4 merges of 11 u: 92 u;
 *   the combine: a record goes through ceil(S / 32) merges in its lane and 5 of the butterfly, each
 *     one side's rebase (a multiply and 8 u) and an addition: 11 u;
 *   once per term: ex2.approx (8 u) and the rounding of its exponent x c - M (2 u |x c - M| in
 *     bits, p-weighted at most the entropy's 2 u ln V / ln 2 < 36 u at V < 2^18): 44 u.
 * The records and their tree depend on V alone, as does the bound. */
double ll_fold_eps(int64_t V);

/* Bounds on the errors of one row's logp, lse and entropy (the kernels' forms in
 * linear_logprob_common.cuh) for a fold within eps (ll_fold_eps) of exact logits:
 *   lse = m ln2 + ln s: eps from s; the constants log2(e) / T and ln 2 and the last operations
 *     (logf, a multiply, an addition, the maximum's scaling) each a few u of |max z|, |lse|;
 *   logp = (t c - m) ln2 - ln s: the same with |z_y| <= |logp| + |lse|;
 *   entropy = ln s - ln2 q / s: ln2 |q / s| = max z - E_p z <= entropy, so q / s's relative error
 *     (eps from q twice over, eps from s) adds 3 eps entropy.
 * a = 16 u (|max z| + |lse| + |logp| + |entropy| + 1) holds those operations' roundings. */
typedef struct ll_bound {
  double logp, lse, entropy;
} ll_bound;

ll_bound ll_fwd_bound(const lp_ref_row *r, double eps);

/* rlk_linear_logprob of n rows on ctx: hidden [n, H] and weight [V, H] of dtype dt, labels (i64)
 * and thresholds (f32; NULL: none), all device buffers, at temperature T under `variant`; logp,
 * lse and entropy into the rows of the device block `out` ([3][n] f32). Fails the test on error. */
void ll_forward_block(rlk_context *ctx, rlk_dtype dt, void *hidden, void *weight, int64_t n, int64_t V, int64_t H,
                      void *labels, void *thresholds, float T, rlk_linear_logprob_variant variant, void *out);

/* The loss half of rlk_linear_policy_loss over a head's n rows taken as one sequence: old_logp
 * and advantages [1, n] f32, the loss scalar (f32) with `normalizer` tokens, grad_hidden [n, H]
 * f32 (device buffers), and the path; the head half is the caller's. */
void ll_policy_over_rows(rlk_linear_policy_loss_args *a, void *old_logp, void *advantages, void *loss,
                         void *grad_hidden, int64_t n, int64_t H, double normalizer,
                         rlk_linear_policy_loss_path path);

/* rlk_linear_policy_loss on ctx with the workspace it asks for (a->workspace, NULL for none:
 * rlk_free it); fails the test on any error. */
void ll_run_policy_loss(rlk_context *ctx, rlk_linear_policy_loss_args *a);

#endif
