/* linear_logprob_rows.h - rlk_linear_logprob's row selection (`rows` in its forward's and its
 * backward's arguments): the check, the gathered rows' layout, and the two kernels
 * (templates/cuda/linear_logprob_rows.cuh, templates/host/linear_logprob_{gather,scatter}.c)
 * that copy the selected rows of hidden into the workspace, where the head's kernels run on them
 * unchanged, and write grad_hidden back by row. A selected row's bits are those of the same call
 * on the gathered rows: the kernels see exactly those rows. */
#ifndef RLK_LINEAR_LOGPROB_ROWS_H
#define RLK_LINEAR_LOGPROB_ROWS_H

#include "ops/linear_logprob_fwd.h"

/* The gathered rows' pitch is H rounded up to this many elements (16 bytes of a 16-bit dtype), so
 * that a tensor map describes them whatever the caller's hidden. */
#define RLK_LL_ROWS_PITCH 8

/* A call's selection: n of hidden's `all` rows, indices of `dtype` (i32 or i64) `stride` apart;
 * data NULL when the call has none. */
typedef struct rlk_ll_rows {
  const void *data;
  rlk_dtype dtype;
  int64_t stride, n, all, pitch;
} rlk_ll_rows;

/* Checks `rows` when given (else r->data is NULL and nothing changes): i32 or i64 [n], n >= 1 and
 * at most hidden's h->N rows, any positive stride; the call's rows become the selected ones
 * (h->N = n), and labels (when not NULL) are checked against them, their stride into h->ls. */
rlk_status rlk_ll_rows_check(const rlk_tensor *rows, const rlk_tensor *labels, rlk_ll_head *h, rlk_ll_rows *r);

/* Where a call plans the gathered rows before it knows its workspace: [n, H] of hidden's dtype
 * with row stride r->pitch at a stand-in address aligned as the workspace's gathered rows are (the
 * tensor-map checks see their layout; the launch points the kernels at the workspace). */
rlk_tensor rlk_ll_rows_planned(const rlk_tensor *hidden, const rlk_ll_rows *r);

/* The gathered rows a forward launch holds at most, in bytes (launches of fewer rows past it):
 * 64 MiB, 8192 rows at H 4096; rlk_ll_rows_set_budget(bytes) sets another (0: the default), for
 * tests that cut a call into launches. */
int64_t rlk_ll_rows_budget(void);
void rlk_ll_rows_set_budget(int64_t bytes);

/* Bytes of `n` gathered rows of `elem` bytes an element and `pitch` elements a row, rounded up to
 * 256 (the workspace's pieces stay 256-byte aligned). */
size_t rlk_ll_rows_bytes(int64_t n, int64_t pitch, size_t elem);

/* The gather kernel for elements of dtype code dt (RLK_DT_*) and indices of `rows`; the scatter
 * kernel for a grad_hidden of code gh. */
rlk_kernel_spec rlk_ll_gather_spec(int dt, rlk_dtype rows);
rlk_kernel_spec rlk_ll_scatter_spec(int gh, rlk_dtype rows);

/* Selected rows [first, first + n) of src (rows of dtype code dt, `src_stride` apart, r->all of
 * them, H elements each) into out [n][pitch]; a bad index gives a NaN row and
 * RLK_LOGPROB_STATUS_BAD_ROW in *status (when given). */
rlk_status rlk_ll_gather(rlk_context *ctx, const rlk_ll_rows *r, int dt, const void *src, int64_t src_stride,
                         int64_t H, int64_t first, int64_t n, void *out, int64_t pitch, int *status, void *stream);

/* grad_hidden [r->all, H] (dtype code gh, row stride ghs) by row from dh [r->n][dh_pitch] (f32 on
 * a GPU, gh's dtype on the host): a selected row gets its row of dh (plus the value it held when
 * `add`), one not selected 0 when `zero`, else stays. */
rlk_status rlk_ll_scatter(rlk_context *ctx, const rlk_ll_rows *r, int gh, const void *dh, int64_t dh_pitch, int64_t H,
                          void *grad_hidden, int64_t ghs, int add, int zero, void *stream);

#endif
