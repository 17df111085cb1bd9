#!/usr/bin/env bash
# Session 22: issue 17's M >= 2048 target (>= 0.95x cuBLAS BF16) -- the warp-specialized mixed-input GEMM of session
# 17 (benchmarks/kernels/ws_mixed_gemm.py, 0.78-0.84x at 2048 rows, bound by its MMA side: non-persistent tiles whose
# refill and epilogue leave the tensor cores idle) made persistent: one CTA an SM walking tiles, the loader and the
# decoder filling the rings for the next tile while the MMA warpgroups store the last one's accumulator.
# Run from the repository root on the device machine; the record of what ran is at the end of this file.
# The phases use benchmarks/gpu_phase_lib.sh's helpers.
#
#   phase a: bash benchmarks/gpu_session22.sh a   (one GPU; ~4 min)
#     ws_mixed_gemm.py: session 17's best non-persistent variant (bm256-s4) beside the persistent ones (4 and 3 x
#     stages), cuBLAS BF16 and the dense path, 7B and 14B MLP / attention weights at 2048 / 4096 / 8192 rows; every
#     variant checked against the float product first.
#   phase b: bash benchmarks/gpu_session22.sh b   (one GPU; ~2 min)
#     where the persistent kernel's time goes: its decoder partition doing only the ring handshakes (-hs) or storing
#     a constant tile (-st) -- wrong results by design -- beside the real one.
#   phase c: bash benchmarks/gpu_session22.sh c   (one GPU; ~10 min)
#     issue 17's rollout table again (last run in session 16; since then the blocked words, compaction and one prefill
#     per prompt): BF16+LoRA vs NVFP4+LoRA, 7B and 14B, batch 1 / 8 / 64, 256-token prompts, 2048 new tokens.
#   phase d: bash benchmarks/gpu_session22.sh d   (one GPU; ~6 min)
#     phase b put the persistent kernel's bound on the decoded tile's shared-memory traffic. A 12-warp version (the
#     decoder warpgroup issues the TMA copies; no loader warp, so ptxas has 168 registers a thread) with and without
#     swapped operands (y^T = W x^T: m64n256 instructions, the decoded tile read once a k16 step a warpgroup), beside
#     p-bm256; then the blocked layout's and the engine's GPU tests (session 21's last commit, the dispatch.has_kernel
#     guard, was CPU-tested only). The 12-warp kernel (--p12) lost and was removed after this call: run phase d at
#     commit 799142a.
#   phase e: bash benchmarks/gpu_session22.sh e   (one GPU; ~9 min)
#     the 7B GRPO step (NVFP4+LoRA vs BF16+LoRA, 8 prompts x 8 answers; issue 17's "no slower than BF16+LoRA"),
#     last measured in session 16 (0.955x), twice.
#   phase f: bash benchmarks/gpu_session22.sh f   (one GPU; ~3 min)
#     m64n256 with a dedicated loader: the 16-warp persistent kernel with a two-warp decoder (-w2: 11 warps, launched
#     as 12, 168 registers a thread), with and without swapped operands, and -hs (the handshakes only) for its ceiling.
#   phase g: bash benchmarks/gpu_session22.sh g   (one GPU; ~3 min)
#     the decoded weight as wgmma's register A operand (no shared-memory round trip): a loader warp and two consumer
#     warpgroups as separate partitions, each decoding its 64 weight rows into the A registers (the ring's a_fragment)
#     against a shared 256-token x tile (m64n256), persistent; x permuted once per call. 3 / 4 / 5 stages. (--ra
#     left ws_mixed_gemm.py for quarl_kernels.mixed_gemm after this call: run phase g at commit 13edc9b.)
#   phase h: bash benchmarks/gpu_session22.sh h   (one GPU; ~9 min)
#     phase g's register-A kernel as a library kernel (kernels/quarl_kernels/mixed_gemm.py: NVFP4 / MXFP4, row-major
#     or blocked words, the decode serialized or overlapped with the MMA), routed by dense.dense_matmul from 2048 rows:
#     its GPU tests and the dense / blocked tests it now runs under; then bench_mixed_gemm.py (cuBLAS, the dense path,
#     the kernel with and without the x permutation, alternated three times) at 2048-16384 rows.
#   phase i: bash benchmarks/gpu_session22.sh i   (one GPU; ~8 min)
#     phase h: the library kernel slower than phase g's experiment (its consumer loop flattened over tiles, the
#     epilogue inside it) and far behind the dense path at 8192-16384 rows (token tiles fastest over the whole M: x
#     re-read from HBM for every weight tile). Now nested tile / step loops and groups of token tiles that keep their
#     x in L2; its GPU tests; bench_mixed_gemm.py again, then MXFP4 and blocked words.
#   phase j: bash benchmarks/gpu_session22.sh j   (one GPU; ~8 min)
#     the kernel routed (dense.dense_matmul: 2048..8192 rows on weights of >= 8192 rows -- the 7B gate / up -- with the
#     overlapped decode): its GPU tests; the 7B GRPO step with it, without
#     (QUARL_KERNELS_MIXED_GEMM=0) and with it again (its update's micro-batches are 6144 rows).
#   phase k: bash benchmarks/gpu_session22.sh k   (one GPU; ~5 min)
#     after phase j the kernel became opt-in (QUARL_KERNELS_MIXED_GEMM=1) and the two GPU test files share their weight
#     helper (tests/kernels/gpu_weights.py): the mixed, blocked and dense GPU tests again.
#   phase l: bash benchmarks/gpu_session22.sh l   (one GPU; ~7 min)
#     the A fragment in x's own k order (mixed_matmul(natural=True): each quad lane gathers byte t of its rows' eight
#     words by a 4 x 4 byte transpose across the quad, two shfl.bfly a word; a scale pair per decoded register), so x
#     needs no permutation: its GPU tests (against the float64 product, the dense path, blocked words), then
#     bench_mixed_gemm.py overlap vs natural at 2048-16384 rows.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}
source benchmarks/gpu_phase_lib.sh

ws() {  # SECONDS ARGS...: ws_mixed_gemm.py -> $OUT/ws/run.log
    local s=$1; shift
    mkdir -p "$OUT/ws"
    timeout -k 5 "$s" "$PY" benchmarks/kernels/ws_mixed_gemm.py "$@" > "$OUT/ws/run.log" 2>&1
    echo "== ws_mixed_gemm rc=$? at $((SECONDS - T0)) s"; cat "$OUT/ws/run.log" | grep -v "^ *File\|^    " | tail -n 5
    grep -E "cuBLAS|x cuBLAS" "$OUT/ws/run.log"
}

case $PHASE in
a)
    ws 90 --variants "" --persistent p-bm256 --ms 2048 --shapes 3584x3584  # a hang costs 90 s, not the call
    [ -n "$(grep 'p-bm256 ' "$OUT/ws/run.log")" ] && mv "$OUT/ws" "$OUT/ws_smoke" && \
    ws "${WS_S:-300}" --variants bm256-s4 --persistent p-bm256,p-bm256-s3 --ms 2048,4096,8192 \
        --shapes 18944x3584,3584x18944,3584x3584,13824x5120,5120x13824
    ;;
b)
    ws "${WS_S:-200}" --variants "" --persistent p-bm256,p-bm256-hs,p-bm256-st --ms 2048,4096 \
        --shapes 18944x3584,3584x18944,13824x5120
    ;;
c)
    rollout_table "${TABLE_S:-560}" 7b,14b 1,8,64 table
    ;;
d)
    ws 90 --variants "" --persistent "" --p12 p12-swap --ms 2048 --shapes 3584x3584  # a hang costs 90 s
    [ -n "$(grep 'p12-swap ' "$OUT/ws/run.log")" ] && mv "$OUT/ws" "$OUT/ws_smoke" && \
    ws "${WS_S:-200}" --variants "" --persistent p-bm256 --p12 p12,p12-swap,p12-swap-r136,p12-swap-s3 --ms 2048,4096 \
        --shapes 18944x3584,3584x18944,3584x3584,13824x5120
    tests "${TEST_S:-240}" tests/kernels/test_blocked_gpu.py tests/engine/test_engine_gpu.py
    ;;
e)
    grpo "${GRPO_S:-280}" grpo
    grpo "${GRPO_S:-280}" grpo2
    ;;
f)
    ws 90 --variants "" --persistent p-w2-swap --ms 2048 --shapes 3584x3584  # a hang costs 90 s
    [ -n "$(grep 'p-w2-swap ' "$OUT/ws/run.log")" ] && mv "$OUT/ws" "$OUT/ws_smoke" && \
    ws "${WS_S:-240}" --variants "" --persistent p-bm256,p-w2,p-w2-swap,p-w2-swap-r120,p-w2-swap-hs --ms 2048,4096 \
        --shapes 18944x3584,3584x18944,3584x3584,13824x5120,5120x13824
    ;;
g)
    ws 90 --variants "" --persistent "" --ra ra --ms 2048 --shapes 3584x3584  # a hang costs 90 s
    [ -n "$(grep 'ra ' "$OUT/ws/run.log")" ] && mv "$OUT/ws" "$OUT/ws_smoke" && \
    ws "${WS_S:-240}" --variants "" --persistent p-bm256 --ra ra,ra-s3,ra-s5,ra-r200 --ms 2048,4096 \
        --shapes 18944x3584,3584x18944,3584x3584,13824x5120,5120x13824
    ;;
h)
    tests "${TEST_S:-200}" tests/kernels/test_mixed_gemm_gpu.py tests/kernels/test_dense_gpu.py \
        tests/kernels/test_dense_fp8_gpu.py tests/kernels/test_blocked_gpu.py -k "not engine and not trainer"
    bench "${BENCH_S:-330}" mixed benchmarks/kernels/bench_mixed_gemm.py --budget-s 300 --repeats 3
    ;;
i)
    tests "${TEST_S:-120}" tests/kernels/test_mixed_gemm_gpu.py
    bench "${BENCH_S:-250}" mixed benchmarks/kernels/bench_mixed_gemm.py --budget-s 220 --repeats 3
    bench 60 mixed_mx benchmarks/kernels/bench_mixed_gemm.py --formats mxfp4 --shapes 18944x3584,3584x18944 \
        --ms 2048,8192 --repeats 2 --budget-s 45
    bench 60 mixed_blk benchmarks/kernels/bench_mixed_gemm.py --blocked --shapes 18944x3584,3584x18944 \
        --ms 2048,8192 --repeats 2 --budget-s 45
    ;;
j)
    tests "${TEST_S:-100}" tests/kernels/test_mixed_gemm_gpu.py
    grpo "${GRPO_S:-120}" grpo_mixed
    QUARL_KERNELS_MIXED_GEMM=0 grpo "${GRPO_S:-120}" grpo_dense
    grpo "${GRPO_S:-120}" grpo_mixed2
    ;;
k)
    tests "${TEST_S:-300}" tests/kernels/test_mixed_gemm_gpu.py tests/kernels/test_blocked_gpu.py \
        tests/kernels/test_dense_gpu.py tests/kernels/test_dense_fp8_gpu.py
    ;;
l)
    tests "${TEST_S:-170}" tests/kernels/test_mixed_gemm_gpu.py
    bench "${BENCH_S:-260}" mixed benchmarks/kernels/bench_mixed_gemm.py --variants overlap,natural --budget-s 230 \
        --repeats 3
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
phase_end

# ---------------------------------------------------------------------------------------------------------------------
# Record (filled in after each call: commit, device seconds, what it showed).
# phase a (commit a65b93d; 23 s of work, machine cold; H100 80GB HBM3): the persistent kernel correct (2.2-2.4e-3) and
#   no faster: p-bm256 0.61-0.85x cuBLAS, p-bm256-s3 0.61-0.75x, session 17's bm256-s4 0.64-0.85x, the dense path
#   0.74-0.97x (single timings) at 2048 / 4096 / 8192 rows on 7B / 14B weights. Device budget left 1745 s.
# phase b (commit ee3912c; 17 s, cold): the handshakes-only decoder (-hs) 0.93-1.07x cuBLAS, a constant tile stored
#   (-st) 0.77-0.88x, the real kernel 0.70-0.87x: the decoded tile's shared-memory store is the bound. Left 1680 s.
# phase c (commit 4a24d25; 397 s, cold): the rollout table, step ms BF16+LoRA / NVFP4+LoRA: 7B 8.40/3.16 (2.66x),
#   8.67/4.00 (2.17x), 10.98/8.26 (1.33x); 14B 15.11/5.70 (2.65x), 16.10/7.31 (2.20x), 22.22/17.30 (1.28x).
#   Left 1373 s.
# phase d (commit 799142a; 261 s, warm): the 12-warp kernel p12 0.47-0.58x, p12-swap (m64n256) 0.57-0.66x, -r136
#   0.58-0.67x, -s3 0.55-0.64x, p-bm256 0.71-0.81x; tests/kernels/test_blocked_gpu.py + tests/engine/
#   test_engine_gpu.py 55 passed. Left 1183 s.
# phase e (commit b7ad6af; 180 s, warm): the 7B GRPO step twice, steady step s BF16+LoRA / NVFP4+LoRA 17.38 / 16.61
#   (0.956x) and 17.67 / 16.70 (0.945x). Machine given back after it; device budget left 1037 s.
# phase f (commit b4871e3; 29 s, cold): a two-warp decoder (p-w2) 0.63-0.78x, with swapped operands (m64n256) 0.64-0.82x,
#   at 120 decoder registers 0.65-0.81x, its handshakes-only skeleton 0.85-1.14x; p-bm256 0.70-0.86x. Left 997 s.
# Reading after phase f: not the operand reads (the swap gains 1-5 %) but the decoder warps' per-step work (the
#   tile's conversion and its 16 KB store; fewer decoder warps lose) binds this shared-memory design at ~0.8x cuBLAS.
# phase g (commit 13edc9b; 29 s, cold): the register-A kernel (ws_mixed_gemm.py --ra) correct, 0.80-0.97x cuBLAS with
#   x permuted in the call (7B gate/up 2048 rows 352.1 us vs cuBLAS 342.0, dense 442.9); dense 0.77-0.93x. Left 946 s.
# phase h (commit 3b1f7e6; 176 s, cold): quarl_kernels.mixed_gemm's first version -- GPU tests 90 passed (mixed,
#   dense, dense FP8, blocked); bench_mixed_gemm.py alternated: 0.72-0.94x at 2048-4096, 0.65-0.90x at 8192-16384
#   (a flattened step loop; token tiles over the whole M re-read x per weight tile); dense 0.82-1.0x. Left 827 s.
# phase i (commit 9285800; 118 s, cold): nested loops + grouped tiles: overlap on permuted x 0.93-1.09x (>= 0.95x at
#   16 of 20 points), with the permutation 0.80-1.00x; MXFP4 and blocked similar; GPU tests 19 passed. Left 737 s.
# phase j (commit b99fdbc; 373 s, cold): routed (2048..8192 rows, N >= 8192): GPU tests 19 passed; the 7B GRPO step,
#   steady step s NVFP4+LoRA update / step: with 11.30 / 17.28 and 11.34 / 17.35, without 11.12 / 17.04 (BF16+LoRA
#   17.70 / 17.87 / 17.82): no gain -> made opt-in. Left 517 s.
# phase k (commit 88cc790; 188 s, cold): opt-in kernel and the shared test weight helper: mixed, blocked, dense and
#   dense FP8 GPU tests, 91 passed. Machine given back; device budget left 389 s.
# phase l (commit aaeebea; 157 s, cold): the natural-order decode: GPU tests 35 passed; bench: natural 0.75-0.91x,
#   overlap (x permuted in the call) 0.78-1.01x, overlap on x permuted before 0.90-1.06x, dense 0.83-1.0x. Machine
#   given back; device budget left 193 s of 1800.
#   (Held time counted at 67 % up to phase f, at 50 % from phase g on.)
