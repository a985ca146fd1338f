/* rtc.h - what the two runtime compilers share (nvrtc.c, hiprtc.c): NVRTC and hiprtc have the
 * one C API under two prefixes (a program from a source and its headers, name expressions,
 * options, a log, lowered names), so one compile serves both. Each file keeps what is its own:
 * the library and its other symbols, the version, the targets and how the binary is read out.
 * Internal to src/jit. */
#ifndef RLK_JIT_RTC_H
#define RLK_JIT_RTC_H

#include <pthread.h>
#include <stddef.h>

#include "core/dynlib.h"
#include "jit/compiler.h"
#include "rlk.h"

/* nvrtcResult / hiprtcResult are C enums, passed as int; a program is an opaque pointer. */
typedef int rlk_rtc_result;
typedef struct rlk_rtc_program_s *rlk_rtc_program;
#define RLK_RTC_SUCCESS 0
#define RLK_RTC_ERROR_COMPILATION 6 /* the same value in both */

/* The functions both have, resolved from the library by the compiler's open. */
typedef struct rlk_rtc_api {
  const char *(*GetErrorString)(rlk_rtc_result);
  rlk_rtc_result (*CreateProgram)(rlk_rtc_program *, const char *, const char *, int, const char *const *,
                                  const char *const *);
  rlk_rtc_result (*DestroyProgram)(rlk_rtc_program *);
  rlk_rtc_result (*CompileProgram)(rlk_rtc_program, int, const char *const *);
  rlk_rtc_result (*GetProgramLogSize)(rlk_rtc_program, size_t *);
  rlk_rtc_result (*GetProgramLog)(rlk_rtc_program, char *);
  rlk_rtc_result (*AddNameExpression)(rlk_rtc_program, const char *);
  rlk_rtc_result (*GetLoweredName)(rlk_rtc_program, const char *, const char **);
} rlk_rtc_api;

/* What tells one runtime compiler from the other in a compile. */
typedef struct rlk_rtc_kind {
  const char *name;        /* "nvrtc": the compiler's kind, its messages' and its functions' prefix */
  const char *error;       /* what stands for an error without a string ("NVRTC error") */
  const char *source_name; /* a request's source name when it gives none ("kernel.cu") */
  const char *arch_option; /* the option that names the target, before its name ("-arch=") */
  const char *binary_noun; /* what the debug line calls the binary ("cubin") */
  /* Reads a compiled program's binary into out (binary, size, binary_name). */
  rlk_status (*binary)(rlk_compiler *self, const rlk_compile_request *req, rlk_rtc_program prog,
                       rlk_compile_result *out, const char *log);
} rlk_rtc_kind;

/* The first member of each runtime compiler's impl struct (the shared code reaches it by a cast). */
typedef struct rlk_rtc {
  const rlk_rtc_kind *kind;
  rlk_dynlib lib;
  rlk_rtc_api api;
  int major, minor;
  /* one program's create/compile/read/destroy sequence at a time: NVRTC serializes compiles in
   * a process anyway, and hiprtc's thread safety varies by release */
  pthread_mutex_t lock;
} rlk_rtc;

/* The error string of r, or the kind's stand-in. */
const char *rlk_rtc_errstr(const rlk_rtc *rtc, rlk_rtc_result r);

/* A compiler of `kind` with a zeroed impl of impl_size bytes (an rlk_rtc first), its compile and
 * destroy set; *out (the open function's, checked here) stays NULL until rlk_rtc_ready. */
rlk_status rlk_rtc_new(const rlk_rtc_kind *kind, size_t impl_size, rlk_compiler **out, rlk_compiler **made);

/* Names the compiler from rtc's version (kind, version, id "<name>-<major>.<minor>"). */
void rlk_rtc_set_version(rlk_compiler *c);

/* Logs the opened compiler and hands it to *out. */
rlk_status rlk_rtc_ready(rlk_compiler *c, rlk_compiler **out);

/* Closes the library and frees the compiler. */
void rlk_rtc_destroy(rlk_compiler *self);

#endif
