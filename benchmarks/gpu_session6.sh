#!/usr/bin/env bash
# The 2026-11-26 (session 6) device calls, as run. Run from the repository root on the device machine.
#
#   phase e: bash benchmarks/gpu_session6.sh e   (one GPU; issue 17, ~9 min)
#     1. GPU tests of this session's kernels (the GEMM last-pass epilogue, split-KV decode attention) and of
#        the decode kernels whose launchers changed (GEMV, mma.sync, wgmma), and of the engine
#     2. benchmarks/decode_attn.py: SDPA vs the split-KV kernel, 7B / 14B shapes, batch 1/8/64
#     3. benchmarks/rollout_profile.py: where a 7B NVFP4+LoRA decode step goes, before (:noepi:sdpa) and after
#   phase f: bash benchmarks/gpu_session6.sh f   (one GPU; issue 17, ~9.5 min)
#     1. benchmarks/grpo_step_gpu.py: the 7B GRPO step, BF16+LoRA vs NVFP4+LoRA (target: no slower)
#     2. the rollout table with LoRA (7B/14B, batch 1/8/64, 2048 new tokens), BF16+LoRA vs NVFP4+LoRA
#   phase g: bash benchmarks/gpu_session6.sh g   (one GPU; ~5 min) after the first two calls: the epilogue's
#     decode rows in registers (no 16-row tl.dot tile at M = 1..8), the epilogue as a custom op, decode attention
#     with 128-slot tiles. GPU tests of the two kernels, the 7B profile (before / after), the 7B GRPO step
#   phase h: bash benchmarks/gpu_session6.sh h   (one GPU; ~6.5 min) the rollout table again
#   phase k: bash benchmarks/gpu_session6.sh k   (one GPU; ~8.5 min) the epilogue's tiles sized by N (enough programs
#     for k / v), the 3D register broadcast back at M = 1: its GPU tests, the 7B NVFP4+LoRA profile, the GRPO step
#     and the rollout table, in one call
#
# Dry run on the CPU host (tiny shapes, no GPU tests): DRY=1 OUT=/tmp/gs6 PY=.venv/bin/python bash benchmarks/gpu_session6.sh e
set -u
: "${OUT:?}"
PHASE=${1:?phase}
T0=$SECONDS
export PYTHONPATH=$PWD:$PWD/kernels
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then
    GRPO=(--device cpu --shape tiny --prompts 2 --group 2 --new-tokens 8 --prompt-len 16 --micro-batch 2)
    PROF=(--device cpu --models tiny --prompt 16 --steps 4 --batches 1,2); ATT=(--dry-run)
    ROLL=(--device cpu --models tiny --new-tokens 8 --batches 1,2)
else
    GRPO=(); PROF=(--models 7b --batches 1,8,64); ATT=(--sweep); ROLL=(--models ${ROLL_MODELS:-7b,14b})
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
echo "phase $PHASE: $(tail -n +2 "$OUT/gpu.txt" | head -1)"

pack() { tar czf "$OUT/$1.tgz" -C "$OUT" "$1" && rm -rf "${OUT:?}/$1"; }

case "$PHASE" in
e)
    mkdir -p "$OUT/tests" "$OUT/attn" "$OUT/prof"
    if [ "$DRY" != 1 ]; then
        timeout -k 5 ${TEST_S:-200} "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider \
            tests/kernels/test_epilogue_gpu.py tests/kernels/test_decode_attn_gpu.py tests/engine/test_engine_gpu.py \
            tests/kernels/test_gemv_gpu.py tests/kernels/test_mma_decode_gpu.py tests/kernels/test_wgmma_decode_gpu.py \
            > "$OUT/tests/pytest.log" 2>&1
        echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests/pytest.log" | tail -n 15
    fi
    timeout -k 5 ${ATT_S:-70} "$PY" benchmarks/decode_attn.py "${ATT[@]}" --out "$OUT/attn/decode_attn.json" > "$OUT/attn/run.log" 2>&1
    echo "== decode attention bench rc=$? at $((SECONDS - T0)) s"; tail -n 20 "$OUT/attn/run.log"
    timeout -k 10 ${PROF_S:-190} "$PY" benchmarks/rollout_profile.py "${PROF[@]}" \
        --variants nvfp4+lora32:noepi:sdpa,nvfp4+lora32,bf16+lora32 \
        --budget-s $(( ${PROF_S:-190} - 15 )) --out "$OUT/prof" > "$OUT/prof/run.log" 2>&1
    echo "== profile rc=$? at $((SECONDS - T0)) s"; grep -E '^\{' "$OUT/prof/run.log" | tail -n 12
    pack tests; pack attn; pack prof
    ;;
f)
    mkdir -p "$OUT/roll" "$OUT/grpo7b"
    timeout -k 10 200 "$PY" benchmarks/grpo_step_gpu.py "${GRPO[@]}" --out "$OUT/grpo7b" --work /tmp/grpo7_work \
        > "$OUT/grpo7b/run.log" 2>&1
    echo "== grpo7b rc=$? at $((SECONDS - T0)) s"; tail -n 12 "$OUT/grpo7b/run.log"
    timeout -k 10 ${ROLL_S:-370} "$PY" benchmarks/rollout.py "${ROLL[@]}" --variants bf16+lora,nvfp4+lora \
        --hf-new-tokens 0 --budget-s $(( ${ROLL_S:-370} - 20 )) --out "$OUT/roll" > "$OUT/roll/run.log" 2>&1
    echo "== rollout rc=$? at $((SECONDS - T0)) s"; tail -n 16 "$OUT/roll/run.log"
    pack grpo7b; pack roll
    ;;
g)
    mkdir -p "$OUT/tests2" "$OUT/prof2" "$OUT/grpo7b2"
    if [ "$DRY" != 1 ]; then
        timeout -k 5 ${TEST_S:-120} "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider \
            tests/kernels/test_epilogue_gpu.py tests/kernels/test_decode_attn_gpu.py \
            tests/engine/test_engine_gpu.py -k "epilogue or lora or decode_attn or attention" > "$OUT/tests2/pytest.log" 2>&1
        echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests2/pytest.log" | tail -n 15
    fi
    timeout -k 10 ${PROF_S:-160} "$PY" benchmarks/rollout_profile.py "${PROF[@]}" \
        --variants nvfp4+lora32:noepi:sdpa,nvfp4+lora32,bf16+lora32 \
        --budget-s $(( ${PROF_S:-160} - 15 )) --out "$OUT/prof2" > "$OUT/prof2/run.log" 2>&1
    echo "== profile rc=$? at $((SECONDS - T0)) s"; grep -E '^\{' "$OUT/prof2/run.log" | tail -n 12
    timeout -k 10 150 "$PY" benchmarks/grpo_step_gpu.py "${GRPO[@]}" --out "$OUT/grpo7b2" --work /tmp/grpo7_work \
        > "$OUT/grpo7b2/run.log" 2>&1
    echo "== grpo7b rc=$? at $((SECONDS - T0)) s"; tail -n 12 "$OUT/grpo7b2/run.log"
    pack tests2; pack prof2; pack grpo7b2
    ;;
h)
    mkdir -p "$OUT/roll2"
    timeout -k 10 ${ROLL_S:-370} "$PY" benchmarks/rollout.py "${ROLL[@]}" --variants bf16+lora,nvfp4+lora \
        --hf-new-tokens 0 --budget-s $(( ${ROLL_S:-370} - 20 )) --out "$OUT/roll2" > "$OUT/roll2/run.log" 2>&1
    echo "== rollout rc=$? at $((SECONDS - T0)) s"; tail -n 16 "$OUT/roll2/run.log"
    pack roll2
    ;;
k)
    mkdir -p "$OUT/tests3" "$OUT/prof3" "$OUT/grpo7b3" "$OUT/roll3"
    if [ "$DRY" != 1 ]; then
        timeout -k 5 ${TEST_S:-90} "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider tests/kernels/test_epilogue_gpu.py \
            tests/engine/test_engine_gpu.py -k "epilogue or lora" > "$OUT/tests3/pytest.log" 2>&1
        echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests3/pytest.log" | tail -n 15
    fi
    timeout -k 10 ${PROF_S:-70} "$PY" benchmarks/rollout_profile.py "${PROF[@]}" --variants nvfp4+lora32 \
        --budget-s $(( ${PROF_S:-70} - 10 )) --out "$OUT/prof3" > "$OUT/prof3/run.log" 2>&1
    echo "== profile rc=$? at $((SECONDS - T0)) s"; grep -E '^\{' "$OUT/prof3/run.log" | tail -n 4
    timeout -k 10 110 "$PY" benchmarks/grpo_step_gpu.py "${GRPO[@]}" --out "$OUT/grpo7b3" --work /tmp/grpo7_work \
        > "$OUT/grpo7b3/run.log" 2>&1
    echo "== grpo7b rc=$? at $((SECONDS - T0)) s"; tail -n 12 "$OUT/grpo7b3/run.log"
    timeout -k 10 ${ROLL_S:-330} "$PY" benchmarks/rollout.py "${ROLL[@]}" --variants bf16+lora,nvfp4+lora \
        --hf-new-tokens 0 --budget-s $(( ${ROLL_S:-330} - 15 )) --out "$OUT/roll3" > "$OUT/roll3/run.log" 2>&1
    echo "== rollout rc=$? at $((SECONDS - T0)) s"; tail -n 16 "$OUT/roll3/run.log"
    pack tests3; pack prof3; pack grpo7b3; pack roll3
    ;;
esac
echo "phase $PHASE done after $((SECONDS - T0)) s"
