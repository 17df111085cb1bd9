#!/usr/bin/env bash
# The whole learning benchmark in one GPU call (~8 min on an H100): both tasks, every policy, the
# entropy control, side by side as processes on one GPU (a 135M model leaves it mostly idle).
#
#   OUT=/tmp/out DATA=/path/to/datasets LR=2e-4 TRAIN_S=300 bash benchmarks/rl_learning_gpu.sh
#
# DATA holds two `quarl data-prep` artifacts (chat template, SmolLM2 tokenizer):
#   builtin-l1  the built-in generator, level 1 only (2400 problems: 2000 train / 400 held out)
#   gsm8k       GSM8K train (7473) / test (1319) from /work/shared/data/gsm8k
# Each training run stops at TRAIN_S seconds (train.max_time_s) or its planned steps, whichever
# comes first; its adapter is then evaluated greedily on the held-out split against its own base.
set -u
: "${OUT:?}" "${DATA:?}"
T0=$SECONDS
DEADLINE=${DEADLINE:-560}  # seconds after start: copy whatever exists and stop (a device call ends at 600)
export OMP_NUM_THREADS=2    # a dozen processes on 16 cores
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # a dozen processes share the GPU's memory
LR=${LR:-2e-4}
TRAIN_S=${TRAIN_S:-300}
W=${WORK:-/tmp/rll}
mkdir -p "$W" "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
# convert the embedded GGUF into the cache once, before a dozen processes race to do it
python3 -c "from quarl.models import load_model; load_model('default')" > "$OUT/warm.log" 2>&1

python3 benchmarks/rl_learning.py --task builtin --data "$DATA/builtin-l1" \
    --policies "bf16-lora,nvfp4-lora,nvfp4-lora-aqn,bf16-lora-dapo,bf16-lora@${LR_HI:-5e-4}" \
    --steps 200 --prompts-per-step 16 --group-size 8 --max-new-tokens 128 --lr "$LR" \
    --micro-batch 16 --rl-set optim.logprob_chunk=256 \
    --train-seconds "$TRAIN_S" --eval-problems 400 --parallel 7 --work "$W/builtin" --out "$OUT" \
    > "$OUT/builtin.log" 2>&1 &
python3 benchmarks/rl_learning.py --task gsm8k --data "$DATA/gsm8k" \
    --policies bf16-lora,nvfp4-lora,nvfp4-lora-aqn \
    --steps 150 --prompts-per-step 16 --group-size 8 --max-new-tokens 256 --lr "$LR" \
    --micro-batch 16 --rl-set optim.logprob_chunk=256 \
    --train-seconds "$TRAIN_S" --eval-problems 400 --parallel 5 --work "$W/gsm8k" --out "$OUT" \
    > "$OUT/gsm8k.log" 2>&1 &
python3 -m benchmarks.rl_entropy --device cuda --formats bf16,nvfp4,perturb-nvfp4 --prompts 64 \
    --new-tokens 128 --samples 4 --out "$OUT/rl_entropy_gpu.json" > "$OUT/entropy.log" 2>&1 &
# the rl stage from the command line, as a user runs it (QeRL's policy, this recipe, 60 steps)
python3 -m quarl.cli.main rl --config quarl/recipes/rl/smollm2-gpu.yaml --model default \
    --data "$DATA/builtin-l1" --output "$W/cli/adapter" --set train.steps=60 --set train.device=cuda \
    --set optim.micro_batch_size=16 --set optim.logprob_chunk=256 \
    --set "train.max_time_s=$TRAIN_S" > "$OUT/cli_rl.log" 2>&1 &
while [ -n "$(jobs -rp)" ] && [ $((SECONDS - T0)) -lt "$DEADLINE" ]; do sleep 5; done
for p in $(jobs -rp); do echo "deadline: stopping $p"; pkill -TERM -P "$p"; kill -TERM "$p"; done
sleep 2

# everything but the weights in one file (a device call returns at most 8 files)
cp "$W"/cli/adapter/report.html "$W"/cli/adapter/summary.json "$OUT/" 2>/dev/null
mv "$OUT"/report.html "$OUT"/cli_report.html 2>/dev/null; mv "$OUT"/summary.json "$OUT"/cli_summary.json 2>/dev/null
tar czf /tmp/results.tgz --exclude='*.safetensors' --exclude='*.pt' --exclude=checkpoints --exclude=tensorboard \
    -C "$W" . -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
tar xzf "$OUT/results.tgz" -O ./builtin.log ./gsm8k.log 2>/dev/null | grep -v '^\s' | tail -n 60
tar xzf "$OUT/results.tgz" -O ./entropy.log 2>/dev/null | grep -E '^(bf16|nvfp4|perturb)'
