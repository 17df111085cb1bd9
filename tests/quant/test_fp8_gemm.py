"""The blockwise FP8 GEMM (``quarl.quant.fp8_gemm``): the emulated path is the blockwise sum, the backends' names
and errors, DeepGEMM against cuBLAS, a refused shape's fallback, the bias epilogue."""


import pytest
import torch

from quarl.quant import fp8_gemm
from quarl.quant.base import QuantError
from quarl.quant.formats import fp8
from quarl.quant.fp8_gemm import add_bias, blockwise_gemm
from quarl.quant.fp8_linear import fp8_linear, quantize_weight_128x128
from tests.quant.fp8_helpers import needs_sm90, rel


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


@needs_sm90
@pytest.mark.parametrize("m,n,bias_dtype", [(16384, 5120, torch.bfloat16), (4099, 512, torch.float32), (3, 640, None)])
def test_gpu_bias_add_is_pytorchs(m, n, bias_dtype):
    """add_bias on CUDA (the epilogue pass in place) gives PyTorch's ``y + bias.to(y.dtype)`` bit for bit; a
    non-contiguous y takes PyTorch's add."""

    torch.manual_seed(3)
    y = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=bias_dtype or torch.bfloat16) * 4
    want = y + b.to(y.dtype)
    assert torch.equal(add_bias(y.clone(), b), want)
    wide = torch.randn(m, n + 128, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(add_bias(wide[:, :n], b), wide[:, :n] + b.to(y.dtype))


# --- the GEMM library (QUARL_FP8_GEMM) -----------------------------------------------------------------------
def test_gemm_backend_names_and_errors(monkeypatch):

    for have_dg in (False, True):  # auto: DeepGEMM where it imports (the same bits), else cuBLAS
        monkeypatch.setattr(fp8_gemm, "deepgemm_available", lambda have=have_dg: have)
        auto = "deepgemm" if have_dg else "cublas"
        for raw, want in (("", auto), ("auto", auto), ("cuBLAS", "cublas"), (" deepgemm ", "deepgemm"),
                          ("emulate", "emulate")):
            monkeypatch.setenv("QUARL_FP8_GEMM", raw)
            assert fp8_gemm.gemm_backend() == want, (raw, have_dg)
    monkeypatch.setenv("QUARL_FP8_GEMM", "cutlass")
    with pytest.raises(QuantError, match="QUARL_FP8_GEMM='cutlass'.*auto, cublas, deepgemm, emulate"):
        fp8_gemm.gemm_backend()


def test_deepgemm_missing_is_a_clear_error(monkeypatch):
    import sys


    fp8_gemm._deep_gemm.cache_clear()
    fp8_gemm.deepgemm_available.cache_clear()
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # import deep_gemm raises ImportError
    try:
        assert not fp8_gemm.deepgemm_available()  # so auto is cuBLAS
        with pytest.raises(QuantError, match="needs the deep_gemm package.*unset QUARL_FP8_GEMM"):
            fp8_gemm._deep_gemm()
    finally:
        fp8_gemm._deep_gemm.cache_clear()
        fp8_gemm.deepgemm_available.cache_clear()


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
    print("DeepGEMM fallbacks:", fp8_gemm.DEEPGEMM_FALLBACKS)
    for a, b in zip(outs["deepgemm"], outs["cublas"]):
        assert rel(a.float(), b.float()) < 1e-3, rel(a.float(), b.float())


def test_deepgemm_refusal_falls_back_to_cublas_once(monkeypatch):
    """A GEMM DeepGEMM refuses runs on cuBLAS with one warning, and is not offered to DeepGEMM again."""

    calls = []

    def refuse(*args):
        calls.append(1)
        raise RuntimeError("Assertion error: n % 64 == 0")

    monkeypatch.setenv("QUARL_FP8_GEMM", "deepgemm")
    monkeypatch.setenv("QUARL_FP8_GEMV", "0")  # 8 rows would go to the decode GEMV (quarl_kernels.fp8_gemv) first
    monkeypatch.setattr(fp8_gemm, "_cublas_ok", lambda t: True)
    monkeypatch.setattr(fp8_gemm, "_deepgemm", refuse)
    monkeypatch.setattr(fp8_gemm.F, "scaled_mm", lambda a, b, sa, ta, sb, tb, output_dtype: "cublas", raising=False)
    monkeypatch.setattr(fp8_gemm, "DEEPGEMM_FALLBACKS", {})
    a, b = torch.zeros(8, 128, dtype=torch.float8_e4m3fn), torch.zeros(16, 128, dtype=torch.float8_e4m3fn)
    sa, sb = torch.ones(8, 1), torch.ones(1, 1)
    with pytest.warns(RuntimeWarning, match="DeepGEMM refused the FP8 GEMM.*n % 64 == 0; using cuBLAS"):
        assert fp8_gemm.blockwise_gemm(a, sa, b, sb, True, torch.bfloat16) == "cublas"
    assert fp8_gemm.blockwise_gemm(a, sa, b, sb, True, torch.bfloat16) == "cublas" and len(calls) == 1
    assert fp8_gemm.DEEPGEMM_FALLBACKS == {((8, 128), (16, 128)): "Assertion error: n % 64 == 0"}
