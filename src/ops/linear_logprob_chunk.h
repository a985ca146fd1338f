/* linear_logprob_chunk.h - how wide a vocabulary chunk rlk_linear_logprob_backward's sm_90a kernels
 * take when the call leaves it to them. */
#ifndef RLK_LINEAR_LOGPROB_CHUNK_H
#define RLK_LINEAR_LOGPROB_CHUNK_H

#include <stdint.h>

/* The backward's shape as the chunk choice sees it: N tokens, H hidden, V vocabulary; which
 * gradients are asked for; the device's multiprocessors (one persistent block each); the widest
 * chunk the workspace allows (a multiple of 256, at least 256). */
typedef struct rlk_ll_chunk_problem {
  int64_t N, H, V;
  int grad_hidden, grad_weight;
  int multiprocessors;
  int64_t widest;
} rlk_ll_chunk_problem;

/* The chunk width (a multiple of 256, from half the widest to the widest) that minimizes a model
 * of the sm_90a backward's time: each chunk launches dz (N x width, K = H), dh (N x H, K = width)
 * and dw (width x H, K = N) over 128 x 256 tiles, and a launch takes as long as its fullest
 * multiprocessor (whole waves of tiles, a tile's time its K), plus a fixed cost a launch. A chunk
 * whose tiles leave most multiprocessors idle in a launch's last wave loses to a narrower one
 * that fills them (on an H200 at N 8192, H 4096, V 151936: 16896 or 8448 columns, whose dz and dw
 * tiles are whole waves of 132, against 10240 or 12800). With no multiprocessor count known, the
 * widest cut evenly: the fewest chunks, of even widths. */
int64_t rlk_ll_bwd_sm90_chunk(const rlk_ll_chunk_problem *p);

#endif
