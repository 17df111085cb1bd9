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
#   phase c: bash benchmarks/gpu_session26.sh c   (carry .dev/dg.tar.xz .whl/bnb-site; one GPU; ~8 min)
#     After a / b (the new one-kernel settings won only the narrow operands; split settings everywhere else, their X^T
#     kernel ~65 % of HBM): split settings whose X^T kernel stores 4-token words. GPU tests again (every setting's bits);
#     each operand's settings timed (benchmarks/kernels/fp8_quant_operands.py, with the pre-session-26 X^T tiles path);
#     the 32B and 7B actor updates with 8 micro-batches per optimizer step.
#   phase d: bash benchmarks/gpu_session26.sh d   (carry .dev/dg.tar.xz; one GPU; ~4 min) -- c's code, one micro-batch
#     per optimizer step, 32B and 7B width.
#   phase e: bash benchmarks/gpu_session26.sh e   (carry .dev/dg.tar.xz .whl/bnb-site; one GPU; ~8 min)
#     After c / d (4-token words won one operand of 24): split settings whose X^T kernel loads its tile through the
#     transposed view (no tl.trans of its own). GPU tests; each operand's settings timed; the final code's 32B and 7B
#     actor updates with 8 micro-batches per optimizer step (c's 32B run ran out of its time: 100 s was too little).
#   phase f: bash benchmarks/gpu_session26.sh f   (no carry; one GPU; ~3 min: the budget's last 300 s)
#     After e (the wide operands still take split settings, two reads): the Gluon one-read kernel (at 3a3911c in
#     kernels/quarl_kernels/fp8_quant_gluon.py, candidates ("gluon", 8 | 16); after f moved to benchmarks/kernels/ and
#     no longer a candidate) -- every setting's bits on the GPU, then each operand's settings timed. No DeepGEMM, so no
#     actor-update step: that is phase g, for the next session.
#   phases g, h (prepared, not run this session; back to back on one machine): bash benchmarks/gpu_session26.sh g
#     (carry .dev/dg.tar.xz .whl/bnb-site; ~8 min) -- the final code's GPU tests (the pruned launch candidates, the
#     engine's refresh_master_tiles), then the 32B actor update with 8 micro-batches per optimizer step; h (carry
#     .dev/dg.tar.xz; ~6 min warm) -- each operand's settings beside the Gluon kernels (the persistent, prefetching one
#     prepared after f: its bytes checked, then timed), 7B with 8 micro-batches, 32B and 7B with one, profiled.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

ARMS=bf16,bf16+glue,jetrl-xtiles+deepgemm+glue
update() {  # SECONDS TAG SHAPE [ARGS...]: the actor update at 16k tokens, 4 layers, BF16 / BF16 + glue / FP8 (X^T tiles,
    # DeepGEMM, glue) -> $OUT/model/TAG
    local s=$1 tag=$2 shape=$3; shift 3
    model_step "$s" "$tag" --shape "$shape" --layers 4 --tokens 16384 --loss rl --arms "$ARMS" "$@"
}

quantizers_then_updates() {  # BENCH_S UPDATE32_S UPDATE7_S: the quantizers' GPU tests (bitsandbytes on the path) and
    # each operand's settings timed, then the 32B and 7B updates with 8 micro-batches per optimizer step
    deepgemm
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 200 tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py
    bench "$1" quant benchmarks/kernels/fp8_quant_operands.py
    update "${M32A_S:-$2}" p32acc8 Qwen2.5-32B --iters 2 --accumulate 8
    update "${M7A_S:-$3}" p7acc8 Qwen2.5-7B --iters 2 --accumulate 8
}

case $PHASE in
a)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 150 tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py
    update "${M32_S:-300}" p32 Qwen2.5-32B --profile --iters 3
    ;;
b)
    deepgemm
    update "${M7_S:-150}" p7 Qwen2.5-7B --profile --iters 3
    update "${M32A_S:-220}" p32acc8 Qwen2.5-32B --iters 2 --accumulate 8
    update "${M7A_S:-150}" p7acc8 Qwen2.5-7B --iters 2 --accumulate 8
    ;;
c)
    quantizers_then_updates 100 100 80
    ;;
d)
    deepgemm
    update "${M32_S:-150}" p32 Qwen2.5-32B --profile --iters 3
    update "${M7_S:-100}" p7 Qwen2.5-7B --profile --iters 3
    ;;
e)
    quantizers_then_updates 60 180 100
    ;;
f)
    tests 170 tests/kernels/test_fp8_quant_gpu.py -k "every_launch_setting or act_quantizer_equals_eager"
    bench 60 quant benchmarks/kernels/fp8_quant_operands.py
    ;;
g)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:$PWD/.whl/bnb-site
    tests 240 tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py tests/engine/test_engine_gpu.py
    update "${M32A_S:-180}" p32acc8 Qwen2.5-32B --iters 2 --accumulate 8
    ;;
h)
    deepgemm
    bench 90 quant_gluon benchmarks/kernels/fp8_quant_operands.py --gluon
    update "${M7A_S:-120}" p7acc8 Qwen2.5-7B --iters 2 --accumulate 8
    update "${M32_S:-110}" p32 Qwen2.5-32B --profile --iters 3
    update "${M7_S:-80}" p7 Qwen2.5-7B --profile --iters 3
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
#   a, b  commit a8feac6, 2026-11-27 ~10:53-11:03 UTC, one NVIDIA H200 (143771 MiB; a cold, b warm), 296 s + 174 s
#      (held 513 s, budget left 1287 s; the H200 counted in full): a -- DeepGEMM built in 82 s; GPU tests 35 passed (the
#      bitsandbytes re-quantization test included); 32B width, 16k tokens, one micro-batch per step, per layer: bf16
#      91.33, bf16+glue 81.86, jetrl-xtiles+deepgemm+glue 55.41 ms (1.48x over bf16+glue), quantizers 5.65 ms a layer
#      (_act_t_kernel 11.66, _act_kernel 7.35, _tile_kernel 3.60 ms over 4 layers). b -- 7B one micro-batch: bf16+glue
#      40.77, FP8 28.54 (1.43x); 32B 8 micro-batches: 78.88 / 51.72 (1.53x); 7B 8 micro-batches: 39.13 / 27.24 (1.44x).
#      The one-kernel column-chunk settings won only the 512- / 1024-wide dY operands.
#   c, d  commit 5d18b59, ~11:05-11:12 UTC, one H200 (c cold, d warm), 389 s + 58 s (budget left 794 s): c -- GPU
#      tests 35 passed; operands (benchmarks/kernels/fp8_quant_operands.py): X^T tiles from the activation quantizer
#      0.145 / 0.657 ms (7B X [16k, 3584] / [16k, 18944]) and 0.185 / 0.956 (32B [16k, 5120] / [16k, 27648]) against
#      0.343 / 0.720 / 0.449 / 1.048 the pre-session-26 way; 4-token-word splits won one operand (32B dY [16k, 5120]);
#      7B 8 micro-batches 39.06 / 27.21 (1.44x); the 32B 8-micro-batch run was cut at its 100 s (bf16 arms only). d --
#      one micro-batch a step, profiled: 32B 81.56 / 54.61 ms a layer (1.49x over bf16+glue; quantizers 5.70 ms of
#      it by the profile), 7B 41.44 / 29.50 (1.40x; quantizers 3.91).
#   e  commit 775f987, ~11:17-11:25 UTC, one H200 (cold), 454 s (budget left 303 s: too little for another cold start
#      with DeepGEMM's build): GPU tests 35 passed; operands: the transposed-load splits won 4 of 12 (by 0.3-7 %); the
#      old X^T-tiles path 0.172 / 0.721 (7B) and 0.205 / 1.047 (32B) ms against 0.135 / 0.657 and 0.185 / 0.956 now
#      (phase c's 0.343 / 0.449 for the hidden-width old path did not repeat); 32B 8 micro-batches: bf16+glue 79.34,
#      FP8 52.27 ms a layer (1.52x); 7B 8 micro-batches: 39.37 / 27.73 (1.42x).
#   f  commit 3a3911c, ~11:38 UTC, one H200 (cold), 72 s (budget left 195 s: the session's device time is spent): the
#      settings' GPU test 7 passed (the Gluon kernel's bits equal to eager, 1x128 and tiles); the Gluon kernel lost
#      every operand, at about half the split settings' speed (32B dY [16k, 27648] 1.81 / 1.85 ms at 16 / 8 warps
#      against 0.856; 32B X [16k, 27648] tiles 1.96 against 0.957; 7B dY [16k, 512] 0.050 against 0.049): moved to
#      benchmarks/kernels/fp8_quant_gluon.py, not a candidate. Phase g not run.
