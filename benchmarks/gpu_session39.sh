#!/usr/bin/env bash
# Session 39. Session 38's prepared phases, in its order: the fused sampler's GPU tests and whether it pays (g, h),
# then the GPU tests session 37's splits' calls did not reach and the 7B actor update after fp8_linear's split (e).
# Run from the repository root on the device machine; the record is at the end of this file.
#
#   phase g: bash benchmarks/gpu_session39.sh g   (no kind; ~9 min) -- session 38's phase g.
#   phase h: bash benchmarks/gpu_session39.sh h   (g's machine, warm; ~9 min) -- session 38's phase h.
#   phase e: bash benchmarks/gpu_session39.sh e   (warm after h; carry .dev/dg.tar.xz; ~9 min) -- session 38's phase e
#     reordered: the 7B actor update first, the engine's tests with the fused sampler on, the ring's last.
#   phase j: bash benchmarks/gpu_session39.sh j   (no kind; ~7 min) -- the nucleus kernel split over many programs a
#     row: its GPU tests, the bench, the engine's last two tests with the fused sampler on, the eval sampling (T 0.6,
#     top-p 0.95) at 7B batch 1 / 64 without / with it, the 7B table with it.
#   phase k (prepared, not run: no device budget left): bash benchmarks/gpu_session39.sh k   (no kind; ~9 min) -- the
#     14B rollout table at batch 1 / 64 on the H200 with the sampler's kernels (now the default; session 36's 14B
#     figures, 2.35x / 1.13x, were without them), the H200's first 14B NVFP4+LoRA decode-step profile at batch 1 / 64
#     (where the 0.29 ms that 2.5x needs at batch 1, and the 0.84 ms for 1.2x at 64, could come from), and the
#     engine's last GPU test with the default (the 128-row seeded rollout).
#   phase l (prepared, not run): bash benchmarks/gpu_session39.sh l   (no kind; carry .dev/dg.tar.xz; ~10 min) --
#     issue 15's 7B actor update in two rounds with the time e lacked (290 s), then the 23 FP8 GPU tests not yet
#     reached (SwiGLU's 16, fused glue's 5, the FP8 quantizers' last two; e's run was cut at fp8_quant's 34th).
#   Order for the next session: k, l.
set -u
PHASE=${1:?phase}
case $PHASE in
g) exec bash benchmarks/gpu_session38.sh g ;;
h) exec bash benchmarks/gpu_session38.sh h ;;
e)  # session 38's e, reordered so that the 7B update (issue 15's figure) comes first and the engine's tests run with the
    # fused sampler on (g's were cut at 15 of 18); the ring's tests last, with what is left of the call
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg TESTS_V=1
    model_step 150 p7_r2 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8 --repeat 2
    QUARL_ENGINE_FUSED_SAMPLE=1 tests 110 tests/engine/test_engine_gpu.py
    mv "$OUT/tests" "$OUT/tests_engine"
    tests 130 tests/kernels/test_fp8_quant_gpu.py tests/kernels/test_fp8_swiglu_gpu.py tests/train/test_fused_glue_gpu.py
    mv "$OUT/tests" "$OUT/tests_fp8"
    tests $(( 560 - SECONDS + T0 )) tests/kernels/test_wgmma_ring_gpu.py
    mv "$OUT/tests" "$OUT/tests_ring"
    phase_end ;;
j)  # the nucleus kernel split over many programs a row (after g's bench: one program a row was ~1 ms a call at
    # 1-64 rows, slower than the sort below ~45 rows): its GPU tests and the sampler's, the bench, the engine's last
    # two GPU tests with the fused sampler on, the 7B table with it on, the eval sampling at batch 1 / 64 off / on
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    TESTS_V=1 tests 90 tests/kernels/test_nucleus_gpu.py tests/kernels/test_sampler_gpu.py
    mv "$OUT/tests" "$OUT/tests_sampler"
    tests_passed tests_sampler || { phase_end; exit 0; }
    mkdir -p "$OUT/sampler"
    timeout -k 5 60 "$PY" benchmarks/kernels/bench_sampler.py --out "$OUT/sampler" > "$OUT/sampler/run.log" 2>&1
    echo "== sampler bench rc=$? at $((SECONDS - T0)) s"; tail -n 8 "$OUT/sampler/run.log"
    TESTS_V=1 QUARL_ENGINE_FUSED_SAMPLE=1 tests 70 tests/engine/test_engine_gpu.py -k "reproducible and (64 or 128)"
    mv "$OUT/tests" "$OUT/tests_engine"
    for side in 0 1; do
        mkdir -p "$OUT/j7_eval$side"
        QUARL_ENGINE_FUSED_SAMPLE=$side timeout -k 5 75 "$PY" benchmarks/rollout.py --models 7b \
            --variants nvfp4+lora --batches 1,64 --hf-new-tokens 0 --temperature 0.6 --top-p 0.95 \
            --budget-s 60 --out "$OUT/j7_eval$side" > "$OUT/j7_eval$side/run.log" 2>&1
        echo "== eval sampling, fused sample $side: rc=$? at $((SECONDS - T0)) s"
        grep -A 4 "^| model" "$OUT/j7_eval$side/run.log" | head -n 6
    done
    QUARL_ENGINE_FUSED_SAMPLE=1 rollout_table $(( 430 - SECONDS + T0 )) 7b 1,64 j7_on
    phase_end ;;
k)  # prepared: the 14B targets on the H200 with the sampler's kernels on (the default), and where its steps go
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    rollout_table 260 14b 1,64 k14  # session 36's 260 s for 8 cells cut 14B BF16 at batch 64 short: 4 cells here
    profile 200 14b nvfp4+lora 1,64
    TESTS_V=1 tests $(( 560 - SECONDS + T0 )) tests/engine/test_engine_gpu.py -k "reproducible and 128"
    phase_end ;;
l)  # prepared: issue 15's 7B actor update after session 37's fp8_linear split (e's was cut), then the FP8 GPU tests
    # e did not reach
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg TESTS_V=1
    model_step 290 p7_r2 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8 --repeat 2
    # the 23 FP8 tests sessions 38-39 did not reach: SwiGLU's and the glue's files first, then fp8_quant's last two
    # (every_dividend_significand alone runs over a minute)
    tests $(( 560 - SECONDS + T0 )) tests/kernels/test_fp8_swiglu_gpu.py tests/train/test_fused_glue_gpu.py \
        "tests/kernels/test_fp8_quant_gpu.py::test_quantizers_on_zeros_subnormals_extremes_and_nonfinite_groups" \
        "tests/kernels/test_fp8_quant_gpu.py::test_group_div_equals_div_rn_on_every_dividend_significand"
    phase_end ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease; raw under results/gpu_2026-11-28/s39/):
#   g  commit 4472306, 2026-11-28 ~09:38-09:44 UTC, no kind -> one NVIDIA H200 (cold), 366 s held (budget 1800 ->
#      1433 s): sampler GPU tests 29 passed; engine GPU tests with QUARL_ENGINE_FUSED_SAMPLE=1 cut by 100 s at 15 of 18,
#      15 passed; bench_sampler (fused 9.07 / 17.43 / 79.96 / 248.54 us against PyTorch 59.27 / 74.71 / 246.54 /
#      842.88 at 1 / 8 / 64 / 256 rows; nucleus, one program a row, 999 / 1105 / 1242 / 1965 against the sort's 174 /
#      498 / 1546 / 5161); 7B table off (b1 7.12 / 2.86, b64 8.56 / 6.73: short runs, 1212-1712 tokens) then on (b1
#      7.07 / 2.80 = 2.525x, b64 8.50 / 6.90 = 1.232x).
#   h  commit 4472306, ~09:45-09:50 UTC, cold again (g's machine had gone idle), -> 1058 s: on (b1 7.02 / 2.81 =
#      2.498x, b64 8.52 / 6.89 = 1.237x), off (7.08 / 2.86 = 2.476x, 8.69 / 7.07 = 1.229x); eval T 0.6 / top-p 0.95
#      b64: off 10.00 / 8.65, on 9.95 / 8.62 ms.
#   e  commit 227d67e (carry .dev/dg.tar.xz), ~09:52-10:00 UTC, cold (the first try was refused: the machine was being
#      given back) -> 492 s: DeepGEMM built in 72 s; the 7B update cut by its 150 s before the FP8 arm (BF16 rows
#      only); engine tests (fused sample on) cut at 16 of 18, 16 passed; FP8 quant / SwiGLU / glue cut at 33 passed;
#      the ring's file 66 passed.
#   j  commit c5eaf19 (the split nucleus), ~10:05-10:10 UTC, cold -> 106 s (given back: 103): sampler + nucleus GPU
#      tests 29 passed; bench (top-p 1: 9.09 / 17.31 / 81.27 / 249.38 against 60.07 / 74.99 / 249.57 / 843.41; nucleus
#      split 46.02 / 80.32 / 393.91 / 1707.50 against the sort's 175.85 / 498.39 / 1565.05 / 5211.82); engine
#      reproducible[64] passed, [128] cut by 70 s; eval NVFP4 b1 / b64: off 3.00 / 8.66, on 2.85 / 7.59 ms; 7B table
#      on: b1 6.98 / 2.78 = 2.511x, b64 8.49 / 6.88 = 1.234x.
