#!/usr/bin/env bash
# Session 25. Issue 17: since session 24 compiled the glue, the 7B NVFP4+LoRA GRPO step fell behind BF16+LoRA's (update
# 9.2-11.3 s against 8.7-9.0 s, step 15.5-17.1 against 15.7-15.8): the dense path decodes each frozen weight again for
# every micro-batch of the log-prob pass and of each update (~40 decodes a projection a step). `optim.dequant_cache`
# (quarl.train.dequant_cache; auto by default) holds the BF16 copies through the log-prob pass and the updates when the
# memory left after the measured working set allows. Issue 15: DeepGEMM with the compiled glue (session 24's prepared
# phase g, `bash benchmarks/gpu_session24.sh g`, carry .dev/dg.tar.xz). Run from the repository root on the device
# machine; the record of what ran is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session25.sh a   (one GPU; ~7 min)
#     The held base's GPU test (bit-equal adapters, one decode a weight a phase) and the dense path's; the 7B GRPO step
#     (3 steps: auto holds from step 1) for BF16+LoRA and NVFP4+LoRA, then NVFP4+LoRA with optim.dequant_cache=false.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    tests 200 tests/train/test_dequant_cache_gpu.py tests/kernels/test_dense_gpu.py
    grpo "${GRPO_S:-210}" grpo_held --steps 3
    grpo "${GRPO2_S:-130}" grpo_nohold --formats nvfp4 --steps 3 --set optim.dequant_cache=false
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
