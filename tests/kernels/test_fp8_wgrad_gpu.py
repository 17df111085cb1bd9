"""The Triton WGrad GEMM (``quarl_kernels.fp8_wgrad``) on an SM90 GPU: every launch setting against cuBLAS's
1x128 x 1x128 ``scaled_mm`` on the same FP8 operands (the fused quantizers' outputs), and the run-time choice.

Run on a CUDA machine: ``pytest -q -m gpu tests/kernels/test_fp8_wgrad_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton WGrad needs Triton (CPU CI has none)")
from quarl_kernels import fp8_wgrad as fw  # after the skip: it imports Triton

from quarl.quant import fp8_linear as fl

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an SM90 GPU (cuBLAS's blockwise scaled_mm is the reference)"),
]


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def operands(m: int, n: int, t: int):
    """dY^T [Mp, Tp] and X^T [Np, Tp] quantized along the tokens as the FP8 linear does (outer-major scales)."""
    torch.manual_seed(9)
    dy = torch.randn(t, m, device="cuda", dtype=torch.bfloat16) * torch.logspace(-2, 2, t, device="cuda")[:, None]
    x = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    tp = -(-t // 128) * 128
    _, _, aq, sa = fl.quantize_act_gemm(dy, t, -(-m // 128) * 128, tp, row_groups=False)
    _, _, bq, sb = fl.quantize_act_gemm(x, t, -(-n // 128) * 128, tp, row_groups=False)
    return aq, sa, bq, sb


@pytest.mark.parametrize("m,n,t", [(3584, 18944, 2048), (512, 3584, 4096), (640, 576, 300)])
def test_every_setting_equals_cublas(monkeypatch, m, n, t):
    aq, sa, bq, sb = operands(m, n, t)
    monkeypatch.setenv("QUARL_FP8_WGRAD_GEMM", "cublas")
    ref = fl.blockwise_gemm(aq, sa, bq, sb, False, torch.float32)
    for setting in fw.SETTINGS:
        got = fw.wgrad_1d1d(aq, sa, bq, sb, torch.float32, setting=setting)
        assert rel(got, ref) < 1e-5, (setting, rel(got, ref))  # FP32 sums in another order only
        got = fw.wgrad_1d1d(aq, sa, bq, sb, torch.bfloat16, setting=setting)
        assert rel(got.float(), ref) < 3e-3, (setting, rel(got.float(), ref))


def test_setting_is_chosen_by_shape_and_kept(monkeypatch):
    monkeypatch.setenv("QUARL_FP8_TUNE", "1")
    aq, sa, bq, sb = operands(1024, 2048, 4096)
    keys = set(fw.TUNED)
    fw.wgrad_1d1d(aq, sa, bq, sb, torch.bfloat16)
    new = [k for k in fw.TUNED if k not in keys]
    assert len(new) == 1 and new[0][0] == "wgrad" and fw.TUNED[new[0]]["best"] in fw.SETTINGS
    assert len(fw.TUNED[new[0]]["ms"]) >= 1
    fw.wgrad_1d1d(aq, sa, bq, sb, torch.bfloat16)
    assert len(fw.TUNED) == len(keys) + 1
