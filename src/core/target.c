/* target.c - compile targets: the one table of target names (which spellings are whose, and what
 * each CUDA arch has), the one parser, the one function that spells a target, and the one reader
 * of RLK_ARCH. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "core/core.h"
#include "core/target.h"

/* CUDA architectures by compute capability x 10: which forms exist besides sm_<cc> ("a": code
 * for this exact major.minor, "f": for its family), whether a device of that arch compiles for
 * the "a" form (TMA and wgmma on 9.0, tcgen05 on 10.x; code that runs only on that exact
 * major.minor, which is what a JIT wants), whether the arch has tcgen05 (through its "a" and
 * "f" forms), and the shared memory limits (per block with opt-in, per SM) of the CUDA
 * programming guide. sm_101 is sm_110 from CUDA 13 on. */
typedef struct cuda_arch_row {
  int sm;
  int has_a, has_f, device_uses_a, tcgen05;
  unsigned smem_block_kib, smem_sm_kib;
} cuda_arch_row;

static const cuda_arch_row cuda_archs[] = {
    {70, 0, 0, 0, 0, 96, 96},     {72, 0, 0, 0, 0, 96, 96},     {75, 0, 0, 0, 0, 64, 64},
    {80, 0, 0, 0, 0, 163, 164},   {86, 0, 0, 0, 0, 99, 100},    {87, 0, 0, 0, 0, 163, 164},
    {88, 0, 0, 0, 0, 99, 100},    {89, 0, 0, 0, 0, 99, 100},    {90, 1, 0, 1, 0, 227, 228},
    {100, 1, 1, 1, 1, 227, 228},  {101, 1, 1, 1, 1, 227, 228},  {103, 1, 1, 1, 1, 227, 228},
    {110, 1, 1, 0, 1, 227, 228},  {120, 1, 1, 0, 0, 99, 100},   {121, 1, 1, 0, 0, 99, 100},
};
#define N_CUDA_ARCHS (sizeof cuda_archs / sizeof cuda_archs[0])

static const cuda_arch_row *cuda_arch(int sm) {
  for (size_t i = 0; i < N_CUDA_ARCHS; i++)
    if (cuda_archs[i].sm == sm) return &cuda_archs[i];
  return NULL;
}

static int row_has_variant(const cuda_arch_row *r, char variant) {
  return variant == 0 || (variant == 'a' && r->has_a) || (variant == 'f' && r->has_f);
}

/* The backends by the names of their targets: the prefixes below and "host". */
const char *rlk_backend_name(rlk_backend b) {
  switch (b) {
    case RLK_BACKEND_AUTO: return "auto";
    case RLK_BACKEND_CUDA: return "cuda";
    case RLK_BACKEND_HIP: return "hip";
    case RLK_BACKEND_HOST: return "host";
  }
  return "unknown";
}

rlk_backend rlk_target_backend(const char *target) {
  rlk_target t;
  return rlk_target_parse(target, &t) == RLK_OK ? t.kind : RLK_BACKEND_AUTO;
}

int rlk_target_cuda_has_variant(int sm, char variant) {
  const cuda_arch_row *r = cuda_arch(sm);
  return r && row_has_variant(r, variant);
}

int rlk_target_cuda_sm(const rlk_target *t) {
  return t && t->kind == RLK_BACKEND_CUDA ? t->major * 10 + t->minor : 0;
}

int rlk_target_name(const rlk_target *t, char *buf, size_t size) {
  switch (t->kind) {
    case RLK_BACKEND_CUDA:
      return rlk_format(buf, size, "%s%d%s", t->ptx ? "compute_" : "sm_", t->major * 10 + t->minor,
                        t->variant ? (char[]){t->variant, 0} : "");
    case RLK_BACKEND_HIP: return rlk_format(buf, size, "gfx%d%x%x", t->major, t->minor, t->stepping);
    case RLK_BACKEND_HOST: return rlk_format(buf, size, "host-%s", t->machine);
    default: return rlk_format(buf, size, "?");
  }
}

/* The derived fields of a CUDA target from major, minor, variant and ptx, and its name. */
static void cuda_fill(rlk_target *t) {
  const int sm = t->major * 10 + t->minor;
  const cuda_arch_row *r = cuda_arch(sm);
  t->kind = RLK_BACKEND_CUDA;
  t->warp_size = 32;
  t->features = 0;
  if (t->major >= 9) t->features |= RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA;
  if (sm == 90 && t->variant == 'a') t->features |= RLK_TARGET_WGMMA;
  if (r && r->tcgen05 && t->variant) t->features |= RLK_TARGET_TCGEN05;
  /* an arch newer than the table: the newest row's limits; older: the 48 KiB every arch has */
  const cuda_arch_row *last = &cuda_archs[N_CUDA_ARCHS - 1];
  if (!r && sm > last->sm) r = last;
  t->smem_per_block = r ? (size_t)r->smem_block_kib * 1024 : 48 * 1024;
  t->smem_per_sm = r ? (size_t)r->smem_sm_kib * 1024 : 48 * 1024;
  rlk_target_name(t, t->name, sizeof t->name);
}

void rlk_target_for_cuda_device(int major, int minor, int multiprocessors, size_t smem_per_block,
                                size_t smem_per_sm, rlk_target *out) {
  memset(out, 0, sizeof *out);
  const cuda_arch_row *r = cuda_arch(major * 10 + minor);
  out->major = major;
  out->minor = minor;
  out->variant = r && r->device_uses_a ? 'a' : 0;
  cuda_fill(out);
  out->multiprocessors = multiprocessors;
  if (smem_per_block) out->smem_per_block = smem_per_block;
  if (smem_per_sm) out->smem_per_sm = smem_per_sm;
}

/* A positive decimal without a leading zero at s (at most 6 digits); the end in *end. -1 if none. */
static int parse_decimal(const char *s, const char **end) {
  int v = 0, n = 0;
  *end = s;
  if (*s == '0') return -1;
  while (*s >= '0' && *s <= '9' && n < 6) v = v * 10 + (*s++ - '0'), n++;
  *end = s;
  return n ? v : -1;
}

static int hex_digit(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static rlk_status parse_cuda(const char *text, rlk_target *out) {
  out->ptx = text[0] == 'c';
  const char *end;
  const int cc = parse_decimal(text + (out->ptx ? 8 : 3), &end);
  if (cc >= 10 && (*end == 'a' || *end == 'f') && !end[1]) out->variant = *end++;
  if (cc < 10 || *end)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s' is not %s<cc>[a|f]", text, out->ptx ? "compute_" : "sm_");
  const cuda_arch_row *r = cuda_arch(cc);
  if (r && !row_has_variant(r, out->variant))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s': compute capability %d.%d has no %s form", text,
                     cc / 10, cc % 10, out->variant == 'a' ? "arch-specific (\"a\")" : "family (\"f\")");
  out->major = cc / 10;
  out->minor = cc % 10;
  cuda_fill(out);
  return RLK_OK;
}

/* gfx<major><minor><stepping>[:feature]...: gfx90a is 9, 0, 0xa; gfx1100 is 11, 0, 0. The
 * features a device reports (sramecc, xnack; + or -) do not change the code: dropped. */
static rlk_status parse_gfx(const char *text, rlk_target *out) {
  const size_t n = strcspn(text, ":");
  for (const char *f = text + n; *f;) {
    const size_t k = strcspn(f + 1, ":");
    const int ok = (k == 8 && !strncmp(f + 1, "sramecc", 7)) || (k == 6 && !strncmp(f + 1, "xnack", 5));
    if (!ok || (f[k] != '+' && f[k] != '-'))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s': '%.*s' is not a feature (sramecc+/-, xnack+/-)", text,
                       (int)k, f + 1);
    f += 1 + k;
  }
  if (n < 6 || n > 8) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s' is not gfx<id>", text);
  char major[8] = "";
  memcpy(major, text + 3, n - 5);
  const char *end;
  out->major = parse_decimal(major, &end);
  out->minor = hex_digit(text[n - 2]);
  out->stepping = hex_digit(text[n - 1]);
  if (out->major < 0 || *end || out->minor < 0 || out->stepping < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s' is not gfx<id>", text);
  out->kind = RLK_BACKEND_HIP;
  out->warp_size = 64;
  out->smem_per_block = out->smem_per_sm = 64 * 1024; /* LDS a workgroup may use */
  rlk_target_name(out, out->name, sizeof out->name);
  return RLK_OK;
}

static rlk_status parse_host(const char *text, rlk_target *out) {
  const char *m = text + 5;
  const size_t n = strlen(m);
  if (!n || n >= sizeof out->machine || strspn(m, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != n)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s' is not host-<machine>", text);
  memcpy(out->machine, m, n + 1);
  out->kind = RLK_BACKEND_HOST;
  out->warp_size = 32;
  rlk_target_name(out, out->name, sizeof out->name);
  return RLK_OK;
}

rlk_status rlk_target_parse(const char *text, rlk_target *out) {
  memset(out, 0, sizeof *out);
  if (!text || !*text) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target: empty");
  if (strlen(text) >= 64) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%.64s...' is too long", text);
  rlk_status st;
  if (!strcmp(text, "host"))
    st = parse_host(rlk_host_target(), out); /* the documented alias */
  else if (!strncmp(text, "sm_", 3) || !strncmp(text, "compute_", 8))
    st = parse_cuda(text, out);
  else if (!strncmp(text, "gfx", 3))
    st = parse_gfx(text, out);
  else if (!strncmp(text, "host-", 5))
    st = parse_host(text, out);
  else
    st = rlk_error(RLK_ERR_INVALID_ARGUMENT,
                   "target '%s' is not sm_<cc>[a|f], compute_<cc>[a|f], gfx<id>, host-<machine> or host", text);
  if (st) memset(out, 0, sizeof *out);
  return st;
}

void rlk_target_features_text(unsigned features, char *buf, size_t size) {
  static const struct {
    unsigned bit;
    const char *name;
  } names[] = {{RLK_TARGET_CLUSTERS, "clusters"},
               {RLK_TARGET_PDL, "pdl"},
               {RLK_TARGET_TMA, "tma"},
               {RLK_TARGET_WGMMA, "wgmma"},
               {RLK_TARGET_TCGEN05, "tcgen05"}};
  size_t len = 0;
  if (size) buf[0] = '\0';
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (!(features & names[i].bit)) continue;
    int w = rlk_format(buf + len, size - len, "%s%s", len ? " " : "", names[i].name);
    if (w < 0) return;
    len += (size_t)w;
  }
}

const char *rlk_target_env(void) { return rlk_env("RLK_ARCH"); }

rlk_status rlk_target_apply_env(rlk_backend kind, rlk_target *t) {
  const char *arch = rlk_target_env();
  if (!arch || kind == RLK_BACKEND_HOST) return RLK_OK;
  rlk_target o;
  rlk_status st = rlk_target_parse(arch, &o);
  if (st == RLK_OK && o.kind != kind) {
    rlk_warn("%s: RLK_ARCH=%s is not a %s target; using %s", rlk_backend_name(kind), arch,
             kind == RLK_BACKEND_CUDA ? "CUDA" : "AMD GPU", t->name[0] ? t->name : "the device's");
    return RLK_OK;
  }
  if (st) return rlk_error_wrap(st, "RLK_ARCH");
  rlk_info("%s: RLK_ARCH=%s overrides the device target %s", rlk_backend_name(kind), o.name,
           t->name[0] ? t->name : "(unknown)");
  /* the device's own counts and limits stay: they describe the hardware that runs the code */
  o.multiprocessors = t->multiprocessors;
  memcpy(o.cluster_sms, t->cluster_sms, sizeof o.cluster_sms);
  if (t->smem_per_block) o.smem_per_block = t->smem_per_block;
  if (t->smem_per_sm) o.smem_per_sm = t->smem_per_sm;
  *t = o;
  return RLK_OK;
}

static pthread_once_t host_target_once = PTHREAD_ONCE_INIT;
static char host_target[80];

static void host_target_init(void) {
  struct utsname u;
  if (uname(&u) == 0 && u.machine[0])
    rlk_format(host_target, sizeof host_target, "host-%s", u.machine);
  else
    rlk_format(host_target, sizeof host_target, "host-unknown");
}

const char *rlk_host_target(void) {
  pthread_once(&host_target_once, host_target_init);
  return host_target;
}
