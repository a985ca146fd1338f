/* linear_logprob_check.c - the fused-head suites' exact inputs, forward bounds and policy-loss
 * call (linear_logprob_check.h). */
#include <check.h>
#include <math.h>

#include "linear_logprob_check.h"
#include "test_util.h"

double ll_grid_step(int64_t H, double scale) {
  ck_assert_msg(441 * H < (1 << 20), "H %lld: the grid's sums would not stay exact", (long long)H);
  return exp2(round(log2(scale / (sqrt((double)H) * 1.08 * 36.7))));
}
double ll_grid_h(uint64_t *rng) { return (double)((int)(rlk_test_rand_u64(rng) % 15u) - 7) / 4.0; }
double ll_grid_w(uint64_t *rng, double step) {
  return (double)((int)(rlk_test_rand_u64(rng) % 127u) - 63) * step;
}

double ll_fold_eps(int64_t V) {
  const int64_t records = (V + 255) / 256;
  return (double)(92 + 11 * ((records + 31) / 32 + 5) + 44) * LL_U;
}

ll_bound ll_fwd_bound(const lp_ref_row *r, double eps) {
  const double a = 16 * LL_U * (fabs(r->max_z) + fabs(r->lse) + fabs(r->logp) + fabs(r->entropy) + 1.0);
  const ll_bound b = {eps + a, eps + a, eps * (1.0 + 3.0 * fabs(r->entropy)) + a};
  return b;
}

void ll_forward_block(rlk_context *ctx, rlk_dtype dt, void *hidden, void *weight, int64_t n, int64_t V, int64_t H,
                      void *labels, void *thresholds, float T, rlk_linear_logprob_variant variant, void *out) {
  rlk_linear_logprob_args a;
  rlk_linear_logprob_args_init(&a);
  a.hidden = rlk_tensor_2d(hidden, dt, n, H, H);
  a.weight = rlk_tensor_2d(weight, dt, V, H, H);
  a.labels = rlk_tensor_1d(labels, RLK_I64, n);
  if (thresholds) a.threshold = rlk_tensor_1d(thresholds, RLK_F32, n);
  a.temperature = T;
  a.variant = variant;
  a.logp = rlk_test_block_row(out, RLK_F32, 0, n);
  a.lse = rlk_test_block_row(out, RLK_F32, 1, n);
  a.entropy = rlk_test_block_row(out, RLK_F32, 2, n);
  rlk_test_workspace(ctx, rlk_linear_logprob_workspace_size(ctx, &a, &a.workspace_bytes), &a.workspace_bytes,
                     &a.workspace, &a.workspace_bytes);
  ck_assert_msg(rlk_linear_logprob(ctx, &a, NULL) == RLK_OK, "%s", rlk_last_error());
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK); /* the call is done with its workspace */
  rlk_free(ctx, a.workspace);
}

void ll_policy_over_rows(rlk_linear_policy_loss_args *a, void *old_logp, void *advantages, void *loss,
                         void *grad_hidden, int64_t n, int64_t H, double normalizer,
                         rlk_linear_policy_loss_path path) {
  a->loss.old_logp = rlk_tensor_2d(old_logp, RLK_F32, 1, n, n);
  a->loss.advantages = rlk_tensor_2d(advantages, RLK_F32, 1, n, n);
  a->loss.token_normalizer = normalizer;
  a->loss.loss = rlk_tensor_1d(loss, RLK_F32, 1);
  a->grad_hidden = rlk_tensor_2d(grad_hidden, RLK_F32, n, H, H);
  a->path = path;
}

void ll_run_policy_loss(rlk_context *ctx, rlk_linear_policy_loss_args *a) {
  size_t bytes = 0;
  rlk_test_workspace(ctx, rlk_linear_policy_loss_workspace_size(ctx, a, &bytes), &bytes, &a->workspace,
                     &a->workspace_bytes);
  ck_assert_msg(rlk_linear_policy_loss(ctx, a, NULL) == RLK_OK, "%s", rlk_last_error());
}
