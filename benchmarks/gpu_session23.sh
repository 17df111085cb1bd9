#!/usr/bin/env bash
# Session 23: issue 17's decode target (>= 80 % of HBM at 1..16 rows) -- a stream-K, TMA-fed, warp-specialized wgmma
# decode kernel (kernels/quarl_kernels/wgmma_stream.py: session 22's register-A design cut for decode; a loader warp,
# two consumer warpgroups decoding in x's natural k order, stages of four K steps, equal contiguous shares of the
# weight's (tile, K chunk) units per CTA, partials summed in slot order by the usual last pass).
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers.
#
#   phase a: bash benchmarks/gpu_session23.sh a   (one GPU; ~8 min)
#     a 90-s smoke of bench_wgmma_stream.py (one shape, 4 rows: a hang costs 90 s, not the call); the kernel's GPU
#     tests; then bench_wgmma_stream.py on the 7B / 14B shapes at 1, 2, 4, 8, 16 rows beside the routed kernels,
#     cuBLAS and a plain read.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    bench 90 smoke benchmarks/kernels/bench_wgmma_stream.py --shapes 18944x3584 --ms 4 --repeats 1
    if grep -q "^| 18944 x 3584 | 4 |" "$OUT/smoke/run.log"; then
        tests 200 tests/kernels/test_wgmma_stream_gpu.py
        bench "${BENCH_S:-300}" stream benchmarks/kernels/bench_wgmma_stream.py
    fi
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
