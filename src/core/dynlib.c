/* dynlib.c - dlopen over a candidate list plus a symbol table (see dynlib.h). */
#include "core/dynlib.h"

#include <dlfcn.h>
#include <string.h>

#include "core/core.h"

/* Appends "; text" (or "text" first) to a bounded message, silently cutting at the end. */
static void note_append(char *buf, size_t size, const char *name, const char *why) {
  size_t len = strlen(buf);
  if (len + 1 >= size) return;
  rlk_format(buf + len, size - len, "%s%s (%s)", len ? "; " : "", name, why);
}

/* The first required symbol of the table that `handle` lacks, or NULL when all are there. */
static const char *first_missing(void *handle, const rlk_dynlib_symbol *symbols, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (symbols[i].optional) continue;
    dlerror();
    if (!dlsym(handle, symbols[i].name)) return symbols[i].name;
  }
  return NULL;
}

/* Fills every slot; optional symbols that are absent become NULL. */
static void fill_slots(void *handle, const rlk_dynlib_symbol *symbols, size_t n) {
  for (size_t i = 0; i < n; i++) {
    dlerror();
    void *address = dlsym(handle, symbols[i].name);
    /* A function pointer and a data pointer have the same representation on every
     * platform with dlsym (POSIX requires it); memcpy keeps ISO C quiet about it. */
    memcpy(symbols[i].slot, &address, sizeof address);
  }
}

/* dlopen flags beyond RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE: 0, or RTLD_NOLOAD. */
static rlk_status open_with(rlk_dynlib *lib, const char *what, const char *const *candidates,
                            size_t ncandidates, const rlk_dynlib_symbol *symbols, size_t nsymbols,
                            int extra_flags) {
  if (!lib || !what || (!candidates && ncandidates))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "dynlib: NULL argument");
  memset(lib, 0, sizeof *lib);
  char tried[1536] = "";
  for (size_t i = 0; i < ncandidates; i++) {
    const char *name = candidates[i];
    if (!name || !*name) continue;
    dlerror();
    /* NODELETE: NVRTC, hiprtc and the drivers carry their own C++ runtimes, thread-local state
     * and atexit handlers; unloading them while the process runs is unsafe, and their
     * load-time allocations must stay reachable. dlclose then only drops a reference. */
    void *handle = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE | extra_flags);
    if (!handle) {
      const char *why = extra_flags & RTLD_NOLOAD ? "not loaded in this process" : dlerror();
      /* The loader repeats the name in its message; keep only what follows it. */
      const char *colon = why ? strstr(why, ": ") : NULL;
      note_append(tried, sizeof tried, name, colon ? colon + 2 : (why ? why : "not loadable"));
      continue;
    }
    const char *missing = first_missing(handle, symbols, nsymbols);
    if (missing) {
      char why[160];
      rlk_format(why, sizeof why, "no symbol %s", missing);
      note_append(tried, sizeof tried, name, why);
      dlclose(handle);
      continue;
    }
    fill_slots(handle, symbols, nsymbols);
    lib->handle = handle;
    rlk_format(lib->path, sizeof lib->path, "%s", name);
    rlk_debug("%s: loaded %s", what, name);
    return RLK_OK;
  }
  return rlk_error(RLK_ERR_UNAVAILABLE, "%s: no usable library: %s", what,
                   tried[0] ? tried : "no candidates");
}

rlk_status rlk_dynlib_open(rlk_dynlib *lib, const char *what, const char *const *candidates,
                           size_t ncandidates, const rlk_dynlib_symbol *symbols,
                           size_t nsymbols) {
  return open_with(lib, what, candidates, ncandidates, symbols, nsymbols, 0);
}

rlk_status rlk_dynlib_open_loaded(rlk_dynlib *lib, const char *what, const char *const *candidates,
                                  size_t ncandidates, const rlk_dynlib_symbol *symbols,
                                  size_t nsymbols) {
  return open_with(lib, what, candidates, ncandidates, symbols, nsymbols, RTLD_NOLOAD);
}

rlk_status rlk_dynlib_resolve(rlk_dynlib *lib, const char *what,
                              const rlk_dynlib_symbol *symbols, size_t nsymbols) {
  if (!lib || !lib->handle)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: library is not open", what ? what : "dynlib");
  const char *missing = first_missing(lib->handle, symbols, nsymbols);
  if (missing)
    return rlk_error(RLK_ERR_UNAVAILABLE, "%s: %s has no symbol %s", what ? what : "dynlib",
                     lib->path, missing);
  fill_slots(lib->handle, symbols, nsymbols);
  return RLK_OK;
}

void rlk_dynlib_close(rlk_dynlib *lib) {
  if (!lib || !lib->handle) return;
  dlclose(lib->handle);
  lib->handle = NULL;
}
