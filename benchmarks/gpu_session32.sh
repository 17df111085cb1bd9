#!/usr/bin/env bash
# Session 32. Issue 15 (Jet-RL): the 7B actor update is 1.46-1.49x BF16 + glue on the H100 (1.54x is the target);
# ~18 of its ~26 ms a layer are DeepGEMM's FP8 GEMMs at ~1250-1300 TFLOP/s. DeepGEMM chooses each GEMM's block
# layout by a cycle model, not by timing; this session measures the alternatives. Run from the repository root on the
# device machine; the record is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session32.sh a   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~6 min)
#     DeepGEMM built with benchmarks/deepgemm_layouts.patch (DG_SM90_LAYOUTS names a layout per GEMM shape), every
#     candidate layout of the 7B layer's five large GEMM shapes compiled in 16 processes, then timed against the
#     heuristic's choice (benchmarks/kernels/deepgemm_layouts.py, two rounds; DG_PRINT_CONFIGS logs the heuristic's).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    mkdir -p "$OUT/layouts"
    for i in $(seq 0 15); do
        timeout -k 5 "${WARM_S:-240}" "$PY" benchmarks/kernels/deepgemm_layouts.py --warm $i/16 > "$OUT/layouts/warm$i.log" 2>&1 &
    done
    wait
    echo "== layouts compiled at $((SECONDS - T0)) s: $(cat "$OUT"/layouts/warm*.log | grep -c ' s$') ok," \
        "$(cat "$OUT"/layouts/warm*.log | grep -c refused) refused"
    grep -h refused "$OUT"/layouts/warm*.log | head -n 5
    DG_PRINT_CONFIGS=1 timeout -k 5 "${SWEEP_S:-150}" "$PY" benchmarks/kernels/deepgemm_layouts.py --out "$OUT/layouts" \
        > "$OUT/layouts/run.log" 2>&1
    echo "== sweep rc=$? at $((SECONDS - T0)) s"; grep -E "^GemmDesc|^\|" "$OUT/layouts/run.log" | cut -c1-400
    ;;
esac
phase_end
