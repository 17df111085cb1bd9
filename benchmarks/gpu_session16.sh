#!/usr/bin/env bash
# Session 16 (2026-11-26): issue 17 -- programmatic dependent launch (kernels/quarl_kernels/pdl.py) for the decode
# step's Triton kernels: each kernel signals at once, the next one's programs take the SMs in its tail, and the
# one-row GEMV asks L2 for its weight slice before it waits for the kernel before (which wrote its x). Run from the
# repository root on the device machine; the record of what ran is at the end of this file. The phases use
# benchmarks/gpu_phase_lib.sh's helpers (tests, profile, rollout_table, grpo, phase_end).
#
#   phase a: bash benchmarks/gpu_session16.sh a   (one GPU; ~9 min)
#     GPU tests: chained norm -> GEMV -> pass launches with and without PDL bit-equal (eager, graph replays), the GEMV,
#     epilogue, fused-glue and decode-attention tests, the seeded 7B-shaped rollout at batch 1 (PDL on = off). Then
#     bench_gemv.py at one row on the 7B / 14B shapes with the read ceiling, PDL on and off.
#   phase b: bash benchmarks/gpu_session16.sh b   (one GPU; ~6 min)
#     After phase a (PDL made the small GEMVs and the read faster but the 7B gate / up GEMV 1.24x slower: every thread
#     along K issued its row's prefetch, 16 copies of each request): one request per row (split over K) or per
#     program (unsplit rows are one block). GPU tests (fewer than phase a's, which ran out of time); bench_gemv at one
#     row with PDL + prefetch, PDL without the prefetch (QUARL_KERNELS_PDL_PREFETCH=0), no PDL.
#   phase c: bash benchmarks/gpu_session16.sh c   (one GPU; ~6 min)
#     The decode-step profile at batch 1 / 8 (7B), BF16+LoRA and NVFP4+LoRA, with PDL, NVFP4 also :nopf and :nopdl,
#     BF16 also :nopdl.
#   phase d: bash benchmarks/gpu_session16.sh d   (one GPU; ~8 min)
#     After phases b-c (the prefetch slowed the large GEMV even alone; signalling first thing slowed the whole step:
#     small kernels' programs placed, crowded, in a long kernel's tail): no prefetch; each kernel waits first and the
#     GEMV / mma.sync / split-attention kernels signal after their loop (QUARL_KERNELS_PDL=late, the default), or
#     first thing (=early). GPU tests (chained launches late / early / off bit-equal, GEMV and mma.sync; the seeded
#     batch-1 7B rollout); bench_gemv at one row late / early / off; the batch 1 / 8 profile.
#   phase e: bash benchmarks/gpu_session16.sh e   (one GPU; ~9 min)
#     PDL (late) in the TMA-ring, wgmma and x-permutation kernels too: their GPU graph tests, the seeded 7B-shaped
#     rollout at batch 1 / 64 / 128 (PDL on = off, bit for bit); the batch-64 decode-step profile with and without.
#   phase f: bash benchmarks/gpu_session16.sh f   (one GPU; ~10 min)
#     The rollout table with this session's code: 7B and 14B, batch 1 / 8 / 64, 2048 new tokens, LoRA r32 on
#     both sides.
#   phase g: bash benchmarks/gpu_session16.sh g   (one GPU; ~4 min)
#     Issue 17's M >= 2048 target: bench_dense_chunks.py -- the dense path's decode in row chunks into one reused
#     scratch small enough for L2 (cuBLAS into column slices of y), against the dense path and cuBLAS on BF16.
#   phase h: bash benchmarks/gpu_session16.sh h   (one GPU; ~9 min)
#     The GPU tests of the other kernels that now take PDL (epilogue / group pass, norm / RoPE / SiLU, decode
#     attention) and the engine's; the 7B GRPO step with this session's code at 16 and 8 prompts x 8 answers.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

gemvbench() {  # SECONDS DIR PDL(0|late|early) ARGS...: bench_gemv.py -> $OUT/DIR
    local s=$1 d=$2 p=$3; shift 3
    mkdir -p "$OUT/$d"
    QUARL_KERNELS_PDL=$p timeout -k 5 "$s" "$PY" benchmarks/kernels/bench_gemv.py --out "$OUT/$d" "$@" \
        > "$OUT/$d/run.log" 2>&1
    echo "== gemv bench $d (PDL=$p) rc=$? at $((SECONDS - T0)) s"; grep -E "M= 1|hbm_copy" "$OUT/$d/run.log" | cut -c1-230
}

case $PHASE in
a)
    tests "${TEST_S:-230}" tests/kernels/test_gemv_gpu.py tests/kernels/test_epilogue_gpu.py \
        tests/kernels/test_fused_gpu.py tests/kernels/test_decode_attn_gpu.py \
        "tests/engine/test_engine_gpu.py::test_seeded_rollout_of_a_7b_shaped_model_is_reproducible[1]"
    gemvbench "${BENCH_S:-140}" gemv_pdl 1 --formats nvfp4 --ms 1 --read-ceiling
    gemvbench "${BENCH_S:-140}" gemv_nopdl 0 --formats nvfp4 --ms 1 --read-ceiling
    ;;
b)
    tests "${TEST_S:-250}" tests/kernels/test_gemv_gpu.py tests/kernels/test_epilogue_gpu.py \
        "tests/engine/test_engine_gpu.py::test_seeded_rollout_of_a_7b_shaped_model_is_reproducible[1]" \
        -k "pdl or deterministic or graph or reproducible or epilogue"
    gemvbench "${BENCH_S:-100}" gemv_pdl 1 --formats nvfp4 --ms 1 --read-ceiling
    QUARL_KERNELS_PDL_PREFETCH=0 gemvbench "${BENCH_S:-100}" gemv_nopf 1 --formats nvfp4 --ms 1 --read-ceiling
    gemvbench "${BENCH_S:-100}" gemv_nopdl 0 --formats nvfp4 --ms 1
    ;;
c)
    profile "${PROFILE_S:-420}" 7b bf16+lora32,bf16+lora32:nopdl,nvfp4+lora32,nvfp4+lora32:nopf,nvfp4+lora32:nopdl 1,8
    ;;
d)
    tests "${TEST_S:-200}" tests/kernels/test_gemv_gpu.py tests/kernels/test_mma_decode_gpu.py \
        "tests/engine/test_engine_gpu.py::test_seeded_rollout_of_a_7b_shaped_model_is_reproducible[1]" \
        -k "pdl or reproducible"
    gemvbench "${BENCH_S:-60}" gemv_late late --formats nvfp4 --ms 1 --read-ceiling
    gemvbench "${BENCH_S:-60}" gemv_early early --formats nvfp4 --ms 1 --read-ceiling
    gemvbench "${BENCH_S:-60}" gemv_off 0 --formats nvfp4 --ms 1 --read-ceiling
    profile "${PROFILE_S:-240}" 7b bf16+lora32,bf16+lora32:nopdl,nvfp4+lora32,nvfp4+lora32:earlypdl,nvfp4+lora32:nopdl 1,8
    ;;
e)
    tests "${TEST_S:-290}" tests/kernels/test_wgmma_ring_gpu.py tests/kernels/test_wgmma_decode_gpu.py \
        "tests/engine/test_engine_gpu.py::test_seeded_rollout_of_a_7b_shaped_model_is_reproducible" -k "graph or 7b_shaped"
    profile "${PROFILE_S:-250}" 7b bf16+lora32,bf16+lora32:nopdl,nvfp4+lora32,nvfp4+lora32:nopdl 64
    ;;
f)
    rollout_table "${TABLE_S:-570}" 7b,14b 1,8,64 table
    ;;
g)
    mkdir -p "$OUT/chunks"
    timeout -k 5 "${CHUNK_S:-240}" "$PY" benchmarks/kernels/bench_dense_chunks.py --out "$OUT/chunks" \
        > "$OUT/chunks/run.log" 2>&1
    echo "== dense chunks rc=$? at $((SECONDS - T0)) s"; grep -E "M=|Error" "$OUT/chunks/run.log" | cut -c1-260
    ;;
h)
    tests "${TEST_S:-230}" tests/kernels/test_epilogue_gpu.py tests/kernels/test_fused_gpu.py \
        tests/kernels/test_decode_attn_gpu.py tests/engine/test_engine_gpu.py -k "not 7b_shaped"
    grpo "${GRPO_S:-190}" grpo128 --prompts 16
    grpo "${GRPO_S:-140}" grpo64
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (one NVIDIA H100 80GB HBM3 per call, driver 580.159.04, torch 2.11.0+cu130, Triton 3.6.0)
#
# phase a (commit 531b1fa; 270 s, machine cold): GPU tests hit their 230 s limit after ~100
#   passed, none failed (test_gemv_gpu's full matrix is long). bench_gemv --formats nvfp4 --ms 1 --read-ceiling, us:
#   PDL on (first prefetch: one request per thread) / off -- q/o 3584x3584 6.87 / 7.90, k/v 512x3584 4.33 / 5.12,
#   gate/up 18944x3584 24.68 / 19.83, down 3584x18944 23.80 / 22.37; the read ceiling 3.16 / 4.67, 1.20 / 2.36,
#   15.02 / 16.40, 15.01 / 16.39 (with PDL a read of the 38.2 MB weight reaches 2543 GB/s, 85 % of the copy rate).
# phase b (commit 1562b3f; 166 s, a fresh machine): GPU tests 54 passed, 1 failed -- the GEMV chain test's check
#   that the 3584 x 3584 launch prefetched its scales (it is split over K there, and its scale rows are not 16-byte
#   slices: PF_S off); the 1024 x 1024 chain and the batch-1 7B rollout (PDL on = off) passed. bench_gemv us, PDL +
#   one-request prefetch / PDL without it / off: q/o 6.60 / 6.80 / 7.89, k/v 4.23 / 4.28 / 5.14, gate/up 23.26 /
#   19.19 / 19.80, down 23.40 / 21.81 / 22.35 (read ceiling with PDL 3.16, 1.19, 15.00, 15.01).
# phase c (same commit; 136 s): decode-step profile, 7B, ms at batch 1 / 8: BF16+LoRA 8.451 / 8.834 (PDL on the glue
#   kernels), :nopdl 8.446 / 8.893; NVFP4+LoRA 4.190 / 5.294 (PDL + prefetch), :nopf 3.807 / 5.287, :nopdl 3.215 /
#   4.363 -- PDL as built (signal first thing) made the 4-bit step 18-21 % slower. Log-prob mismatch unchanged.
# phase d (commit f03bfff; 261 s, an NVIDIA H200 this time, HBM copy 4212 GB/s): GPU tests 6 passed (the GEMV and
#   mma.sync chains late / early / off bit-equal, the batch-1 7B rollout PDL on = off). bench_gemv us late / early /
#   off: q/o 6.78 / 7.09 / 7.43, k/v 4.51 / 4.15 / 5.08, gate/up 17.31 / 17.29 / 17.90, down 19.60 / 19.02 / 20.39.
#   Profile, 7B, ms at batch 1 / 8: NVFP4+LoRA late 2.862 / 3.845, early 3.469 / 5.005, off 2.919 / 3.923 (GPU idle
#   0.035 / 0.046 late vs 0.153 / 0.189 off); BF16+LoRA 7.042 / 7.443 late vs 7.020 / 7.390 off.
# phase e (commit 6a012c1; 204 s, H100): GPU tests 6 passed (ring / wgmma graph tests, the seeded 7B rollout at batch
#   1 / 64 / 128, PDL on = off). Batch-64 profile, ms: NVFP4+LoRA 8.297 with PDL, 8.447 without (GPU idle 0.104 vs
#   0.391); BF16+LoRA 11.006 with, 10.863 without.
# phase f (6a012c1 or a later commit up to a47b194, no kernel change between; 360 s, H100): the rollout table,
#   step ms BF16+LoRA / NVFP4+LoRA: 7B batch 1 8.50 / 3.15
#   (2.70x), 8 8.96 / 4.24 (2.11x), 64 10.95 / 8.26 (1.33x); 14B 15.25 / 5.76 (2.65x), 16.29 / 7.81 (2.09x), 22.21 /
#   17.60 (1.26x). Log-probs vs the trainer (7B NVFP4+LoRA): mean 0.0545, max 0.2809.
# phase g (commit 216529f; 10 s, H100): bench_dense_chunks.py, us (x cuBLAS BF16): 18944x3584 M=2048 cuBLAS 371.3,
#   dense 409.9 (0.906x), row chunks of 1024 / 2048 / 4096: 0.767x / 0.830x / 0.819x; M=4096 0.921x dense, 0.889x /
#   0.915x / 0.912x; 3584x18944 M=2048 0.813x dense, 0.800x / 0.847x; M=4096 0.927x, 0.976x / 0.930x; 3584x3584
#   M=2048 0.910x, 0.866x / 0.977x; M=4096 0.984x, 0.983x / 1.033x; 27648x5120 M=2048 0.831x, 0.824x / 0.846x /
#   0.869x; M=4096 1.028x, 1.036x / 1.011x / 1.027x. Mixed, and nowhere >= 0.95x on the large weights at M=2048:
#   the narrower cuBLAS GEMMs lose what the chunks save. Not adopted.
# phase h (commit 516777d; 382 s, H100; the machine given back after it, 69 s of device budget left): GPU tests 146
#   passed (epilogue / group pass, fused norm / RoPE / SiLU, decode attention, engine). 7B GRPO step, steady step,
#   s rollout / log-prob / update / step: 16 prompts x 8 -- BF16+LoRA 7.12 / 3.29 / 21.77 / 32.18, NVFP4+LoRA 6.35 /
#   3.40 / 22.40 / 32.16 (0.999x; 1.024x in session 15); 8 prompts x 8 -- BF16+LoRA 5.71 / 1.64 / 10.81 / 18.16,
#   NVFP4+LoRA 4.44 / 1.69 / 11.21 / 17.35 (0.955x; 0.942x in session 14).
