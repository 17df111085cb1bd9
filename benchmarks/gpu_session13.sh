#!/usr/bin/env bash
# Session 13 (2026-11-26, fifth device session of the day): issue 17's batch-1 margin at 14B (2.46-2.55x against
# 2.5x) and the 7B GRPO step. Run from the repository root on the device machine; the record of what ran is at the
# end of this file. The phases use benchmarks/gpu_phase_lib.sh's helpers (tests, profile, rollout_table, grpo,
# phase_end).
#
#   phase a: bash benchmarks/gpu_session13.sh a   (one GPU; ~6 min)
#     1. GPU tests: the decode attention kernel with the merge of its splits in the attention launch (the last
#        program to arrive merges: decode_attn "combine=fused", new), and the RoPE pass with its products rounded
#        in software (session 12's phase k, never run): bit-equality at 1 and 8 rows;
#     2. the decode attention alone at 7B / 14B, batch 1 / 8, L 1280 / 2304, with its sweep (incl. the merge as
#        its own launch);
#     3. the decode-step profile at 7B / 14B, batch 1 / 8: the defaults, :attnkernel (the merge as a second launch,
#        as before) and :rope (batch 1).
#   phase b: bash benchmarks/gpu_session13.sh b   (one GPU; ~7 min)
#     The code after phase a (the merge as its own kernel again, with the faster loads; the RoPE pass on at one
#     row): GPU tests (decode attention, the engine, the group passes), the host time of one training call of the
#     4-bit base vs nn.Linear (benchmarks/train_linear_host.py), the rollout table (7B / 14B, batch 1 / 8).
#   phase c: bash benchmarks/gpu_session13.sh c   (one GPU, carry .dev/dg.tar.xz; ~5 min)
#     Issue 15: Jet-RL's actor update with the optimizer step amortized as an RL update runs it (fp8_model_step.py
#     --accumulate 8: 8 micro-batches of 8k / 16k tokens per AdamW step) beside the per-micro-batch step of sessions
#     9-10 (--accumulate 1), BF16 vs Jet-RL's recipe vs X^T tiles, both on DeepGEMM, Qwen2.5-7B width.
#   phase d: bash benchmarks/gpu_session13.sh d   (one GPU; ~7 min)
#     Issue 17's 7B GRPO step: the LoRA update micro-batch (BF16, NVFP4, NVFP4 with every decoded weight kept), then
#     the GRPO step with the defaults and NVFP4 with QUARL_KERNELS_DENSE_KEEP=196 (a 7B model's 196 projections:
#     each decoded once per update instead of 385 times per micro-batch, at its BF16 weights' memory).
#   phase e: bash benchmarks/gpu_session13.sh e   (one GPU; ~5 min)
#     The 7B GRPO step with rollout.free_cache=false (the engine keeps its KV cache and CUDA graphs across rollouts:
#     phase d's steady rollouts still captured 2 graphs each), then with the defaults, on one machine.
#   phase f: bash benchmarks/gpu_session13.sh f   (one GPU; ~5 min)
#     1. the one-row GEMV at the 7B shapes beside a pure streaming read of the same bytes timed the same way
#        (bench_gemv.py --read-ceiling: the % of the copy rate a kernel of that size reaches at all);
#     2. the 7B GRPO step with rollout.free_cache=false, NVFP4 also with QUARL_KERNELS_DENSE_KEEP=196 (both memory-
#        for-time settings), and again with rollout.free_cache=false alone (phase e's repeat).
#   phase g: bash benchmarks/gpu_session13.sh g   (one GPU; ~5 min; at commit 976bc48 -- the code it tested was reverted)
#     keep_cache=False keeping the graphs, reused when the freed cache comes back at the same addresses
#     (FastGenerator._free_cache at 2ea8c00): the engine GPU tests, then the 7B GRPO step with the defaults (do the
#     steady rollouts still capture?) and with rollout.free_cache=false.
#   phase h: bash benchmarks/gpu_session13.sh h   (one GPU; ~3 min)
#     Where a batch-64 decode step goes now (the one rollout target left far off): the 7B profile at batch 64, BF16+LoRA
#     and NVFP4+LoRA (fp32 adapters, as the trainer keeps them).
#   phase i: bash benchmarks/gpu_session13.sh i   (one GPU; ~4 min; at commit 52e40ec -- the switch it measured was
#     removed after it, so :mmagroup64 is no modifier any more)
#     A LoRA group's weights in one mma.sync launch up to 64 rows (QUARL_MMA_GROUP_MAX_M=64, off by default):
#     its GPU test at 40 / 64 rows, and the 7B step at batch 32 / 64 with and without it (:mmagroup64).
#   phase j: bash benchmarks/gpu_session13.sh j   (one GPU; ~3 min)
#     What a rollout pays for a freed cache (benchmarks/recapture_cost.py: 7B, 64 x (256 + 512), BF16+LoRA and
#     NVFP4+LoRA, keep_cache False / True, the engine's warm-up and capture seconds), and the engine GPU tests.
#   phase k: bash benchmarks/gpu_session13.sh k   (one GPU; ~6 min)
#     A re-capture (after a freed cache) skips the eager warm-up for shapes captured before: the engine GPU tests,
#     recapture_cost.py again, and the 7B GRPO step with the defaults.
#   phase l: bash benchmarks/gpu_session13.sh l   (one GPU; ~4 min)
#     The 7B GRPO step with the defaults twice more (the spread of the ratio with phase k's code).
set -u
: "${OUT:?}"
PHASE=${1:?phase}
source benchmarks/gpu_phase_lib.sh

attn_bench() {  # SECONDS: the decode attention kernel alone -> $OUT/attn
    mkdir -p "$OUT/attn"
    timeout -k 5 "$1" "$PY" benchmarks/decode_attn.py --models 7b 14b --batch 1 8 --lengths 1280 2304 --sweep \
        --out "$OUT/attn/decode_attn.json" > "$OUT/attn/run.log" 2>&1
    echo "== decode attention rc=$? at $((SECONDS - T0)) s"; grep -E "^\| (7b|14b)" "$OUT/attn/run.log"
}

case "$PHASE" in
a)
    tests "${TEST_S:-150}" tests/kernels/test_decode_attn_gpu.py tests/kernels/test_epilogue_gpu.py -k "attn or fused_merge or graph or rope or engine"
    attn_bench "${ATTN_S:-60}"
    profile "${PROFILE_S:-170}" 7b,14b nvfp4+lora32,nvfp4+lora32:attnkernel,nvfp4+lora32:rope 1,8
    ;;
b)
    tests "${TEST_S:-150}" tests/kernels/test_decode_attn_gpu.py tests/engine/test_engine_gpu.py \
        tests/kernels/test_epilogue_gpu.py -k "attn or engine or group or rope"
    mkdir -p "$OUT/host"
    timeout -k 5 "${HOST_S:-60}" "$PY" benchmarks/train_linear_host.py --out "$OUT/host" > "$OUT/host/run.log" 2>&1
    echo "== host time rc=$? at $((SECONDS - T0)) s"; grep -E "^\| " "$OUT/host/run.log"; grep -A 22 "tottime" "$OUT/host/run.log" | head -n 24
    rollout_table "${ROLL_S:-300}" 7b,14b 1,8 roll
    ;;
c)
    [ -d .dg/DeepGEMM ] || tar xJf .dev/dg.tar.xz
    KEEP_PHASE=$PHASE KEEP_T0=$T0  # gpu_session7.sh's library sets PHASE and T0 for itself
    source benchmarks/gpu_session7.sh lib > /dev/null
    setup_deepgemm > /dev/null 2>&1
    PHASE=$KEEP_PHASE T0=$KEEP_T0
    echo "== DeepGEMM ready at $((SECONDS - T0)) s: $(ls /tmp/dg/deep_gemm/_C*.so 2>&1 | head -1)"
    mkdir -p "$OUT/model"
    for acc in 8 1; do
        for t in 8192 16384; do
            tag=acc$acc-Qwen2.5-7B-$t
            timeout -k 5 "${MODEL_S:-110}" "$PY" benchmarks/fp8_model_step.py --shape Qwen2.5-7B --layers 4 --tokens $t \
                --loss rl --arms bf16,jetrl+deepgemm,jetrl-xtiles+deepgemm --accumulate $acc --iters $((acc > 1 ? 3 : 6)) \
                --budget-s $(( ${MODEL_S:-110} - 20 )) --out "$OUT/model/$tag" > "$OUT/model/$tag.log" 2>&1
            echo "== model step $tag rc=$? at $((SECONDS - T0)) s"; sed -n '/^# actor update/,$p' "$OUT/model/$tag.log"
        done
    done
    ;;
d)
    mkdir -p "$OUT/update"
    timeout -k 5 "${UPDATE_S:-100}" "$PY" benchmarks/lora_update_step.py --arms bf16,nvfp4,nvfp4:keepall \
        --out "$OUT/update" > "$OUT/update/run.log" 2>&1
    echo "== update micro-batch rc=$? at $((SECONDS - T0)) s"; grep -E "^\| " "$OUT/update/run.log"
    grpo "${GRPO_S:-200}" grpo
    QUARL_KERNELS_DENSE_KEEP=196 grpo "${GRPO_S2:-130}" grpo_keep196 --formats nvfp4
    ;;
e)
    grpo "${GRPO_S:-200}" grpo_keepcache --set rollout.free_cache=false
    grpo "${GRPO_S:-200}" grpo
    ;;
f)
    mkdir -p "$OUT/gemv"
    timeout -k 5 "${GEMV_S:-90}" "$PY" benchmarks/kernels/bench_gemv.py --formats nvfp4 --ms 1 --read-ceiling \
        --out "$OUT/gemv" > "$OUT/gemv/run.log" 2>&1
    echo "== GEMV + read ceiling rc=$? at $((SECONDS - T0)) s"; grep -E "^\| nvfp4|HBM copy" "$OUT/gemv/run.log"
    QUARL_KERNELS_DENSE_KEEP=196 grpo "${GRPO_S:-200}" grpo_keepcache_keep196 --set rollout.free_cache=false
    grpo "${GRPO_S:-200}" grpo_keepcache --set rollout.free_cache=false
    ;;
g)
    tests "${TEST_S:-120}" tests/engine/test_engine_gpu.py
    grpo "${GRPO_S:-200}" grpo
    grpo "${GRPO_S:-200}" grpo_keepcache --set rollout.free_cache=false
    ;;
h)
    profile "${PROFILE_S:-150}" 7b bf16+lora32,nvfp4+lora32 64
    ;;
l)
    grpo "${GRPO_S:-200}" grpo
    grpo "${GRPO_S:-200}" grpo2
    ;;
k)
    tests "${TEST_S:-100}" tests/engine/test_engine_gpu.py tests/kernels/test_decode_attn_gpu.py -k "graph or engine"
    mkdir -p "$OUT/recapture"
    timeout -k 5 "${RECAP_S:-150}" "$PY" benchmarks/recapture_cost.py --out "$OUT/recapture" > "$OUT/recapture/run.log" 2>&1
    echo "== recapture rc=$? at $((SECONDS - T0)) s"; grep -E "^\| " "$OUT/recapture/run.log"
    grpo "${GRPO_S:-200}" grpo
    ;;
j)
    tests "${TEST_S:-100}" tests/engine/test_engine_gpu.py
    mkdir -p "$OUT/recapture"
    timeout -k 5 "${RECAP_S:-200}" "$PY" benchmarks/recapture_cost.py --out "$OUT/recapture" > "$OUT/recapture/run.log" 2>&1
    echo "== recapture rc=$? at $((SECONDS - T0)) s"; grep -E "^\| " "$OUT/recapture/run.log"
    ;;
i)
    tests "${TEST_S:-120}" tests/kernels/test_epilogue_gpu.py -k "group_launch"
    profile "${PROFILE_S:-200}" 7b nvfp4+lora32,nvfp4+lora32:mmagroup64 32,64
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record of the calls (2026-11-26; results/gpu_2026-11-26/s13/<x>):
#   a  phase a at c7fccd4 (the merge in the attention launch, combine=fused, as the default): 231 s. GPU tests 27
#      passed (decode attention incl. the fused merge under graph replay; the RoPE pass bit-equal at 1 and 8 rows).
#      Attention alone (us, default = fused / merge kernel): 7B b1 7.9 / 7.9, b8 12.5 / 12.1 (L 1280); L 2304 9.4 /
#      9.7, 18.8 / 16.4; 14B b1 7.9 / 8.1, b8 22.8 / 22.0; L 2304 12.7 / 11.4, 34.5 / 34.4. Step ms (batch 1 / 8):
#      7B 3.234 / 4.341 fused, 3.242 / 4.352 :attnkernel, 3.197 / 4.358 :rope; 14B 5.885 / 7.986, 5.911 / 7.922,
#      5.839 / 7.969. Kept: the merge's new loads and the RoPE pass at one row; dropped: the fused merge.
#   b  phase b at c41b8e9 (the merge kernel with the new loads; the RoPE pass on): 302 s. GPU tests 41 passed. Host
#      time per training call 187.5 (BF16) / 445.7 us (NVFP4). Rollout BF16+LoRA / NVFP4+LoRA: 7B 8.44 / 3.21 =
#      2.63x (b1), 8.86 / 4.32 = 2.05x (b8); 14B 15.07 / 5.87 = 2.57x, 16.15 / 7.93 = 2.04x.
#   c  phase c at 4fe5fa5, carry .dev/dg.tar.xz: 247 s. 28-layer estimate x (Jet-RL recipe / X^T tiles, DeepGEMM):
#      accumulate 8: 1.20 / 1.26 (8k), 1.20 / 1.27 (16k); accumulate 1: 1.20 / 1.27, 1.20 / 1.26.
#   d  phase d at 6c7026d: 174 s. Update micro-batch (4 layers) 108.2 / 111.2 / 109.1 ms (BF16 / NVFP4 / keep all).
#      GRPO step (steady) BF16 18.24 s (5.94 / 1.62 / 10.68), NVFP4 18.60 (5.98 / 1.68 / 10.95) = 1.020x; NVFP4 with
#      QUARL_KERNELS_DENSE_KEEP=196 18.41 (5.99 / 1.69 / 10.73; update peak 22.8 GiB vs 11.2) = 1.009x.
#   e  phase e at 18e7982: 189 s. GRPO step (steady) with rollout.free_cache=false: BF16 17.65 s (5.54 / 1.60 / 10.50),
#      NVFP4 17.77 (5.21 / 1.66 / 10.90) = 1.007x; defaults: BF16 17.93 (5.79 / 1.60 / 10.53), NVFP4 18.17 (5.70 / 1.66
#      / 10.81) = 1.013x.
#   f  phase f at 34ab19c: 196 s. GEMV / pure read (us, % of the copy rate): gate-up 19.87 (64 %) / 16.37 (78 %), down
#      22.38 (57 %) / 16.38 (78 %), q-o 7.73 (31 %) / 4.67 (52 %), k-v 5.09 (7 %) / 2.34 (15 %). GRPO step with
#      rollout.free_cache=false: BF16 17.71, NVFP4 17.69 = 0.999x; also DENSE_KEEP=196 on NVFP4: 17.84 / 17.48 = 0.980x
#      (NVFP4 update peak 25.5 GiB vs BF16's 22.0).
#   g  phase g at 976bc48 (the first call, at 2ea8c00, found no g branch: rc 2 in 0.3 s): 265 s. GPU tests 13 passed, 1
#      failed: the graph-reuse test -- two calls in a row, and the freed cache did not come back at the same addresses
#      (3 captures); in the GRPO step too the steady rollouts captured 2 graphs each. Reverted. GRPO step (steady):
#      defaults BF16 18.24 s (5.85 / 1.63 / 10.76), NVFP4 19.03 (6.07 / 1.69 / 11.28) = 1.043x; rollout.free_cache=false
#      BF16 18.10 (5.57 / 1.64 / 10.89), NVFP4 18.37 (5.26 / 1.76 / 11.35) = 1.015x.
#   h  phase h at 44abe72: 72 s. 7B batch-64 step BF16+LoRA 10.967 ms, NVFP4+LoRA 10.299 ms (1.065x); the four GEMM
#      groups 5.57 vs 6.28 ms, LoRA 1.66 (+0.24 bias) vs 0.59, attention 1.70 vs 1.76.
#   i1 phase i at a0bc1cb (raw in s13/i1): 98 s. The group route never engaged past 16 rows: the engine tried the
#      group only with the A GEMM in the launch (<= 16 rows), and the q/k/v group (16.5M weights) missed the large-
#      weight rule; GPU tests 8 passed, 2 failed (q/k/v at 40 / 64 rows: no route). Step ms with / without the switch
#      (the same kernels): batch 32 7.646 / 7.568, batch 64 10.263 / 10.259. Fixed, re-run as i.
#   i  phase i at 52e40ec: 121 s. GPU tests 10 passed (the group launch at 40 / 64 rows within the bounds of one launch
#      per weight). 7B step ms without / with the group past 16 rows: batch 32 7.574 / 7.805, batch 64 10.241 / 10.847
#      (710 vs 766 kernels a step at 64: fewer launches, slower). Removed.

#   j  phase j at 97fb74b: 150 s. GPU tests 13 passed. One 7B rollout call (64 x (256 + 512)), s, freed cache / kept:
#      BF16+LoRA 5.851-5.864 / 5.555-5.565 (re-capture: warm-up 0.21 + record 0.09-0.11 s), NVFP4+LoRA 5.904-5.987 /
#      5.199-5.202 (warm-up 0.50-0.51 + record 0.22-0.28 s): the eager warm-up steps are two thirds of it.
#   k  phase k at 4134bf4: 232 s. GPU tests 20 passed. Rollout call, s, freed cache (re-capture without the warm-up) /
#      kept: BF16+LoRA 5.611-5.613 / 5.526-5.529, NVFP4+LoRA 5.340-5.382 / 5.173-5.174. GRPO step (steady, defaults):
#      BF16 17.93 s (5.64 / 1.61 / 10.68), NVFP4 18.09 (5.37 / 1.66 / 11.06) = 1.009x.
#   l  phase l at 2819dca (the first call refused: the previous machine was still going back; retried after 60 s):
#      210 s. GRPO step (steady, defaults) twice: BF16 18.20 / NVFP4 18.24 = 1.002x; 18.19 / 18.23 = 1.002x.
#      Device time spent (219 s left): no further calls this session.
