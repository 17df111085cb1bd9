#!/usr/bin/env bash
# Session 18: issue 17's "M >= 2048 at >= 0.95x cuBLAS BF16" through the issue's own suggestion -- NVFP4 weights
# expanded to FP8 tiles with FP8 tensor-core GEMMs, opt-in (QUARL_KERNELS_DENSE_FP8=1, quarl_kernels/dense_fp8.py),
# measured against the weight-only dense path and cuBLAS on BF16 weights; then what it does to the 7B GRPO step.
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers (tests, grpo, phase_end).
#
#   phase a: bash benchmarks/gpu_session18.sh a   (one GPU; ~5 min)
#     GPU tests of the FP8 dense path and the BF16 one, then bench_dense_fp8.py: cuBLAS BF16 / dense / FP8 at
#     2048..16384 rows, forward and DGrad, on the 7B gate / up, down, q / o and 14B gate+up weights.
#   phase b: bash benchmarks/gpu_session18.sh b   (one GPU; ~5 min)
#     the 7B GRPO step (8 x 8, 256 + 512 tokens): BF16+LoRA and NVFP4+LoRA, then NVFP4+LoRA with the FP8 dense path
#     (step times and the rollout/trainer log-prob mismatch).
#   phase c: bash benchmarks/gpu_session18.sh c   (one GPU; ~4 min)
#     after a: the expansion kernel rewritten (exponent from the scale bytes, 32-row chunks, 4 warps) and nothing
#     kept for the backward; its GPU tests, bench_dense_fp8.py on two shapes, and one LoRA micro-batch update
#     (lora_update_step.py, 4 layers of 7B width, 8 x 768 tokens) BF16 / NVFP4 / NVFP4 with the FP8 path, profiled.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    tests 150 tests/kernels/test_dense_fp8_gpu.py tests/kernels/test_dense_gpu.py
    mkdir -p "$OUT/fp8"
    (cd benchmarks/kernels && timeout -k 5 "${BENCH_S:-360}" "$PY" bench_dense_fp8.py --out "$OUT/fp8" --repeats 3) \
        > "$OUT/fp8/run.log" 2>&1
    echo "== dense fp8 bench rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/fp8/run.log" | head -n 40
    ;;
b)
    grpo "${GRPO_S:-170}" grpo
    QUARL_KERNELS_DENSE_FP8=1 grpo "${GRPO_S2:-120}" grpo_fp8 --formats nvfp4
    "$PY" - "$OUT" <<'PYEOF'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("grpo*/grpo_step_gpu.json")):
    for r in json.loads(f.read_text())["results"]:
        print(f.parent.name, r["format"], [(s["step"], s["mismatch_abs_logprob_diff"]) for s in r["steps"]])
PYEOF
    ;;
c)
    tests 100 tests/kernels/test_dense_fp8_gpu.py
    mkdir -p "$OUT/fp8"
    (cd benchmarks/kernels && timeout -k 5 150 "$PY" bench_dense_fp8.py --out "$OUT/fp8" --repeats 2 \
        --shapes 18944x3584,3584x18944 --ms 2048,8192) > "$OUT/fp8/run.log" 2>&1
    echo "== dense fp8 bench rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/fp8/run.log" | head -n 12
    mkdir -p "$OUT/lu"
    timeout -k 5 "${LU_S:-240}" "$PY" benchmarks/lora_update_step.py --arms bf16,nvfp4,nvfp4:fp8 --profile \
        --out "$OUT/lu" > "$OUT/lu/run.log" 2>&1
    echo "== lora update step rc=$? at $((SECONDS - T0)) s"; grep -v Warning "$OUT/lu/run.log" | tail -n 60
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------- record
