/* rlk-bench-linear-logprob - times rlk_linear_logprob (the fused LM head + log-probs) on the
 * device, for the anchor comparison with cuBLAS (tools/bench/torch_linear_logprob.py runs
 * h @ W^T and matmul + logsumexp in the same job).
 *
 *   rlk-bench-linear-logprob [--shape N,H,V]... [--iters K] [--variant auto|wgmma|tiled] [--backward]
 *
 * Inputs: hidden ~ U(-1, 1), weight ~ U(-1, 1) * 3 / sqrt(H) (logits of std ~ 1), bf16, random
 * labels; entropy on. Prints a line per shape: median / min / max ms over K timed calls after 3
 * warm-up calls, TFLOP/s counting 2 N H V, the workspace bytes, and a spot check of two rows
 * against an fp64 computation on the host. --backward also times rlk_linear_logprob_backward
 * (grad_logp and grad_entropy given, f32 grad_hidden and grad_weight). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlk.h"

static const char *prog = "rlk-bench-linear-logprob";

#include "tool_util.h"
#include "bench_util.h"

static int fail(const char *what) {
  fprintf(stderr, "rlk-bench-linear-logprob: %s: %s\n", what, rlk_last_error());
  return 1;
}

/* Times `iters` calls of the forward (b NULL) or of the backward (b), each alone between device
 * events; t gets the timings (ms), sorted. 0, or fail's 1. */
static int time_calls(rlk_context *ctx, const rlk_linear_logprob_args *a, const rlk_linear_logprob_backward_args *b,
                      int iters, double *t) {
  rlk_event *e0, *e1;
  if (rlk_event_create(ctx, &e0) || rlk_event_create(ctx, &e1)) return fail("events");
  for (int i = 0; i < iters; i++) {
    float ms = 0;
    if (rlk_event_record(e0, NULL) ||
        (b ? rlk_linear_logprob_backward(ctx, b, NULL) : rlk_linear_logprob(ctx, a, NULL)) ||
        rlk_event_record(e1, NULL) || rlk_stream_synchronize(ctx, NULL) || rlk_event_elapsed_ms(e0, e1, &ms))
      return fail(b ? "timed backward" : "timed call");
    t[i] = ms;
  }
  rlk_event_destroy(e0);
  rlk_event_destroy(e1);
  qsort(t, (size_t)iters, sizeof *t, bench_cmp_double);
  return 0;
}

static int time_backward(rlk_context *ctx, const rlk_linear_logprob_args *a, int iters, int64_t N, int64_t H,
                         int64_t V) {
  void *dgh, *dgw, *dg, *wsp = NULL;
  if (rlk_malloc(ctx, (size_t)(N * H) * 4, &dgh) || rlk_malloc(ctx, (size_t)(V * H) * 4, &dgw) ||
      rlk_malloc(ctx, (size_t)N * 4, &dg))
    return fail("rlk_malloc (backward)");
  float *ones = malloc((size_t)N * 4);
  for (int64_t i = 0; i < N; i++) ones[i] = (float)((i % 7) - 3) * 0.25f;
  if (rlk_memcpy_to_device(ctx, dg, ones, (size_t)N * 4)) return fail("upload");
  free(ones);
  rlk_linear_logprob_backward_args b;
  rlk_linear_logprob_backward_args_init(&b);
  b.hidden = a->hidden;
  b.weight = a->weight;
  b.labels = a->labels;
  b.lse = a->lse;
  b.grad_logp = rlk_tensor_1d(dg, RLK_F32, N);
  b.grad_entropy = rlk_tensor_1d(dg, RLK_F32, N);
  b.entropy = a->entropy;
  b.grad_hidden = rlk_tensor_2d(dgh, RLK_F32, N, H, H);
  b.grad_weight = rlk_tensor_2d(dgw, RLK_F32, V, H, H);
  size_t wsb = 0;
  if (rlk_linear_logprob_backward_workspace_size(ctx, &b, &wsb)) return fail("backward workspace size");
  if (wsb && rlk_malloc(ctx, wsb, &wsp)) return fail("rlk_malloc backward workspace");
  b.workspace = wsp;
  b.workspace_bytes = wsb;
  if (rlk_linear_logprob_backward(ctx, &b, NULL) || rlk_stream_synchronize(ctx, NULL)) return fail("backward");
  double *t = malloc((size_t)iters * sizeof *t);
  if (time_calls(ctx, a, &b, iters, t)) return 1;
  const double med = t[iters / 2], flop = 3 * 2.0 * (double)N * (double)H * (double)V;
  printf("linear_logprob backward N=%lld H=%lld V=%lld bf16 (f32 grads): median %.3f ms (min %.3f, max %.3f), "
         "%.0f TFLOP/s counting 3 GEMMs, workspace %zu B\n",
         (long long)N, (long long)H, (long long)V, med, t[0], t[iters - 1], flop / (med * 1e-3) / 1e12, wsb);
  rlk_free(ctx, dgh), rlk_free(ctx, dgw), rlk_free(ctx, dg);
  if (wsp) rlk_free(ctx, wsp);
  free(t);
  return 0;
}

static int run_shape(rlk_context *ctx, int64_t N, int64_t H, int64_t V, int iters, int variant, int backward) {
  const size_t hn = (size_t)(N * H), wn = (size_t)(V * H);
  uint16_t *h = malloc(hn * 2), *w = malloc(wn * 2);
  int64_t *lab = malloc((size_t)N * 8);
  if (!h || !w || !lab) return fail("host memory");
  uint64_t s = 12345;
  const float ws = 3.0f / sqrtf((float)H);
  for (size_t i = 0; i < hn; i++) h[i] = bench_bf16_of((float)(bench_lcg(&s) * 0x1p-53 * 2.0 - 1.0));
  for (size_t i = 0; i < wn; i++) w[i] = bench_bf16_of(ws * (float)(bench_lcg(&s) * 0x1p-53 * 2.0 - 1.0));
  for (int64_t i = 0; i < N; i++) lab[i] = (int64_t)(bench_lcg(&s) % (uint64_t)V);
  void *dh, *dw, *dl, *dlp, *dlse, *dent, *wsp = NULL;
  if (rlk_malloc(ctx, hn * 2, &dh) || rlk_malloc(ctx, wn * 2, &dw) || rlk_malloc(ctx, (size_t)N * 8, &dl) ||
      rlk_malloc(ctx, (size_t)N * 4, &dlp) || rlk_malloc(ctx, (size_t)N * 4, &dlse) ||
      rlk_malloc(ctx, (size_t)N * 4, &dent))
    return fail("rlk_malloc");
  if (rlk_memcpy_to_device(ctx, dh, h, hn * 2) || rlk_memcpy_to_device(ctx, dw, w, wn * 2) ||
      rlk_memcpy_to_device(ctx, dl, lab, (size_t)N * 8))
    return fail("upload");
  rlk_linear_logprob_args a;
  rlk_linear_logprob_args_init(&a);
  a.hidden = rlk_tensor_2d(dh, RLK_BF16, N, H, H);
  a.weight = rlk_tensor_2d(dw, RLK_BF16, V, H, H);
  a.labels = rlk_tensor_1d(dl, RLK_I64, N);
  a.logp = rlk_tensor_1d(dlp, RLK_F32, N);
  a.lse = rlk_tensor_1d(dlse, RLK_F32, N);
  a.entropy = rlk_tensor_1d(dent, RLK_F32, N);
  a.variant = (rlk_linear_logprob_variant)variant;
  size_t wsb = 0;
  if (rlk_linear_logprob_workspace_size(ctx, &a, &wsb)) return fail("workspace size");
  if (wsb && rlk_malloc(ctx, wsb, &wsp)) return fail("rlk_malloc workspace");
  a.workspace = wsp;
  a.workspace_bytes = wsb;
  for (int i = 0; i < 3; i++)
    if (rlk_linear_logprob(ctx, &a, NULL)) return fail("rlk_linear_logprob");
  if (rlk_stream_synchronize(ctx, NULL)) return fail("sync");
  /* spot check: rows 0 and N - 1 in fp64 */
  float lp[2], ls[2], en[2];
  double err = 0.0;
  const int64_t rows[2] = {0, N - 1};
  for (int r = 0; r < 2; r++) {
    if (rlk_memcpy_to_host(ctx, &lp[r], (float *)dlp + rows[r], 4) ||
        rlk_memcpy_to_host(ctx, &ls[r], (float *)dlse + rows[r], 4) ||
        rlk_memcpy_to_host(ctx, &en[r], (float *)dent + rows[r], 4))
      return fail("download");
    const uint16_t *hr = h + rows[r] * H;
    double m = -INFINITY, se = 0.0, pz = 0.0, zy = 0.0;
    for (int64_t v = 0; v < V; v++) {
      double z = 0.0;
      for (int64_t k = 0; k < H; k++) z += bench_bf16_value(hr[k]) * bench_bf16_value(w[v * H + k]);
      if (v == lab[rows[r]]) zy = z;
      if (z > m) {
        const double f = m == -INFINITY ? 0.0 : exp(m - z);
        se *= f, pz *= f, m = z;
      }
      const double e = exp(z - m);
      se += e, pz += e * z;
    }
    const double lse = m + log(se);
    const double d[3] = {fabs(lp[r] - (zy - lse)), fabs(ls[r] - lse), fabs(en[r] - (lse - pz / se))};
    for (int q = 0; q < 3; q++) err = d[q] > err ? d[q] : err;
  }
  double *t = malloc((size_t)iters * sizeof *t);
  if (time_calls(ctx, &a, NULL, iters, t)) return 1;
  const double med = t[iters / 2], flop = 2.0 * (double)N * (double)H * (double)V;
  printf("linear_logprob fwd+entropy N=%lld H=%lld V=%lld bf16 variant=%d: median %.3f ms (min %.3f, max %.3f), "
         "%.0f TFLOP/s, workspace %zu B, spot check |err| %.3g%s\n",
         (long long)N, (long long)H, (long long)V, variant, med, t[0], t[iters - 1], flop / (med * 1e-3) / 1e12,
         wsb, err, err < 2e-3 ? "" : "  <-- WRONG");
  if (backward && time_backward(ctx, &a, iters < 3 ? iters : 3, N, H, V)) return 1;
  rlk_free(ctx, dh), rlk_free(ctx, dw), rlk_free(ctx, dl), rlk_free(ctx, dlp), rlk_free(ctx, dlse);
  rlk_free(ctx, dent);
  if (wsp) rlk_free(ctx, wsp);
  free(h), free(w), free(lab), free(t);
  return 0;
}

static int tool_main(int argc, char **argv) {
  int64_t shapes[8][3];
  int nshapes = 0, iters = 10, variant = 0, backward = 0;
  static const struct option longopts[] = {{"shape", required_argument, NULL, 's'},
                                           {"iters", required_argument, NULL, 'i'},
                                           {"backward", no_argument, NULL, 'B'},
                                           {"variant", required_argument, NULL, 'v'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  opterr = 0;
  long num = 0;
  for (int c; (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1;) {
    switch (c) {
      case 's': {
        long long n, h, v;
        if (nshapes >= 8) return usage_error("at most 8 --shape");
        if (sscanf(optarg, "%lld,%lld,%lld", &n, &h, &v) != 3 || n < 1 || h < 1 || v < 1)
          return usage_error("--shape: '%s' is not N,H,V", optarg);
        shapes[nshapes][0] = n, shapes[nshapes][1] = h, shapes[nshapes][2] = v;
        nshapes++;
        break;
      }
      case 'i':
        if (parse_int(optarg, 1, 1000000, &num)) return usage_error("--iters needs a count from 1");
        iters = (int)num;
        break;
      case 'B': backward = 1; break;
      case 'v':
        if (strcmp(optarg, "auto") && strcmp(optarg, "wgmma") && strcmp(optarg, "tiled"))
          return usage_error("--variant: '%s' is not auto, wgmma or tiled", optarg);
        variant = !strcmp(optarg, "wgmma") ? 1 : !strcmp(optarg, "tiled") ? 2 : 0;
        break;
      case 'h':
        printf("usage: %s [--shape N,H,V]... [--iters K] [--variant auto|wgmma|tiled] [--backward]\n", prog);
        return 0;
      default: return getopt_error(c, argv);
    }
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
  if (iters < 1) iters = 1;
  if (!nshapes) {
    shapes[0][0] = 8192, shapes[0][1] = 4096, shapes[0][2] = 151936;
    nshapes = 1;
  }
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_CUDA;
  rlk_context *ctx;
  if (rlk_context_create(&ctx, &o)) return fail("context");
  rlk_device_info info;
  rlk_context_device_info(ctx, &info);
  printf("device: %s (%s)\n", info.name, info.target);
  for (int s = 0; s < nshapes; s++)
    if (run_shape(ctx, shapes[s][0], shapes[s][1], shapes[s][2], iters, variant, backward)) return 1;
  rlk_context_destroy(ctx);
  return 0;
}

int main(int argc, char **argv) { return tool_exit(tool_main(argc, argv)); }
