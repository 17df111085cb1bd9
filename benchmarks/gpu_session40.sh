#!/usr/bin/env bash
# Session 40. Session 39's prepared phases, in its order: the 14B targets on the H200 with the sampler's kernels and
# the first 14B decode-step profile there (k), then issue 15's 7B actor update and the FP8 GPU tests not yet reached
# (l). Run from the repository root on the device machine; the record is at the end of this file.
#
#   phase k: bash benchmarks/gpu_session40.sh k   (no kind; ~9 min) -- session 39's phase k.
#   phase l: bash benchmarks/gpu_session40.sh l   (no kind; carry .dev/dg.tar.xz; ~10 min) -- session 39's phase l.
set -u
PHASE=${1:?phase}
case $PHASE in
k) exec bash benchmarks/gpu_session39.sh k ;;
l) exec bash benchmarks/gpu_session39.sh l ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease; raw under results/gpu_2026-11-28/s40/):
