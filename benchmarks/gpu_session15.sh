#!/usr/bin/env bash
# Session 15 (2026-11-26): issue 17 above 64 rows -- the TMA-ring kernel with wide token tiles (128 / 256 rows a CTA,
# a third grid axis over token tiles) for rollouts of 128-256 sequences and the bottom of prefill, where wo_matmul runs
# the Triton tensor-core kernel (M = 65..255, 0.4-0.7x cuBLAS) or the dense path (M >= 256). Run from the repository
# root on the device machine; the record of what ran is at the end of this file. The phases use
# benchmarks/gpu_phase_lib.sh's helpers (tests, profile, rollout_table, grpo, deepgemm, model_step, phase_end).
#
#   phase a: bash benchmarks/gpu_session15.sh a   (one GPU; ~9 min)
#     The ring's GPU tests (wide token tiles included); bench_ring_wide.py: every WIDE_CONFIGS entry beside wo_matmul's
#     dispatch, the dense path and cuBLAS BF16 on the 7B / 14B projections at M = 96..2048.
#   phase b: bash benchmarks/gpu_session15.sh b   (one GPU; ~7 min)
#     After phase a (wide tiles beat cuBLAS at 96-128 rows on the large weights, 0.6-0.8x at 192-256; a partial last
#     token tile slower than two full ones): x padded to whole token tiles, and two warpgroups a CTA sharing each x
#     stage (rows = 128, warps = 8: half the x traffic from L2 per weight row). GPU tests; the sweep at 96..512 rows.
#   phase c: bash benchmarks/gpu_session15.sh c   (one GPU; ~8 min)
#     The wide tiles on by default (ring-R64S3W2T128 for 65..384 rows; x padded to whole tiles at every M): the ring and
#     wo_gemm GPU tests, the seeded 7B-shaped rollout at batch 64 and 128 (reproducible?), and the 7B decode-step
#     profile at batch 128 / 256: BF16+LoRA, NVFP4+LoRA, NVFP4+LoRA:nowide (before).
#   phase e: bash benchmarks/gpu_session15.sh e   (one GPU; ~6 min)
#     Phase c's profile stopped in the first NVFP4 prefill (128 x 1024 prompt tokens in one pass: the gate / up
#     output passed 2**31 elements, an illegal address in the epilogue's int32 row offsets) and BF16 at 256 x 1024
#     ran out of memory in its prefill. Now the engine prefills max_num_batched_tokens (16384) tokens at a time and
#     the epilogue indexes rows in int64: the engine GPU tests, then phase c's profile again.
#   phase d: bash benchmarks/gpu_session15.sh d   (one GPU; ~8 min)
#     The rollout table at batch 128 / 256, 7B, 2048 new tokens, LoRA on both sides; the 14B decode-step profile at
#     batch 128 (its BF16 KV cache for 2048 new tokens does not fit beside the BF16 weights).
#   phase f: bash benchmarks/gpu_session15.sh f   (one GPU; ~4 min)
#     The wide tiles' loop is latency-bound at 3 CTAs an SM (136 registers, 72 KB of shared memory): 2 stages (53 KB)
#     with the registers capped at 128 (maxnreg; spills outside the loop only) fit 4. GPU tests; the sweep at 96..512
#     rows: the default beside R64 S2 with and without the cap.
#   phase g: bash benchmarks/gpu_session15.sh g   (one GPU; ~5 min)
#     The ring's GPU tests after their merge into one parametrized test (the padded / unpadded and per-tile checks now
#     on the decode tiles too); the batch-64 rollout table (7B) with this session's code (x padded, chunked prefill).
#   phase h: bash benchmarks/gpu_session15.sh h   (one GPU; ~7 min)
#     Batches sized by free memory (max_batch_size=None): the engine GPU tests; the 14B rollout table at batch 128
#     (2048 new tokens), whose BF16 side did not fit one batch (phase d): now two of 64, NVFP4 one of 128.
#   phase i: bash benchmarks/gpu_session15.sh i   (one GPU; ~5 min)
#     Phase h again after the fix: the engine GPU tests, the 14B table at batch 128.
#   phase j: bash benchmarks/gpu_session15.sh j   (one GPU; ~7 min)
#     The 7B GRPO step with 16 prompts x 8 answers (its rollouts are 128 rows: the wide tiles), BF16+LoRA and
#     NVFP4+LoRA, the benchmark's other defaults (256 + 512 tokens, mu 2, LoRA r32).
#   phase k: bash benchmarks/gpu_session15.sh k   (one GPU; ~4 min)
#     Phase j's NVFP4 step with QUARL_KERNELS_DENSE_KEEP=196: every projection's transient BF16 weight kept from the
#     forward for the backward (one decode per projection a micro-batch instead of two), at its memory.
#   phase l: bash benchmarks/gpu_session15.sh l   (one GPU; ~3 min)
#     After moving the ring's x permutation to ring_x.py and the engine's memory sizing to memory.py (no behaviour
#     change): the ring, wo_gemm and engine GPU tests.
#   phase m: bash benchmarks/gpu_session15.sh m   (one GPU, carry .dev/dg.tar.xz; ~6 min)
#     Issue 15: does Jet-RL's actor-update speed-up grow with width? fp8_model_step.py at Qwen2.5-32B width (4
#     decoder layers, --loss rl, 8k / 16k tokens): BF16, Jet-RL's recipe and X^T tiles, both on DeepGEMM (session 13's
#     arms at 7B: 1.20x / 1.26-1.27x).
#   phase n: bash benchmarks/gpu_session15.sh n   (one GPU; ~2 min)
#     The decode kernels' graph-capture tests after their capture / replay moved to tests/kernels/helpers.replayed.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

wide() {  # SECONDS ARGS...: bench_ring_wide.py -> $OUT/wide
    local s=$1; shift
    mkdir -p "$OUT/wide"
    timeout -k 5 "$s" "$PY" benchmarks/kernels/bench_ring_wide.py --budget-s $(( s - 30 )) --out "$OUT/wide" "$@" \
        > "$OUT/wide/run.log" 2>&1
    echo "== wide bench rc=$? at $((SECONDS - T0)) s"; grep -A 80 "^| N x K" "$OUT/wide/run.log" | head -n 90
}

case $PHASE in
a)
    tests "${TEST_S:-170}" tests/kernels/test_wgmma_ring_gpu.py
    wide "${WIDE_S:-330}" --ms 96,128,192,256,512,1024,2048
    ;;
b)
    tests "${TEST_S:-200}" tests/kernels/test_wgmma_ring_gpu.py
    wide "${WIDE_S:-300}" --ms 96,128,192,256,384,512 --configs 2,5,8,9,10,11 --unpadded \
        --shapes 18944x3584,3584x18944,3584x3584,27648x5120,5120x13824,5120x5120,1024x5120
    ;;
c)
    tests "${TEST_S:-260}" tests/kernels/test_wgmma_ring_gpu.py tests/kernels/test_wo_gemm_gpu.py \
        "tests/engine/test_engine_gpu.py::test_seeded_rollout_of_a_7b_shaped_model_is_reproducible"
    profile "${PROFILE_S:-260}" 7b bf16+lora32,nvfp4+lora32,nvfp4+lora32:nowide 128,256
    ;;
e)
    tests "${TEST_S:-150}" tests/engine/test_engine_gpu.py tests/kernels/test_wo_gemm_gpu.py -k "not 7b_shaped"
    profile "${PROFILE_S:-280}" 7b bf16+lora32,nvfp4+lora32,nvfp4+lora32:nowide 128,256
    ;;
f)
    tests "${TEST_S:-200}" tests/kernels/test_wgmma_ring_gpu.py
    wide "${WIDE_S:-240}" --ms 96,128,192,256,384,512 --configs 0,6,7,8 \
        --shapes 18944x3584,3584x18944,3584x3584,27648x5120,5120x13824,5120x5120
    ;;
g)
    tests "${TEST_S:-150}" tests/kernels/test_wgmma_ring_gpu.py
    rollout_table "${TABLE_S:-260}" 7b 64 table64
    ;;
h)
    tests "${TEST_S:-150}" tests/engine/test_engine_gpu.py -k "not 7b_shaped"
    rollout_table "${TABLE_S:-330}" 14b 128 table14b
    grep -h -o '"batch_rows": [0-9]*\|"batches": [0-9]*' "$OUT"/table14b/*.json | head -8
    ;;
i)
    tests "${TEST_S:-120}" tests/engine/test_engine_gpu.py -k "not 7b_shaped"
    rollout_table "${TABLE_S:-330}" 14b 128 table14b
    grep -h -o '"batch_rows": [0-9]*' "$OUT"/table14b/*.json | head -4
    ;;
j)
    grpo "${GRPO_S:-560}" grpo128 --prompts 16
    ;;
k)
    QUARL_KERNELS_DENSE_KEEP=196 grpo "${GRPO_S:-400}" grpo128keep --prompts 16 --formats nvfp4
    ;;
l)
    tests "${TEST_S:-300}" tests/kernels/test_wgmma_ring_gpu.py tests/kernels/test_wo_gemm_gpu.py \
        tests/engine/test_engine_gpu.py
    ;;
m)
    deepgemm
    for t in 8192 16384; do
        model_step "${MODEL_S:-150}" Qwen2.5-32B-$t --shape Qwen2.5-32B --layers 4 --tokens $t --loss rl \
            --arms bf16,jetrl+deepgemm,jetrl-xtiles+deepgemm --iters 6
    done
    ;;
n)
    tests "${TEST_S:-200}" tests/kernels/test_wgmma_ring_gpu.py tests/kernels/test_wgmma_decode_gpu.py \
        tests/kernels/test_mma_decode_gpu.py -k "graph"
    ;;
d)
    rollout_table "${TABLE_S:-380}" 7b 128,256 table
    profile "${PROFILE_S:-170}" 14b bf16+lora32,nvfp4+lora32,nvfp4+lora32:nowide 128
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# Record of the calls (commit, seconds, what came back):
#   a  phase a at 70c39e3: 106 s (machine start not counted). GPU tests 68 passed. Wide tiles, best ring / cuBLAS BF16 /
#      dispatch (us): 18944 x 3584 at 128 rows 46.3 / 56.8 / 70.1, at 256 83.8 / 65.8 / 137.0, at 512 132.0 / 96.5 /
#      163.8; 3584 x 18944 at 128 54.9 / 62.2 / 71.0; 27648 x 5120 at 128 97.7 / 108.1 / 122.3; 5120 x 13824 at 128
#      51.5 / 62.6 / 164.5. At 96 / 192 rows (a partial last tile) slower than at 128 / 256; from 1024 rows the dense
#      path wins; 512 x 3584 never pays. Best config mostly ring-R64S3W2T128.
#   b  phase b at 3de0a09: 79 s. GPU tests 76 passed. x padded to whole token tiles: 18944 x 3584 at 96 rows 47.1 vs
#      61.8 us unpadded, at 192 83.0 vs 127.7; 27648 x 5120 at 192 172.1 vs 245.5. Two warpgroups a CTA (w8) and
#      256-row tiles slower at every point (1.2-2x). ring-R64S3W2T128 / cuBLAS / dense at 384 rows: 18944 x 3584 117.2 /
#      81.5 / 150.8; 27648 x 5120 260.6 / 152.0 / 301.0; at 512 the dense path wins or ties on 5 of 7 shapes.
#   c  phase c at 9035533: 183 s. GPU tests 128 passed (ring, wo_gemm, the seeded 7B rollout at batch 64 and 128:
#      reproducible). Profile: BF16+LoRA batch 128 step 13.75 ms; BF16 at 256 out of memory in the prefill (256 x 1024
#      tokens at once); the first NVFP4 cell stopped with an illegal memory access in its prefill (128 x 1024 tokens:
#      a gate / up output of 2.5e9 elements, past the epilogue's int32 offsets). Fixed in the next commit.
#   e  phase e at 6eba7b7 (chunked prefill, int64 epilogue rows): 249 s. GPU tests 75 passed (engine, wo_gemm). 7B
#      decode step ms at batch 128 / 256: BF16+LoRA 13.760 / 18.601, NVFP4+LoRA 12.442 / 20.203, :nowide 14.414 /
#      24.425. Log-prob check vs the trainer forward: mean |delta| 0.0480 (BF16), 0.0675 (NVFP4, both arms).
#   d  phase d at 6eba7b7: 289 s. Table, 7B, 2048 new tokens, BF16+LoRA / NVFP4+LoRA decode tok/s: batch 128 9462.8 /
#      10410.0 (1.10x), batch 256 13481.8 / 12612.9 (0.94x). 14B decode step at batch 128 (ms): BF16+LoRA 29.631,
#      NVFP4+LoRA 28.129, :nowide 42.018.
#   f  phase f at 108fca9: 59 s. GPU tests 71 passed. 2 stages (53 KB) with or without the 128-register cap (4 / 3
#      CTAs an SM) slower than the 3-stage default at every point: 18944 x 3584 at 128 rows 57.4 / 56.5 vs 48.0 us, at
#      256 115.7 / 114.5 vs 85.6; the cap reverted (its configs never won). The default's dispatch matched its own
#      timing (46.2 / 85.3 us).
#   g  phase g at 44bb074: 112 s. GPU tests 65 passed (the merged ring test). Table, 7B batch 64: BF16+LoRA 5857.4 /
#      NVFP4+LoRA 7560.4 tok/s = 1.29x (session 14: 1.29x). The machine was given back; device budget left 1085 s.
#   h  phase h at 69f0d1e: 166 s. Engine GPU tests 14 passed. 14B table at batch 128: NVFP4+LoRA 4584.4 tok/s (27.92
#      ms a step, one batch of 128, KV cache 54.0 GiB, peak 67.1 GiB); BF16+LoRA out of memory: the benchmark's
#      1-token probe after its 2048-token warm-up sized its rows at the short length, and the cache it grew kept the
#      long one (128 x 2304 slots beside 27.9 GiB of weights). Fixed next (the estimate takes the cache's length).
#   i  phase i at 1e68ec5: 244 s. Engine GPU tests 14 passed. 14B table at batch 128, 2048 new tokens: BF16+LoRA
#      2895.3 tok/s (two batches of 64: its cache for 128 rows does not fit beside its weights), NVFP4+LoRA 4585.1
#      (one batch of 128) = 1.58x. The machine was given back; device budget left 849 s.
#   j  phase j at 4b4af9e: 172 s. 7B GRPO step, 16 prompts x 8 answers (128-row rollouts), steady step (step 1), s:
#      BF16+LoRA rollout 7.00 / log-prob 3.26 / update 21.23 / step 31.49; NVFP4+LoRA 6.33 / 3.39 / 22.51 / 32.24
#      = 1.024x (slower): the rollout is 10 % faster, the update (the dense path's dequantize) 6 % slower. Device
#      budget left 747 s; the machine was given back.
#   k  phase k at 21ce3cd: 98 s. Phase j's NVFP4 step with QUARL_KERNELS_DENSE_KEEP=196 (every transient kept): update
#      23.49 s (phase j, default 7: 22.51; another machine), step 33.36 s, update peak 22.8 GiB (11.1): no gain.
#      Device budget left 681 s; the machine was given back.
#   l  phase l at bf80bc4 (ring_x.py and engine/memory.py split out): 184 s. GPU tests 142 passed (ring, wo_gemm,
#      engine incl. the seeded 28-layer 7B-shaped rollouts at batch 64 and 128). Device budget left 574 s; the
#      machine was given back.
#   m  phase m at 4879868, carry .dev/dg.tar.xz (DeepGEMM 54e2261 built in 63 s): 168 s. Actor update at Qwen2.5-32B
#      width (4 layers, --loss rl), 64-layer estimate x BF16 (Jet-RL recipe / X^T tiles, DeepGEMM): 8k 1.27x / 1.36x,
#      16k 1.30x / 1.39x; per layer 1.28x / 1.37x and 1.31x / 1.41x. Device budget left 474 s; machine given back.
#      (Phase m ran its DeepGEMM setup and model steps inline; they are gpu_phase_lib.sh's `deepgemm` and `model_step`
#      since, the same commands.)
#   n  phase n at bf37bb1 (graph-capture tests through helpers.replayed): 19 s. 9 passed (ring, wgmma_decode,
#      mma_decode). Device budget left 448 s; the machine was given back.
