#!/usr/bin/env bash
# Session 10 (2026-11-26, second device session of the day): issue 15's whole actor update with the rl stage's own
# loss and Liger's fused kernels (policy.use_liger_kernel), and where its time goes. Run from the repository root on
# the device machine; the record of what ran is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session10.sh a   carry: .dev/dg.tar.xz .dev/whl   (one GPU; ~5 min)
#     1. GPU tests: Liger inside quarl's models (tests/train/test_fused_kernels_gpu.py: loss and every gradient vs
#        transformers' eager code, BF16 and full-parameter Jet-RL) and session 9's failed LoRA A partials test
#        (its LoRA targets fixed);
#     2. benchmarks/fp8_model_step.py, Qwen2.5-7B width, 4 decoder layers + stem, 8k and 16k tokens, --loss rl (the
#        rl stage's chunked log-probs), BF16 vs Jet-RL (best recipe arms), each with and without Liger, and one
#        profiled step per arm (GPU time by kernel class) at 8k.
#     RAN at commit 327c7e1 (the +liger arms and tests/train/test_fused_kernels_gpu.py were removed after it:
#     Liger gained nothing; results in benchmarks/results/gpu_2026-11-26/s10/a).
#   phase b: bash benchmarks/gpu_session10.sh b   carry: .dev/dg.tar.xz .dev/whl   (one GPU; ~5 min)
#     The fused token log-prob kernel (quarl_kernels/token_logprob.py), which phase a's profile asked for (~40 ms of
#     fp32 passes over the logits in a 185 ms step): its GPU tests, then the same model step with
#     QUARL_LOGPROB_KERNEL=0 (PyTorch ops) and 1 (the kernel), 8k (profiled) and 16k tokens.
#   phase c: bash benchmarks/gpu_session10.sh c   carry: .dev/dg.tar.xz .dev/whl   (one GPU; ~3 min)
#     The model step at Qwen3-8B width (4 layers), 8k and 16k tokens, the kernel on.
#   phase f: bash benchmarks/gpu_session10.sh f   (one GPU; ~5 min)
#     The FP8 decode GEMV (quarl_kernels/fp8_gemv.py): its GPU tests (against cuBLAS's blockwise GEMM, in a CUDA
#     graph, through the linear), the launch-setting sweep against cuBLAS FP8 and BF16 at Qwen3-8B shapes and
#     1-64 rows (benchmarks/kernels/bench_fp8_gemv.py), and the 8B decode-GEMM step with QUARL_FP8_GEMV=0 / 1.
#   phase g: bash benchmarks/gpu_session10.sh g   (one GPU; ~4 min)
#     Issue 15's FP8 rollout decode through the engine (benchmarks/rollout.py, new 8b shape and fp8 variant: the
#     rl stage's Jet-RL rollout recipe), BF16 vs FP8 with the GEMV and FP8 without it, batch 1 / 8 / 64.
#   phase e: bash benchmarks/gpu_session10.sh e   carry: .dev/dg.tar.xz .dev/whl   (one GPU; ~8 min)
#     1. issue 17's rollout table with the defaults (session 9's ran with the slower LoRA A partials switched on);
#     2. session 9's phase b, not run then: the DeepGEMM anomaly (every layer-step arm also as one CUDA graph per
#        step, SM clock / power / temperature logged every 200 ms).
#
# .dev/dg.tar.xz: see benchmarks/gpu_session8.sh; .dev/whl: liger_kernel-0.8.5-py3-none-any.whl (PyPI), installed
# with --no-deps into /tmp/site (torch and triton are the machine's).
set -u
: "${OUT:?}"
PHASE=${1:?phase}
T0=$SECONDS
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .dev/whl/liger_kernel-*.whl || exit 4
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
echo "phase $PHASE: $(tail -n +2 "$OUT/gpu.txt" | head -1)"
if [ "$PHASE" != f ] && [ "$PHASE" != g ]; then  # phases f and g need no DeepGEMM
    [ -d .dg/DeepGEMM ] || tar xJf .dev/dg.tar.xz
    # the library script sets PHASE, T0 and PYTHONPATH (setup_deepgemm) for itself: keep this script's
    KEEP_PHASE=$PHASE KEEP_T0=$T0
    source benchmarks/gpu_session7.sh lib > /dev/null
    setup_deepgemm > /dev/null 2>&1
    PHASE=$KEEP_PHASE T0=$KEEP_T0
    export PYTHONPATH=$PYTHONPATH:/tmp/site
    echo "== DeepGEMM ready at $((SECONDS - T0)) s: $(ls /tmp/dg/deep_gemm/_C*.so 2>&1 | head -1)"
fi

model_step() {  # tag shape tokens extra-args...   (ARMS: the arms)
    local tag=$1 shape=$2 t=$3; shift 3
    timeout -k 5 "${MODEL_S:-200}" "$PY" benchmarks/fp8_model_step.py --shape "$shape" --layers 4 --tokens "$t" \
        --loss rl --arms "$ARMS" --budget-s $(( ${MODEL_S:-200} - 30 )) --out "$OUT/model/$tag$shape-$t" "$@" \
        > "$OUT/model/$tag$shape-$t.log" 2>&1
    echo "== model step $tag$shape $t rc=$? at $((SECONDS - T0)) s"; sed -n '/^# actor update/,$p' "$OUT/model/$tag$shape-$t.log"
}

mkdir -p "$OUT/model"
case "$PHASE" in
a)
    mkdir -p "$OUT/tests"
    QUARL_ENGINE_LORA_A=1 timeout -k 5 "${TEST_S:-120}" "$PY" -m pytest -q -rfEs -m gpu -p no:cacheprovider \
        tests/train/test_fused_kernels_gpu.py \
        "tests/kernels/test_epilogue_gpu.py::test_packed_group_takes_the_partials_route_in_a_cuda_graph" \
        > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR|SKIP" "$OUT/tests/pytest.log" | tail -n 12
    ARMS=bf16,bf16+liger,jetrl+deepgemm,jetrl+deepgemm+liger,jetrl-xtiles+deepgemm,jetrl-xtiles+deepgemm+liger
    model_step "" Qwen2.5-7B 8192 --profile
    model_step "" Qwen2.5-7B 16384
    ;;
b)
    mkdir -p "$OUT/tests"
    timeout -k 5 "${TEST_S:-120}" "$PY" -m pytest -q -rfEs -m gpu -p no:cacheprovider tests/kernels/test_token_logprob_gpu.py \
        > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "^E |passed|failed|FAILED|ERROR|SKIP" "$OUT/tests/pytest.log" | tail -n 30
    ARMS=bf16,jetrl+deepgemm,jetrl-xtiles+deepgemm
    for k in 0 1; do
        export QUARL_LOGPROB_KERNEL=$k
        model_step "lpk$k-" Qwen2.5-7B 8192 --profile
        model_step "lpk$k-" Qwen2.5-7B 16384
    done
    ;;
c)
    mkdir -p "$OUT/tests"
    timeout -k 5 "${TEST_S:-120}" "$PY" -m pytest -q -rfEs -m gpu -p no:cacheprovider tests/kernels/test_token_logprob_gpu.py \
        > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "^E |passed|failed|FAILED|ERROR|SKIP" "$OUT/tests/pytest.log" | tail -n 30
    export QUARL_LOGPROB_KERNEL=1
    ARMS=bf16,jetrl+deepgemm,jetrl-xtiles+deepgemm
    model_step "" Qwen3-8B 8192
    model_step "" Qwen3-8B 16384
    ;;
e)
    mkdir -p "$OUT/roll" "$OUT/s9b"
    timeout -k 5 "${ROLL_S:-170}" "$PY" benchmarks/rollout.py --models 7b,14b --variants bf16+lora,nvfp4+lora \
        --hf-new-tokens 0 --budget-s $(( ${ROLL_S:-170} - 15 )) --out "$OUT/roll" > "$OUT/roll/run.log" 2>&1
    echo "== rollout table rc=$? at $((SECONDS - T0)) s"; grep -A 20 "^| model" "$OUT/roll/run.log" | head -n 16
    OUT="$OUT/s9b" LAYER_S=${LAYER_S:-200} WARM_S=${WARM_S:-90} bash benchmarks/gpu_session9.sh b
    ;;
f)  # the FP8 decode GEMV (quarl_kernels/fp8_gemv.py): GPU tests, kernel sweep vs cuBLAS, decode step with / without
    mkdir -p "$OUT/tests" "$OUT/gemv" "$OUT/dec0" "$OUT/dec1"
    timeout -k 5 "${TEST_S:-60}" "$PY" -m pytest -q -rfEs -m gpu -p no:cacheprovider tests/kernels/test_fp8_gemv_gpu.py \
        > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "^E |passed|failed|FAILED|ERROR|SKIP" "$OUT/tests/pytest.log" | tail -n 30
    timeout -k 5 "${GEMV_S:-60}" "$PY" benchmarks/kernels/bench_fp8_gemv.py --budget-s $(( ${GEMV_S:-60} - 20 )) \
        --rows 1,8,16,64 --configs "${GEMV_CONFIGS:-default}" --out "$OUT/gemv" > "$OUT/gemv/run.log" 2>&1
    echo "== GEMV sweep rc=$? at $((SECONDS - T0)) s"; sed -n '/^# FP8 decode GEMM/,$p' "$OUT/gemv/run.log"; tail -n 3 "$OUT/gemv/run.log"
    for k in 0 1; do  # 0: cuBLAS at every batch; 1: the GEMV up to 64 rows
        QUARL_FP8_GEMV=$k timeout -k 5 "${DEC_S:-40}" "$PY" benchmarks/fp8_linear.py --batches 1,8,16,64 \
            --skip correctness,quantizers,training,profile_gate --budget-s $(( ${DEC_S:-50} - 10 )) --out "$OUT/dec$k" \
            > "$OUT/dec$k/run.log" 2>&1
        echo "== decode QUARL_FP8_GEMV=$k rc=$? at $((SECONDS - T0)) s"; grep "^decode" "$OUT/dec$k/run.log"
    done
    ;;
g)  # issue 15: FP8 vs BF16 rollout decode through the engine, Qwen3-8B shape, batch 1 / 8 / 64, with the FP8 GEMV
    # (default: <= 16 rows) and without it (QUARL_FP8_GEMV=0)
    mkdir -p "$OUT/roll" "$OUT/roll0"
    timeout -k 5 "${ROLL_S:-150}" "$PY" benchmarks/rollout.py --models 8b --variants bf16,fp8 --new-tokens 512 \
        --hf-new-tokens 0 --budget-s $(( ${ROLL_S:-150} - 15 )) --out "$OUT/roll" > "$OUT/roll/run.log" 2>&1
    echo "== rollout rc=$? at $((SECONDS - T0)) s"; grep -A 9 "^| model" "$OUT/roll/run.log"
    QUARL_FP8_GEMV=0 timeout -k 5 "${ROLL0_S:-90}" "$PY" benchmarks/rollout.py --models 8b --variants fp8 \
        --new-tokens 512 --hf-new-tokens 0 --budget-s $(( ${ROLL0_S:-90} - 15 )) --out "$OUT/roll0" \
        > "$OUT/roll0/run.log" 2>&1
    echo "== rollout, no GEMV, rc=$? at $((SECONDS - T0)) s"; grep -A 6 "^| model" "$OUT/roll0/run.log"
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
# the device tool returns a limited number of files: one archive of the run's (phase b lost 7 files to that limit)
tar czf "$OUT/phase-$PHASE.tar.gz" -C "$OUT" --exclude "phase-$PHASE.tar.gz" --exclude gpu.txt . 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name "phase-$PHASE.tar.gz" ! -name gpu.txt -exec rm -rf {} +
echo "phase $PHASE done at $((SECONDS - T0)) s"

# ---------------------------------------------------------------------------------------------------------------
# Record of the calls (2026-11-26, one H100 80GB HBM3 each; results/gpu_2026-11-26/s10/<x>):
#   a  phase a at 327c7e1, carry .dev/dg.tar.xz .dev/whl: 195 s (GPU tests 2 passed, 1 failed: Liger + Jet-RL)
#   b  phase b at 29213e2, same carry: 222 s (the log-prob kernel's tiny-model GPU test needed the embedded model:
#      fixed in 5f848b3; 7 of its files exceeded the tool's file count, the logs kept the tables)
#   c  phase c at 5f848b3, same carry: 92 s (GPU tests 3 passed)
#   d  the 7B GRPO step with and without the log-prob kernel, at 5f848b3, one command on the warm machine (187 s):
#      export PYTHONPATH=$PWD:$PWD/kernels; for k in 1 0; do QUARL_LOGPROB_KERNEL=$k timeout -k 10 270 \
#        python3 benchmarks/grpo_step_gpu.py --out $OUT/g/lpk$k --work /tmp/grpo7_work$k > $OUT/g/lpk$k.log 2>&1; done
#   e  phase e at 3c04f3b, same carry: 308 s (the rollout table's 14B batch-64 cell ran out of its budget share)
#   f  phase f at a681920 (DeepGEMM skipped): 35 s -- GEMV tests 17 failed (the bf16 check's tolerance, a test bug:
#      near-zero outputs), default-setting sweep, decode A/B
#   f2 phase f at 4a2182e with TEST_S=90 GEMV_S=170 GEMV_CONFIGS=all DEC_S=1: tests 17 passed; the sweep stopped
#      (the default setting was not among GEMV_CONFIGS: fixed in cc1dd03)
#   f3 phase f at cc1dd03 with TEST_S=1 GEMV_S=170 GEMV_CONFIGS=all DEC_S=1: the sweep of 13 settings
#   f4 phase f at dee4f26 (the sweep's settings as defaults) with TEST_S=60 GEMV_S=60 DEC_S=40: 17 passed, sweep,
#      decode A/B
#   g  phase g at 00ad5d0: 93 s
#   h  at 00ad5d0, one command: export PYTHONPATH=$PWD:$PWD/kernels; timeout -k 5 200 python3 -m pytest -q -rfE -m gpu
#      -p no:cacheprovider tests/quant/test_fp8_linear.py tests/engine/test_engine_gpu.py tests/rl/test_precision.py
#      -> 18 passed, 8 skipped
