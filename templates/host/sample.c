/* sample.c - host form of rlk::sample (templates/cuda/sample.cuh): one row after another.
 *
 * The row's first pass is rlk_logprob_fwd's (templates/host/logprob_fwd.c: chunks of LP_CHUNK
 * logits folded into the f32 state), so logp carries the bits rlk_logprob writes on this backend.
 * Tokens are drawn with the CUDA template's definitions (fixed-point masses relative to the row
 * maximum, thresholds by radix select over order-preserving keys, one 64-bit Philox draw for the
 * inverse CDF), sequentially: there are no shares or candidates to shortcut. The draws equal the
 * GPU's; the tokens may differ where the exponentials round differently (libm's exp2f here).
 * threshold: the kept set's smallest logit, as the GPU's (-inf unfiltered, the maximum greedy).
 * Parameters: RLK_P_LOGITS (RLK_DT_*), RLK_P_TOKENS (int32_t or int64_t), RLK_P_FILTER (0/1);
 * seg, unroll, cap and rows16 only shape the GPU kernel. */
#include "logprob_common.h"
#include "rlk_host_philox.h"
#include "sample_params.h"

RLK_PARAMS_DECLARE(smp_params, RLK_SAMPLE_PARAMS, RLK_SAMPLE_PARAMS_SIZE);

typedef RLK_P_TOKENS smp_token_t;


#define SMP_DIGIT_BITS 11
#define SMP_BINS (1 << SMP_DIGIT_BITS)
#define SMP_MASS_SCALE 1099511627776.0f /* 2^40 */
#define SMP_LN2_D 0.69314718055994530942

/* A token's fixed-point mass relative to the row maximum mx, 2^((x - mx) c) (exactly 2^40 at the
 * maximum: the GPU's mass_of). Converted as the GPU's cvt.rzi.u64.f32 does (NaN gives 0, 2^64
 * and above the largest value): a plain cast of a NaN exponent's is undefined in C. */
static inline uint64_t smp_mass(float x, float c, float mx) {
  const float m = exp2f((x - mx) * c) * SMP_MASS_SCALE;
  if (!(m > 0.0f)) return 0;
  return m >= 18446744073709551616.0f ? UINT64_MAX : (uint64_t)m;
}

static inline int smp_key_width(int dt) { return dt == RLK_DT_F32 ? 32 : (dt == RLK_DT_BF16 ? 16 : 19); }

static inline uint32_t smp_key(float x, int kw) {
  uint32_t b = rlk_float_as_bits(x);
  if (b == 0x80000000u) b = 0u;
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return b >> (32 - kw);
}

static inline uint64_t smp_umulhi(uint64_t a, uint64_t b) {
  return (uint64_t)(((unsigned __int128)a * b) >> 64);
}

/* ceil(p Z) for q = floor(p 2^32), p < 1. */
static inline uint64_t smp_ceil_fraction(uint64_t q, uint64_t Z) {
  const unsigned __int128 p = (unsigned __int128)q * Z;
  return (uint64_t)(p >> 32) + (((uint64_t)p & 0xffffffffull) != 0);
}

typedef struct smp_row {
  const char *row;
  int dt, kw;
  rlk_i64 V;
  float c, M, l2min;
  int use_m;
  uint32_t key_lo;
} smp_row;

static inline int smp_keep_m(const smp_row *R, float x) {
  return !R->use_m || (x - R->M) * R->c >= R->l2min;
}

/* The bin b of hist[0, n) (key order) with A_b < target <= A_b + hist[b], A_b the sum above b. */
static int smp_boundary(const uint64_t *hist, int n, uint64_t target, uint64_t *above_out) {
  uint64_t above = 0;
  for (int b = n - 1; b >= 0; --b) {
    if (above < target && target <= above + hist[b]) {
      *above_out = above;
      return b;
    }
    above += hist[b];
  }
  *above_out = above;
  return 0;
}

/* A radix select over the row's keys, 11 bits a pass. With masses == 0: the k-th largest key
 * (k = goal, in [1, V)), bins counting elements. With masses == 1: top-p's threshold key over the
 * kept set {key >= key_lo, min-p}, bins summing masses, where the mass from the top first reaches
 * ceil(p Z0) (goal = floor(p 2^32)). */
static uint32_t smp_select_key(const smp_row *R, int masses, uint64_t goal) {
  uint64_t hist[SMP_BINS];
  uint32_t prefix = 0;
  int nb = 0;
  uint64_t target = goal;
  while (nb < R->kw) {
    const int w = R->kw - nb < SMP_DIGIT_BITS ? R->kw - nb : SMP_DIGIT_BITS, shift = R->kw - nb - w;
    memset(hist, 0, sizeof(uint64_t) << w);
    for (rlk_i64 j = 0; j < R->V; j++) {
      const float x = lp_load(R->row, R->dt, j);
      const uint32_t key = smp_key(x, R->kw);
      if (nb && (key >> (R->kw - nb)) != prefix) continue;
      if (!masses)
        hist[(key >> shift) & ((1u << w) - 1u)]++;
      else if (key >= R->key_lo && smp_keep_m(R, x))
        hist[(key >> shift) & ((1u << w) - 1u)] += smp_mass(x, R->c, R->M);
    }
    if (masses && nb == 0) {
      uint64_t z0 = 0;
      for (int b = 0; b < (1 << w); b++) z0 += hist[b];
      target = smp_ceil_fraction(goal, z0);
    }
    uint64_t above;
    const int b = smp_boundary(hist, 1 << w, target, &above);
    target -= above;
    prefix = (prefix << w) | (uint32_t)b;
    nb += w;
  }
  return prefix;
}

RLK_HOST_KERNEL rlk_sample(void **args) {
  const smp_params *p_ = (const smp_params *)args[0];
  const void *logits = p_->logits;
  const rlk_i64 row_stride = p_->row_stride, B = p_->B, V = p_->V;
  const float *temperatures = p_->temperatures;
  const float temperature = p_->temperature;
  const int32_t *top_ks32 = p_->top_ks32;
  const int64_t *top_ks64 = (const int64_t *)p_->top_ks64;
  const rlk_i64 top_k = p_->top_k;
  const float *top_ps = p_->top_ps;
  const float top_p = p_->top_p;
  const float *min_ps = p_->min_ps;
  const float min_p = p_->min_p;
  const uint64_t *seeds = (const uint64_t *)p_->seeds;
  const uint64_t seed = p_->seed;
  const uint64_t *offsets = (const uint64_t *)p_->offsets;
  const uint64_t offset = p_->offset;
  smp_token_t *tokens = (smp_token_t *)p_->tokens;
  float *logp = p_->logp;
  float *logp_filtered = p_->logp_filtered;
  float *threshold = p_->threshold;
  int32_t *status = p_->status;
  const int dt = RLK_P_LOGITS, filter = RLK_P_FILTER;

  for (rlk_i64 i = 0; i < B; i++) {
    const float t_in = temperatures ? temperatures[i] : temperature;
    const rlk_i64 k = top_ks32 ? (rlk_i64)top_ks32[i] : (top_ks64 ? top_ks64[i] : top_k);
    const float p = top_ps ? top_ps[i] : top_p;
    const float mp = min_ps ? min_ps[i] : min_p;
    const uint64_t sd = seeds ? seeds[i] : seed, off = offsets ? offsets[i] : offset;
    if (!(t_in == 0.0f || (t_in >= 0x1p-60f && t_in <= 3.40282346638528859812e+38f)) || k < 0 ||
        !(p > 0.0f && p <= 1.0f) ||
        !(mp >= 0.0f && mp <= 1.0f)) {
      tokens[i] = (smp_token_t)-1;
      if (logp) logp[i] = NAN;
      if (logp_filtered) logp_filtered[i] = NAN;
      if (threshold) threshold[i] = NAN;
      if (status) *status |= SMP_STATUS_BAD_PARAM;
      continue;
    }
    const int greedy = t_in == 0.0f;
    const float T = greedy ? 1.0f : t_in;
    const float c = LP_LOG2E / T;
    const char *row = (const char *)logits + (size_t)(i * row_stride) * lp_dt_bytes(dt);

    /* pass 1: rlk_logprob_fwd's state */
    lp_state st = {-INFINITY, 0.0f, 0.0f};
    float x[LP_CHUNK];
    for (rlk_i64 j0 = 0; j0 < V; j0 += LP_CHUNK) {
      const int n = V - j0 < LP_CHUNK ? (int)(V - j0) : LP_CHUNK;
      for (int q = 0; q < n; q++) x[q] = lp_load(row, dt, j0 + q);
      lp_add_chunk(&st, x, n, c, 0);
    }
    if (!(st.s > 0.0f)) {
      const int nan = st.s != 0.0f;
      tokens[i] = (smp_token_t)-1;
      if (logp) logp[i] = nan ? NAN : -INFINITY;
      if (logp_filtered) logp_filtered[i] = nan ? NAN : -INFINITY;
      if (threshold) threshold[i] = NAN;
      if (status) *status |= nan ? SMP_STATUS_NAN : SMP_STATUS_NO_TOKEN;
      continue;
    }
    smp_row R;
    R.row = row;
    R.dt = dt;
    R.kw = smp_key_width(dt);
    R.V = V;
    R.c = c;
    R.M = st.m;
    R.use_m = filter && mp > 0.0f;
    R.l2min = R.use_m ? log2f(mp) : 0.0f;
    R.key_lo = 0;
    rlk_philox_ctr ctr = {{(uint32_t)off, (uint32_t)(off >> 32), seeds ? 0u : (uint32_t)i,
                           seeds ? 0u : (uint32_t)((uint64_t)i >> 32)}};
    const rlk_philox_ctr draw = rlk_philox4x32_10(ctr, (uint32_t)sd, (uint32_t)(sd >> 32));
    const uint64_t R1 = (uint64_t)draw.v[0] | ((uint64_t)draw.v[1] << 32);

    rlk_i64 y = 0;
    int whole_row = 1;
    uint64_t kept = 0;
    float thr = st.m; /* the kept set's smallest logit: greedy keeps the maximum's ties */
    if (greedy) {
      while (lp_load(row, dt, y) != st.m) y++;
    } else {
      const int use_k = filter && k > 0 && k < V, use_p = filter && p < 1.0f;
      whole_row = !(use_k || use_p || R.use_m);
      if (use_k) R.key_lo = smp_select_key(&R, 0, (uint64_t)k);
      if (use_p) R.key_lo = smp_select_key(&R, 1, (uint64_t)RLK_SAMPLE_TOP_P_STEPS(p));
      /* the kept set's mass, then the element where the running mass passes the draw */
      thr = INFINITY;
      for (rlk_i64 j = 0; j < V; j++) {
        const float xj = lp_load(row, dt, j);
        if (smp_key(xj, R.kw) >= R.key_lo && smp_keep_m(&R, xj)) {
          kept += smp_mass(xj, c, R.M);
          thr = fminf(thr, xj);
        }
      }
      if (whole_row) thr = -INFINITY; /* every token kept */
      const uint64_t u = smp_umulhi(R1, kept);
      uint64_t run = 0;
      rlk_i64 last = 0;
      for (y = 0; y < V; y++) {
        const float xj = lp_load(row, dt, y);
        if (smp_key(xj, R.kw) >= R.key_lo && smp_keep_m(&R, xj)) {
          last = y;
          run += smp_mass(xj, c, R.M);
          if (run > u) break;
        }
      }
      if (y == V) y = last; /* unreachable: u < kept */
    }
    const float xy = lp_load(row, dt, y);
    const float lp = (xy - st.m) / T - logf(st.s);
    tokens[i] = (smp_token_t)y;
    if (logp) logp[i] = lp;
    if (threshold) threshold[i] = thr;
    if (logp_filtered)
      logp_filtered[i] = greedy ? 0.0f
                                : (whole_row ? lp
                                             : (xy - st.m) / T - (float)(log((double)kept) - 40.0 * SMP_LN2_D));
  }
}
