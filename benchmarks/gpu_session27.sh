#!/usr/bin/env bash
# Session 27. Issue 15: session 26's final code (its pruned launch candidates, the fast engine's refresh of the FP8
# master tiles before each rollout) had not run on a GPU, nor had the persistent, prefetching Gluon quantizer. Run from
# the repository root on the device machine; the record of what ran is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session27.sh a   (carry .dev/dg.tar.xz .whl/bnb-site; one GPU; ~6 min)
#     DeepGEMM built; the quantizers', the FP8 linear's and the engine's GPU tests; each operand's settings timed beside
#     the Gluon kernels (benchmarks/kernels/fp8_quant_operands.py --gluon: the persistent kernel's bytes checked first).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 240 tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py tests/engine/test_engine_gpu.py
    bench 100 quant_gluon benchmarks/kernels/fp8_quant_operands.py --gluon
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
