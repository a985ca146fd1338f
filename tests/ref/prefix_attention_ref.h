/* prefix_attention_ref.h - an fp64 reference for rlk_prefix_attention and its backward, written
 * from the contract (include/rlk.h, shared/specs/ops.md section 7) on the replicated layout:
 * plain causal attention over one sequence, every score matrix materialized. Independent of the
 * kernels and of the packed layout. */
#ifndef RLK_PREFIX_ATTENTION_REF_H
#define RLK_PREFIX_ATTENTION_REF_H

#include <stdint.h>

/* Causal attention over one sequence of L tokens, q [L, Hq, D], k and v [L, Hkv, D], query head
 * h using key head h / (Hq / Hkv): out [L, Hq, D], lse [L, Hq] (natural log). With dout given
 * (non-NULL), also dq [L, Hq, D], dk and dv [L, Hkv, D] of sum(dout * out). */
void pa_ref_causal(int64_t L, int Hq, int Hkv, int D, double scale, const double *q, const double *k,
                   const double *v, const double *dout, double *out, double *lse, double *dq, double *dk,
                   double *dv);

#endif
