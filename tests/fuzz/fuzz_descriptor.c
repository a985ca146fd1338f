/* fuzz_descriptor.c - every public op on the host backend with descriptors the input makes:
 * shapes, strides, dtypes, ranks, absent and present tensors, scalars and modes, mostly near a
 * consistent call (so that many calls pass validation and run their kernel) and otherwise off it
 * by a mutation (a special extent or stride, another dtype or rank, a missing tensor).
 *
 * Every tensor gets a heap buffer of exactly the bytes its own descriptor spans, with its data
 * pointer where the lowest element lives; AddressSanitizer then reports any access the library
 * or a kernel makes outside what a descriptor describes (the kernels are compiled by
 * tests/fuzz/kernel-cc, with both sanitizers too). A descriptor that spans more than any tensor
 * may (RLK_TENSOR_MAX_BYTES, or 64 bits) gets a 16-byte buffer: the op must refuse it, or its
 * accesses land outside. A span below that but above FUZZ_SPAN_MAX skips the call (no buffer
 * that big is made).
 *
 * No kernel is compiled while fuzzing: LLVMFuzzerInitialize builds every op's sample
 * configurations (rlk_op_table's samples, the kernels of every family) and a few more group
 * advantage ones (its group size and mode shape the kernel) into the fuzz cache
 * (RLK_FUZZ_CACHE_DIR, kept between runs), then the context that serves the calls runs with
 * RLK_JIT=0, so a call that needs another kernel is validated and then fails quickly.
 *
 * Checks beyond the sanitizers: a call given a descriptor that spans more than a tensor may, or
 * a data pointer not aligned to its dtype, fails; a sample call's tokens are in [-1, V). */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "fuzz.h"
#include "ops/ops.h"
#include "rlk.h"

#define FUZZ_SPAN_MAX ((size_t)4 << 20) /* bytes of one tensor's buffer, at most */
#define FUZZ_MAX_BUFFERS 32

static rlk_context *ctx;

/* Kernels beyond the samples: the group advantage modes at the fuzzer's favourite group size,
 * and with offsets. */
static const char *const extra_kernels[] = {
    "group_advantage mode=grpo group_size=16", "group_advantage mode=mean-only group_size=16",
    "group_advantage mode=rloo group_size=16", "group_advantage mode=batch-std group_size=16",
    "group_advantage mode=grpo group_size=0 offsets=i64 scores_2d=1 mask=bool broadcast=1",
    "group_advantage mode=mean-only group_size=0 offsets=i64 scores_2d=1 mask=bool broadcast=1",
    "group_advantage mode=rloo group_size=16 scores_2d=1 mask=bool broadcast=1",
    "group_advantage mode=batch-std group_size=0 offsets=i64", NULL};

static void build(rlk_context *c, const char *line) {
  if (rlk_precompile(c, line, NULL) != RLK_OK) {
    fprintf(stderr, "fuzz_descriptor: cannot build '%s': %s\n", line, rlk_last_error());
    exit(1);
  }
}

/* ---- setup ---------------------------------------------------------------------------- */

static rlk_context *host_context(void) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_HOST;
  rlk_context *c = NULL;
  if (rlk_context_create(&c, &o) != RLK_OK) {
    fprintf(stderr, "fuzz_descriptor: no host context: %s\n", rlk_last_error());
    exit(1);
  }
  return c;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fz_init(argc, argv);
  fz_default_env("RLK_CACHE_DIR", RLK_FUZZ_CACHE_DIR);
  fz_default_env("RLK_HOST_CC", RLK_FUZZ_KERNEL_CC);
  setenv("RLK_TUNE", "off", 1);
  unsetenv("RLK_LOGPROB_VARIANT");
  unsetenv("RLK_JIT");
  rlk_context *warm = host_context();
  for (size_t i = 0; rlk_op_table[i]; i++)
    for (size_t k = 0; rlk_op_table[i]->samples && rlk_op_table[i]->samples[k]; k++)
      build(warm, rlk_op_table[i]->samples[k]);
  for (size_t i = 0; extra_kernels[i]; i++) build(warm, extra_kernels[i]);
  rlk_context_destroy(warm);
  setenv("RLK_JIT", "0", 1);
  ctx = host_context();
  return 0;
}

/* ---- one call's input, buffers and data --------------------------------------------------- */

typedef struct call {
  fz_input in;
  fz_rng rng;
  int style; /* buffer contents: 0 plausible, 1 random bytes, 2 zeros, 3 plausible with specials */
  int skip;  /* a descriptor spans more than FUZZ_SPAN_MAX: the call is not made */
  int refuse; /* a descriptor no buffer can hold, or misaligned: the call must fail */
  char refuse_why[96]; /* which one (the tensor's place among the call's) */
  int lenient; /* the tensors made now may be ignored by the op (rlk.h says when): no refusal due */
  int ntensors;
  int last_spanned; /* the last tensor made has a buffer of its whole span */
  void *bufs[FUZZ_MAX_BUFFERS];
  int nbufs;
} call;

static uint8_t u8(call *c) { return fz_u8(&c->in); }

static void *alloc(call *c, size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) fz_fail("malloc", "out of memory");
  if (c->nbufs < FUZZ_MAX_BUFFERS) c->bufs[c->nbufs++] = p;
  else fz_fail("fuzz_descriptor", "too many buffers");
  return p;
}

/* Extents: small ones, warp and block edges, a few larger. */
static int64_t dim(call *c) {
  static const int64_t dims[] = {1, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 63, 64, 65, 100,
                                 127, 128, 129, 255, 256, 257, 511, 513, 1000, 1025, 2049, 0};
  return FZ_PICK(&c->in, dims);
}

static const int64_t specials[] = {0, 1, -1, 2, -2, 3, 7, 64, 1000, (int64_t)1 << 20,
                                   ((int64_t)1 << 31) - 1, (int64_t)1 << 31, (int64_t)1 << 32,
                                   (int64_t)1 << 40, (int64_t)1 << 53, (int64_t)1 << 54,
                                   ((int64_t)1 << 55) + 1, (int64_t)1 << 61,
                                   (int64_t)1 << 62, INT64_MAX, INT64_MIN, -((int64_t)1 << 62),
                                   INT64_MAX / 2 + 1, INT64_MAX / 4};

typedef enum fill_kind {
  F_VAL,    /* values: floats around 0 */
  F_MASK,   /* 0 or 1 */
  F_OFFS,   /* non-decreasing from 0 to n (offsets) */
  F_LABEL,  /* in [0, n), some ignore_index (-100) */
  F_TOPK,   /* in [0, n + 1] */
  F_PROB,   /* in (0, 1] */
  F_TEMP,   /* in [0, 2] */
  F_BITS,   /* any bits (seeds) */
  F_ZERO    /* zeros (status words) */
} fill_kind;

static uint16_t half_bits(float f) {
  /* Plausible values only (|f| in [2^-14, 2^15) or 0), truncated: enough for inputs. */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  if (f == 0 || exp <= 0) return (uint16_t)sign;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  return (uint16_t)(sign | ((uint32_t)exp << 10) | ((x >> 13) & 0x3ffu));
}

/* Element i of a buffer that may be misaligned for its dtype (memcpy, no typed store). */
static void put(void *buf, rlk_dtype dt, size_t i, double v) {
  float f = (float)v;
  uint32_t fb;
  memcpy(&fb, &f, 4);
  union {
    float f32;
    double f64;
    uint16_t u16;
    int32_t i32;
    int64_t i64;
    uint8_t u8;
  } e;
  size_t es = rlk_dtype_size(dt) ? rlk_dtype_size(dt) : 1;
  switch (dt) {
  case RLK_F32: e.f32 = f; break;
  case RLK_F64: e.f64 = v; break;
  case RLK_F16: e.u16 = half_bits(f); break;
  case RLK_BF16: e.u16 = (uint16_t)(fb >> 16); break;
  case RLK_I32: e.i32 = isfinite(v) && fabs(v) < 2e9 ? (int32_t)v : -1; break;
  case RLK_I64: e.i64 = isfinite(v) && fabs(v) < 9e18 ? (int64_t)v : -1; break;
  case RLK_BOOL: e.u8 = v != 0; break;
  default: e.u8 = (uint8_t)(int)fmod(fabs(isfinite(v) ? v : 0), 256); break;
  }
  memcpy((uint8_t *)buf + i * es, &e, es);
}

static double unit(call *c) { return (double)(fz_next(&c->rng) >> 11) * 0x1.0p-53; }

static void fill(call *c, void *buf, size_t bytes, rlk_dtype dt, fill_kind kind, int64_t n) {
  size_t es = rlk_dtype_size(dt) ? rlk_dtype_size(dt) : 1;
  size_t count = bytes / es;
  if (c->style == 2 || kind == F_ZERO) {
    memset(buf, 0, bytes);
    return;
  }
  if (c->style == 1 || kind == F_BITS) {
    for (size_t i = 0; i < bytes; i++) ((uint8_t *)buf)[i] = (uint8_t)fz_next(&c->rng);
    return;
  }
  static const double odd[] = {NAN, INFINITY, -INFINITY, -0.0, 1e30, -1e30, 1e-30};
  for (size_t i = 0; i < count; i++) {
    double v;
    switch (kind) {
    case F_MASK: v = (double)(fz_next(&c->rng) & 1); break;
    case F_OFFS: v = count > 1 ? (double)((int64_t)((double)n * (double)i / (double)(count - 1))) : 0; break;
    case F_LABEL: v = (fz_next(&c->rng) % 16) == 0 ? -100 : (double)(n > 0 ? (int64_t)(fz_next(&c->rng) % (uint64_t)n) : 0); break;
    case F_TOPK: v = (double)(fz_next(&c->rng) % (uint64_t)(n > 0 ? n + 2 : 2)); break;
    case F_PROB: v = 1.0 - unit(c) * 0.999; break;
    case F_TEMP: v = unit(c) * 2; break;
    default: v = unit(c) * 4 - 2; break;
    }
    if (c->style == 3 && (fz_next(&c->rng) % 8) == 0)
      v = kind == F_LABEL || kind == F_OFFS || kind == F_TOPK ? (double)(int64_t)(fz_next(&c->rng) % 7) - 3 + (double)n
                                                           : odd[fz_next(&c->rng) % 7];
    put(buf, dt, i, v);
  }
}

/* The lowest and highest element offsets of a descriptor, or -1 when they overflow 64 bits. */
static int span(const rlk_tensor *t, __int128 *lo, __int128 *hi, int *empty) {
  *lo = *hi = 0;
  *empty = 0;
  int nd = t->ndim < 0 ? 0 : t->ndim > RLK_MAX_DIMS ? RLK_MAX_DIMS : t->ndim;
  for (int i = 0; i < nd; i++)
    if (t->shape[i] <= 0) *empty = 1;
  if (*empty) return 0;
  for (int i = 0; i < nd; i++) {
    __int128 step = (__int128)(t->shape[i] - 1) * t->strides[i];
    if (step < 0) *lo += step;
    else *hi += step;
  }
  return *lo < INT64_MIN || *hi > INT64_MAX ? -1 : 0;
}

/* A contiguous descriptor of `nd` dims of `dt`, as the input mutates it, with its buffer. */
static rlk_tensor tensor_nd(call *c, rlk_dtype dt, int nd, const int64_t *dims, fill_kind kind, int64_t n) {
  rlk_tensor t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.ndim = nd;
  for (int i = nd - 1; i >= 0; i--) {
    t.shape[i] = dims[i];
    t.strides[i] = i == nd - 1 ? 1 : t.strides[i + 1] * dims[i + 1];
  }
  const int64_t d0 = dims[0];
  int misaligned = 0;
  const int place = c->ntensors++;
  c->last_spanned = 0;
  uint8_t m = u8(c);
  if (m < 160) {
    if (nd >= 2 && (m & 7) == 0) t.strides[0] += 1 + u8(c) % 17; /* padded rows */
  } else {
    for (int rounds = 1 + (m & 1); rounds > 0; rounds--) {
      uint8_t k = u8(c), which = u8(c) % RLK_MAX_DIMS;
      switch (k % 13) {
      case 0: return t; /* absent: data NULL */
      case 1: t.dtype = (rlk_dtype)(u8(c) % 9); break;
      case 2: t.ndim = (int32_t)(u8(c) % 7) - 1; break;
      case 3: t.shape[which] = FZ_PICK(&c->in, specials); break;
      case 4: t.strides[which] = FZ_PICK(&c->in, specials); break;
      case 5: t.shape[which] = (int64_t)((uint64_t)t.shape[which] + ((u8(c) & 1) ? 1u : UINT64_MAX)); break;
      case 6: t.strides[which] = (int64_t)(0 - (uint64_t)t.strides[which]); break; /* wraps at INT64_MIN */
      case 7: t.shape[which] = FZ_PICK(&c->in, specials); t.strides[which] = FZ_PICK(&c->in, specials); break;
      case 8: t.strides[0] = 1; t.strides[1] = d0; break; /* column-major */
      case 9: t.shape[0] = 0; break;
      case 10: t.strides[which] = 0; break;
      case 11: misaligned = rlk_dtype_size(t.dtype) > 1; break;
      default: t.shape[which] = dim(c); break;
      }
    }
  }
  __int128 lo, hi;
  int empty;
  size_t es = rlk_dtype_size(t.dtype) ? rlk_dtype_size(t.dtype) : 8;
  if (span(&t, &lo, &hi, &empty) != 0 || (hi - lo + 1) * (__int128)es > (__int128)RLK_TENSOR_MAX_BYTES) {
    t.data = alloc(c, 16); /* more than any tensor may span: the op must refuse it */
    c->refuse |= !c->lenient;
    snprintf(c->refuse_why, sizeof c->refuse_why, "tensor %d spans more than 2^%d bytes", place,
             RLK_TENSOR_MAX_BYTES_LOG2);
    return t;
  }
  size_t bytes = empty ? 0 : (size_t)(hi - lo + 1) * es;
  if (bytes > FUZZ_SPAN_MAX) {
    c->skip = 1;
    t.data = alloc(c, 16);
    return t;
  }
  uint8_t *buf = alloc(c, bytes + (size_t)misaligned);
  fill(c, buf + misaligned, bytes, t.dtype, kind, n);
  t.data = buf + misaligned + (size_t)(-lo) * es;
  c->last_spanned = 1;
  if (getenv("RLK_FUZZ_VERBOSE"))
    fprintf(stderr, "fuzz: tensor %d: dtype %d ndim %d shape [%lld, %lld] strides [%lld, %lld] %zu bytes%s\n",
            place, (int)t.dtype, (int)t.ndim, (long long)t.shape[0], (long long)t.shape[1],
            (long long)t.strides[0], (long long)t.strides[1], bytes, misaligned ? " misaligned" : "");
  if (misaligned && !c->lenient) {
    c->refuse = 1;
    snprintf(c->refuse_why, sizeof c->refuse_why, "tensor %d is misaligned", place);
  }
  return t;
}

static rlk_tensor tensor(call *c, rlk_dtype dt, int nd, int64_t d0, int64_t d1, fill_kind kind, int64_t n) {
  const int64_t dims[2] = {d0, d1};
  return tensor_nd(c, dt, nd, dims, kind, n);
}

static rlk_tensor absent(void) {
  rlk_tensor t;
  memset(&t, 0, sizeof t);
  return t;
}

/* An optional tensor: present on odd bytes. */
#define OPT(c, expr) ((u8(c) & 1) ? (expr) : absent())

static double real(call *c, double nominal) {
  static const double odd[] = {0, -1, 1, 1e-8, 0.5, 2, 1e30, -1e30, NAN, INFINITY, -INFINITY, 1e-300, 0.95};
  return u8(c) < 200 ? nominal : FZ_PICK(&c->in, odd);
}

static int mode(call *c, int n) {
  static const int odd[] = {-1, 99, INT_MAX, INT_MIN};
  uint8_t m = u8(c);
  return m < 240 ? m % n : (m == 240 ? n : FZ_PICK(&c->in, odd));
}

static rlk_dtype pick_dtype(call *c, const rlk_dtype *set, size_t n) { return set[u8(c) % n]; }

static const rlk_dtype floats[] = {RLK_F32, RLK_F32, RLK_F64};
static const rlk_dtype masks[] = {RLK_BOOL, RLK_I32, RLK_F32};
static const rlk_dtype ints[] = {RLK_I32, RLK_I64};
static const rlk_dtype logits_types[] = {RLK_BF16, RLK_F16, RLK_F32};

/* The workspace an op asked for (st, bytes: its workspace_size call), when it can be given. */
static void give_workspace(call *c, rlk_status st, size_t bytes, void **workspace, size_t *workspace_bytes) {
  *workspace = st == RLK_OK && bytes && bytes <= FUZZ_SPAN_MAX ? alloc(c, bytes) : NULL;
  *workspace_bytes = *workspace ? bytes : 0;
}

/* ---- the ops ------------------------------------------------------------------------------ */

static rlk_status op_checked(const call *c, rlk_status st, const char *name) {
  fz_checked(st, name);
  if (st == RLK_OK && c->refuse) fz_fail(name, c->refuse_why);
  return st;
}

static void group_advantage(call *c) {
  static const int64_t sizes[] = {16, 16, 64, 2048, 0, 0, 1, 2, 3, 5, 7};
  int64_t G = FZ_PICK(&c->in, sizes), T = dim(c), groups = 1 + u8(c) % 4;
  int64_t B = G ? G * (G == 2048 ? 1 : groups) : 1 + u8(c) % 48;
  rlk_dtype dt = pick_dtype(c, floats, 3);
  rlk_group_advantage_args a;
  rlk_group_advantage_args_init(&a);
  int rows = u8(c) & 1;
  a.scores = rows ? tensor(c, dt, 2, B, T, F_VAL, 0) : tensor(c, dt, 1, B, 0, F_VAL, 0);
  a.group_size = (u8(c) % 16) ? G : FZ_PICK(&c->in, specials);
  if (G == 0 || u8(c) % 8 == 0) {
    int64_t ng = 1 + u8(c) % (B < 8 ? B : 8);
    a.group_offsets = tensor(c, pick_dtype(c, ints, 2), 1, ng + 1, 0, F_OFFS, B);
  }
  a.mode = (rlk_advantage_mode)mode(c, 4);
  a.eps = (float)real(c, 1e-6);
  a.unbiased = mode(c, 2);
  a.singleton = (rlk_singleton_policy)mode(c, 2);
  a.advantages = tensor(c, RLK_F32, 1, B, 0, F_VAL, 0);
  a.mask = OPT(c, tensor(c, pick_dtype(c, masks, 3), 2, B, T, F_MASK, 0));
  a.token_advantages = OPT(c, tensor(c, RLK_F32, 2, B, T, F_VAL, 0));
  if (!c->skip) op_checked(c, rlk_group_advantage(ctx, &a, NULL), "rlk_group_advantage");
}

/* Per-token tensors of the loss ops: [B, T] padded or [N] packed. */
typedef struct tokens {
  int packed;
  int64_t B, T, N, S;
} tokens;

static rlk_tensor tok(call *c, const tokens *k, rlk_dtype dt, fill_kind kind) {
  return k->packed ? tensor(c, dt, 1, k->N, 0, kind, 0) : tensor(c, dt, 2, k->B, k->T, kind, 0);
}

/* seq_offsets of the loss ops: always for packed tokens, now and then for padded ones. */
static rlk_tensor token_offsets(call *c, const tokens *k) {
  return k->packed || u8(c) % 8 == 0 ? tensor(c, pick_dtype(c, ints, 2), 1, k->S + 1, 0, F_OFFS, k->N) : absent();
}

/* The aggregation and normalizers both loss ops take. */
static void loss_aggregation(call *c, rlk_loss_agg *agg, double *token_normalizer, double *seq_normalizer,
                             double *norm_scale, double *loss_scale) {
  *agg = (rlk_loss_agg)mode(c, 5);
  *token_normalizer = real(c, 100);
  *seq_normalizer = real(c, 8);
  *norm_scale = real(c, 64);
  *loss_scale = real(c, 1);
}

static tokens token_layout(call *c) {
  tokens k = {u8(c) & 1, dim(c), dim(c), dim(c), 1 + u8(c) % 8};
  return k;
}

static void policy_loss(call *c) {
  tokens k = token_layout(c);
  rlk_dtype dt = pick_dtype(c, floats, 3);
  rlk_policy_loss_args a;
  rlk_policy_loss_args_init(&a);
  a.logp = tok(c, &k, dt, F_VAL);
  a.old_logp = tok(c, &k, dt, F_VAL);
  a.seq_advantages = mode(c, 4) == 0;
  a.advantages = a.seq_advantages ? tensor(c, dt, 1, k.packed ? k.S : k.B, 0, F_VAL, 0) : tok(c, &k, dt, F_VAL);
  a.mask = OPT(c, tok(c, &k, pick_dtype(c, masks, 3), F_MASK));
  a.seq_offsets = token_offsets(c, &k);
  a.ref_logp = OPT(c, tok(c, &k, dt, F_VAL));
  a.entropy = OPT(c, tok(c, &k, dt, F_VAL));
  a.rollout_is_weights = OPT(c, tok(c, &k, dt, F_VAL));
  a.mode = (rlk_policy_loss_mode)mode(c, 5);
  a.clip_low = real(c, 0.2);
  a.clip_high = real(c, 0.28);
  a.dual_clip = real(c, 3);
  a.log_ratio_min = real(c, -20);
  a.log_ratio_max = real(c, 20);
  a.sapo_tau_pos = real(c, 1);
  a.sapo_tau_neg = real(c, 1.05);
  a.kl_estimator = (rlk_kl_estimator)mode(c, 4);
  a.kl_coef = a.ref_logp.data ? real(c, 0.1) : real(c, 0);
  a.kl_input_clamp = real(c, 20);
  a.kl_output_clamp = real(c, 10);
  a.kl_straight_through = mode(c, 2);
  a.entropy_coef = a.entropy.data ? real(c, 0.01) : real(c, 0);
  loss_aggregation(c, &a.agg, &a.token_normalizer, &a.seq_normalizer, &a.norm_scale, &a.loss_scale);
  a.loss = tensor(c, dt, 1, 1, 0, F_VAL, 0);
  a.grad_logp = tok(c, &k, dt, F_VAL);
  c->lenient = a.entropy_coef == 0; /* grad_entropy is ignored then */
  a.grad_entropy = OPT(c, tok(c, &k, dt, F_VAL));
  c->lenient = 0;
  a.metrics = OPT(c, tensor(c, dt, 1, RLK_POLICY_LOSS_METRICS, 0, F_VAL, 0));
  if (c->skip) return;
  size_t bytes = 0;
  rlk_status st = fz_checked(rlk_policy_loss_workspace_size(ctx, &a, &bytes), "rlk_policy_loss_workspace_size");
  give_workspace(c, st, bytes, &a.workspace, &a.workspace_bytes);
  op_checked(c, rlk_policy_loss(ctx, &a, NULL), "rlk_policy_loss");
}

static void value_loss(call *c) {
  tokens k = token_layout(c);
  rlk_dtype dt = pick_dtype(c, floats, 3);
  rlk_value_loss_args a;
  rlk_value_loss_args_init(&a);
  a.values = tok(c, &k, dt, F_VAL);
  a.old_values = tok(c, &k, dt, F_VAL);
  a.returns = tok(c, &k, dt, F_VAL);
  a.mask = OPT(c, tok(c, &k, pick_dtype(c, masks, 3), F_MASK));
  a.seq_offsets = token_offsets(c, &k);
  a.clip = real(c, 0.5);
  loss_aggregation(c, &a.agg, &a.token_normalizer, &a.seq_normalizer, &a.norm_scale, &a.loss_scale);
  a.loss = tensor(c, dt, 1, 1, 0, F_VAL, 0);
  a.grad_values = tok(c, &k, dt, F_VAL);
  a.metrics = OPT(c, tensor(c, dt, 1, RLK_VALUE_LOSS_METRICS, 0, F_VAL, 0));
  if (c->skip) return;
  size_t bytes = 0;
  rlk_status st = fz_checked(rlk_value_loss_workspace_size(ctx, &a, &bytes), "rlk_value_loss_workspace_size");
  give_workspace(c, st, bytes, &a.workspace, &a.workspace_bytes);
  op_checked(c, rlk_value_loss(ctx, &a, NULL), "rlk_value_loss");
}

/* The [B, T] tensors of the scans, of one value dtype. */
typedef struct rows {
  int64_t B, T;
  rlk_dtype dt;
} rows;

static rows row_layout(call *c) {
  rows r;
  r.B = dim(c);
  r.T = dim(c);
  r.dt = pick_dtype(c, floats, 3);
  return r;
}

static rlk_tensor row_values(call *c, const rows *r) { return tensor(c, r->dt, 2, r->B, r->T, F_VAL, 0); }

static rlk_tensor row_mask(call *c, const rows *r) {
  return OPT(c, tensor(c, pick_dtype(c, masks, 3), 2, r->B, r->T, F_MASK, 0));
}

static void gae(call *c) {
  const rows r = row_layout(c);
  rlk_gae_args a;
  rlk_gae_args_init(&a);
  a.rewards = row_values(c, &r);
  a.values = row_values(c, &r);
  a.mask = row_mask(c, &r);
  a.gamma = real(c, 1);
  a.lambda = real(c, 0.95);
  a.masked = (rlk_gae_masked)mode(c, 2);
  a.advantages = row_values(c, &r);
  a.returns = OPT(c, row_values(c, &r));
  a.algo = (rlk_scan_algo)mode(c, 3);
  if (!c->skip) op_checked(c, rlk_gae(ctx, &a, NULL), "rlk_gae");
}

static void discounted_returns(call *c) {
  const rows r = row_layout(c);
  rlk_discounted_returns_args a;
  rlk_discounted_returns_args_init(&a);
  a.rewards = row_values(c, &r);
  a.mask = row_mask(c, &r);
  a.gamma = real(c, 0.99);
  a.masked = (rlk_returns_masked)mode(c, 2);
  a.returns = row_values(c, &r);
  a.algo = (rlk_scan_algo)mode(c, 3);
  if (!c->skip) op_checked(c, rlk_discounted_returns(ctx, &a, NULL), "rlk_discounted_returns");
}

static void reverse_cumsum(call *c) {
  const rows r = row_layout(c);
  rlk_reverse_cumsum_args a;
  rlk_reverse_cumsum_args_init(&a);
  a.values = row_values(c, &r);
  a.mask = row_mask(c, &r);
  a.out = row_values(c, &r);
  if (u8(c) & 1) {
    a.baseline = tensor(c, r.dt, 1, r.B, 0, F_VAL, 0);
    a.advantages = row_values(c, &r);
  }
  a.algo = (rlk_scan_algo)mode(c, 3);
  if (!c->skip) op_checked(c, rlk_reverse_cumsum(ctx, &a, NULL), "rlk_reverse_cumsum");
}

static void masked_whiten(call *c) {
  int flat = u8(c) % 4 == 0;
  int64_t B = dim(c), T = dim(c);
  rlk_dtype dt = pick_dtype(c, floats, 3);
  rlk_masked_whiten_args a;
  rlk_masked_whiten_args_init(&a);
#define MW_TENSOR(d, kind) (flat ? tensor(c, d, 1, B * T, 0, kind, 0) : tensor(c, d, 2, B, T, kind, 0))
  a.x = MW_TENSOR(dt, F_VAL);
  a.mask = OPT(c, MW_TENSOR(pick_dtype(c, masks, 3), F_MASK));
  a.out = u8(c) % 4 == 0 ? a.x : MW_TENSOR(dt, F_VAL); /* in place, or its own buffer */
#undef MW_TENSOR
  a.eps = real(c, 1e-8);
  a.eps_mode = (rlk_whiten_eps)mode(c, 2);
  a.unbiased = mode(c, 2);
  a.count_eps = real(c, 1e-8);
  a.shift_mean = mode(c, 2);
  a.normalize_std = mode(c, 2);
  a.masked = (rlk_whiten_masked)mode(c, 2);
  a.stats = OPT(c, tensor(c, RLK_F64, 1, 3, 0, F_VAL, 0));
  if (c->skip) return;
  size_t bytes = 0;
  rlk_status st = fz_checked(rlk_masked_whiten_workspace_size(ctx, &a, &bytes), "rlk_masked_whiten_workspace_size");
  give_workspace(c, st, bytes, &a.workspace, &a.workspace_bytes);
  op_checked(c, rlk_masked_whiten(ctx, &a, NULL), "rlk_masked_whiten");
}

static void tuning(call *c, rlk_logprob_variant *variant, int *block, int *unroll, int *stages) {
  static const int blocks[] = {0, 32, 64, 100, 128, 256, 512, 992, 1024, 2048, -1};
  static const int unrolls[] = {0, 1, 2, 3, 4, 8, 16, -1};
  if (u8(c) % 8) return; /* the defaults, mostly */
  *variant = (rlk_logprob_variant)mode(c, 4);
  *block = FZ_PICK(&c->in, blocks);
  *unroll = FZ_PICK(&c->in, unrolls);
  *stages = FZ_PICK(&c->in, unrolls);
}

static int64_t ignore_index(call *c, int64_t V) {
  const int64_t odd[] = {0, V, V - 1, -1, INT64_MIN, INT64_MAX};
  return u8(c) % 4 ? -100 : FZ_PICK(&c->in, odd);
}

/* What both log-prob passes read: logits [N, V] of dtype dt, labels, temperature and ignore_index. */
static void logprob_inputs(call *c, int64_t N, int64_t V, rlk_dtype dt, rlk_tensor *logits, rlk_tensor *labels,
                           float *temperature, int64_t *ignore) {
  *logits = tensor(c, dt, 2, N, V, F_VAL, 0);
  *labels = tensor(c, pick_dtype(c, ints, 2), 1, N, 0, F_LABEL, V);
  *temperature = (float)real(c, 1);
  *ignore = ignore_index(c, V);
}

static void logprob(call *c) {
  int64_t N = dim(c), V = dim(c);
  rlk_logprob_args a;
  rlk_logprob_args_init(&a);
  logprob_inputs(c, N, V, pick_dtype(c, logits_types, 3), &a.logits, &a.labels, &a.temperature, &a.ignore_index);
  a.logp = tensor(c, RLK_F32, 1, N, 0, F_VAL, 0);
  a.lse = OPT(c, tensor(c, RLK_F32, 1, N, 0, F_VAL, 0));
  a.entropy = OPT(c, tensor(c, RLK_F32, 1, N, 0, F_VAL, 0));
  a.status = OPT(c, tensor(c, RLK_I32, 1, 1, 0, F_ZERO, 0));
  tuning(c, &a.variant, &a.block, &a.unroll, &a.stages);
  if (!c->skip) op_checked(c, rlk_logprob(ctx, &a, NULL), "rlk_logprob");
}

static void logprob_backward(call *c) {
  int64_t N = dim(c), V = dim(c);
  rlk_logprob_backward_args a;
  rlk_logprob_backward_args_init(&a);
  rlk_dtype ldt = pick_dtype(c, logits_types, 3);
  logprob_inputs(c, N, V, ldt, &a.logits, &a.labels, &a.temperature, &a.ignore_index);
  a.lse = tensor(c, RLK_F32, 1, N, 0, F_VAL, 0);
  a.grad_logp = OPT(c, tensor(c, RLK_F32, 1, N, 0, F_VAL, 0));
  a.grad_entropy = OPT(c, tensor(c, RLK_F32, 1, N, 0, F_VAL, 0));
  c->lenient = !a.grad_entropy.data; /* the entropy is read only with its gradient */
  a.entropy = OPT(c, tensor(c, RLK_F32, 1, N, 0, F_VAL, 0));
  c->lenient = 0;
  a.grad_logits = u8(c) % 4 == 0 ? a.logits : tensor(c, (u8(c) & 1) ? RLK_F32 : ldt, 2, N, V, F_VAL, 0);
  a.status = OPT(c, tensor(c, RLK_I32, 1, 1, 0, F_ZERO, 0));
  tuning(c, &a.variant, &a.block, &a.unroll, &a.stages);
  if (!c->skip) op_checked(c, rlk_logprob_backward(ctx, &a, NULL), "rlk_logprob_backward");
}

static void sample(call *c) {
  static const int splits[] = {RLK_SAMPLE_ROW_SPLIT_AUTO, 0, 1, 2, 4, 8, 3, 16, -2};
  int64_t B = dim(c), V = dim(c);
  rlk_sample_args a;
  rlk_sample_args_init(&a);
  a.logits = tensor(c, pick_dtype(c, logits_types, 3), 2, B, V, F_VAL, 0);
  a.temperatures = OPT(c, tensor(c, RLK_F32, 1, B, 0, F_TEMP, 0));
  a.temperature = (float)real(c, u8(c) % 4 ? 1 : 0);
  a.top_ks = OPT(c, tensor(c, pick_dtype(c, ints, 2), 1, B, 0, F_TOPK, V));
  a.top_k = u8(c) % 4 ? 0 : FZ_PICK(&c->in, specials);
  a.top_ps = OPT(c, tensor(c, RLK_F32, 1, B, 0, F_PROB, 0));
  a.top_p = (float)real(c, u8(c) % 4 ? 1 : 0.9);
  a.min_ps = OPT(c, tensor(c, RLK_F32, 1, B, 0, F_PROB, 0));
  a.min_p = (float)real(c, u8(c) % 4 ? 0 : 0.05);
  a.seeds = OPT(c, tensor(c, RLK_I64, 1, B, 0, F_BITS, 0));
  a.seed = fz_u64(&c->in);
  a.offsets = OPT(c, tensor(c, RLK_I64, 1, B, 0, F_BITS, 0));
  a.offset = fz_u64(&c->in);
  a.tokens = tensor(c, pick_dtype(c, ints, 2), 1, B, 0, F_ZERO, 0);
  a.logp = OPT(c, tensor(c, RLK_F32, 1, B, 0, F_VAL, 0));
  a.logp_filtered = OPT(c, tensor(c, RLK_F32, 1, B, 0, F_VAL, 0));
  a.status = OPT(c, tensor(c, RLK_I32, 1, 1, 0, F_ZERO, 0));
  if (u8(c) % 8 == 0) {
    a.logprob_block = (int)FZ_PICK(&c->in, specials);
    a.logprob_unroll = u8(c) % 10;
  }
  a.row_split = FZ_PICK(&c->in, splits);
  a.pdl = mode(c, 2);
  if (c->skip) return;
  rlk_status st = op_checked(c, rlk_sample(ctx, &a, NULL), "rlk_sample");
  /* Tokens of a call that ran: in [0, V), or -1 for a row that raised a status bit. */
  V = a.logits.shape[1]; /* as described, maybe mutated */
  if (st == RLK_OK && a.tokens.ndim == 1 && a.tokens.shape[0] == B && V > 0)
    for (int64_t i = 0; i < B; i++) {
      int64_t t = a.tokens.dtype == RLK_I32 ? ((int32_t *)a.tokens.data)[i * a.tokens.strides[0]]
                                            : ((int64_t *)a.tokens.data)[i * a.tokens.strides[0]];
      if (t < -1 || t >= V) {
        char why[160];
        snprintf(why, sizeof why, "token %lld of row %lld outside [-1, %lld)", (long long)t, (long long)i,
                 (long long)V);
        fz_fail("rlk_sample", why);
      }
    }
}

/* A packed prefix-attention layout: host arrays that always hold num + 1 entries (the call
 * reads that many: a shorter array would be the caller's fault), values mutated now and then,
 * and i32 tensors with the same values where the input gives them. */
typedef struct pa_shape {
  int64_t T, Hq, Hkv, D;
  rlk_dtype dt;
} pa_shape;

static void copy_offsets(const call *c, rlk_tensor *t, const int32_t *v, int64_t n) {
  if (!c->last_spanned || !t->data || t->dtype != RLK_I32 || t->ndim != 1 || t->strides[0] <= 0) return;
  for (int64_t i = 0; i < n && i < t->shape[0]; i++) memcpy((int32_t *)t->data + i * t->strides[0], &v[i], 4);
}

static void pa_layout(call *c, rlk_prefix_attention_layout *l, pa_shape *sh) {
  const int64_t P = 1 + u8(c) % 2;
  int32_t *seg = alloc(c, (size_t)(P * 5 + 1) * 4), *grp = alloc(c, (size_t)(P + 1) * 4);
  int64_t S = 0, T = 0;
  seg[0] = grp[0] = 0;
  for (int64_t p = 0; p < P; p++) {
    const int G = u8(c) % 4;
    T += u8(c) % 9; /* the prefix, possibly empty */
    seg[++S] = (int32_t)T;
    for (int g = 0; g < G; g++) {
      T += 1 + u8(c) % 6;
      seg[++S] = (int32_t)T;
    }
    grp[p + 1] = (int32_t)S;
  }
  static const int32_t odd[] = {-1, 0, 1, INT32_MAX, INT32_MIN, 7};
  if (u8(c) % 8 == 0) seg[u8(c) % (S + 1)] = FZ_PICK(&c->in, odd);
  if (u8(c) % 8 == 0) grp[u8(c) % (P + 1)] = FZ_PICK(&c->in, odd);
  l->host_seq_offsets = u8(c) % 16 ? seg : NULL;
  l->host_group_offsets = u8(c) % 16 ? grp : NULL;
  static const int64_t fewer[] = {0, -1, INT64_MIN};
  l->num_segments = u8(c) % 16 ? S : FZ_PICK(&c->in, fewer);
  l->num_prompts = u8(c) % 16 ? P : FZ_PICK(&c->in, fewer);
  if (u8(c) & 1) {
    l->seq_offsets = tensor(c, RLK_I32, 1, S + 1, 0, F_ZERO, 0);
    copy_offsets(c, &l->seq_offsets, seg, S + 1);
    l->group_offsets = tensor(c, RLK_I32, 1, P + 1, 0, F_ZERO, 0);
    copy_offsets(c, &l->group_offsets, grp, P + 1);
  }
  static const int64_t heads[] = {64, 64, 128, 128, 32, 0, 96};
  sh->T = T;
  sh->Hkv = 1 + u8(c) % 2;
  sh->Hq = sh->Hkv * (1 + u8(c) % 2);
  sh->D = FZ_PICK(&c->in, heads);
  static const rlk_dtype types[] = {RLK_BF16, RLK_F16, RLK_BF16, RLK_F16, RLK_F32};
  sh->dt = FZ_PICK(&c->in, types);
}

static rlk_tensor pa_heads(call *c, const pa_shape *sh, int64_t H, rlk_dtype dt) {
  const int64_t dims[3] = {sh->T, H, sh->D};
  return tensor_nd(c, dt, 3, dims, F_VAL, 0);
}

/* What both attention passes read: the layout, q, k, v, the scale and out; returns the shape. */
static pa_shape pa_inputs(call *c, rlk_prefix_attention_layout *l, rlk_tensor *q, rlk_tensor *k, rlk_tensor *v,
                          float *scale, rlk_tensor *out) {
  pa_shape sh;
  pa_layout(c, l, &sh);
  *q = pa_heads(c, &sh, sh.Hq, sh.dt);
  *k = pa_heads(c, &sh, sh.Hkv, sh.dt);
  *v = pa_heads(c, &sh, sh.Hkv, sh.dt);
  *scale = (float)real(c, 0);
  *out = pa_heads(c, &sh, sh.Hq, sh.dt);
  return sh;
}

static void prefix_attention(call *c) {
  rlk_prefix_attention_args a;
  rlk_prefix_attention_args_init(&a);
  const pa_shape sh = pa_inputs(c, &a.layout, &a.q, &a.k, &a.v, &a.scale, &a.out);
  a.lse = OPT(c, tensor(c, RLK_F32, 2, sh.T, sh.Hq, F_VAL, 0));
  if (!c->skip) op_checked(c, rlk_prefix_attention(ctx, &a, NULL), "rlk_prefix_attention");
}

static void prefix_attention_backward(call *c) {
  rlk_prefix_attention_backward_args a;
  rlk_prefix_attention_backward_args_init(&a);
  const pa_shape sh = pa_inputs(c, &a.layout, &a.q, &a.k, &a.v, &a.scale, &a.out);
  a.lse = tensor(c, RLK_F32, 2, sh.T, sh.Hq, F_VAL, 0);
  a.grad_out = pa_heads(c, &sh, sh.Hq, sh.dt);
  a.grad_q = pa_heads(c, &sh, sh.Hq, sh.dt);
  a.grad_k = pa_heads(c, &sh, sh.Hkv, sh.dt);
  a.grad_v = pa_heads(c, &sh, sh.Hkv, sh.dt);
  if (c->skip) return;
  size_t bytes = 0;
  rlk_status st = fz_checked(rlk_prefix_attention_backward_workspace_size(ctx, &a, &bytes),
                             "rlk_prefix_attention_backward_workspace_size");
  give_workspace(c, st, bytes, &a.workspace, &a.workspace_bytes);
  op_checked(c, rlk_prefix_attention_backward(ctx, &a, NULL), "rlk_prefix_attention_backward");
}

/* RLK_FUZZ_SKIP="op ..." leaves those ops out (to explore the others while a fault is open). */
static int skipped(const char *name) {
  const char *list = getenv("RLK_FUZZ_SKIP");
  size_t n = strlen(name);
  for (const char *p = list ? strstr(list, name) : NULL; p; p = strstr(p + 1, name))
    if ((p == list || p[-1] == ' ' || p[-1] == ',') && (p[n] == '\0' || p[n] == ' ' || p[n] == ','))
      return 1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const struct {
    const char *name;
    void (*run)(call *);
  } ops[] = {{"group_advantage", group_advantage}, {"policy_loss", policy_loss}, {"value_loss", value_loss},
             {"gae", gae}, {"discounted_returns", discounted_returns}, {"reverse_cumsum", reverse_cumsum},
             {"masked_whiten", masked_whiten}, {"logprob", logprob}, {"logprob_backward", logprob_backward},
             {"sample", sample}, {"prefix_attention", prefix_attention},
             {"prefix_attention_backward", prefix_attention_backward}};
  call c;
  memset(&c, 0, sizeof c);
  c.in.p = data;
  c.in.n = size;
  const size_t which = fz_u8(&c.in) % (sizeof ops / sizeof ops[0]);
  if (skipped(ops[which].name)) return 0;
  void (*op)(call *) = ops[which].run;
  c.style = u8(&c) % 4;
  c.rng.s = fz_u64(&c.in);
  op(&c);
  for (int i = 0; i < c.nbufs; i++) free(c.bufs[i]);
  return 0;
}
