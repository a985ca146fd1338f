/* linear_logprob_bwd.h - the backward's kernels as the op's other files take them
 * (linear_logprob_bwd.c): the sm_90a kernel's kinds and template, which the token chunks launch
 * too, with its tensor-map requests and its launch; the kernel choice the precompile plan lists. */
#ifndef RLK_LINEAR_LOGPROB_BWD_H
#define RLK_LINEAR_LOGPROB_BWD_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "runtime/op.h"
#include "common/linear_logprob_params.h"

/* sm_90a: one kernel, the product chosen by kind (RLK_LL_BWD_DZ / DH / DW, and RLK_LL_BWD_LOGITS /
 * LOGITS_T / DH_T for the token chunks); the settings a kind does not read are given as
 * labels=i32, entropy=0, gw=f32, so that each kind has one spelling (gw: the output's dtype, dh's
 * too in the token chunks). */
enum {
  RLK_LL_BWD_DZ = 0, RLK_LL_BWD_DH = 1, RLK_LL_BWD_DW = 2, RLK_LL_BWD_LOGITS = 3, RLK_LL_BWD_LOGITS_T = 4,
  RLK_LL_BWD_DH_T = 5
};

/* linear_logprob_bwd_sm90 (templates/cuda/linear_logprob_bwd_sm90.cuh): kind, hidden, labels,
 * entropy, gw. */
extern const rlk_template rlk_ll_bwd_sm90_tmpl;

#define RLK_LL_BWD_GROUP 8      /* the sm_90a tile order's default rows of tiles */
#define RLK_LL_BWD_GROUP_MAX 64 /* the most a call or the group setting may ask for */

/* What selects the backward's kernels: gh / gw are -1 for an absent gradient; sm90: the wgmma
 * kernels (an sm_90a target, tensor maps for hidden and weight). */
typedef struct rlk_ll_bwd_config {
  int hidden;
  rlk_dtype labels;
  int entropy;
  int gh, gw;
  int sm90;
} rlk_ll_bwd_config;

/* The backward's specs: [dz, dh, dh_out, dw] on a GPU (absent gradients' kernels left out, and
 * dh_out for an f32 grad_hidden, which dh sums into; sm90: dz, dh, dw are linear_logprob_bwd_sm90
 * kinds), the one host kernel on the host. */
rlk_status rlk_ll_bwd_specs(const rlk_context *ctx, const rlk_ll_bwd_config *c, rlk_kernel_spec *specs, size_t *n);

/* A 128-byte-swizzled tensor map request over a 16-bit [rows, cols] matrix. */
rlk_tma_desc_request rlk_ll_tma_req(const void *base, rlk_dtype dt, int64_t rows, int64_t cols, int64_t stride,
                                    uint32_t box_rows);

/* The map of an f32 output that dh and dw store through shared staging: boxes of 64 rows x 32
 * columns (128 bytes, the swizzle's span). */
rlk_tma_desc_request rlk_ll_tma_req_f32(void *base, int64_t rows, int64_t cols, int64_t stride);

/* Whether a tensor map can describe an f32 output (else its kernel writes from registers). */
int rlk_ll_tma_ok(const rlk_tma_desc_request *r);

/* One linear_logprob_bwd_sm90 product of g.M x g.Nn over g.K (g's tensor maps set): tiles of
 * 128 x 256, persistent blocks (one a multiprocessor, none more than tiles) that walk them. */
rlk_status rlk_ll_bwd_sm90_launch(rlk_context *ctx, const rlk_kernel_spec *spec, ll_bwd_sm90_args *g, size_t smem,
                                  void *stream);

#endif
