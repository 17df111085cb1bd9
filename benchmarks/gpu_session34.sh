#!/usr/bin/env bash
# Session 34. Issue 15 (Jet-RL): the 7B actor update is 1.477-1.511x BF16 + glue on the H100 (1.54x the target;
# ~0.6-1.4 ms a layer missing; run-to-run spread ~0.8 ms). Run from the repository root on the device machine; the
# record is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session34.sh a   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~8 min)
#     Session 33's prepared phase e, as written there: the staged SwiGLU kernel's UNTESTED_SETTINGS (X^T by 64-column
#     chunks) and its forward form -- their GPU bit tests, every one-launch SwiGLU candidate and both forward forms at
#     7B / 32B width (fp8_swiglu_bench.py), then the 7B actor update in three rounds (--repeat 3).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}

case $PHASE in
a)
    exec bash benchmarks/gpu_session33.sh e
    ;;
esac
source benchmarks/gpu_phase_lib.sh

case $PHASE in
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
