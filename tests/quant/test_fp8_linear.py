"""The FP8 training linear: padding, zero blocks, gradients vs. high precision, master tiles, WGrad modes, GPU ==
emulated (its GEMM: test_fp8_gemm.py; its operands and their memo: test_fp8_operands.py)."""

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from quarl.quant import QuantLinear, fp8_operands
from quarl.quant import fp8_linear as fl
from quarl.quant.base import QuantError
from quarl.quant.formats import fp8
from quarl.quant.formats.fp8 import FORMAT, FP8Config
from quarl.quant.fp8_linear import fp8_linear, quantize_weight_128x128, quantize_weight_padded
from tests.quant.fp8_helpers import needs_sm90, rel

# Gradient tolerance vs. the FP32 layer (stated in docs/rl.md): FP8 E4M3 on both operands of every
# GEMM gives ~3-4 % relative L2 error on Gaussian data (measured 2.8 % forward, 3.7 % DGrad/WGrad).
REL_TOL = 0.06




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

    t_rows, orig = [], fl.quantize_act_gemm

    def spy(x, rows, cols, t=None, row_groups=True):
        t_rows.append(t)
        return orig(x, rows, cols, t, row_groups)

    monkeypatch.setattr(fp8_operands, "quantize_act_gemm", spy)  # the forward's quantize_input calls it there
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

