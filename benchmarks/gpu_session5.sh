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
    SMALL=(--device cpu --shape tiny --big-shape tiny --fsdp-shape tiny --prompts 4 --group 4 --big-group 2
           --prompt-len 16 --new-tokens 8 --fsdp-seq-len 64 --fsdp-new-tokens 8 --micro-batch 4)
else
    NGPU=$(nvidia-smi -L 2>/dev/null | wc -l); TORCHRUN=torchrun; SMALL=(); GRPO=(); GPTQ=()
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
esac
echo "phase $PHASE done after $((SECONDS - T0)) s"
