/* invariant.h - RLK_INVARIANT=1: the choices that are not batch invariant, refused.
 *
 * What is batch invariant always (a row's bits whatever the rows around it: linear_logprob_plan.h
 * has the fused head's analysis) costs nothing to keep; what remains are choices a call makes from
 * more than the row: rlk_logprob's tuning database winners (per token bucket: another block or
 * unroll folds a row in another order) and its bulk and tensor-map variants (another order, and a
 * fallback by the rows' alignment); the fused head's fallback from the sm_90a wgmma kernels to the
 * tiled ones where no tensor map describes hidden or weight (another K order: another packing of
 * the same rows may change it). With RLK_INVARIANT=1 the database is not read for them and the
 * variants and fallbacks are errors that say why. */
#ifndef RLK_OPS_INVARIANT_H
#define RLK_OPS_INVARIANT_H

/* 1 when the environment's RLK_INVARIANT is 1 (read at each call: a getenv). */
int rlk_invariant(void);

#endif
