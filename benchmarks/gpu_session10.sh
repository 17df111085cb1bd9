#!/usr/bin/env bash
# Session 10 (2026-11-26, second device session of the day): issue 15's whole actor update with the rl stage's own
# loss and Liger's fused kernels (policy.use_liger_kernel), and where its time goes. Run from the repository root on
# the device machine; the record of what ran is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session10.sh a   carry: .dev/dg.tar.xz .dev/whl   (one GPU; ~5 min)
#     1. GPU tests: Liger inside quarl's models (tests/train/test_fused_kernels_gpu.py: loss and every gradient vs
#        transformers' eager code, BF16 and full-parameter Jet-RL) and session 9's failed LoRA A partials test
#        (its LoRA targets fixed);
#     2. benchmarks/fp8_model_step.py, Qwen2.5-7B width, 4 decoder layers + stem, 8k and 16k tokens, --loss rl (the
#        rl stage's chunked log-probs), BF16 vs Jet-RL (best recipe arms), each with and without Liger, and one
#        profiled step per arm (GPU time by kernel class) at 8k.
#   phase b: bash benchmarks/gpu_session10.sh b   carry: .dev/dg.tar.xz .dev/whl   (one GPU; ~4 min)
#     The same at Qwen3-8B width (4 layers), 8k and 16k tokens, no profile.
#
# .dev/dg.tar.xz: see benchmarks/gpu_session8.sh; .dev/whl: liger_kernel-0.8.5-py3-none-any.whl (PyPI), installed
# with --no-deps into /tmp/site (torch and triton are the machine's).
set -u
: "${OUT:?}"
PHASE=${1:?phase}
T0=$SECONDS
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .dev/whl/liger_kernel-*.whl || exit 4
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
echo "phase $PHASE: $(tail -n +2 "$OUT/gpu.txt" | head -1)"
[ -d .dg/DeepGEMM ] || tar xJf .dev/dg.tar.xz
# the library script sets PHASE, T0 and PYTHONPATH (setup_deepgemm) for itself: keep this script's
KEEP_PHASE=$PHASE KEEP_T0=$T0
source benchmarks/gpu_session7.sh lib > /dev/null
setup_deepgemm > /dev/null 2>&1
PHASE=$KEEP_PHASE T0=$KEEP_T0
export PYTHONPATH=$PYTHONPATH:/tmp/site
echo "== DeepGEMM ready at $((SECONDS - T0)) s: $(ls /tmp/dg/deep_gemm/_C*.so 2>&1 | head -1)"

model_step() {  # shape tokens extra-args...
    local shape=$1 t=$2; shift 2
    timeout -k 5 "${MODEL_S:-200}" "$PY" benchmarks/fp8_model_step.py --shape "$shape" --layers 4 --tokens "$t" \
        --loss rl --arms bf16,bf16+liger,jetrl+deepgemm,jetrl+deepgemm+liger,jetrl-xtiles+deepgemm,jetrl-xtiles+deepgemm+liger \
        --budget-s $(( ${MODEL_S:-200} - 30 )) --out "$OUT/model/$shape-$t" "$@" > "$OUT/model/$shape-$t.log" 2>&1
    echo "== model step $shape $t rc=$? at $((SECONDS - T0)) s"; sed -n '/^# actor update/,$p' "$OUT/model/$shape-$t.log"
}

mkdir -p "$OUT/model"
case "$PHASE" in
a)
    mkdir -p "$OUT/tests"
    QUARL_ENGINE_LORA_A=1 timeout -k 5 "${TEST_S:-120}" "$PY" -m pytest -q -rfEs -m gpu -p no:cacheprovider \
        tests/train/test_fused_kernels_gpu.py \
        "tests/kernels/test_epilogue_gpu.py::test_packed_group_takes_the_partials_route_in_a_cuda_graph" \
        > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR|SKIP" "$OUT/tests/pytest.log" | tail -n 12
    model_step Qwen2.5-7B 8192 --profile
    model_step Qwen2.5-7B 16384
    ;;
b)
    model_step Qwen3-8B 8192
    model_step Qwen3-8B 16384
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
echo "phase $PHASE done at $((SECONDS - T0)) s"
