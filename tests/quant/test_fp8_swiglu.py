"""quarl.quant.fp8_swiglu on CPU: the fused FP8 MLP is the three FP8 linears with eager SwiGLU between them, bit for bit
(forward, the input's and the three weights' gradients, both X^T groupings, shapes not multiples of 128), with and
without autograd -- but for the input's gradient where gate and up are one stacked GEMM (intermediate widths
multiples of 128), one FP32 sum rounded once instead of two rounded products added in BF16: at least as near the FP32
value; the fused glue routes a full-parameter Jet-RL MLP through it and nothing else; the switches refuse bad values.
The Triton kernels' own checks: tests/kernels/test_fp8_swiglu_{interpreter,gpu}.py."""

import pytest
import torch
import torch.nn.functional as F

from quarl.quant import fp8_swiglu
from quarl.quant.fp8_linear import fp8_linear
from quarl.quant.fp8_swiglu import FP8SwiGLUFunction, silu_mul_grads
from quarl.quant.fp8_swiglu import fp8_swiglu as fused
from tests.quant.jetrl_models import glue_restored, jetrl_qwen2, with_and_without  # noqa: F401 (a fixture)


def _weights(h: int, inter: int, seed: int = 0):
    torch.manual_seed(seed)
    mk = lambda n, k: (torch.randn(n, k) * 0.05).to(torch.bfloat16).requires_grad_()
    return mk(inter, h), mk(inter, h), mk(h, inter)


def _run(fn, x, ws, dy):
    for t in (x, *ws):
        t.grad = None
    y = fn(x, *ws)
    y.backward(dy)
    return [y.detach(), x.grad, *(w.grad for w in ws)]


@pytest.mark.parametrize("stack", ["1", "0"], ids=["gate-up-stacked", "two-gemms"])
@pytest.mark.parametrize("wgrad", ["1x128", "tiles"])
@pytest.mark.parametrize("m,h,inter", [(37, 192, 320), (130, 128, 256), (5, 576, 1536)])
def test_fused_mlp_is_three_fp8_linears_bit_for_bit(m, h, inter, wgrad, stack, monkeypatch):
    monkeypatch.setenv("QUARL_FP8_STACK", stack)
    ws = _weights(h, inter)
    x = torch.randn(2, m, h).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(2, m, h).to(torch.bfloat16)
    stacked = fp8_swiglu.stack_gate_up(x, ws[0], ws[1])
    assert stacked == (stack == "1" and inter % 128 == 0)

    def unfused(x, wg, wu, wd):
        return fp8_linear(F.silu(fp8_linear(x, wg, wgrad=wgrad)) * fp8_linear(x, wu, wgrad=wgrad), wd, wgrad=wgrad)

    got = _run(lambda x, *w: fused(x, *w, wgrad=wgrad), x, ws, dy)
    want = _run(unfused, x, ws, dy)
    for name, a, b in zip(("y", "dx", "dWg", "dWu", "dWd"), got, want, strict=True):
        if name == "dx" and stacked:  # one FP32 sum over 2I rounded once: nearer the FP32 value, not the same bits
            ref = _dx_reference(x.detach(), ws, dy)
            err, err_sep = ((t.float() - ref).norm() / ref.norm() for t in (a, b))
            assert err <= err_sep + 1e-6 and err < 5e-3, (err, err_sep)
            continue
        assert a.shape == b.shape and torch.equal(a, b), (name, (a.float() - b.float()).abs().max())
    with torch.no_grad():  # the trainer's old log-probs: the same forward bits without a graph
        assert torch.equal(fused(x, *ws, wgrad=wgrad), got[0])


def _dx_reference(x, ws, dy):
    """dg Wg + du Wu in FP32 over the FP8 operands the DGrads see (dg, du in 1x128 groups, W in 128x128 tiles), dg and
    du as the three FP8 linears' backward makes them (eager SwiGLU's autograd on dh = down's DGrad)."""
    from quarl.quant.formats.fp8 import dequantize_act_1x128
    from quarl.quant.fp8_gemm import _dequant_tiles
    from quarl.quant.fp8_linear import _master_tiles
    from quarl.quant.fp8_operands import quantize_act_gemm

    wg, wu, wd = (w.detach() for w in ws)
    h, inter = wg.shape[1], wg.shape[0]
    x2, dy2 = x.reshape(-1, h), dy.reshape(-1, h)
    m = x2.shape[0]
    g, u = fp8_linear(x2, wg), fp8_linear(x2, wu)
    hq = (F.silu(g) * u).requires_grad_()
    fp8_linear(hq, wd.requires_grad_(False)).backward(dy2)  # dh: down's DGrad, as the fused backward computes it
    dg, du = silu_mul_grads(g, u, hq.grad)
    total = 0
    for d, w in ((dg, wg), (du, wu)):
        q, s, _, _ = quantize_act_gemm(d, m, inter, None)
        wq, wsc = _master_tiles(w)
        total = total + dequantize_act_1x128(q, s) @ _dequant_tiles(wq, wsc)[:, :h]
    return total.reshape(dy.shape)


def test_input_gradient_only_and_weights_only():
    """A frozen input or frozen weights: only the gradients asked for, the same values as with all of them."""
    ws = _weights(192, 320, seed=1)
    x = torch.randn(9, 192).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(9, 192).to(torch.bfloat16)
    full = _run(fused, x, ws, dy)
    xd = x.detach()
    for t in ws:
        t.grad = None
    fused(xd, *ws).backward(dy)
    assert all(torch.equal(w.grad, f) for w, f in zip(ws, full[2:], strict=True))
    frozen = [w.detach() for w in ws]
    x.grad = None
    fused(x, *frozen).backward(dy)
    assert torch.equal(x.grad, full[1])


def test_silu_mul_grads_is_autograd():
    torch.manual_seed(0)
    g, u, dh = (torch.randn(7, 33).to(torch.bfloat16) for _ in range(3))
    g.requires_grad_(), u.requires_grad_()
    (F.silu(g) * u).backward(dh)
    dg, du = silu_mul_grads(g.detach(), u.detach(), dh)
    assert torch.equal(dg, g.grad) and torch.equal(du, u.grad)


@pytest.mark.usefixtures("glue_restored")
def test_compiled_glue_runs_a_jetrl_mlp_fused_and_equal(monkeypatch):
    """policy.compile_glue on a full-parameter Jet-RL model: each MLP is one FP8SwiGLUFunction (counted), and the
    loss and every gradient equal those of the unfused FP8 linears (QUARL_FP8_SWIGLU=0), bit for bit."""
    from quarl.train.fused_glue import compile_glue

    model = jetrl_qwen2()
    compile_glue(model, backend="aot_eager")
    loss, grads, loss0, grads0 = with_and_without(monkeypatch, model, FP8SwiGLUFunction, "QUARL_FP8_SWIGLU",
                                                  torch.randint(0, 97, (2, 11)))
    assert torch.equal(loss, loss0)
    assert all(torch.equal(grads[k], grads0[k]) for k in grads), [k for k in grads if not torch.equal(grads[k],
                                                                                                      grads0[k])]


@pytest.mark.usefixtures("glue_restored")
def test_lora_and_bf16_mlps_are_not_fused():
    from quarl.train.fused_glue import compile_glue

    lora = jetrl_qwen2(lora=True)
    compile_glue(lora, backend="aot_eager")
    assert not any(fp8_swiglu.fusable(m) for m in lora.modules() if hasattr(m, "gate_proj"))
    full = jetrl_qwen2()
    assert all(fp8_swiglu.fusable(m) for m in full.modules() if hasattr(m, "gate_proj"))
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    assert not fp8_swiglu.fusable(Qwen2MLP(full.config))  # nn.Linear projections


def test_switch_refuses_other_values(monkeypatch):
    monkeypatch.setenv("QUARL_FP8_SWIGLU", "yes")
    with pytest.raises(ValueError, match="QUARL_FP8_SWIGLU='yes'"):
        fp8_swiglu.enabled()


def test_forward_switch_refuses_other_values(monkeypatch):
    monkeypatch.setenv("QUARL_FP8_SWIGLU_FWD", "on")
    with pytest.raises(ValueError, match="QUARL_FP8_SWIGLU_FWD='on'"):
        fp8_swiglu.forward_fused()


@pytest.mark.parametrize("fwd", ["1", "0"])
def test_swiglu_operand_on_cpu_is_silu_mul_then_the_quantizer(fwd, monkeypatch):
    """Off CUDA (either switch value) the down projection's operand is the given silu_mul's h quantized -- the fused
    Gluon kernel is a CUDA path (its bits against eager: tests/kernels/test_fp8_swiglu_gpu.py)."""
    from quarl.quant.fp8_linear import quantize_input

    monkeypatch.setenv("QUARL_FP8_SWIGLU_FWD", fwd)
    torch.manual_seed(1)
    g, u = (torch.randn(37, 320) * 3).to(torch.bfloat16), torch.randn(37, 320).to(torch.bfloat16)
    calls = []

    def silu_mul(a, b):
        calls.append(1)
        return F.silu(a) * b

    for t_rows, tiles in ((None, False), (128, False), (128, True)):
        got = fp8_swiglu.swiglu_operand(g, u, silu_mul, 37, 384, t_rows, tiles)
        h = F.silu(g) * u
        want = quantize_input(h, h, 37, 384, t_rows, False, tiles)
        raw = lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
        for a, b in zip(got, want, strict=True):
            assert (a is None and b is None) or torch.equal(raw(a), raw(b))
    assert len(calls) == 3
