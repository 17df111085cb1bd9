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
#   phase e: bash benchmarks/gpu_session21.sh e   (one GPU; ~3 min)
#     the TMA ring's 128-row configs on blocked words (two [64, 8] boxes a step; only compile-tested before) against
#     row-major, decode and wide token tiles.
#   phase f: bash benchmarks/gpu_session21.sh f   (one GPU; ~2 min, what the device time left allows)
#     bench_blocked_configs.py --mma: the mma.sync kernel's candidates at 4 / 8 / 16 rows on both layouts (is another
#     tile than config 4 better on blocked words?), 7B gate/up and down.
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
e)
    tests 150 tests/kernels/test_blocked_gpu.py -k ring
    ;;
f)
    bench "${BENCH_S:-125}" mma benchmarks/kernels/bench_blocked_configs.py --mma --repeats 2 --shapes 18944x3584,3584x18944
    ;;
esac
phase_end
# ---- record of what ran (2026-11-27, one NVIDIA H100 80GB HBM3 each) ----
# phase a (commit 62a4efc; 386 s, ~418 s held, counted in full this session): session 20's phase l -- engine GPU tests
#   (compaction, shared prefill vs trainer, greedy vs HF, re-capture) on the final move_rows: 7 passed. The kernel GPU
#   suite as a baseline hit its 330 s limit at 30 % (no failure before it). Device after a: 1381 s of 1800 left.
# phase b (commit 790f49a; 299 s, ~783 s held in all): test_blocked_gpu.py + engine + ring GPU tests: 116 passed.
#   bench_decode_bound.py --blocked, row-major / blocked us: 7B gate/up 1 row 20.86 / 21.79, 4 24.29 / 21.97, 8 25.02 /
#   22.46, 16 31.11 / 28.64, 64 34.10 / 34.49, 2048 448.1 / 452.2; 7B down 8 rows 27.55 / 25.13; 14B gate/up 8 rows
#   26.47 / 23.70 (1.06-1.12x at 4..16 rows, 0.90-0.96x at 1, 0.99-1.04x at 64, 0.955-1.004x at 2048). Device after b:
#   1016 s left.
# phase c (commit c466e3e; 262 s, ~1107 s held): bench_blocked_configs.py stopped at 5120x13824 on gemv (64, 8) (blocked
#   != row-major, see d) after 3 shapes: the best one-row GEMV tile on blocked words 2-7 % behind the best on row-major;
#   the dense decode 88-89 % of HBM blocked vs 84-86 % row-major at [32, 16]. rollout_profile.py 7B step ms at batch 1 /
#   4 / 8 / 16 / 64: BF16+LoRA 8.495 / 8.731 / 8.875 / 9.294 / 11.010; NVFP4+LoRA row-major 3.140 / 4.097 / 4.254 / 5.135
#   / 8.283; blocked 3.571 / 3.813 / 4.002 / 4.954 / 8.274 (batch 1 +14 %: hence QUARL_KERNELS_BLOCKED=auto). Device
#   after c: 693 s left.
# phase d (commit f330e32; 286 s, ~1455 s held in all): test_blocked_gpu.py 33 passed. --check: every GEMV_CONFIGS
#   tile bit-equal on both shapes; the non-default (64, 8) tile one output of 5120 apart in its last bits at 5120x13824
#   (both 1.6819497e-3 from the float64 product). rollout_profile.py NVFP4+LoRA step ms, row-major / auto, batch 1 / 4 /
#   8 / 16: 7B 3.035 / 3.143, 4.102 / 3.858, 4.275 / 4.039, 5.162 / 4.944; 14B 5.689 / 5.705, 7.286 / 6.777, 7.730 /
#   7.255, 9.630 / 9.247. Machine given back; device after d: 342 s of 1800 left.
# phase e (commit 15633cf; 23 s, ~1515 s held in all): test_blocked_gpu.py -k ring: 4 passed (the
#   ring at 64 / 128 rows a CTA, decode and wide token tiles, 1600 rows: bit-equal on blocked words). Machine given
#   back; device after e: 285 s of 1800 left.
# phase f (commit 5a3e4de; 26 s, ~1574 s held in all): bench_blocked_configs.py --mma, 2 alternating repeats, us row-major
#   / blocked: the default (config 4, 128 rows x 16 words, no register prefetch) is the fastest candidate on blocked
#   words at every point -- 7B gate/up 4 / 8 / 16 rows 24.33 / 21.96, 24.85 / 22.38, 31.08 / 28.47; down 26.98 / 24.75,
#   27.56 / 25.10, 26.57 / 25.08; (256 x 8) gains most from blocks (1.22-1.26x at 4-8 rows) but stays slower than it.
#   The defaults stand. Machine given back; device after f: ~220 s of 1800 left.
