/* rlk_logprob_status.h - the bits the log-prob kernels (logprob, logprob_shard, linear_logprob and
 * the fused heads) OR into the caller's status word: include/rlk.h's RLK_LOGPROB_STATUS_* (the
 * op checks they agree). */
#ifndef RLK_LOGPROB_STATUS_H
#define RLK_LOGPROB_STATUS_H

enum {
  LP_STATUS_BAD_LABEL = 1,   /* a label outside the vocabulary that is not ignore_index */
  LP_STATUS_LABEL_OWNERS = 2, /* sharded: a label that two or more shards own */
  LP_STATUS_BAD_ROW = 4       /* a selected row outside hidden or not after the one before */
};

#endif
