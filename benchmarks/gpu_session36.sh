#!/usr/bin/env bash
# Session 36. Issue 17's rollout rows on the H200 (session 29: 2.46x / 1.18x at 7B batch 1 / 64, 2.37x at 14B batch
# 1 -- the targets 2.5x / 1.2x met on the H100 only) and issue 15's 7B actor update (1.49-1.53x on the H100, where
# the 700 W cap binds; 1.54x the target). Run from the repository root on the device machine; the record is at the
# end of this file.
#
#   phase a: bash benchmarks/gpu_session36.sh a   (no kind: the tool gives an H100 or an H200; carry .dev/dg.tar.xz
#     .dev/dg_built.tar.xz; ~8 min). On an H200: issue 17's table at batch 1 / 64 (7B, 14B), the NVFP4 engine at batch
#     1 with the v7 sweep's H200 rule (QUARL_KERNELS_GEMV_DEFAULTS=h200: config 0 on every weight at one row -- never
#     measured on an H200: session 30's call for it was given an H100), and the one-row GEMV's work-split sweep
#     (bench_decode_bound.py --gemv-sweep). On an H100: session 35's prepared phase f (DeepGEMM's layouts by joules).
#   phase b: bash benchmarks/gpu_session36.sh b   (a's H200, warm; carry .dev/dg.tar.xz .dev/dg_built.tar.xz; ~7 min)
#     Issue 15 on the H200 at this code (last measured there in session 28, before the staged / TMA quantizers and the
#     token-major RoPE): the 7B actor update in three rounds, Qwen3-8B's in two.
#   phase c: bash benchmarks/gpu_session36.sh c   (no kind; ~6 min) -- after a (on the H200 the one-row GEMV's best
#     config differs from the H100's by shape: config 7 fastest on 7B's gate / up (K = 3584, where the rule gives 0)
#     and config 0 on 14B's gate / up (K = 5120, where it gives 7)): the rollout at batch 1 (7B, 14B; NVFP4+LoRA, 2048
#     new tokens) with those shapes' configs named per run (QUARL_KERNELS_GEMV_M1, new), beside the rule's.
#   phase d: bash benchmarks/gpu_session36.sh d   (no kind; carry .dev/dg.tar.xz .dev/dg_built.tar.xz; ~8 min) --
#     session 35's prepared phase f cut to the budget left (the four large shapes, 0.3 s of calls a layout): DeepGEMM's
#     layouts by joules a call; then `deepgemm_layouts.py --pick` names, per shape, the fewest-joules layout that saves
#     >= 2 % of the heuristic's joules at <= 1 % more time, and the 7B update runs with it (2 rounds).
#   phase e: bash benchmarks/gpu_session36.sh e   (d's H200, warm; ~3.5 min) -- the 7B update again in three rounds
#     at this code (the heuristic's layouts), to widen b's sample on this card.
#   phase f: bash benchmarks/gpu_session36.sh f   (e's H200, warm; ~2 min) -- the same with d's picked layouts named,
#     on the same warm machine as e (d's 1.538 / 1.553x came from another call).
#   phase g (prepared, not run: no device budget left): bash benchmarks/gpu_session36.sh g   (no kind; ~8 min) --
#     the decode kernels with their first weights loaded before the PDL wait (new, opt-in, built and checked on CPU
#     only: QUARL_KERNELS_GEMV_W_EARLY / _MMA_W_EARLY / _RING_W_EARLY): the PDL chain tests of the three kernels
#     (bit-equal to plain launches with each switch), then the 7B rollout at batch 1 (NVFP4+LoRA) alternating twice
#     without / with the GEMV's switch. If it is faster by more than the plain runs' spread, make it the default (and
#     run the engine's GPU tests with it).
#   phase h (prepared, not run): bash benchmarks/gpu_session36.sh h   (no kind; ~9 min; after g's tests passed) --
#     the 14B rollout at batch 1 without / with the GEMV's switch, then the 7B one at batch 8 and 64 (the mma.sync
#     kernel and the TMA ring with their switches) alternating twice.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh
GPU=$(tail -n +2 "$OUT/gpu.txt" | head -1)

case $PHASE in
a)
    if [[ $GPU != *H200* ]]; then
        echo "== not an H200: session 35's phase f"
        exec bash benchmarks/gpu_session35.sh f
    fi
    rollout_table 260 7b,14b 1,64 table
    QUARL_KERNELS_GEMV_DEFAULTS=h200 rollout_table 110 7b,14b 1 table_h200 nvfp4+lora
    bench 120 sweep benchmarks/kernels/bench_decode_bound.py --gemv-sweep --repeats 3
    ;;
b)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    ARMS="bf16,bf16+glue,jetrl-xtiles+deepgemm+glue"
    model_step 230 p7_r3 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl --arms $ARMS --iters 2 --accumulate 8 \
        --repeat 3
    model_step 160 q8_r2 --shape Qwen3-8B --layers 4 --tokens 16384 --loss rl --arms $ARMS --iters 2 --accumulate 8 \
        --repeat 2
    ;;
c)
    rollout_table 90 7b 1 c7_auto
    for e in 18944x3584:7 18944x3584:7,3584x3584:7; do
        QUARL_KERNELS_GEMV_M1=$e rollout_table 60 7b 1 "c7_${e//[:,]/_}" nvfp4+lora
    done
    rollout_table 100 14b 1 c14_auto
    for e in 13824x5120:0 13824x5120:0,5120x5120:0; do
        QUARL_KERNELS_GEMV_M1=$e rollout_table 70 14b 1 "c14_${e//[:,]/_}" nvfp4+lora
    done
    ;;
d)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    SH=gate-up-fwd+down-dgrad,down-fwd+gate-up-dgrad,gate-up-wgrad,down-wgrad
    mkdir -p "$OUT/layouts"
    for i in $(seq 0 15); do
        timeout -k 5 130 "$PY" benchmarks/kernels/deepgemm_layouts.py --shapes $SH --warm $i/16 \
            > "$OUT/layouts/warm$i.log" 2>&1 &
    done
    wait
    echo "== layouts compiled at $((SECONDS - T0)) s: $(cat "$OUT"/layouts/warm*.log | grep -c ' s$') ok"
    timeout -k 5 190 "$PY" benchmarks/kernels/deepgemm_layouts.py --shapes $SH --out "$OUT/layouts" --energy-s 0.3 \
        --reps 10 > "$OUT/layouts/run.log" 2>&1
    echo "== sweep rc=$? at $((SECONDS - T0)) s"; grep -E "^\|" "$OUT/layouts/run.log" | cut -c1-200
    L=$("$PY" benchmarks/kernels/deepgemm_layouts.py --pick "$OUT/layouts/deepgemm_layouts.json" 2>&1 | tail -1)
    echo "== picked DG_SM90_LAYOUTS=$L"
    if [[ -n $L && $L != *rror* ]]; then
        DG_SM90_LAYOUTS=$L model_step 170 p7_layouts --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
            --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8 --repeat 2
    fi
    ;;
e)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    model_step 200 p7_r3 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8 --repeat 3
    ;;
f)
    deepgemm
    export PYTHONPATH=$PYTHONPATH:/tmp/dg
    DG_SM90_LAYOUTS="16384:18944:3584=256,128,1,2;16384:3584:18944=256,128,1,2;3584:18944:16384=128,192,1,1" \
        model_step 150 p7_layouts_r3 --shape Qwen2.5-7B --layers 4 --tokens 16384 --loss rl \
        --arms "bf16,bf16+glue,jetrl-xtiles+deepgemm+glue" --iters 2 --accumulate 8 --repeat 3
    ;;
g)
    tests 180 tests/kernels/test_gemv_gpu.py tests/kernels/test_mma_decode_gpu.py tests/kernels/test_wgmma_ring_gpu.py \
        -k "pdl_chain"
    if grep -q " passed" "$OUT/tests/pytest.log" && ! grep -qE "failed|error" "$OUT/tests/pytest.log"; then
        rollout_table 90 7b 1 g7_plain
        QUARL_KERNELS_GEMV_W_EARLY=1 rollout_table 60 7b 1 g7_early nvfp4+lora
        rollout_table 60 7b 1 g7_plain2 nvfp4+lora
        QUARL_KERNELS_GEMV_W_EARLY=1 rollout_table 60 7b 1 g7_early2 nvfp4+lora
    fi
    ;;
h)  # after g's tests passed
    rollout_table 100 14b 1 h14_plain
    QUARL_KERNELS_GEMV_W_EARLY=1 rollout_table 70 14b 1 h14_early nvfp4+lora
    rollout_table 100 7b 8,64 h7_plain
    QUARL_KERNELS_MMA_W_EARLY=1 QUARL_KERNELS_RING_W_EARLY=1 rollout_table 80 7b 8,64 h7_early nvfp4+lora
    rollout_table 80 7b 8,64 h7_plain2 nvfp4+lora
    QUARL_KERNELS_MMA_W_EARLY=1 QUARL_KERNELS_RING_W_EARLY=1 rollout_table 80 7b 8,64 h7_early2 nvfp4+lora
    ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
#   a  commit a5c973c, 2026-11-28 03:29-03:35 UTC, no kind -> one NVIDIA H200 (cold), 335 s (budget 1800 -> 1315 s):
#      table step ms BF16+LoRA / NVFP4+LoRA 7B 7.06 / 2.84, 8.67 / 7.36 (2.49x / 1.18x), 14B 12.40 / 5.27, 16.88 (1564
#      new tokens: the budget's cut) / 14.91 (2.35x / 1.13x); with QUARL_KERNELS_GEMV_DEFAULTS=h200 NVFP4+LoRA 2.91 /
#      5.28 at batch 1; the one-row GEMV sweep: config 7 faster than 0 on 7B's weights, config 0 on 14B's gate / up.
#   b  commit a8588f9, 03:37-03:43 UTC, one H200 (cold), 338 s (-> 909 s; given back: 906): 7B update 25.63 / 25.23 /
#      25.26 ms a layer against bf16+glue 39.14 / 39.11 / 38.84 (1.527 / 1.550 / 1.538x); Qwen3-8B 21.89 / 22.00
#      against 33.17 / 33.19 (1.515 / 1.508x).
#   c  commit 36c2f5a, 03:45-03:49 UTC, one H200 (cold), 231 s (-> 643 s; given back: 641): NVFP4+LoRA batch 1, step ms
#      (BF16+LoRA 6.99 / 12.41): 7B 2.87 by the rule, 2.95 (18944x3584:7), 2.96 (+3584x3584:7); 14B 5.25 by the rule,
#      5.23 (13824x5120:0), 5.28 (+5120x5120:0).
#   d  commit ba6b1d6, 03:50-03:55 UTC, one H200 (cold), 293 s (-> 313 s): 108 layouts compiled in 49 s; the sweep's
#      joules noise (the heuristic's layout 1154 / 1565 mJ in its two rounds); picked
#      16384:18944:3584=256,128,1,2;16384:3584:18944=256,128,1,2;3584:18944:16384=128,192,1,1; the 7B update with them
#      24.91 / 25.09 against 38.59 / 38.68 (1.538 / 1.553x).
#   e  commit 709ac81, 03:55-03:57 UTC, d's H200 (warm), 105 s (-> 193 s): 7B update (heuristic layouts) 25.30 / 25.54 /
#      25.30 against 38.47 / 38.57 / 38.48 (1.520 / 1.510 / 1.521x).
#   f  commit 9701a21, 03:57-03:59 UTC, e's H200 (warm), 108 s (-> 72 s; given back: 69): with d's picks 25.54 / 24.98 /
#      25.00 against 38.25 / 38.39 / 38.38 (1.498 / 1.537 / 1.535x): within the spread, not kept.
