/* hopper_selftest_params.h - the arguments of the Hopper self-test kernels (templates/cuda/
 * hopper_selftest.cuh), filled by tests/test_hopper.c: a tile kernel's tensor maps of A and B and
 * its output D (f32, row-major); the box copy's map, output and the box's origin (row, column); the
 * instruction check's one map and output (it is compiled, never launched). */
#ifndef RLK_HOPPER_SELFTEST_PARAMS_H
#define RLK_HOPPER_SELFTEST_PARAMS_H

#include "rlk_params.h"

#define RLK_HT_TILE_PARAMS(F, S_)  \
  F(S_, rlk_tensor_map, map_a, 0)  \
  F(S_, rlk_tensor_map, map_b, 128) \
  F(S_, float *, D, 256)
RLK_PARAMS_DECLARE(ht_tile_args, RLK_HT_TILE_PARAMS, 320);

#define RLK_HT_BOX_PARAMS(F, S_) \
  F(S_, rlk_tensor_map, map, 0)  \
  F(S_, float *, out, 128)       \
  F(S_, int, row0, 136)          \
  F(S_, int, col0, 140)
RLK_PARAMS_DECLARE(ht_box_args, RLK_HT_BOX_PARAMS, 192);

#define RLK_HT_CHECK_PARAMS(F, S_) \
  F(S_, rlk_tensor_map, map, 0)    \
  F(S_, float *, out, 128)
RLK_PARAMS_DECLARE(ht_check_args, RLK_HT_CHECK_PARAMS, 192);

#endif
