/* linear_divergence_ref.h - an fp64 reference for rlk_linear_divergence and its backward, from the
 * definitions: both heads' logits materialized per row, log-softmax with the maximum subtracted,
 * each divergence summed as written in rlk.h (the top-k set by sorting), and the gradients by the
 * chain rule through the log-softmax Jacobian from the divergence's partial derivatives with
 * respect to the log-probabilities (not the simplified forms the kernels use). Dense row-major
 * fp64 inputs, so that finite differences can probe the gradients. */
#ifndef RLK_LINEAR_DIVERGENCE_REF_H
#define RLK_LINEAR_DIVERGENCE_REF_H

#include <stdint.h>

typedef struct ld_ref_problem {
  int64_t N, V, Hs, Ht;
  const double *hs, *ws, *ht, *wt; /* [N][Hs], [V][Hs], [N][Ht], [V][Ht] */
  double Ts, Tt;
  int mode;    /* 0 forward KL, 1 reverse KL, 2 JSD */
  double beta; /* JSD */
  int top_k;   /* > 0: forward KL over the teacher's top k */
  const int *ignored; /* [N] or NULL: rows with D 0 and no gradient */
} ld_ref_problem;

typedef struct ld_ref_row {
  double lse_s, lse_t, D, entropy;
  double a1, a2;     /* JSD: KL(p_s || m), KL(p_t || m); top-k: P, the last member's z_t (the set
                      * holds finite z_t only; empty: P NaN, a2 +inf) */
  int64_t last;      /* top-k: the last member's column (-1: an empty set) */
  double max_abs_z;  /* max over both heads' |z| */
  double abs_dot;    /* max over both heads' columns of sum_k |h_k w_vk| / T (a logit's f32 error
                      * is at most that times gamma_H) */
  double topk_gap;   /* top-k: z_t of the last member minus the next column's (inf: none) */
} ld_ref_row;

/* Row i's outputs. */
void ld_ref_forward_row(const ld_ref_problem *p, int64_t i, ld_ref_row *out);

/* sum_i g_i D_i (the loss whose gradients ld_ref_backward gives). */
double ld_ref_loss(const ld_ref_problem *p, const double *g);

/* The gradients of sum_i g_i D_i: dhs [N][Hs], dws [V][Hs], dht [N][Ht], dwt [V][Ht] (each may be
 * NULL), overwritten. The bounds, when given (with delta and dz_rel), get per element sums of
 * |dz| bounds: for each (i, v), e(i, v) = 2.1 delta (p_s + p_t) L (2 + |log p_s| + |log p_t| + L)
 * |g_i| + dz_rel |dz(i, v)| with
 * L = 1 + |lse_s| + |lse_t| + |D| + |a1| + |a2| + |log beta| + |log(1 - beta)|, summed into the
 * bounds of the products: bh_s[i][c] += e / T_s |w_s[v][c]|, bw_s[v][c] += e / T_s |h_s[i][c]|,
 * likewise the teacher's (bh_t, bw_t; each may be NULL). See the test for the derivation. */
void ld_ref_backward(const ld_ref_problem *p, const double *g, double *dhs, double *dws, double *dht, double *dwt,
                     double delta, double dz_rel, double *bh_s, double *bw_s, double *bh_t, double *bw_t);

#endif
