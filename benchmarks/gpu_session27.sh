#!/usr/bin/env bash
# Session 27. Issue 15: session 26's final code (its pruned launch candidates, the fast engine's refresh of the FP8
# master tiles before each rollout) had not run on a GPU, nor had the persistent, prefetching Gluon quantizer. Run from
# the repository root on the device machine; the record of what ran is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session27.sh a   (carry .dev/dg.tar.xz .whl/bnb-site; one GPU; ~6 min)
#     DeepGEMM built; the quantizers', the FP8 linear's and the engine's GPU tests; each operand's settings timed beside
#     the Gluon kernels (benchmarks/kernels/fp8_quant_operands.py --gluon: the persistent kernel's bytes checked first).
#   phase b: bash benchmarks/gpu_session27.sh b   (carry .dev/dg.tar.xz; one GPU; ~8 min)
#     After a (the persistent Gluon kernel: still ~2x slower than the split settings): SwiGLU inside the FP8 quantizers
#     (quarl.quant.fp8_swiglu: h, dg, du never written in BF16). Its GPU tests (operands against eager PyTorch, every
#     launch setting's bits, the fused MLP against three FP8 linears; the inductor glue on a Jet-RL model), then the 32B
#     actor update with 8 micro-batches per optimizer step: bf16 / bf16+glue / FP8 fused / FP8 unfused.
#   phase c: bash benchmarks/gpu_session27.sh c   (carry .dev/dg.tar.xz; right after b, warm; ~7 min)
#     The same four arms at 7B width with 8 micro-batches, then both widths with one, profiled (where the time went).
#   phase d: bash benchmarks/gpu_session27.sh d   (carry .dev/dg.tar.xz; one GPU; ~7 min)
#     After b / c (the fused arm was slower than the unfused one: its kernels at 1.3-3.0 TB/s, the backward's
#     compute-bound on exact expf / div_rn, the transposed passes reducing again): the row pass stores the transposed
#     operand's scales, the backward uses fast arithmetic. GPU tests again; 32B and 7B with 8 micro-batches, 4 arms.
#   phase e: bash benchmarks/gpu_session27.sh e   (carry .dev/dg.tar.xz; right after d, warm; ~5 min)
#     The 32B run with 8 micro-batches again (3 steps timed: how far the ratio moves between runs), then 7B with 8
#     micro-batches, profiled.
#   phase f: bash benchmarks/gpu_session27.sh f   (no carry; one GPU; ~3 min: the budget's last ~320 s)
#     After d (e not run: too little budget left; the fused arm still 1-2 % slower: its row pass 1.8-1.9x slower than
#     b's, the column amax reduced across warps per chunk): the amax kept elementwise and reduced once, 16-warp row
#     settings. The fused kernels' GPU tests, then fused vs unfused per MLP (benchmarks/kernels/fp8_swiglu_bench.py).
#   phases g, h (prepared, not run this session; back to back on one machine): after f (the fused backward 1.27x the
#     glue + quantizer, the fused forward 0.84x: removed, the forward back to the glue's silu_mul + quantizer).
#     g (carry .dev/dg.tar.xz; ~8 min): the final form's GPU tests (the kernels, the inductor glue on a Jet-RL model;
#     added after f: the FP8 linear's bias add as the epilogue pass in place, the master weights' tiles re-made in
#     place), then 32B and 7B with 8 micro-batches, 4 arms; h (carry .dev/dg.tar.xz; ~9 min warm): 32B and 7B again, two rounds of the 4 arms
#     each (fp8_model_step.py --repeat 2, added after f: each round's ratios, its arms minutes apart; the 7B second
#     round only as far as its time goes).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

ARMS=bf16,bf16+glue,jetrl-xtiles+deepgemm+glue,jetrl-xtiles+deepgemm+glue+unfused
update() {  # SECONDS TAG SHAPE [ARGS...]: the actor update at 16k tokens, 4 layers -> $OUT/model/TAG
    local s=$1 tag=$2 shape=$3; shift 3
    model_step "$s" "$tag" --shape "$shape" --layers 4 --tokens 16384 --loss rl --arms "$ARMS" "$@"
}

case $PHASE in
a)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 240 tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py tests/engine/test_engine_gpu.py
    bench 100 quant_gluon benchmarks/kernels/fp8_quant_operands.py --gluon
    ;;
b)
    deepgemm
    tests 170 tests/kernels/test_fp8_swiglu_gpu.py tests/train/test_fused_glue_gpu.py tests/quant/test_fp8_linear.py -s
    update "${M32A_S:-270}" p32acc8 Qwen2.5-32B --iters 2 --accumulate 8
    ;;
c)
    deepgemm
    update "${M7A_S:-170}" p7acc8 Qwen2.5-7B --iters 2 --accumulate 8
    update "${M32_S:-150}" p32 Qwen2.5-32B --profile --iters 2
    update "${M7_S:-110}" p7 Qwen2.5-7B --profile --iters 2
    ;;
d|g)  # g: d again on the final form (d ran with a 130 s test limit and without the last two tests, added after f)
    deepgemm
    tests 170 tests/kernels/test_fp8_swiglu_gpu.py tests/train/test_fused_glue_gpu.py \
        tests/quant/test_fp8_linear.py::test_gpu_bias_add_is_pytorchs \
        tests/quant/test_fp8_linear.py::test_gpu_master_tiles_remade_in_place -s
    update "${M32A_S:-200}" p32acc8 Qwen2.5-32B --iters 2 --accumulate 8
    update "${M7A_S:-150}" p7acc8 Qwen2.5-7B --iters 2 --accumulate 8
    ;;
e)
    deepgemm
    update "${M32A_S:-200}" p32acc8r Qwen2.5-32B --iters 3 --accumulate 8
    update "${M7A_S:-150}" p7acc8p Qwen2.5-7B --iters 2 --accumulate 8 --profile
    ;;
f)
    tests 80 tests/kernels/test_fp8_swiglu_gpu.py -s
    bench 90 swiglu benchmarks/kernels/fp8_swiglu_bench.py
    ;;
h)
    deepgemm
    update "${M32A_S:-400}" p32acc8r Qwen2.5-32B --iters 2 --accumulate 8 --repeat 2
    update "${M7A_S:-150}" p7acc8r Qwen2.5-7B --iters 2 --accumulate 8 --repeat 2
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
#   a  commit f1fdb9c, 2026-11-27 ~12:27-12:32 UTC, one NVIDIA H200 (143771 MiB; cold), 338 s (held 378 s, budget
#      left 1422 s): DeepGEMM built in 88 s; GPU tests: 51 passed, none failed, before the 240 s limit stopped the run
#      in tests/engine/test_engine_gpu.py's 7B-shaped rollout tests; fp8_quant_operands.py --gluon: the persistent
#      Gluon kernel the same bits on all 10 operands, ~2x slower than the split settings on every wide one.
#   b, c  commit 9364a91 (fused version 1), ~12:38-12:44 UTC, one H200 (b cold, c warm), 385 s + 167 s (budget left
#      812 s): b -- GPU tests 21 passed, 1 skipped (bitsandbytes not carried); 0 of 3.1e8 h / dg / du codes differ from
#      eager; the fused MLP equal to three FP8 linears; 32B 8 micro-batches: bf16+glue 78.98, fused 53.41, unfused
#      51.09 ms a layer (the report printed 50.44 for unfused: the bf16 stem, fixed in 7f1d9e3). c -- 7B 8
#      micro-batches 38.44 / 28.64 / 26.82; one micro-batch, profiled: 32B 80.89 / 57.58 / 56.20, 7B 41.34 / 29.01 /
#      29.34; the fused kernels 1.3-3.0 TB/s (their tuned tables).
#   d  commit 7f1d9e3 (version 2), ~12:56-13:03 UTC, one H200 (cold), 448 s (budget left 323 s: e not run): GPU tests
#      8 passed (dg / du: 2,341 of 6.2e8 codes one step off; gradients within 1.4e-5); 32B 8 micro-batches 78.19 /
#      52.47 / 51.33, 7B 38.84 / 27.78 / 27.11 (the row pass 1.8-1.9x slower than version 1's: per-chunk amax).
#   f  commit 3d653a8 (version 3), ~13:09-13:11 UTC, one H200 (cold), 116 s (budget left 170 s: spent): GPU tests 5
#      passed; fp8_swiglu_bench.py: backward fused 1.524 / 2.203 ms against unfused 1.919 / 2.795 (7B / 32B), forward
#      fused 1.315 / 1.904 against 1.094 / 1.600 (the forward fusion removed after this call). Phases g, h not run.
