#!/usr/bin/env bash
# Session 39. Session 38's prepared phases, in its order: the fused sampler's GPU tests and whether it pays (g, h),
# then the GPU tests session 37's splits' calls did not reach and the 7B actor update after fp8_linear's split (e).
# Run from the repository root on the device machine; the record is at the end of this file.
#
#   phase g: bash benchmarks/gpu_session39.sh g   (no kind; ~9 min) -- session 38's phase g.
#   phase h: bash benchmarks/gpu_session39.sh h   (g's machine, warm; ~9 min) -- session 38's phase h.
#   phase e: bash benchmarks/gpu_session39.sh e   (no kind; carry .dev/dg.tar.xz; ~9 min) -- session 38's phase e.
set -u
PHASE=${1:?phase}
case $PHASE in
g) exec bash benchmarks/gpu_session38.sh g ;;
h) exec bash benchmarks/gpu_session38.sh h ;;
e) exec bash benchmarks/gpu_session38.sh e ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease; raw under results/gpu_2026-11-28/s39/):
