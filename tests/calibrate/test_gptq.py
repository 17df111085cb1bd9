"""GPTQ numerics: equals RTN where it must, beats it where it should, matches a textbook reference."""

import pytest
import torch

from quarl.calibrate.gptq import HessianAccumulator, gptq_quantize, group_size, relative_error
from quarl.quant import QuantError, get_format, make_config
from quarl.quant.pack import pack_qtensor

ALL_FORMATS = ["nvfp4", "mxfp4", "nf4", "nf4-dq", "int4-g128", "int3-g128", "int2-g128", "int8-g128",
               "int4-g128-sym", "fp8", "fp8-block"]  # fmt: skip


def _tensors_equal(a: dict, b: dict) -> bool:
    def raw(t):
        return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t

    return a.keys() == b.keys() and all(torch.equal(raw(a[k]), raw(b[k])) for k in a)


def correlated_hessian(k: int, tokens: int = 4096, rank: int = 32, seed: int = 0) -> torch.Tensor:
    """H = 2 X X^T / n for inputs with strongly correlated channels (low rank + noise), like LLM activations."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, rank, generator=g) @ torch.randn(rank, k, generator=g)
    x = x + 0.1 * torch.randn(tokens, k, generator=g)
    acc = HessianAccumulator(k)
    acc.add(x)
    return acc.H


@pytest.fixture(scope="module")
def weight():
    return torch.randn(128, 256, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("spec", ALL_FORMATS)
@pytest.mark.parametrize("act_order", [False, True])
def test_identity_hessian_is_exactly_rtn(spec, act_order, weight):
    """With H = I no error is propagated, and scales come from unchanged weights: GPTQ == RTN, byte for byte."""
    cfg = make_config(spec)
    fmt = get_format(cfg.name)
    r = gptq_quantize(weight, torch.eye(weight.shape[1]), cfg, act_order=act_order)
    ref = fmt.quantize(weight, cfg)
    assert torch.equal(r.q, fmt.dequantize(ref))
    assert _tensors_equal(r.qtensor.tensors, ref.tensors)


@pytest.mark.parametrize("spec", ["int4-g128", "int3-g128", "nvfp4", "mxfp4", "nf4", "int2-g128", "fp8-block"])
def test_gptq_beats_rtn_on_correlated_inputs(spec, weight):
    cfg = make_config(spec)
    fmt = get_format(cfg.name)
    H = correlated_hessian(weight.shape[1])
    rtn = relative_error(weight, fmt.dequantize(fmt.quantize(weight, cfg)), H)
    for act_order in (False, True):
        r = gptq_quantize(weight, H, cfg, act_order=act_order)
        err = relative_error(weight, r.q, H)
        # on such inputs GPTQ removes most of the output error (typically 5-20x)
        assert err < 0.5 * rtn, (spec, act_order, err, rtn)
        # and what it returns is exactly what the packed weight decodes to
        assert torch.equal(r.qtensor.dequantize(), r.q)


def _reference_gptq_int(w, H, cfg, percdamp=0.01):
    """Textbook OBS/GPTQ, no blocking, no Cholesky: quantize column i, then
    W[:, j>i] -= (w_i - q_i) / [H^-1]_ii * [H^-1]_{i, j>i} and drop i from H^-1 by a Schur complement."""
    fmt = get_format("int")
    W = w.double().clone()
    H = H.double().clone()
    H += percdamp * torch.mean(torch.diag(H)) * torch.eye(H.shape[0], dtype=H.dtype)
    Hinv = torch.linalg.inv(H)
    _n, k = W.shape
    Q = torch.zeros_like(W)
    g = cfg.group_size
    for i in range(k):
        if i % g == 0:
            scales = fmt.block_scales(W[:, i : i + g].float(), cfg, {})
        q = fmt.qdq_with_scales(W[:, i : i + 1].float(), scales, cfg, {}).double()
        Q[:, i : i + 1] = q
        err = (W[:, i : i + 1] - q) / Hinv[i, i]
        W[:, i + 1 :] -= err @ Hinv[i : i + 1, i + 1 :]
        Hinv[i + 1 :, i + 1 :] -= Hinv[i + 1 :, i : i + 1] @ Hinv[i : i + 1, i + 1 :] / Hinv[i, i]
    return Q.float()


def test_blocked_cholesky_gptq_matches_textbook_reference():
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    H = correlated_hessian(256, tokens=2048, rank=48)
    cfg = make_config("int4-g64")
    ref = _reference_gptq_int(w, H, cfg)
    for bs in (128, 32, 256):
        q = gptq_quantize(w, H, cfg, block_size=bs, act_order=False).q
        # same algorithm, different float order: scales differ in the last bits (so values by ~1 ulp);
        # a different code (an actual rounding decision) would differ by a whole step (~0.1 here)
        flips = ((q - ref).abs() > 1e-4).float().mean().item()
        assert flips < 1e-3, (bs, flips)
        assert relative_error(w, q, H) == pytest.approx(relative_error(w, ref, H), rel=0.02)


def test_dead_columns_are_zeroed_and_everything_stays_finite(weight):
    H = correlated_hessian(weight.shape[1])
    dead = torch.tensor([0, 5, 77, 200])
    H[dead, :] = 0
    H[:, dead] = 0
    for spec in ("nvfp4", "int4-g128"):
        r = gptq_quantize(weight, H, make_config(spec), act_order=True)
        assert torch.isfinite(r.q).all()
        assert (r.q[:, dead] == 0).all()


def test_shared_state_is_used_and_not_mutated(weight):
    """Fused q/k/v shards pass one NVFP4 global scale; NF4-dq's cursor state is copied, not consumed."""
    cfg = make_config("nvfp4")
    st = get_format("nvfp4").tensor_state(weight * 3, cfg)  # as if another shard had a larger amax
    r = gptq_quantize(weight, correlated_hessian(256), cfg, state=st)
    assert torch.equal(r.qtensor.tensors["weight_global_scale"], st["global_scale"])
    dq = make_config("nf4-dq")
    st = get_format("nf4").tensor_state(weight, dq)
    gptq_quantize(weight, correlated_hessian(256), dq, state=st)
    assert st["next_group"] == 0


def test_hessian_accumulator_is_a_running_mean_over_batches():
    x = torch.randn(3, 50, 16)
    acc = HessianAccumulator(16)
    for xi in x:
        acc.add(xi)
    flat = x.reshape(-1, 16)
    torch.testing.assert_close(acc.H, 2 * flat.t() @ flat / flat.shape[0], rtol=1e-5, atol=1e-5)
    w, w_hat = torch.randn(8, 16), torch.randn(8, 16)
    direct = ((flat @ (w - w_hat).t()) ** 2).sum() / ((flat @ w.t()) ** 2).sum()
    assert relative_error(w, w_hat, acc.H) == pytest.approx(float(direct), rel=1e-4)


def test_fp8_per_tensor_is_one_group_and_bad_shapes_are_refused(weight):
    assert group_size(make_config("fp8"), 256) == 256
    assert group_size(make_config("fp8-block"), 256) == 128
    with pytest.raises(QuantError, match="multiple of the block size"):
        gptq_quantize(torch.randn(8, 96), torch.eye(96), make_config("int4-g128"))
    with pytest.raises(QuantError, match="do not match"):
        gptq_quantize(weight, torch.eye(10), make_config("nvfp4"))


def test_pack_refuses_values_off_the_grid(weight):
    cfg = make_config("int4-g128")
    fmt = get_format("int")
    scales = [fmt.block_scales(weight[:, i : i + 128], cfg, {}) for i in (0, 128)]
    with pytest.raises(QuantError, match="not exact"):
        pack_qtensor(cfg, weight, scales, {})  # the raw weight is not on the int4 grid
