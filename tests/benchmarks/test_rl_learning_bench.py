"""benchmarks/rl_learning.py's policy names on CPU: ``-fp8dense`` is a training-only environment switch on top of
the named policy (same overrides, same base for eval), composable with ``-dapo`` and ``@<lr>``; a typo stops."""

import pytest

from tests.benchmarks.bench_module import load_bench

bench = load_bench("rl_learning.py", "rl_learning")


def test_fp8dense_is_the_same_policy_with_a_training_switch():
    assert bench.policy_spec("nvfp4-lora-fp8dense") == bench.policy_spec("nvfp4-lora")
    ov, quant = bench.policy_spec("nvfp4-lora-dapo-fp8dense@5e-4")
    assert quant == "nvfp4" and "algo.algo=dapo" in ov and "optim.lr=0.0005" in ov
    assert bench.train_env("nvfp4-lora-fp8dense@5e-4") == {"QUARL_KERNELS_DENSE_FP8": "1"}
    assert bench.train_env("nvfp4-lora") == {} and bench.train_env("nvfp4-lora@5e-4") == {}
    assert bench.train_env("nvfp4-lora-plainrows") == {"QUARL_ENGINE_COMPACT": "0", "QUARL_ENGINE_SHARE_PREFILL": "0"}
    assert bench.policy_spec("nvfp4-lora-plainrows") == bench.policy_spec("nvfp4-lora")


def test_unknown_policy_stops():
    with pytest.raises(SystemExit, match="unknown policy"):
        bench.policy_spec("nvfp4-lroa-fp8dense")


def test_eager_suffix_turns_the_compiled_glue_off():
    base, quant = bench.policy_spec("nvfp4-lora@2e-4")
    assert bench.policy_spec("nvfp4-lora-eager@2e-4") == ([*base, "policy.compile_glue=false"], quant)
    assert bench.policy_spec("nvfp4-lora-8bit-eager")[0][-2:] == ["optim.optimizer=adamw8bit",
                                                                  "policy.compile_glue=false"]


def test_8bit_suffix_trains_the_same_policy_with_8bit_adamw():
    ov, quant = bench.policy_spec("nvfp4-lora-8bit@2e-4")
    base, _ = bench.policy_spec("nvfp4-lora@2e-4")
    assert quant == "nvfp4" and ov == [*base, "optim.optimizer=adamw8bit"]
    assert bench.train_env("nvfp4-lora-8bit") == {}

    class Args:  # the run's own optimizer pin comes first, the policy's -8bit last (it wins)
        steps = prompts_per_step = group_size = max_new_tokens = micro_batch = updates = lora_r = seed = 1
        lr = warmup = train_seconds = 0.0
        schedule, device, rl_set = "constant", "cuda", []

    ov = bench.rl_overrides(Args, "nvfp4-lora-8bit")
    assert ov.index("optim.optimizer=adamw") < ov.index("optim.optimizer=adamw8bit")
