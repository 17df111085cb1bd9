#!/usr/bin/env bash
# Session 17: issue 17's two open kernel targets. Phase a was prepared in session 16 (no device budget was left to run
# it): the warp-specialized mixed-input GEMM experiment (benchmarks/kernels/ws_mixed_gemm.py), first run here; b the
# mma.sync decode kernel's cp.async ring; c-d every GPU test; e-f the dense path at large M; g-j the GEMM's variants.
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers (tests, profile, rollout_table, grpo, phase_end).
#
#   phase a: bash benchmarks/gpu_session17.sh a   (one GPU; ~3 min)
#     ws_mixed_gemm.py: its output against the dense path's (relative error), then its time beside cuBLAS on BF16
#     weights and the dense path at M = 2048 / 4096 on the 7B gate / up, down and q / o shapes. A hang (a barrier
#     phase wrong) shows as the timeout.
#   phase b: bash benchmarks/gpu_session17.sh b   (one GPU; ~8 min)
#     mma_decode's cp.async ring (configs 14-18): GPU tests, bench_mma_decode at 1 / 4 / 8 / 16 rows on the 7B and
#     14B weights with a plain read of each weight's bytes beside it, and the one-row GEMV with its read ceiling.
#   phases c, d: bash benchmarks/gpu_session17.sh c (then d)   (one GPU; up to ~10 min each)
#     the whole GPU test selection (`pytest -m gpu`: 724 tests at this commit) in two calls.
#   phase e: bash benchmarks/gpu_session17.sh e   (one GPU; ~3 min)
#     the dense path vs cuBLAS BF16 at 2048..16384 rows (bench_dense_chunks.py without chunks).
#   phase f: bash benchmarks/gpu_session17.sh f   (one GPU; ~5 min): e with the two arms alternating, 5 times a point.
#   phase g: bash benchmarks/gpu_session17.sh g   (one GPU; ~4 min): ws_mixed_gemm.py's six variants.
#   phase h: bash benchmarks/gpu_session17.sh h   (one GPU; ~2 min): its scale loads pipelined in the loader.
#   phase i: bash benchmarks/gpu_session17.sh i   (one GPU; ~2 min): 4 / 5 x stages at 256-token tiles.
#   phase j: bash benchmarks/gpu_session17.sh j   (one GPU; ~2 min): the same without the decode (a diagnostic).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    mkdir -p "$OUT/ws"
    (cd benchmarks/kernels && timeout -k 5 "${WS_S:-150}" "$PY" ws_mixed_gemm.py --variants v1) > "$OUT/ws/run.log" 2>&1
    echo "== ws gemm rc=$? at $((SECONDS - T0)) s"; tail -n 30 "$OUT/ws/run.log"
    ;;
b)  # the mma.sync decode kernel with a cp.async ring of words and scales (configs 14-18): tests, then the kernels at
    # 1..16 rows on the 7B / 14B weights beside the double-buffered configs, the GEMV (one row) and a plain read
    tests 170 tests/kernels/test_mma_decode_gpu.py -k "ring or pdl or graph or M8N512 or M1N384"
    mkdir -p "$OUT/mma"
    (cd benchmarks/kernels && timeout -k 5 300 "$PY" bench_mma_decode.py --out "$OUT/mma" --formats nvfp4 \
        --ms 1,4,8,16 --read-ceiling --shapes 18944x3584,3584x18944,3584x3584,512x3584,13824x5120,5120x13824) \
        > "$OUT/mma/run.log" 2>&1
    echo "== mma bench rc=$? at $((SECONDS - T0)) s"; grep -E "^nvfp4" "$OUT/mma/run.log"
    mkdir -p "$OUT/gemv"
    (cd benchmarks/kernels && timeout -k 5 100 "$PY" bench_gemv.py --out "$OUT/gemv" --formats nvfp4 --ms 1 \
        --read-ceiling) > "$OUT/gemv/run.log" 2>&1
    echo "== gemv bench rc=$? at $((SECONDS - T0)) s"; tail -n 12 "$OUT/gemv/run.log"
    ;;
c)  # every GPU test of the decode GEMM kernels at this commit (the ring of phase b removed)
    tests 570 tests/kernels/test_mma_decode_gpu.py tests/kernels/test_gemv_gpu.py tests/kernels/test_wgmma_decode_gpu.py \
        tests/kernels/test_wgmma_ring_gpu.py
    ;;
d)  # every other GPU test: fused glue, wo_gemm, epilogues, dense path, decode attention, FP8, the engine, onloading
    tests 570 tests/kernels/test_fused_gpu.py tests/kernels/test_wo_gemm_gpu.py tests/kernels/test_epilogue_gpu.py \
        tests/kernels/test_dense_gpu.py tests/kernels/test_decode_attn_gpu.py tests/kernels/test_fp8_quant_gpu.py \
        tests/kernels/test_fp8_gemv_gpu.py tests/kernels/test_token_logprob_gpu.py tests/engine/test_engine_gpu.py \
        tests/quant/test_fp8_linear.py tests/quant/formats/test_fp8.py tests/calibrate/test_onload.py
    ;;
e)  # the dense path against cuBLAS BF16 at the row counts the product runs at M >= 2048: training micro-batches
    # (8 x 768 = 6144 rows in the 7B GRPO step) and the engine's prefill chunks (up to 16384 rows)
    mkdir -p "$OUT/dense"
    (cd benchmarks/kernels && timeout -k 5 240 "$PY" bench_dense_chunks.py --out "$OUT/dense" \
        --ms 2048,4096,6144,8192,16384 --chunks 1000000) > "$OUT/dense/run.log" 2>&1
    echo "== dense rc=$? at $((SECONDS - T0)) s"; cat "$OUT/dense/run.log" | grep -v Warning
    ;;
f)  # phase e again with the arms alternating 5 times a point (medians): e's large-M ratios were not monotonic
    mkdir -p "$OUT/dense"
    (cd benchmarks/kernels && timeout -k 5 400 "$PY" bench_dense_chunks.py --out "$OUT/dense" \
        --ms 2048,4096,8192,16384 --chunks 1000000 --repeats 5) > "$OUT/dense/run.log" 2>&1
    echo "== dense rc=$? at $((SECONDS - T0)) s"; cat "$OUT/dense/run.log" | grep -v Warning
    nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active \
        --format=csv
    ;;
g)  # ws_mixed_gemm's variants (session 17): scales staged by the loader, no proxy fence after the word reads, a third
    # decoded stage, two MMA warpgroups on 256-token tiles; each checked against the float product, then timed. A hang
    # (a barrier wrong in the 8-warp default partition) shows as the timeout, after the variants that ran.
    mkdir -p "$OUT/ws"
    (cd benchmarks/kernels && timeout -k 5 "${WS_S:-240}" "$PY" ws_mixed_gemm.py \
        --variants v1,ssmem,ssmem-nofence,ssmem-nofence-d3,bm256,bm256-d3) > "$OUT/ws/run.log" 2>&1
    echo "== ws variants rc=$? at $((SECONDS - T0)) s"; cat "$OUT/ws/run.log"
    ;;
h)  # ws_mixed_gemm with the loader's scale loads 3 steps ahead (phase g's loader waited out one load a step)
    mkdir -p "$OUT/ws"
    (cd benchmarks/kernels && timeout -k 5 "${WS_S:-240}" "$PY" ws_mixed_gemm.py \
        --variants bm256,bm256-spf,bm256-spf-s4,bm128-spf) > "$OUT/ws/run.log" 2>&1
    echo "== ws variants rc=$? at $((SECONDS - T0)) s"; cat "$OUT/ws/run.log"
    ;;
i)  # ws_mixed_gemm: 4 and 5 x stages on 256-token tiles (phase h: the fourth stage gave 11-18 %), each twice
    mkdir -p "$OUT/ws"
    (cd benchmarks/kernels && timeout -k 5 "${WS_S:-240}" "$PY" ws_mixed_gemm.py \
        --variants bm256-s4,bm256-spf-s4,bm256-spf-s5,bm256-spf-s4,bm256-spf-s5) > "$OUT/ws/run.log" 2>&1
    echo "== ws variants rc=$? at $((SECONDS - T0)) s"; cat "$OUT/ws/run.log"
    ;;
j)  # diagnostic: ws_mixed_gemm with the decode replaced by one conversion (wrong results): is the decoder the bound?
    mkdir -p "$OUT/ws"
    (cd benchmarks/kernels && timeout -k 5 "${WS_S:-240}" "$PY" ws_mixed_gemm.py \
        --variants bm256-s4,bm256-s4-nodecode,bm256-s4,bm256-s4-nodecode) > "$OUT/ws/run.log" 2>&1
    echo "== ws variants rc=$? at $((SECONDS - T0)) s"; cat "$OUT/ws/run.log"
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (2026-11-26, one NVIDIA H100 80GB HBM3 per call, driver 580.159.04; raw: results/gpu_2026-11-26/s17/)
#   (phases a and g ran ws_mixed_gemm.py with no --variants when it had one / six variants; the lines above now
#   name them, so that a re-run times the same kernels)
#   a  commit b3ed6c0, 18 s: ws_mixed_gemm correct (rel. err 2.2-2.4e-3), 0.48-0.62x cuBLAS BF16 at M = 2048 / 4096
#      (dense path 0.85-0.98x in the same run).
#   b  commit 459e949, 103 s: the mma.sync cp.async ring (configs 14-18) slower at all 24 points (by 7-47 %); GPU
#      tests 39 passed, 4 failed (two test bugs: INT4 at K = 1088, not a multiple of its 128 block; and a graph
#      replay with new x compared against the old x's output) -- the ring was then removed (commit e076ede).
#   c  commit e076ede, 550 s: 433 passed, 1 skipped (MXFP4 at K = 1040).
#   d  commit e076ede, 403 s (warm): 282 passed, 8 skipped (DeepGEMM not built in this call).
#   e  commit d1484f2, 15 s: dense / cuBLAS 0.79-1.00x at 2048..16384 rows, one unpaired timing each (not monotonic).
#   f  commit df1879a, 27 s: alternating 5x, medians 0.82-0.89x at 2048, 0.93-0.95x at 4096,
#      0.91-0.99x at 8192, 0.96-0.98x at 16384 rows; SM clock 1980 MHz (max), no throttle reason.
#   g  commit 84c8018, 21 s: ws_mixed_gemm's variants, all correct (2.2-2.4e-3); best two MMA warpgroups on 256-token
#      tiles, 0.64-0.75x cuBLAS (v1 0.52-0.59x; the dense path 0.81-0.91x in the same run).
#   h  commit dad6b1b, 15 s: 256-token tiles with the loader's scale loads 3 steps ahead: alone +0-12 %, with a
#      fourth x stage 0.74-0.84x cuBLAS (dense 0.76-0.88x in the same call).
#   i  commit 2951162, 15 s: 4 stages with / without the scale prefetch, 5 stages: best 0.78-0.83x at 2048 rows,
#      0.74-0.77x at 4096 (dense 0.80-0.87x / 0.83-0.91x); a fifth stage no gain.
#   j  commit 75b802c, 16 s: without the decode 0.780-0.829x, with it 0.774-0.852x: the decoder is not
#      the bound.
#   Device time: ~1486 s held over nine machines' starts, counted at 50-67 %; 1046 s of budget left.
