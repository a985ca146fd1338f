/* value.h - a declared value: a name and the values it may take. A kernel template's parameter
 * (jit/template.h) and an op's configuration setting (runtime/op.h) are both declared this way;
 * where a setting feeds a parameter unchanged (the same name, the same values), both point at
 * one declaration, so the two cannot drift apart. */
#ifndef RLK_VALUE_H
#define RLK_VALUE_H

#include <stdint.h>

typedef enum rlk_value_kind {
  RLK_VALUE_INT = 0,    /* an integer in [min, max], a power of two when pow2 is set */
  RLK_VALUE_FLAG = 1,   /* 0 or 1 */
  RLK_VALUE_CHOICE = 2, /* an index into choices (NULL-terminated names), in [min, max] */
  RLK_VALUE_DTYPE = 3   /* an rlk_dtype whose RLK_DTYPE_BIT is in dtypes */
} rlk_value_kind;

#define RLK_DTYPE_BIT(d) (1u << (unsigned)(d))

typedef struct rlk_value_decl {
  const char *name; /* lower-case identifier: "dtype", "block", "mode" */
  rlk_value_kind kind;
  int64_t min, max;
  int pow2;
  uint32_t dtypes;
  const char *const *choices;
} rlk_value_decl;

/* Initializers of a declaration, one a kind. RLK_DECL_CHOICES allows every name of `names`, an
 * array whose size is in scope; RLK_DECL_CHOICE the indices lo to hi. */
#define RLK_DECL_INT(name, lo, hi) {name, RLK_VALUE_INT, lo, hi, 0, 0, NULL}
#define RLK_DECL_POW2(name, lo, hi) {name, RLK_VALUE_INT, lo, hi, 1, 0, NULL}
#define RLK_DECL_FLAG(name) {name, RLK_VALUE_FLAG, 0, 1, 0, 0, NULL}
#define RLK_DECL_CHOICE(name, names, lo, hi) {name, RLK_VALUE_CHOICE, lo, hi, 0, 0, names}
#define RLK_DECL_CHOICES(name, names) RLK_DECL_CHOICE(name, names, 0, RLK_LAST_CHOICE(names))
#define RLK_DECL_DTYPE(name, dtypes) {name, RLK_VALUE_DTYPE, 0, 0, 0, dtypes, NULL}

/* The index of the last name of a NULL-terminated array of names whose size is in scope. */
#define RLK_LAST_CHOICE(names) ((int64_t)(sizeof(names) / sizeof((names)[0])) - 2)

#endif
