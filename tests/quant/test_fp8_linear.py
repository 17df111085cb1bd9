"""The FP8 training linear: block layouts, padding, zero blocks, gradients vs. high precision, GPU == emulated."""

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from quarl.quant import QuantLinear
from quarl.quant import fp8_linear as fl
from quarl.quant.base import QuantError
from quarl.quant.formats import fp8
from quarl.quant.formats.fp8 import FORMAT, FP8Config
from quarl.quant.fp8_linear import blockwise_gemm, fp8_linear, quantize_weight_128x128, quantize_weight_padded

# Gradient tolerance vs. the FP32 layer (stated in docs/rl.md): FP8 E4M3 on both operands of every
# GEMM gives ~3-4 % relative L2 error on Gaussian data (measured 2.8 % forward, 3.7 % DGrad/WGrad).
REL_TOL = 0.06


# the GPU tests: cuBLAS's blockwise FP8 scaled_mm and DeepGEMM's kernels are SM90 (Hopper) here
_NO_SM90 = not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0)


def needs_sm90(test):
    return pytest.mark.gpu(pytest.mark.skipif(_NO_SM90, reason="needs an SM90 GPU")(test))


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _blocksum(a, sa, b, sb, b_tiles):
    """Hand-built blockwise GEMM: per 128-wide K block, fp8 partial products times both scales."""
    m, k = a.shape
    n = b.shape[0]
    out = torch.zeros(m, n, dtype=torch.float64)
    for kb in range(k // 128):
        sl = slice(kb * 128, (kb + 1) * 128)
        part = a.double()[:, sl] @ b.double()[:, sl].t()
        s_b = sb.repeat_interleave(128, 0)[:n, kb] if b_tiles else sb[:, kb]
        out += part * sa[:, kb:kb + 1].double() * s_b.double()[None]
    return out


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


@pytest.mark.parametrize("b_tiles", [True, False])
def test_emulated_gemm_is_the_blockwise_sum(b_tiles):
    torch.manual_seed(1)
    a, sa = fp8.quantize_act_1x128(torch.randn(64, 512))
    w = torch.randn(256, 512)
    b, sb = quantize_weight_128x128(w) if b_tiles else fp8.quantize_act_1x128(w)
    y = blockwise_gemm(a, sa, b, sb, b_tiles, torch.float32)
    ref = _blocksum(a, sa, b, sb, b_tiles)
    assert (y.double() - ref).abs().max() < 1e-6 * ref.abs().max() * 512**0.5  # fp32 summation order only
    with pytest.raises(QuantError, match="multiples of 128"):
        blockwise_gemm(a[:, :200], sa, b[:, :200], sb, b_tiles, torch.float32)


def test_forward_matches_the_fp8_oracle():
    torch.manual_seed(2)
    x, w = torch.randn(16, 512), torch.randn(200, 512) * 0.02
    q = FORMAT.quantize(w, FP8Config("block"))
    torch.testing.assert_close(fp8_linear(x, w), fp8.fp8_blockwise_matmul_reference(x, q), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fp8_linear(x, q), fp8_linear(x, w), rtol=0, atol=0)  # frozen == master


def _fwd_bwd(x, w, b, g):
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = fp8_linear(x, w, b)
    y.backward(g)
    return y.detach(), x.grad, w.grad, b.grad


def test_non_multiple_of_128_is_the_zero_padded_layer():
    """SmolLM2's 576: the short last block equals explicit zero padding of every operand, bit for bit."""
    torch.manual_seed(3)
    m, n, k = 300, 200, 576
    x, w, b = torch.randn(m, k), torch.randn(n, k) * 0.05, torch.randn(n)
    g = torch.randn(m, n)
    y, dx, dw, db = _fwd_bwd(x, w, b, g)
    xp, wp, bp = F.pad(x, (0, 64)), F.pad(w, (0, 64, 0, 56)), F.pad(b, (0, 56))
    yp, dxp, dwp, dbp = _fwd_bwd(F.pad(xp, (0, 0, 0, 84)), wp, bp, F.pad(g, (0, 56, 0, 84)))
    assert y.shape == (m, n) and dx.shape == (m, k) and dw.shape == (n, k)
    assert torch.equal(y, yp[:m, :n]) and torch.equal(dx, dxp[:m, :k]) and torch.equal(dw, dwp[:n, :k])
    torch.testing.assert_close(db, dbp[:n])  # a plain sum: the extra zero rows change its order only


def test_gradients_agree_with_high_precision():
    torch.manual_seed(4)
    x, w, b = torch.randn(2, 160, 512), torch.randn(384, 512) * 0.05, torch.randn(384)
    g = torch.randn(2, 160, 384)
    y, dx, dw, db = _fwd_bwd(x, w, b, g)
    x2, w2, b2 = (t.clone().requires_grad_() for t in (x, w, b))
    y2 = F.linear(x2, w2, b2)
    y2.backward(g)
    assert y.shape == y2.shape and dx.shape == x.shape
    for got, ref in ((y, y2.detach()), (dx, x2.grad), (dw, w2.grad)):
        assert 0 < rel(got, ref) < REL_TOL
        assert F.cosine_similarity(got.flatten().double(), ref.flatten().double(), dim=0) > 0.998
    torch.testing.assert_close(db, b2.grad)  # the bias gradient is a plain sum


def test_bf16_activations_and_master_weights():
    """BF16 activations and gradients between ops, FP32 master weight: dtypes follow their inputs."""
    torch.manual_seed(5)
    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(128, 256) * 0.05).requires_grad_()
    y = fp8_linear(x, w)
    assert y.dtype == torch.bfloat16
    y.float().pow(2).sum().backward()
    assert x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
    y32 = F.linear(x.detach().float(), w.detach())
    assert rel(y.float(), y32) < REL_TOL


def test_zero_blocks_stay_zero_and_finite():
    torch.manual_seed(6)
    x, w = torch.randn(128, 256), torch.randn(256, 256)
    x[:, :128] = 0  # a zero 1x128 group in every row
    w[:128, 128:] = 0  # a zero 128x128 tile
    y, dx, dw, _ = _fwd_bwd(x, w, torch.zeros(256), torch.zeros(128, 256))
    assert torch.isfinite(y).all() and (dx == 0).all() and (dw == 0).all()  # zero upstream grad -> exact zeros
    y, dx, dw, _ = _fwd_bwd(torch.zeros(8, 256), w, torch.zeros(256), torch.randn(8, 256))
    assert (y == 0).all() and (dw == 0).all() and torch.isfinite(dx).all()


def test_weight_is_requantized_after_an_update():
    w = torch.nn.Parameter(torch.randn(128, 128))
    x = torch.randn(4, 128)
    y0 = fp8_linear(x, w)
    with torch.no_grad():
        w.mul_(2.0)  # an optimizer step: in place, the version counter moves
    torch.testing.assert_close(fp8_linear(x, w), 2 * y0)


class _DataWriter(torch.optim.Optimizer):
    """An optimizer that writes its parameters through ``.data``, as bitsandbytes' 8-bit AdamW does (its
    kernels take the storage): the parameter's version counter does not move."""

    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                p.data.mul_(2.0)


@pytest.mark.parametrize("make", [lambda p: torch.optim.AdamW(p, lr=0.5, fused=True), _DataWriter],
                         ids=["fused-adamw", "data-writer"])
def test_weight_is_requantized_after_a_step_that_moves_no_version(make):
    """torch's fused AdamW and bitsandbytes' optimizers leave ``_version`` where it was: the FP8 tiles of the
    weights before the step must not serve the next forward (session 26: they did)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(256, 256))
    x = torch.randn(8, 256)
    opt = make([w])
    fp8_linear(x, w).sum().backward()
    version = w._version
    opt.step()
    assert w._version == version  # the premise: this optimizer moved no version counter
    assert torch.equal(fp8_linear(x, w), fp8_linear(x, w.detach().clone()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bitsandbytes' optimizers run on CUDA in the rl stage")
def test_weight_is_requantized_after_a_bitsandbytes_step():
    """The rl stage's default optimizer (``optim.optimizer=adamw8bit``) with the FP8 flow: bitsandbytes' step runs
    torch's optimizer hooks. Skipped where bitsandbytes is not installed (CI); the device runs carry it."""
    bnb = pytest.importorskip("bitsandbytes")
    dev = "cuda"
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4096, 256, device=dev))
    x = torch.randn(8, 256, device=dev)
    opt = bnb.optim.AdamW8bit([w], lr=0.1)
    fp8_linear(x, w).sum().backward()
    opt.step()
    assert torch.equal(fp8_linear(x, w), fp8_linear(x, w.detach().clone()))


def test_refresh_master_tiles_updates_in_place_what_changed():
    """The engine calls refresh_master_tiles before a rollout: stale tiles are re-quantized into the same storage
    (a captured CUDA graph reads them by address), fresh ones and weights without tiles are left alone."""
    from quarl.quant.fp8_linear import _master_tiles, refresh_master_tiles

    torch.manual_seed(0)
    mod = torch.nn.Module()
    mod.a = torch.nn.Parameter(torch.randn(256, 256))
    mod.b = torch.nn.Parameter(torch.randn(128, 128))  # never through the FP8 linear: no tiles
    fp8_linear(torch.randn(4, 256), mod.a)
    q0, s0 = mod.a._quarl_fp8[1], mod.a._quarl_fp8[2]
    addr = (q0.data_ptr(), s0.data_ptr())
    assert refresh_master_tiles(mod) == 0  # fresh
    mod.a.grad = torch.randn_like(mod.a)
    torch.optim.AdamW([mod.a], lr=0.5, fused=True).step()  # moves no version counter
    assert refresh_master_tiles(mod) == 1 and not hasattr(mod.b, "_quarl_fp8")
    q, s = _master_tiles(mod.a)  # a cache hit now
    rq, rs = quantize_weight_padded(mod.a.detach().clone())
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    assert (q.data_ptr(), s.data_ptr()) == addr
    assert refresh_master_tiles(mod) == 0


def test_weights_changed_marks_tiles_stale():
    from quarl.quant.fp8_linear import weights_changed

    w = torch.nn.Parameter(torch.randn(128, 128))
    x = torch.randn(4, 128)
    y0 = fp8_linear(x, w)
    w.data.mul_(2.0)  # outside autograd's version counting and outside an optimizer
    assert torch.equal(fp8_linear(x, w), y0)  # not seen: what weights_changed() is for
    weights_changed()
    torch.testing.assert_close(fp8_linear(x, w), 2 * y0)


def test_no_grad_forward_skips_the_wgrad_operand(monkeypatch):
    """Rollout with a master weight (full-parameter Jet-RL) under no_grad: no X^T quantization, same output."""
    from quarl.quant import fp8_linear as fl

    t_rows, orig = [], fl.quantize_act_gemm

    def spy(x, rows, cols, t=None, row_groups=True):
        t_rows.append(t)
        return orig(x, rows, cols, t, row_groups)

    monkeypatch.setattr(fl, "quantize_act_gemm", spy)
    w = torch.nn.Parameter(torch.randn(128, 256))
    x = torch.randn(4, 256)
    with torch.no_grad():
        y0 = fp8_linear(x, w)
    y1 = fp8_linear(x, w)
    assert t_rows == [None, 128] and torch.equal(y0, y1.detach()) and y1.requires_grad and not y0.requires_grad


def test_quantlinear_fp8_flow_qat_and_frozen_lora():
    torch.manual_seed(7)
    lin = torch.nn.Linear(576, 192, bias=True)
    x = torch.randn(3, 5, 576, requires_grad=True)
    qat = QuantLinear.from_linear(lin, "fp8-block", mode="qat", act_quant="fp8-1x128")
    assert qat.fp8_flow
    qat(x).sum().backward()
    ref_w = lin.weight.detach().clone().requires_grad_()
    fp8_linear(x.detach(), ref_w, None).sum().backward()
    torch.testing.assert_close(qat.weight.grad, ref_w.grad)
    from quarl.quant import LoRAConfig

    frozen = QuantLinear.from_linear(lin, "fp8-block", act_quant="fp8-1x128", lora=LoRAConfig(r=4, alpha=8))
    with torch.no_grad():
        frozen.lora_B.normal_()
    frozen(x).sum().backward()
    assert frozen.lora_A.grad is not None and frozen.lora_B.grad.abs().sum() > 0
    assert not QuantLinear.from_linear(lin, "fp8-block").fp8_flow  # no activation quantizer: weight-only


@needs_sm90
def test_gpu_master_tiles_remade_in_place():
    """On CUDA a changed master weight's tiles are re-quantized into their old storage (no copy): the same bits as
    fresh tiles, the transposed tiles and scales current, and a fused AdamW step's weights are what the next forward
    runs."""
    from quarl.quant.fp8_linear import _master_tiles, _scales_t, _transposed

    torch.manual_seed(4)
    w = (torch.randn(1536, 576, device="cuda") * 0.05).to(torch.bfloat16).requires_grad_()
    q, s = _master_tiles(w)
    where = (q.data_ptr(), s.data_ptr(), _transposed(q).data_ptr())
    _scales_t(s)
    w.grad = torch.randn_like(w)
    torch.optim.AdamW([w], lr=1e-2, fused=True).step()
    q2, s2 = _master_tiles(w)
    assert (q2.data_ptr(), s2.data_ptr(), _transposed(q2).data_ptr()) == where
    rq, rs = quantize_weight_padded(w.detach().clone())
    assert torch.equal(q2.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s2, rs)
    assert torch.equal(_transposed(q2).view(torch.uint8), rq.t().contiguous().view(torch.uint8))
    assert torch.equal(_scales_t(s2), rs.t())


@needs_sm90
@pytest.mark.parametrize("m,n,bias_dtype", [(16384, 5120, torch.bfloat16), (4099, 512, torch.float32), (3, 640, None)])
def test_gpu_bias_add_is_pytorchs(m, n, bias_dtype):
    """add_bias on CUDA (the epilogue pass in place) gives PyTorch's ``y + bias.to(y.dtype)`` bit for bit; a
    non-contiguous y takes PyTorch's add."""
    from quarl.quant.fp8_linear import add_bias

    torch.manual_seed(3)
    y = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=bias_dtype or torch.bfloat16) * 4
    want = y + b.to(y.dtype)
    assert torch.equal(add_bias(y.clone(), b), want)
    wide = torch.randn(m, n + 128, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(add_bias(wide[:, :n], b), wide[:, :n] + b.to(y.dtype))


@needs_sm90
@pytest.mark.parametrize("m,n,k", [(4096, 1536, 576), (300, 512, 640), (1024, 384, 1024)])
def test_gpu_path_equals_emulated(m, n, k):
    """cuBLAS blockwise GEMMs (forward, DGrad, WGrad) == the emulated FP32 path up to summation order."""
    torch.manual_seed(8)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda") * 0.05
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    # the compiled quantizers (the CUDA default) vs the eager ones: scales exact; codes equal but for
    # rare near-ties of the division (measured on the H100: 2 of 14.7M activation bytes, 10 of 68M
    # weight bytes), each one E4M3 step apart
    qc, sc = torch.compile(fp8.quantize_act_1x128, dynamic=True)(x.t())
    qe, se = fp8.quantize_act_1x128(x.t())
    qw, sw = quantize_weight_padded(w)
    qr, sr = quantize_weight_128x128(w)
    assert torch.equal(sc, se) and torch.equal(sw, sr)
    for a, b in ((qc.contiguous(), qe.contiguous()), (qw[:n, :k], qr)):
        diff = a.view(torch.uint8) != b.view(torch.uint8)
        assert diff.float().mean() < 1e-6
        assert ((a.float() - b.float()).abs()[diff] <= b.float().abs()[diff] / 8 + 2**-9).all()  # one step
    outs = {}
    for mode in ("auto", "emulate"):
        os.environ["QUARL_FP8_GEMM"] = mode
        try:
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = fp8_linear(xx, ww)
            y.backward(g)
            outs[mode] = (y.float(), xx.grad.float(), ww.grad.float())
        finally:
            os.environ.pop("QUARL_FP8_GEMM", None)
    for a, e in zip(outs["auto"], outs["emulate"]):
        # bf16 outputs: one bf16 rounding of an fp32 sum that differs by summation order
        assert rel(a, e) < 5e-3, rel(a, e)


# --- one activation quantized once (q/k/v and gate/up read the same X) ----------------------------------------
def _count_quant(monkeypatch):
    from quarl.quant import fp8_linear as fl

    calls, orig = [], fl.quantize_act_gemm

    def spy(x, rows, cols, t=None, row_groups=True):
        calls.append((tuple(x.shape), t))
        return orig(x, rows, cols, t, row_groups)

    monkeypatch.setattr(fl, "quantize_act_gemm", spy)
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


# --- the GEMM library (QUARL_FP8_GEMM) -----------------------------------------------------------------------
def test_gemm_backend_names_and_errors(monkeypatch):
    from quarl.quant import fp8_linear as fl

    for have_dg in (False, True):  # auto: DeepGEMM where it imports (the same bits), else cuBLAS
        monkeypatch.setattr(fl, "deepgemm_available", lambda have=have_dg: have)
        auto = "deepgemm" if have_dg else "cublas"
        for raw, want in (("", auto), ("auto", auto), ("cuBLAS", "cublas"), (" deepgemm ", "deepgemm"),
                          ("emulate", "emulate")):
            monkeypatch.setenv("QUARL_FP8_GEMM", raw)
            assert fl.gemm_backend() == want, (raw, have_dg)
    monkeypatch.setenv("QUARL_FP8_GEMM", "cutlass")
    with pytest.raises(QuantError, match="QUARL_FP8_GEMM='cutlass'.*auto, cublas, deepgemm, emulate"):
        fl.gemm_backend()


def test_deepgemm_missing_is_a_clear_error(monkeypatch):
    import sys

    from quarl.quant import fp8_linear as fl

    fl._deep_gemm.cache_clear()
    fl.deepgemm_available.cache_clear()
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # import deep_gemm raises ImportError
    try:
        assert not fl.deepgemm_available()  # so auto is cuBLAS
        with pytest.raises(QuantError, match="needs the deep_gemm package.*unset QUARL_FP8_GEMM"):
            fl._deep_gemm()
    finally:
        fl._deep_gemm.cache_clear()
        fl.deepgemm_available.cache_clear()


def test_deepgemm_off_hopper_is_the_emulated_gemm(monkeypatch):
    """Off SM90 (here: CPU) the deepgemm setting takes the emulated path, as cublas does: same numbers."""
    torch.manual_seed(3)
    x, w = torch.randn(64, 256), torch.randn(128, 256) * 0.05
    outs = []
    for mode in ("emulate", "deepgemm"):
        monkeypatch.setenv("QUARL_FP8_GEMM", mode)
        outs.append(fp8_linear(x, w))
    assert torch.equal(outs[0], outs[1])


@needs_sm90
@pytest.mark.parametrize("m,n,k", [(1024, 4608, 3584), (300, 512, 640), (4099, 1536, 576), (77, 576, 1536)])
@pytest.mark.parametrize("wgrad", ["1x128", "tiles"])
def test_gpu_deepgemm_equals_cublas(monkeypatch, m, n, k, wgrad):
    """DeepGEMM's 1D2D kernel (forward, DGrad, X^T-tiles WGrad) on the same FP8 operands as cuBLAS's: the FP32
    sums in the same 128-K blocks give the same BF16 outputs (measured bit-identical on an H200); the 1x128 x 1x128
    WGrad stays on cuBLAS. SmolLM2-like shapes (K = 576, odd token counts) included: a shape DeepGEMM refuses
    falls back to cuBLAS with a warning, recorded in ``DEEPGEMM_FALLBACKS`` (printed here)."""
    pytest.importorskip("deep_gemm")
    from quarl.quant import fp8_linear as fl

    torch.manual_seed(4)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    outs = {}
    for mode in ("cublas", "deepgemm"):
        monkeypatch.setenv("QUARL_FP8_GEMM", mode)
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fp8_linear(xx, ww, wgrad=wgrad)
        y.backward(g)
        outs[mode] = (y, xx.grad, ww.grad)
    print("DeepGEMM fallbacks:", fl.DEEPGEMM_FALLBACKS)
    for a, b in zip(outs["deepgemm"], outs["cublas"]):
        assert rel(a.float(), b.float()) < 1e-3, rel(a.float(), b.float())


# --- WGrad with X^T in 128x128 tiles (opt-in) ------------------------------------------------------------------
def test_wgrad_tiles_is_the_tiled_x_product_and_changes_only_dw():
    """``wgrad="tiles"``: y and dX are the default's bit for bit; dW is dY^T (1x128 along the tokens) times X^T
    quantized in 128x128 tiles, computed here from the format's own quantizers; it stays close to FP32."""
    from quarl.quant.fp8_linear import _pad2, _tiles_padded

    torch.manual_seed(6)
    m, n, k = 300, 384, 576  # neither M nor K a multiple of 128
    x, w, g = torch.randn(m, k), torch.randn(n, k) * 0.05, torch.randn(m, n)
    x[:, 7] *= 40.0  # an outlier channel: where tiles are coarser than 1x128 groups
    outs = {}
    for mode in ("1x128", "tiles"):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fp8_linear(xx, ww, wgrad=mode)
        y.backward(g)
        outs[mode] = (y.detach(), xx.grad, ww.grad)
    assert torch.equal(outs["tiles"][0], outs["1x128"][0]) and torch.equal(outs["tiles"][1], outs["1x128"][1])
    mt, kp, np_ = 384, 640, 384
    qg, sg = fp8.quantize_act_1x128(_pad2(g, mt, np_).t())  # dY^T [Np, Mt], 1x128 along the tokens
    qx, sx = _tiles_padded(_pad2(x, mt, kp))  # X [Mt, Kp] in 128x128 tiles
    xt = (qx.float() * sx.repeat_interleave(128, 0).repeat_interleave(128, 1)).t()  # X^T dequantized [Kp, Mt]
    want = (fp8.dequantize_act_1x128(qg, sg) @ xt.t())[:n, :k]
    torch.testing.assert_close(outs["tiles"][2], want, rtol=1e-5, atol=1e-5)
    ref = g.t() @ x
    e_tiles, e_spec = rel(outs["tiles"][2], ref), rel(outs["1x128"][2], ref)
    assert e_spec < e_tiles < REL_TOL, (e_spec, e_tiles)  # coarser, still within the FP8 bound


def test_wgrad_mode_is_checked():
    with pytest.raises(QuantError, match="wgrad must be one of"):
        fp8_linear(torch.randn(4, 128), torch.randn(128, 128), wgrad="128x1")


@needs_sm90
def test_gpu_wgrad_tiles_equals_emulated(monkeypatch):
    torch.manual_seed(7)
    x = torch.randn(1000, 640, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(512, 640, device="cuda") * 0.05).to(torch.bfloat16)
    g = torch.randn(1000, 512, device="cuda", dtype=torch.bfloat16)
    modes = ["emulate", "cublas"] + (["deepgemm"] if importlib.util.find_spec("deep_gemm") else [])
    grads = {}
    for mode in modes:
        monkeypatch.setenv("QUARL_FP8_GEMM", mode)
        ww = w.clone().requires_grad_()
        fp8_linear(x, ww, wgrad="tiles").backward(g)
        grads[mode] = ww.grad.float()
    for mode in modes[1:]:
        assert rel(grads[mode], grads["emulate"]) < 5e-3, (mode, rel(grads[mode], grads["emulate"]))


def test_deepgemm_refusal_falls_back_to_cublas_once(monkeypatch):
    """A GEMM DeepGEMM refuses runs on cuBLAS with one warning, and is not offered to DeepGEMM again."""
    from quarl.quant import fp8_linear as fl

    calls = []

    def refuse(*args):
        calls.append(1)
        raise RuntimeError("Assertion error: n % 64 == 0")

    monkeypatch.setenv("QUARL_FP8_GEMM", "deepgemm")
    monkeypatch.setenv("QUARL_FP8_GEMV", "0")  # 8 rows would go to the decode GEMV (quarl_kernels.fp8_gemv) first
    monkeypatch.setattr(fl, "_cublas_ok", lambda t: True)
    monkeypatch.setattr(fl, "_deepgemm", refuse)
    monkeypatch.setattr(fl.F, "scaled_mm", lambda a, b, sa, ta, sb, tb, output_dtype: "cublas", raising=False)
    monkeypatch.setattr(fl, "DEEPGEMM_FALLBACKS", {})
    a, b = torch.zeros(8, 128, dtype=torch.float8_e4m3fn), torch.zeros(16, 128, dtype=torch.float8_e4m3fn)
    sa, sb = torch.ones(8, 1), torch.ones(1, 1)
    with pytest.warns(RuntimeWarning, match="DeepGEMM refused the FP8 GEMM.*n % 64 == 0; using cuBLAS"):
        assert fl.blockwise_gemm(a, sa, b, sb, True, torch.bfloat16) == "cublas"
    assert fl.blockwise_gemm(a, sa, b, sb, True, torch.bfloat16) == "cublas" and len(calls) == 1
    assert fl.DEEPGEMM_FALLBACKS == {((8, 128), (16, 128)): "Assertion error: n % 64 == 0"}


def test_shared_input_scope_quantizes_one_x_once_under_no_grad(monkeypatch):
    """``shared_input``: under no_grad (rollout) the projections reading one unchanged X share its quantization
    inside the scope -- one quantization instead of three, the same outputs -- an X changed in place inside the scope
    is quantized again (its version counter), and nothing is memoized outside a scope or left behind by one."""
    torch.manual_seed(0)
    ws = [torch.randn(n, 256) * 0.05 for n in (128, 64, 64)]
    x = torch.randn(3, 256)
    calls = []
    real = fl._quantize_x
    monkeypatch.setattr(fl, "_quantize_x", lambda *a: calls.append(1) or real(*a))
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
