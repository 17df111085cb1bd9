"""Packed adapters (quarl.engine.lora) on CPU: the engine's output is the module path's, token for token.

Greedy tokens with the pack equal those without it and HF generate's; log-probs equal the full
forward; an fp32 adapter under bf16 activations (the trainer's case) gives the same tokens as
the unpacked engine; in-place optimizer updates and replaced adapter tensors are seen by the
next call; a hooked projection is called as a module (its hook fires)."""

from __future__ import annotations

import pytest
import torch

from quarl.engine import FastGenerator
from quarl.engine.lora import GROUPS, LoraPack, packable
from tests.engine.conftest import PAD, full_forward_logprobs, hf_greedy, lora_model, make_model, prompts
from tests.engine.test_engine import greedy


def _lora_B(model):
    return [p for n, p in model.named_parameters() if n.endswith("lora_B")]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_packed_greedy_equals_unpacked_and_hf_generate(kind):
    model = lora_model(kind)
    rows = prompts((6, 2, 9))
    ref = hf_greedy(model, rows, 10)
    eng = FastGenerator(model, PAD)
    roll = eng.generate(rows, greedy(10), n=1)
    pack = eng.runner._lora
    assert pack is not None and all(set(g) == set(GROUPS) for g in pack.layers), "every group should be packed"
    off = FastGenerator(model, PAD, lora_pack=False).generate(rows, greedy(10), n=1)
    assert torch.equal(roll.completion_ids, ref)
    assert torch.equal(off.completion_ids, ref)
    torch.testing.assert_close(roll.logprobs, off.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(roll.logprobs, full_forward_logprobs(model, roll), atol=2e-5, rtol=0)


def test_fp32_adapter_under_bf16_activations():
    """The trainer's adapter is fp32; the pack holds its bf16 cast, the module casts at every call."""
    model = lora_model("qwen2", dtype=torch.bfloat16, fp32_adapter=True)
    rows = prompts((5, 8))
    on = FastGenerator(model, PAD)
    a = on.generate(rows, greedy(8), n=1)
    assert on.runner._lora.layers[0]["qkv"].A.dtype == torch.bfloat16
    b = FastGenerator(model, PAD, lora_pack=False).generate(rows, greedy(8), n=1)
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=2e-2, rtol=0)  # bf16: GEMM shapes differ (N = 3r vs r)


def test_updates_between_calls_are_seen():
    """In place (an optimizer step) and replaced tensors (a new adapter): the next call uses them."""
    model = lora_model("llama")
    rows = prompts((4, 7))
    eng = FastGenerator(model, PAD)
    before = eng.generate(rows, greedy(8), n=1).completion_ids
    with torch.no_grad():
        for p in _lora_B(model):
            p.mul_(-3.0)
    after = eng.generate(rows, greedy(8), n=1).completion_ids
    assert not torch.equal(before, after), "the test needs an update that changes the answer"
    assert torch.equal(after, hf_greedy(model, rows, 8))
    q = model.model.layers[0].self_attn.q_proj
    old = eng.runner._lora
    q.lora_A = torch.nn.Parameter(q.lora_A.detach() * 2)
    replaced = eng.generate(rows, greedy(8), n=1).completion_ids
    assert eng.runner._lora is not old, "a replaced adapter tensor rebuilds the pack"
    assert torch.equal(replaced, hf_greedy(model, rows, 8))


def test_hooked_projection_is_called_as_a_module():
    model = lora_model("qwen2")
    rows = prompts((5, 3))
    ref = FastGenerator(model, PAD, lora_pack=False).generate(rows, greedy(6), n=1)
    calls = []
    up = model.model.layers[1].mlp.up_proj
    h = up.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    try:
        assert not packable(up)
        eng = FastGenerator(model, PAD)
        roll = eng.generate(rows, greedy(6), n=1)
        assert "gate_up" not in eng.runner._lora.layers[1] and "gate_up" in eng.runner._lora.layers[0]
        assert calls, "the hook must fire"
        assert torch.equal(roll.completion_ids, ref.completion_ids)
    finally:
        h.remove()


def test_models_without_lora_build_an_empty_pack():
    model = make_model("qwen3")
    pack = LoraPack(list(model.model.layers), torch.float32)
    assert not pack and pack.buffers() == []
    rows = prompts((3, 6))
    assert torch.equal(FastGenerator(model, PAD).generate(rows, greedy(5), n=1).completion_ids,
                       hf_greedy(model, rows, 5))


def test_environment_switch(monkeypatch):
    model = lora_model("llama")
    monkeypatch.setenv("QUARL_ENGINE_LORA_PACK", "0")
    eng = FastGenerator(model, PAD)
    eng.generate(prompts((3,)), greedy(2), n=1)
    assert eng.runner._lora is None
    monkeypatch.setenv("QUARL_ENGINE_LORA_PACK", "maybe")
    with pytest.raises(ValueError, match="QUARL_ENGINE_LORA_PACK"):
        FastGenerator(model, PAD)


def test_epilogue_route_is_taken_and_equals_addmm(monkeypatch):
    """Where a projection's kernel offers the fused last pass (``QuantLinear.epilogue_kernel``), the
    pack calls it with the adapter's column slice of the packed A output; its result is the addmm
    path's. On CPU no kernel offers one, so a reference stands in for the GPU kernel here (the kernel's
    own numerics: tests/kernels/test_epilogue_*); ``QUARL_ENGINE_LORA_EPILOGUE=0`` keeps the addmm."""
    from quarl_kernels.fused_ops import silu_mul_reference

    from quarl.quant.linear import QuantLinear

    calls, gated = [], []

    def reference(x, m, a, b, scaling, gate=None):  # what quarl_kernels.registration.forward_epilogue computes
        y = torch.nn.functional.linear(x, m.dequantized_weight(x.dtype))
        y = y + m.bias.to(y.dtype) if m.bias is not None else y
        assert a is not None, "only the engine's packed groups take the fused route (never base_forward)"
        calls.append((m.out_features, tuple(a.shape), a.stride()))
        gated.append(gate is not None)
        y = y + scaling * a @ b.t()
        return y if gate is None else silu_mul_reference(gate, y)  # the MLP's activation in the up's last pass

    model = lora_model("qwen2")
    rows = prompts((6, 2, 9))
    off = FastGenerator(model, PAD).generate(rows, greedy(8), n=1)
    assert not calls
    monkeypatch.setattr(QuantLinear, "epilogue_kernel", lambda self, x: reference)
    on = FastGenerator(model, PAD).generate(rows, greedy(8), n=1)
    n_layers = len(model.model.layers)
    assert len(calls) >= 7 * n_layers, "every packed projection should take the fused route"
    # the up projection's last pass applies the MLP's SiLU: one call in seven (per layer and step) carries the gate
    assert sum(gated) * 7 == len(calls), (sum(gated), len(calls))
    assert any(stride[0] > shape[-1] for _, shape, stride in calls), "q/k/v get column slices of one A output"
    assert torch.equal(on.completion_ids, off.completion_ids)
    torch.testing.assert_close(on.logprobs, off.logprobs, atol=1e-5, rtol=0)
    calls.clear()
    monkeypatch.setenv("QUARL_ENGINE_LORA_EPILOGUE", "0")
    FastGenerator(model, PAD).generate(rows, greedy(2), n=1)
    assert not calls
    monkeypatch.setenv("QUARL_ENGINE_LORA_EPILOGUE", "sometimes")
    with pytest.raises(ValueError, match="QUARL_ENGINE_LORA_EPILOGUE"):
        FastGenerator(model, PAD)


def test_epilogue_kernel_only_without_autograd_and_on_kernel_devices():
    model = lora_model("qwen2")
    q = model.model.layers[0].self_attn.q_proj
    x = torch.randn(2, q.in_features)
    with torch.no_grad():
        assert q.epilogue_kernel(x) is None  # CPU: no kernel registered for it
    assert q.epilogue_kernel(x) is None


def test_a_gemm_inside_the_first_launch_route(monkeypatch):
    """Where every projection of a group takes the fused last pass and a step has at most ``A_MAX_M`` rows (decode),
    the group's first projection runs its ``epilogue_a_kernel``: its launch returns the group's A GEMM as split
    partials ``[S, ..., G*r]`` too (extra programs of the GEMV / mma.sync kernel on CUDA; a CPU stand-in here, split
    over K in 3 ranges), and each other projection gets its columns of them; the last pass (a reference here: sum in
    split order, round to the activation dtype, as the kernel does) gives the cuBLAS route's tokens. Steps of more
    rows (this prefill: 3 x 9) keep the one-GEMM ``a``; ``QUARL_ENGINE_LORA_A=0`` keeps it everywhere."""
    from quarl_kernels.fused_ops import silu_mul_reference

    from quarl.engine import lora as lp
    from quarl.quant.linear import QuantLinear

    seen = []  # per fused call: (rows of the step, did ``a`` come as partials)

    def reference(x, m, a, b, scaling, gate=None):  # forward_epilogue with partials: the last pass's arithmetic
        seen.append((x.numel() // x.shape[-1], a.dim() == x.dim() + 1))
        if a.dim() == x.dim() + 1:
            a = sum(a[s] for s in range(1, a.shape[0])) + a[0] if a.shape[0] > 1 else a[0]
            a = a.to(x.dtype)
        y = torch.nn.functional.linear(x, m.dequantized_weight(x.dtype))
        y = y + m.bias.to(y.dtype) if m.bias is not None else y
        y = y + scaling * a @ b.t()
        return y if gate is None else silu_mul_reference(gate, y)

    def reference_a(x, m, a_w, a_lo, b, scaling):  # forward_epilogue_a: the launch's partials, then the last pass
        assert x.numel() // x.shape[-1] <= lp.A_MAX_M
        chunks = torch.tensor_split(torch.arange(x.shape[-1]), 3)
        parts = torch.stack([x[..., c].float() @ a_w[:, c].float().t() for c in chunks])  # [3, ..., G*r]
        return reference(x, m, parts[..., a_lo:a_lo + b.shape[-1]], b, scaling), parts

    model = lora_model("qwen2")
    rows = prompts((6, 2, 9))
    monkeypatch.setenv("QUARL_ENGINE_LORA_A", "0")
    off = FastGenerator(model, PAD).generate(rows, greedy(8), n=1)
    monkeypatch.setattr(QuantLinear, "epilogue_kernel", lambda self, x: reference)
    monkeypatch.setattr(QuantLinear, "epilogue_a_kernel", lambda self, x: reference_a)
    FastGenerator(model, PAD).generate(rows, greedy(2), n=1)
    assert seen and not any(p for _, p in seen), "switched off"
    monkeypatch.delenv("QUARL_ENGINE_LORA_A")
    seen.clear()
    on = FastGenerator(model, PAD).generate(rows, greedy(8), n=1)
    assert {r for r, _ in seen} == {27, 3}, seen  # the prefill's 3 x 9 rows, then decode steps of 3
    assert all(p == (r <= lp.A_MAX_M) for r, p in seen), "on by default: every projection of a decode step, only those"
    assert torch.equal(on.completion_ids, off.completion_ids)
    torch.testing.assert_close(on.logprobs, off.logprobs, atol=1e-4, rtol=0)
    monkeypatch.setenv("QUARL_ENGINE_LORA_A", "often")
    with pytest.raises(ValueError, match="QUARL_ENGINE_LORA_A"):
        FastGenerator(model, PAD)


def test_group_in_one_launch_route(monkeypatch):
    """At decode steps (up to ``GROUP_MAX_M`` rows) a packed group of two or more projections (q/k/v, gate/up) runs
    its ``epilogue_group_kernel`` (on CUDA: the weights and the A programs in one GEMV / mma.sync launch, then each
    last pass; a CPU stand-in here) and gets the cuBLAS route's tokens; o and down (one projection) and a 27-row
    prefill keep the per-projection route; ``gate_act`` asks the group for ``silu(gate) * up`` as its second
    output."""
    from quarl_kernels.fused_ops import silu_mul_reference

    from quarl.engine import lora as lp
    from quarl.quant.linear import QuantLinear

    def reference(x, m, a, b, scaling, gate=None):  # forward_epilogue (a may be partials)
        if a.dim() == x.dim() + 1:
            a = (sum(a[s] for s in range(1, a.shape[0])) + a[0] if a.shape[0] > 1 else a[0]).to(x.dtype)
        y = torch.nn.functional.linear(x, m.dequantized_weight(x.dtype))
        y = (y + m.bias.to(y.dtype) if m.bias is not None else y) + scaling * a @ b.t()
        return y if gate is None else silu_mul_reference(gate, y)

    def reference_a(x, m, a_w, a_lo, b, scaling):
        parts = (x.float() @ a_w.float().t())[None]
        return reference(x, m, parts[..., a_lo:a_lo + b.shape[-1]], b, scaling), parts

    groups = []

    def reference_group(x, mods, a_w, bs, scalings, gate_act=False):  # registration.forward_group
        assert x.numel() // x.shape[-1] <= lp.GROUP_MAX_M and len(mods) >= 2
        groups.append((len(mods), gate_act))
        parts = (x.float() @ a_w.float().t())[None]
        r = bs[0].shape[-1]
        out = [reference(x, m, parts[..., j * r:(j + 1) * r], bs[j], scalings[j]) for j, m in enumerate(mods)]
        if gate_act:
            out[1] = silu_mul_reference(out[0], out[1])
        return out

    model = lora_model("qwen2")
    one = prompts((6,))
    monkeypatch.setenv("QUARL_ENGINE_LORA_A", "0")
    off = FastGenerator(model, PAD).generate(one, greedy(8), n=1)
    monkeypatch.setattr(QuantLinear, "epilogue_kernel", lambda self, x: reference)
    monkeypatch.setattr(QuantLinear, "epilogue_a_kernel", lambda self, x: reference_a)
    monkeypatch.setattr(QuantLinear, "epilogue_group_kernel", lambda self, x: reference_group)
    FastGenerator(model, PAD).generate(one, greedy(2), n=1)
    assert not groups, "the group route rides on the A route: off with it"
    monkeypatch.delenv("QUARL_ENGINE_LORA_A")
    on = FastGenerator(model, PAD).generate(one, greedy(8), n=1)
    n_layers = len(model.model.layers)
    assert groups and set(groups) == {(3, False), (2, True)}, set(groups)  # q/k/v; gate/up with the SiLU
    assert len(groups) % (2 * n_layers) == 0
    assert torch.equal(on.completion_ids, off.completion_ids)
    torch.testing.assert_close(on.logprobs, off.logprobs, atol=1e-4, rtol=0)
    groups.clear()
    FastGenerator(model, PAD).generate(prompts((6, 2, 9)), greedy(4), n=1)
    assert len(groups) == 3 * 2 * n_layers, "decode steps of three rows (the mma.sync kernel's), not the prefill"
