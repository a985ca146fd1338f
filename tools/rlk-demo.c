/*
 * rlk-demo - the first thing to run: computes GRPO group advantages for a small random batch
 * twice and shows what the kernel cache did each time.
 *
 *   first call:  a miss and a compile (or a disk hit when the demo ran before, or when a
 *                precompiled tree is listed in RLK_CACHE_RO_DIRS)
 *   second call: an in-memory hit, no compile
 *
 * Then it checks the advantages against a plain double-precision computation.
 * Built only on the public API (include/rlk.h). Exit status: 0 success, 1 a failure (or an
 * error above tolerance), 2 a usage error.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rlk.h"

static const char *prog = "rlk-demo";

#include "tool_util.h"

#define TOLERANCE 1e-5

static void usage(FILE *out) {
  fprintf(out,
          "usage: %s [OPTIONS]\n"
          "\n"
          "Runs rlk_group_advantage (GRPO) twice on random scores and shows the kernel cache\n"
          "at work: the first call compiles (or loads from disk), the second is served from\n"
          "memory. Checks the result against a double-precision reference.\n"
          "\n"
          "options:\n"
          "  --backend B       auto (default: a GPU when present, else the CPU), cuda, hip or host\n"
          "  --prompts N       groups in the batch (default 8)\n"
          "  --group-size G    responses per prompt, >= 2 (default 4)\n"
          "  --tokens T        tokens per response for the masked broadcast (default 16)\n"
          "  --mode M          grpo (default), mean-only, rloo or batch-std\n"
          "  --seed S          random seed (default: from the clock)\n"
          "  -h, --help        this help\n"
          "\n"
          "The cache is the usual one: RLK_CACHE_DIR (or ~/.cache/rlk), after the read-only trees\n"
          "in RLK_CACHE_RO_DIRS; with RLK_JIT=0 a kernel missing from every cache is an error.\n"
          "\n"
          "exit status: 0 success, 1 failure, 2 usage error\n",
          prog);
}

/* The per-sequence advantages in double precision, from the op's definition. */
static void reference(const float *scores, long batch, long g, rlk_advantage_mode mode, double eps,
                      int unbiased, double *adv, double *group_mean) {
  double batch_std = 0;
  if (mode == RLK_ADV_BATCH_STD) {
    double m = 0, ss = 0;
    for (long i = 0; i < batch; i++) m += scores[i];
    m /= (double)batch;
    for (long i = 0; i < batch; i++) ss += (scores[i] - m) * (scores[i] - m);
    batch_std = sqrt(ss / (double)(unbiased ? batch - 1 : batch));
  }
  for (long b0 = 0; b0 < batch; b0 += g) {
    double sum = 0, ss = 0;
    for (long i = b0; i < b0 + g; i++) sum += scores[i];
    double m = sum / (double)g;
    for (long i = b0; i < b0 + g; i++) ss += (scores[i] - m) * (scores[i] - m);
    double sd = sqrt(ss / (double)(unbiased ? g - 1 : g));
    for (long i = b0; i < b0 + g; i++) {
      double s = scores[i];
      group_mean[i] = m;
      switch (mode) {
        case RLK_ADV_GRPO: adv[i] = (s - m) / (sd + eps); break;
        case RLK_ADV_MEAN_ONLY: adv[i] = s - m; break;
        case RLK_ADV_RLOO: adv[i] = s - (sum - s) / (double)(g - 1); break;
        case RLK_ADV_BATCH_STD: adv[i] = (s - m) / (batch_std + eps); break;
        default: adv[i] = NAN; break; /* modes the demo does not offer (--mode) */
      }
    }
  }
}

static void print_counters(const char *label, const rlk_context *ctx) {
  rlk_counters c;
  if (rlk_context_counters(ctx, &c) != RLK_OK) return;
  /* One machine-readable line: name=value pairs, cumulative since the context was made. */
  printf("counters %s: calls=%" PRIu64 " memory_hits=%" PRIu64 " disk_hits=%" PRIu64
         " misses=%" PRIu64 " compiles=%" PRIu64 " rebuilt=%" PRIu64
         " compile_seconds=%.3f load_seconds=%.3f\n",
         label, c.calls, c.memory_hits, c.disk_hits, c.misses, c.compiles, c.rebuilt,
         c.compile_seconds, c.load_seconds);
}

static void explain(int call, const rlk_counters *before, const rlk_counters *after,
                    double seconds) {
  uint64_t mem = after->memory_hits - before->memory_hits;
  uint64_t disk = after->disk_hits - before->disk_hits;
  uint64_t miss = after->misses - before->misses;
  uint64_t comp = after->compiles - before->compiles;
  uint64_t lookups = after->calls - before->calls;
  printf("call %d: %.3f s, %" PRIu64 " kernel lookup%s:", call, seconds, lookups,
         lookups == 1 ? "" : "s");
  const char *sep = " ";
  if (mem) {
    printf("%s%" PRIu64 " memory hit%s", sep, mem, mem == 1 ? "" : "s");
    sep = ", ";
  }
  if (disk) {
    printf("%s%" PRIu64 " disk hit%s", sep, disk, disk == 1 ? "" : "s");
    sep = ", ";
  }
  if (miss) {
    printf("%s%" PRIu64 " miss%s", sep, miss, miss == 1 ? "" : "es");
    sep = ", ";
  }
  if (comp)
    printf("%s%" PRIu64 " compile%s (%.3f s)", sep, comp, comp == 1 ? "" : "s",
           after->compile_seconds - before->compile_seconds);
  printf("\n");
}

static int tool_main(int argc, char **argv) {
  rlk_backend backend = RLK_BACKEND_AUTO;
  long prompts = 8, gsize = 4, tokens = 16;
  rlk_advantage_mode mode = RLK_ADV_GRPO;
  uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);

  static const struct option longopts[] = {
      {"backend", required_argument, NULL, 'b'}, {"prompts", required_argument, NULL, 'P'},
      {"group-size", required_argument, NULL, 'G'}, {"tokens", required_argument, NULL, 'T'},
      {"mode", required_argument, NULL, 'm'},    {"seed", required_argument, NULL, 's'},
      {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
  opterr = 0;
  for (int c; (c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1;) {
    const char *v = optarg;
    switch (c) {
      case 'b':
        if (parse_backend(v, &backend)) return usage_error("unknown backend '%s' (auto, cuda, hip, host)", v);
        break;
      case 'P':
        if (parse_int(v, 1, 1 << 16, &prompts)) return usage_error("bad --prompts '%s'", v);
        break;
      case 'G':
        if (parse_int(v, 2, 1 << 12, &gsize)) return usage_error("bad --group-size '%s' (>= 2)", v);
        break;
      case 'T':
        if (parse_int(v, 1, 1 << 16, &tokens)) return usage_error("bad --tokens '%s'", v);
        break;
      case 'm':
        if (!strcmp(v, "grpo")) mode = RLK_ADV_GRPO;
        else if (!strcmp(v, "mean-only") || !strcmp(v, "mean_only")) mode = RLK_ADV_MEAN_ONLY;
        else if (!strcmp(v, "rloo")) mode = RLK_ADV_RLOO;
        else if (!strcmp(v, "batch-std") || !strcmp(v, "batch_std")) mode = RLK_ADV_BATCH_STD;
        else return usage_error("unknown mode '%s' (grpo, mean-only, rloo, batch-std)", v);
        break;
      case 's': {
        char *end = NULL;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 0);
        if (errno || end == v || *end) return usage_error("bad --seed '%s'", v);
        seed = (uint64_t)x;
        break;
      }
      case 'h': usage(stdout); return 0;
      default: return getopt_error(c, argv);
    }
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
  const long batch = prompts * gsize;
  if ((long long)batch * tokens > (1ll << 28)) return usage_error("batch too large%s", "");

  const char *mode_name = mode == RLK_ADV_GRPO        ? "grpo"
                          : mode == RLK_ADV_MEAN_ONLY ? "mean-only"
                          : mode == RLK_ADV_RLOO      ? "rloo"
                                                      : "batch-std";
  printf("rlk %s demo: group advantages (%s), %ld prompts x group size %ld, %ld tokens, seed %" PRIu64
         "\n",
         rlk_version_string(), mode_name, prompts, gsize, tokens, seed);

  rlk_context_options opts;
  rlk_context_options_init(&opts);
  opts.backend = backend;
  rlk_context *ctx = NULL;
  rlk_status st = rlk_context_create(&ctx, &opts);
  if (st != RLK_OK) return lib_error("creating the context", st);

  int rc = 1;
  rlk_device_info info;
  memset(&info, 0, sizeof info);
  st = rlk_context_device_info(ctx, &info);
  if (st != RLK_OK) {
    rc = lib_error("reading the device info", st);
    rlk_context_destroy(ctx);
    return rc;
  }
  const char *cache = rlk_context_cache_dir(ctx);
  printf("backend:  %s\n", rlk_backend_name(rlk_context_backend(ctx)));
  printf("device:   %s\n", info.name);
  printf("target:   %s\n", info.target);
  printf("compiler: %s\n", info.compiler);
  printf("cache:    %s\n", *cache ? cache : "(in memory only: the cache root is not writable)");
  /* What the library reads too; shown so a user sees why a first call is a disk hit. */
  const char *ro = getenv("RLK_CACHE_RO_DIRS"), *jit = getenv("RLK_JIT");
  if (ro && *ro) printf("read-only cache trees (searched first): %s\n", ro);
  if (jit && !strcmp(jit, "0")) printf("RLK_JIT=0: a kernel missing from every cache is an error\n");

  /* Host-side data: scores ~ N-ish(0.5, 0.3) as rewards, a random prefix mask per row. */
  const size_t nb = (size_t)batch, nbt = (size_t)batch * (size_t)tokens;
  float *h_scores = malloc(nb * sizeof(float));
  float *h_adv = malloc(nb * sizeof(float));
  float *h_tok = malloc(nbt * sizeof(float));
  uint8_t *h_mask = malloc(nbt);
  double *ref = malloc(nb * sizeof(double));
  double *gmean = malloc(nb * sizeof(double));
  void *d_scores = NULL, *d_adv = NULL, *d_tok = NULL, *d_mask = NULL;
  if (!h_scores || !h_adv || !h_tok || !h_mask || !ref || !gmean) {
    fprintf(stderr, "%s: out of memory\n", prog);
    goto done;
  }
  uint64_t rs = seed;
  for (size_t i = 0; i < nb; i++) {
    h_scores[i] = (float)(rng_uniform(&rs) * 2.0 - 0.5);
    long len = 1 + (long)(rng_uniform(&rs) * (double)tokens); /* response length 1..T */
    if (len > tokens) len = tokens;
    for (long t = 0; t < tokens; t++) h_mask[i * (size_t)tokens + (size_t)t] = t < len;
  }

  if ((st = rlk_malloc(ctx, nb * sizeof(float), &d_scores)) != RLK_OK ||
      (st = rlk_malloc(ctx, nb * sizeof(float), &d_adv)) != RLK_OK ||
      (st = rlk_malloc(ctx, nbt * sizeof(float), &d_tok)) != RLK_OK ||
      (st = rlk_malloc(ctx, nbt, &d_mask)) != RLK_OK) {
    rc = lib_error("allocating device memory", st);
    goto done;
  }
  if ((st = rlk_memcpy_to_device(ctx, d_scores, h_scores, nb * sizeof(float))) != RLK_OK ||
      (st = rlk_memcpy_to_device(ctx, d_mask, h_mask, nbt)) != RLK_OK) {
    rc = lib_error("copying inputs to the device", st);
    goto done;
  }

  rlk_group_advantage_args args;
  rlk_group_advantage_args_init(&args);
  args.scores = rlk_tensor_1d(d_scores, RLK_F32, batch);
  args.group_size = gsize;
  args.mode = mode;
  args.advantages = rlk_tensor_1d(d_adv, RLK_F32, batch);
  args.mask = rlk_tensor_2d(d_mask, RLK_BOOL, batch, tokens, tokens);
  args.token_advantages = rlk_tensor_2d(d_tok, RLK_F32, batch, tokens, tokens);

  print_counters("before", ctx);
  for (int call = 1; call <= 2; call++) {
    rlk_counters before, after;
    rlk_context_counters(ctx, &before);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = rlk_group_advantage(ctx, &args, NULL);
    if (st == RLK_OK) st = rlk_stream_synchronize(ctx, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st != RLK_OK) {
      rc = lib_error("rlk_group_advantage", st);
      if (st == RLK_ERR_JIT_DISABLED)
        fprintf(stderr,
                "%s: precompile what this demo needs with\n"
                "  rlk-precompile --out DIR --targets %s --sweep \"group_advantage mode=%s "
                "group_size=%ld scores=f32 mask=bool broadcast=1\"\n"
                "and list DIR in RLK_CACHE_RO_DIRS (or use it as RLK_CACHE_DIR)\n",
                prog, rlk_context_backend(ctx) == RLK_BACKEND_HOST ? "host" : info.target,
                mode_name, gsize);
      print_counters("after failure", ctx);
      goto done;
    }
    rlk_context_counters(ctx, &after);
    explain(call, &before, &after,
            (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    char label[32];
    snprintf(label, sizeof label, "after call %d", call);
    print_counters(label, ctx);
  }

  memset(h_adv, 0xff, nb * sizeof(float)); /* NaN: a value the op did not write shows */
  memset(h_tok, 0xff, nbt * sizeof(float));
  if ((st = rlk_memcpy_to_host(ctx, h_adv, d_adv, nb * sizeof(float))) != RLK_OK ||
      (st = rlk_memcpy_to_host(ctx, h_tok, d_tok, nbt * sizeof(float))) != RLK_OK) {
    rc = lib_error("copying results to the host", st);
    goto done;
  }

  reference(h_scores, batch, gsize, mode, args.eps, args.unbiased, ref, gmean);
  double err = 0, tok_err = 0;
  for (size_t i = 0; i < nb; i++) {
    double e = fabs((double)h_adv[i] - ref[i]);
    if (!(e <= err)) err = isnan(e) ? INFINITY : e;
    for (long t = 0; t < tokens; t++) {
      size_t k = i * (size_t)tokens + (size_t)t;
      double want = h_mask[k] ? ref[i] : 0.0;
      double te = fabs((double)h_tok[k] - want);
      if (!(te <= tok_err)) tok_err = isnan(te) ? INFINITY : te;
    }
  }

  long show = batch < 3 * gsize ? batch : 3 * gsize;
  printf("\n%6s %6s %10s %10s %12s %12s %7s\n", "prompt", "member", "score", "group mean",
         "advantage", "reference", "tokens");
  for (long i = 0; i < show; i++) {
    long len = 0;
    for (long t = 0; t < tokens; t++) len += h_mask[(size_t)i * (size_t)tokens + (size_t)t];
    printf("%6ld %6ld %10.4f %10.4f %12.6f %12.6f %7ld\n", i / gsize, i % gsize, h_scores[i],
           gmean[i], h_adv[i], ref[i], len);
  }
  if (show < batch) printf("%6s (%ld more rows)\n", "...", batch - show);
  printf("\nmax abs error: advantages %.3g, token advantages %.3g (tolerance %.0e)\n", err,
         tok_err, TOLERANCE);
  if (err > TOLERANCE || tok_err > TOLERANCE) {
    fprintf(stderr, "%s: the results differ from the reference by more than %.0e\n", prog,
            TOLERANCE);
    rc = 1;
  } else {
    printf("ok\n");
    rc = 0;
  }

done:
  rlk_free(ctx, d_scores);
  rlk_free(ctx, d_adv);
  rlk_free(ctx, d_tok);
  rlk_free(ctx, d_mask);
  free(h_scores);
  free(h_adv);
  free(h_tok);
  free(h_mask);
  free(ref);
  free(gmean);
  rlk_context_destroy(ctx);
  return rc;
}

int main(int argc, char **argv) { return tool_exit(tool_main(argc, argv)); }
