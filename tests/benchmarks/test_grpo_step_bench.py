"""benchmarks/grpo_step_gpu.py on CPU: the streamed (layer-by-layer, quantized-as-built)
construction equals the dense build quantized afterwards, the trainer takes it without
quantizing again, the memory arithmetic matches real models, and the script's presets and
OOM handling work end to end on a tiny shape (seconds)."""

import importlib.util
import json
from pathlib import Path

import torch

from quarl.quant import QuantLinear, quantize_model
from tests.threads import one_thread_fixture

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("grpo_step_gpu", ROOT / "benchmarks" / "grpo_step_gpu.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


_one_thread = one_thread_fixture()


def _raw(t: torch.Tensor) -> torch.Tensor:
    """Bytes of a tensor, so FP8 tensors compare exactly too."""
    return t.detach().contiguous().view(torch.uint8) if t.element_size() == 1 else t.detach()


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(_raw(sa[k]), _raw(sb[k])), k


def test_streamed_construction_equals_dense_then_quantize():
    cfg = bench.qwen25_config("tiny")
    dense = bench.build_model(cfg, "cpu", torch.float32, seed=0)
    quantize_model(dense, {"default": "nvfp4"})
    streamed = bench.build_model(cfg, "cpu", torch.float32, seed=0, quant_format="nvfp4")
    assert_same_state(streamed, dense)
    assert streamed.quarl_recipe == dense.quarl_recipe
    q = streamed.model.layers[1].mlp.down_proj
    assert isinstance(q, QuantLinear) and q.weight_scale.dtype == torch.float8_e4m3fn
    assert type(streamed.lm_head) is torch.nn.Linear and streamed.lm_head.weight.dtype == torch.float32
    emb = streamed.model.embed_tokens.weight
    assert abs(float(emb.std()) - 0.02) < 2e-3  # really random, not a trivially equal fill
    assert torch.equal(streamed.model.norm.weight, torch.ones_like(streamed.model.norm.weight))
    other = bench.build_model(cfg, "cpu", torch.float32, seed=1, quant_format="nvfp4")
    assert not torch.equal(other.model.embed_tokens.weight, emb)  # the seed reaches every parameter


def test_init_depends_on_the_name_not_the_order():
    a, b = torch.empty(4, 8), torch.empty(4, 8)
    la, lb = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    la.weight, lb.weight = torch.nn.Parameter(a), torch.nn.Parameter(b)
    bench.init_params(la, "x.q_proj", 0)
    torch.randn(100)  # global RNG use in between changes nothing
    bench.init_params(lb, "x.q_proj", 0)
    assert torch.equal(la.weight, lb.weight) and torch.equal(la.bias, lb.bias)
    bench.init_params(lb, "x.k_proj", 0)
    assert not torch.equal(la.weight, lb.weight)


def _trainer(model, tmp_path: Path, *extra: str):
    from quarl.config import load_config
    from quarl.rl import RLConfig, RLTrainer

    cfg = load_config(RLConfig, None, [
        "policy.format=nvfp4", "policy.lora_r=4", "policy.lora_alpha=4", "policy.dtype=float32",
        "rollout.group_size=2", "rollout.max_new_tokens=4", "rollout.max_prompt_tokens=4", "train.steps=1",
        "train.prompts_per_step=1", "train.device=cpu", "train.resume=false", "optim.optimizer=adamw", *extra])  # fmt: skip
    tok = bench.IdTokenizer(model.config.vocab_size, 4)
    return RLTrainer(cfg, model, tok, ["p0"], ["0"], tmp_path, reward_fn=bench.BernoulliReward(0))


def test_trainer_takes_the_streamed_model_as_built(tmp_path, monkeypatch):
    """Same policy either way (base and LoRA init); the streamed one is not quantized again."""
    cfg = bench.qwen25_config("tiny")
    dense = _trainer(bench.build_model(cfg, "cpu", torch.float32), tmp_path / "dense").model
    import quarl.train.policy as policy_mod  # where build_policy (and its quantize_model) lives

    def no_requantize(*a, **k):
        raise AssertionError("the trainer quantized a model that was already quantized")

    monkeypatch.setattr(policy_mod, "quantize_model", no_requantize)
    streamed_model = bench.build_model(cfg, "cpu", torch.float32, quant_format="nvfp4")
    packed = streamed_model.model.layers[0].self_attn.q_proj.weight_packed
    tr = _trainer(streamed_model, tmp_path / "streamed")
    assert tr.model.model.layers[0].self_attn.q_proj.weight_packed is packed  # kept, not copied
    assert_same_state(tr.model, dense)
    assert tr.policy_report["trainable_params"] == sum(p.numel() for p in tr.params) > 0


def test_estimate_matches_the_models_it_describes(tmp_path):
    cfg = bench.qwen25_config("tiny")
    kw = {"rows": 2, "prompt_len": 4, "new_tokens": 4, "micro_batch": 2, "lora_r": 4}
    model = bench.build_model(cfg, "cpu", torch.bfloat16, quant_format="nvfp4")
    persistent = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert bench.estimate_bytes(cfg, "nvfp4", **kw)["weights"] == persistent
    dense = bench.build_model(cfg, "cpu", torch.bfloat16)
    assert bench.estimate_bytes(cfg, "bf16", **kw)["weights"] == sum(p.numel() * 2 for p in dense.parameters())
    tr = _trainer(bench.build_model(cfg, "cpu", torch.float32, quant_format="nvfp4"), tmp_path)
    assert bench.estimate_bytes(cfg, "nvfp4", **kw)["lora_params"] == 4 * sum(p.numel() for p in tr.params)


def test_32b_shape_by_arithmetic():
    """Qwen2.5-32B's parameter count (32.76 B) from the meta model; the figures the docstring quotes."""
    from transformers import AutoModelForCausalLM

    cfg = bench.qwen25_config("32b")
    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).parameters())
    assert 32.7e9 < n < 32.8e9
    kw = {"rows": 8, "prompt_len": 256, "new_tokens": 2048, "micro_batch": 8, "lora_r": 32}
    bf16, fp4 = bench.estimate_memory(cfg, "bf16", **kw), bench.estimate_memory(cfg, "nvfp4", **kw)
    assert bf16["weights"] == round(2 * n / 2**30, 2) and bf16["weights"] > 60
    assert 19 < fp4["weights"] < 20 and fp4["update"] < 79


def test_preset_sets_the_issue_config_and_flags_override():
    a = bench.parse_args(["--preset", "memory32b"])
    assert (a.shape, a.formats, a.prompts, a.group, a.new_tokens, a.mu, a.steps) == ("32b", "nvfp4", 1, 8, 2048, 1, 1)
    b = bench.parse_args(["--preset", "memory32b", "--micro-batch", "4", "--new-tokens", "1024"])
    assert (b.shape, b.micro_batch, b.new_tokens) == ("32b", 4, 1024)
    assert bench.parse_args([]).shape == "7b"


def test_preset_runs_on_cpu_and_an_oom_is_a_result_row(tmp_path, monkeypatch):
    """mu=1: no separate log-prob pass. An OOM in one format is recorded (phase, message) and
    the next format still runs."""
    from quarl.rl import RLTrainer

    real, calls = RLTrainer._updates, []

    def updates(self, *a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return real(self, *a, **k)

    monkeypatch.setattr(RLTrainer, "_updates", updates)
    res = bench.main(
        [
            "--preset",
            "memory32b",
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--formats",
            "bf16,nvfp4",
            "--new-tokens",
            "8",
            "--prompt-len",
            "8",
            "--out",
            str(tmp_path),
        ]
    )
    oom, ok = res
    assert oom["oom"] and oom["failed_phase"] == "update" and "Tried to allocate" in oom["error"]
    assert [m["phase"] for m in oom["memory"]] == ["build", "policy", "rollout", "update"]
    assert "error" not in ok and ok["construction"] == "stream" and ok["optimizer"] == "adamw"
    assert [m["phase"] for m in ok["memory"]] == ["build", "policy", "rollout", "update"]  # mu=1: no log-prob pass
    assert len(ok["steps"]) == 1 and ok["steps"][0]["response_len_mean"] == 8
    saved = json.loads((tmp_path / "grpo_step_gpu.json").read_text())
    assert [r["format"] for r in saved["results"]] == ["bf16", "nvfp4"]
    md = (tmp_path / "grpo_step_gpu.md").read_text()
    assert "OOM in update" in md and "| nvfp4 | stream |" in md
