"""GPU checks of the large-M path (``quarl_kernels.dense``): dequantize to a transient
BF16 weight, then cuBLAS.

* ``dense.dequantize`` against the format's own BF16 dequantize: MXFP4 bit-exact;
  NVFP4 equal except where the fp32 reciprocal of the global scale moves a BF16
  rounding (bounded at 1e-4 of the weights, each off by one BF16 ulp at most);
  INT4 within the BF16 rounding of its group scale (2**-8 relative);
* ``wo_matmul`` / ``wo_matmul_t`` at M >= the threshold take the path and match
  a float64 product; ``QUARL_KERNELS_DENSE_MIN_M=0`` sends the same call to the
  fused kernels and both agree;
* bad settings of the variable fail with a message naming the fix.

Run on a CUDA machine: ``pytest -q -m gpu tests/kernels``. Skips without CUDA.
"""

from __future__ import annotations

import pytest
import torch
from quarl_kernels.ops import _packed_weight

from quarl.quant import get_format, make_config

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
from quarl_kernels import dense, tuning, wo_gemm  # after the skip: they import Triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SPECS = ["nvfp4", "mxfp4", "int4-g128", "int4-g128-sym"]


def _q(spec: str, n: int, k: int):
    cfg = make_config(spec)
    q = get_format(cfg.name).quantize(torch.randn(n, k, device="cuda") * 0.03, cfg)
    t = q.tensors
    args = (t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), t.get("weight_global_scale"),
            cfg.name, cfg.block_size, n, k)
    return args, q


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n,k", [(520, 1024), (96, 384), (1000, 3584), (33, 640)])  # N tails, K tails of a tile
def test_dequantize_matches_reference_bf16(spec, n, k):
    torch.manual_seed(n + k)
    args, q = _q(spec, n, k)
    w = dense.dequantize(_packed_weight(*args))
    ref = q.dequantize(torch.bfloat16)
    assert w.shape == (n, k) and w.dtype == torch.bfloat16
    assert torch.isfinite(w).all()
    if spec == "mxfp4":
        assert torch.equal(w, ref)
    elif spec == "nvfp4":
        diff = w.float() != ref.float()
        assert diff.float().mean().item() <= 1e-4, diff.float().mean().item()
        ulp = ref.float().abs() * 2.0**-7  # one bf16 ulp (8 significant bits) is <= 2**-7 relative
        assert ((w.float() - ref.float()).abs() <= ulp + 1e-30).all()
    else:
        rel = ((w.float() - ref.float()).abs() / ref.float().abs().clamp_min(1e-12))
        assert rel[ref != 0].max().item() <= 2.0**-7


@pytest.mark.parametrize("spec", SPECS)
def test_large_m_forward_and_backward_take_dense_path_and_match(spec, monkeypatch):
    torch.manual_seed(0)
    n, k, m = 768, 2048, 1100
    args, q = _q(spec, n, k)
    pw = _packed_weight(*args)
    ref_w = q.dequantize(torch.float64)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    dy = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    monkeypatch.setenv("QUARL_KERNELS_DENSE_MIN_M", "1024")
    assert dense.use_dense(m) and not dense.use_dense(1023)
    y = wo_gemm.wo_matmul(x, pw)
    dx = wo_gemm.wo_matmul_t(dy, pw)
    for out, ref in ((y, x.double() @ ref_w.T), (dx, dy.double() @ ref_w)):
        assert ((out.double() - ref).norm() / ref.norm()).item() < 5e-3
    monkeypatch.setenv("QUARL_KERNELS_DENSE_MIN_M", "0")  # fused kernels for the same call
    assert not dense.use_dense(m)
    y_f = wo_gemm.wo_matmul(x, pw)
    dx_f = wo_gemm.wo_matmul_t(dy, pw)
    assert ((y.float() - y_f.float()).norm() / y_f.float().norm()).item() < 5e-3
    assert ((dx.float() - dx_f.float()).norm() / dx_f.float().norm()).item() < 5e-3


def test_op_autograd_through_dense_path(monkeypatch):
    monkeypatch.setenv("QUARL_KERNELS_DENSE_MIN_M", "64")
    torch.manual_seed(3)
    args, q = _q("nvfp4", 256, 512)
    x = torch.randn(2, 40, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # M = 80 >= 64
    y = torch.ops.quarl.wo_linear(x, *args)
    y.float().square().sum().backward()
    w = q.dequantize(torch.float64)
    ref_y = x.detach().double() @ w.T
    ref_dx = (2 * y.detach().double()) @ w
    assert ((y.double() - ref_y).norm() / ref_y.norm()).item() < 5e-3
    assert ((x.grad.double() - ref_dx).norm() / ref_dx.norm()).item() < 5e-3


@pytest.mark.parametrize("spec", ["nvfp4", "int4-g128"])
def test_checkpointed_layers_reuse_the_recompute_weight_bit_equal(spec, monkeypatch):
    """Two checkpointed QuantLinear layers (frozen base + LoRA) through ``registration.forward``: with one layer's
    weight kept (``QUARL_KERNELS_DENSE_KEEP=1``) the backward's ``dy @ W`` reuses the weight its recompute made
    (and the last layer's recompute the forward's) -- 3 decodes instead of 6 -- and every gradient is bit-equal
    to the run that keeps none; a no-grad forward keeps nothing; ``dispatch.release_transients`` empties it."""
    from quarl_kernels import recent_weights as rw
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    from quarl.quant import QuantLinear, dispatch
    from tests.lora_stacks import lora_quant_stack

    monkeypatch.setenv("QUARL_KERNELS_DENSE_MIN_M", "64")

    def run(keep: str):
        monkeypatch.setenv(rw.ENV, keep)
        rw.release()
        layers = lora_quant_stack(spec)
        x = torch.randn(96, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        h = x
        before = dict(rw.stats)
        for lay in layers:
            h = checkpoint(lambda t, lay=lay: torch.tanh(lay(t)), h, use_reentrant=False)
        h.float().square().sum().backward()
        decodes = rw.stats["misses"] - before["misses"]
        grads = [x.grad] + [p.grad for p in layers.parameters() if p.requires_grad]
        return decodes, grads

    d0, g0 = run("0")
    d1, g1 = run("1")
    assert (d0, d1) == (6, 3)
    for a, b in zip(g0, g1, strict=True):
        assert torch.equal(a, b)
    assert rw.kept() == 1
    dispatch.release_transients()
    assert rw.kept() == 0
    lay = QuantLinear.from_linear(nn.Linear(512, 512), spec).cuda().to(torch.bfloat16)
    with torch.no_grad():
        lay(torch.randn(96, 512, device="cuda", dtype=torch.bfloat16))
    assert rw.kept() == 0


@pytest.mark.parametrize("raw,msg", [("many", "not an integer"), ("-5", "negative")])
def test_bad_threshold_setting_names_the_fix(raw, msg, monkeypatch):
    monkeypatch.setenv("QUARL_KERNELS_DENSE_MIN_M", raw)
    with pytest.raises(ValueError, match=msg):
        dense.dense_min_m()


def test_tuned_configs_persist_to_disk_and_are_reused(tmp_path, monkeypatch):
    """QUARL_KERNELS_TUNE=1 times the candidates once; a fresh process (simulated by
    clearing the in-memory choice) reads the winner back from the JSON cache."""
    cache = tmp_path / "kc.json"
    monkeypatch.setenv("QUARL_KERNELS_CACHE", str(cache))
    monkeypatch.setattr(tuning, "_CHOICE", {})
    monkeypatch.setattr(tuning, "_DISK", None)
    args, q = _q("nvfp4", 512, 1024)
    pw = _packed_weight(*args)
    x = torch.randn(12, 1024, device="cuda").to(torch.bfloat16)
    wo_gemm.wo_matmul(x, pw, tune=True)
    import json

    saved = json.loads(cache.read_text())
    assert len(saved) == 1 and torch.cuda.get_device_name(0) in next(iter(saved))
    monkeypatch.setattr(tuning, "_CHOICE", {})
    monkeypatch.setattr(tuning, "_DISK", None)
    monkeypatch.setattr(tuning, "_time_ms", lambda fn, reps=20: (_ for _ in ()).throw(AssertionError("re-timed")))
    y = wo_gemm.wo_matmul(x, pw, tune=True)  # from the file: no timing
    ref = x.double() @ q.dequantize(torch.float64).T
    assert ((y.double() - ref).norm() / ref.norm()).item() < 5e-3
