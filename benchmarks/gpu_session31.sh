#!/usr/bin/env bash
# Session 31. Issue 15 (Jet-RL): the 7B actor update's quantizers stream at ~60 % of the H100's copy rate with one
# chunk of loads in flight a program (session 30's profile); here their loops software-pipelined (Triton's pipeliner,
# cp.async into shared memory: fp8_quant's seven-field ACT_SETTINGS, fp8_swiglu's four-field MERGED_SETTINGS). Run
# from the repository root on the device machine; the record is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session31.sh a   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~7 min)
#     The GPU tests of both quantizers (every setting's bits against eager, the new pipelined ones included), then
#     each 7B operand's candidates (fp8_quant_operands.py, with session 30's prepared second table: row groups alone,
#     X^T alone, a plain copy of the useful bytes) and the fused SwiGLU backward (fp8_swiglu_bench.py); DeepGEMM
#     built meanwhile for phase b.
#   phase b: bash benchmarks/gpu_session31.sh b   (right after a, warm; carry .dev/dg.tar.xz .dev/old31; ~8 min)
#     The 7B actor update with this code, with session 30's quantizers (.dev/old31: fp8_quant.py and fp8_swiglu.py
#     of commit b17cc12, copied over a copy of the tree in /tmp/old), and with this code again.
#   phase c: bash benchmarks/gpu_session31.sh c   (nvidia-h100-x1; ~4 min)
#     After a (the pipelined settings lost: 5 of 6 operands, every SwiGLU one): what bounds the one-read quantizers,
#     under Nsight Compute (--set full, --clock-control none): benchmarks/kernels/profile_fp8_quant.py's six launches
#     at the 7B width, 16k tokens.
#   phase d: bash benchmarks/gpu_session31.sh d   (nvidia-h100-x1; ~4 min)
#     After c (the Triton one-read kernels' X^T transpose: 5.7-5.9-way shared-memory bank conflicts on 75 % of its
#     wavefronts; loads using half of each sector a request): quarl_kernels.fp8_quant_regs, a Gluon kernel whose
#     transpose is a register renaming -- its GPU test against eager (every setting, both X^T forms, odd shapes,
#     zeros / subnormals / 1e38 groups), then its time on each 7B operand beside the best Triton setting.
#   phase e: bash benchmarks/gpu_session31.sh e   (nvidia-h100-x1; ~4 min)
#     After d (the register-order kernel 2-6 % faster than the best Triton setting on 4 of 5 operands; its persistent
#     forms slower): the MLP forward's h = silu(g) * u quantized in the same kernel from g and u (never written in
#     BF16): its GPU test against eager, then fp8_swiglu_bench.py's forward rows (glue + quantizer vs fused) at 7B
#     and 32B width.
#   phase f: bash benchmarks/gpu_session31.sh f   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~4 min)
#     After e (fused forward 0.84 ms against the glue + quantizer's 1.31 at 7B width, 1.21 / 1.89 at 32B): the fused
#     forward wired into quarl.quant.fp8_swiglu (QUARL_FP8_SWIGLU_FWD=0 rules it out); the GPU tests of the fused MLP
#     (both forward paths), the kernels and the compiled glue / engine on Jet-RL models; DeepGEMM built for g.
#   phase g: bash benchmarks/gpu_session31.sh g   (right after f, warm; ~8 min)
#     The 7B actor update with the fused forward, with QUARL_FP8_SWIGLU_FWD=0, and fused again.
#   phase h: bash benchmarks/gpu_session31.sh h   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~7 min)
#     fp8_quant_regs as a run-time candidate of fp8_quant.quantize_act (("regs", tokens a thread, warps), where X^T is
#     wanted): the GPU tests (the choice taking it, stacked out= blocks, every setting's bits), the 7B operands' table
#     (which operands it wins), then the 7B actor update.
#   phase i: bash benchmarks/gpu_session31.sh i   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~7 min)
#     The Qwen3-8B actor update with this session's code (session 30: 1.45x), then the 7B one again.
#   phase j: bash benchmarks/gpu_session31.sh j   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~9 min)
#     The Qwen2.5-32B actor update, two rounds (session 30: 1.56x / 1.54x).
#   phase k: bash benchmarks/gpu_session31.sh k   (nvidia-h100-x1; ~4 min)
#     SwiGLU's backward pass in the register-order Gluon kernel (fp8_quant_regs._swiglu_bwd_kernel: dh, g, u read
#     once, dg and du coded from registers, bit for bit fp8_swiglu's merged pass), a candidate of the merged choice:
#     the GPU test (every setting's bits, rows / no rows, padded shape), then fp8_swiglu_bench's backward rows.
#   phase l: bash benchmarks/gpu_session31.sh l   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~6 min)
#     After k (the Gluon backward pass 1.607 ms against the Triton merged pass's 1.771 at 7B width): the 7B and
#     Qwen3-8B actor updates with everything of this session.
#   phase m (prepared, not run: no device budget left): bash benchmarks/gpu_session31.sh m   (nvidia-h100-x1; carry
#     .dev/dg.tar.xz; ~7 min) -- for the next step on the 7B actor update: the Gluon kernels under Nsight Compute
#     (what limits them now: session 31's reading is too few loads in flight at two programs a multiprocessor), then
#     where a 7B FP8 layer's time goes with this session's code (profiled, one micro-batch a step; session 30's
#     profile for comparison).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

case $PHASE in
a)
    (deepgemm > "$OUT/deepgemm.log" 2>&1) &
    tests 200 tests/kernels/test_fp8_quant_gpu.py tests/kernels/test_fp8_swiglu_gpu.py
    bench 120 quant benchmarks/kernels/fp8_quant_operands.py --models Qwen2.5-7B
    bench 100 swiglu benchmarks/kernels/fp8_swiglu_bench.py --models Qwen2.5-7B
    wait
    cat "$OUT/deepgemm.log"
    ;;
b)
    rm -rf /tmp/old && mkdir -p /tmp/old && cp -r benchmarks kernels quarl /tmp/old/ && cp .dev/old31/*.py /tmp/old/kernels/quarl_kernels/
    [ -d /tmp/dg/deep_gemm ] || deepgemm
    model7 new old new
    ;;
c)
    mkdir -p "$OUT/ncu"
    timeout -k 5 "${NCU_S:-300}" ncu --clock-control none --kernel-name regex:"_act_kernel|_act_t_kernel|_swiglu_rows_kernel" \
        --launch-skip 6 --launch-count 6 --set full --import-source no \
        "$PY" benchmarks/kernels/profile_fp8_quant.py > "$OUT/ncu/ncu.txt" 2>&1
    echo "== ncu rc=$? at $((SECONDS - T0)) s"
    grep -E "^  _|launch:|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Registers Per|L1/TEX Hit|Mem Pipes Busy|Executed Instructions  |No Eligible|Active Warps Per|Eligible Warps|Theoretical Occ|Block Limit Reg|Shared Memory Config|SM Frequency" "$OUT/ncu/ncu.txt" | head -n 150
    ;;
d)
    tests 150 tests/kernels/test_fp8_quant_gpu.py -k "regs or every_launch"
    bench 150 quant benchmarks/kernels/fp8_quant_operands.py --models Qwen2.5-7B --regs
    ;;
e)
    tests 200 tests/kernels/test_fp8_swiglu_gpu.py tests/kernels/test_fp8_quant_gpu.py -k "regs or forward_operand"
    bench 120 swiglu benchmarks/kernels/fp8_swiglu_bench.py --models Qwen2.5-7B,Qwen2.5-32B
    ;;
f)
    (deepgemm > "$OUT/deepgemm.log" 2>&1) &
    tests 230 tests/kernels/test_fp8_swiglu_gpu.py tests/kernels/test_fp8_quant_gpu.py tests/train/test_fused_glue_gpu.py \
        -k "swiglu or regs or glue or fused or stack or engine or jetrl"
    wait
    cat "$OUT/deepgemm.log"
    ;;
g)
    [ -d /tmp/dg/deep_gemm ] || deepgemm
    FP8=jetrl-xtiles+deepgemm+glue
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    for r in fused written fused2; do
        [ $r = written ] && export QUARL_FP8_SWIGLU_FWD=0 || export QUARL_FP8_SWIGLU_FWD=1
        model_step "${M_S:-150}" p7$r --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl --arms "bf16,bf16+glue,$FP8" \
            --iters 2 --accumulate 8
    done
    ;;
h)
    (deepgemm > "$OUT/deepgemm.log" 2>&1) &
    tests 150 tests/kernels/test_fp8_quant_gpu.py -k "regs or chosen or every_launch or equals_eager"
    bench 100 quant benchmarks/kernels/fp8_quant_operands.py --models Qwen2.5-7B
    wait
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    model_step "${M_S:-150}" p7regs --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8
    ;;
i)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    model_step "${M8_S:-170}" p8 --shape Qwen3-8B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8
    model_step "${M_S:-150}" p7 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8
    ;;
j)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    model_step "${M32_S:-420}" p32 --shape Qwen2.5-32B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8 --repeat 2
    ;;
k)
    tests 150 tests/kernels/test_fp8_swiglu_gpu.py -k "every_launch or operands_match"
    bench 100 swiglu benchmarks/kernels/fp8_swiglu_bench.py --models Qwen2.5-7B,Qwen2.5-32B
    ;;
l)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    model_step "${M_S:-140}" p7 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8
    model_step "${M8_S:-150}" p8 --shape Qwen3-8B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8
    ;;
m)  # prepared, not run (no device budget left)
    mkdir -p "$OUT/ncu"
    timeout -k 5 "${NCU_S:-240}" ncu --clock-control none --kernel-name regex:"_regs_kernel|_swiglu_bwd_kernel" \
        --launch-skip 4 --launch-count 4 --set full --import-source no \
        "$PY" benchmarks/kernels/profile_fp8_quant.py --regs > "$OUT/ncu/ncu.txt" 2>&1
    echo "== ncu rc=$? at $((SECONDS - T0)) s"
    grep -E "^  _|launch:|Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions  |No Eligible|Achieved Occupancy|Registers Per|way bank" \
        "$OUT/ncu/ncu.txt" | head -n 80
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    model_step "${M_S:-200}" p7prof --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --profile
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
#   a  commit b8a7b39, 2026-11-27 19:16-19:20 UTC, one NVIDIA H100 80GB HBM3 (cold), 219 s (budget 1800 -> 1672 s,
#      counted at 50 %): GPU tests 29 passed (the pipelined settings' bits); 7B operands: the pipelined settings won
#      none of the wide ones (X [T, 18944] best pipelined 0.850 against 0.678 ms); second table: X [T, 18944] both
#      0.678, rows alone 0.351, X^T alone 0.419, copy 0.416; SwiGLU merged (32, 8, 32) 1.760, pipelined 2.07-2.16 ms.
#   c  commit e9e6bd0, 19:21-19:22 UTC, H100 (cold), 34 s (-> 1621 s): ncu of the six launches (RESULTS "Session 31").
#   d  commit 01f652c, 19:25-19:27 UTC, H100 (cold), 119 s (-> 1528 s): fp8_quant_regs' GPU test 6 passed; regs (16,
#      8) 0.137 / 0.651 / 0.128 / 0.028 / 0.608 ms on the 7B X / X inter / dY / dY kv / dY inter operands.
#   d  (again, persistent forms) commit cc0b134, 19:29-19:32 UTC, H100 (cold), 178 s (-> 1406 s): persistent forms
#      0.795-1.124 ms on X [T, 18944] (plain (16, 8) 0.652); one GPU test failed: the 4-tile cp.async ring on fp32
#      input asked 266 KB of shared memory (the forms were removed after).
#   e  commit 0e7fd1a, 19:34-19:37 UTC, H100 (cold), 170 s (-> 1288 s): GPU tests 7 passed; forward fused (16, 8)
#      0.840 / 1.214 ms against glue + quantizer 1.311 / 1.887 (7B / 32B width).
#   f  commit e9b28b2, 19:39-19:42 UTC, H100 (cold), 153 s (-> 1177 s): 19 GPU tests passed (fused MLP both forward
#      paths, kernels, compiled glue and engine on Jet-RL models).
#   g  commit e9b28b2, 19:42-19:45 UTC, the same H100 (warm), 209 s (-> 1069 s): 7B actor update per layer bf16+glue /
#      FP8 38.92 / 26.17 (1.487x) h fused, 39.11 / 27.10 (1.443x) QUARL_FP8_SWIGLU_FWD=0, 38.97 / 26.30 (1.482x).
#   h  commit 4b8d2f1, 19:51-19:55 UTC, H100 (cold), 224 s (-> 924 s): GPU tests 17 passed; regs chosen on 4 of 5 7B
#      operands (X inter 0.651, dY 0.121, dY inter 0.588 ms); 7B actor update 39.41 / 26.54 (1.485x).
#   i  commit aa17590, 19:55-19:58 UTC, the same H100 (warm), 165 s (-> 825 s): Qwen3-8B 33.62 / 22.73 (1.479x); 7B
#      39.16 / 26.84 (1.459x).
#   j  commit aa17590, 19:58-20:01 UTC, the same H100 (warm), 176 s (-> 733 s): Qwen2.5-32B, two rounds, 78.53 /
#      50.43 (1.557x), 78.84 / 50.42 (1.564x).
#   k  commit 5681572, 20:03-20:05 UTC, H100 (cold; counted in full from here), 123 s (-> 557 s): GPU tests 3 passed
#      (the Gluon backward pass's bits equal the Triton passes'); SwiGLU backward ('regs', 16, 8) 1.607 / 2.341 ms
#      against the merged Triton pass's 1.771 / 2.580 (7B / 32B width); forward fused 0.849 / 1.223.
#   l  commit e08745e, 20:05-20:10 UTC, the same H100 (warm), 324 s (-> 222 s; given back: 219 s): 7B 39.28 / 26.64
#      (1.474x), Qwen3-8B 33.80 / 22.79 (1.483x). No budget left to start another machine.
