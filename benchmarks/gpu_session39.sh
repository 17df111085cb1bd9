#!/usr/bin/env bash
# Session 39. Session 38's prepared phases, in its order: the fused sampler's GPU tests and whether it pays (g, h),
# then the GPU tests session 37's splits' calls did not reach and the 7B actor update after fp8_linear's split (e).
# Run from the repository root on the device machine; the record is at the end of this file.
#
#   phase g: bash benchmarks/gpu_session39.sh g   (no kind; ~9 min) -- session 38's phase g.
#   phase h: bash benchmarks/gpu_session39.sh h   (g's machine, warm; ~9 min) -- session 38's phase h.
#   phase e: bash benchmarks/gpu_session39.sh e   (warm after h; carry .dev/dg.tar.xz; ~9 min) -- session 38's phase e
#     reordered: the 7B actor update first, the engine's tests with the fused sampler on, the ring's last.
set -u
PHASE=${1:?phase}
case $PHASE in
g) exec bash benchmarks/gpu_session38.sh g ;;
h) exec bash benchmarks/gpu_session38.sh h ;;
e)  # session 38's e, reordered so that the 7B update (issue 15's figure) comes first and the engine's tests run with the
    # fused sampler on (g's were cut at 15 of 18); the ring's tests last, with what is left of the call
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg TESTS_V=1
    model_step 150 p7_r2 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8 --repeat 2
    QUARL_ENGINE_FUSED_SAMPLE=1 tests 110 tests/engine/test_engine_gpu.py
    mv "$OUT/tests" "$OUT/tests_engine"
    tests 130 tests/kernels/test_fp8_quant_gpu.py tests/kernels/test_fp8_swiglu_gpu.py tests/train/test_fused_glue_gpu.py
    mv "$OUT/tests" "$OUT/tests_fp8"
    tests $(( 560 - SECONDS + T0 )) tests/kernels/test_wgmma_ring_gpu.py
    mv "$OUT/tests" "$OUT/tests_ring"
    phase_end ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease; raw under results/gpu_2026-11-28/s39/):
