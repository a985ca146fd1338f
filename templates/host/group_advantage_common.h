/* group_advantage_common.h - pieces the host group_advantage kernels share (their template
 * values: templates/common/group_advantage_params.h). */
#ifndef RLK_GROUP_ADVANTAGE_COMMON_H
#define RLK_GROUP_ADVANTAGE_COMMON_H

#include "rlk_host_seq_mask.h"
#include "group_advantage_params.h"

#endif
