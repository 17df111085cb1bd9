#!/usr/bin/env bash
# Session 20: issue 17's large-M target (>= 0.95x cuBLAS BF16 at M >= 2048, weight-only numerics). The dense path
# decodes each weight, then runs cuBLAS (0.80-0.89x at 2048 rows); kernels/quarl_kernels/dequant_ahead.py decodes the
# *next* weight of a chain on a side stream while the current GEMM runs. Does the decode hide behind the GEMM?
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers (tests, grpo, phase_end).
#
#   phase a: bash benchmarks/gpu_session20.sh a   (one GPU; ~4 min)
#     the dense path's and dequant_ahead's GPU tests; then bench_dequant_ahead.py: chains of 4 decoder layers' NVFP4
#     projections (7B and 14B width) at 2048 / 4096 / 8192 rows, forward and backward order: cuBLAS BF16, the dense
#     path without and with the side-stream decode, and both with cuBLAS leaving 8 / 16 SMs free (carveout).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

ahead() {  # DIR ARGS...: bench_dequant_ahead.py -> $OUT/DIR
    local d=$1; shift
    mkdir -p "$OUT/$d"
    (cd benchmarks/kernels && timeout -k 5 "${BENCH_S:-400}" "$PY" bench_dequant_ahead.py --out "$OUT/$d" "$@") \
        > "$OUT/$d/run.log" 2>&1
    echo "== bench_dequant_ahead $* rc=$? at $((SECONDS - T0)) s"; grep -E "^\||^ahead|^dense" "$OUT/$d/run.log"
    grep -E "Error|error" "$OUT/$d/run.log" | head -n 5
}

#   phase b: bash benchmarks/gpu_session20.sh b   (one GPU; ~4 min)
#     after a (the side-stream decode slows the chains: 0.38-0.98x; cuBLAS's tiles start late behind the decode's): the
#     GEMM on a high-priority stream and cuBLAS leaving 0 / 8 / 16 / 32 SMs to the decode while one is in flight
#     (QUARL_KERNELS_DENSE_AHEAD_PRIO / _SMS), the same chains; the knobs' GPU tests first.
#   phase c: bash benchmarks/gpu_session20.sh c   (one GPU; ~4 min)
#     b again with the carveout in force: torch applies it on its cuBLASLt route only (b's outputs were bit-equal with
#     and without it: not applied), so the carved GEMMs (and the BF16 reference of each carveout) run on cuBLASLt.
case $PHASE in
a)
    tests 150 tests/kernels/test_dense_gpu.py tests/kernels/test_dequant_ahead_gpu.py
    ahead ahead --carveouts 0,8,16
    ;;
b)
    tests 150 tests/kernels/test_dequant_ahead_gpu.py
    ahead prio --carveouts 0,8,16,32
    ;;
c)
    tests 150 tests/kernels/test_dequant_ahead_gpu.py
    ahead lt --carveouts 0,8,16,32
    ;;
esac
phase_end
