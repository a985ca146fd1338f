/* test_api.c - the public API's plumbing: statuses, errors, versions, descriptors, contexts,
 * memory and events on the host backend, and bad calls that must fail cleanly. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rlk.h"
#include "suites.h"
#include "test_util.h"

START_TEST(status_strings_and_versions) {
  for (int s = RLK_OK; s <= RLK_ERR_INTERNAL; s++) {
    const char *str = rlk_status_string((rlk_status)s);
    ck_assert_ptr_nonnull(str);
    ck_assert_str_ne(str, "unknown status");
  }
  ck_assert_str_eq(rlk_status_string((rlk_status)999), "unknown status");
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", RLK_VERSION_MAJOR, RLK_VERSION_MINOR, RLK_VERSION_PATCH);
  ck_assert_str_eq(rlk_version_string(), v);
  ck_assert_int_eq(rlk_version(), RLK_VERSION_MAJOR * 10000 + RLK_VERSION_MINOR * 100 + RLK_VERSION_PATCH);
}
END_TEST

START_TEST(descriptors_and_dtypes) {
  float x[6];
  rlk_tensor t = rlk_tensor_2d(x, RLK_F32, 2, 3, 3);
  ck_assert_int_eq(t.ndim, 2);
  ck_assert_int_eq(t.shape[1], 3);
  ck_assert_int_eq(t.strides[0], 3);
  ck_assert_int_eq(t.strides[1], 1);
  ck_assert_uint_eq(rlk_dtype_size(RLK_BF16), 2);
  ck_assert_uint_eq(rlk_dtype_size(RLK_I64), 8);
  ck_assert_uint_eq(rlk_dtype_size(RLK_DTYPE_INVALID), 0);
  ck_assert_str_eq(rlk_dtype_name(RLK_BF16), "bf16");
  ck_assert_str_eq(rlk_backend_name(RLK_BACKEND_HOST), "host");
}
END_TEST

START_TEST(bad_context_options) {
  rlk_context *ctx = (rlk_context *)0x1;
  ck_assert_int_eq(rlk_context_create(NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = (rlk_backend)42;
  ck_assert_int_eq(rlk_context_create(&ctx, &o), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(ctx);
  ck_assert_ptr_nonnull(strstr(rlk_last_error(), "backend"));
  rlk_context_options_init(&o);
  o.device = -1;
  ck_assert_int_eq(rlk_context_create(&ctx, &o), RLK_ERR_INVALID_ARGUMENT);
  /* the CPU is device 0 alone */
  o.device = 1;
  o.backend = RLK_BACKEND_HOST;
  rlk_test_expect_error(rlk_context_create(&ctx, &o), RLK_ERR_INVALID_ARGUMENT, "one device", "rlk_context_create");
  ck_assert_ptr_null(ctx);
  /* a compile-only CUDA context needs a target */
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_CUDA;
  o.compile_only = 1;
  rlk_test_expect_error(rlk_context_create(&ctx, &o), RLK_ERR_INVALID_ARGUMENT, "target", "rlk_context_create");
  /* the host backend compiles only for the host */
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_HOST;
  o.target = "sm_90a";
  ck_assert_int_eq(rlk_context_create(&ctx, &o), RLK_ERR_UNSUPPORTED);
  rlk_context_destroy(NULL);
}
END_TEST

START_TEST(host_context_basics) {
  rlk_context *ctx = rlk_test_host_context();
  ck_assert_int_eq(rlk_context_backend(ctx), RLK_BACKEND_HOST);
  rlk_device_info info;
  ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
  ck_assert_int_gt(info.multiprocessors, 0);
  ck_assert_ptr_nonnull(strstr(info.target, "host-"));
  ck_assert_ptr_nonnull(strstr(info.compiler, "clang"));
  ck_assert_ptr_nonnull(strstr(rlk_context_supported_targets(ctx), info.target));
  ck_assert_int_eq(rlk_context_device_info(ctx, NULL), RLK_ERR_INVALID_ARGUMENT);

  void *p = NULL;
  ck_assert_int_eq(rlk_malloc(ctx, 0, &p), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_malloc(ctx, 64, &p), RLK_OK);
  ck_assert_int_eq(rlk_memset(ctx, p, 0xab, 64), RLK_OK);
  unsigned char back[64];
  ck_assert_int_eq(rlk_memcpy_to_host(ctx, back, p, 64), RLK_OK);
  ck_assert_int_eq(back[63], 0xab);
  ck_assert_int_eq(rlk_memcpy_to_device(ctx, NULL, back, 64), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_stream_synchronize(ctx, NULL), RLK_OK);
  ck_assert_int_eq(rlk_free(ctx, p), RLK_OK);
  ck_assert_int_eq(rlk_free(ctx, NULL), RLK_OK);

  rlk_event *a = NULL, *b = NULL;
  ck_assert_int_eq(rlk_event_create(ctx, &a), RLK_OK);
  ck_assert_int_eq(rlk_event_create(ctx, &b), RLK_OK);
  ck_assert_int_eq(rlk_event_record(a, NULL), RLK_OK);
  ck_assert_int_eq(rlk_event_record(b, NULL), RLK_OK);
  float ms = -1;
  ck_assert_int_eq(rlk_event_elapsed_ms(a, b, &ms), RLK_OK);
  ck_assert(ms >= 0);
  rlk_event_destroy(a);
  rlk_event_destroy(b);

  rlk_counters c;
  ck_assert_int_eq(rlk_context_counters(ctx, &c), RLK_OK);
  rlk_context_reset_counters(ctx);
  ck_assert_int_eq(rlk_context_counters(ctx, &c), RLK_OK);
  ck_assert_uint_eq(c.calls, 0);
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(precompile_rejects_bad_lines) {
  rlk_context *ctx = rlk_test_host_context();
  ck_assert_int_eq(rlk_precompile(NULL, "group_advantage", NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_precompile(ctx, NULL, NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(rlk_precompile(ctx, "", NULL), RLK_ERR_INVALID_ARGUMENT);
  rlk_test_expect_error(rlk_precompile(ctx, "no_such_op a=1", NULL), RLK_ERR_INVALID_ARGUMENT, "no_such_op",
                        "rlk_precompile");
  ck_assert_int_eq(rlk_precompile(ctx, "group_advantage bogus", NULL), RLK_ERR_INVALID_ARGUMENT);
  rlk_test_expect_error(rlk_precompile(ctx, "group_advantage nope=1", NULL), RLK_ERR_INVALID_ARGUMENT, "nope",
                        "rlk_precompile");
  ck_assert_int_eq(rlk_precompile(ctx, "group_advantage group_size=4 group_size=8", NULL), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(rlk_precompile_ops(), "group_advantage"));
  ck_assert_str_ne(rlk_precompile_help("group_advantage"), "");
  ck_assert_str_eq(rlk_precompile_help("nope"), "");
  rlk_context_destroy(ctx);
}
END_TEST

START_TEST(rlk_arch_overrides_only_device_targets) {
  setenv("RLK_ARCH", "sm_80", 1);
  /* the host backend ignores a device target override */
  rlk_context *ctx = rlk_test_host_context();
  rlk_context_destroy(ctx);
  /* a compile-only context without a target takes RLK_ARCH */
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = RLK_BACKEND_CUDA;
  o.compile_only = 1;
  rlk_status st = rlk_context_create(&ctx, &o);
  if (st == RLK_ERR_UNAVAILABLE) {
    printf("skip (api: RLK_ARCH compile-only): no NVRTC here: %s\n", rlk_last_error());
  } else {
    ck_assert_msg(st == RLK_OK, "%s", rlk_last_error());
    rlk_device_info info;
    ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
    ck_assert_str_eq(info.target, "sm_80");
    rlk_context_destroy(ctx);
    /* RLK_ARCH alone names the backend of a compile-only context left at AUTO */
    setenv("RLK_ARCH", "compute_90", 1);
    o.backend = RLK_BACKEND_AUTO;
    ck_assert_msg(rlk_context_create(&ctx, &o) == RLK_OK, "%s", rlk_last_error());
    ck_assert_int_eq(rlk_context_backend(ctx), RLK_BACKEND_CUDA);
    ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
    ck_assert_str_eq(info.target, "compute_90");
    rlk_context_destroy(ctx);
  }
  unsetenv("RLK_ARCH");
}
END_TEST

/* A compile-only context for `target` on `backend`. */
static rlk_status compile_only_context(rlk_backend backend, const char *target, rlk_context **ctx) {
  rlk_context_options o;
  rlk_context_options_init(&o);
  o.backend = backend;
  o.compile_only = 1;
  o.target = target;
  *ctx = NULL;
  return rlk_context_create(ctx, &o);
}

/* A compile-only context's target names its backend, in every documented spelling; the name it
 * reports is the canonical one, and every target keys its kernels apart from every other. */
START_TEST(compile_only_targets_route_by_name) {
  static const char *const cuda[] = {"sm_80",   "sm_90",   "sm_90a",  "compute_90", "compute_90a",
                                     "sm_100a", "sm_100f", "sm_103a", "sm_120a",    "sm_121a"};
  enum { N = sizeof cuda / sizeof cuda[0] };
  char keys[N][80];
  for (size_t i = 0; i < N; i++) {
    rlk_context *ctx = NULL;
    rlk_status st = compile_only_context(RLK_BACKEND_AUTO, cuda[i], &ctx);
    if (st == RLK_ERR_UNAVAILABLE) {
      /* no NVRTC: the message is NVRTC's, never the host backend's */
      ck_assert_msg(strstr(rlk_last_error(), "nvrtc") != NULL, "%s: %s", cuda[i], rlk_last_error());
      printf("skip (api: %s compile-only): %s\n", cuda[i], rlk_last_error());
      fflush(stdout);
      keys[i][0] = '\0';
      continue;
    }
    ck_assert_msg(st == RLK_OK, "%s: %s", cuda[i], rlk_last_error());
    ck_assert_int_eq(rlk_context_backend(ctx), RLK_BACKEND_CUDA);
    rlk_device_info info;
    ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
    ck_assert_str_eq(info.target, cuda[i]);
    int n = 0;
    ck_assert_msg(rlk_precompile_keys(ctx, "token_kl", keys[i], sizeof keys[i], &n) == RLK_OK, "%s: %s", cuda[i],
                  rlk_last_error());
    ck_assert_int_eq(n, 1);
    for (size_t j = 0; j < i; j++) ck_assert_msg(strcmp(keys[i], keys[j]) != 0, "%s and %s share a key", cuda[i], cuda[j]);
    rlk_context_destroy(ctx);
  }
  /* the AMD and host spellings route to their backends (hiprtc may be missing: then it says so) */
  static const struct {
    const char *target, *canonical, *compiler;
    rlk_backend backend;
  } others[] = {{"gfx90a:sramecc+:xnack-", "gfx90a", "hiprtc", RLK_BACKEND_HIP},
                {"host", NULL, "clang", RLK_BACKEND_HOST}};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    rlk_context *ctx = NULL;
    rlk_status st = compile_only_context(RLK_BACKEND_AUTO, others[i].target, &ctx);
    if (st == RLK_ERR_UNAVAILABLE) {
      ck_assert_msg(strstr(rlk_last_error(), others[i].compiler) != NULL, "%s: %s", others[i].target, rlk_last_error());
      printf("skip (api: %s compile-only): %s\n", others[i].target, rlk_last_error());
      fflush(stdout);
      continue;
    }
    ck_assert_msg(st == RLK_OK, "%s: %s", others[i].target, rlk_last_error());
    ck_assert_int_eq(rlk_context_backend(ctx), others[i].backend);
    rlk_device_info info;
    ck_assert_int_eq(rlk_context_device_info(ctx, &info), RLK_OK);
    if (others[i].canonical) ck_assert_str_eq(info.target, others[i].canonical);
    rlk_context_destroy(ctx);
  }
  /* a target of another backend than the one asked for, and a name of none, say so */
  rlk_context *ctx = NULL;
  ck_assert_int_eq(compile_only_context(RLK_BACKEND_CUDA, "gfx90a", &ctx), RLK_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(rlk_last_error(), "gfx90a is a hip target") != NULL, "%s", rlk_last_error());
  ck_assert_int_eq(compile_only_context(RLK_BACKEND_AUTO, "compute_9x", &ctx), RLK_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(rlk_last_error(), "options.target") && strstr(rlk_last_error(), "compute_9x"), "%s",
                rlk_last_error());
}
END_TEST

/* Descriptors that reach past their buffers, or whose byte span cannot be addressed, are
 * refused before anything runs (heap buffers of exactly the described size, so a kernel that
 * ran anyway would show under AddressSanitizer). */
START_TEST(descriptors_out_of_bounds_are_refused) {
  rlk_context *ctx = rlk_test_host_context();
  enum { T = 64 };
  float *x = malloc(T * sizeof *x), *out = malloc(T * sizeof *out);
  unsigned char *mask_short = malloc(T / 2);
  float *out_short = malloc(T / 2 * sizeof *out_short);
  ck_assert(x && out && mask_short && out_short);
  for (int i = 0; i < T; i++) x[i] = (float)i * 0.25f - 3.0f;
  rlk_masked_whiten_args w;
  rlk_masked_whiten_args_init(&w);
  w.x = rlk_tensor_1d(x, RLK_F32, T);
  w.mask = rlk_tensor_1d(mask_short, RLK_BOOL, T / 2); /* shorter than x */
  w.out = rlk_tensor_1d(out, RLK_F32, T);
  rlk_test_expect_error(rlk_masked_whiten(ctx, &w, NULL), RLK_ERR_INVALID_ARGUMENT, "mask", "rlk_masked_whiten");
  w.mask = rlk_tensor_1d(NULL, RLK_BOOL, 0);
  w.out = rlk_tensor_1d(out_short, RLK_F32, T / 2); /* shorter than x */
  rlk_test_expect_error(rlk_masked_whiten(ctx, &w, NULL), RLK_ERR_INVALID_ARGUMENT, "out", "rlk_masked_whiten");
  w.out = rlk_tensor_1d(out, RLK_F32, T + 1); /* longer */
  ck_assert_int_eq(rlk_masked_whiten(ctx, &w, NULL), RLK_ERR_INVALID_ARGUMENT);

  /* stride x extent past 2^63 (and past any address space) in every position */
  static const int64_t strides[] = {(int64_t)1 << 62, INT64_MAX / 3, (int64_t)1 << 57};
  for (size_t i = 0; i < sizeof strides / sizeof strides[0]; i++) {
    rlk_gae_args g;
    rlk_gae_args_init(&g);
    g.rewards = rlk_tensor_2d(x, RLK_F32, 2, T / 2, T / 2);
    g.values = rlk_tensor_2d(x, RLK_F32, 2, T / 2, T / 2);
    g.advantages = rlk_tensor_2d(out, RLK_F32, 2, T / 2, T / 2);
    g.values.strides[0] = strides[i];
    rlk_test_expect_error(rlk_gae(ctx, &g, NULL), RLK_ERR_INVALID_ARGUMENT, "values", "rlk_gae");
    g.values.strides[0] = T / 2;
    g.advantages.shape[0] = (int64_t)1 << 40;
    g.advantages.strides[0] = (int64_t)1 << 40;
    ck_assert_int_eq(rlk_gae(ctx, &g, NULL), RLK_ERR_INVALID_ARGUMENT);
  }
  rlk_tensor big = rlk_tensor_2d(x, RLK_F32, (int64_t)1 << 40, (int64_t)1 << 40, (int64_t)1 << 40);
  rlk_masked_whiten_args_init(&w);
  w.x = big;
  w.out = big;
  ck_assert_int_eq(rlk_masked_whiten(ctx, &w, NULL), RLK_ERR_INVALID_ARGUMENT);
  free(x);
  free(out);
  free(mask_short);
  free(out_short);
  rlk_context_destroy(ctx);
}
END_TEST

/* A workspace count past the end of the address space (SIZE_MAX: "plenty") still covers the
 * bytes the call writes there: an output inside the workspace is refused, whatever the count. */
START_TEST(workspace_count_past_memory_still_overlaps) {
  rlk_context *ctx = rlk_test_host_context();
  enum { B = 4, T = 3 };
  double r[B * T];
  for (int i = 0; i < B * T; i++) r[i] = i;
  _Alignas(16) double ws[2 * B];
  rlk_group_advantage_args a;
  rlk_group_advantage_args_init(&a);
  a.scores = rlk_tensor_2d(r, RLK_F64, B, T, T); /* f64 rows: their sums in the workspace */
  a.group_size = 2;
  a.advantages = rlk_tensor_1d(ws, RLK_F32, B);
  a.workspace = ws;
  const size_t counts[] = {sizeof ws, SIZE_MAX, SIZE_MAX / 2 + 2, SIZE_MAX - (uintptr_t)ws + 1};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    a.workspace_bytes = counts[i];
    rlk_test_expect_error(rlk_group_advantage(ctx, &a, NULL), RLK_ERR_INVALID_ARGUMENT, "workspace",
                          "rlk_group_advantage");
  }
  rlk_context_destroy(ctx);
}
END_TEST

/* Log callbacks swapped while threads log: every message reaches a callback with its own user
 * argument (a callback set with one argument never sees another's). */
enum { LOG_THREADS = 3, LOG_SWAPS = 20000 };
static atomic_int log_mismatch, log_stop;
static void log_a(rlk_log_level l, const char *m, void *u) { (void)l, (void)m, log_mismatch += u != (void *)&log_a; }
static void log_b(rlk_log_level l, const char *m, void *u) { (void)l, (void)m, log_mismatch += u != (void *)&log_b; }
static void log_c(rlk_log_level l, const char *m, void *u) { (void)l, (void)m, log_mismatch += u != (void *)&log_c; }
static void *log_spam(void *arg) {
  (void)arg;
  while (!atomic_load(&log_stop)) rlk_log(RLK_LOG_INFO, "x");
  return NULL;
}

START_TEST(log_callbacks_keep_their_argument) {
  pthread_t t[LOG_THREADS];
  rlk_log_callback cbs[3] = {log_a, log_b, log_c};
  rlk_set_log_callback(log_a, RLK_LOG_INFO, (void *)&log_a);
  for (int i = 0; i < LOG_THREADS; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, log_spam, NULL), 0);
  for (int i = 0; i < LOG_SWAPS; i++) rlk_set_log_callback(cbs[i % 3], RLK_LOG_INFO, (void *)cbs[i % 3]);
  atomic_store(&log_stop, 1);
  for (int i = 0; i < LOG_THREADS; i++) pthread_join(t[i], NULL);
  rlk_set_log_callback(NULL, RLK_LOG_WARN, NULL);
  const int bad = atomic_load(&log_mismatch);
  ck_assert_msg(bad == 0, "%d messages reached a callback with another's argument", bad);
}
END_TEST

/* Error messages are UTF-8 whatever a length limit cut: a character cut short, or a byte of no
 * character, reads as '?', and whole characters stay as they are. */
START_TEST(error_messages_are_utf8) {
  /* "%.4s" cuts the second e-acute (c3 a9) after its first byte */
  rlk_error(RLK_ERR_INVALID_ARGUMENT, "[%.4s] and [%s]", "a\xc3\xa9\xc3\xa9", "b\xff\xc3\xa9");
  ck_assert_str_eq(rlk_last_error(), "[a\xc3\xa9?] and [b?\xc3\xa9]");
  /* the same through a wrap, and a message cut at the cap inside a character */
  char big[9000];
  memset(big, 'x', sizeof big);
  memcpy(big + 8189, "\xe2\x82\xac", 3); /* the euro sign across the 8191-byte cut */
  big[sizeof big - 1] = '\0';
  rlk_error(RLK_ERR_IO, "%s", big);
  const char *m = rlk_last_error();
  const size_t n = strlen(m);
  ck_assert_uint_eq(n, 8191);
  ck_assert_msg(m[n - 2] == '?' && m[n - 1] == '?', "the cut sequence's bytes: %02x %02x", (unsigned char)m[n - 2],
                (unsigned char)m[n - 1]);
  rlk_error(RLK_ERR_IO, "inner \xc3");
  rlk_error_wrap(RLK_ERR_IO, "outer \xe2\x82");
  ck_assert_str_eq(rlk_last_error(), "outer ??: inner ?");
}
END_TEST

Suite *api_suite(void) {
  Suite *s = suite_create("api");
  rlk_test_add_case(s, "api", 60, TESTS(status_strings_and_versions, descriptors_and_dtypes,
      bad_context_options, host_context_basics, precompile_rejects_bad_lines,
      rlk_arch_overrides_only_device_targets, compile_only_targets_route_by_name,
      descriptors_out_of_bounds_are_refused, workspace_count_past_memory_still_overlaps,
      log_callbacks_keep_their_argument, error_messages_are_utf8));
  return s;
}
