#!/usr/bin/env bash
# Session 19: issue 17's decode target (>= 80 % of HBM at M = 1..16) -- is DRAM latency what holds the decode
# kernels at 44-66 % where a plain read of the same bytes reaches 80-85 %? A rolling L2 prefetch
# (kernels/quarl_kernels/l2_prefetch.py: each K step asks L2 for the words and scale bytes of the step l2_ahead
# ahead; GemvConfig / MmaDecodeConfig.l2_ahead) measured against the kernels without it.
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers (tests, profile, rollout_table, phase_end).
#
#   phase a: bash benchmarks/gpu_session19.sh a   (commit 1f91051; one GPU; ~3 min)
#     bench_l2_prefetch.py: the one-row GEMV and the mma.sync kernel (4 / 8 / 16 rows), default configs, l2_ahead 0 /
#     2 / 4 / 8, alternating 3 times, on the 7B gate / up, down, q / o and 14B gate / up, down weights, beside a plain
#     read of the same bytes; every variant bit-equal to l2_ahead 0 first. Then the GEMV and mma_decode GPU tests.
#   phase b: bash benchmarks/gpu_session19.sh b   (commit 0e437fa; one GPU; ~3 min)
#     the prefetch removed; instead the loads' cache policy (GemvConfig / MmaDecodeConfig.wload: 1 the words and scale
#     bytes .cg, L2 only; 2 the same L1 evict-first; 3 as 1 and x L1 evict-last) -- does the streamed weight evict the
#     reused x from L1? bench_decode_loads.py (phase a's bench, wload 0..3), then the wload GPU tests.
#   phase c: bash benchmarks/gpu_session19.sh c   (commit d0862d8; one GPU; ~1 min)
#     the cache-policy knob removed; instead a diagnostic (GemvConfig / MmaDecodeConfig.diag, wrong results by design):
#     1 the decode replaced by one bitcast / conversion a word, 2 (GEMV) also no FFMAs and no x -- which part of the
#     loop holds the kernels below the plain read? bench_decode_bound.py (diag 0 checked against float64 first).
#   phase d: bash benchmarks/gpu_session19.sh d   (commit 9878ba6; one GPU; ~1 min)
#     after c (the GEMV's loop alone streams at 63-70 %): the one-row GEMV's work split -- rows x K words a step, a
#     row's contiguous run 128 B .. 2 KB a step -- real and as its loop alone (diag 2), on the 7B / 14B MLP weights
#     (bench_decode_bound.py --gemv-sweep).
#   phase e: bash benchmarks/gpu_session19.sh e   (commit 05767e0; one GPU; ~1 min)
#     the words pre-tiled (gemv.tile_words: each kernel step's [rows, K words] tile one contiguous block, diag + 4):
#     the default configs at 1 / 4 / 8 / 16 rows and the GEMV's loop alone, tiled against as they are (the tiled
#     outputs bit-equal to the untiled ones first) -- bench_decode_bound.py --tiled.
#   phase f: bash benchmarks/gpu_session19.sh f   (commit 96e2123; one GPU; ~2 min)
#     what the tiled words would give the engine's decode step: rollout_profile.py, 7B, LoRA r32 fp32 adapters,
#     batch 4 / 8 / 16, BF16+LoRA, NVFP4+LoRA and NVFP4+LoRA:tiled (an experiment in the bench: every FP4 layer's words
#     tiled in place, the mma.sync launches reading them tiled; step times only -- tokens mean nothing there).
#   phase g: bash benchmarks/gpu_session19.sh g   (commit d7b2ac9; one GPU; ~1 min)
#     one block shape for every kernel? bench_decode_bound.py --blocks on the 7B / 14B MLP weights: the mma.sync kernel
#     at 4 / 8 / 16 rows on row-major words, its own [128, 16] blocks and [64, 8] blocks; the TMA ring (the default at
#     32 / 64 rows, the wide tiles at 128) on row-major words and [64, 8] blocks -- its step.
#   phase h: bash benchmarks/gpu_session19.sh h   (commit bdb79ba; one GPU; ~3 min)
#     phase f at 14B: rollout_profile.py 14B, batch 4 / 8 / 16, BF16+LoRA, NVFP4+LoRA and NVFP4+LoRA:tiled.
#   phase i: bash benchmarks/gpu_session19.sh i   (commit d2fc76c; one GPU; ~4 min)
#     the engine run session 14 left for its two wgmma_decode rules on small weights (rollout_profile.py :wgrules:
#     14B k / v at 33..64 rows on wgmma_decode, 14B q / o at 17..32 rows on its config 1): 7B (a control -- no 7B
#     weight changes route) and 14B, batch 32 / 64, BF16+LoRA, NVFP4+LoRA, NVFP4+LoRA:wgrules.
#   phase j: bash benchmarks/gpu_session19.sh j   (commit b751615; one GPU; ~5 min)
#     after i, the two rules in wgmma_decode (NVFP4: MID_MIN_WEIGHTS at 33..64 rows, config 1 at 17..32 rows from
#     N = 4096): the GPU tests of wgmma_decode (every case, and the 14B-shaped routing), the decode dispatch and the
#     engine; then the 14B profile at 32 / 64 rows with the rules as shipped and :nowgrules (the before).
#   phase k: bash benchmarks/gpu_session19.sh k   (commit 8fd32ee; one GPU; ~2 min)
#     the final code (the rules' thresholds narrowed to the measured shapes): wgmma_decode's dispatch GPU tests and
#     the decode kernels' PDL-chain tests (GEMV, mma.sync: their kernels carry the diagnostic constexpr).
#   phase l: bash benchmarks/gpu_session19.sh l   (one GPU; ~2 min)
#     phase g's question for the mid-size weights: [64, 8] word blocks on 14B q / o, 14B k / v and 7B q / o at 8 / 32 /
#     64 rows -- the mma.sync kernel, wgmma_decode (diag 8) or the ring, whichever wo_matmul runs there.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

bound() {  # DIR ARGS...: bench_decode_bound.py -> $OUT/DIR (phases c-e)
    local d=$1; shift
    mkdir -p "$OUT/$d"
    (cd benchmarks/kernels && timeout -k 5 "${BENCH_S:-420}" "$PY" bench_decode_bound.py --out "$OUT/$d" "$@") \
        > "$OUT/$d/run.log" 2>&1
    echo "== bench_decode_bound $* rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/$d/run.log" | head -n 90
    grep -E "Error|error" "$OUT/$d/run.log" | head -n 5
}

legacy() {  # DIR SCRIPT TESTS_K: phases a / b -- a bench removed after its call (run it at the commit named), its tests
    local d=$1 script=$2 k=$3
    mkdir -p "$OUT/$d"
    (cd benchmarks/kernels && timeout -k 5 "${BENCH_S:-400}" "$PY" "$script" --out "$OUT/$d") > "$OUT/$d/run.log" 2>&1
    echo "== $script rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/$d/run.log" | head -n 90
    tests 170 tests/kernels/test_gemv_gpu.py tests/kernels/test_mma_decode_gpu.py -k "$k"
}

case $PHASE in
a)  # at commit 1f91051
    legacy l2 bench_l2_prefetch.py l2_ahead
    ;;
b)  # at commit 0e437fa
    legacy loads bench_decode_loads.py wload
    ;;
c)
    bound bound
    ;;
d)
    bound sweep --gemv-sweep --shapes 18944x3584,3584x18944,13824x5120,5120x13824
    ;;
e)
    bound tiled --tiled
    ;;
f)
    profile "${PROF_S:-430}" 7b bf16+lora32,nvfp4+lora32,nvfp4+lora32:tiled 4,8,16
    ;;
h)
    profile "${PROF_S:-540}" 14b bf16+lora32,nvfp4+lora32,nvfp4+lora32:tiled 4,8,16
    ;;
i)
    profile "${PROF_S:-560}" 7b,14b bf16+lora32,nvfp4+lora32,nvfp4+lora32:wgrules 32,64
    ;;
l)
    bound blocks2 --blocks --ms 8,32,64 --shapes 5120x5120,1024x5120,3584x3584
    ;;
k)
    tests 300 tests/kernels/test_wgmma_decode_gpu.py tests/kernels/test_gemv_gpu.py tests/kernels/test_mma_decode_gpu.py \
        -k "wo_matmul or pdl or graph or portable or split_k"
    ;;
j)
    tests 300 tests/kernels/test_wgmma_decode_gpu.py tests/engine/test_engine_gpu.py -k "nvfp4 or wo_matmul or engine or generat"
    profile "${PROF_S:-260}" 14b nvfp4+lora32,nvfp4+lora32:nowgrules 32,64
    ;;
g)
    bound blocks --blocks --ms 4,8,16,32,64,128 --shapes 18944x3584,3584x18944,13824x5120,5120x13824
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------- record
# All calls on one NVIDIA H100 80GB HBM3 (driver 580.159.04), 2026-11-26/27, torch 2.11.0+cu130, Triton 3.6.0.
# phase a (commit 1f91051; 139 s, ~178 s held at 67 %): bench_l2_prefetch.py, us per call (x the kernel without the
#   prefetch), PDL late: the prefetch is slower at every point and distance, the more so the farther ahead --
#   one-row GEMV 7B gate / up 20.92 -> 30.05 / 33.65 / 41.26 us at l2_ahead 2 / 4 / 8 (x0.70 / 0.62 / 0.51), 7B down
#   21.53 -> 32.20 / 37.22 / 48.27, 14B down 20.94 -> 36.42 (x0.58); mma.sync 4-16 rows x0.75-0.93 at 2, x0.60-0.76
#   at 8; plain read of the same bytes 15.9-16.5 us (80-82 % of the copy rate) on the large weights, 4.1 us (59 %) on
#   q / o. GPU tests (l2_ahead bit-equal to without, GEMV and mma.sync, NVFP4 / INT4): 8 passed.
# phase b (commit 0e437fa; 164 s, ~379 s held at 67 %): bench_decode_loads.py, us per call (x plain loads): the
#   cache policy moves nothing -- .cg words (L2 only) x0.95-1.01, L1 evict-first words x0.88-1.02 (slower on the
#   mma.sync kernel), .cg words + x evict-last x0.95-1.00; one-row GEMV 7B gate / up 20.87 us (61 % of the copy rate),
#   down 21.51 (60 %); mma.sync 8 rows 24.99 / 27.65, 16 rows 31.08 / 26.60; plain read 15.9-16.5 us (80-82 %).
#   GPU tests (every wload bit-equal to plain loads): 12 passed. Device after b: 1544 s of 1800 left.
# phase c (commit d0862d8; 27 s, ~453 s held in all): bench_decode_bound.py, us per call (x the real kernel): the
#   one-row GEMV with its decode replaced by a bitcast x0.97-1.11, with the decode, x and the FFMAs all dropped (its loop
#   as a plain read) x1.05-1.23 -- 19.55 / 20.24 / 18.99 / 20.01 us on 7B gate/up, 7B down, 14B gate/up, 14B down
#   (63-70 % of the copy rate) where a plain read of the same bytes takes 15.9-16.4 us (80-82 %); mma.sync 4 / 8 rows
#   without the decode x1.09-1.12, 16 rows x0.97-1.02. So the decode is ~10 % of the time; the loop's access pattern
#   caps the kernels near 65-70 %. Device after c: 1495 s of 1800 left.
# phase d (commit 9878ba6; 33 s, ~536 s held in all): bench_decode_bound.py --gemv-sweep, one-row GEMV us per call,
#   real / its loop alone (diag 2), % of the copy rate in brackets. 7B gate / up (read 15.96 us, 80 %): BN64xBK256
#   (config 0, the default) 20.95 (61) / 19.54 (65); BN32xBK512 (config 7) 19.34 (66) / 17.91 (71); BN8xBK2048 26.26
#   / 17.93 (71); BN4xBK4096 29.42 / 17.13 (75); BN8xBK2048 with the register prefetch 27.25 / 16.91 (76). 7B down: the
#   default (config 7) 21.57 (59) / 20.22 (63); best loop BN4xBK4096 18.85 (68), real 27.29. 14B: best loops 17.38-17.56
#   us (76 %) with real kernels at 21.87-25.63. Longer runs of a row bring the loop alone to 71-76 % (from 63-70 %) but
#   the real kernel loses 30-130 % there: each thread then holds more distinct x (up to 168 registers against 119).
#   Device after d: 1439 s of 1800 left.
# phase e (commit 05767e0; 27 s, ~596 s held in all): bench_decode_bound.py --tiled, us per call (x the untiled
#   kernel), the tiled outputs bit-equal: the mma.sync kernel's default (128 rows x 16 words a step, 64-byte runs of a
#   row) with each step one contiguous 8 KB block -- 4 / 8 rows x1.17-1.22 on the 7B / 14B MLP weights (7B gate / up 8
#   rows 25.21 -> 21.21 us, 51 -> 61 % of the copy rate; 14B down 28.46 -> 23.41, 47 -> 57 %), 16 rows x1.09-1.11,
#   q / o x1.02-1.09; the one-row GEMV x0.96-0.99 (its runs are 128-256 B already), its loop alone x1.00-1.03.
#   Device after e: 1399 s of 1800 left.
# phase f (commit 96e2123; 128 s, ~757 s held in all): rollout_profile.py 7B, LoRA r32 fp32, context 1026..1109,
#   decode step ms (graphed loop) at batch 4 / 8 / 16: BF16+LoRA 8.773 / 8.895 / 9.290; NVFP4+LoRA 4.112 / 4.293 /
#   5.168 (2.13x / 2.07x / 1.80x); NVFP4+LoRA with the words tiled for the mma.sync kernel 3.777 / 3.925 / 4.862
#   (2.32x / 2.27x / 1.91x: -8.1 / -8.6 / -5.9 %; down 0.872 -> 0.754 ms and the q/k/v + gate/up group launches
#   ("unattributed") 1.865 -> 1.597 ms at batch 8). generate() check at batch 8: 5.182 / 4.579 ms against the loop's
#   4.293 / 3.925 (one timed call; batch 4 and BF16 agree within 1.5 %). Device after f: 1291 s of 1800 left.
# phase g (commit d7b2ac9; 29 s, ~819 s held in all): bench_decode_bound.py --blocks, us per call (x row-major), every
#   tiled output bit-equal: mma.sync at 4 / 8 rows x1.17-1.21 with its own [128, 16] blocks and x1.17-1.20 with
#   [64, 8] blocks, at 16 rows x1.09-1.12 / x1.07-1.10 (7B gate / up 8 rows 24.98 -> 21.21 / 21.01 us); the TMA ring
#   reading [64, 8] blocks (its step) x0.96-0.99 at 32 rows, x0.99-1.01 at 64, x1.00 at 128 (wide tiles): TMA's
#   strided boxes lose nothing to the row-major layout. Device after g: 1250 s of 1800 left.
# phase h (commit bdb79ba; 179 s, ~1031 s held in all): rollout_profile.py 14B, LoRA r32 fp32, decode step ms at
#   batch 4 / 8 / 16: BF16+LoRA 15.819 / 16.255 / 17.093; NVFP4+LoRA 7.287 / 7.769 / 9.687 (2.17x / 2.09x / 1.76x);
#   NVFP4+LoRA with tiled words 6.849 / 7.344 / 9.092 (2.31x / 2.21x / 1.88x: -6.0 / -5.5 / -6.1 %). generate() check
#   within 2-7 % of the loop. Device after h: 1038 s of 1800 left.
# phase i (commit d2fc76c; 217 s, ~1282 s held in all): rollout_profile.py, decode step ms at batch 32 / 64 (graphed
#   loop): 7B BF16+LoRA 9.669 / 10.985, NVFP4+LoRA 6.625 / 8.203, :wgrules 6.615 / 8.208 (no 7B weight re-routes: the
#   control); 14B BF16+LoRA 18.865 / 22.012, NVFP4+LoRA 13.598 / 17.736, :wgrules 13.090 / 17.470 (-3.7 % / -1.5 %:
#   q/k/v 2.243 -> 1.993 and o 1.059 -> 0.824 ms at 32, q/k/v 2.503 -> 2.374 at 64). Log-prob checks identical (batch
#   8: other kernels). Device after i: 786 s of 1800 left.
# phase j (commit b751615; 255 s, ~1568 s held in all): GPU tests of wgmma_decode (NVFP4 cases, wo_matmul dispatch incl.
#   the 14B-shaped routing) and the engine: 42 passed. rollout_profile.py 14B NVFP4+LoRA, step ms (graphed-kernel sum)
#   at batch 32 / 64: the rules as shipped 12.439 (12.868) / 17.574 (17.565), :nowgrules 13.551 (13.392) / 17.769
#   (17.624). Device after j: 500 s of 1800 left.
# phase k (commit 8fd32ee; 140 s, ~1741 s held in all, this machine counted at 50 %): GPU tests at the final code --
#   wgmma_decode's dispatch (incl. the 14B-shaped routes against float64), the GEMV's and mma.sync's PDL-chain, graph,
#   split-K and portable-decode tests: 34 passed, 0 failed. Device after k: 414 s of 1800 left.
# phase l (commit f67006f; 23 s, ~1797 s held in all, counted at 50 %): bench_decode_bound.py --blocks on mid-size
#   weights, us (x row-major), every tiled output bit-equal: mma.sync at 8 rows 14B q / o 13.23 -> 12.14 ([64, 8]
#   blocks, x1.09), 7B q / o 9.68 -> 8.80 (x1.10), 14B k / v (config 1, 256-byte runs) 7.80 -> 7.89 (x0.99);
#   wgmma_decode at 32 rows 14B q / o 15.85 -> 15.32 (x1.03), 7B q / o 11.52 -> 11.37 (x1.01), at 64 rows 14B k / v
#   10.42 -> 10.20 (x1.02); the ring at 64 rows on q / o x1.03. Device after l: 386 s of 1800 left.
