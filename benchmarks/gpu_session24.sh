#!/usr/bin/env bash
# Session 24: issue 15's whole actor update. Sessions 9-15 left Jet-RL's 1.54x unreached (1.26-1.27x at 7B width,
# 1.36-1.39x at 32B): the FP8 projections reach 1.4-1.5x, and everything else in a decoder layer stays BF16-priced.
# Session 10's Liger arms (RMSNorm / RoPE / SwiGLU fused) moved nothing -- but its profile's norm class and "other"
# were the same to 0.1 ms with and without Liger, which says Liger's kernels never ran rather than that the glue is
# cheap. This session: the glue compiled by torch.compile (quarl.train.fused_glue, the +glue arms of
# benchmarks/fp8_model_step.py), and a per-layer profile (step - stem by kernel class, 40 longest kernels).
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session24.sh a   (one GPU; ~6 min)
#     tests/train/test_fused_glue_gpu.py (inductor's glue against eager, BF16 and Jet-RL models); then the actor
#     update at Qwen2.5-7B width, 4 layers: bf16, bf16+glue, jetrl-xtiles, jetrl-xtiles+glue (cuBLAS FP8: no DeepGEMM
#     build) at 8k tokens with --profile, then 16k tokens.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    tests 150 tests/train/test_fused_glue_gpu.py
    model_step "${M8_S:-230}" g8 --shape Qwen2.5-7B --layers 4 --tokens 8192 --loss rl --profile --iters 6 \
        --arms bf16,bf16+glue,jetrl-xtiles,jetrl-xtiles+glue
    model_step "${M16_S:-170}" g16 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl --iters 6 \
        --arms bf16,bf16+glue,jetrl-xtiles,jetrl-xtiles+glue
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
