#!/usr/bin/env bash
# Session 11 (2026-11-26, third device session of the day): issue 17's LoRA A GEMM inside the first projection's
# GEMV launch (quarl_kernels/lora_a.py: extra programs of gemv._gemv_kernel write the group's x @ A^T partials,
# each projection's last pass finishes them). Run from the repository root on the device machine; the record of
# what ran is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session11.sh a   (one GPU; ~5 min)
#     1. GPU tests: the last pass and the A partials on every route (tests/kernels/test_epilogue_gpu.py), the engine
#        (tests/engine/test_engine_gpu.py), the GEMV (tests/kernels/test_gemv_gpu.py: its launcher was refactored);
#     2. the 7B decode-step profile at batch 1, the A GEMM inside the launch (default) vs on cuBLAS (:noloraa);
#     3. issue 17's rollout table (7B / 14B, NVFP4+LoRA vs BF16+LoRA) at batch 1 and 8 with the defaults.
#   phase b: bash benchmarks/gpu_session11.sh b   (one GPU; ~6 min)
#     The A programs in the Gluon mma.sync launch too (M = 2..16): GPU tests (the last pass and the A partials on every
#     route, the engine, the mma.sync kernel), the profile at batch 1 / 8 with and without, the rollout table at 1 / 8.
#   phase c: bash benchmarks/gpu_session11.sh c   (one GPU; ~8 min)
#     About 4 K ranges for the mma.sync launch's A programs (phase b: its q/k/v and o launches grew by 0.13-0.15 ms),
#     the partial sum unrolled, and a decode step's RoPE + K/V cache write in one launch: GPU tests, the profile at
#     batch 1 / 8 with and without the A programs, the whole rollout table (7B / 14B, batch 1 / 8 / 64).
#   phase d: bash benchmarks/gpu_session11.sh d   (one GPU; ~8 min)
#     The SiLU in the up projection's last pass: GPU tests, the profile at batch 1 / 8, the rollout table, and the
#     7B GRPO step (benchmarks/grpo_step_gpu.py: BF16+LoRA vs NVFP4+LoRA, issue 17's "no slower" target).
#   phase e: bash benchmarks/gpu_session11.sh e   (one GPU; ~7 min)
#     The one-row GEMV's own last pass (gemv._last_pass: the split that finishes a tile last sums it and runs the
#     epilogue; no reduction kernel after the launch): GPU tests, the batch-1 profile with and without
#     (:nolastpass), the rollout table at batch 1 / 8.
#     RAN at commit 127f0a9; the last pass in the launch was 18 % slower and was removed after it (results in
#     benchmarks/results/gpu_2026-11-26/s11/e, RESULTS.md): to re-run, check out 127f0a9.
#   phase f: bash benchmarks/gpu_session11.sh f   (one GPU; ~9 min)
#     The final code's GPU tests: the last pass, the engine, the fused glue (RoPE + K/V write), the mma.sync and GEMV
#     kernels (both carry the LoRA A programs).
#   phase g: bash benchmarks/gpu_session11.sh g   (one GPU; ~7 min)
#     A one-row LoRA group's weights in one GEMV launch (q/k/v, gate/up with the A programs: gemv.launch_gemv_group):
#     GPU tests, the batch-1 profile with and without (:nogroup), the rollout table at batch 1 / 8.
#   phase h: bash benchmarks/gpu_session11.sh h   (one GPU; ~6 min)
#     The final code: the 7B GRPO step once more, and the GEMV's GPU tests.
#   phase i: bash benchmarks/gpu_session11.sh i   (one GPU; ~5 min)
#     A group's weights in one mma.sync launch too (2..16 rows): GPU tests, the profile at batch 1 / 8 with and without
#     (:nogroup), the 7B rollout table at batch 1 / 8.
#     NOT RUN: the device refused it (the session's device time was spent); session 12's phase a ran it instead
#     (benchmarks/gpu_session12.sh), and the mma.sync group launch is on by default since.
#
# The phases use benchmarks/gpu_phase_lib.sh's helpers (factored in session 12, after the calls: the same commands,
# the rollout table's time budget now 20 s under its limit instead of 15; each record names the commit it ran at).
set -u
: "${OUT:?}"
PHASE=${1:?phase}
source benchmarks/gpu_phase_lib.sh

case "$PHASE" in
a)
    tests "${TEST_S:-150}" tests/kernels/test_epilogue_gpu.py tests/engine/test_engine_gpu.py tests/kernels/test_gemv_gpu.py
    profile "${PROFILE_S:-100}" 7b nvfp4+lora32,nvfp4+lora32:noloraa 1
    rollout_table "${ROLL_S:-150}" 7b,14b 1,8 roll
    ;;
b)  # the A programs in the mma.sync launch too (M = 2..16): GPU tests, profile at batch 1 / 8, rollout table 1 / 8
    tests "${TEST_S:-170}" tests/kernels/test_epilogue_gpu.py tests/engine/test_engine_gpu.py tests/kernels/test_mma_decode_gpu.py
    profile "${PROFILE_S:-130}" 7b nvfp4+lora32,nvfp4+lora32:noloraa 1,8
    rollout_table "${ROLL_S:-150}" 7b,14b 1,8 roll
    ;;
c)  # about 4 K ranges for the mma.sync launch's A programs, the last pass's partial sum unrolled, and a decode
    # step's RoPE + K/V cache write in one launch: GPU tests, profile at batch 1 / 8, the whole rollout table
    tests "${TEST_S:-150}" tests/kernels/test_epilogue_gpu.py tests/kernels/test_fused_gpu.py tests/engine/test_engine_gpu.py
    profile "${PROFILE_S:-130}" 7b nvfp4+lora32,nvfp4+lora32:noloraa 1,8
    rollout_table "${ROLL_S:-240}" 7b,14b 1,8,64 roll
    ;;
d)  # the SiLU in the up projection's last pass: GPU tests, profile at batch 1 / 8, rollout table, 7B GRPO step
    tests "${TEST_S:-130}" tests/kernels/test_epilogue_gpu.py tests/engine/test_engine_gpu.py
    profile "${PROFILE_S:-90}" 7b nvfp4+lora32 1,8
    rollout_table "${ROLL_S:-200}" 7b,14b 1,8,64 roll
    grpo "${GRPO_S:-150}" grpo
    ;;
e)  # the one-row GEMV's own last pass (gemv._last_pass, commit 127f0a9 only): GPU tests, profile, table 1 / 8
    tests "${TEST_S:-170}" tests/kernels/test_epilogue_gpu.py tests/engine/test_engine_gpu.py tests/kernels/test_gemv_gpu.py
    profile "${PROFILE_S:-100}" 7b nvfp4+lora32,nvfp4+lora32:nolastpass 1
    rollout_table "${ROLL_S:-150}" 7b,14b 1,8 roll
    ;;
f)  # the final code's GPU tests: every suite this session touched
    tests "${TEST_S:-500}" tests/kernels/test_epilogue_gpu.py tests/engine/test_engine_gpu.py tests/kernels/test_fused_gpu.py \
        tests/kernels/test_mma_decode_gpu.py tests/kernels/test_gemv_gpu.py
    ;;
g)  # a one-row group's weights in one GEMV launch: GPU tests, profile at batch 1 with / without, rollout table 1 / 8
    tests "${TEST_S:-120}" tests/kernels/test_epilogue_gpu.py tests/engine/test_engine_gpu.py
    profile "${PROFILE_S:-90}" 7b nvfp4+lora32,nvfp4+lora32:nogroup 1
    rollout_table "${ROLL_S:-170}" 7b,14b 1,8 roll
    ;;
h)  # the final code: the 7B GRPO step again (phase d's NVFP4 update was an outlier?), and the GEMV GPU tests
    grpo "${GRPO_S:-200}" grpo
    tests "${TEST_S:-150}" tests/kernels/test_gemv_gpu.py
    ;;
i)  # (not run; see the header) a group's weights in one mma.sync launch too: tests, profile, 7B table
    tests "${TEST_S:-110}" tests/kernels/test_epilogue_gpu.py tests/engine/test_engine_gpu.py
    profile "${PROFILE_S:-80}" 7b nvfp4+lora32,nvfp4+lora32:nogroup 1,8
    rollout_table "${ROLL_S:-100}" 7b 1,8 roll
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record of the calls (2026-11-26; results/gpu_2026-11-26/s11/<x>):
#   a  phase a at 630707a: 323 s (GPU tests cut at 150 s after 124 passed, 0 failed: all of test_epilogue_gpu.py and
#      test_engine_gpu.py, 78 of test_gemv_gpu.py; the profile's attribution put the A-carrying launches under "lora":
#      fixed in rollout_profile.py after it)
#   b  phase b at 5acf43f: 326 s (GPU tests 199 passed, 1 failed: the [13-4608-42] case's 1e-3 bound against
#      cuBLAS's a, which rounds differently -- the test now holds the last pass bit-equal to a given as the partials'
#      rounded sum, and cuBLAS's a to 4e-3 like the a check)
#   c  phase c at e9e4638: 380 s (GPU tests 115 passed)
#   d  phase d at e89a797: 389 s (GPU tests 54 passed, 1 failed: test_engine_gpu's counting stand-in took no gate
#      keyword -- a test bug, fixed after)
#   e  phase e at 127f0a9: 348 s (GPU tests cut at 170 s: 2 failures among the first ~190, not identified -- the
#      log was cut before pytest's summary; the profile: the launch's own last pass 4.359 ms vs 3.693 without)
#   f  phase f at 5b665b4: 429 s (GPU tests 399 passed, 1 skipped, 0 failed: test_epilogue_gpu, test_engine_gpu,
#      test_fused_gpu, test_mma_decode_gpu, test_gemv_gpu)
#   g  phase g at ca37026: 279 s (GPU tests 57 passed: test_epilogue_gpu, test_engine_gpu)
#   h  phase h at the commit after ca37026 (script only), on the warm machine: 245 s (7B GRPO step 1.032x; GEMV GPU
#      tests 84 passed, 0 failed before the 150 s limit)
#   i  refused at 5938d24 ("too little device-machine time is left")
