"""GPU checks of the opt-in FP8 large-M path (``quarl_kernels.dense_fp8``, ``QUARL_KERNELS_DENSE_FP8=1``).

* ``expand`` on the GPU gives the codes the Triton interpreter gives on CPU (a PyTorch reference from the packed
  tensors: the exact FP4 value x block scale, a power-of-two tile scale, one RNE rounding to E4M3), both
  orientations, N / K tails padded with zero codes; tile scales within one fp32 ulp (the GPU's division);
* ``matmul`` / ``matmul_t`` on cuBLAS's blockwise FP8 GEMM equal the emulated FP32 product of the same FP8
  operands (summation order only) and the float64 product of the packed weight within the FP8 error;
* ``wo_matmul`` / ``wo_matmul_t`` at M >= the dense threshold take it only when switched on.

Run on a CUDA machine: ``pytest -q -m gpu tests/kernels``. Skips without CUDA.
"""

from __future__ import annotations

import pytest
import torch
from quarl_kernels.ops import _packed_weight

from quarl.quant import get_format, make_config
from quarl.quant.formats.fp4 import decode_e2m1, unpack_fp4
from quarl.quant.formats.mxfp4 import e8m0_to_float

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
from quarl_kernels import dense, dense_fp8, wo_gemm  # after the skip: they import Triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _weight(spec: str, n: int, k: int):
    cfg = make_config(spec)
    t = get_format(cfg.name).quantize(torch.randn(n, k, device="cuda") * 0.03, cfg).tensors
    pw = _packed_weight(t["weight_packed"], t["weight_scale"], None, t.get("weight_global_scale"), cfg.name,
                        cfg.block_size, n, k)
    vals = decode_e2m1(unpack_fp4(t["weight_packed"])).reshape(n, k // cfg.block_size, cfg.block_size)
    s = t["weight_scale"].float() if spec == "nvfp4" else e8m0_to_float(t["weight_scale"])
    exact = (vals * s[..., None]).reshape(n, k).double()  # FP4 value x block scale, exact
    w64 = exact / t["weight_global_scale"].double() if spec == "nvfp4" else exact
    return pw, exact, w64, s


def _reference_codes(v: torch.Tensor, bs: torch.Tensor):
    """The codes and tile exponents; the exponent from 6 x the tile's largest block scale ``bs`` (what the kernel
    reads: the tile's amax for NVFP4, a bound for MXFP4)."""
    n, k = v.shape
    np_, kp = -(-n // 128) * 128, -(-k // 128) * 128
    vp = torch.zeros(np_, kp, dtype=torch.float64, device=v.device)
    vp[:n, :k] = v
    tiles = vp.reshape(np_ // 128, 128, kp // 128, 128)
    sp = torch.zeros(np_, kp, dtype=torch.float64, device=v.device)
    sp[:n, :k] = bs.double().repeat_interleave(k // bs.shape[1], dim=1)
    amax = 6 * sp.reshape(np_ // 128, 128, kp // 128, 128).amax(dim=(1, 3))
    e = torch.floor(torch.log2(amax.clamp_min(1e-300))) - 8
    e = torch.where(torch.ldexp(amax, -e) > 448, e + 1, e)
    e = torch.where(amax == 0, torch.zeros_like(e), e)
    return torch.ldexp(tiles, -e[:, None, :, None]).to(torch.float8_e4m3fn).reshape(np_, kp), e


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("n,k", [(200, 320), (3584, 3584), (1000, 18944)])
def test_expand_matches_reference(spec, n, k):
    torch.manual_seed(n + k)
    pw, exact, w64, bs = _weight(spec, n, k)
    codes, e = _reference_codes(exact, bs)
    q, s = dense_fp8.expand(pw)
    qt, st = dense_fp8.expand(pw, transpose=True)
    assert torch.equal(q.float(), codes.float())
    assert torch.equal(qt.float(), codes.t().float())
    assert torch.equal(st, s.t())
    scale_ref = torch.ldexp(torch.ones_like(e), e) * (w64.abs().sum() / exact.abs().sum())  # 2**e * F
    assert torch.allclose(s.double(), scale_ref, rtol=3e-7, atol=0)


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4"])
def test_gemms_match_emulation_and_reference(spec, monkeypatch):
    torch.manual_seed(1)
    n, k, m = 768, 2048, 1100
    pw, _, w64, _ = _weight(spec, n, k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    dy = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    y, dx = dense_fp8.matmul(x, pw), dense_fp8.matmul_t(dy, pw)
    monkeypatch.setenv("QUARL_FP8_GEMM", "emulate")
    y_e, dx_e = dense_fp8.matmul(x, pw), dense_fp8.matmul_t(dy, pw)
    monkeypatch.delenv("QUARL_FP8_GEMM")
    for out, emu, ref in ((y, y_e, x.double() @ w64.T), (dx, dx_e, dy.double() @ w64)):
        assert ((out.double() - emu.double()).norm() / emu.double().norm()).item() < 5e-3  # bf16 output rounding
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert 1e-3 < err < 0.06, err


def test_wo_matmul_routes_by_switch(monkeypatch):
    torch.manual_seed(2)
    n, k, m = 512, 1024, 1024
    pw, *_ = _weight("nvfp4", n, k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    dy = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    monkeypatch.setenv("QUARL_KERNELS_DENSE_MIN_M", "256")
    monkeypatch.setenv("QUARL_KERNELS_DENSE_FP8", "1")
    monkeypatch.setenv("QUARL_KERNELS_DENSE_FP8_MIN_GFLOP", "1")  # this 1.07 GFLOP GEMM goes FP8
    assert torch.equal(wo_gemm.wo_matmul(x, pw), dense_fp8.matmul(x, pw))
    assert torch.equal(wo_gemm.wo_matmul_t(dy, pw), dense_fp8.matmul_t(dy, pw))
    monkeypatch.setenv("QUARL_KERNELS_DENSE_FP8_MIN_GFLOP", "2")  # ... and not above its size
    assert torch.equal(wo_gemm.wo_matmul(x, pw), x @ dense.dequantize(pw).T)
    monkeypatch.setenv("QUARL_KERNELS_DENSE_FP8", "0")
    monkeypatch.setenv("QUARL_KERNELS_DENSE_FP8_MIN_GFLOP", "0")
    assert torch.equal(wo_gemm.wo_matmul(x, pw), x @ dense.dequantize(pw).T)
