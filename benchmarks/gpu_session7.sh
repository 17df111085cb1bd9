#!/usr/bin/env bash
# The 2026-11-26 (session 7) device calls, as run. Run from the repository root on the device machine.
#
#   phase a: bash benchmarks/gpu_session7.sh a   (one GPU; issue 15, ~9 min)
#     Is the FP8 layer capped by cuBLAS's blockwise GEMMs? DeepGEMM (github.com/deepseek-ai/DeepGEMM with its
#     CUTLASS and fmt headers, carried in .dg/, which .git/info/exclude ignores; std::regex replaced by string scans,
#     benchmarks/deepgemm_noregex.patch: it crashed in this extension) built with the machine's nvcc into
#     /tmp/dg (kept while the machine is warm), its kernels compiled by 8 processes in parallel, then
#     1. benchmarks/fp8_gemm_backends.py: each GEMM of a layer (fwd / dgrad / wgrad), BF16 vs cuBLAS vs DeepGEMM
#     2. benchmarks/fp8_layer.py --arms bf16,fp8,fp8-deepgemm: the layer step with each library
#   phase b: bash benchmarks/gpu_session7.sh b   (one GPU; issue 15, ~6 min) the layer step with DeepGEMM for the
#     forward and DGrad GEMMs (cuBLAS WGrad) at 8k / 16k / 4k tokens, and the fused quantizers under Nsight Compute
#     (benchmarks/kernels/profile_fp8_quant.py)
#   phase c: bash benchmarks/gpu_session7.sh c   (one GPU; issue 15, ~7 min) X^T's codes stored as 4-token words
#     (fp8_quant PACK_T): the fused-quantizer / FP8-linear GPU tests, then the layer step of phase b with the profile
#   phase e: bash benchmarks/gpu_session7.sh e   (one GPU; issue 15, ~8 min) WGrad with X^T in 128x128 tiles (opt-in
#     fp8_linear(wgrad="tiles")): the FP8-linear GPU tests, the per-GEMM table (8k) and the layer step of five arms
#   phase f: bash benchmarks/gpu_session7.sh f   (one GPU; ~3 min) the FP8-linear GPU tests with DeepGEMM on odd shapes
#   phase d: one DeepGEMM call with the faulthandler (benchmarks/dg_diag.py): the diagnosis of the crash
#   TOKENS (default 8192) and MODELS pick the shapes.
#
# .dg/DeepGEMM, assembled on the CPU host (the device machine has no network):
#   git clone --recursive https://github.com/deepseek-ai/DeepGEMM .dg/DeepGEMM && git -C .dg/DeepGEMM checkout 54e2261
#   (with its submodules at cutlass f3fde58 and fmt 553ec11; only their include/ folders are needed: 29 MB in all)
#   git -C .dg/DeepGEMM apply ../../benchmarks/deepgemm_noregex.patch
#   echo /.dg/ >> .git/info/exclude          # then carry .dg in the device call
set -u
: "${OUT:?}"
PHASE=${1:?phase}
T0=$SECONDS
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
TOKENS=${TOKENS:-8192}
MODELS=${MODELS:-Qwen2.5-7B,Qwen3-8B}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
echo "phase $PHASE: $(tail -n +2 "$OUT/gpu.txt" | head -1)"

build_deepgemm() {
    if [ "${DG_REBUILD:-0}" = 1 ]; then rm -rf /tmp/dg /root/.deep_gemm; DG_REBUILD=0; fi
    if ls /tmp/dg/deep_gemm/_C*.so > /dev/null 2>&1; then echo "deep_gemm: already built"; return 0; fi
    rm -rf /tmp/dg && cp -r .dg/DeepGEMM /tmp/dg || return 1
    ln -sfn /tmp/dg/third-party/cutlass/include/cutlass /tmp/dg/deep_gemm/include/cutlass
    ln -sfn /tmp/dg/third-party/cutlass/include/cute /tmp/dg/deep_gemm/include/cute
    # the system g++: /opt/gcc's wrapper links a libstdc++ of its own into the extension, whose locale code
    # then crashed in the process (std::regex, std::ostream; the first calls of phase d)
    (cd /tmp/dg && CXX=/usr/bin/g++ CC=/usr/bin/gcc timeout -k 5 "${BUILD_S:-330}" "$PY" setup.py build) \
        > "$OUT/dg_build.log" 2>&1
    local rc=$?
    echo "== deep_gemm build rc=$rc at $((SECONDS - T0)) s"; tail -n 15 "$OUT/dg_build.log"
    local so
    so=$(find /tmp/dg/build -name "*.so" | head -n 1)
    [ -n "$so" ] && ln -sf "$so" /tmp/dg/deep_gemm/
}

# build DeepGEMM (once per machine), put it on the path; then start its kernels' compilation in 8 background
# processes over the GEMMs of the models at the token counts $2 (logs in $1/warm*.log; the caller waits)
setup_deepgemm() {
    build_deepgemm || echo "deep_gemm build failed"
    export PYTHONPATH=$PWD:$PWD/kernels:/tmp/dg
}
warm_deepgemm() {
    for i in 0 1 2 3 4 5 6 7; do
        timeout -k 5 "${WARM_S:-200}" "$PY" benchmarks/fp8_gemm_backends.py --warm $i/8 --models "$MODELS" \
            --tokens "$2" > "$1/warm$i.log" 2>&1 &
    done
}
# `source benchmarks/gpu_session7.sh lib`: the functions above only (later sessions' scripts use them)
if [ "$PHASE" = lib ]; then return 0; fi

case "$PHASE" in
a)
    mkdir -p "$OUT/gemm" "$OUT/layer"
    setup_deepgemm
    "$PY" -c "import deep_gemm, sys; print('deep_gemm', deep_gemm.__file__)" 2>&1 | tail -n 5
    warm_deepgemm "$OUT/gemm" "$TOKENS"
    wait
    echo "== JIT warm-up done at $((SECONDS - T0)) s"; cat "$OUT"/gemm/warm*.log | sort | tail -n 40
    timeout -k 5 "${GEMM_S:-120}" "$PY" benchmarks/fp8_gemm_backends.py --models "$MODELS" --tokens "$TOKENS" \
        --budget-s $(( ${GEMM_S:-120} - 20 )) --out "$OUT/gemm" > "$OUT/gemm/run.log" 2>&1
    echo "== GEMM libraries rc=$? at $((SECONDS - T0)) s"; tail -n 12 "$OUT/gemm/run.log"
    timeout -k 5 "${LAYER_S:-100}" "$PY" benchmarks/fp8_layer.py --arms bf16,fp8,fp8-deepgemm --models "$MODELS" \
        --tokens "$TOKENS" --quick --no-graph --no-profile --budget-s $(( ${LAYER_S:-100} - 15 )) \
        --out "$OUT/layer" > "$OUT/layer/run.log" 2>&1
    echo "== layer rc=$? at $((SECONDS - T0)) s"; tail -n 14 "$OUT/layer/run.log"
    tar czf "$OUT/gemm_logs.tgz" -C "$OUT" gemm/warm0.log gemm/warm1.log gemm/warm2.log gemm/warm3.log \
        gemm/warm4.log gemm/warm5.log gemm/warm6.log gemm/warm7.log gemm/run.log layer/run.log 2>/dev/null
    rm -f "$OUT"/gemm/warm*.log
    ;;
b)  # the layer step with DeepGEMM for forward + DGrad (cuBLAS WGrad) at 4k-16k tokens; the quantizers under ncu
    mkdir -p "$OUT/layer" "$OUT/warm"
    setup_deepgemm
    warm_deepgemm "$OUT/warm" "${TOKENS_B:-8192,16384,4096}"
    wait
    echo "== JIT warm-up done at $((SECONDS - T0)) s"
    timeout -k 5 "${LAYER_S:-200}" "$PY" benchmarks/fp8_layer.py --arms bf16,fp8,fp8-deepgemm --models "$MODELS" \
        --tokens "${TOKENS_B:-8192,16384,4096}" --quick --no-graph --no-profile --budget-s $(( ${LAYER_S:-200} - 20 )) \
        --out "$OUT/layer" > "$OUT/layer/run.log" 2>&1
    echo "== layer rc=$? at $((SECONDS - T0)) s"; grep -A12 "DeepGEMM's GEMMs" "$OUT/layer/run.log"
    timeout -k 5 "${NCU_S:-150}" ncu --kernel-name regex:"_act_kernel|_tile_kernel" --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        "$PY" benchmarks/kernels/profile_fp8_quant.py > "$OUT/ncu_fp8_quant.txt" 2>&1
    echo "== ncu rc=$? at $((SECONDS - T0)) s"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Compute \(SM\) Throughput" "$OUT/ncu_fp8_quant.txt" | head -70
    tar czf "$OUT/warm.tgz" -C "$OUT" warm && rm -rf "${OUT:?}/warm"
    ;;
c)  # X^T stored as 4-token words (fp8_quant PACK_T): GPU tests (every setting bit-identical to eager, DeepGEMM vs
    # cuBLAS), then the layer step (bf16 / fp8 cuBLAS / fp8 DeepGEMM) at 8k / 16k / 4k tokens with the kernel profile
    mkdir -p "$OUT/layer" "$OUT/warm" "$OUT/tests"
    setup_deepgemm
    warm_deepgemm "$OUT/warm" "${TOKENS_B:-8192,16384,4096}"
    QUARL_FP8_TUNE=0 timeout -k 5 "${TEST_S:-150}" "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider \
        tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests/pytest.log" | tail -n 12
    wait
    echo "== JIT warm-up done at $((SECONDS - T0)) s"
    timeout -k 5 "${LAYER_S:-240}" "$PY" benchmarks/fp8_layer.py --arms bf16,fp8,fp8-deepgemm --models "$MODELS" \
        --tokens "${TOKENS_B:-8192,16384,4096}" --quick --no-graph --budget-s $(( ${LAYER_S:-240} - 20 )) \
        --out "$OUT/layer" > "$OUT/layer/run.log" 2>&1
    echo "== layer rc=$? at $((SECONDS - T0)) s"; grep -A12 "DeepGEMM's GEMMs" "$OUT/layer/run.log"
    grep -A30 "fused quantizers" "$OUT/layer/run.log" | head -32
    tar czf "$OUT/warm.tgz" -C "$OUT" warm && rm -rf "${OUT:?}/warm"
    ;;
e)  # WGrad with X^T in 128x128 tiles (fp8_linear wgrad="tiles"): GPU tests, the GEMMs of one layer per library and
    # role (8k tokens), the layer step of every arm at 8k / 16k / 4k tokens with the kernel profile
    mkdir -p "$OUT/layer" "$OUT/warm" "$OUT/tests" "$OUT/gemm"
    setup_deepgemm
    warm_deepgemm "$OUT/warm" "${TOKENS_B:-8192,16384,4096}"
    QUARL_FP8_TUNE=0 timeout -k 5 "${TEST_S:-150}" "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider \
        tests/quant/test_fp8_linear.py > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests/pytest.log" | tail -n 12
    wait
    echo "== JIT warm-up done at $((SECONDS - T0)) s"
    timeout -k 5 "${GEMM_S:-90}" "$PY" benchmarks/fp8_gemm_backends.py --models "$MODELS" --tokens 8192 \
        --budget-s $(( ${GEMM_S:-90} - 15 )) --out "$OUT/gemm" > "$OUT/gemm/run.log" 2>&1
    echo "== GEMM libraries rc=$? at $((SECONDS - T0)) s"; tail -n 5 "$OUT/gemm/run.log"
    timeout -k 5 "${LAYER_S:-300}" "$PY" benchmarks/fp8_layer.py --arms bf16,fp8,fp8-deepgemm,fp8-xtiles,fp8-deepgemm-xtiles \
        --models "$MODELS" --tokens "${TOKENS_B:-8192,16384,4096}" --quick --no-graph --budget-s $(( ${LAYER_S:-300} - 25 )) \
        --out "$OUT/layer" > "$OUT/layer/run.log" 2>&1
    echo "== layer rc=$? at $((SECONDS - T0)) s"; grep -A10 "X^T in 128x128" "$OUT/layer/run.log"
    tar czf "$OUT/warm.tgz" -C "$OUT" warm && rm -rf "${OUT:?}/warm"
    ;;
f)  # the FP8-linear GPU tests with DeepGEMM on SmolLM2-like and odd shapes (its refusals fall back to cuBLAS)
    mkdir -p "$OUT/tests"
    setup_deepgemm
    QUARL_FP8_TUNE=0 timeout -k 5 "${TEST_S:-240}" "$PY" -m pytest -q -rfE -s -m gpu -p no:cacheprovider \
        tests/quant/test_fp8_linear.py > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR|fallbacks" "$OUT/tests/pytest.log" | tail -n 20
    ;;
d)  # diagnosis: one DeepGEMM call on unit scales, with the faulthandler and the JIT's compiler commands
    setup_deepgemm
    DG_JIT_DEBUG=1 DG_JIT_PRINT_COMPILER_COMMAND=1 timeout -k 5 120 "$PY" -X faulthandler benchmarks/dg_diag.py \
        > "$OUT/diag.log" 2>&1
    echo "== diag rc=$?"; tail -c 6000 "$OUT/diag.log"
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
echo "phase $PHASE done at $((SECONDS - T0)) s"
