#!/usr/bin/env bash
# Session 30. Issue 17's rollout targets on the H200 (session 29: 2.46x / 2.06x / 1.18x at 7B, 2.37x / 2.02x at 14B
# batch 1 / 8 -- below the H100's, where the targets are met). Run from the repository root on the device machine;
# the record is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session30.sh a   (nvidia-h200; ~9 min)
#     Session 29's prepared phase g: the 7B / 14B table at batch 1 / 8 with and without the one-row GEMV's H200 rule
#     (QUARL_KERNELS_GEMV_DEFAULTS=h200: config 0 on every FP4 weight at one row, where the default takes config 7 on
#     long rows -- tuned in the H100 engine, session 12); then the 7B decode-step profile at batch 1 / 64, BF16+LoRA
#     and NVFP4+LoRA, on the H200 (where the time goes at 64, the batch the H200 misses by 2 %).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    rollout_table "${TABLE_S:-200}" 7b,14b 1,8 table
    QUARL_KERNELS_GEMV_DEFAULTS=h200 rollout_table "${TABLE_S:-150}" 7b,14b 1,8 table_h200 nvfp4+lora
    profile "${PROF_S:-200}" 7b bf16+lora,nvfp4+lora 1,64
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
