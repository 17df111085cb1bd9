"""The FP8 linear's operands (``quarl.quant.fp8_operands``): the 1x128 / 128x1 / 128x128 layouts, one activation
quantized once for the projections that read it (the memo, ``shared_input``), the DGrad scales kept per weight
version."""


import torch

from quarl.quant import QuantLinear, fp8_operands
from quarl.quant import fp8_linear as fl
from quarl.quant.formats import fp8
from quarl.quant.fp8_linear import fp8_linear, quantize_weight_128x128, quantize_weight_padded
from tests.quant.fp8_helpers import needs_sm90


def test_block_layouts_1x128_128x1_128x128():
    torch.manual_seed(0)
    x = torch.randn(256, 384) * torch.logspace(-2, 2, 256)[:, None]  # rows of very different range
    # 1x128: one scale per row per 128 columns
    q, s = fp8.quantize_act_1x128(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (256, 3) and s[7, 2] == x[7, 256:].abs().max() / 448
    # 128x1 (X^T for WGrad): one scale per column per 128 rows, i.e. 1x128 of the transpose
    _, st = fp8.quantize_act_1x128(x.t())
    assert st.shape == (384, 2) and st[5, 1] == x[128:, 5].abs().max() / 448
    # 128x128 tiles of W, and W^T's tiles are the transpose of W's (DGrad reuses the forward's bits)
    w = torch.randn(200, 384)
    wq, ws = quantize_weight_128x128(w)
    assert ws.shape == (2, 3) and ws[1, 2] == w[128:, 256:].abs().max() / 448
    wtq, wts = quantize_weight_128x128(w.t().contiguous())
    assert torch.equal(wts, ws.t()) and torch.equal(wtq.view(torch.uint8), wq.t().view(torch.uint8))
    # the GEMM-layout quantizer (padded, 4-D view) is the format's quantizer bit for bit
    qp, sp = quantize_weight_padded(w)
    assert qp.shape == (256, 384) and torch.equal(sp, ws)
    assert torch.equal(qp[:200].view(torch.uint8), wq.view(torch.uint8)) and not qp[200:].view(torch.uint8).any()


# --- one activation quantized once (q/k/v and gate/up read the same X) ----------------------------------------
def _count_quant(monkeypatch):
    from quarl.quant import fp8_linear as fl

    calls, orig = [], fl.quantize_act_gemm

    def spy(x, rows, cols, t=None, row_groups=True):
        calls.append((tuple(x.shape), t))
        return orig(x, rows, cols, t, row_groups)

    monkeypatch.setattr(fl, "quantize_act_gemm", spy)  # the backward's dY
    monkeypatch.setattr(fp8_operands, "quantize_act_gemm", spy)  # the forward's X (quantize_input)
    fl.clear_input_memo()
    return calls


def _qkv(x, ws, g):
    ys = [fp8_linear(x, w) for w in ws]
    torch.autograd.backward(ys, g)
    return [y.detach() for y in ys], x.grad.clone(), [w.grad.clone() for w in ws]


def test_memo_quantizes_a_shared_input_once_and_changes_no_bit(monkeypatch):
    """q, k, v on one X: one quantization of X (both groupings) in the forward, outputs and all gradients equal
    to the unmemoized layer bit for bit (the same operands)."""
    calls = _count_quant(monkeypatch)
    torch.manual_seed(11)
    x0 = torch.randn(2, 70, 576)  # K = 576: padded; 140 tokens: two token groups
    ws0 = [torch.randn(n, 576) * 0.05 for n in (192, 64, 64)]
    g = [torch.randn(2, 70, w.shape[0]) for w in ws0]
    runs = {}
    for memo in ("1", "0"):
        monkeypatch.setenv("QUARL_FP8_MEMO", memo)
        calls.clear()
        x = x0.clone().requires_grad_()
        ws = [torch.nn.Parameter(w.clone()) for w in ws0]
        runs[memo] = _qkv(x, ws, g)
        fwd = [c for c in calls if c[0] == (140, 576)]
        assert len(fwd) == (1 if memo == "1" else 3) and all(t == 256 for _, t in fwd), calls
    for a, b in zip(runs["1"], runs["0"]):
        for u, v in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
            assert torch.equal(u, v)


def test_memo_is_invalidated_when_x_changes_in_place(monkeypatch):
    calls = _count_quant(monkeypatch)
    torch.manual_seed(12)
    x = torch.randn(8, 256)
    w1, w2 = torch.nn.Parameter(torch.randn(128, 256)), torch.nn.Parameter(torch.randn(128, 256))
    y1 = fp8_linear(x, w1)
    x.mul_(2.0)  # in place: the version counter moves; the memoized codes are stale
    y2 = fp8_linear(x, w2)
    assert len(calls) == 2
    fresh = fp8_linear(x.clone(), w2)  # another tensor: quantized anew
    assert len(calls) == 3 and torch.equal(y2, fresh)
    assert not torch.equal(y1, fp8_linear(x.clone(), w1))  # (the change mattered)


def test_memo_only_under_autograd_and_never_for_another_tensor(monkeypatch):
    calls = _count_quant(monkeypatch)
    x = torch.randn(8, 256)
    w = torch.nn.Parameter(torch.randn(128, 256))
    with torch.no_grad():  # rollout / eval: static buffers may be rewritten by kernels that move no version
        fp8_linear(x, w)
        fp8_linear(x, w)
    assert len(calls) == 2
    fp8_linear(x, w)
    fp8_linear(x[:], w)  # a view is another tensor object: no hit (the memo keys on identity)
    fp8_linear(x.clone(), w)
    assert len(calls) == 5
    fp8_linear(x, w)  # the slot holds the last tensor only
    assert len(calls) == 6


def test_memo_is_emptied_by_backward(monkeypatch):
    from quarl.quant import fp8_linear as fl

    calls = _count_quant(monkeypatch)
    x = torch.randn(8, 256, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(128, 256))
    fp8_linear(x, w).sum().backward()
    assert fl._X_SLOT[0] is None  # the next step's X is never served the previous step's codes
    fp8_linear(x, w)
    assert len(calls) == 3  # forward, the backward's dY, the second forward


def test_frozen_base_lora_memo_rows_only(monkeypatch):
    """LoRA on an FP8 base (no WGrad): the shared X is quantized once, rows only (no X^T)."""
    calls = _count_quant(monkeypatch)
    lin = torch.nn.Linear(256, 128, bias=False)
    wq = QuantLinear.from_linear(lin, "fp8-block", act_quant="fp8-1x128").qtensor()
    x = torch.randn(5, 256, requires_grad=True)
    ys = [fp8_linear(x, wq) for _ in range(3)]
    assert [c for c in calls] == [((5, 256), None)]
    torch.autograd.backward(ys, [torch.ones_like(y) for y in ys])
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_dgrad_tile_scales_are_kept_per_weight_version():
    from quarl.quant import fp8_linear as fl

    s = torch.rand(3, 5)
    st = fl._scales_t(s)
    assert torch.equal(st, s.t()) and st.is_contiguous() and fl._scales_t(s) is st
    s.mul_(2.0)
    assert torch.equal(fl._scales_t(s), s.t())


@needs_sm90
def test_gpu_memo_changes_no_bit(monkeypatch):
    """On cuBLAS with the fused quantizers: q/k/v on one X, memoized vs not, equal y, dX and dW bit for bit."""
    torch.manual_seed(13)
    x0 = torch.randn(3000, 3584, device="cuda", dtype=torch.bfloat16)
    ws0 = [torch.randn(n, 3584, device="cuda", dtype=torch.bfloat16) * 0.02 for n in (3584, 512, 512)]
    g = [torch.randn(3000, w.shape[0], device="cuda", dtype=torch.bfloat16) for w in ws0]
    runs = {}
    for memo in ("1", "0"):
        monkeypatch.setenv("QUARL_FP8_MEMO", memo)
        x = x0.clone().requires_grad_()
        ws = [torch.nn.Parameter(w.clone()) for w in ws0]
        ys, dx, dws = _qkv(x, ws, g)
        runs[memo] = [*ys, dx, *dws]
    assert all(torch.equal(a, b) for a, b in zip(runs["1"], runs["0"]))


def test_jetrl_model_quantizes_each_layer_input_once(monkeypatch):
    """What ``precision.mode=jetrl`` full-parameter trains (quantize_model with the Jet-RL recipe, QuantLinear
    "qat" in a Llama): per layer 4 activation quantizations in the forward (q/k/v share one, gate/up one, o,
    down) instead of 7, plus the 7 dY ones in the backward; logits and every gradient equal to the unmemoized
    model, bit for bit."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from quarl.quant import quantize_model
    from quarl.rl.precision import JETRL_RECIPE

    calls = _count_quant(monkeypatch)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ids = torch.randint(0, 256, (2, 9))
    runs = {}
    for memo in ("1", "0"):
        monkeypatch.setenv("QUARL_FP8_MEMO", memo)
        torch.manual_seed(0)
        m = LlamaForCausalLM(cfg)
        quantize_model(m, dict(JETRL_RECIPE, mode="qat"))
        calls.clear()
        logits = m(ids).logits
        logits.float().square().mean().backward()
        runs[memo] = [logits.detach()] + [p.grad for p in m.parameters() if p.grad is not None]
        assert len(calls) == (2 * (4 + 7) if memo == "1" else 2 * (7 + 7)), calls
    assert len(runs["1"]) == len(runs["0"]) > 10
    assert all(torch.equal(a, b) for a, b in zip(runs["1"], runs["0"]))


def test_shared_input_scope_quantizes_one_x_once_under_no_grad(monkeypatch):
    """``shared_input``: under no_grad (rollout) the projections reading one unchanged X share its quantization
    inside the scope -- one quantization instead of three, the same outputs -- an X changed in place inside the scope
    is quantized again (its version counter), and nothing is memoized outside a scope or left behind by one."""
    torch.manual_seed(0)
    ws = [torch.randn(n, 256) * 0.05 for n in (128, 64, 64)]
    x = torch.randn(3, 256)
    calls = []
    real = fl._quantize_x
    monkeypatch.setattr(fp8_operands, "_quantize_x", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        alone = [fl.fp8_linear(x, w) for w in ws]
        assert len(calls) == 3 and fl._X_SLOT[0] is None
        with fl.shared_input():
            shared = [fl.fp8_linear(x, w) for w in ws]
            assert len(calls) == 4
            x.mul_(2.0)
            again = fl.fp8_linear(x, ws[0])
            assert len(calls) == 5
        assert fl._X_SLOT[0] is None
    for a, b in zip(alone, shared, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(again, alone[0])
