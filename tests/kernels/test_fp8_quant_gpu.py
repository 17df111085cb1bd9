"""The fused FP8 quantizers on CUDA: bit for bit the eager PyTorch quantizers on the same GPU.

The CPU interpreter test (``test_fp8_quant_interpreter.py``) checks indexing and rounding;
this one checks what only the GPU has: the reference's ``amax * fp32(1/448)`` scale, the
correctly rounded division (``div_rn``; ``torch.compile``'s approximate one is what made
the compiled quantizers differ), the hardware E4M3 cast, and the FP8 linear on cuBLAS
with the Triton quantizers against the eager ones (same operands, same GEMM calls: equal
outputs). Shapes at 7B scale so that the rare near-ties do occur (the compiled path
missed 2 of 14.7M activation bytes there).

Run on a CUDA machine: ``pytest -q -m gpu tests/kernels/test_fp8_quant_gpu.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

from quarl.quant.formats.fp8 import quantize_act_1x128
from quarl.quant.fp8_linear import (
    _pad2,
    _round_up,
    _tiles_padded,
    fp8_linear,
    quant_backend,
    quantize_weight_128x128,
)

pytest.importorskip("triton", reason="the fused quantizers need Triton (CPU CI has none)")
from quarl_kernels import fp8_quant as fq  # after the skip: it imports Triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def same(a, b) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def ndiff(a, b) -> int:
    return int((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).sum())


@pytest.mark.parametrize("m,k,dtype", [(8192, 3584, torch.bfloat16), (4099, 576, torch.bfloat16),
                                       (1000, 18944, torch.bfloat16), (300, 640, torch.float32),
                                       (64, 4096, torch.float16), (1, 3584, torch.bfloat16)])
def test_act_quantizer_equals_eager(m, k, dtype):
    torch.manual_seed(0)
    x = (torch.randn(m, k, device="cuda") * torch.logspace(-3, 3, m, device="cuda")[:, None]).to(dtype)
    mp, mt, kp = _round_up(m, 4), _round_up(m, 128), _round_up(k, 128)
    q, s, qt, st = fq.quantize_act(x, mp, kp, mt)
    rq, rs = quantize_act_1x128(_pad2(x, mp, kp))  # eager on CUDA: the oracle
    rqt, rst = quantize_act_1x128(_pad2(x, mt, kp).t())
    assert torch.equal(s, rs) and torch.equal(st, rst)
    assert same(q, rq), f"{ndiff(q, rq)} of {q.numel()} codes differ (1x128 along K)"
    assert same(qt, rqt), f"{ndiff(qt, rqt)} of {qt.numel()} codes differ (1x128 along tokens)"
    q2, s2, _, _ = fq.quantize_act(x, mp, kp)  # the rows-only launch (other tile height)
    assert same(q2, rq) and torch.equal(s2, rs)


def test_act_quantizer_strided_and_expanded_inputs():
    torch.manual_seed(1)
    base = torch.randn(700, 4000, device="cuda", dtype=torch.bfloat16)
    for x in (base[5:605:2, 11:587], base.t()[:1000, :300], torch.randn(1, 512, device="cuda").expand(333, 512)):
        m, k = x.shape
        q, s, qt, st = fq.quantize_act(x, _round_up(m, 4), _round_up(k, 128), _round_up(m, 128))
        rq, rs = quantize_act_1x128(_pad2(x, _round_up(m, 4), _round_up(k, 128)))
        rqt, rst = quantize_act_1x128(_pad2(x, _round_up(m, 128), _round_up(k, 128)).t())
        assert same(q, rq) and torch.equal(s, rs) and same(qt, rqt) and torch.equal(st, rst)


@pytest.mark.parametrize("n,k,dtype", [(18944, 3584, torch.bfloat16), (1536, 576, torch.float32),
                                       (200, 576, torch.bfloat16), (4096, 12288, torch.bfloat16)])
def test_tile_quantizer_equals_eager(n, k, dtype):
    torch.manual_seed(2)
    w = (torch.randn(n, k, device="cuda") * 0.02).to(dtype)
    q, s, qt = fq.quantize_tiles(w, transpose=True)
    rq, rs = _tiles_padded(_pad2(w, _round_up(n, 128), _round_up(k, 128)))  # eager
    fq8, fs = quantize_weight_128x128(w)  # the fp8-block format
    assert torch.equal(s, rs) and torch.equal(s, fs)
    assert same(q, rq), f"{ndiff(q, rq)} of {q.numel()} weight codes differ"
    assert same(q[:n, :k], fq8)
    bad = (qt.view(torch.uint8) != rq.t().contiguous().view(torch.uint8)).any(dim=1).nonzero().flatten()
    # the W^T bug (ptxas, fp32 input, fixed 2026-11-25): by its SASS, rows k = 1 mod 4 -- name the rows
    assert bad.numel() == 0, f"W^T rows differ: {bad.numel()} of {qt.shape[0]}, first {bad[:8].tolist()}"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="blockwise FP8 scaled_mm needs an SM90 GPU")
@pytest.mark.parametrize("m,n,k,wdt", [(4096, 1536, 576, torch.bfloat16), (4096, 1536, 576, torch.float32),
                                        (300, 512, 640, torch.bfloat16), (2048, 18944, 3584, torch.bfloat16)])
@pytest.mark.parametrize("wgrad", ["1x128", "tiles"])
def test_fp8_linear_triton_quantizers_equal_eager(m, n, k, wdt, wgrad):
    """Forward, DGrad and WGrad on cuBLAS: Triton quantizers vs eager ones give the same bits (an fp32 master
    weight at SmolLM2's K = 576 too: full-parameter Jet-RL's DGrad reads the kernel's W^T tiles)."""
    torch.manual_seed(3)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * 0.05).to(wdt)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    outs = {}
    for backend in ("triton", "eager"):
        os.environ["QUARL_FP8_QUANT"] = backend
        try:
            assert quant_backend(x) == backend
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = fp8_linear(xx, ww, wgrad=wgrad)
            y.backward(g)
            outs[backend] = (y, xx.grad, ww.grad)
        finally:
            os.environ.pop("QUARL_FP8_QUANT", None)
    for name, a, e in zip(("y", "dx", "dw"), outs["triton"], outs["eager"]):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert torch.equal(a, e), f"{name}: max |diff| {(a.float() - e.float()).abs().max().item()}"


def test_every_launch_setting_gives_the_same_bits():
    """The run-time choice of (rows per chunk, warps[, X^T as 4-token words]) changes no bit: each candidate
    against the eager oracle, activations in both groupings (and X^T alone) and weight tiles with their transpose
    (bf16 and the fp32 W^T-bug shape)."""
    torch.manual_seed(4)
    x = (torch.randn(4099, 3584, device="cuda") * torch.logspace(-3, 3, 4099, device="cuda")[:, None]).to(torch.bfloat16)
    mp, mt, kp = _round_up(4099, 4), _round_up(4099, 128), 3584
    rq, rs = quantize_act_1x128(_pad2(x, mp, kp))
    rqt, rst = quantize_act_1x128(_pad2(x, mt, kp).t())
    tq, ts = _tiles_padded(_pad2(x, mt, kp))  # X^T's 128x128 tiles (fp8_wgrad=tiles) are these, transposed
    for setting in fq.ACT_SETTINGS:
        sub, warps, pack, split, t_chunk = fq.parse_setting(setting)
        kw = {"sub": sub, "warps": warps, "pack": pack, "split": split, "t_chunk": t_chunk}
        q, s, qt, st = fq.quantize_act(x, mp, kp, mt, **kw)
        assert same(q, rq) and same(qt, rqt) and torch.equal(s, rs) and torch.equal(st, rst), setting
        _, _, qt, st = fq.quantize_act(x, mp, kp, mt, row_groups=False, **kw)
        assert same(qt, rqt) and torch.equal(st, rst), setting
        q, s, qt, st = fq.quantize_act(x, mp, kp, mt, t_tiles=True, **kw)
        assert same(q, rq) and torch.equal(s, rs) and same(qt, tq.t()) and torch.equal(st, ts.t()), (setting, "tiles")
    for n, k, dt in ((1536, 576, torch.float32), (4096, 3584, torch.bfloat16)):
        w = (torch.randn(n, k, device="cuda") * 0.02).to(dt)
        rq, rs = _tiles_padded(_pad2(w, _round_up(n, 128), _round_up(k, 128)))
        for sub, warps in fq.TILE_SETTINGS:
            q, s, qt = fq.quantize_tiles(w, transpose=True, sub=sub, warps=warps)
            assert same(q, rq) and torch.equal(s, rs) and same(qt, rq.t()), (n, k, dt, sub, warps)


def test_launch_setting_is_chosen_by_shape_and_kept(monkeypatch):
    monkeypatch.setenv("QUARL_FP8_TUNE", "1")  # (the device script runs the other tests at the default setting)
    torch.manual_seed(5)
    x = torch.randn(3000, 2560, device="cuda", dtype=torch.bfloat16)
    keys = set(fq.TUNED)
    q, s, _, _ = fq.quantize_act(x, 3000, 2560, 3072)
    new = [k for k in fq.TUNED if k not in keys]
    assert len(new) == 1 and new[0][0] == "act" and fq.TUNED[new[0]]["best"] in fq.ACT_SETTINGS
    assert len(fq.TUNED[new[0]]["ms"]) >= 1  # the candidates that ran, with their times
    fq.quantize_act(x[:2900], 2900, 2560, 2944)  # the same class (tokens rounded up to 4096): no new tuning
    assert len(fq.TUNED) == len(keys) + 1
    rq, rs = quantize_act_1x128(x)
    assert same(q, rq) and torch.equal(s, rs)
