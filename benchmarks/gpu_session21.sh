#!/usr/bin/env bash
# Session 21: issue 17's decode lever from session 19 -- a blocked in-memory layout of the packed words
# ([N / 64, KW / 8, 64, 8] int32 words, docs/kernels.md "A blocked in-memory layout"), read by every kernel that
# reads packed words, converted once when a model goes onto the GPU and back when it is saved.
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers.
#
#   phase a: bash benchmarks/gpu_session21.sh a   (commit a7cec0e + this script; one GPU; ~6 min)
#     session 20's phase l (the engine's compaction / shared prefill / greedy GPU tests on the final move_rows code),
#     then every kernel GPU test as the baseline before the layout change.
#   phase b: bash benchmarks/gpu_session21.sh b   (one GPU; ~9 min)
#     the blocked layout's GPU tests (every kernel bit-equal on blocked words, the engine's rollout and the trainer's
#     forward unchanged, state_dict row-major), the engine's and the TMA ring's GPU tests; then bench_decode_bound.py
#     --blocked: wo_matmul on row-major against blocked words at 1 / 4 / 8 / 16 / 64 / 2048 rows, 7B and 14B shapes.
#   phase c: bash benchmarks/gpu_session21.sh c   (one GPU; ~8 min)
#     bench_blocked_configs.py: the one-row GEMV's candidates and the dense decode's tiles on both layouts (phase b had
#     the GEMV 0.90-0.96x and the dense path 0.96-0.99x on blocked words); rollout_profile.py 7B decode step at batch
#     1 / 4 / 8 / 16 / 64: BF16+LoRA, NVFP4+LoRA row-major (:rowmajor), NVFP4+LoRA blocked.
#   phase d: bash benchmarks/gpu_session21.sh d   (one GPU; ~6 min)
#     the engine now lays the words out per call (QUARL_KERNELS_BLOCKED=auto: blocked from 2 rows, row-major at 1 --
#     phase c's 7B batch-1 step was 14 % slower blocked); test_blocked_gpu.py; bench_blocked_configs.py --check (phase
#     c stopped on gemv (64, 8) at 5120x13824: blocked != row-major -- which one is off?); rollout_profile.py 7B and
#     14B, NVFP4+LoRA row-major (:rowmajor) vs auto, batch 1 / 4 / 8 / 16.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    tests 200 tests/engine/test_engine_gpu.py -k "compaction or matches_trainer or greedy_equals_hf or recapture"
    mv "$OUT/tests" "$OUT/tests_engine"
    tests 330 tests/kernels
    ;;
b)
    tests 300 tests/kernels/test_blocked_gpu.py tests/engine/test_engine_gpu.py tests/kernels/test_wgmma_ring_gpu.py
    bench "${BENCH_S:-240}" blocked benchmarks/kernels/bench_decode_bound.py --blocked --ms 1,4,8,16,64,2048 \
        --shapes 18944x3584,3584x18944,3584x3584,13824x5120 --repeats 3
    ;;
c)
    bench "${BENCH_S:-230}" configs benchmarks/kernels/bench_blocked_configs.py --repeats 3
    profile "${PROF_S:-300}" 7b bf16+lora32,nvfp4+lora32:rowmajor,nvfp4+lora32 1,4,8,16,64
    ;;
d)
    tests 150 tests/kernels/test_blocked_gpu.py
    bench 60 check benchmarks/kernels/bench_blocked_configs.py --check --shapes 5120x13824,13824x5120
    grep -v '"equal": true' "$OUT/check/run.log" | head -n 20
    profile "${PROF_S:-330}" 7b,14b nvfp4+lora32:rowmajor,nvfp4+lora32 1,4,8,16
    ;;
esac
phase_end
# ---- record of what ran (2026-11-27, one NVIDIA H100 80GB HBM3 each) ----
