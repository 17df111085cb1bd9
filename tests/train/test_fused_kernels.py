"""quarl.train.fused_kernels on CPU: every refusal names the knob and the fix; the wiring into both trainers.

Liger's kernels are Triton kernels (CUDA only, and not installed in CPU CI): their numerics inside quarl's models
are checked on the GPU (test_fused_kernels_gpu.py). Here a stand-in for Liger's ``monkey_patch`` module checks
what quarl does around it: the model family lookup, the count of patched modules, the report."""

import sys
import types

import pytest
import torch

from quarl.train.fused_kernels import PATCHES, apply_liger_kernel
from tests.rl.conftest import small_tiny_model


def test_cpu_is_refused_with_the_knob_named():
    model, _ = small_tiny_model()
    with pytest.raises(ValueError, match=r"policy.use_liger_kernel=true needs a CUDA device.*set policy.use_liger_kernel=false"):
        apply_liger_kernel(model, "cpu")
    with pytest.raises(ValueError, match=r"student.use_liger_kernel=true needs a CUDA device"):
        apply_liger_kernel(model, torch.device("cpu"), key="student.use_liger_kernel")


def test_missing_liger_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", None)  # import -> ImportError
    model, _ = small_tiny_model()
    with pytest.raises(ValueError, match=r"needs the liger-kernel package.*pip install 'quarl\[gpu\]'"):
        apply_liger_kernel(model, "cuda")


def _fake_liger(monkeypatch, families, bind=True):
    """A stand-in for liger_kernel.transformers.monkey_patch: binds a forward to each RMSNorm and MLP, as Liger does."""
    calls = []

    def apply(model, **kw):
        calls.append(kw)
        if bind:
            for m in model.modules():
                if type(m).__name__.endswith(("RMSNorm", "MLP")):
                    m.__dict__["forward"] = type(m).forward.__get__(m)

    mod = types.ModuleType("liger_kernel.transformers.monkey_patch")
    mod.MODEL_TYPE_TO_APPLY_LIGER_FN = dict.fromkeys(families)
    mod._apply_liger_kernel_to_instance = apply
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", mod)
    return calls


def test_patches_norms_and_mlps_and_never_the_loss(monkeypatch):
    calls = _fake_liger(monkeypatch, ["llama", "qwen2"])
    model, _ = small_tiny_model()
    layers = model.config.num_hidden_layers
    report = apply_liger_kernel(model, "cuda")
    assert calls == [PATCHES]
    assert not PATCHES["cross_entropy"] and not PATCHES["fused_linear_cross_entropy"]  # quarl computes its own loss
    assert report["model_type"] == "llama" and report["modules"] == 3 * layers + 1  # 2 norms + MLP each, final norm
    assert report["patches"] == ["rope", "rms_norm", "swiglu"]


def test_unknown_family_and_nothing_patched_are_refused(monkeypatch):
    _fake_liger(monkeypatch, ["qwen2"])
    model, _ = small_tiny_model()
    with pytest.raises(ValueError, match=r"no kernels for model_type 'llama'.*set policy.use_liger_kernel=false"):
        apply_liger_kernel(model, "cuda")
    _fake_liger(monkeypatch, ["llama"], bind=False)
    with pytest.raises(ValueError, match=r"patched no module"):
        apply_liger_kernel(model, "cuda")


def test_rl_trainer_refuses_it_on_cpu(tmp_path):
    from quarl.rl.trainer import RLTrainer
    from tests.rl.conftest import ANSWERS, PROMPTS, ParityReward, tiny_cfg

    model, tok = small_tiny_model()
    with pytest.raises(ValueError, match=r"policy.use_liger_kernel=true needs a CUDA device"):
        RLTrainer(tiny_cfg("policy.use_liger_kernel=true"), model, tok, PROMPTS, ANSWERS, tmp_path,
                  reward_fn=ParityReward())


def test_distill_trainer_refuses_it_on_cpu(tmp_path):
    from tests.distill.test_trainer import _trainer

    with pytest.raises(ValueError, match=r"student.use_liger_kernel=true needs a CUDA device"):
        _trainer(tmp_path, "student.use_liger_kernel=true")
