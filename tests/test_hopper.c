/* test_hopper.c - the Hopper building blocks (templates/cuda/hopper_*.cuh): the kernels of
 * hopper_selftest.cuh and the sm_90a kernels of rlk_linear_logprob, rlk_prefix_attention and
 * rlk_linear_divergence compile for sm_90a through NVRTC within a cold-compile budget of CPU time
 * (no GPU needed), and with RLK_TEST_GPU=1 on an sm_90 device one output tile D = A B^T through
 * TMA (128-byte swizzle), mbarriers and wgmma (A in shared memory and in registers; bf16 and f16)
 * matches an fp64 product of the stored inputs. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/hopper_selftest_params.h"
#include "runtime/context.h"
#include "ops/ops.h"
#include "suites.h"
#include "test_util.h"

static const char *const ht_dt_names[] = {"bf16", "f16", NULL};

static const rlk_value_decl *const ht_params[] = {
    RLK_PARAM_CHOICE("ab", ht_dt_names, 0, 1),
    RLK_PARAM_INT("n", 16, 256),
    RLK_PARAM_INT("k", 64, 256),
};
#define HT_NEEDS (RLK_TARGET_WGMMA | RLK_TARGET_TMA)
static const rlk_template ht_ss = {"hopper_selftest", "hopper_tile_ss", "cuda/hopper_selftest.cuh", NULL, 3, ht_params,
                                   HT_NEEDS};
static const rlk_template ht_rs = {"hopper_selftest", "hopper_tile_rs", "cuda/hopper_selftest.cuh", NULL, 3, ht_params,
                                   HT_NEEDS};
static const rlk_template ht_mn = {"hopper_selftest", "hopper_tile_mn", "cuda/hopper_selftest.cuh", NULL, 3, ht_params,
                                   HT_NEEDS};
static const rlk_value_decl *const ht_check_params[] = {RLK_PARAM_INT("n", 16, 256)};
static const rlk_template ht_check = {"hopper_selftest", "hopper_ptx_check", "cuda/hopper_selftest.cuh", NULL, 1,
                                      ht_check_params, HT_NEEDS};

static const rlk_value_decl *const ht_box_params[] = {RLK_PARAM_INT("rows", 1, 256),
                                                RLK_PARAM_INT("cols", 4, 128)};
static const rlk_template ht_box = {"hopper_selftest", "hopper_tma_box", "cuda/hopper_selftest.cuh", NULL, 2,
                                    ht_box_params, RLK_TARGET_TMA};

/* Cold compile of each kernel, CPU seconds of this process (NVRTC and its PTX compiler run in
 * process; CPU time grows less than wall time when other programs load the machine): the budget a
 * first call may spend on one Hopper kernel, 0.6 s on the 2-core build machine, with slack; twice
 * that under AddressSanitizer, whose allocator the compiler's many small allocations go through.
 * Build machines differ in speed (a 2-core VM of one kind took 2.5 to 3 times another's), so the
 * budget is also HT_COMPILE_UNITS times this process's cold compiles of two self-test kernels
 * (hopper_tile_rs and hopper_tile_mn, after the compiler's first use), whichever is larger: on
 * the slower VM the largest kernel (a linear_logprob_bwd_sm90 kind) took 2.7 to 3.7 of those
 * units, loaded or not; a kernel whose code doubles does not fit. */
#if defined(__SANITIZE_ADDRESS__)
#define HT_COMPILE_BUDGET 3.0
#else
#define HT_COMPILE_BUDGET 1.5
#endif
#define HT_COMPILE_UNITS 5.0
static double ht_unit; /* the reference compiles' CPU seconds (0 until they ran) */

static double ht_cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_sec +
         1e-6 * (double)u.ru_stime.tv_usec;
}

/* Compiles one spec cold; fails the test past the budget; returns its CPU seconds. */
static double ht_compile(rlk_context *ctx, const rlk_kernel_spec *spec) {
  rlk_context_reset_counters(ctx);
  const double cpu0 = ht_cpu_seconds();
  rlk_status st = rlk_jit_prepare(ctx->jit, spec);
  const double cpu = ht_cpu_seconds() - cpu0;
  ck_assert_msg(st == RLK_OK, "%s: %s", spec->tmpl->entry, rlk_last_error());
  rlk_counters c;
  ck_assert_int_eq(rlk_context_counters(ctx, &c), RLK_OK);
  ck_assert_uint_eq(c.compiles, 1);
  printf("hopper compile %s: %.3f s CPU, %.3f s wall\n", spec->tmpl->entry, cpu, c.compile_seconds);
  const double budget = HT_COMPILE_UNITS * ht_unit > HT_COMPILE_BUDGET ? HT_COMPILE_UNITS * ht_unit : HT_COMPILE_BUDGET;
  ck_assert_msg(cpu <= budget, "%s: cold compile %.3f s of CPU, over %.3f s (%.0f x %.3f s, the references')",
                spec->tmpl->entry, cpu, budget, HT_COMPILE_UNITS, ht_unit);
  return cpu;
}

/* Compiles, cold, each kernel of `line`'s plan that is an sm_90a one (entry "..._sm90..."); returns
 * how many. */
static int ht_compile_sm90(rlk_context *ctx, const rlk_op_desc *op, const char *line) {
  rlk_kernel_spec specs[RLK_OP_MAX_KERNELS];
  size_t n = 0;
  ck_assert_msg(rlk_test_plan_line(op, ctx, line, specs, &n) == RLK_OK, "%s: %s", line, rlk_last_error());
  int compiled = 0;
  for (size_t i = 0; i < n; i++)
    if (strstr(specs[i].tmpl->entry, "_sm90")) {
      ht_compile(ctx, &specs[i]);
      compiled++;
    }
  return compiled;
}

static rlk_kernel_spec ht_spec(const rlk_template *t, int ab, int n, int k) {
  return (rlk_kernel_spec){.tmpl = t, .values[0] = ab, .values[1] = n, .values[2] = k};
}

START_TEST(compile_sm90a) {
  char dir[1024];
  rlk_test_mkdtemp(dir, sizeof dir, "hopper-compile");
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_CUDA;
  o.compile_only = 1;
  o.target = "sm_90a";
  o.cache_dir = dir;
  rlk_context *ctx = NULL;
  if (rlk_context_create(&ctx, &o) != RLK_OK) {
    printf("skip (hopper compile): no NVRTC: %s\n", rlk_last_error());
    return;
  }
  const rlk_kernel_spec specs[] = {ht_spec(&ht_ss, 0, 256, 128), ht_spec(&ht_rs, 1, 64, 64),
                                   ht_spec(&ht_mn, 0, 256, 128)};
  ht_unit = 0;
  double unit = 0;
  for (size_t i = 0; i < 3; i++) {
    const double cpu = ht_compile(ctx, &specs[i]);
    if (i > 0) unit += cpu; /* the reference: the two after the compiler's first use */
  }
  ht_unit = unit;
  /* every wrapper of the headers through the assembler, every wgmma width and form */
  static const int widths[] = {16, 32, 64, 128, 192, 256};
  for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
    rlk_kernel_spec c;
    memset(&c, 0, sizeof c);
    c.tmpl = &ht_check;
    c.values[0] = widths[i];
    rlk_status st = rlk_jit_prepare(ctx->jit, &c);
    ck_assert_msg(st == RLK_OK, "hopper_ptx_check<%d>: %s", widths[i], rlk_last_error());
  }
  /* the f32 box copy the GPU case runs */
  rlk_kernel_spec box;
  memset(&box, 0, sizeof box);
  box.tmpl = &ht_box;
  box.values[0] = 16;
  box.values[1] = 32;
  ck_assert_msg(rlk_jit_prepare(ctx->jit, &box) == RLK_OK, "hopper_tma_box: %s", rlk_last_error());
  /* the fused LM head's kernels: the sm_90a GEMM, its tiled fallback and the combine */
  rlk_op_config_pair pairs[2] = {{"entropy", "1"}, {"pass", "fwd"}};
  rlk_kernel_spec ll[RLK_OP_MAX_KERNELS];
  size_t n = 0;
  ck_assert_int_eq(rlk_op_plan(&rlk_op_linear_logprob, ctx, 2, pairs, ll, &n), RLK_OK);
  ck_assert_uint_eq(n, 3);
  for (size_t i = 0; i < n; i++) ht_compile(ctx, &ll[i]);
  /* and its sm_90a backward: the three kinds of linear_logprob_bwd_sm90 */
  rlk_op_config_pair bwd[3] = {{"entropy", "1"}, {"pass", "bwd"}, {"grad", "f32"}};
  ck_assert_int_eq(rlk_op_plan(&rlk_op_linear_logprob, ctx, 3, bwd, ll, &n), RLK_OK);
  int kinds = 0;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(ll[i].tmpl->entry, "linear_logprob_bwd_sm90")) {
      ht_compile(ctx, &ll[i]);
      kinds++;
    }
  ck_assert_int_eq(kinds, 3);
  /* and the token chunks' own kinds: the stored logits, row-major and transposed, and dh from
   * the transposed (their other products are the backward's, compiled above), with the
   * transposed stored pass */
  rlk_op_config_pair ch[1] = {{"pass", "chunks"}};
  ck_assert_int_eq(rlk_op_plan(&rlk_op_linear_logprob, ctx, 1, ch, ll, &n), RLK_OK);
  kinds = 0;
  int passes = 0;
  for (size_t i = 0; i < n; i++) {
    if (!strcmp(ll[i].tmpl->entry, "linear_logprob_bwd_sm90") && ll[i].values[0] >= 3) {
      ht_compile(ctx, &ll[i]);
      kinds++;
    }
    if (!strcmp(ll[i].tmpl->entry, "linear_logprob_stored_dz_t")) {
      ht_compile(ctx, &ll[i]);
      passes++;
    }
  }
  ck_assert_int_eq(kinds, 3);
  ck_assert_int_eq(passes, 1);
  /* prefix attention's sm_90a forward, dk/dv and dq */
  ck_assert_int_eq(ht_compile_sm90(ctx, &rlk_op_prefix_attention, "prefix_attention pass=both dtype=bf16"), 3);
  /* the distillation divergence's sm_90a forward passes (the stats, JSD's second) in quads, pairs
   * and alone, its dz in pairs and alone, and the fused head's two products instantiated from its
   * source */
  ck_assert_int_eq(ht_compile_sm90(ctx, &rlk_op_linear_divergence, "linear_divergence mode=jsd grad=f32"), 10);
  rlk_context_destroy(ctx);
  rlk_test_rmtree(dir);
}
END_TEST

/* wgmma is Hopper's alone: datacenter Blackwell (sm_100a, sm_100f, sm_103a) has tcgen05 instead,
 * consumer Blackwell (sm_120a, sm_121a) neither. On those targets the JIT refuses every template
 * that needs wgmma, naming the feature and the target, before any compiler sees it; and no op's
 * sample configuration plans one there (their portable kernels take its place: the plan cases
 * of `make test-targets` compile them for sm_100a and sm_120a). */
START_TEST(wgmma_refused_on_blackwell) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.compile_only = 1;
  o.target = "sm_90a";
  rlk_context *hopper = NULL;
  if (rlk_context_create(&hopper, &o) != RLK_OK) {
    printf("skip (hopper on blackwell): no NVRTC: %s\n", rlk_last_error());
    fflush(stdout);
    return;
  }
  /* the Hopper kernels of the ops as sm_90a plans them, and the self-test's */
  rlk_kernel_spec wg[2 * RLK_OP_MAX_KERNELS + 1];
  size_t nwg = 0, n = 0;
  rlk_kernel_spec planned[RLK_OP_MAX_KERNELS];
  rlk_op_config_pair ll[1] = {{"pass", "both"}};
  rlk_op_config_pair pa[1] = {{"pass", "both"}};
  ck_assert_int_eq(rlk_op_plan(&rlk_op_linear_logprob, hopper, 1, ll, planned, &n), RLK_OK);
  for (size_t i = 0; i < n; i++)
    if (planned[i].tmpl->requires & RLK_TARGET_WGMMA) wg[nwg++] = planned[i];
  ck_assert_int_eq(rlk_op_plan(&rlk_op_prefix_attention, hopper, 1, pa, planned, &n), RLK_OK);
  for (size_t i = 0; i < n; i++)
    if (planned[i].tmpl->requires & RLK_TARGET_WGMMA) wg[nwg++] = planned[i];
  wg[nwg++] = ht_spec(&ht_ss, 0, 256, 128);
  ck_assert_uint_ge(nwg, 6); /* linear_logprob's forward and backward, prefix attention's three */
  rlk_context_destroy(hopper);

  static const char *const blackwell[] = {"sm_100a", "sm_100f", "sm_103a", "sm_120a", "sm_121a"};
  for (size_t b = 0; b < sizeof blackwell / sizeof blackwell[0]; b++) {
    char dir[1024];
    rlk_test_mkdtemp(dir, sizeof dir, "blackwell");
    o.target = blackwell[b];
    o.cache_dir = dir;
    rlk_context *ctx = NULL;
    rlk_status st = rlk_context_create(&ctx, &o);
    if (st == RLK_ERR_UNSUPPORTED) { /* an NVRTC older than the arch */
      printf("skip (hopper on %s): %s\n", blackwell[b], rlk_last_error());
      fflush(stdout);
      rlk_test_rmtree(dir);
      continue;
    }
    ck_assert_msg(st == RLK_OK, "%s: %s", blackwell[b], rlk_last_error());
    ck_assert_uint_eq(ctx->target.features & RLK_TARGET_WGMMA, 0);
    for (size_t i = 0; i < nwg; i++) {
      ck_assert_int_eq(rlk_jit_prepare(ctx->jit, &wg[i]), RLK_ERR_UNSUPPORTED);
      const char *msg = rlk_last_error();
      ck_assert_msg(strstr(msg, wg[i].tmpl->entry) && strstr(msg, "needs") && strstr(msg, "wgmma") &&
                        strstr(msg, blackwell[b]),
                    "%s on %s: %s", wg[i].tmpl->entry, blackwell[b], msg);
    }
    rlk_counters c;
    ck_assert_int_eq(rlk_context_counters(ctx, &c), RLK_OK);
    ck_assert_uint_eq(c.compiles, 0); /* refused before compiling */
    /* every sample line plans kernels the target can build (keys only: nothing compiles) */
    for (size_t k = 0; rlk_op_table[k]; k++)
      for (size_t i = 0; rlk_op_table[k]->samples && rlk_op_table[k]->samples[i]; i++) {
        char keys[RLK_OP_MAX_KERNELS * 66];
        int nk = 0;
        st = rlk_precompile_keys(ctx, rlk_op_table[k]->samples[i], keys, sizeof keys, &nk);
        ck_assert_msg(st == RLK_OK, "%s on %s: %s", rlk_op_table[k]->samples[i], blackwell[b], rlk_last_error());
      }
    rlk_context_destroy(ctx);
    rlk_test_rmtree(dir);
  }
}
END_TEST

static double ht_value(const uint16_t *p, int64_t i, int f16) {
  uint16_t b = p[i];
  if (f16) {
    _Float16 h;
    memcpy(&h, &b, sizeof h);
    return (double)h;
  }
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return (double)f;
}

/* One tile through the kernel against fp64. K-major kernels: D = A B^T with A [64][K], B [N][K];
 * hopper_tile_mn: D = A^T B with A [K][64], B [K][N] (MN contiguous). The inputs are on a grid (A
 * a / 4, B b / 64, a and b integers, |a| <= 7, |b| <= 63, 16-bit values either way): every product
 * is a multiple of 2^-8 and every partial sum one of at most 441 K / 256 in magnitude, which f32
 * holds exactly while 441 K < 2^20, in any order and under any truncation: D must be exact. */
static void ht_tile(rlk_context *ctx, const rlk_template *t, int f16, int N, int K, uint64_t *rng) {
  const int mn = t == &ht_mn;
  const rlk_dtype dt = f16 ? RLK_F16 : RLK_BF16;
  uint16_t *a = calloc((size_t)64 * K, 2), *b = calloc((size_t)N * K, 2);
  float *d = malloc((size_t)64 * N * sizeof(float));
  ck_assert(a && b && d);
  ck_assert_msg(441 * K < (1 << 20), "K %d: the grid's sums would not stay exact", K);
  for (int64_t i = 0; i < 64 * K; i++)
    rlk_test_store(a, dt, i, (double)((int)(rlk_test_rand_u64(rng) % 15u) - 7) / 4.0);
  for (int64_t i = 0; i < (int64_t)N * K; i++)
    rlk_test_store(b, dt, i, (double)((int)(rlk_test_rand_u64(rng) % 127u) - 63) / 64.0);
  void *da = rlk_test_dev_upload(ctx, a, (size_t)64 * K * 2);
  void *db = rlk_test_dev_upload(ctx, b, (size_t)N * K * 2);
  void *dd = rlk_test_dev_alloc(ctx, (size_t)64 * N * sizeof(float));
  ck_assert_int_eq(rlk_memset(ctx, dd, 0xff, (size_t)64 * N * sizeof(float)), RLK_OK);
  rlk_tma_desc_request ra = {da, dt, 64, (uint64_t)K, (uint64_t)K, 64, 64, 128};
  rlk_tma_desc_request rb = {db, dt, (uint64_t)N, (uint64_t)K, (uint64_t)K, (uint32_t)N, 64, 128};
  if (mn) {
    const rlk_tma_desc_request ma_ = {da, dt, (uint64_t)K, 64, 64, 64, 64, 128};
    const rlk_tma_desc_request mb_ = {db, dt, (uint64_t)K, (uint64_t)N, (uint64_t)N, 64, 64, 128};
    ra = ma_;
    rb = mb_;
  }
  ht_tile_args targs = {.D = dd};
  ck_assert_msg(rlk_cuda_tma_encode(ctx->backend, &ra, &targs.map_a) == RLK_OK, "%s", rlk_last_error());
  ck_assert_msg(rlk_cuda_tma_encode(ctx->backend, &rb, &targs.map_b) == RLK_OK, "%s", rlk_last_error());
  rlk_kernel_spec s = ht_spec(t, f16, N, K);
  rlk_launch_dims dims;
  memset(&dims, 0, sizeof dims);
  dims.grid[0] = dims.grid[1] = dims.grid[2] = 1;
  dims.block[0] = 128;
  dims.block[1] = dims.block[2] = 1;
  dims.shared_bytes = (size_t)(K / 64) * (8192u + (size_t)N * 128u) + 1024u;
  ck_assert_msg(rlk_context_launch_params(ctx, &s, &dims, NULL, &targs) == RLK_OK, "%s", rlk_last_error());
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, d, dd, (size_t)64 * N * sizeof(float)), RLK_OK);
  double worst = 0.0;
  for (int i = 0; i < 64; i++)
    for (int j = 0; j < N; j++) {
      double ref = 0.0, mag = 0.0;
      for (int k = 0; k < K; k++) {
        const int64_t ia = mn ? (int64_t)k * 64 + i : (int64_t)i * K + k;
        const int64_t ib = mn ? (int64_t)k * N + j : (int64_t)j * K + k;
        const double p = ht_value(a, ia, f16) * ht_value(b, ib, f16);
        ref += p;
        mag += fabs(p);
      }
      const double err = fabs((double)d[(size_t)i * N + j] - ref);
      ck_assert_msg(err == 0.0, "%s %s N=%d K=%d: D[%d][%d] = %.9g, fp64 %.9g (exact on the grid)",
                    t->entry, f16 ? "f16" : "bf16", N, K, i, j, (double)d[(size_t)i * N + j], ref);
      if (err / (mag + 1e-30) > worst) worst = err / (mag + 1e-30);
    }
  printf("hopper gpu %s %s N=%d K=%d: worst |err| / sum|a b| = %.3g\n", t->entry, f16 ? "f16" : "bf16",
         N, K, worst);
  rlk_free(ctx, da);
  rlk_free(ctx, db);
  rlk_free(ctx, dd);
  free(a);
  free(b);
  free(d);
}

/* One f32 box through a map rlk_cuda_tma_encode wrote (no swizzle, rows of a stride past the
 * columns): inside the tensor, and hanging over its bottom-right corner, where TMA fills zeros.
 * Element for element against the host's copy: a wrong stride, extent, box or element type in the
 * map moves or drops values. */
static void ht_box_copy(rlk_context *ctx, uint64_t *rng, int BOX_ROWS, int BOX_COLS) {
  const uint64_t rows = 100 + rlk_test_rand_u64(rng) % 400, cols = BOX_COLS + 8 + rlk_test_rand_u64(rng) % 200;
  const uint64_t stride = (cols + 3) / 4 * 4 + 4 * (rlk_test_rand_u64(rng) % 3); /* 16-byte rows */
  const size_t bytes = (size_t)(rows * stride * sizeof(float));
  float *h = malloc(bytes), *out = malloc((size_t)BOX_ROWS * BOX_COLS * sizeof(float));
  const size_t out_bytes = (size_t)BOX_ROWS * BOX_COLS * sizeof(float);
  ck_assert(h && out);
  for (uint64_t i = 0; i < rows * stride; i++) h[i] = (float)rlk_test_rand_normal(rng);
  void *d = rlk_test_dev_upload(ctx, h, bytes), *dout = rlk_test_dev_alloc(ctx, out_bytes);
  const rlk_tma_desc_request req = {d, RLK_F32, rows, cols, stride, BOX_ROWS, BOX_COLS, 0};
  ht_box_args bargs = {.out = dout};
  ck_assert_msg(rlk_cuda_tma_encode(ctx->backend, &req, &bargs.map) == RLK_OK, "%s", rlk_last_error());
  rlk_kernel_spec s;
  memset(&s, 0, sizeof s);
  s.tmpl = &ht_box;
  s.values[0] = BOX_ROWS;
  s.values[1] = BOX_COLS;
  /* A box's first column lies on the 16-byte grid (4 f32): an H200 faults (an illegal
   * instruction at the barrier's wait) on a box that starts off it: every earlier form of this
   * case drew a random column, and the four boxes off the grid faulted, the one on it held. The
   * library's kernels start their boxes at multiples of the box's width. */
  const int origins[2][2] = {
      {(int)(rlk_test_rand_u64(rng) % (rows - BOX_ROWS)), (int)(rlk_test_rand_u64(rng) % (cols - BOX_COLS)) & ~3},
      {(int)rows - BOX_ROWS / 2, ((int)cols - BOX_COLS / 4) & ~3}};
  for (int k = 0; k < 2; k++) {
    const int row0 = origins[k][0], col0 = origins[k][1];
    ck_assert_int_eq(rlk_memset(ctx, dout, 0xff, out_bytes), RLK_OK);
    rlk_launch_dims dims;
    memset(&dims, 0, sizeof dims);
    dims.grid[0] = dims.grid[1] = dims.grid[2] = 1;
    dims.block[0] = 128;
    dims.block[1] = dims.block[2] = 1;
    dims.shared_bytes = out_bytes + 128; /* the box and its alignment slack */
    bargs.row0 = row0, bargs.col0 = col0;
    printf("hopper gpu hopper_tma_box<%d, %d>: box at (%d, %d) of f32 %llu x %llu (stride %llu)\n", BOX_ROWS, BOX_COLS,
           row0, col0, (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)stride);
    fflush(stdout);
    ck_assert_msg(rlk_context_launch_params(ctx, &s, &dims, NULL, &bargs) == RLK_OK, "%s", rlk_last_error());
    ck_assert_msg(rlk_stream_synchronize(ctx, NULL) == RLK_OK, "tma box at (%d, %d): %s", row0, col0, rlk_last_error());
    ck_assert_int_eq(rlk_memcpy_to_host(ctx, out, dout, out_bytes), RLK_OK);
    for (int r = 0; r < BOX_ROWS; r++)
      for (int c = 0; c < BOX_COLS; c++) {
        const uint64_t gr = (uint64_t)(row0 + r), gc = (uint64_t)(col0 + c);
        const float want = gr < rows && gc < cols ? h[gr * stride + gc] : 0.0f;
        ck_assert_msg(out[r * BOX_COLS + c] == want,
                      "box (%d,%d) at (%d,%d): %.9g, want %.9g (rows %llu cols %llu stride %llu)", r, c, row0,
                      col0, (double)out[r * BOX_COLS + c], (double)want, (unsigned long long)rows,
                      (unsigned long long)cols, (unsigned long long)stride);
      }
  }
  rlk_free(ctx, d);
  rlk_free(ctx, dout);
  free(h);
  free(out);
}

START_TEST(gpu_wgmma_tile) {
  if (!rlk_test_gpu_enabled("hopper")) return;
  rlk_context *ctx = rlk_test_cuda_context("hopper");
  if (!ctx) return;
  rlk_device_info info;
  ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
  if (info.compute_major != 9) {
    printf("skip (hopper gpu): compute capability %d.x is not 9.0\n", info.compute_major);
    rlk_context_destroy(ctx);
    return;
  }
  uint64_t rng = rlk_test_seed() ^ 0x4f70u;
  ht_tile(ctx, &ht_ss, 0, 256, 128, &rng);
  ht_tile(ctx, &ht_ss, 1, 64, 192, &rng);
  ht_tile(ctx, &ht_rs, 0, 128, 64, &rng);
  ht_tile(ctx, &ht_rs, 1, 64, 64, &rng);
  ht_tile(ctx, &ht_mn, 0, 256, 128, &rng);
  ht_tile(ctx, &ht_mn, 1, 64, 64, &rng);
  ht_box_copy(ctx, &rng, 8, 128); /* the logprob kernels' box */
  ht_box_copy(ctx, &rng, 16, 32);
  rlk_context_destroy(ctx);
}
END_TEST

/* The clusters' SMs the CUDA backend reads at open (rlk_target.cluster_sms, what the forward
 * divergence picks its cluster by): on an sm_90+ device every size known, whole clusters, no more
 * SMs than the device has and no more for bigger clusters (a GPC holding quads holds pairs). */
START_TEST(gpu_cluster_shapes) {
  if (!rlk_test_gpu_enabled("hopper")) return;
  rlk_context *ctx = rlk_test_cuda_context("hopper");
  if (!ctx) return;
  rlk_device_info info;
  ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
  if (info.compute_major < 9) {
    printf("skip (hopper gpu): compute capability %d.x has no clusters\n", info.compute_major);
    rlk_context_destroy(ctx);
    return;
  }
  const rlk_target *t = &ctx->target;
  printf("hopper gpu: %d SMs, in clusters of 2 / 4 / 8: %d / %d / %d\n", t->multiprocessors, t->cluster_sms[1],
         t->cluster_sms[2], t->cluster_sms[3]);
  ck_assert_int_eq(t->cluster_sms[0], 0);
  for (int i = 1; i < RLK_TARGET_CLUSTER_SIZES; i++) {
    ck_assert_int_gt(t->cluster_sms[i], 0);
    ck_assert_int_eq(t->cluster_sms[i] % (1 << i), 0);
    ck_assert_int_le(t->cluster_sms[i], i == 1 ? t->multiprocessors : t->cluster_sms[i - 1]);
  }
  rlk_context_destroy(ctx);
}
END_TEST

Suite *hopper_suite(void) {
  Suite *s = suite_create("hopper");
  rlk_test_add_case(s, "compile", 120, TESTS(compile_sm90a, wgmma_refused_on_blackwell));
  rlk_test_add_case(s, "gpu", 300, TESTS(gpu_wgmma_tile, gpu_cluster_shapes));
  return s;
}
