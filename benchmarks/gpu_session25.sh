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
#   phase b: bash benchmarks/gpu_session25.sh b   (one GPU; ~8 min)
#     After a (held: the update 1-2 % faster at micro-batch 8, 12 GiB more at its peak; the trainer's GPU test needs
#     the embedded tokenizer, so a kernel-level test was added): the held-weights GPU tests; the 7B GRPO step at
#     micro-batch 4 (16 micro-batches of 3072 rows: twice the decodes a step), BF16+LoRA and NVFP4+LoRA held, then
#     NVFP4+LoRA not held.
#   phase c: bash benchmarks/gpu_session25.sh c   (carry .dev/dg.tar.xz; one GPU; ~5 min)
#     Issue 15 after session 24's phase g (DeepGEMM + glue: 1.33x at 7B, 1.45x at 32B width over BF16 + glue): where
#     a 32B-width layer's time goes, profiled, BF16 + glue beside X^T tiles + DeepGEMM + glue at 16k tokens.
#   phase d: bash benchmarks/gpu_session25.sh d   (one GPU; ~6 min)
#     After b (at micro-batch 4 the NVFP4 update is 1.17-1.25x BF16's even held: the kernel path's host work per call,
#     not the decode -- its log-prob pass is level with BF16's) the held weights are QuantLinear._held, multiplied
#     by autograd's own matmul (the BF16 path's host cost). GPU tests; the 7B GRPO step at micro-batch 8: BF16+LoRA and
#     NVFP4+LoRA (auto: held from step 1), then NVFP4+LoRA not held.
#   phase e: bash benchmarks/gpu_session25.sh e   (one GPU; ~6 min) -- the same at micro-batch 4.
#   phase c2: phase c again with the bf16 arm the benchmark requires (carry .dev/dg.tar.xz).
#   phase f3 (after e1 twice; carry .whl/s3 .whl/small .whl/bnb-site): a held weight serves only the calls the dense
#     path takes; the trainer GPU tests (8-bit AdamW resume included) and the NVFP4 step at micro-batch 4 again.
#   phase f4 (after e1 twice; carry .whl/s3 .whl/small .whl/bnb-site): the final code's trainer GPU tests and the 7B
#     step at micro-batch 8.
#   phase h: bash benchmarks/gpu_session25.sh h   (one GPU; ~7 min) -- phase e again on the final code.
#   phase e1 (twice) / f: as gpu_session24.sh's (carry .whl/s1, then .whl/s2; then .whl/s3 .whl/small .whl/bnb-site):
#     the GGUF assembled on the machine, then the RL trainer's held-base GPU test (and the 8-bit AdamW trainer test).
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
b)
    tests 120 tests/train/test_dequant_cache_gpu.py tests/kernels/test_dense_gpu.py
    grpo "${GRPO_S:-250}" grpo_mb4_held --micro-batch 4 --steps 3
    grpo "${GRPO2_S:-160}" grpo_mb4_nohold --formats nvfp4 --micro-batch 4 --steps 3 --set optim.dequant_cache=false
    ;;
c)
    deepgemm
    model_step "${M32_S:-300}" p32 --shape Qwen2.5-32B --layers 4 --tokens 16384 --loss rl --profile --iters 3 \
        --arms bf16+glue,jetrl-xtiles+deepgemm+glue
    ;;
c2)
    deepgemm
    model_step "${M32_S:-330}" p32 --shape Qwen2.5-32B --layers 4 --tokens 16384 --loss rl --profile --iters 3 \
        --arms bf16,bf16+glue,jetrl-xtiles+deepgemm+glue
    ;;
d)
    tests 200 tests/train/test_dequant_cache_gpu.py tests/kernels/test_dense_gpu.py tests/engine/test_engine_gpu.py
    grpo "${GRPO_S:-200}" grpo_mb8_held --steps 3
    grpo "${GRPO2_S:-120}" grpo_mb8_nohold --formats nvfp4 --steps 3 --set optim.dequant_cache=false
    ;;
e)
    grpo "${GRPO_S:-260}" grpo_mb4_held2 --micro-batch 4 --steps 3
    grpo "${GRPO2_S:-160}" grpo_mb4_nohold2 --formats nvfp4 --micro-batch 4 --steps 3 --set optim.dequant_cache=false
    ;;
e1)
    mkdir -p /tmp/stash && cp .whl/s*/gguf.xz.part* /tmp/stash/ && ls -la /tmp/stash
    ;;
f)
    smollm2_from_stash || exit 2
    smollm2_site .whl/small || exit $?
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 240 tests/train/test_dequant_cache_gpu.py tests/train/test_optim_gpu.py
    ;;
f3)  # after f2 (the 8-bit AdamW trainer test resumed to a different step: a fresh auto cache measures its first phase
    # while the straight run held, and the held product rounded unlike the fused kernels at few rows): a held weight
    # now serves only the calls the dense path would take (dispatch.HeldWeight.serves)
    smollm2_from_stash || exit 2
    smollm2_site .whl/small || exit $?
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 300 tests/train/test_dequant_cache_gpu.py tests/train/test_optim_gpu.py tests/kernels/test_dense_gpu.py \
        tests/train/test_fused_glue_gpu.py
    grpo "${GRPO_S:-150}" grpo_mb4_held3 --formats nvfp4 --micro-batch 4 --steps 3
    ;;
f4)  # the final code (the working set scaled to each phase's tokens): the trainer GPU tests with the embedded
    # tokenizer (after e1 twice), then the 7B step at micro-batch 8 (torch AdamW, as in a / d)
    smollm2_from_stash || exit 2
    smollm2_site .whl/small || exit $?
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 240 tests/train/test_dequant_cache_gpu.py tests/train/test_optim_gpu.py
    grpo "${GRPO_S:-230}" grpo_mb8_final --steps 3 --set optim.optimizer=adamw
    ;;
f5)  # f4's trainer test failed in the test's own wrapper of DequantCache.phase (no tokens argument): fixed; the test
    smollm2_from_stash || exit 2
    smollm2_site .whl/small || exit $?
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 200 tests/train/test_dequant_cache_gpu.py
    ;;
h)  # f3's NVFP4 step at micro-batch 4 ran with 8-bit AdamW (bitsandbytes on the path there; torch AdamW in d / e):
    # the final code at micro-batch 4, BF16+LoRA and NVFP4+LoRA held, then NVFP4+LoRA not held, torch AdamW as in e
    grpo "${GRPO_S:-250}" grpo_mb4_held4 --micro-batch 4 --steps 3
    grpo "${GRPO2_S:-160}" grpo_mb4_nohold4 --formats nvfp4 --micro-batch 4 --steps 3 --set optim.dequant_cache=false
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
#   g  (gpu_session24.sh g: DeepGEMM + glue) commit d24ba7c, 2026-11-27 08:48-08:53 UTC, one H100 80GB HBM3, 254 s
#      (cold start; DeepGEMM built in 83 s): 16k tokens, 4 layers: Qwen2.5-7B 28-layer estimate bf16 1800.0 (an
#      outlier: 1456.9 in session 24), bf16+glue 1252.4, jetrl-xtiles+deepgemm 1140.5, +glue 943.6 (1.33x over
#      bf16+glue); Qwen2.5-32B 64-layer bf16 6037.2, bf16+glue 5356.1, jetrl-xtiles+deepgemm 4405.6, +glue 3699.0
#      (1.45x). Budget left 1655 s (a one-chip machine counts 50 % of its held time this session).
#   a  commit 296a3ec, ~08:55-08:59 UTC, one H100, 230 s (cold): the held-base trainer test failed (it needs the
#      embedded tokenizer: now skipped without it, run in f / f3), 26 passed; 7B GRPO step, micro-batch 8, steady
#      steps: BF16+LoRA update 9.14 / 8.72 s, step 15.86 / 15.47; NVFP4+LoRA held (version 1: recent_weights.holding)
#      8.84 / 8.97, 14.32 / 14.51; not held 9.02 / 8.99, 14.59 / 14.50; the held GiB logged as 0 (release() inside
#      the phase emptied it: fixed in 010d7b0). Budget left 1523 s.
#   b, c, e1, e1, f  commit 010d7b0, ~09:03-09:12 UTC, one H100 (b cold, the rest warm): b -- GPU tests 28 passed,
#      1 skipped; micro-batch 4: BF16+LoRA update 11.40 / 11.46, step 18.24 / 18.43; NVFP4 held (version 1) 14.27 /
#      13.34, 19.93 / 18.89; not held 17.73 / 14.00, 23.82 / 19.67; held 12.15 GiB, peak 21.1 GiB. c -- failed (the
#      benchmark requires the bf16 arm; rerun as c2). f -- the GGUF checked; dequant-cache + optim GPU tests 6
#      passed. Budget left 1258 s.
#   d, e, c2, e1, e1, f2  commits f4d3222 / a036b73 (version 2: QuantLinear._held), ~09:21-09:37 UTC, one H100 (d
#      cold): d -- GPU tests (dequant cache, dense path, engine) 46 passed, 1 skipped; micro-batch 8: BF16+LoRA update
#      9.08 / 8.76, step 15.99 / 15.51; NVFP4 held 8.95 / 8.72, 14.52 / 14.47; not held 9.40 / 9.01, 15.27 / 14.80.
#      e -- micro-batch 4: BF16+LoRA 12.24 / 11.52, 19.29 / 18.31; NVFP4 held 10.27 / 10.92, 15.83 / 16.55; not held
#      16.63 / 19.55, 22.36 / 25.92. c2 -- 32B width, 16k, profiled: bf16 6032.2, bf16+glue 5453.9,
#      jetrl-xtiles+deepgemm+glue 3696.5 (1.48x); per layer bf16+glue 79.16 ms (GEMMs 67.01), FP8 57.00 (GEMMs
#      38.67, quantizers 5.50). f2 -- 1 failed, 5 passed: the 8-bit AdamW trainer's resumed run differed (version 2
#      served few-row calls too; a fresh auto cache measures its first phase). Budget left 750 s.
#   e1, e1, f3  commit 98e3fa0 (version 3: a held weight serves only the dense path's calls), ~09:41-09:47 UTC, one
#      H100 (cold): GPU tests (dequant cache, 8-bit AdamW trainer resume, dense path, fused glue) 35 passed; NVFP4
#      held, micro-batch 4, with 8-bit AdamW (bitsandbytes on the path here): update 13.17 / 13.70, step 18.86 /
#      19.38 (not comparable with d / e: torch AdamW there). Budget left 576 s.
#   h  commit 547bc7b (code of 98e3fa0), ~09:47-09:52 UTC, one H100 (cold), 255 s: micro-batch 4, torch
#      AdamW: BF16+LoRA update 10.56 / 9.98, step 17.48 / 16.82; NVFP4 held 11.98 / 11.95, 17.55 / 17.70; not held
#      14.52 / 15.95, 20.18 / 21.75. Budget left 431 s; machine given back.
#   e1, e1, f4  commit 0cbc53a (code of 3e18eb2: auto's working set scaled to each phase's tokens), ~10:02-10:06
#      UTC, one H100 (cold): GPU tests 5 passed, 1 failed (the held-base trainer test's wrapper of DequantCache.phase
#      took no tokens argument: the test's bug, fixed); micro-batch 8, torch AdamW: BF16+LoRA update 8.98 / 8.71, step
#      15.73 / 15.64; NVFP4 held 8.90 / 8.69, 14.58 / 14.66 (12.15 GiB held, peak 22.7 GiB). Budget left 278 s.
#   e1, e1, f5  commit abe1e6f (the fixed test), ~10:07-10:09 UTC, one H100 (cold): tests/train/test_dequant_cache_gpu.py 3 passed.
#      Budget left 201 s; machine given back.
