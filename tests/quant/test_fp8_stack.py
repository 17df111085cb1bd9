"""quarl.quant.fp8_stack on CPU: q, k, v as one FP8 GEMM forward and one DGrad. The outputs, the weights' and the
biases' gradients are the three FP8 linears' bit for bit; the input's gradient is the FP32 sum rounded once (closer to
the FP32 reference of the same operands than the three rounded products added in BF16); the stacked tiles follow the
weights through optimizer steps and are the bytes a single projection reads; the fused glue routes a full-parameter
Jet-RL attention through it (and the whole model trains as with the switch off, within the DGrad's rounding), and an
MLP's gate and up stacked the same way (quarl.quant.fp8_swiglu); a deep copy gets its own group. The Triton ``out=``
paths: tests/kernels/test_fp8_quant_interpreter.py."""

import copy

import pytest
import torch

from quarl.quant import fp8_stack
from quarl.quant.fp8_linear import _master_tiles, fp8_linear
from quarl.quant.fp8_stack import FP8StackFunction
from tests.quant.jetrl_models import (  # noqa: F401 (glue_restored: a fixture)
    glue_restored,
    jetrl_qwen2,
    loss_and_grads,
    with_and_without,
)


def _params(k: int, widths: tuple[int, ...], bias: bool, seed: int = 0):
    torch.manual_seed(seed)
    ws = [(torch.randn(n, k) * 0.05).to(torch.bfloat16).requires_grad_() for n in widths]
    bs = [(torch.randn(n) * 0.1).to(torch.bfloat16).requires_grad_() if bias else None for n in widths]
    return ws, bs


def _grads(ts):
    return [t.grad.clone() if t is not None and t.grad is not None else None for t in ts]


def _zero(ts):
    for t in ts:
        if t is not None:
            t.grad = None


@pytest.mark.parametrize("wgrad", ["1x128", "tiles"])
@pytest.mark.parametrize("m,k,widths,bias", [(37, 192, (256, 128, 128), True), (130, 128, (128, 256), False),
                                             (5, 576, (384, 128, 128), True)])
def test_stack_is_the_separate_linears(m, k, widths, bias, wgrad):
    ws, bs = _params(k, widths, bias)
    x = torch.randn(2, m, k).to(torch.bfloat16).requires_grad_()
    dys = [torch.randn(2, m, n).to(torch.bfloat16) for n in widths]

    outs = fp8_stack.fp8_stack(x, ws, bs, wgrad)
    torch.autograd.backward(outs, dys)
    got = [o.detach() for o in outs], x.grad.clone(), _grads(ws), _grads(bs)
    _zero([x, *ws, *bs])
    sep = [fp8_linear(x, w, b, wgrad=wgrad) for w, b in zip(ws, bs, strict=True)]
    torch.autograd.backward(sep, dys)
    want = [o.detach() for o in sep], x.grad.clone(), _grads(ws), _grads(bs)

    for a, b in zip(got[0], want[0], strict=True):  # outputs: the same operands and reductions
        assert a.shape == b.shape and torch.equal(a, b)
    for a, b in zip(got[2] + got[3], want[2] + want[3], strict=True):  # weight and bias gradients
        assert (a is None and b is None) or torch.equal(a, b)
    # the input's gradient: one FP32 sum rounded once against three roundings and two BF16 adds -- both near the FP32
    # value of the same FP8 operands, the stacked one at least as near
    ref = _dx_reference(ws, dys, k)
    err_stack = (got[1].float() - ref).norm() / ref.norm()
    err_sep = (want[1].float() - ref).norm() / ref.norm()
    assert err_stack <= err_sep + 1e-6 and err_stack < 5e-3, (err_stack, err_sep)
    with torch.no_grad():  # the trainer's old log-probs: the same forward bits without a graph
        assert all(torch.equal(a, b) for a, b in zip(fp8_stack.fp8_stack(x, ws, bs, wgrad), got[0], strict=True))


def _dx_reference(ws, dys, k):
    """sum_i dY_i W_i in FP32 over the FP8 operands the GEMMs see (dY in 1x128 groups, W in 128x128 tiles)."""
    from quarl.quant.formats.fp8 import dequantize_act_1x128
    from quarl.quant.fp8_gemm import _dequant_tiles
    from quarl.quant.fp8_operands import quantize_act_gemm

    total = 0
    for w, dy in zip(ws, dys, strict=True):
        d2 = dy.reshape(-1, dy.shape[-1])
        q, s, _, _ = quantize_act_gemm(d2, d2.shape[0], w.shape[0], None)
        wq, wsc = _master_tiles(w)
        total = total + dequantize_act_1x128(q, s) @ _dequant_tiles(wq, wsc)[:, :k]
    return total.reshape(*dys[0].shape[:-1], k)


def test_widths_not_multiples_of_128_are_refused():
    ws, _ = _params(128, (192, 64), False)
    with pytest.raises(ValueError, match="multiples of 128"):
        fp8_stack.fp8_stack(torch.randn(3, 128), ws)


def test_stacked_tiles_follow_the_weights_and_are_what_a_single_projection_reads():
    ws, bs = _params(256, (256, 128, 128), True, seed=2)
    opt = torch.optim.AdamW([*ws, *bs], lr=1e-2, fused=False)
    x = torch.randn(9, 256).to(torch.bfloat16)
    for _ in range(3):
        outs = fp8_stack.fp8_stack(x, ws, bs)
        sum(o.float().square().sum() for o in outs).backward()
        opt.step()
        opt.zero_grad()
    outs = fp8_stack.fp8_stack(x, ws, bs)  # after the last step: the stack re-made
    stack = ws[0]._quarl_stack[1]
    for i, w in enumerate(ws):
        q, s, qt = stack.blocks(i)
        fresh = fp8_stack._weight_tiles(w)  # the weight quantized now, from scratch
        assert torch.equal(q.view(torch.uint8), fresh[0].view(torch.uint8)) and torch.equal(s, fresh[1])
        assert torch.equal(qt.view(torch.uint8), fresh[0].t().view(torch.uint8))
        mq, ms = _master_tiles(w)  # the single projection's cache: the stack's own bytes, no copy
        assert mq.data_ptr() == q.data_ptr() and ms.data_ptr() == s.data_ptr()
        with torch.no_grad():
            assert torch.equal(fp8_linear(x, w, bs[i]), outs[i])


def _qwen2(stack_ok: bool = True, seed: int = 0, inter: int = 320):
    # q 256 wide, k / v 128: multiples of 128 (stackable); 192 / 96 are not. The MLP's gate / up stack where inter is
    # a multiple of 128 (quarl.quant.fp8_swiglu.stack_gate_up): not at 320
    heads, kv, dim = (4, 2, 64) if stack_ok else (4, 2, 48)
    return jetrl_qwen2(heads * dim, inter, heads, kv, seed=seed)






@pytest.mark.usefixtures("glue_restored")
def test_compiled_glue_stacks_a_jetrl_attention(monkeypatch):
    """policy.compile_glue on a full-parameter Jet-RL Qwen2: every attention's q / k / v is one FP8StackFunction
    (counted); the loss equals the three linears' (QUARL_FP8_STACK=0) bit for bit, and so does every weight's gradient
    but the ones upstream of a q / k / v DGrad, which differ by that DGrad's BF16 rounding only."""
    from quarl.train.fused_glue import compile_glue

    model = _qwen2()
    report = compile_glue(model, backend="aot_eager")
    assert report["fp8_qkv_stacks"] == 2
    loss, grads, loss0, grads0 = with_and_without(monkeypatch, model, FP8StackFunction, "QUARL_FP8_STACK",
                                                  torch.randint(0, 97, (2, 11)))
    assert torch.equal(loss, loss0)
    last = "model.layers.1."  # the last layer's projections and its MLP see the same dY bits in both runs
    for name in grads:
        if name.startswith(last) and "input_layernorm" not in name:
            assert torch.equal(grads[name], grads0[name]), name
        rel = (grads[name].float() - grads0[name].float()).norm() / grads0[name].float().norm().clamp_min(1e-12)
        assert rel < 0.05, (name, rel)


@pytest.mark.usefixtures("glue_restored")
def test_compiled_glue_stacks_a_jetrl_mlps_gate_and_up(monkeypatch):
    """The MLP's gate and up as one stacked GEMM (an intermediate width a multiple of 128; q / k / v not stackable
    here): the loss equals the two GEMMs' (QUARL_FP8_STACK=0) bit for bit, and so does every weight's gradient but the
    ones upstream of a gate / up DGrad (the last layer's MLP sees the same dY bits in both runs)."""
    from quarl.quant.fp8_swiglu import FP8SwiGLUFunction
    from quarl.train.fused_glue import compile_glue

    model = _qwen2(stack_ok=False, inter=384)
    compile_glue(model, backend="aot_eager")
    stacked = []
    real = FP8SwiGLUFunction.apply

    def spy(*a):
        stacked.append(a[-1] is not None)  # gu: the gate / up tiles stacked
        return real(*a)

    monkeypatch.setattr(FP8SwiGLUFunction, "apply", spy)
    ids = torch.randint(0, 97, (2, 11))
    loss, grads = loss_and_grads(model, ids)
    monkeypatch.setenv("QUARL_FP8_STACK", "0")
    loss0, grads0 = loss_and_grads(model, ids)
    assert stacked == [True, True, False, False]  # two MLPs stacked with the switch on, none with it off
    assert torch.equal(loss, loss0)
    last = "model.layers.1.mlp."
    for name in grads:
        if name.startswith(last):
            assert torch.equal(grads[name], grads0[name]), name
        rel = (grads[name].float() - grads0[name].float()).norm() / grads0[name].float().norm().clamp_min(1e-12)
        assert rel < 0.05, (name, rel)


@pytest.mark.usefixtures("glue_restored")
def test_not_stackable_attentions_stay_three_linears():
    from quarl.train.fused_glue import compile_glue

    model = _qwen2(stack_ok=False)
    assert "fp8_qkv_stacks" not in compile_glue(model, backend="aot_eager")
    assert all(m._stack is None for m in model.modules() if hasattr(m, "fp8_wgrad"))


@pytest.mark.usefixtures("glue_restored")
def test_a_deep_copy_gets_its_own_group():
    from quarl.train.fused_glue import compile_glue

    model = _qwen2()
    compile_glue(model, backend="aot_eager")
    clone = copy.deepcopy(model)
    attn, attn_c = model.model.layers[0].self_attn, clone.model.layers[0].self_attn
    group_c = attn_c.q_proj._stack
    assert group_c is not attn.q_proj._stack and group_c is attn_c.k_proj._stack
    assert group_c.projs == (attn_c.q_proj, attn_c.k_proj, attn_c.v_proj)
    ids = torch.randint(0, 97, (1, 7))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, clone(input_ids=ids).logits)


def test_switch_refuses_other_values(monkeypatch):
    monkeypatch.setenv("QUARL_FP8_STACK", "yes")
    with pytest.raises(ValueError, match="QUARL_FP8_STACK='yes'"):
        fp8_stack.enabled()
