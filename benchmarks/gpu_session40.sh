#!/usr/bin/env bash
# Session 40. Session 39's prepared phases, in its order: the 14B targets on the H200 with the sampler's kernels and
# the first 14B decode-step profile there (k), then issue 15's 7B actor update and the FP8 GPU tests not yet reached
# (l). Run from the repository root on the device machine; the record is at the end of this file.
#
#   phase k: bash benchmarks/gpu_session40.sh k   (no kind; ~9 min) -- session 39's phase k.
#   phase l: bash benchmarks/gpu_session40.sh l   (no kind; carry .dev/dg.tar.xz; ~10 min) -- session 39's phase l.
#   phase m: bash benchmarks/gpu_session40.sh m   (no kind; ~4 min) -- the 14B batch-1 step by kernel name (k's profile
#     left 53 % of it unattributed: the one-row group launches), with the groups split into one launch a weight
#     (:nogroup, each projection attributed) and the BF16 step beside it; the 7B step the same way.
#   phase n: bash benchmarks/gpu_session40.sh n   (no kind; ~6 min) -- the profile's generate check in its new form (two
#     multi-token calls differenced: m's read 2.33 ms against a 4.97-ms loop) at 14B / 7B batch 1, then the 14B
#     batch-1 row twice more (k: 2.38x).
#   phase o: bash benchmarks/gpu_session40.sh o   (no kind; ~6 min) -- the one-row GEMV's K split in whole waves
#     (benchmarks/gemv_split_step.py): the 14B gate/up group launch runs 1.7 waves of the 528 programs an H200 holds at
#     its 108 registers; the 14B batch-1 step under five splits / configs of it and of q/k/v, alternating three rounds,
#     7B as the control, then the 14B batch-1 row with the fastest.
#   phase p: bash benchmarks/gpu_session40.sh p   (no kind; ~5 min) -- the whole-waves split as the default
#     (gemv_config.whole_waves_split: 14B / 32B gate/up group 3 ways, nothing else moves): the 14B step without / with
#     it after a throwaway engine, the 14B batch-1 row, the GEMV group GPU tests.
#   phase q (prepared, not run: no device time left): bash benchmarks/gpu_session40.sh q   (no kind; ~6 min) -- why a
#     process's first engine decodes 2-4 % faster: gemv_split_step (now logging each timing's SM clock and watts)
#     with no throwaway engine, the same setting five times; then the 7B / 14B batch-1 rows with the NVFP4 engine
#     built first (rollout.py builds BF16 first: does its BF16 cell gain from going first?).
#   phase r (prepared, not run): bash benchmarks/gpu_session40.sh r   (no kind; ~4 min) -- whole waves without LoRA:
#     plain NVFP4 14B at batch 1 launches gate and up one weight each, 432 tiles split 2 ways by the rule: 864
#     programs, 1.31 waves at 5 an SM (96 registers) -- the rule's split > 1, so whole_waves_split does not touch it;
#     session 19's isolated timings fit (config 7, 1.31 waves: 23.4 us; config 0, 0.98 wave: 20.9 us). The step
#     under the rule, 3 ways (1.96 waves), config 0 (the rule's 3 ways: 0.98 wave).
set -u
PHASE=${1:?phase}
case $PHASE in
k) exec bash benchmarks/gpu_session39.sh k ;;
l) exec bash benchmarks/gpu_session39.sh l ;;
m)  # where the 14B batch-1 step goes, kernel by kernel (2.38x in k; 2.5x needs 4.94 ms against 5.19)
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    profile 150 14b "nvfp4+lora,nvfp4+lora:nogroup,bf16+lora" 1
    mv "$OUT/profile" "$OUT/profile14"
    profile 90 7b "nvfp4+lora,bf16+lora" 1
    mv "$OUT/profile" "$OUT/profile7"
    for d in profile14 profile7; do sed -n '/kernels by time/,$p' "$OUT/$d/run.log" | head -n 80; done
    phase_end ;;
n)  # the generate check's new form on the GPU, and the 14B batch-1 row again
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    profile 75 14b nvfp4+lora 1
    mv "$OUT/profile" "$OUT/profile14"
    profile 60 7b nvfp4+lora 1
    mv "$OUT/profile" "$OUT/profile7"
    grep -h "generate\` (check)\|\*\*step ms" "$OUT"/profile*/run.log
    rollout_table 130 14b 1 n14a
    rollout_table 130 14b 1 n14b
    phase_end ;;
o)  # whole waves for the one-row GEMV's launches (14B gate/up: 1.7 waves by the rule)
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    S=QUARL_KERNELS_GEMV_SPLIT M1=QUARL_KERNELS_GEMV_M1
    mkdir -p "$OUT/split14" "$OUT/split7"
    timeout -k 5 170 "$PY" benchmarks/gemv_split_step.py --model 14b --out "$OUT/split14" --budget-s 130 \
        --settings "rule=;gu2=$S=27648x5120:2;gu3=$S=27648x5120:3;c0=$M1=13824x5120:0;c0s3=$M1=13824x5120:0|$S=27648x5120:3;qkv2=$S=7168x5120:2" \
        > "$OUT/split14/run.log" 2>&1
    echo "== 14B splits rc=$? at $((SECONDS - T0)) s"; grep -A 9 "^| setting" "$OUT/split14/run.log"
    timeout -k 5 60 "$PY" benchmarks/gemv_split_step.py --model 7b --out "$OUT/split7" --budget-s 40 \
        --settings "rule=;gu2=$S=37888x3584:2" > "$OUT/split7/run.log" 2>&1
    echo "== 7B splits rc=$? at $((SECONDS - T0)) s"; grep -A 4 "^| setting" "$OUT/split7/run.log"
    best=$("$PY" - "$OUT/split14/gemv_split_step.json" <<'PYEOF'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
med = {k: statistics.median(v) for k, v in r["ms"].items() if v}
k = min(med, key=med.get)
print(" ".join(f"{n}={v}" for n, v in r["settings"][k].items()))
PYEOF
)
    echo "== the 14B batch-1 row with the fastest setting: ${best:-(the defaults)}"
    [ -n "$best" ] && export $best
    rollout_table 150 14b 1 o14
    phase_end ;;
p)  # the whole-waves split, default now: the 14B step off / on, the 14B batch-1 row, the group launches' GPU tests
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    mkdir -p "$OUT/ww14"
    timeout -k 5 100 "$PY" benchmarks/gemv_split_step.py --model 14b --out "$OUT/ww14" --budget-s 70 \
        --settings "off=QUARL_KERNELS_GEMV_WHOLE_WAVES=0;on=" > "$OUT/ww14/run.log" 2>&1
    echo "== 14B whole waves off / on rc=$? at $((SECONDS - T0)) s"; grep -A 4 "^| setting" "$OUT/ww14/run.log"
    rollout_table 120 14b 1 p14
    TESTS_V=1 tests $(( 280 - SECONDS + T0 )) tests/kernels/test_epilogue_gpu.py -k "group_launch_matches"
    phase_end ;;
q)  # prepared: the first-engine effect -- the clock of each timing, and the rollout rows in the other order
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    mkdir -p "$OUT/first14"
    timeout -k 5 90 "$PY" benchmarks/gemv_split_step.py --model 14b --out "$OUT/first14" --budget-s 60 \
        --warm-engines 0 --rounds 5 --settings "a=" > "$OUT/first14/run.log" 2>&1
    echo "== 14B, five engines in a row rc=$? at $((SECONDS - T0)) s"; grep -A 4 "^| setting" "$OUT/first14/run.log"
    rollout_table 150 14b 1 q14 nvfp4+lora,bf16+lora
    rollout_table 100 7b 1 q7 nvfp4+lora,bf16+lora
    phase_end ;;
r)  # prepared: whole waves for the plain NVFP4 (no LoRA) 14B gate / up launches
    OUT=${OUT:?}; source benchmarks/gpu_phase_lib.sh
    S=QUARL_KERNELS_GEMV_SPLIT M1=QUARL_KERNELS_GEMV_M1
    mkdir -p "$OUT/plain14"
    timeout -k 5 150 "$PY" benchmarks/gemv_split_step.py --model 14b --recipe nvfp4 --out "$OUT/plain14" \
        --budget-s 110 --settings "rule=;gu3=$S=13824x5120:3;c0=$M1=13824x5120:0" > "$OUT/plain14/run.log" 2>&1
    echo "== plain NVFP4 14B rc=$? at $((SECONDS - T0)) s"; grep -A 6 "^| setting" "$OUT/plain14/run.log"
    phase_end ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease; raw under results/gpu_2026-11-28/s40/):
#   k  commit 673ab0f, 2026-11-28 ~11:00-11:05 UTC, no kind -> one NVIDIA H200 (cold), 295 s held (budget 1800 ->
#      1505 s): 14B table with the sampler's kernels b1 12.354 / 5.192 = 2.379x, b64 17.231 / 14.234 = 1.211x (all
#      2048 tokens); 14B NVFP4+LoRA profile b1 4.975 / b64 14.406 ms (b1: 53 % "unattributed", the group launches);
#      engine GPU test reproducible[128] passed.
#   l  commit 673ab0f (carry .dev/dg.tar.xz), ~11:05-11:12 UTC, warm after k -> 1059 s: DeepGEMM built in 65 s; 7B
#      actor update per layer bf16 44.83 / 44.88, bf16+glue 38.49 / 38.16, FP8 24.91 / 25.07 ms (x bf16+glue 1.545 /
#      1.522); the 23 FP8 GPU tests not reached since session 37: 23 passed.
#   m  commit 0d4fc72, ~11:14-11:17 UTC, cold -> 852 s: profiles by kernel name, 14B b1 nvfp4+lora (4.974 ms; GEMV
#      3597 us in 192 launches), :nogroup (5.802), bf16+lora (12.372); 7B nvfp4+lora (2.679), bf16+lora (7.011).
#   n  commit 0a4da3a, ~11:19-11:23 UTC, cold -> 559 s: the generate check's second form read -2.119 ms (14B) / 3.258
#      (7B) against 4.972 / 2.680-ms loops (the 14B prefill swings ~0.1 s a call; third form committed after);
#      14B b1 rows 12.352 / 5.168 = 2.390x, 12.345 / 5.184 = 2.381x.
#   o  commit a547fcf, ~11:28-11:31 UTC, cold -> 347 s: gemv_split_step 14B (rule 4.971* / 5.145 / 5.149, gate/up 2
#      ways 4.946, 3 ways 4.897, config 0 5.125, config 0 + 3 ways 4.949, q/k/v 2 ways 5.242; * the process's first
#      engine), 7B (rule 2.690* / 2.791 / 2.793, gate/up 2 ways 2.790); the 14B b1 row with gate/up 3 ways: 12.41 /
#      4.92 = 2.52x.
#   p  commit fab8e95 (the whole-waves split the default), ~11:35-11:38 UTC, cold -> 122 s (given back: 118): 14B
#      off 5.144 / on 4.894 ms (throwaway first engine 4.705); 14B b1 row 12.427 / 4.920 = 2.526x; the group launch
#      GPU tests with the 14B gate/up group: 9 passed.
