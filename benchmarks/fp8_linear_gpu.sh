#!/usr/bin/env bash
# Jet-RL's FP8 training linear on one H100 in one ~150 s device call: the GPU tests of the fused
# FP8 quantizers and of the FP8 linear (bit-identity with eager, cuBLAS == emulated), then the
# timing benchmark (BF16 vs FP8 with fused quantizers vs FP8 with the old compiled ones).
#
#   OUT=$OUT bash benchmarks/fp8_linear_gpu.sh            # DEADLINE=150 (seconds) by default
# (58 s with a 24 s test timeout was too short on 2026-11-25: cold Triton/Inductor compiles ate it)
#   OUT=/tmp/dry DEVICE=cpu bash benchmarks/fp8_linear_gpu.sh   # CPU dry run (tiny shapes, no GPU tests)
#
# Tests first (they also fill Triton's and Inductor's on-disk caches, so the benchmark's compiles
# are warm), each part under `timeout`; the benchmark stops starting measurements at its budget and
# rewrites fp8_linear.json after every row, so a cut-off run still leaves what it finished.
# Outputs in $OUT: gpu.txt, gpu_tests.log, fp8_linear.log, fp8_linear.json.
set -u
: "${OUT:?}"
T0=$SECONDS
DEADLINE=${DEADLINE:-150}
DEVICE=${DEVICE:-cuda}
TEST_S=${TEST_S:-$((DEADLINE * 2 / 5))}  # 60 s of the default 150; 24 s of a 60 s DEADLINE
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1

if [ "$DEVICE" = cuda ]; then
    timeout -k 2 "$TEST_S" "$PY" -m pytest -q -m gpu -p no:cacheprovider \
        tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py > "$OUT/gpu_tests.log" 2>&1
    echo "gpu tests rc=$? after $((SECONDS - T0)) s" | tee -a "$OUT/gpu_tests.log"
    EXTRA=()
else
    echo "cpu dry run: GPU tests not run" > "$OUT/gpu_tests.log"
    EXTRA=(--device cpu --iters 2)
fi

LEFT=$((DEADLINE - (SECONDS - T0)))
[ "$LEFT" -lt 12 ] && LEFT=12  # a run of the tests to their timeout still leaves the benchmark a try
BUDGET=$((LEFT - 9))   # start no measurement after this; leaves time for the last row, the tables, exit
[ "$BUDGET" -lt 5 ] && BUDGET=5
timeout -k 2 "$((LEFT - 1))" "$PY" benchmarks/fp8_linear.py --out "$OUT" --budget-s "$BUDGET" "${EXTRA[@]}" \
    > "$OUT/fp8_linear.log" 2>&1
echo "benchmark rc=$? after $((SECONDS - T0)) s (budget ${BUDGET} s)" | tee -a "$OUT/fp8_linear.log"

echo "== GPU tests"; grep -E "passed|failed|error|rc=" "$OUT/gpu_tests.log" | tail -n 12
echo "== benchmark"; sed -n '/^# FP8 vs BF16/,$p' "$OUT/fp8_linear.log" | tail -n 30
grep -E "^(train|quant|decode|budget)|failed" "$OUT/fp8_linear.log" | tail -n 14
