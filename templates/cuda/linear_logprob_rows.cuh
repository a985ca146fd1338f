/* linear_logprob_rows.cuh - rlk_linear_logprob's row selection (`rows`, strictly increasing
 * indices into hidden's rows), every CUDA target and HIP:
 *
 *   linear_logprob_gather   a block per selected row: copies the row into out [n][pitch] (the
 *                           forward's and backward's GEMMs then run on those rows as they are);
 *                           an index outside [0, src_rows) or not greater than the one before it
 *                           gives a row of NaN (its outputs NaN, as a bad label's) and
 *                           LP_STATUS_BAD_ROW; columns [H, pitch) get 0
 *   linear_logprob_scatter  a selected row of grad_hidden gets its row of the f32 sum dh (plus
 *                           the value it held when `add`), one that is not gets 0 (when `zero`)
 *                           or stays: with `zero`, a block per grad_hidden row, which finds itself
 *                           in `rows` by a binary search; without, a block per selected row (the
 *                           launch follows the selection, not hidden's rows), which writes only
 *                           where that search finds its own index: a bad selection never writes
 *                           a row twice nor outside [0, N)
 * Each output element is written by one thread: deterministic whatever the selection. */
#ifndef RLK_LINEAR_LOGPROB_ROWS_CUH
#define RLK_LINEAR_LOGPROB_ROWS_CUH

#include "linear_logprob_common.cuh"

namespace rlk {
namespace ll {
RLK_PARAMS_DECLARE(GatherParams, RLK_LL_GATHER_PARAMS, RLK_LL_GATHER_PARAMS_SIZE);
RLK_PARAMS_DECLARE(ScatterParams, RLK_LL_SCATTER_PARAMS, RLK_LL_SCATTER_PARAMS_SIZE);
} /* namespace ll */

template <int DT, typename R>
__global__ void __launch_bounds__(LL_THREADS) linear_logprob_gather(RLK_PARAMS_ARG ll::GatherParams p_) {
  typedef typename ll::elem<DT>::type T;
  const R *__restrict__ rows = (const R *)p_.rows;
  const i64 j = (i64)blockIdx.x, i = p_.first + j, rs = p_.rows_stride, H = p_.H, pitch = p_.pitch;
  const i64 r = (i64)rows[i * rs];
  const bool ok = r >= 0 && r < p_.src_rows && (i == 0 || (i64)rows[(i - 1) * rs] < r);
  const T *__restrict__ src = (const T *)p_.src + (ok ? r : 0) * p_.src_stride;
  T *__restrict__ out = (T *)p_.out + j * pitch;
  const T nan = store_as<T>::from(limits<float>::quiet_nan()), zero = store_as<T>::from(0.0f);
  for (i64 c = threadIdx.x; c < pitch; c += blockDim.x) out[c] = c >= H ? zero : ok ? src[c] : nan;
  if (!ok && threadIdx.x == 0 && p_.status) atomicOr((int *)p_.status, (int)LP_STATUS_BAD_ROW);
}

template <int GDT, typename R>
__global__ void __launch_bounds__(LL_THREADS) linear_logprob_scatter(RLK_PARAMS_ARG ll::ScatterParams p_) {
  typedef typename ll::elem<GDT>::type G;
  const R *__restrict__ rows = (const R *)p_.rows;
  const i64 rs = p_.rows_stride, H = p_.H;
  /* the row this block writes: its own (zero) or its selected index's */
  const i64 row = p_.zero ? (i64)blockIdx.x : (i64)rows[(i64)blockIdx.x * rs];
  if (row < 0 || row >= p_.N) return;
  /* the first index whose row is >= this one (every thread alike: the same few loads) */
  i64 lo = 0, hi = p_.n;
  while (lo < hi) {
    const i64 mid = lo + (hi - lo) / 2;
    if ((i64)rows[mid * rs] < row)
      lo = mid + 1;
    else
      hi = mid;
  }
  const bool selected = lo < p_.n && (i64)rows[lo * rs] == row;
  if (!p_.zero && lo != (i64)blockIdx.x) return; /* a repeated or unordered index: not this block's */
  if (!selected && !p_.zero) return;
  G *__restrict__ o = (G *)p_.grad_hidden + row * p_.gh_stride;
  const float *__restrict__ d = (const float *)p_.dh + lo * p_.dh_pitch;
  for (i64 c = threadIdx.x; c < H; c += blockDim.x) {
    if (!selected)
      o[c] = store_as<G>::from(0.0f);
    else
      o[c] = store_as<G>::from(p_.add ? to_float(o[c]) + d[c] : d[c]);
  }
}

} /* namespace rlk */

#endif /* RLK_LINEAR_LOGPROB_ROWS_CUH */
