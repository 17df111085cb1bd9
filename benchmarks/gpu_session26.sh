#!/usr/bin/env bash
# Session 26. Issue 15: (1) the FP8 linear kept serving a master weight's tiles from before an optimizer step when the
# optimizer moves no version counter -- torch's fused AdamW (fp8_model_step.py's) and bitsandbytes' 8-bit AdamW (the
# rl stage's default): every FP8 actor-update figure of sessions 9-25 left out the per-step weight quantization; fixed
# with an optimizer post-step hook (quarl.quant.fp8_linear). (2) X^T in 128x128 tiles (fp8_wgrad=tiles) now comes from
# the activation quantizer (quantize_act(t_tiles=True): no unused row-major codes, no third pass), and new one-kernel
# launch settings walk X^T's pass by column chunks (each transposed row 128 contiguous bytes). Run from the repository
# root on the device machine; the record of what ran is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session26.sh a   (carry .dev/dg.tar.xz .whl/bnb-site; one GPU; ~6 min)
#     DeepGEMM built; the quantizers' and the FP8 linear's GPU tests (every launch setting bit-equal to eager, X^T tiles,
#     the weight re-quantized after a bitsandbytes step on CUDA); the 32B-width actor update at 16k tokens, profiled,
#     bf16 / bf16+glue / jetrl-xtiles+deepgemm+glue (optimizer step every micro-batch, now with its weight quantization).
#   phase b: bash benchmarks/gpu_session26.sh b   (carry .dev/dg.tar.xz; one GPU; ~7 min)
#     The same at 7B width, then both widths with 8 micro-batches per optimizer step (--accumulate 8: an actor update's
#     mini-batch, the weight quantization amortized as in a real run).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 150 tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py
    model_step "${M32_S:-300}" p32 --shape Qwen2.5-32B --layers 4 --tokens 16384 --loss rl --profile --iters 3 \
        --arms bf16,bf16+glue,jetrl-xtiles+deepgemm+glue
    ;;
b)
    deepgemm
    model_step "${M7_S:-150}" p7 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl --profile --iters 3 \
        --arms bf16,bf16+glue,jetrl-xtiles+deepgemm+glue
    model_step "${M32A_S:-220}" p32acc8 --shape Qwen2.5-32B --layers 4 --tokens 16384 --loss rl --iters 2 \
        --accumulate 8 --arms bf16,bf16+glue,jetrl-xtiles+deepgemm+glue
    model_step "${M7A_S:-150}" p7acc8 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl --iters 2 \
        --accumulate 8 --arms bf16,bf16+glue,jetrl-xtiles+deepgemm+glue
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
