#!/usr/bin/env bash
# Session 37. Session 36's prepared phases first: the three decode kernels with their first weights loaded before the
# PDL wait (QUARL_KERNELS_GEMV_W_EARLY / _MMA_W_EARLY / _RING_W_EARLY, opt-in, CPU-checked only) -- their PDL chain
# tests on the GPU, then the rollout with and without them. Run from the repository root on the device machine; the
# record is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session37.sh a   (no kind; ~8 min) -- session 36's phase g: the PDL chain tests of the
#     three kernels, then the 7B rollout at batch 1 (NVFP4+LoRA) alternating twice without / with the GEMV's switch.
#   phase b: bash benchmarks/gpu_session37.sh b   (a's machine, warm; ~9 min; after a's tests passed) -- session 36's
#     phase h: 14B batch 1 without / with the GEMV's switch; 7B batch 8 and 64 alternating twice without / with the
#     mma.sync kernel's and the TMA ring's switches.
#   phase c: bash benchmarks/gpu_session37.sh c   (no kind; ~9 min) -- b's batch-8 gain made the mma.sync kernel's
#     switch the default (QUARL_KERNELS_MMA_W_EARLY, on unless 0): its GPU tests and the engine's with it on, then
#     14B batch 8 and 7B batch 16 alternating off / on.
#   phase d: bash benchmarks/gpu_session37.sh d   (no kind; ~9 min) -- c's engine tests were cut by their 200 s and
#     its 7B batch-16 runs by their budget: the 7B table at batch 1 / 8 / 16 / 64 at this code (the new default), the
#     NVFP4 side at batch 16 off / on / off again, then the engine's GPU tests.
set -u
PHASE=${1:?phase}
case $PHASE in
a) exec bash benchmarks/gpu_session36.sh g ;;
b)  # a's GEMV switch was slower (3.04 / 3.06 ms against 2.87 / 2.86): 14B's run of it dropped; batch 8 / 64 only
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    rollout_table 100 7b 8,64 h7_plain
    QUARL_KERNELS_MMA_W_EARLY=1 QUARL_KERNELS_RING_W_EARLY=1 rollout_table 80 7b 8,64 h7_early nvfp4+lora
    rollout_table 80 7b 8,64 h7_plain2 nvfp4+lora
    QUARL_KERNELS_MMA_W_EARLY=1 QUARL_KERNELS_RING_W_EARLY=1 rollout_table 80 7b 8,64 h7_early2 nvfp4+lora
    phase_end ;;
c)
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    tests 200 tests/kernels/test_mma_decode_gpu.py tests/engine/test_engine_gpu.py
    rollout_table 110 14b 8 c14_off_bf16 bf16+lora
    for r in 1 2; do
        QUARL_KERNELS_MMA_W_EARLY=0 rollout_table 60 14b 8 c14_off$r nvfp4+lora
        rollout_table 60 14b 8 c14_on$r nvfp4+lora
    done
    for r in 1 2; do
        QUARL_KERNELS_MMA_W_EARLY=0 rollout_table 45 7b 16 c7_off$r nvfp4+lora
        rollout_table 45 7b 16 c7_on$r nvfp4+lora
    done
    phase_end ;;
d)
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    rollout_table 230 7b 1,8,16,64 d7_table
    QUARL_KERNELS_MMA_W_EARLY=0 rollout_table 60 7b 16 d7_off1 nvfp4+lora
    rollout_table 60 7b 16 d7_on2 nvfp4+lora
    QUARL_KERNELS_MMA_W_EARLY=0 rollout_table 60 7b 16 d7_off2 nvfp4+lora
    tests 140 tests/engine/test_engine_gpu.py
    phase_end ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
