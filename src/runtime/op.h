/* op.h - what the runtime knows of an op: its settings table, its plan (the kernels a
 * configuration line needs, through the same selection a call makes), samples and tuning
 * candidates; and the generic configuration-line machinery over those tables (the op table
 * itself comes down from the ops layer: runtime/catalog.h). */
#ifndef RLK_RUNTIME_OP_H
#define RLK_RUNTIME_OP_H

#include <stddef.h>
#include <stdint.h>

#include "jit/template.h"
#include "rlk.h"
#include "runtime/context.h"
#include "tune/tune_table.h"

#define RLK_OP_MAX_KERNELS 24

typedef struct rlk_op_config_pair {
  const char *name;
  const char *value;
} rlk_op_config_pair;

/* ---- an op's settings: declared once, in a table ---------------------------------- */

/* One setting of an op's configuration line. The table of them is all the generic code needs
 * to parse a line, reject what is wrong, spell it canonically and write the --help text. Its
 * name and values are a declared value (jit/value.h): the template parameter's own declaration
 * where the setting feeds that parameter unchanged, one of its own otherwise (a setting that
 * selects kernels, or is translated into a parameter: a dtype into a dtype code). */
typedef struct rlk_op_setting {
  const rlk_value_decl *value; /* name and values: INT, FLAG, CHOICE (the value is the name's
                                * index) or DTYPE (the value is the rlk_dtype) */
  int64_t def;                 /* the value when a line does not give it; an INT default outside
                                * [min, max] means "not given" and is never spelled */
  const char *feeds;           /* what it sets or selects: "entry.param" or "entry" words, entries as
                                * globs ("pattn_*.dtype"); "" when it sets no kernel parameter (a
                                * run-time value, or a tuning key); tests/test_ops.c checks each */
  const char *doc;             /* one line */
  int bucketed;                /* a shape hint the op reads only through rlk_tune_bucket (a
                                * tuning key's tokens): RLK_JIT_RECORD writes its bucket */
} rlk_op_setting;

/* A setting whose value a template parameter declares (`decl`, a static rlk_value_decl). */
#define RLK_SET(decl, def, feeds, doc) {&(decl), def, feeds, doc}
/* A setting with a declaration of its own, made in place (a static compound literal). */
#define RLK_SET_INT(n, def, lo, hi, feeds, doc) {&(const rlk_value_decl)RLK_DECL_INT(n, lo, hi), def, feeds, doc}
#define RLK_SET_FLAG(n, def, feeds, doc) {&(const rlk_value_decl)RLK_DECL_FLAG(n), def, feeds, doc}
#define RLK_SET_CHOICE(n, choices, def, feeds, doc) \
  {&(const rlk_value_decl)RLK_DECL_CHOICES(n, choices), def, feeds, doc}
#define RLK_SET_DTYPE(n, dtypes, def, feeds, doc) {&(const rlk_value_decl)RLK_DECL_DTYPE(n, dtypes), def, feeds, doc}
/* A shape hint read only through its tuning bucket (rlk_op_setting.bucketed): no kernel parameter. */
#define RLK_SET_BUCKETED(n, def, lo, hi, doc) {&(const rlk_value_decl)RLK_DECL_INT(n, lo, hi), def, "", doc, 1}

#define RLK_OP_MAX_SETTINGS 16

/* A parsed configuration line: one value per setting, in the table's order. */
typedef struct rlk_op_values {
  int64_t v[RLK_OP_MAX_SETTINGS];
  uint32_t given; /* bit i: setting i was on the line */
} rlk_op_values;

#define RLK_OP_GIVEN(vals, i) (((vals)->given >> (i)) & 1u)

typedef struct rlk_op_desc {
  const char *name; /* "group_advantage" */
  const rlk_op_setting *settings;
  size_t nsettings; /* <= RLK_OP_MAX_SETTINGS */
  const char *note; /* a last --help line, NULL if none */
  /* The kernel specs the op would launch on `ctx` for a parsed line (ctx, specs and nspecs are
   * checked by the caller; at most RLK_OP_MAX_KERNELS). A combination of settings that cannot
   * be: RLK_ERR_INVALID_ARGUMENT naming them. */
  rlk_status (*plan)(const rlk_context *ctx, const rlk_op_values *vals, rlk_kernel_spec *specs,
                     size_t *nspecs);
  /* Configuration lines that together reach every kernel variant family of the op (every
   * entry, dtype, mode and code path); the tests compile all of them for every target. */
  const char *const *samples;
  /* Tuning candidates (NULL if none): settings, each appended to a configuration line, that a
   * sweep tool times against each other on a device. Valid on every target: a setting a target
   * cannot honour falls back to its default there (equal specs then time alike). */
  const char *const *candidates;
  /* The tuning database key of a configuration (NULL for an op without candidates): from
   * settings that name one pass and tokens=, the canonical shape (rlk_tune_record.shape, the
   * same string the op's calls look up, defaults spelled out) and the token bucket. A setting
   * that is not part of a key (a tuning setting, pass=both) is RLK_ERR_INVALID_ARGUMENT. */
  rlk_status (*tune_key)(const rlk_op_values *vals, char *shape, size_t size, int64_t *tokens);
  /* The tuning settings that change a configuration's calls on `ctx` but not its kernels (a
   * vocabulary split, a tile order), space-separated, a string literal; NULL when there are none.
   * A sweep times a candidate that names one even when it plans to the default's kernels. */
  const char *(*runtime_tuning)(const rlk_context *ctx, const rlk_op_values *vals);
  /* Makes explicit in a call's values what its plan also read from the environment (a variant
   * an RLK_*_VARIANT variable forces where the call asked for auto), so that the line the record
   * writes plans the same kernels where that variable is not set; NULL when the plan reads none. */
  void (*recorded)(rlk_op_values *vals);
  /* 0 when this process's environment keeps the op's calls from reading the tuning database (a
   * variable forcing a variant, RLK_INVARIANT=1), so that rlk_tune_lookup reports what a call
   * takes; NULL when nothing in the environment does. */
  int (*reads_tuning)(void);
} rlk_op_desc;

#define RLK_OP_CONFIG_MAX_PAIRS 32

/* The kernel specs of op d's settings `pairs` on ctx: rlk_op_values_parse, then d->plan. */
rlk_status rlk_op_plan(const rlk_op_desc *d, const rlk_context *ctx, size_t npairs, const rlk_op_config_pair *pairs,
                       rlk_kernel_spec *specs, size_t *nspecs);

/* The values of `pairs` for op d, defaults first. RLK_ERR_INVALID_ARGUMENT naming the setting:
 * unknown (the known ones listed), given twice, or a value its declaration does not allow. */
rlk_status rlk_op_values_parse(const rlk_op_desc *d, size_t npairs, const rlk_op_config_pair *pairs,
                               rlk_op_values *out);

/* vals: every setting at its default, none given. */
void rlk_op_values_init(const rlk_op_desc *d, rlk_op_values *vals);

/* Sets setting i of vals to x and marks it given. */
static inline void rlk_op_values_set(rlk_op_values *vals, int i, int64_t x) {
  vals->v[i] = x;
  vals->given |= 1u << i;
}

/* One setting's value from its text. */
rlk_status rlk_op_setting_parse(const rlk_op_setting *s, const char *text, int64_t *value);

/* The index of d's setting `name`, -1 if it has none. */
int rlk_op_setting_index(const rlk_op_desc *d, const char *name);

/* The canonical line of parsed values: "op name=value ..." with the settings that were given or
 * differ from their defaults (an op may read "given" as a choice: offsets= implies uneven
 * groups), in table order, each value spelled one way. It parses back to the same values and
 * given settings. -1 if it does not fit. */
int rlk_op_values_line(const rlk_op_desc *d, const rlk_op_values *vals, char *buf, size_t size);

/* A tuning database winner's settings ("name=value ...", "" for the default) as the values of d's
 * settings tuning[0..n) in that order, each at its default unless given: 0, or -1 when the text
 * names another setting or a value its declaration does not allow. What an op's
 * rlk_tune_parse_fn calls. */
int rlk_op_tuning_values(const rlk_op_desc *d, const int *tuning, size_t n, const char *settings,
                         int64_t values[RLK_TUNE_VALUES]);

/* A plan's or a selection's last step: *nspecs = n and every spec checked against its template's
 * schema. */
rlk_status rlk_op_planned(const rlk_kernel_spec *specs, size_t n, size_t *nspecs);

/* The tuning database's winner on ctx for op d's configuration shape and token count (bucketed):
 * its settings as values (parse: the op's, rlk_op_tuning_values over its tuning settings) and
 * the entry; NULL without a database, a record, or with a winner that is not d's tuning (warned
 * about once: the default runs). */
const rlk_tune_entry *rlk_op_tuned(const rlk_context *ctx, const rlk_op_desc *d, const char *shape, int64_t tokens,
                                   rlk_tune_parse_fn parse, int64_t values[RLK_TUNE_VALUES]);

/* d's --help text from its table: "name: choices, doc (default)" lines, then the note. -1 if
 * it does not fit. */
int rlk_op_help_text(const rlk_op_desc *d, char *buf, size_t size);

#endif
