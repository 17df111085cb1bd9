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
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record of the calls (2026-11-26; results/gpu_2026-11-26/s13/<x>):
