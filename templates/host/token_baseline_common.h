/* token_baseline_common.h - what the host token_baseline kernels share (their template values:
 * templates/common/token_baseline_params.h). */
#ifndef RLK_TOKEN_BASELINE_COMMON_H
#define RLK_TOKEN_BASELINE_COMMON_H

#include <math.h>

#include "rlk_host_seq_mask.h"
#include "token_baseline_params.h"

typedef RLK_P_DTYPE tb_t;

#endif
