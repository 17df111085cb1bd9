#!/usr/bin/env bash
# Session 28. Issue 15: session 27's final form (SwiGLU's backward inside the FP8 quantizers) measured end to end
# (phase g of gpu_session27.sh, run at the start of this session), then an attention's q / k / v as one FP8 GEMM each
# way (quarl.quant.fp8_stack) and the FP8 projections' bias added by the epilogue pass (QuantLinear had kept
# PyTorch's broadcast add). Run from the repository root on the device machine; the record is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session28.sh a   (carry .dev/dg.tar.xz; one GPU; ~7 min)
#     DeepGEMM built; the stack's GPU tests (outputs and weight / bias gradients against the three FP8 linears, with
#     cuBLAS and DeepGEMM, at Qwen2.5-7B's q / k / v widths) and the inductor glue on a Jet-RL model (now stacked);
#     then the actor update at 32B and 7B width, 8 micro-batches per optimizer step: bf16, bf16+glue, FP8 (fused MLP
#     + stacked q / k / v), FP8 +nostack (session 27's final form; g measured it beside session 26's +unfused).
#   phase b: bash benchmarks/gpu_session28.sh b   (carry .dev/dg.tar.xz; right after a, warm; ~8 min)
#     After a (the stack 0.45 ms a layer faster at 32B width, 0.28 ms slower at 7B: within the spread?): Qwen3-8B
#     width (the issue names Qwen2.5-7B / Qwen3-8B layer shapes) as a's four arms; 7B with one micro-batch, profiled
#     (where the stack's time goes); 7B's four arms twice more (fp8_model_step.py --repeat 2).
#   phases c, d: after b (see the record below). phase e (prepared, not run; carry .dev/dg.tar.xz; ~4 min): the
#     GPU tests of the final stack (its weight gradients one GEMM per projection since d) and the rollout engine on a
#     stacked Jet-RL model (written after d), with the FP8 linear's GPU tests.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

FP8=jetrl-xtiles+deepgemm+glue
update() {  # SECONDS TAG SHAPE ARMS [ARGS...]: the actor update at 16k tokens, 4 layers -> $OUT/model/TAG
    local s=$1 tag=$2 shape=$3 arms=$4; shift 4
    model_step "$s" "$tag" --shape "$shape" --layers 4 --tokens 16384 --loss rl --arms "$arms" "$@"
}

case $PHASE in
a)
    deepgemm
    tests 110 tests/quant/test_fp8_stack_gpu.py tests/train/test_fused_glue_gpu.py::test_inductor_glue_matches_eager -s
    update "${M32A_S:-200}" p32acc8 Qwen2.5-32B "bf16,bf16+glue,$FP8,$FP8+nostack" --iters 2 --accumulate 8
    update "${M7A_S:-150}" p7acc8 Qwen2.5-7B "bf16,bf16+glue,$FP8,$FP8+nostack" --iters 2 --accumulate 8
    ;;
b)
    deepgemm
    update "${M8A_S:-130}" p8acc8 Qwen3-8B "bf16,bf16+glue,$FP8,$FP8+nostack" --iters 2 --accumulate 8
    update "${M7P_S:-110}" p7prof Qwen2.5-7B "bf16,bf16+glue,$FP8,$FP8+nostack" --iters 2 --profile
    update "${M7A_S:-200}" p7acc8r Qwen2.5-7B "bf16,bf16+glue,$FP8,$FP8+nostack" --iters 2 --accumulate 8 --repeat 2
    ;;
c)
    deepgemm
    update "${M8R_S:-120}" p8acc8r Qwen3-8B "bf16,bf16+glue,$FP8" --iters 2 --accumulate 8 --repeat 2
    update "${M8K_S:-70}" p8acc8t8k Qwen3-8B "bf16,bf16+glue,$FP8" --iters 2 --accumulate 8 --tokens 8192
    update "${M7K_S:-70}" p7acc8t8k Qwen2.5-7B "bf16,bf16+glue,$FP8" --iters 2 --accumulate 8 --tokens 8192
    update "${M32R_S:-170}" p32acc8r Qwen2.5-32B "bf16,bf16+glue,$FP8" --iters 2 --accumulate 8 --repeat 2
    ;;
d)
    deepgemm
    update "${M7A_S:-140}" p7acc8 Qwen2.5-7B "bf16,bf16+glue,$FP8,$FP8+nostack" --iters 2 --accumulate 8
    ;;
e)  # prepared, not run (the device budget was spent after d)
    deepgemm
    tests 200 tests/quant/test_fp8_stack_gpu.py tests/train/test_fused_glue_gpu.py tests/quant/test_fp8_linear.py -s
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
#   g of gpu_session27.sh  commit 993ba98, 2026-11-27 14:02-14:09 UTC, one NVIDIA H200 (143771 MiB; cold), 416 s
#      (held 467 s, budget left 1330 s): DeepGEMM built in 86 s; GPU tests 12 passed (the fused SwiGLU kernels, the
#      inductor glue on a Jet-RL model, the epilogue bias add, the master tiles re-made in place); 8 micro-batches,
#      per layer: 32B bf16+glue 71.65, FP8 fused 46.43 (1.543x), unfused 46.69 (1.535x); 7B 35.33 / 24.29 (1.454x) /
#      24.73 (1.429x). Every arm ~9 % faster than session 27's calls on another H200; the ratios as before.
#   a  commit ef9b39b (the stack's first version: WGrad stacked too), 14:11-14:18 UTC, one H200 (cold), 399 s (held
#      902 s, budget left 897 s): DeepGEMM built in 70 s; GPU tests 6 passed (the stack equal to three FP8 linears on
#      cuBLAS and DeepGEMM: outputs and weight / bias gradients bit for bit; the inductor glue on a Jet-RL model,
#      stacked); per layer, bf16+glue / FP8 / FP8 +nostack: 32B 82.72 / 51.75 (1.598x) / 52.20 (1.585x); 7B 39.35 /
#      27.20 (1.447x) / 26.92 (1.462x).
#   b  commit 239da4c, 14:19-14:23, the same machine (warm), 222 s (budget left 641 s): Qwen3-8B 37.59 / 23.25 / 23.44
#      (its bf16+glue arm slow: 1.08x the eager arm, 1.20x in c); 7B one micro-batch, profiled: 42.78 / 27.90 /
#      29.47 (the stacked WGrad 2.73 ms against 2.16 for q, k, v apart: one more wave of tiles); 7B two rounds:
#      39.81 / 27.00 / 27.28 and 39.68 / 26.98 / 27.16 (1.474x / 1.471x; without the stack 1.459x / 1.461x).
#   c  commit b651ed3, 14:23-14:28, warm, 280 s (budget left 345 s): Qwen3-8B two rounds 34.32 / 23.20, 34.15 / 23.29
#      (1.480x / 1.467x); 8k tokens: Qwen3-8B 17.19 / 12.26 (1.402x), 7B 20.28 / 13.96 (1.453x); 32B two rounds
#      80.01 / 51.35, 80.26 / 51.20 (1.558x / 1.568x).
#   d  commit 0f2cfbc (the WGrad one GEMM per projection), 14:29-14:33, one H200 (cold), 199 s (budget left 102 s,
#      given back: 92 s): 7B 39.47 / 27.25 (1.448x) / 27.05 (1.459x). The device budget is spent.
