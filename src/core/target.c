/* target.c - compile targets: the one parser, the one CUDA arch table and the one reader of
 * RLK_ARCH. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "core/core.h"
#include "core/target.h"

/* CUDA architectures by compute capability x 10: whether an arch-specific ("a") variant exists
 * (a compiler lists it), whether a device of that arch compiles for it (TMA and wgmma on 9.0,
 * tcgen05 on 10.x; code that runs only on that exact major.minor, which is what a JIT wants),
 * and the shared memory limits (per block with opt-in, per SM) of the CUDA programming guide. */
typedef struct cuda_arch_row {
  int sm;
  int has_a, device_uses_a;
  unsigned smem_block_kib, smem_sm_kib;
} cuda_arch_row;

static const cuda_arch_row cuda_archs[] = {
    {70, 0, 0, 96, 96},    {72, 0, 0, 96, 96},    {75, 0, 0, 64, 64},    {80, 0, 0, 163, 164},
    {86, 0, 0, 99, 100},   {87, 0, 0, 163, 164},  {89, 0, 0, 99, 100},   {90, 1, 1, 227, 228},
    {100, 1, 1, 227, 228}, {101, 1, 1, 227, 228}, {103, 1, 1, 227, 228}, {110, 1, 0, 227, 228},
    {120, 1, 0, 99, 100},  {121, 1, 0, 99, 100},
};

static const cuda_arch_row *cuda_arch(int sm) {
  for (size_t i = 0; i < sizeof cuda_archs / sizeof cuda_archs[0]; i++)
    if (cuda_archs[i].sm == sm) return &cuda_archs[i];
  return NULL;
}

const char *rlk_backend_name(rlk_backend b) {
  switch (b) {
    case RLK_BACKEND_AUTO: return "auto";
    case RLK_BACKEND_CUDA: return "cuda";
    case RLK_BACKEND_HIP: return "hip";
    case RLK_BACKEND_HOST: return "host";
  }
  return "unknown";
}

int rlk_target_cuda_has_arch_specific(int sm) {
  const cuda_arch_row *r = cuda_arch(sm);
  return r && r->has_a;
}

int rlk_target_cuda_sm(const rlk_target *t) {
  return t && t->kind == RLK_BACKEND_CUDA ? t->major * 10 + t->minor : 0;
}

/* The derived fields of a CUDA target from major, minor and arch_specific. */
static void cuda_fill(rlk_target *t) {
  const int sm = t->major * 10 + t->minor;
  const cuda_arch_row *r = cuda_arch(sm);
  t->kind = RLK_BACKEND_CUDA;
  t->warp_size = 32;
  t->features = 0;
  if (t->major >= 9) t->features |= RLK_TARGET_CLUSTERS | RLK_TARGET_PDL | RLK_TARGET_TMA;
  if (sm == 90 && t->arch_specific) t->features |= RLK_TARGET_WGMMA;
  /* an arch newer than the table: the newest row's limits; older: the 48 KiB every arch has */
  const cuda_arch_row *last = &cuda_archs[sizeof cuda_archs / sizeof cuda_archs[0] - 1];
  if (!r && sm > last->sm) r = last;
  t->smem_per_block = r ? (size_t)r->smem_block_kib * 1024 : 48 * 1024;
  t->smem_per_sm = r ? (size_t)r->smem_sm_kib * 1024 : 48 * 1024;
}

void rlk_target_for_cuda_device(int major, int minor, int multiprocessors, size_t smem_per_block,
                                size_t smem_per_sm, rlk_target *out) {
  memset(out, 0, sizeof *out);
  const cuda_arch_row *r = cuda_arch(major * 10 + minor);
  out->major = major;
  out->minor = minor;
  out->arch_specific = r && r->device_uses_a;
  rlk_format(out->name, sizeof out->name, "sm_%d%d%s", major, minor, out->arch_specific ? "a" : "");
  cuda_fill(out);
  out->multiprocessors = multiprocessors;
  if (smem_per_block) out->smem_per_block = smem_per_block;
  if (smem_per_sm) out->smem_per_sm = smem_per_sm;
}

/* Digits of s as a positive int; the end in *end. -1 if none. */
static int parse_digits(const char *s, const char **end) {
  int v = 0, n = 0;
  while (*s >= '0' && *s <= '9' && n < 6) v = v * 10 + (*s++ - '0'), n++;
  *end = s;
  return n ? v : -1;
}

rlk_status rlk_target_parse(const char *text, rlk_target *out) {
  memset(out, 0, sizeof *out);
  if (!text || !*text) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target: empty");
  if (strlen(text) >= sizeof out->name) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s' is too long", text);
  const char *end = NULL;
  if (!strncmp(text, "sm_", 3) || !strncmp(text, "compute_", 8)) {
    int cc = parse_digits(text + (text[0] == 's' ? 3 : 8), &end);
    int a = *end == 'a' && text[0] == 's';
    if (cc < 10 || (*end && !(a && !end[1])))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s' is not sm_<cc>[a] or compute_<cc>", text);
    out->major = cc / 10;
    out->minor = cc % 10;
    out->arch_specific = a;
    cuda_fill(out);
    rlk_format(out->name, sizeof out->name, "%s", text);
    return RLK_OK;
  }
  if (!strncmp(text, "gfx", 3)) {
    /* Feature flags are not part of a target here: "gfx90a:xnack-" -> "gfx90a". */
    size_t n = strcspn(text, ":");
    if (n < 6) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s' is not gfx<id>", text);
    rlk_format(out->name, sizeof out->name, "%.*s", (int)n, text);
    /* gfx<major><minor digit><stepping digit>: gfx90a -> 9.0, gfx942 -> 9.4, gfx1100 -> 11.0 */
    char id[16] = "";
    rlk_format(id, sizeof id, "%.*s", (int)(n - 3), text + 3);
    size_t len = strlen(id);
    if (len < 3) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s' is not gfx<id>", text);
    out->minor = (int)strtol((char[]){id[len - 2], 0}, NULL, 16);
    id[len - 2] = '\0';
    out->major = parse_digits(id, &end);
    if (out->major < 0 || *end) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s' is not gfx<id>", text);
    out->kind = RLK_BACKEND_HIP;
    out->warp_size = 64;
    out->smem_per_block = out->smem_per_sm = 64 * 1024; /* LDS a workgroup may use */
    return RLK_OK;
  }
  if (!strncmp(text, "host-", 5) && text[5]) {
    out->kind = RLK_BACKEND_HOST;
    rlk_format(out->name, sizeof out->name, "%s", text);
    out->warp_size = 32;
    out->smem_per_block = out->smem_per_sm = 0;
    return RLK_OK;
  }
  return rlk_error(RLK_ERR_INVALID_ARGUMENT, "target '%s' is not sm_<cc>[a], compute_<cc>, gfx<id> or host-<machine>",
                   text);
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
