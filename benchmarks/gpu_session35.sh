#!/usr/bin/env bash
# Session 35. Issue 15 (Jet-RL): the 7B actor update is 1.482-1.519x BF16 + glue on the H100 (1.54x the target;
# ~0.3-0.6 ms a layer missing, run-to-run spread ~0.8 ms). Run from the repository root on the device machine; the
# record is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session35.sh a   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~8 min)
#     Session 34's prepared phase e, as written there: the staged plain-activation quantizer's GPU bits and times, one
#     profiled 7B update (with QUARL_FP8_STAGED_ACT=1 when the bits held), DeepGEMM's build packed for later calls.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}

case $PHASE in
a)
    exec bash benchmarks/gpu_session34.sh e
    ;;
esac
source benchmarks/gpu_phase_lib.sh

phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
