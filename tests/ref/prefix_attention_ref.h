/* prefix_attention_ref.h - an fp64 reference for rlk_prefix_attention and its backward, written
 * from the contract (include/rlk.h, shared/specs/ops.md section 7) on the replicated layout:
 * plain causal attention over one sequence, every score matrix materialized. Independent of the
 * kernels and of the packed layout. With an arithmetic (pa_ref_arith) it also bounds, element by
 * element, how far a kernel doing that arithmetic may land from the exact values. */
#ifndef RLK_PREFIX_ATTENTION_REF_H
#define RLK_PREFIX_ATTENTION_REF_H

#include <stdint.h>

/* What a kernel's arithmetic does, for the bounds. */
typedef struct pa_ref_arith {
  double dot;          /* the error of a dot product q . k or dO . v over the head dim, relative to
                          the sum of |products| (0: exact, as f32 sums inputs on the test's grid) */
  double u;            /* unit roundoff of the sums and other operations: f32 2^-24, fp64 2^-53 */
  double ex;           /* relative error of one exponential */
  double r16;          /* P and dS rounded to 16 bits before the second products: half an ulp, relative
                          (0: they are not) */
  double a16, min16;   /* that rounding below min16 (the dtype's smallest normal): a16 absolute */
  double o16, ao16;    /* the outputs' 16-bit rounding: half an ulp relative, a16 absolute below the
                          normal range */
  int64_t tiles;       /* the most key tiles one row's online softmax walks (a rescale each) */
  int delta_from_out;  /* the backward's delta is dO . O of the stored 16-bit O (the GPU kernels);
                          else sum_j P dP in the arithmetic (the host) */
} pa_ref_arith;

/* Per-element bounds (arrays the caller allocates, laid out as the values): out and lse whole;
 * for dq, dk and dv the error carried in from P and dS (e) and the sum of |terms| (m), which
 * pa_ref_bound turns into a bound once the caller has summed them over everything that adds to
 * one element (a shared prefix's replicas). */
typedef struct pa_ref_bounds {
  double *out, *lse;
  double *dq_e, *dq_m, *dk_e, *dk_m, *dv_e, *dv_m;
} pa_ref_bounds;

/* Causal attention over one sequence of L tokens, q [L, Hq, D], k and v [L, Hkv, D], query head
 * h using key head h / (Hq / Hkv): out [L, Hq, D], lse [L, Hq] (natural log). With dout given
 * (non-NULL), also dq [L, Hq, D], dk and dv [L, Hkv, D] of sum(dout * out). With ar and b given,
 * the bounds of the kernels' results under ar into b (dq, dk, dv's parts added to what b holds);
 * scale is the exact one, the kernels' f32 copy of it within 2^-24. */
void pa_ref_causal(int64_t L, int Hq, int Hkv, int D, double scale, const double *q, const double *k,
                   const double *v, const double *dout, double *out, double *lse, double *dq, double *dk,
                   double *dv, const pa_ref_arith *ar, pa_ref_bounds *b);

/* The bound of an element from its carried error e and sum of |terms| m (pa_ref_bounds) once the
 * kernel has summed K terms, scaled the sum (by scale or 1 / l) and stored it in 16 bits; ref is
 * the element's exact value. */
double pa_ref_bound(const pa_ref_arith *ar, double e, double m, double ref, int64_t K);

#endif
