/* host_backend.c - the CPU as a backend: a kernel module is a shared object loaded from
 * memory, a kernel a plain C function `void kernel(void **args)` that loops over the whole
 * problem itself, memory is the heap and events read the monotonic clock. It lets every
 * layer above (JIT, cache, ops) run and be tested on machines without a GPU. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <elf.h>

#include "backend/backend.h"
#include "backend/binary_image.h"
#include "core/core.h"
#include "core/target.h"

/* The ELF machine of shared objects this process can load. */
#if defined(__x86_64__)
#define HOST_ELF_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_ELF_MACHINE EM_AARCH64
#elif defined(__powerpc64__)
#define HOST_ELF_MACHINE EM_PPC64
#elif defined(__riscv) && __riscv_xlen == 64
#define HOST_ELF_MACHINE EM_RISCV
#else
#define HOST_ELF_MACHINE 0 /* unknown: leave the check to the loader */
#endif

typedef struct host_module {
  void *dl;
  /* The memfd the object was loaded from, kept open while it is loaded so that no other
   * module gets the same /proc/self/fd path (the loader matches modules by path). */
  int fd;
} host_module;

typedef struct host_event {
  double seconds;
  int recorded;
} host_event;

/* Writes all `size` bytes of `data` to fd; 0 on success, else errno. */
static int write_all(int fd, const void *data, size_t size) {
  const unsigned char *p = data;
  while (size) {
    ssize_t n = write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += n;
    size -= (size_t)n;
  }
  return 0;
}

/* The loader's message for the last failure, without the path it repeats (a temporary
 * name that means nothing to the reader). */
static const char *loader_error(void) {
  const char *why = dlerror();
  if (!why) return "unknown loader error";
  const char *so = strstr(why, ": ");
  return so ? so + 2 : why;
}

/* Lets the memory file be mapped executable where the kernel asks (Linux 6.3+ knows the
 * flag; older kernels reject it, and then a plain memfd is executable anyway). */
#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif

/* Loads from an anonymous memory file. RLK_OK, or RLK_ERR_UNAVAILABLE when this did not
 * work for any reason (no memfds, no /proc, a noexec policy, the loader refusing), with
 * the loader's message in rlk_last_error(); the caller then tries a temporary file. */
static rlk_status load_from_memfd(const void *image, size_t size, host_module *m) {
  int fd = memfd_create("rlk-kernel", MFD_CLOEXEC | MFD_EXEC);
  if (fd < 0 && errno == EINVAL) fd = memfd_create("rlk-kernel", MFD_CLOEXEC);
  if (fd < 0) return rlk_error(RLK_ERR_UNAVAILABLE, "memfd_create: %s", strerror(errno));
  if (write_all(fd, image, size) != 0) {
    close(fd);
    return rlk_error(RLK_ERR_UNAVAILABLE, "writing a memfd failed");
  }
  char path[64];
  rlk_format(path, sizeof path, "/proc/self/fd/%d", fd);
  /* A module still loaded under this path (one that could not be unloaded) would be
   * returned instead of ours. */
  void *stale = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (stale) {
    dlclose(stale);
    close(fd);
    return rlk_error(RLK_ERR_UNAVAILABLE, "%s names a module still loaded", path);
  }
  dlerror();
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    rlk_status st = rlk_error(RLK_ERR_UNAVAILABLE, "%s", loader_error());
    close(fd);
    return st;
  }
  m->dl = dl;
  m->fd = fd;
  return RLK_OK;
}

/* Loads from a private temporary file, removed as soon as the loader has mapped it. */
static rlk_status load_from_tempfile(const void *image, size_t size, host_module *m) {
  const char *dir = getenv("TMPDIR");
  if (!dir || !*dir) dir = "/tmp";
  char path[4096];
  if (rlk_format(path, sizeof path, "%s/rlk-kernel-XXXXXX.so", dir) < 0)
    return rlk_error(RLK_ERR_IO, "host: module_load: TMPDIR path is too long");
  int fd = mkstemps(path, 3);
  if (fd < 0)
    return rlk_error(RLK_ERR_IO, "host: module_load: cannot create a file in %s: %s", dir,
                     strerror(errno));
  int err = write_all(fd, image, size);
  if (err) {
    unlink(path);
    close(fd);
    return rlk_error(RLK_ERR_IO, "host: module_load: writing %s: %s", path, strerror(err));
  }
  dlerror();
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  rlk_status st = RLK_OK;
  if (!dl) st = rlk_error(RLK_ERR_BACKEND, "host: module_load: %s", loader_error());
  unlink(path);
  close(fd);
  if (st != RLK_OK) return st;
  m->dl = dl;
  m->fd = -1;
  return RLK_OK;
}

static rlk_status host_module_load(rlk_backend_impl *self, const void *image, size_t size,
                                   void **module) {
  (void)self;
  if (!module) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host: module_load: module is NULL");
  *module = NULL;
  rlk_status st;
  if (HOST_ELF_MACHINE) {
    st = rlk_elf_image_check(image, size, HOST_ELF_MACHINE, "host");
    if (st != RLK_OK) return st;
  } else if (!rlk_image_is_elf(image, size)) {
    return rlk_error(RLK_ERR_BACKEND, "host: module_load: not an ELF image");
  }
  host_module *m = calloc(1, sizeof *m);
  if (!m) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "host: module_load: out of memory");
  st = load_from_memfd(image, size, m);
  if (st != RLK_OK) {
    rlk_debug("host: module_load: no memfd load (%s); using a temporary file", rlk_last_error());
    st = load_from_tempfile(image, size, m);
  }
  if (st != RLK_OK) {
    free(m);
    return st;
  }
  *module = m;
  return RLK_OK;
}

static void host_module_unload(rlk_backend_impl *self, void *module) {
  (void)self;
  host_module *m = module;
  if (!m) return;
  if (m->dl && dlclose(m->dl) != 0) rlk_warn("host: module_unload: %s", loader_error());
  if (m->fd >= 0) close(m->fd);
  free(m);
}

static rlk_status host_get_function(rlk_backend_impl *self, void *module, const char *name,
                                    void **fn) {
  (void)self;
  host_module *m = module;
  if (!m || !name || !fn)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host: get_function: NULL argument");
  *fn = NULL;
  dlerror();
  void *sym = dlsym(m->dl, name);
  if (!sym) {
    dlerror(); /* its text repeats the module's temporary path; the name says enough */
    return rlk_error(RLK_ERR_BACKEND, "host: get_function: no symbol '%s' in the module", name);
  }
  *fn = sym;
  return RLK_OK;
}

static rlk_status host_launch(rlk_backend_impl *self, void *fn, const rlk_launch_dims *dims,
                              void *stream, void **args) {
  (void)self;
  (void)dims; /* a host kernel covers the whole problem in one call */
  (void)stream;
  if (!fn) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host: launch: function is NULL");
  void (*kernel)(void **);
  /* POSIX guarantees object and function pointers convert; memcpy keeps ISO C quiet. */
  memcpy(&kernel, &fn, sizeof kernel);
  kernel(args);
  return RLK_OK;
}

static rlk_status host_mem_alloc(rlk_backend_impl *self, size_t bytes, void **out) {
  (void)self;
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host: mem_alloc: out is NULL");
  *out = NULL;
  if (bytes == 0) return RLK_OK;
  /* 64-byte alignment, like device allocations are (at least) aligned for vector loads. */
  size_t rounded = (bytes + 63) & ~(size_t)63;
  if (rounded < bytes)
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "host: mem_alloc: %zu bytes is too large", bytes);
  void *p = aligned_alloc(64, rounded);
  if (!p) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "host: mem_alloc: %zu bytes", bytes);
  *out = p;
  return RLK_OK;
}

static rlk_status host_mem_free(rlk_backend_impl *self, void *ptr) {
  (void)self;
  free(ptr);
  return RLK_OK;
}

static rlk_status host_copy(rlk_backend_impl *self, void *dst, const void *src, size_t bytes) {
  (void)self;
  if (bytes == 0) return RLK_OK;
  if (!dst || !src) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host: copy: NULL pointer");
  memmove(dst, src, bytes);
  return RLK_OK;
}

static rlk_status host_mem_set(rlk_backend_impl *self, void *dst, int value, size_t bytes) {
  (void)self;
  if (bytes == 0) return RLK_OK;
  if (!dst) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host: mem_set: NULL pointer");
  memset(dst, value, bytes);
  return RLK_OK;
}

static rlk_status host_synchronize(rlk_backend_impl *self, void *stream) {
  (void)self;
  (void)stream; /* launches complete before they return */
  return RLK_OK;
}

static rlk_status host_event_create(rlk_backend_impl *self, void **event) {
  (void)self;
  if (!event) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host: event_create: event is NULL");
  host_event *e = calloc(1, sizeof *e);
  if (!e) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "host: event_create: out of memory");
  *event = e;
  return RLK_OK;
}

static rlk_status host_event_record(rlk_backend_impl *self, void *event, void *stream) {
  (void)self;
  (void)stream;
  host_event *e = event;
  if (!e) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host: event_record: event is NULL");
  e->seconds = rlk_now();
  e->recorded = 1;
  return RLK_OK;
}

static rlk_status host_event_elapsed_ms(rlk_backend_impl *self, void *start, void *end,
                                        float *ms) {
  (void)self;
  const host_event *a = start, *b = end;
  if (!a || !b || !ms)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host: event_elapsed_ms: NULL argument");
  if (!a->recorded || !b->recorded)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "host: event_elapsed_ms: the %s event was never recorded",
                     a->recorded ? "end" : "start");
  *ms = (float)((b->seconds - a->seconds) * 1e3);
  return RLK_OK;
}

static void host_event_destroy(rlk_backend_impl *self, void *event) {
  (void)self;
  free(event);
}

static void host_destroy(rlk_backend_impl *self) { free(self); }

/* ---- description ------------------------------------------------------------------ */

/* The CPU model from /proc/cpuinfo ("model name" on x86; other fields elsewhere), or a
 * generic name when it cannot be read. */
static void cpu_model_name(char *buf, size_t size) {
  static const char *const keys[] = {"model name", "Model", "Hardware", "cpu model", "cpu"};
  rlk_format(buf, size, "host CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  int best = (int)(sizeof keys / sizeof keys[0]);
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (!colon) continue;
    for (int k = 0; k < best; k++) {
      size_t n = strlen(keys[k]);
      if (strncmp(line, keys[k], n) != 0) continue;
      const char *rest = line + n;
      while (*rest == ' ' || *rest == '\t') rest++;
      if (rest != colon) continue; /* a longer key that merely starts the same */
      const char *value = colon + 1;
      while (*value == ' ' || *value == '\t') value++;
      size_t len = strcspn(value, "\r\n");
      if (len == 0) continue;
      rlk_format(buf, size, "%.*s", (int)len, value);
      best = k;
      break;
    }
    if (best == 0) break;
  }
  fclose(f);
}

rlk_status rlk_host_backend_open(rlk_backend_impl **out) {
  if (!out) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host: out is NULL");
  *out = NULL;
  rlk_backend_impl *b = calloc(1, sizeof *b);
  if (!b) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "host: out of memory opening the backend");
  b->kind = RLK_BACKEND_HOST;
  b->name = "host";
  cpu_model_name(b->info.name, sizeof b->info.name);
  rlk_format(b->info.target, sizeof b->info.target, "%s", rlk_host_target());
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  b->info.multiprocessors = cores > 0 ? (int)cores : 1;
  rlk_status st = rlk_target_parse(b->info.target, &b->target);
  if (st != RLK_OK) {
    free(b);
    return st;
  }
  b->target.multiprocessors = b->info.multiprocessors;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  b->info.total_memory = (pages > 0 && page > 0) ? (size_t)pages * (size_t)page : 0;
  b->module_load = host_module_load;
  b->module_unload = host_module_unload;
  b->get_function = host_get_function;
  b->launch = host_launch;
  b->mem_alloc = host_mem_alloc;
  b->mem_free = host_mem_free;
  b->copy_to_device = host_copy;
  b->copy_to_host = host_copy;
  b->mem_set = host_mem_set;
  b->synchronize = host_synchronize;
  b->event_create = host_event_create;
  b->event_record = host_event_record;
  b->event_elapsed_ms = host_event_elapsed_ms;
  b->event_destroy = host_event_destroy;
  b->destroy = host_destroy;
  *out = b;
  return RLK_OK;
}
