#!/usr/bin/env bash
# The GPU part of the conformance work, for a CUDA machine without the trainers' packages: the
# policy loss, value loss, token KL and group advantage GPU cases (GSPO through the mean, GMPO, the clamp
# bound conventions, f64 token rewards) against the fp64 references that the CPU run of
# `make conformance` ties to verl, TRL and OpenRLHF. Build the tests first (make tests; a
# machine without clang can run a build made elsewhere).
set -euo pipefail
cd "$(dirname "$0")/../.."
export RLK_TEST_GPU=1 RLK_TEST_BIN_DIR="$PWD/build/bin"
for suite in policy_loss token_kl group_advantage; do
  CK_RUN_SUITE=$suite CK_RUN_CASE=gpu build/tests/check_rlk
done
