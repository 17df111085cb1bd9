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
#   phase b: bash benchmarks/gpu_session24.sh b   (one GPU; ~8 min)
#     after a (the glue ~6 ms of a 7B layer's 25 ms, ~1 ms compiled): policy.compile_glue / student.compile_glue
#     (auto: on in a one-process CUDA run) wired into the rl and distill stages. The fused-glue GPU tests; the 7B
#     GRPO step (benchmarks/grpo_step_gpu.py, LoRA: BF16+LoRA and NVFP4+LoRA) with the glue compiled (the default now)
#     and eager (--set policy.compile_glue=false); the actor update at Qwen2.5-32B width with and without the glue.
#   phase e1 (twice) / f: as gpu_session23.sh's e1 / f (carry .whl/s1, then .whl/s2; then .whl/s3 .whl/small
#     .whl/bnb-site; the SmolLM2 GGUF assembled on the machine) -- the RL trainer's GPU test (8-bit AdamW, resume to
#     the identical step; the glue compiled now), then the learning check: nvfp4-lora (glue compiled, the default) vs
#     nvfp4-lora-eager, same seed and settings, 150 s of training each.
#   phase g: bash benchmarks/gpu_session24.sh g   (carry .dev/dg.tar.xz; one GPU; ~8 min) -- PREPARED, NOT RUN in
#     session 24 (its device time was spent): the actor update with DeepGEMM's FP8 GEMMs and the compiled glue, 7B
#     and 32B width at 16k tokens (sessions 9-15's best arm was X^T tiles + DeepGEMM). .dev/dg.tar.xz is made on the
#     CPU host from the fetch tool's mirrors (no network on either machine): DeepGEMM 54e2261 with cutlass f3fde58's
#     and fmt 553ec11's include/ (git archive), benchmarks/deepgemm_noregex.patch applied, tar cJf of .dg (1.3 MB).
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
b)
    tests 150 tests/train/test_fused_glue_gpu.py
    grpo "${GRPO_S:-150}" grpo_glue
    grpo "${GRPO_S:-120}" grpo_eager --set policy.compile_glue=false
    model_step "${M32_S:-150}" g32 --shape Qwen2.5-32B --layers 4 --tokens 8192 --loss rl --iters 5 \
        --arms bf16,bf16+glue,jetrl-xtiles,jetrl-xtiles+glue
    ;;
c)  # the actor update at 32B width and 16k tokens, and phase a's 7B 8k point again (8 iterations)
    model_step "${M32_S:-200}" g32_16k --shape Qwen2.5-32B --layers 4 --tokens 16384 --loss rl --iters 4 \
        --arms bf16,bf16+glue,jetrl-xtiles,jetrl-xtiles+glue
    model_step "${M8_S:-130}" g8b --shape Qwen2.5-7B --layers 4 --tokens 8192 --loss rl --iters 8 \
        --arms bf16,bf16+glue,jetrl-xtiles,jetrl-xtiles+glue
    ;;
d)  # after b and f: with the glue compiled the rollout was 0.3-0.5 s slower -- the engine took the patched modules
    # for foreign ones and left its own fused kernels; now it recognizes them. The glue and engine GPU tests, then
    # the 7B GRPO step (glue compiled, the default) again
    tests 300 tests/train/test_fused_glue_gpu.py tests/engine/test_engine_gpu.py
    grpo "${GRPO_S:-150}" grpo_glue2
    ;;
g)
    deepgemm
    model_step "${M7_S:-200}" dg7 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl --iters 5 \
        --arms bf16,bf16+glue,jetrl-xtiles+deepgemm,jetrl-xtiles+deepgemm+glue
    model_step "${M32_S:-230}" dg32 --shape Qwen2.5-32B --layers 4 --tokens 16384 --loss rl --iters 4 \
        --arms bf16,bf16+glue,jetrl-xtiles+deepgemm,jetrl-xtiles+deepgemm+glue
    ;;
e1)
    mkdir -p /tmp/stash && cp .whl/s*/gguf.xz.part* /tmp/stash/ && ls -la /tmp/stash
    ;;
f)
    smollm2_from_stash || exit 2
    smollm2_site .whl/small || exit $?
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 150 tests/train/test_optim_gpu.py
    learn "${LEARN_S:-330}" --task builtin --data .whl/s3/data/builtin-l1 --policies nvfp4-lora,nvfp4-lora-eager \
        --lr 2e-4 --steps 120 --prompts-per-step 16 --group-size 8 --max-new-tokens 128 --micro-batch 16 \
        --rl-set optim.logprob_chunk=256 --eval-problems 200 --train-seconds "${TRAIN_S:-150}" --parallel 2 \
        --device cuda --model default --work /tmp/learn --out "$OUT/learn" --name glue
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
#   a  commit 48a630a, 2026-11-27 ~07:37 UTC, one H100 80GB HBM3, 125 s (cold start; held 156 s): fused-glue GPU
#      tests 2 passed; Qwen2.5-7B width, 4 layers, 28-layer estimate: 8k bf16 760.3, bf16+glue 650.7 (1.17x),
#      jetrl-xtiles 647.5 (1.17x), jetrl-xtiles+glue 573.1 (1.33x); 16k 1456.9 / 1245.6 (1.17x) / 1215.3 (1.20x) /
#      1007.3 (1.45x). Per layer at 8k: "other" 5.92 -> 0.95 ms, glue class 0.50 -> 1.15 ms; GEMMs 5-10 % slower with
#      the glue compiled. Budget left 1643 s.
#   b  commit eea1fa0, ~07:43-07:47 UTC, one H100 80GB HBM3, 298 s (cold start): fused-glue GPU
#      tests 2 passed; 7B GRPO step (steady step 1) BF16+LoRA update 8.72 s glue / 10.51 eager, step 15.84 / 17.54;
#      NVFP4+LoRA update 9.24 / 10.79, step 15.52 / 16.78 (rollout 5.72 / 5.40 and 4.83 / 4.32: slower with the glue,
#      see d); Qwen2.5-32B width 8k, 64-layer estimate: bf16 3133.0, bf16+glue 2784.3, jetrl-xtiles 2444.8,
#      jetrl-xtiles+glue 2123.0. Budget left 1282 s.
#   e1, e1, f  ~07:47-07:53 UTC, back to back: the GGUF checked (sha256 OK); test_optim_gpu.py 3 passed (the RL
#      trainer on CUDA with the glue compiled); learning check, 150 s each: nvfp4-lora (glue) +47.0 pts in 25 steps,
#      nvfp4-lora-eager +55.5 in 29; train reward at steps 5-24 0.314 / 0.322; step 0 29.4 s / 16.2 s (compilation).
#      Budget left 920 s.
#   c  ~07:54 UTC (warm), 73 s: 32B width 16k: bf16 5988.5, bf16+glue 5391.4, jetrl-xtiles 4617.3, jetrl-xtiles+glue
#      3982.3; 7B 8k again (8 iterations): 760.8 / 649.6 / 641.5 / 542.5. Budget left 819 s; machine given back.
#   d  commit e423050, ~07:58-08:01 UTC, one H100 80GB HBM3, 297 s (cold start): the glue and engine GPU tests 21
#      passed (the engine rolls a glue-patched model out with its own kernels: same tokens and log-probs, the compiled
#      functions never called); 7B GRPO step 1: BF16+LoRA rollout 5.37 s (eager in b 5.40), update 9.01, step 15.78;
#      NVFP4+LoRA rollout 4.44 (b eager 4.32), update 11.12, step 17.00. Budget left 486 s.
#   d2 (inline, warm, 103 s): TORCH_LOGS=recompiles and gpu_phase_lib.sh's `grpo 170 grpo_glue3`: 4 recompilations in
#      the whole run (rms_norm 3 variants: requires_grad, no-grad; rope and silu_mul 2), no cache-limit fallback;
#      BF16+LoRA update 8.71 / step 15.71, NVFP4+LoRA update 11.25 / step 17.11. Budget left 374 s.
#   d3 (inline, warm, 169 s): `grpo 100 n_glue --formats nvfp4; grpo 100 n_eager --formats nvfp4 --set
#      policy.compile_glue=false; grpo 100 n_glue2 --formats nvfp4`: NVFP4+LoRA step 1 update 9.88 / 10.92 / 10.38 s,
#      step 15.63 / 16.94 / 16.04, log-prob pass 1.44 / 1.67 / 1.45. Budget left 182 s; machine given back.
