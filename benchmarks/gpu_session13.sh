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
