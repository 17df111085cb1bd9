#!/usr/bin/env bash
# Session 14 (2026-11-26): issue 17's batch-64 decode (the M = 17..64 wgmma kernel at 24-28 % of HBM). Run from the
# repository root on the device machine; the record of what ran is at the end of this file. The phases use
# benchmarks/gpu_phase_lib.sh's helpers (tests, profile, rollout_table, grpo, phase_end).
#
#   phase a: bash benchmarks/gpu_session14.sh a   (one GPU; ~4 min)
#     Nsight Compute on the wgmma decode kernel as shipped (benchmarks/kernels/profile_wgmma_decode.py): NVFP4 at 64
#     rows on 18944 x 3584 and 3584 x 3584 (config 1, the M > 32 default), and at 32 rows on 18944 x 3584 (config 2):
#     the full section set, the details page and the per-instruction (SASS) stall samples.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

ncu_wgmma() {  # NAME SECONDS ARGS...: one ncu report of profile_wgmma_decode.py -> $OUT/ncu/NAME.*
    local name=$1 s=$2; shift 2
    mkdir -p "$OUT/ncu"
    timeout -k 5 "$s" ncu --clock-control none --profile-from-start off -k regex:"wgmma" --set full \
        -o "$OUT/ncu/$name" -f "$PY" benchmarks/kernels/profile_wgmma_decode.py "$@" > "$OUT/ncu/$name.log" 2>&1
    echo "== ncu $name rc=$? at $((SECONDS - T0)) s"
    ncu -i "$OUT/ncu/$name.ncu-rep" --page details > "$OUT/ncu/$name.details.txt" 2>&1
    ncu -i "$OUT/ncu/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu/$name.source.csv" 2>&1
    grep -E "^  [a-z_]+|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issue Slots Busy|No Eligible|Block Limit|Warp Cycles Per Issued" \
        "$OUT/ncu/$name.details.txt" | head -60
}

#   phase b: bash benchmarks/gpu_session14.sh b   (one GPU; ~7 min)
#     The TMA-ring kernel (kernels/quarl_kernels/wgmma_ring.py, new; built from phase a's profile: x permuted once
#     per call and fed by TMA with the packed words, STAGES steps ahead; no x registers, PRMTs, shared stores, fence or
#     CTA barrier per step): its GPU tests; NVFP4 at 32 / 64 rows beside every wgmma_decode candidate, mma_decode and
#     cuBLAS (bench_wgmma_decode.py --ring) on the 7B shapes; ncu of its default at 64 rows; the 7B decode-step
#     profile at batch 64 (BF16+LoRA, NVFP4+LoRA, NVFP4+LoRA:ring).
#   phase c: bash benchmarks/gpu_session14.sh c   (one GPU; ~8 min)
#     The TMA-ring kernel on by default (with its measured configs, x permuted by a Triton kernel, once for gate + up):
#     the GPU tests (ring, wgmma_decode); issue 17's rollout table at batch 64, 7B and 14B, LoRA on both sides; the
#     decode-step profile at batch 64, 7B and 14B: BF16+LoRA, NVFP4+LoRA (ring), NVFP4+LoRA:noring.
#   phase d: bash benchmarks/gpu_session14.sh d   (one GPU; ~5 min)
#     The 7B GRPO step (its rollouts are batch 64) with the defaults (the ring on), twice.
#   phase e: bash benchmarks/gpu_session14.sh e   (one GPU; ~9 min)
#     Issue 17's rollout table in one run with the code of phase c/d: 7B and 14B, batch 1 / 8 / 64, 2048 new tokens,
#     BF16+LoRA vs NVFP4+LoRA (rank 32 on all projections).
#   phase f: (ran at a682404, reverted: the CTA's scales as one TMA box; an illegal instruction in every ring launch)
#   phase g: bash benchmarks/gpu_session14.sh g   (one GPU; ~4 min)
#     Reproducibility with the ring (phase d's NVFP4 mismatch statistic differed between two identical GRPO runs): the
#     ring GPU tests incl. repeated launches bit-identical (eager, other work between, graph replays); then a seeded
#     batch-64 NVFP4+LoRA rollout on a 4-layer 7B-shaped model, twice on one engine and once on a fresh one, with the
#     ring on, off, and wgmma_decode off too (benchmarks/rollout_determinism.py).
#   phase h: bash benchmarks/gpu_session14.sh h   (one GPU; ~8 min)
#     The same at the GRPO step's scale: the seeded rollout at 28 layers, 512 tokens (ring on / off), then the 7B GRPO
#     step twice with QUARL_KERNELS_WGMMA_RING=0 (is the NVFP4 mismatch statistic identical between runs again, as in
#     session 13?).
#   phase i: bash benchmarks/gpu_session14.sh i   (one GPU; ~6 min)
#     Phase h found the ring not reproducible at the GRPO step's scale (tokens differ from step 7; identical with the
#     ring off). Suspect: the next step's decode rewrites the A registers of the wgmma still in flight (PTX leaves
#     that undefined). The kernel hammered from a CUDA graph (benchmarks/kernels/ring_race.py: 400 launches a shape)
#     with and without each step's wgmma waited for (inflight=0); the seeded rollout at 28 layers / 512 tokens with
#     that variant; its speed beside the others (bench_wgmma_decode.py --ring, 64 rows, 7B shapes).
#   phase j: bash benchmarks/gpu_session14.sh j   (one GPU; ~5 min)
#     The fix (phase i: reproducible when each step's wgmma is waited for, ~2 % slower): the ring and wgmma_decode wait
#     for each step's MMA before the next decode. GPU tests (ring, wgmma_decode); the seeded rollout at 28 layers /
#     512 tokens; the speed of both kernels at 32 / 64 rows (NVFP4 7B shapes, INT4 on the MLP shape).
#   phase k: bash benchmarks/gpu_session14.sh k   (one GPU; ~7 min)
#     With the fix: issue 17's rollout table at batch 64 (7B, 14B) and the 7B GRPO step.
#   phase l: bash benchmarks/gpu_session14.sh l   (one GPU; ~2 min)
#     The decode-into-A-registers block shared by the two wgmma kernels (wgmma_decode.a_fragment; no change in the
#     arithmetic): their GPU tests.
#   phase m: bash benchmarks/gpu_session14.sh m   (one GPU; ~2 min)
#     The reproducibility check as a GPU test (tests/engine/test_engine_gpu.py, the 7B-shaped batch-64 rollout).
#   phase n: bash benchmarks/gpu_session14.sh n   (one GPU; ~1.5 min)
#     Could the ring take k / v (below its size floor today, on the Triton tensor-core kernel) and share q's permuted
#     x? The ring beside the dispatch on the 7B / 14B k / v shapes and the 14B q / o (5120 x 5120) at 32 / 64 rows.
case $PHASE in
a)
    ncu_wgmma m64 200 --shapes 18944x3584,3584x3584 --m 64 --configs 1
    ncu_wgmma m32 120 --shapes 18944x3584 --m 32 --configs 2
    ;;
b)
    tests "${TEST_S:-180}" tests/kernels/test_wgmma_ring_gpu.py
    mkdir -p "$OUT/bench"
    timeout -k 5 "${BENCH_S:-200}" "$PY" benchmarks/kernels/bench_wgmma_decode.py --ring --formats nvfp4 --ms 32,64 \
        --no-check --shapes 18944x3584,3584x18944,3584x3584 --budget-s $(( ${BENCH_S:-200} - 30 )) --out "$OUT/bench" \
        > "$OUT/bench/run.log" 2>&1
    echo "== bench rc=$? at $((SECONDS - T0)) s"; tail -n 12 "$OUT/bench/run.log"
    ncu_wgmma ring 100 --shapes 18944x3584,3584x3584 --m 64 --configs r0
    profile "${PROFILE_S:-150}" 7b bf16+lora32,nvfp4+lora32,nvfp4+lora32:ring 64
    ;;
c)
    tests "${TEST_S:-200}" tests/kernels/test_wgmma_ring_gpu.py tests/kernels/test_wgmma_decode_gpu.py
    rollout_table "${TABLE_S:-260}" 7b,14b 64 table64
    profile "${PROFILE_S:-130}" 7b,14b bf16+lora32,nvfp4+lora32,nvfp4+lora32:noring 64
    ;;
d)
    grpo "${GRPO_S:-270}" grpo
    grpo "${GRPO_S:-270}" grpo2
    ;;
e)
    rollout_table "${TABLE_S:-570}" 7b,14b 1,8,64 table
    ;;
g)
    tests "${TEST_S:-150}" tests/kernels/test_wgmma_ring_gpu.py
    mkdir -p "$OUT/det"
    timeout -k 5 "${DET_S:-240}" "$PY" benchmarks/rollout_determinism.py --out "$OUT/det" > "$OUT/det/run.log" 2>&1
    echo "== determinism rc=$? at $((SECONDS - T0)) s"; tail -n 8 "$OUT/det/run.log"
    ;;
h)
    mkdir -p "$OUT/det"
    timeout -k 5 "${DET_S:-200}" "$PY" benchmarks/rollout_determinism.py --layers 28 --tokens 512 --out "$OUT/det" \
        > "$OUT/det/run.log" 2>&1
    echo "== determinism rc=$? at $((SECONDS - T0)) s"; tail -n 8 "$OUT/det/run.log"
    QUARL_KERNELS_WGMMA_RING=0 grpo "${GRPO_S:-150}" grpo_noring
    QUARL_KERNELS_WGMMA_RING=0 grpo "${GRPO_S:-150}" grpo_noring2
    grep -ho '"mismatch_abs_logprob_diff": [0-9.]*' "$OUT"/grpo_noring*/grpo_step_gpu.json
    ;;
i)
    mkdir -p "$OUT/race" "$OUT/det" "$OUT/bench"
    timeout -k 5 "${RACE_S:-120}" "$PY" benchmarks/kernels/ring_race.py --out "$OUT/race" > "$OUT/race/run.log" 2>&1
    echo "== race rc=$? at $((SECONDS - T0)) s"; cat "$OUT/race/run.log" | tail -n 8
    timeout -k 5 "${DET_S:-200}" "$PY" benchmarks/rollout_determinism.py --layers 28 --tokens 512 --out "$OUT/det" \
        > "$OUT/det/run.log" 2>&1
    echo "== determinism rc=$? at $((SECONDS - T0)) s"; tail -n 8 "$OUT/det/run.log"
    timeout -k 5 "${BENCH_S:-130}" "$PY" benchmarks/kernels/bench_wgmma_decode.py --ring --formats nvfp4 --ms 64 \
        --no-check --smoke-timeout-s 0 --shapes 18944x3584,3584x18944,3584x3584 --budget-s $(( ${BENCH_S:-130} - 20 )) \
        --out "$OUT/bench" > "$OUT/bench/run.log" 2>&1
    echo "== bench rc=$? at $((SECONDS - T0)) s"; grep -o '"config": "ring[^"]*", "default": [a-z]*, "err": [0-9.e-]*, "us": [0-9.]*' "$OUT/bench/wgmma_decode.json" | head -30
    ;;
j)
    tests "${TEST_S:-170}" tests/kernels/test_wgmma_ring_gpu.py tests/kernels/test_wgmma_decode_gpu.py
    mkdir -p "$OUT/det" "$OUT/bench"
    timeout -k 5 "${DET_S:-120}" "$PY" benchmarks/rollout_determinism.py --layers 28 --tokens 512 --out "$OUT/det" \
        > "$OUT/det/run.log" 2>&1
    echo "== determinism rc=$? at $((SECONDS - T0)) s"; tail -n 8 "$OUT/det/run.log"
    timeout -k 5 "${BENCH_S:-150}" "$PY" benchmarks/kernels/bench_wgmma_decode.py --ring --formats nvfp4,int4-g128 \
        --ms 32,64 --no-check --smoke-timeout-s 0 --shapes 18944x3584,3584x3584 --budget-s $(( ${BENCH_S:-150} - 20 )) \
        --out "$OUT/bench" > "$OUT/bench/run.log" 2>&1
    echo "== bench rc=$? at $((SECONDS - T0)) s"; grep -A 9 "^| format" "$OUT/bench/run.log" | head -12
    ;;
k)
    rollout_table "${TABLE_S:-280}" 7b,14b 64 table64
    grpo "${GRPO_S:-150}" grpo
    ;;
l)
    tests "${TEST_S:-170}" tests/kernels/test_wgmma_ring_gpu.py tests/kernels/test_wgmma_decode_gpu.py
    ;;
m)
    tests "${TEST_S:-200}" tests/engine/test_engine_gpu.py -k "reproducible or matches_trainer"
    ;;
n)
    mkdir -p "$OUT/bench"
    timeout -k 5 "${BENCH_S:-100}" "$PY" benchmarks/kernels/bench_wgmma_decode.py --ring --formats nvfp4 --ms 32,64 \
        --no-check --smoke-timeout-s 0 --shapes 512x3584,1024x5120,5120x5120 --budget-s $(( ${BENCH_S:-100} - 15 )) \
        --out "$OUT/bench" > "$OUT/bench/run.log" 2>&1
    echo "== bench rc=$? at $((SECONDS - T0)) s"; grep -A 9 "^| format" "$OUT/bench/run.log" | head -10
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record of the calls (2026-11-26; results/gpu_2026-11-26/s14/<x>):
#   a  phase a at c83bb52: 31 s. ncu, v11 NVFP4 at 64 rows: 18944 x 3584 50.8 us, 24 % DRAM, 21 % issue, 3 CTAs (158
#      regs), 9.2 cycles an issued instruction, 55 % long scoreboard (stall samples: x PRMTs ~30 %, fence 10 %, barrier
#      7 %, x stores with 8.6-way bank conflicts); 3584 x 3584 15.2 us, 15 %; at 32 rows 18944 x 3584 34.8 us, 35 %.
#   b  phase b at caffec1 (ring off by default, x permuted by torch): 156 s. GPU tests 32 passed. NVFP4 at 64 rows,
#      ring best / v11 best / cuBLAS (us): 18944 x 3584 36.2 / 54.3 / 54.5; 3584 x 18944 39.8 / 52.4 / 57.1; 3584 x 3584
#      14.5 / 17.1 / 12.2; at 32 rows 31.7 / 38.4 / 62.8, 33.2 / 42.1 / 55.3, 13.0 / 11.4 / 12.1. ncu of the ring:
#      40 % DRAM, 40 % issue. 7B batch-64 step: BF16+LoRA 10.968, NVFP4+LoRA 10.281, :ring 9.097 ms.
#   c  phase c at f1342fa (ring on by default, Triton permutation, shared by gate / up; the first call was refused
#      and cost 120 s of budget): 391 s. GPU tests 112 passed. Batch-64 table: 7B 5878.5 / 7588.8 tok/s = 1.29x, 14B
#      2898.9 / 3576.9 = 1.23x. Profile step ms: 7B BF16 10.936, NVFP4 8.446, :noring 10.273; 14B 22.235 / 18.226 /
#      21.678.
#   d  phase d at f1342fa: 192 s. GRPO step (steady) BF16 18.36 / NVFP4 17.58 = 0.958x; 18.45 / 17.61 = 0.954x; the
#      NVFP4 step-0 mismatch differed between the runs (0.0730 / 0.0681).
#   e  phase e at 599e49d: 391 s. Table, BF16+LoRA / NVFP4+LoRA tok/s: 7B b1 118.1 / 310.6 (2.63x), b8 901.1 / 1848.9
#      (2.05x), b64 5863.9 / 7582.9 (1.29x); 14B 65.9 / 171.5 (2.60x), 494.3 / 1011.6 (2.05x), 2881.5 / 3573.3 (1.24x).
#   f  phase f at a682404 (the scales by TMA): 47 s. Every ring launch: "an illegal instruction"; GPU tests 33 failed,
#      bench smoke failed, profile failed. Reverted (387fe50).
#   g  phase g at 8e2d979: 66 s. GPU tests 36 passed (repeated launches bit-identical). Seeded rollout, 4 layers, 128
#      tokens, batch 64: identical in all arms.
#   h  phase h at 1f64157: 264 s. Seeded rollout, 28 layers, 512 tokens: default differs from token 7 (replay) / 29
#      (fresh engine); ring off and wgmma off identical. GRPO with the ring off: 18.31 / 18.45 (1.008x), 18.13 / 20.33;
#      NVFP4 step-0 mismatch 0.0633 in both runs.
#   i  phase i at 17e0abb: 115 s. ring_race.py: 0 of 400 differ for inflight 1 and 0 (kernel alone). Seeded rollout:
#      default differs from token 24 / 57; inflight=0 (QUARL_KERNELS_WGMMA_RING_INFLIGHT=0), ring off, wgmma off all
#      identical. Bench at 64 rows, ring R64S3 inflight 1 / 0: 34.3 / 35.2 us (18944 x 3584), 36.2 / 36.9 (3584 x 18944).
#   j  phase j at 548f83d (the wait for each step's wgmma in the ring and wgmma_decode): 164 s. GPU tests 117 passed.
#      Seeded rollout identical in every arm. Dispatch / cuBLAS at 32 / 64 rows (us): 18944 x 3584 29.2 / 55.1, 35.7 /
#      56.8; 3584 x 3584 11.3 / 12.3, 13.4 / 12.4; INT4 18944 x 3584 36.2 / 62.4, 54.1 / 54.8.
#   k  phase k at 548f83d: 269 s. Batch-64 table: 7B 5866.5 / 7539.1 = 1.29x, 14B 2896.4 / 3561.9 = 1.23x. GRPO step
#      (steady) BF16 18.23 / NVFP4 17.18 = 0.942x.
#   l  phase l at af85963 (wgmma_decode.a_fragment shared by both kernels): 63 s. GPU tests 117 passed.
#      Device budget left after the session's calls: 332 s; the machine was given back.
#   m  phase m at b3ed3d1 (the GPU test of the 7B-shaped batch-64 rollout's reproducibility): 57 s. 2 passed (47.9 s,
#      with the trainer-forward match test). Device budget left: 288 s; the machine was given back.
#   n  phase n at 0ed0bef: 48 s. NVFP4, whole calls (us), dispatch / best ring / best v11 / cuBLAS, 32 | 64 rows:
#      512 x 3584 6.6 / 10.4 / 8.7 / 7.2 | 8.3 / 11.2 / 9.8 / 7.4; 1024 x 5120 9.6 / 11.0 / 9.5 / 8.6 | 13.6 / 12.0 / 11.3
#      / 9.2; 5120 x 5120 20.2 / 16.4 / 16.5 / 23.3 | 19.2 / 18.8 / 25.5 / 22.7. The ring does not pay for the 7B k / v;
#      v11 (R64xBK128) would for the 14B k / v at 64 rows, and is the faster v11 config for NVFP4 at 32 rows now.
#   o  (not run: "too little device-machine time is left to start another machine"). It was to test wgmma_decode's
#      defaults changed after phase n (a3cdb99); without an engine-level run they were reverted (5019a15).
