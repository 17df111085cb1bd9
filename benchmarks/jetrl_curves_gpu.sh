#!/usr/bin/env bash
# Reward curves of Jet-RL's three precision flows (bf16, fp8-rollout, jetrl) with the same seed, on
# one GPU in ~200 s: three `quarl rl` trainings side by side as processes (the learning benchmark's
# settings: built-in level-1 problems, 16 prompts x 8 answers, 128 new tokens, LoRA r32, lr 2e-4),
# each stopped by train.max_time_s, then each adapter evaluated greedily on held-out problems
# against its own base (BF16, or the FP8 base with FP8 activations for jetrl), if time allows.
#
#   OUT=$OUT DATA=runs/jetrl/data/builtin-l1 bash benchmarks/jetrl_curves_gpu.sh
#   OUT=/tmp/dry DATA=runs/jetrl/data/builtin-l1 DEVICE=cpu MODEL=tiny-qwen2 bash benchmarks/jetrl_curves_gpu.sh
#
# DATA: a `quarl data-prep` artifact, built on the CPU host and carried (240 KB):
#   quarl data-prep --config quarl/recipes/data/default.yaml --set template=chat --set tokenizer=default \
#       --set 'sources=[{name: synthetic, num_samples: 2400, max_difficulty: 1}]' --set split.eval_size=400 \
#       --output runs/jetrl/data/builtin-l1
# At DEADLINE (seconds after start) whatever still runs is stopped and the curves logged so far are
# collected (--report-only). Outputs in $OUT: jetrl_curves.{json,md,png}, jetrl_curves_table.md
# (the RESULTS.md block), curves.log, gpu.txt, and results.tgz (logs, metrics.jsonl, samples,
# eval artifacts; no weights).
set -u
: "${OUT:?}" "${DATA:?}"
T0=$SECONDS
DEADLINE=${DEADLINE:-195}
TRAIN_S=${TRAIN_S:-105}
EVAL_N=${EVAL_N:-200}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-default}
PY=${PYTHON:-python3}
W=${WORK:-/tmp/jetrl_curves}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}  # five processes on 16 cores
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export PYTHONPATH=$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$W" "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
# convert the embedded GGUF into the cache once, before five processes race to do it
"$PY" -c "from quarl.models import load_model; load_model('$MODEL')" > "$OUT/warm.log" 2>&1

if [ "$DEVICE" = cuda ]; then
    SIZE=(--steps 200 --prompts-per-step 16 --group-size 8 --max-new-tokens 128 --micro-batch 16
          --rl-set optim.logprob_chunk=256 --eval-problems "$EVAL_N")
else  # the dry run: a tiny model, two steps
    SIZE=(--steps 2 --prompts-per-step 2 --group-size 2 --max-new-tokens 8 --micro-batch 4 --eval-problems 4)
fi
ARGS=(--task builtin --data "$DATA" --policies bf16,fp8-rollout,jetrl --lr 2e-4 "${SIZE[@]}"
      --train-seconds "$TRAIN_S" --parallel 5 --device "$DEVICE" --model "$MODEL"
      --work "$W" --out "$OUT" --name jetrl_curves)
"$PY" benchmarks/rl_learning.py "${ARGS[@]}" > "$OUT/curves.log" 2>&1 &
MAIN=$!
STOP=$((DEADLINE - 15))  # leaves time to collect, render and pack
while kill -0 "$MAIN" 2>/dev/null && [ $((SECONDS - T0)) -lt "$STOP" ]; do sleep 2; done
if kill -0 "$MAIN" 2>/dev/null; then
    echo "deadline at $((SECONDS - T0)) s: stopping the runs, collecting what they logged" | tee -a "$OUT/curves.log"
    for c in $(pgrep -P "$MAIN"); do kill -TERM "$c"; done  # the job processes rl_learning.py started
    kill -TERM "$MAIN"
    sleep 2
    "$PY" benchmarks/rl_learning.py "${ARGS[@]}" --report-only >> "$OUT/curves.log" 2>&1
fi
"$PY" benchmarks/jetrl_curves.py "$OUT/jetrl_curves.json" --out "$OUT/jetrl_curves_table.md" > /dev/null \
    2>> "$OUT/curves.log"
tar czf "$OUT/results.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude=checkpoints --exclude=tensorboard \
    -C "$W" . 2>/dev/null
echo "done after $((SECONDS - T0)) s"
grep -E "started|exited|deadline" "$OUT/curves.log" | tail -n 12
cat "$OUT/jetrl_curves_table.md" 2>/dev/null
