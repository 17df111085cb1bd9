#!/usr/bin/env bash
# Prepared in session 8 (2026-11-26) for the next device session. Ran on 2026-11-26 (H100) at commit 13f5854:
# phase a (results/gpu_2026-11-26/s9/a) and phase c (s9/c); phase b (the DeepGEMM anomaly) was NOT run -- the
# session spent its device time on the whole-model step instead (gpu_session10.sh). RESULTS.md: "Issue 17: the LoRA
# A GEMM as one launch of split partials is slower" and Jet-RL "The whole actor update".
#
#   phase a: bash benchmarks/gpu_session9.sh a   (one GPU; issue 17, ~9 min)
#     The LoRA A GEMM as one launch of split partials (quarl_kernels/lora_a.py, opt-in QUARL_ENGINE_LORA_A=1):
#     1. its GPU tests (tests/kernels/test_epilogue_gpu.py: against F.linear, and a packed q/k/v group in a CUDA
#        graph against the cuBLAS route) and the engine's GPU tests with it switched on;
#     2. the decode-step profile A/B, 7B NVFP4 + fp32 LoRA r32, batch 1 / 8 / 64 (`:loraa` = switched on);
#     3. the rollout table (7B / 14B, NVFP4+LoRA vs BF16+LoRA) with it switched on.
#     If it is faster at every batch, make it the default (quarl/engine/lora.py resolve_a_kernel) and say so.
#   phase b: bash benchmarks/gpu_session9.sh b   carry: .dev/dg.tar.xz   (one GPU; issue 15, ~6 min)
#     Session 7/8's anomaly -- DeepGEMM's GEMMs faster alone and in a one-step kernel profile, the back-to-back
#     layer step not: every arm also as one CUDA graph per step (no host), with the SM clock, power and temperature
#     logged every 200 ms (nvidia-smi) beside the run. Graph faster for DeepGEMM -> a host-side cause; graph as slow
#     and the clock lower under DeepGEMM -> power / clocks.
#   phase c: bash benchmarks/gpu_session9.sh c   carry: .dev/dg.tar.xz   (one GPU; issue 15, ~9 min)
#     The whole actor update (benchmarks/fp8_model_step.py): a Qwen2.5-7B-width model with 4 decoder layers and its
#     stem, BF16 vs full-parameter Jet-RL (1x128 X^T / X^T tiles, cuBLAS / DeepGEMM), 8k and 16k tokens; the
#     28-layer estimate is the figure to hold against Jet-RL's 1.41x (training phase) and 1.54x (actor update).
#
# .dev/dg.tar.xz: see benchmarks/gpu_session8.sh.
set -u
: "${OUT:?}"
PHASE=${1:?phase}
T0=$SECONDS
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
export PYTHONPATH=$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
echo "phase $PHASE: $(tail -n +2 "$OUT/gpu.txt" | head -1)"

case "$PHASE" in
a)
    mkdir -p "$OUT/tests" "$OUT/profile" "$OUT/roll"
    QUARL_ENGINE_LORA_A=1 timeout -k 5 "${TEST_S:-170}" "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider \
        tests/kernels/test_epilogue_gpu.py tests/engine/test_engine_gpu.py > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests/pytest.log" | tail -n 12
    timeout -k 5 "${PROFILE_S:-170}" "$PY" benchmarks/rollout_profile.py --models 7b \
        --variants nvfp4+lora32,nvfp4+lora32:loraa --batches 1,8,64 --budget-s $(( ${PROFILE_S:-170} - 15 )) \
        --out "$OUT/profile" > "$OUT/profile/run.log" 2>&1
    echo "== profile rc=$? at $((SECONDS - T0)) s"; tail -n 40 "$OUT/profile/run.log"
    QUARL_ENGINE_LORA_A=1 timeout -k 5 "${ROLL_S:-200}" "$PY" benchmarks/rollout.py --models 7b,14b \
        --variants bf16+lora,nvfp4+lora --hf-new-tokens 0 --budget-s $(( ${ROLL_S:-200} - 15 )) \
        --out "$OUT/roll" > "$OUT/roll/run.log" 2>&1
    echo "== rollout table rc=$? at $((SECONDS - T0)) s"; tail -n 20 "$OUT/roll/run.log"
    ;;
b)
    [ -d .dg/DeepGEMM ] || tar xJf .dev/dg.tar.xz
    source benchmarks/gpu_session7.sh lib
    mkdir -p "$OUT/layer" "$OUT/warm"
    setup_deepgemm > /dev/null 2>&1
    warm_deepgemm "$OUT/warm" 8192,16384
    wait
    echo "== JIT warm-up done at $((SECONDS - T0)) s"
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
        --format=csv -lms 200 > "$OUT/layer/clocks.csv" 2>&1 &
    SMI=$!
    ARMS=bf16,fp8,fp8-deepgemm,fp8-deepgemm-xtiles
    timeout -k 5 "${LAYER_S:-240}" "$PY" benchmarks/fp8_layer.py --arms $ARMS --graph-arms $ARMS \
        --models Qwen2.5-7B,Qwen3-8B --tokens 8192,16384 --quick --no-profile --budget-s $(( ${LAYER_S:-240} - 25 )) \
        --out "$OUT/layer" > "$OUT/layer/run.log" 2>&1
    echo "== layer rc=$? at $((SECONDS - T0)) s"; sed -n '/^# one decoder layer/,$p' "$OUT/layer/run.log" | head -n 50
    kill "$SMI" 2>/dev/null
    rm -rf "${OUT:?}/warm"
    ;;
c)  # issue 15: the whole actor update (benchmarks/fp8_model_step.py), BF16 vs full-parameter Jet-RL, 7B width with 4
    # decoder layers plus the stem, at 8k and 16k tokens; the 28-layer estimate beside Jet-RL's 1.41x / 1.54x
    [ -d .dg/DeepGEMM ] || tar xJf .dev/dg.tar.xz
    source benchmarks/gpu_session7.sh lib
    setup_deepgemm > /dev/null 2>&1
    mkdir -p "$OUT/model"
    for t in 8192 16384; do
        timeout -k 5 "${MODEL_S:-250}" "$PY" benchmarks/fp8_model_step.py --shape Qwen2.5-7B --layers 4 --tokens $t \
            --arms bf16,jetrl,jetrl-xtiles,jetrl+deepgemm,jetrl-xtiles+deepgemm --budget-s $(( ${MODEL_S:-250} - 30 )) \
            --out "$OUT/model/$t" > "$OUT/model/$t.log" 2>&1
        echo "== model step $t rc=$? at $((SECONDS - T0)) s"; tail -n 9 "$OUT/model/$t.log"
    done
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
echo "phase $PHASE done at $((SECONDS - T0)) s"
