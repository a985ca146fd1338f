/* rlk_host_labels.h - a host kernel's labels, of its label type RLK_P_LABELS (int32_t or
 * int64_t), read as indices. */
#ifndef RLK_HOST_LABELS_H
#define RLK_HOST_LABELS_H

#include "rlk_host_prelude.h"

/* Element i of labels. */
static inline rlk_i64 rlk_label_at(const void *labels, rlk_i64 i) { return (rlk_i64)((const RLK_P_LABELS *)labels)[i]; }

#endif
