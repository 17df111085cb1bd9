#!/usr/bin/env bash
# Session 17: prepared in session 16 (no device budget was left to run it). Issue 17's M >= 2048 target: the
# warp-specialized mixed-input GEMM experiment (benchmarks/kernels/ws_mixed_gemm.py), built for sm_90 on a CPU but
# never run. Run from the repository root on the device machine; the record of what ran goes at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers (tests, profile, rollout_table, grpo, phase_end).
#
#   phase a: bash benchmarks/gpu_session17.sh a   (one GPU; ~3 min)
#     ws_mixed_gemm.py: its output against the dense path's (relative error), then its time beside cuBLAS on BF16
#     weights and the dense path at M = 2048 / 4096 on the 7B gate / up, down and q / o shapes. A hang (a barrier
#     phase wrong) shows as the timeout.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    mkdir -p "$OUT/ws"
    (cd benchmarks/kernels && timeout -k 5 "${WS_S:-150}" "$PY" ws_mixed_gemm.py) > "$OUT/ws/run.log" 2>&1
    echo "== ws gemm rc=$? at $((SECONDS - T0)) s"; tail -n 30 "$OUT/ws/run.log"
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (nothing run yet)
