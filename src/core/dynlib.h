/* dynlib.h - opening a shared library chosen from a list of candidates and resolving a
 * table of its symbols, so the runtime can use NVRTC, hiprtc and the device runtimes
 * without linking them (one binary then works with whichever toolkit is installed). */
#ifndef RLK_DYNLIB_H
#define RLK_DYNLIB_H

#include <stddef.h>

#include "rlk.h"

/* One symbol to resolve. `slot` points at the variable that receives the address, usually
 * a function pointer (the address is copied into it byte for byte). An optional symbol
 * that is missing leaves its slot NULL; a missing required one rejects the library. */
typedef struct rlk_dynlib_symbol {
  const char *name;
  void *slot;
  int optional;
} rlk_dynlib_symbol;

typedef struct rlk_dynlib {
  void *handle;   /* from dlopen; NULL when closed */
  char path[512]; /* the candidate that was loaded, as given in the list */
} rlk_dynlib;

/* Tries `candidates` in order (file names for the loader path, or paths; NULL entries are
 * skipped) and keeps the first one that loads and defines every required symbol of
 * `symbols`, whose slots are then filled. `what` names the library in messages ("nvrtc").
 * On failure returns RLK_ERR_UNAVAILABLE with every candidate tried and why it was
 * rejected (the loader's error, or the first missing symbol); `lib` is left closed. */
rlk_status rlk_dynlib_open(rlk_dynlib *lib, const char *what, const char *const *candidates,
                           size_t ncandidates, const rlk_dynlib_symbol *symbols,
                           size_t nsymbols);

/* rlk_dynlib_open over the libraries the process has already loaded (dlopen with RTLD_NOLOAD,
 * names matched against loaded files and sonames): a library must be the very copy another
 * component loaded (a communicator created by PyTorch's NCCL). Loads nothing new. */
rlk_status rlk_dynlib_open_loaded(rlk_dynlib *lib, const char *what, const char *const *candidates,
                                  size_t ncandidates, const rlk_dynlib_symbol *symbols,
                                  size_t nsymbols);

/* Resolves more symbols from an open library, with the same rules: RLK_ERR_UNAVAILABLE
 * naming the first missing required symbol. */
rlk_status rlk_dynlib_resolve(rlk_dynlib *lib, const char *what,
                              const rlk_dynlib_symbol *symbols, size_t nsymbols);

/* Closes the library (no-op when it is not open). */
void rlk_dynlib_close(rlk_dynlib *lib);

#endif
