#!/usr/bin/env bash
# Session 29. Every GPU test of the repository at the code of sessions 24-28 (the compiled glue, the held base, the
# FP8 flow's in-place tiles, bias epilogue, fused SwiGLU backward and q / k / v stack, the engine on a stacked Jet-RL
# model), none of which had run as a whole suite since session 23. Run from the repository root on the device
# machine; the record is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session29.sh a   (kind nvidia-h100-x4 or h200-x4; carry .dev/dg.tar.xz and
#            .whl/bnb-site -- bitsandbytes 0.50.2 installed with --no-deps --target, every libbitsandbytes_*.so but
#            cpu and cuda130 deleted; ~9.5 min)
#     benchmarks/gpu_suite.py --gpus 4: the 25 files with the gpu marker, one pytest each, four at a time, each on its
#     own GPU, longest first; DeepGEMM is built in the background meanwhile and its two files
#     (test_fp8_linear.py, test_fp8_stack_gpu.py) wait for it (--late / --after).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    export PYTHONPATH=$PYTHONPATH:/tmp/dg:$PWD/.whl/bnb-site
    nvidia-smi -L | tee "$OUT/gpus.txt"
    rm -f /tmp/dg.ready
    (deepgemm > "$OUT/deepgemm.log" 2>&1; touch /tmp/dg.ready) &
    "$PY" -c "import bitsandbytes as b; print('bitsandbytes', b.__version__)" 2>&1 | tail -n 1
    mkdir -p "$OUT/suite"
    timeout -k 5 "${SUITE_S:-550}" "$PY" benchmarks/gpu_suite.py --out "$OUT/suite" --gpus "${GPUS:-4}" \
        --budget-s $(( ${SUITE_S:-550} - 15 )) --late tests/quant/test_fp8_linear.py,tests/quant/test_fp8_stack_gpu.py \
        --after /tmp/dg.ready 2>&1 | tee "$OUT/suite/run.log" | tail -n 60
    cat "$OUT/deepgemm.log"
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
