#!/usr/bin/env bash
# Session 19: issue 17's decode target (>= 80 % of HBM at M = 1..16) -- is DRAM latency what holds the decode
# kernels at 44-66 % where a plain read of the same bytes reaches 80-85 %? A rolling L2 prefetch
# (kernels/quarl_kernels/l2_prefetch.py: each K step asks L2 for the words and scale bytes of the step l2_ahead
# ahead; GemvConfig / MmaDecodeConfig.l2_ahead) measured against the kernels without it.
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers (tests, profile, rollout_table, phase_end).
#
#   phase a: bash benchmarks/gpu_session19.sh a   (one GPU; ~6 min)
#     bench_l2_prefetch.py: the one-row GEMV and the mma.sync kernel (4 / 8 / 16 rows), default configs, l2_ahead 0 /
#     2 / 4 / 8, alternating 3 times, on the 7B gate / up, down, q / o and 14B gate / up, down weights, beside a plain
#     read of the same bytes; every variant bit-equal to l2_ahead 0 first. Then the GEMV and mma_decode GPU tests.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    mkdir -p "$OUT/l2"
    (cd benchmarks/kernels && timeout -k 5 "${BENCH_S:-400}" "$PY" bench_l2_prefetch.py --out "$OUT/l2") \
        > "$OUT/l2/run.log" 2>&1
    echo "== l2 prefetch bench rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/l2/run.log" | head -n 90
    grep -E "Error|error" "$OUT/l2/run.log" | head -n 5
    tests 170 tests/kernels/test_gemv_gpu.py tests/kernels/test_mma_decode_gpu.py -k "l2_ahead"
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------- record
