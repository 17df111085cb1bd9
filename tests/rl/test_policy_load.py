"""policy.load: a quantized base streamed from its checkpoint (layer by layer, packed as read)
gives the policy the dense load gives -- same packed base, same LoRA init and placement -- and
``quarl rl`` runs end to end on it; auto picks stream for a quantized base on CUDA only."""

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from quarl.config import load_config
from quarl.models import load_model
from quarl.rl import RLConfig, run_rl
from quarl.rl.config import PolicyConfig
from quarl.train.policy import base_recipe, build_policy, load_policy_model, resolve_load
from tests.datasets import synthetic_dataset
from tests.quant.test_stream import MIXED, assert_same_state, save_tiny
from tests.rl.conftest import TINY_OVERRIDES

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize(("policy", "device", "how"), [
    ({}, CUDA, "stream"),                                     # the default policy (nvfp4 + LoRA) on a GPU
    ({}, CPU, "dense"),                                       # the host holds the dense model anyway
    ({"format": "bf16"}, CUDA, "dense"),                      # nothing to pack
    ({"mode": "full", "format": "bf16"}, CUDA, "dense"),
    ({"quant_recipe": {"default": "bf16", "overrides": [{"pattern": "*.mlp.*", "format": "nf4"}]}}, CUDA, "stream"),
    ({"load": "stream"}, CPU, "stream"),                      # asked for
    ({"load": "dense"}, CUDA, "dense"),
])  # fmt: skip
def test_resolve_load(policy, device, how):
    assert resolve_load(PolicyConfig(**policy), device) == how


def test_bad_load_values_are_refused_when_the_config_is_built():
    with pytest.raises(ValueError, match="policy.load must be auto|dense|stream"):
        load_config(RLConfig, None, ["policy.load=lazy"])
    with pytest.raises(ValueError, match="policy.load=stream quantizes the frozen base.*policy.mode=lora"):
        load_config(RLConfig, None, ["policy.load=stream", "policy.mode=full", "policy.format=bf16"])


@pytest.mark.parametrize("policy", [{"format": "nvfp4"}, {"quant_recipe": MIXED}])
def test_streamed_base_gives_the_dense_policy(tmp_path, monkeypatch, policy):
    """Same packed base, same LoRA (placement, init under the same seed, fp32), same recorded recipe;
    build_policy does not quantize a base streamed with its own recipe again."""
    import quarl.train.policy as policy_mod

    d = save_tiny(tmp_path / "m", "qwen2", tied=False)
    cfg = PolicyConfig(lora_r=4, lora_alpha=8, load="stream", **policy)
    dense, _ = load_model(d)
    torch.manual_seed(0)
    rep_dense = build_policy(dense, cfg)

    streamed, _, how = load_policy_model(d, cfg, CPU, torch.float32)
    assert how == "stream" and streamed.quarl_recipe == base_recipe(cfg)
    monkeypatch.setattr(policy_mod, "quantize_model", lambda *a, **k: pytest.fail("quantized twice"))
    torch.manual_seed(0)
    rep = build_policy(streamed, cfg)
    assert_same_state(streamed, dense)  # packed tensors and the LoRA A/B init, byte for byte
    assert streamed.quarl_recipe == dense.quarl_recipe
    assert rep == rep_dense and rep["format"] == cfg.format
    names = lambda m: sorted(n for n, p in m.named_parameters() if p.requires_grad)
    assert names(streamed) == names(dense) and all(
        p.dtype == torch.float32 for p in streamed.parameters() if p.requires_grad)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return synthetic_dataset(tmp_path_factory.mktemp("data") / "dataset", num_samples=12)


def test_quarl_rl_streams_a_saved_model_and_trains_the_dense_policy(dataset, tmp_path):
    """`quarl rl --set policy.load=stream` on a sharded tiny checkpoint: a complete adapter artifact
    that says how the base was loaded, and the run is the dense run step for step."""
    import warnings

    from quarl.cli.main import app
    from quarl.models import tiny_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = tiny_model("llama")
    d = tmp_path / "base"
    model.save_pretrained(d, max_shard_size="1MB")
    tok.save_pretrained(d)
    assert len(list(d.glob("*.safetensors"))) > 1

    args = ["rl", "--model", str(d), "--data", dataset]
    sets = [x for o in [*TINY_OVERRIDES, "train.steps=2"] for x in ("--set", o)]
    r = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "s"), *sets, "--set", "policy.load=stream"])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["policy_load"] == "stream" and summary["policy_format"] == "nvfp4"
    b = summary["policy_load_build"]
    assert b["mode"] == "stream" and b["layers"] == 2 and b["final_bytes"] < b["dense_bytes"]

    cfg = load_config(RLConfig, None, [*TINY_OVERRIDES, "train.steps=2", "policy.load=dense"])
    res = run_rl(cfg, model_uri=str(d), data_uri=dataset, output_uri=str(tmp_path / "d"))
    assert res["policy_load"] == "dense"
    a, b = (load_file(str(tmp_path / x / "adapter_model.safetensors")) for x in ("s", "d"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the same training, step for step
    qa, qb = (json.loads((tmp_path / x / "quant_recipe.json").read_text()) for x in ("s", "d"))
    assert qa == qb and qa["lora"]["r"] == 32
