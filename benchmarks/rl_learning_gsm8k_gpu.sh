#!/usr/bin/env bash
# Second device call of the learning benchmark (PROBE=1 adds the NaN probe; MB = micro-batch rows): GSM8K again, after all three policies stopped at step 12
# with a NaN gradient (finite loss) in the first call. Runs (1) benchmarks/rl_nan_probe.py, replaying
# the failing bf16-lora run (micro-batches of 16 rows = 2 prompts, so left padding inside a micro-batch)
# with the attention backward instrumented, and (2) the three GSM8K policies with micro-batches of
# 8 rows = one prompt's group (identical prompts: no left padding, so quarl.rl.logprobs runs them with
# no attention mask at all since the fix in completion_logprobs).
#   OUT=/tmp/out DATA=/path/to/datasets LR=2e-4 TRAIN_S=300 bash benchmarks/rl_learning_gsm8k_gpu.sh
set -u
: "${OUT:?}" "${DATA:?}"
T0=$SECONDS
DEADLINE=${DEADLINE:-540}
export OMP_NUM_THREADS=2 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
W=${WORK:-/tmp/rll}
mkdir -p "$W" "$OUT"
python3 -c "from quarl.models import load_model; load_model('default')" > "$OUT/warm.log" 2>&1
if [ "${PROBE:-0}" = 1 ]; then
    python3 benchmarks/rl_nan_probe.py --data "$DATA/gsm8k" --out "$OUT/rl_nan_probe.json" > "$OUT/probe.log" 2>&1 &
fi
python3 benchmarks/rl_learning.py --task gsm8k --data "$DATA/gsm8k" --policies bf16-lora,nvfp4-lora,nvfp4-lora-aqn \
    --steps 150 --prompts-per-step 16 --group-size 8 --max-new-tokens 256 --lr "${LR:-2e-4}" \
    --micro-batch "${MB:-16}" --rl-set optim.logprob_chunk=256 --train-seconds "${TRAIN_S:-300}" --eval-problems 400 \
    --parallel 5 --work "$W/gsm8k" --out "$OUT" > "$OUT/gsm8k.log" 2>&1 &
while [ -n "$(jobs -rp)" ] && [ $((SECONDS - T0)) -lt "$DEADLINE" ]; do sleep 5; done
for p in $(jobs -rp); do echo "deadline: stopping $p"; pkill -TERM -P "$p"; kill -TERM "$p"; done
sleep 2
tar czf /tmp/results.tgz --exclude='*.safetensors' --exclude='*.pt' --exclude=checkpoints --exclude=tensorboard \
    -C "$W" . -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
tar xzf "$OUT/results.tgz" -O ./gsm8k.log 2>/dev/null | grep -v '^\s' | tail -n 40
tar xzf "$OUT/results.tgz" -O ./rl_nan_probe.json 2>/dev/null | tail -n 40
