/* linear_divergence_plan.h - the cluster the sm_90a forward of rlk_linear_divergence runs its row
 * blocks in, from the device's shape. */
#ifndef RLK_OPS_LINEAR_DIVERGENCE_PLAN_H
#define RLK_OPS_LINEAR_DIVERGENCE_PLAN_H

#include <stdint.h>

#include "core/target.h"

/* Fewer row blocks than this run a block alone (what clusters do there is unmeasured; a cluster's
 * blocks of no rows weigh more). */
#define RLK_LD_SM90_CLUSTER_ROWS 32

/* The sm_90a forward's cluster (1, 2 or 4 row blocks of 128 rows) for a call of row_blocks on
 * target t. Quads (on an H100 at 4096 and 8192 rows, H 4096, V 151936: 0.88x and 0.83x the time
 * of blocks alone: a quad loads a weight tile once for four row blocks) unless the device's GPCs
 * keep fewer than 85 percent as many SMs busy in quads as in pairs (rlk_target.cluster_sms: a
 * cluster's blocks share a GPC, and GPCs differ in SM count from chip to chip), then pairs.
 * Measured at 8192 rows: an H100 keeping 120 SMs in quads and 132 in pairs ran the quads' forward
 * in 0.93x the pairs' time (a quad's SM did a tile in 0.84x a pair's time: the break-even); on an
 * H200 (its shapes not read then) the quads took 1.09x the pairs' time. Unknown shapes (0) keep
 * quads. Top-k (top_k != 0) runs pairs: its heaps' uneven work holds a cluster to its slowest
 * block (quads took 1.14x the time of pairs). */
int rlk_ld_sm90_fwd_cluster(const rlk_target *t, int64_t row_blocks, int top_k);

#endif
