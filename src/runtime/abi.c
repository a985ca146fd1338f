/* abi.c - the sizes of the public structs, for bindings that mirror them in another language.
 *
 * One row per struct of include/rlk.h that a caller fills or reads (the ops' come from
 * runtime/op_list.h). A binding compares its own layout's size with the row before it passes a
 * struct in, so a package built against one header never hands a struct of the wrong size to a
 * library built from another. */
#include <string.h>

#include "core/core.h"
#include "runtime/op_list.h"

typedef struct abi_row {
  const char *name;
  size_t size;
} abi_row;

#define ABI_ROW(type) {#type, sizeof(type)}
#define ABI_ROW_OF_OP(type) ABI_ROW(type),

static const abi_row abi_rows[] = {
    ABI_ROW(rlk_context_options),
    ABI_ROW(rlk_device_info),
    ABI_ROW(rlk_counters),
    ABI_ROW(rlk_tensor),
    ABI_ROW(rlk_cache_entry),
    RLK_OP_LIST(RLK_OP_LIST_SKIP, ABI_ROW_OF_OP, RLK_OP_LIST_SKIP)
    ABI_ROW(rlk_tune_timing),
    ABI_ROW(rlk_tune_record),
};

size_t rlk_abi_struct_size(const char *name) {
  if (!name) return 0;
  for (size_t i = 0; i < sizeof abi_rows / sizeof abi_rows[0]; i++)
    if (!strcmp(abi_rows[i].name, name)) return abi_rows[i].size;
  return 0;
}
