#!/usr/bin/env bash
# Session 30. Issue 17's rollout targets on the H200 (session 29: 2.46x / 2.06x / 1.18x at 7B, 2.37x / 2.02x at 14B
# batch 1 / 8 -- below the H100's, where the targets are met; phase a, given an H100), then issue 15 (Jet-RL): the
# FP8 quantizers without a division per element, DeepGEMM in the rollout, the merged SwiGLU passes, the 7B / 8B / 32B
# actor update and the 7B profile on an H100 (phases b-j). Run from the repository root on the device machine; the
# record is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session30.sh a   (nvidia-h200; ~9 min)
#     Session 29's prepared phase g: the 7B / 14B table at batch 1 / 8 with and without the one-row GEMV's H200 rule
#     (QUARL_KERNELS_GEMV_DEFAULTS=h200: config 0 on every FP4 weight at one row, where the default takes config 7 on
#     long rows -- tuned in the H100 engine, session 12); then the 7B decode-step profile at batch 1 / 64, BF16+LoRA
#     and NVFP4+LoRA, on the H200 (where the time goes at 64, the batch the H200 misses by 2 %).
#   phase b: bash benchmarks/gpu_session30.sh b   (nvidia-h100-x1; carry .dev/dg.tar.xz .dev/old_quant; ~8 min)
#     Jet-RL's FP8 quantizers without a division per element (quarl_kernels.group_div: the group's reciprocal once,
#     div.rn's own fast path per element; 472 instead of 816 SASS instructions in the row pass): the GPU tests (the
#     quotient against div.rn on every divisor significand and every dividend significand, the quantizers against
#     eager on zeros / subnormals / extreme and infinite groups, and the existing bit-for-bit tests); then each
#     7B operand's quantizer time and the 7B actor update, with this code and with session 29's fp8_quant.py
#     (.dev/old_quant, copied over a copy of the tree in /tmp/old) in the same call.
#   phase c: bash benchmarks/gpu_session30.sh c   (right after b, warm; ~4 min): b's 7B actor update again with the
#     bf16 arm the report divides by (b's lacked it), this code / session 29's quantizers / this code.
#   phase d: bash benchmarks/gpu_session30.sh d   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~8.5 min)
#     Jet-RL's FP8 rollout at batch 64 is 1.05x BF16 (session 29): there the decode GEMMs are cuBLAS's blockwise
#     kernels (the FP8 GEMV takes <= 16 rows), ~14 us a call even on the 4 MB k/v weight. The Qwen3-8B rollout with
#     DeepGEMM for those GEMMs (QUARL_FP8_GEMM=deepgemm, the training flow's opt-in) against the default, then the
#     Qwen3-8B actor update with this session's quantizers (session 28: 1.47-1.48x).
#   phase e: bash benchmarks/gpu_session30.sh e   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~6 min)
#     SwiGLU's backward quantizers as one merged launch (fp8_swiglu MERGED_SETTINGS: the row pass's program codes its
#     own tile transposed too, dh / g / u re-read from L2 instead of by a second launch from HBM; chosen by time
#     against the best pair): the GPU tests, fp8_swiglu_bench (7B width; fused with and without the merged launch),
#     then the 7B actor update with the merged launch allowed and with QUARL_FP8_SWIGLU_MERGE=0.
#   phase f: bash benchmarks/gpu_session30.sh f   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~6.5 min)
#     After e (the merged SwiGLU launch 1.756 ms against the pair's 1.845; more rows and warps did better): the
#     larger merged candidates in fp8_swiglu_bench, then the 7B actor update merged / pair / merged (the spread).
#   phase g: bash benchmarks/gpu_session30.sh g   (right after f, the machine warm: DeepGEMM built; ~9 min)
#     Every FP8 GPU test with DeepGEMM importable, so QUARL_FP8_GEMM=auto (the new default) takes it: the quantizers,
#     the FP8 linear (DeepGEMM against cuBLAS), the q / k / v stack, the fused SwiGLU, the compiled glue and the
#     rollout engine on Jet-RL models, the FP8 GEMV.
#   phase h: bash benchmarks/gpu_session30.sh h   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~6.5 min)
#     Jet-RL's actor update at Qwen2.5-32B width on an H100 with this session's code (beaten on an H200 in session
#     28: 1.56-1.60x; on an H100 last measured in session 25, before sessions 26-30's changes).
#   phase i: bash benchmarks/gpu_session30.sh i   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~4 min)
#     Where a 7B FP8 layer's time goes now (one micro-batch, profiled; session 28's profile was on an H200 before
#     this session's quantizers), for the next step on the 7B actor update.
#   phase j: bash benchmarks/gpu_session30.sh j   (nvidia-h100-x1; ~3 min)
#     Four more one-read quantizer settings (fp8_quant.ACT_SETTINGS): every setting's bits on the GPU, then each 7B
#     operand's best setting and time.
#   phase k (prepared, not run: the device budget could not start another machine): bash benchmarks/gpu_session30.sh k
#     (nvidia-h100-x1; ~2 min)
#     Where the one-read quantizers' time goes (fp8_quant_operands.py's second table): each 7B X / dY operand's row
#     groups alone, X^T alone, and a plain copy of the same useful bytes.
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
b)
    rm -rf /tmp/old && mkdir -p /tmp/old && cp -r benchmarks kernels quarl /tmp/old/ && cp .dev/old_quant/fp8_quant.py /tmp/old/kernels/quarl_kernels/
    (deepgemm > "$OUT/deepgemm.log" 2>&1) &
    tests 170 tests/kernels/test_fp8_quant_gpu.py tests/kernels/test_fp8_gemv_gpu.py
    for side in new old; do
        root=$PWD; [ $side = old ] && root=/tmp/old
        mkdir -p "$OUT/quant_$side"
        (cd $root && PYTHONPATH=$root:$root/kernels timeout -k 5 100 "$PY" benchmarks/kernels/fp8_quant_operands.py \
            --models Qwen2.5-7B --out "$OUT/quant_$side" > "$OUT/quant_$side/run.log" 2>&1)
        echo "== operands ($side) rc=$? at $((SECONDS - T0)) s"; grep "^|" "$OUT/quant_$side/run.log" | head -n 16
    done
    wait
    model7 new old
    ;;
c)  # b's model steps (its arms lacked the bf16 arm the report divides by)
    [ -d /tmp/old ] || { mkdir -p /tmp/old && cp -r benchmarks kernels quarl /tmp/old/ && cp .dev/old_quant/fp8_quant.py /tmp/old/kernels/quarl_kernels/; }
    deepgemm
    model7 new old new
    ;;
d)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    QUARL_FP8_GEMM=deepgemm roll8b "${ROLL_S:-160}" dgroll bf16,fp8
    roll8b "${ROLL0_S:-100}" cublasroll fp8
    model_step "${M8_S:-150}" p8acc8 --shape Qwen3-8B --layers 4 --tokens 16384 --loss rl \
        --arms bf16,bf16+glue,jetrl-xtiles+deepgemm+glue --iters 2 --accumulate 8
    ;;
e)
    (deepgemm > "$OUT/deepgemm.log" 2>&1) &
    tests 150 tests/kernels/test_fp8_swiglu_gpu.py
    bench 100 swiglu benchmarks/kernels/fp8_swiglu_bench.py --models Qwen2.5-7B
    wait
    cat "$OUT/deepgemm.log"
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    FP8=jetrl-xtiles+deepgemm+glue
    model_step "${M_S:-150}" p7merge --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl --arms "bf16,bf16+glue,$FP8" \
        --iters 2 --accumulate 8
    QUARL_FP8_SWIGLU_MERGE=0 model_step "${M_S:-150}" p7pair --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,$FP8" --iters 2 --accumulate 8
    ;;
f)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    bench 100 swiglu benchmarks/kernels/fp8_swiglu_bench.py --models Qwen2.5-7B
    FP8=jetrl-xtiles+deepgemm+glue
    for r in merge pair merge2; do
        if [ $r = pair ]; then export QUARL_FP8_SWIGLU_MERGE=0; else unset QUARL_FP8_SWIGLU_MERGE; fi
        model_step "${M_S:-130}" "p7$r" --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
            --arms "bf16,bf16+glue,$FP8" --iters 2 --accumulate 8
    done
    unset QUARL_FP8_SWIGLU_MERGE
    ;;
g)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    "$PY" -c "from quarl.quant.fp8_linear import gemm_backend; print('QUARL_FP8_GEMM auto ->', gemm_backend())"
    tests "${TESTS_S:-470}" tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py \
        tests/quant/test_fp8_stack_gpu.py tests/kernels/test_fp8_swiglu_gpu.py tests/train/test_fused_glue_gpu.py \
        tests/kernels/test_fp8_gemv_gpu.py
    ;;
h)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    model_step "${M32_S:-300}" p32 --shape Qwen2.5-32B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8 --repeat 2
    ;;
i)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    model_step "${MP_S:-200}" p7prof --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --profile
    ;;
j)
    tests 120 tests/kernels/test_fp8_quant_gpu.py -k "every_launch_setting or act_quantizer_equals_eager"
    bench 100 quant benchmarks/kernels/fp8_quant_operands.py --models Qwen2.5-7B
    ;;
k)  # prepared, not run
    bench 120 quant benchmarks/kernels/fp8_quant_operands.py --models Qwen2.5-7B
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
#   a  commit 88a0a37, 2026-11-27 17:12-17:17 UTC, kind nvidia-h200 given as one NVIDIA H100 80GB HBM3 (cold), 326 s
#      (budget 1800 -> 1620 s, counted at 50 %): table BF16+LoRA / NVFP4+LoRA step ms 7B 8.37 / 3.11, 8.66 / 4.02; 14B
#      15.03 / 5.58, 15.83 / 7.26; with QUARL_KERNELS_GEMV_DEFAULTS=h200 NVFP4+LoRA 3.17, 4.02, 5.82, 7.28 (slower on
#      the H100); profile 7B step ms BF16+LoRA 8.42 / 11.04, NVFP4+LoRA 3.14 / 8.27 at batch 1 / 64.
#   b  commit a414e09, 17:30-17:33, one NVIDIA H100 80GB HBM3 (cold), 161 s (budget left 1501 s): GPU tests 42 passed;
#      7B operands, this code / session 29's quantizers (ms): X hidden 0.144 / 0.154, X inter 0.678 / 0.767, dY hidden
#      0.131 / 0.151, dY kv 0.041 / 0.049, dY inter 0.637 / 0.728, W tiles 0.114 / 0.129; the model steps lacked the
#      bf16 arm (rc 1 at once).
#   c  commit ab4244e, 17:33-17:37, the same H100 (warm), 233 s (budget left 1373 s): 7B actor update per layer,
#      bf16+glue / FP8: new 39.75 / 27.20 (1.461x), old 39.84 / 27.45 (1.451x), new 39.87 / 27.30 (1.460x).
#   d  commit c41b702, 17:39-17:45, one NVIDIA H100 80GB HBM3 (cold), 331 s (budget left 1173 s): DeepGEMM ready at 77
#      s; Qwen3-8B rollout step ms with QUARL_FP8_GEMM=deepgemm: BF16 7.06 / 7.33 / 9.55, FP8 4.84 / 5.27 / 7.43 (1.46x /
#      1.39x / 1.29x); FP8 on cuBLAS 4.85 / 5.29 / 9.04; Qwen3-8B actor update per layer bf16+glue 33.51, FP8 23.11
#      (1.450x).
#   e  commit 568489d, 17:49-17:54, one NVIDIA H100 80GB HBM3 (cold), 234 s (budget left 1024 s): fp8_swiglu GPU tests 5
#      passed; 7B SwiGLU backward fused merged 1.785, two passes 1.860, unfused 2.307 ms; actor update per layer
#      bf16+glue / FP8 merged 38.70 / 26.40, pair (QUARL_FP8_SWIGLU_MERGE=0) 38.61 / 26.86.
#   f  commit d9701a1, 17:56-18:02, one NVIDIA H100 80GB HBM3 (cold), 353 s (budget left 794 s): merged 1.797, two
#      passes 1.881, unfused 2.307 ms (best merged setting (32, 8, 32) again; the larger ones slower); actor update per
#      layer merged 39.13 / 26.86, pair 38.98 / 26.79, merged 39.03 / 26.95.
#   g  commit d9701a1, 18:02-18:07, the same H100 (warm), 309 s (budget left 636 s): QUARL_FP8_GEMM auto -> deepgemm;
#      every FP8 GPU test file: 73 passed, 1 skipped (bitsandbytes), 0 failed.
#   h  commit 9b9e4d9, 18:09-18:14, one NVIDIA H100 80GB HBM3 (cold), 286 s (budget left 456 s): 32B actor update per
#      layer, two rounds: bf16+glue 78.77 / 78.84, FP8 50.49 / 51.18 ms (1.560x / 1.540x).
#   i  commit b984e73, 18:17-18:22, one NVIDIA H100 80GB HBM3 (cold), 238 s (budget left 280 s): 7B profile per layer,
#      bf16+glue GEMMs 35.28 of 42.98 ms; FP8 GEMMs 18.85, SwiGLU quantizers 2.32, other quantizers 2.31, attention
#      2.28, glue 1.47, optimizer 1.60, other 1.57 (30.40 ms).
#   j  commit 1a24788, 18:27-18:29, one NVIDIA H100 80GB HBM3 (cold), 65 s (budget left 211 s): GPU tests 7 passed; 7B
#      operands ms: X hidden 0.145, X inter 0.678, dY hidden 0.126, dY kv 0.029, dY inter 0.622, W tiles 0.114.
