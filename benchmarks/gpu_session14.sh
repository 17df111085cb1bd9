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
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------
# Record of the calls (2026-11-26; results/gpu_2026-11-26/s14/<x>):
