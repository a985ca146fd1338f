/* template.h - kernel templates, their typed parameter schemas, and kernel specs.
 *
 * A template is one kernel entry point in a template source file (templates/cuda/X.cuh for
 * NVRTC and hiprtc, templates/host/X.c for the CPU). Its schema lists the parameters that
 * specialize it, each typed and range-checked: the only values that ever reach generated
 * code. A spec is a template plus one value per parameter; the JIT turns it into a name
 * expression (CUDA/HIP: rlk::entry<args...>) or -D defines (host) and a cache key. */
#ifndef RLK_TEMPLATE_H
#define RLK_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "jit/value.h"
#include "rlk.h"

/* A template's parameter: a declared value (jit/value.h). RLK_PARAM_* declare one in place, in
 * a template's list, where no setting shares it: the address of a static compound literal. */
#define RLK_PARAM_INT(name, lo, hi) (&(const rlk_value_decl)RLK_DECL_INT(name, lo, hi))
#define RLK_PARAM_POW2(name, lo, hi) (&(const rlk_value_decl)RLK_DECL_POW2(name, lo, hi))
#define RLK_PARAM_FLAG(name) (&(const rlk_value_decl)RLK_DECL_FLAG(name))
#define RLK_PARAM_CHOICE(name, names, lo, hi) (&(const rlk_value_decl)RLK_DECL_CHOICE(name, names, lo, hi))
#define RLK_PARAM_DTYPE(name, dtypes) (&(const rlk_value_decl)RLK_DECL_DTYPE(name, dtypes))

#define RLK_MAX_PARAMS 16

typedef struct rlk_template {
  const char *family;      /* cache family and source stem: "group_advantage" */
  const char *entry;       /* kernel name inside namespace rlk (CUDA) / rlk_<entry> (host) */
  const char *cuda_source; /* file under templates/, NULL if there is none */
  const char *host_source; /* file under templates/, NULL if there is none */
  size_t nparams;          /* <= RLK_MAX_PARAMS */
  const rlk_value_decl *const *params; /* in template-argument order */
  /* The RLK_TARGET_* features its code needs (core/target.h; 0: none). The JIT refuses it, with
   * the reason, for a target without them (a wgmma kernel for sm_100a), so it is never compiled
   * to nothing or into an error deep in the compiler. */
  unsigned requires;
} rlk_template;

/* A template specialized: one value per parameter, in the schema's order. */
typedef struct rlk_kernel_spec {
  const rlk_template *tmpl;
  int64_t values[RLK_MAX_PARAMS];
} rlk_kernel_spec;

/* Checks every value of a spec against the schema; an RLK_ERR_INVALID_ARGUMENT names the
 * template, the parameter and the allowed range. */
rlk_status rlk_spec_validate(const rlk_kernel_spec *spec);

/* Writes "name=value name=value ..." with parameters sorted by name and values spelled
 * canonically (bools 0/1, dtypes by rlk_dtype_name, enums by choice name). */
rlk_status rlk_spec_params_text(const rlk_kernel_spec *spec, char *buf, size_t size);

/* The CUDA/HIP name expression, e.g. "rlk::group_advantage<float, 0, 16, true, 128>". */
rlk_status rlk_spec_name_expression(const rlk_kernel_spec *spec, char *buf, size_t size);

/* The host compile defines, one per parameter, "-DRLK_P_<NAME>=<value>", sorted by name;
 * dtype values are C type names. Writes them into `defines` (each a buffer of `each` bytes)
 * and their count into *count. */
rlk_status rlk_spec_host_defines(const rlk_kernel_spec *spec, char defines[][96], size_t *count);

/* Parses "value" for parameter `decl` (the canonical spelling, or an integer). */
rlk_status rlk_param_parse(const rlk_value_decl *decl, const char *text, int64_t *value);

/* The C++ spelling of a dtype in device code (templates/cuda/rlk_prelude.cuh). */
const char *rlk_dtype_cuda_type(rlk_dtype dtype);

/* The C spelling of a dtype in host code (templates/host/rlk_host_prelude.h). */
const char *rlk_dtype_host_type(rlk_dtype dtype);

/* ------------------------------------------------------------------------ */
/* Template sources                                                         */
/* ------------------------------------------------------------------------ */

typedef struct rlk_source_file {
  const char *name; /* path under templates/: "cuda/rlk_prelude.cuh" */
  const char *text; /* NUL-terminated */
  size_t size;
} rlk_source_file;

/* The set of files a compiler sees for one source directory ("cuda" or "host"): the
 * template sources and every header they can include, those of the directory and of
 * templates/common (the kernels' argument lists and template values, shared by both), with one
 * digest over all of them (SHA-256 over the length-prefixed names and contents, sorted by name).
 * A compiler sees each file by its name alone, so no two files of a set share one. */
typedef struct rlk_source_set {
  const char *dir;
  size_t count;
  const rlk_source_file *files;
  char digest[65];
} rlk_source_set;

/* The folder of templates/ that both source sets hold. */
#define RLK_SOURCES_SHARED "common"

/* The source set for `dir`: embedded in the library at build time, or read from
 * RLK_TEMPLATE_DIR/<dir> and RLK_TEMPLATE_DIR/common when that variable is set (loaded once per
 * process). */
rlk_status rlk_sources_get(const char *dir, const rlk_source_set **out);

/* A file of a set by name, or NULL. */
const rlk_source_file *rlk_sources_find(const rlk_source_set *set, const char *name);

/* Digest of a list of files, as defined above; `hex` holds 65 bytes. Shared by the build-time
 * embedder and the RLK_TEMPLATE_DIR loader so both agree. */
void rlk_sources_digest(const rlk_source_file *files, size_t count, char hex[65]);

/* Whether the file `name` ("cuda/x.cuh", "common/y.h") belongs to the source set of `dir`. */
int rlk_sources_in_set(const char *name, const char *dir);

/* The name a compiler sees a file by: `name` without its folder. */
const char *rlk_sources_basename(const char *name);

#endif
