"""benchmarks/fp8_model_step.py on CPU (seconds): the FP8 arms run the rl stage's own full-parameter Jet-RL recipe
(every projection a trainable ``QuantLinear`` on the FP8 flow, embedding and LM head left BF16), a timed step trains
(the weights move), and the report's per-layer and whole-model arithmetic is the documented one."""

import json
import sys

import pytest
import torch

from quarl.quant import QuantLinear
from tests.benchmarks.bench_module import load_bench
from tests.threads import one_thread_fixture

bench = load_bench("fp8_model_step.py", "fp8_model_step")

_one_thread = one_thread_fixture()


@pytest.mark.parametrize("arm,wgrad", [("jetrl", "1x128"), ("jetrl-xtiles", "tiles")])
def test_fp8_arms_are_the_rl_stage_recipe_and_train(arm, wgrad):
    model = bench.build("tiny", 1, "cpu")
    bench.prepare(model, arm)
    q = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(q) == 7 and all(m.mode == "qat" and m.fp8_flow and m.fp8_wgrad == wgrad for m in q)
    assert not isinstance(model.lm_head, QuantLinear) and model.lm_head.weight.dtype == torch.bfloat16
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = q[0].weight.detach().clone()
    bench.step_fn(model, opt, torch.randint(0, 1000, (2, 16)))()
    assert not torch.equal(before, q[0].weight.detach())


def test_run_and_report(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fp8_model_step.py", "--device", "cpu", "--shape", "tiny", "--layers", "1",
                                      "--tokens", "32", "--seq", "16", "--iters", "1", "--arms", "bf16,jetrl",
                                      "--out", str(tmp_path)])
    bench.main()
    res = json.loads((tmp_path / "fp8_model_step.json").read_text())
    assert [(r["arm"], r["layers"]) for r in res["rows"]] == [("bf16", 0), ("bf16", 1), ("jetrl", 1)]
    assert all("ms" in r for r in res["rows"]), res["rows"]
    res["rows"] = [{"arm": "bf16", "layers": 0, "ms": 10.0}, {"arm": "bf16", "layers": 1, "ms": 30.0},
                   {"arm": "jetrl", "layers": 1, "ms": 25.0}]
    text = bench.render(res)  # per layer 20 / 15 ms; 4-layer (tiny's "real" depth) estimate 90 / 70 ms
    assert "| bf16 | 30.0 | 1.00x | 10.0 | 20.00 | 1.00x | 90.0 | 1.00x |" in text
    assert "| jetrl | 25.0 | 1.20x | 10.0 | 15.00 | 1.33x | 70.0 | 1.29x |" in text


def test_arm_names_are_checked():
    assert bench.parse_arm("jetrl-xtiles+deepgemm") == ("jetrl-xtiles", True, False)
    assert bench.parse_arm("bf16") == ("bf16", False, False)
    assert bench.parse_arm("bf16+glue") == ("bf16", False, True)
    assert bench.parse_arm("jetrl+deepgemm+glue") == ("jetrl", True, True)
    assert bench.parse_arm("jetrl-xtiles+deepgemm+glue+unfused") == ("jetrl-xtiles", True, True)
    assert bench.arm_env("jetrl-xtiles+deepgemm+glue+unfused") == {"QUARL_FP8_GEMM": "deepgemm", "QUARL_FP8_SWIGLU": "0",
                                                                   "QUARL_FP8_STACK": "0"}
    assert bench.arm_env("jetrl-xtiles+glue+nostack") == {"QUARL_FP8_GEMM": "cublas", "QUARL_FP8_STACK": "0"}
    for bad in ("bf16+deepgemm", "jetrl+deepgemm+deepgemm", "fp8", "jetrl+tiles", "jetrl+liger", "bf16+glue+glue",
                "jetrl+unfused", "bf16+glue+unfused", "jetrl+nostack", "bf16+glue+nostack",
                "jetrl+glue+unfused+nostack"):
        with pytest.raises(SystemExit, match="unknown arm"):
            bench.parse_arm(bad)


def test_rl_loss_is_the_rl_stage_logprobs_and_trains():
    """--loss rl: the rl stage's chunked completion log-probs drive the update (the weights move), and its loss is
    the policy-gradient form over the completion only."""
    model = bench.build("tiny", 1, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = model.model.layers[0].mlp.down_proj.weight.detach().clone()
    bench.step_fn(model, opt, torch.randint(0, 1000, (2, 24)), loss="rl")()
    assert not torch.equal(before, model.model.layers[0].mlp.down_proj.weight.detach())


def test_profile_classes_and_the_report():
    assert bench.kernel_class("_act_t_kernel") == "fp8 quantize"
    assert bench.kernel_class("_swiglu_cols_kernel") == "fp8 swiglu quantize"  # not norm/rope/swiglu
    assert bench.kernel_class("_staged_kernel") == "fp8 swiglu quantize"  # fp8_swiglu_staged (session 33)
    assert bench.kernel_class("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert bench.kernel_class("flash_bwd_kernel") == "attention"
    assert bench.kernel_class("fmha_cutlassB_bf16_aligned_64x64_k128_sm80") == "attention"  # not a GEMM
    assert bench.kernel_class("_rms_norm_backward_kernel") == "norm/rope/swiglu"
    assert bench.kernel_class("multi_tensor_apply_kernel") == "optimizer"
    assert bench.kernel_class("elementwise_kernel") == "other"
    assert bench.kernel_class("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "norm/rope/swiglu"
    prof = bench.profile_step(lambda: (torch.ones(64, 64) @ torch.ones(64, 64)).t().contiguous() + 1, "cpu")
    assert prof["total_ms"] >= 0 and abs(sum(prof["classes"].values()) - prof["total_ms"]) < 1e-9 and prof["top"]
    ops = {o[0]: o for o in prof["ops"]}  # the layout ops by input shape: name, shapes, calls, ms
    assert "aten::add" in ops and ops["aten::add"][1] == "[[64, 64], [], []]" and ops["aten::add"][2] == 1, ops
    assert "aten::copy_" in ops and "aten::mm" not in ops
    res = {"shape": "tiny", "layers": 1, "tokens": 32, "seq": 16, "gpu": "cpu", "torch": "x", "loss": "rl",
           "rows": [{"arm": "bf16", "layers": 0, "ms": 10.0,
                     "profile": {"classes": {"gemm": 4.0, "other": 5.0}, "total_ms": 9.0, "top": []}},
                    {"arm": "bf16", "layers": 1, "ms": 30.0},
                    {"arm": "jetrl", "layers": 1, "ms": 20.0,
                     "profile": {"classes": {"gemm": 12.0, "other": 6.0}, "total_ms": 18.0, "top": [],
                                 "ops": [["aten::copy_", "[[8, 4, 16, 2]]", 2.0, 0.25]]}}]}
    text = bench.render(res)
    assert "| jetrl | aten::copy_ | [[8, 4, 16, 2]] | 2 | 0.250 |" in text
    assert "| jetrl | 20.0 | 1.50x | 10.0 | 10.00 | 2.00x | 50.0 | 1.80x |" in text
    assert "| jetrl | 0.0 | 0.0 | 0.0 | 12.0 | 0.0 | 0.0 | 0.0 | 6.0 | 18.0 |" in text  # fp8 swiglu quantize, ...
    assert "| bf16 (stem) | 0.0 | 0.0 | 0.0 | 4.0 | 0.0 | 0.0 | 0.0 | 5.0 | 9.0 |" in text
    assert "| jetrl, per layer | 0.00 | 0.00 | 0.00 | 8.00 | 0.00 | 0.00 | 0.00 | 1.00 | 9.00 |" in text  # (step - stem) / 1


def test_glue_arms_compile_the_glue_and_have_their_own_stem(tmp_path, monkeypatch):
    from transformers.models.qwen2 import modeling_qwen2

    original = modeling_qwen2.apply_rotary_pos_emb
    monkeypatch.setattr(sys, "argv", ["fp8_model_step.py", "--device", "cpu", "--shape", "tiny", "--layers", "1",
                                      "--tokens", "32", "--seq", "16", "--iters", "1", "--arms", "bf16,jetrl+glue",
                                      "--out", str(tmp_path)])
    try:
        bench.main()
        assert modeling_qwen2.apply_rotary_pos_emb is original  # restored after the +glue arm
    finally:
        modeling_qwen2.apply_rotary_pos_emb = original
    res = json.loads((tmp_path / "fp8_model_step.json").read_text())
    assert [(r["arm"], r["layers"]) for r in res["rows"]] == [("bf16", 0), ("bf16+glue", 0), ("bf16", 1),
                                                               ("jetrl+glue", 1)]
    assert all("ms" in r for r in res["rows"]), res["rows"]


def test_accumulate_runs_n_micro_batches_per_optimizer_step(tmp_path, monkeypatch):
    """--accumulate N: N forward + backward passes, then one optimizer step (the gradient is N times one pass's);
    the reported times are per micro-batch and the report says so."""
    model = bench.build("tiny", 1, "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    steps = []
    monkeypatch.setattr(opt, "step", lambda: steps.append(model.lm_head.weight.grad.clone()))
    ids = torch.randint(0, 1000, (2, 16))
    bench.step_fn(model, opt, ids, accumulate=1)()
    bench.step_fn(model, opt, ids, accumulate=3)()
    assert len(steps) == 2 and model.lm_head.weight.grad is None  # zeroed after each optimizer step
    torch.testing.assert_close(steps[1], 3 * steps[0], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="accumulate=0"):
        bench.step_fn(model, opt, ids, accumulate=0)
    monkeypatch.setattr(sys, "argv", ["fp8_model_step.py", "--device", "cpu", "--shape", "tiny", "--layers", "1",
                                      "--tokens", "32", "--seq", "16", "--iters", "1", "--arms", "bf16",
                                      "--accumulate", "2", "--out", str(tmp_path)])
    bench.main()
    res = json.loads((tmp_path / "fp8_model_step.json").read_text())
    assert res["accumulate"] == 2 and all("ms" in r for r in res["rows"])
    assert "2 micro-batches per optimizer step, ms per micro-batch" in (tmp_path / "fp8_model_step.md").read_text()


def test_rounds_give_the_median_and_each_rounds_ratios(tmp_path, monkeypatch):
    """--repeat: every decoder-layer arm timed once a round (stems once); the main table takes each arm's median, a
    second one each round's per-layer ratios to the bf16 and bf16+glue bases."""
    monkeypatch.setattr(sys, "argv", ["fp8_model_step.py", "--device", "cpu", "--shape", "tiny", "--layers", "1",
                                      "--tokens", "32", "--seq", "16", "--iters", "1", "--arms", "bf16,jetrl",
                                      "--repeat", "2", "--out", str(tmp_path)])
    bench.main()
    res = json.loads((tmp_path / "fp8_model_step.json").read_text())
    assert [(r["arm"], r["layers"], r["round"]) for r in res["rows"]] == [
        ("bf16", 0, 0), ("bf16", 1, 0), ("jetrl", 1, 0), ("bf16", 1, 1), ("jetrl", 1, 1)]
    res["rows"] = [{"arm": "bf16", "layers": 0, "ms": 10.0}, {"arm": "bf16+glue", "layers": 0, "ms": 8.0},
                   {"arm": "bf16", "layers": 1, "round": 0, "ms": 30.0},
                   {"arm": "bf16+glue", "layers": 1, "round": 0, "ms": 24.0},
                   {"arm": "jetrl+glue", "layers": 1, "round": 0, "ms": 20.0},
                   {"arm": "bf16", "layers": 1, "round": 1, "ms": 34.0},
                   {"arm": "bf16+glue", "layers": 1, "round": 1, "ms": 26.0},
                   {"arm": "jetrl+glue", "layers": 1, "round": 1, "ms": 18.0},
                   {"arm": "bf16", "layers": 1, "round": 2, "ms": 32.0},
                   {"arm": "bf16+glue", "layers": 1, "round": 2, "error": "OutOfMemoryError"},
                   {"arm": "jetrl+glue", "layers": 1, "round": 2, "ms": 19.0}]
    res["repeat"] = 3
    text = bench.render(res)
    assert "each arm's median of 3 rounds" in text
    assert "| bf16 | 32.0 | 1.00x | 10.0 | 22.00 | 1.00x |" in text  # median of 30 / 34 / 32
    assert "| jetrl+glue | 19.0 |" in text and "| bf16+glue | 24.0 |" in text  # 20 / 18 / 19; the timed 24 / 26
    # per layer: bf16 20 / 24 / 22, bf16+glue 16 / 18 / -, jetrl+glue 12 / 10 / 11
    assert "| jetrl+glue | 12.00 | 10.00 | 11.00 | 1.667, 2.400, 2.000 | 1.333, 1.800 |" in text
    assert "| bf16+glue | 16.00 | 18.00 | - | 1.250, 1.333 | 1.000, 1.000 |" in text


def test_energy_table_is_joules_per_layer_against_the_bases():
    """With NVML's joules on the rows (CUDA): J per micro-batch per layer = (arm - its stem) / layers, the ratios to
    bf16 and bf16+glue, mean W and SM clock; no table when no row has joules (CPU: the meter reads None)."""
    res = {"shape": "tiny", "layers": 2, "tokens": 32, "seq": 16, "loss": "rl", "gpu": "g", "torch": "t",
           "rows": [{"arm": "bf16", "layers": 0, "ms": 10.0, "joules": 5.0, "watts": 500.0, "sm_mhz": 1900.0},
                    {"arm": "bf16+glue", "layers": 0, "ms": 9.0, "joules": 4.0, "watts": 450.0, "sm_mhz": None},
                    {"arm": "bf16", "layers": 2, "ms": 50.0, "joules": 35.0, "watts": 700.0, "sm_mhz": 1400.0},
                    {"arm": "bf16+glue", "layers": 2, "ms": 40.0, "joules": 28.0, "watts": 700.0, "sm_mhz": 1450.0},
                    {"arm": "jetrl+glue", "layers": 2, "ms": 30.0, "joules": 20.0, "watts": 690.0, "sm_mhz": 1500.0}]}
    text = bench.render(res)
    # per layer J: bf16 (35 - 5) / 2 = 15, bf16+glue (28 - 4) / 2 = 12, jetrl+glue (20 - 4) / 2 = 8
    assert "| jetrl+glue | 8.000 | 1.875x | 1.500x | 690 | 1500 |" in text
    assert "| bf16 | 15.000 | 1.000x | 0.800x | 700 | 1400 |" in text
    for r in res["rows"]:
        r.pop("joules")
    assert "Energy (NVML" not in bench.render(res)
    from gpu_energy import EnergyMeter

    m = EnergyMeter()  # no NVML on a CPU machine (or no CUDA device): every reading None, start / stop harmless
    m.start()
    m.stop()
    assert m.lib is not None or m.joules is None and m.sm_mhz is None


def test_an_arms_model_is_gone_before_the_next_arm_is_measured(monkeypatch):
    """A +glue FP8 arm's model lives in reference cycles (forwards bound to their modules, the q / k / v stack group):
    time_arm collects it before the next arm, whose peak memory would otherwise include it (session 28: ~3 GiB at 7B
    width, the later of two arms always the higher)."""
    import gc
    import weakref

    refs = []
    build = bench.build

    def built(*a, **kw):  # the model, held in a cycle of its own as well (glue bindings alone depend on the run)
        m = build(*a, **kw)
        m._cycle = [m]
        refs.append(weakref.ref(m))
        return m

    monkeypatch.setattr(bench, "build", built)
    collect = gc.collect
    gc.disable()  # no automatic collection; and none during the first arm (dynamo collects when it compiles)
    try:
        with monkeypatch.context() as m:
            m.setattr(gc, "collect", lambda *a: 0)
            bench.time_arm("tiny", 1, "jetrl-xtiles+glue", 32, 32, 1, "cpu", "rl")
        assert refs[0]() is not None  # in a cycle: refcounting alone left it
        assert gc.collect is collect
        bench.time_arm("tiny", 1, "bf16", 32, 32, 1, "cpu", "rl")  # no compile here: time_arm itself collects it
        assert refs[0]() is None
    finally:
        gc.enable()
