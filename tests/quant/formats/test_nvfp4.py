"""NVFP4: byte-identical to compressed-tensors' nvfp4-pack-quantized compressor,
plus accuracy, STE, GPTQ-hook consistency, fused-shard global scale and input checks."""

import pytest
import torch

from quarl.quant.base import QTensor, QuantError, get_format
from quarl.quant.formats.fp4 import E2M1_VALUES
from quarl.quant.formats.nvfp4 import NVFP4_FORMAT as F
from quarl.quant.formats.nvfp4 import NVFP4Config, shared_global_state
from quarl.quant.spec import make_config, spec_string
from tests.quant.formats._fp4_ct_reference import bits_equal, ct_compress, sqnr_db

CFG = NVFP4Config()


def _weight(seed: int, n: int = 64, k: int = 256, std: float = 0.02) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * std


def _awkward_weight(seed: int) -> torch.Tensor:
    """Gaussian weights plus the corner cases: a zero block, a block whose E4M3
    scale underflows, an outlier, and a block that hits every E2M1 tie exactly."""
    w = _weight(seed)
    w[0, :16] = 0.0
    w[1, 16:32] = 1e-9
    # outlier = tensor amax = 2688 * 2**-14, so the global scale is exactly 2**14 ...
    w[2, 5] = 2688 * 2**-14
    # ... and a block with amax 6 * 2**-10 gets E4M3 scale 16, divisor 2**-10 exactly
    w[3, :16] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 2) * 2**-10
    w[3, 8:16] *= -1
    w[4, 32:48] = -w[4, 32:48].abs()
    return w


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bytes_match_compressed_tensors(seed):
    w = _awkward_weight(seed)
    ref, _, fmt = ct_compress(w, "NVFP4A16")
    assert fmt == "nvfp4-pack-quantized"
    q = F.quantize(w, CFG)
    assert set(q.tensors) == set(ref) == {"weight_packed", "weight_scale", "weight_global_scale"}
    for name in ref:
        assert bits_equal(q.tensors[name], ref[name]), name


def test_bytes_match_compressed_tensors_wide_dynamic_range():
    # log-normal magnitudes span many E4M3 binades of block scale
    g = torch.Generator().manual_seed(3)
    w = torch.randn(32, 512, generator=g) * torch.exp(torch.randn(32, 512, generator=g) * 3)
    ref, _, _ = ct_compress(w, "NVFP4A16")
    q = F.quantize(w, CFG)
    assert all(bits_equal(q.tensors[k], ref[k]) for k in ref)


def test_dequantize_matches_compressed_tensors_decompression():
    w = _awkward_weight(4)
    _, ref_deq, _ = ct_compress(w, "NVFP4A16")
    q = F.quantize(w, CFG)
    # compressed-tensors decompresses to bf16 (fp32 math, one final cast)
    assert bits_equal(F.dequantize(q, torch.bfloat16), ref_deq)
    assert torch.equal(F.dequantize(q, torch.float32).bfloat16(), ref_deq)
    assert torch.equal(q.dequantize(torch.bfloat16), ref_deq)


def test_bf16_weights_quantize_as_their_fp32_upcast():
    w = _weight(5).bfloat16()
    a, b = F.quantize(w, CFG), F.quantize(w.float(), CFG)
    assert all(bits_equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert F.fake_quant(w, CFG).dtype == torch.bfloat16


def test_layout_names_dtypes_shapes():
    q = F.quantize(_weight(6, n=48, k=320), CFG)
    t = q.tensors
    assert q.shape == (48, 320) and q.config == CFG
    assert t["weight_packed"].dtype == torch.uint8 and t["weight_packed"].shape == (48, 160)
    assert t["weight_scale"].dtype == torch.float8_e4m3fn and t["weight_scale"].shape == (48, 20)
    assert t["weight_global_scale"].dtype == torch.float32 and t["weight_global_scale"].shape == (1,)
    # 4 bits per weight + one byte per 16 weights + 4 bytes
    assert q.nbytes == 48 * 160 + 48 * 20 + 4


def test_global_scale_convention_and_scale_range():
    w = _weight(7)
    q = F.quantize(w, CFG)
    gs = q.tensors["weight_global_scale"]
    assert torch.equal(gs, torch.tensor([448.0 * 6.0]) / w.abs().amax())
    # the block holding the tensor's amax gets the largest E4M3 scale, 448
    assert q.tensors["weight_scale"].float().max().item() == 448.0


def test_sqnr_on_gaussian_weights():
    # measured ~20.4 dB for seeds 0-19 at this shape (E2M1 with 16-wide blocks)
    w = _weight(8, n=256, k=1024)
    assert sqnr_db(w, F.dequantize(F.quantize(w, CFG))) > 20.0


def test_dequantized_values_lie_on_the_scaled_e2m1_grid():
    w = _weight(9)
    q = F.quantize(w, CFG)
    div = q.tensors["weight_scale"].float() / q.tensors["weight_global_scale"]  # [N, G]
    vals = F.dequantize(q).unflatten(-1, (-1, 16)) / div[..., None]
    grid = torch.tensor(E2M1_VALUES)
    assert torch.isin(vals.abs(), grid).all()


def test_fake_quant_is_dequant_of_quant_with_identity_gradient():
    w = _weight(10).requires_grad_(True)
    out = F.fake_quant(w, CFG)
    assert torch.equal(out.detach(), F.dequantize(F.quantize(w.detach(), CFG)))
    g = torch.randn_like(w)
    (out * g).sum().backward()
    assert torch.equal(w.grad, g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gptq_hooks_reproduce_fake_quant_exactly(dtype):
    w = _awkward_weight(11).to(dtype)
    state = F.tensor_state(w, CFG)
    out = torch.empty_like(w)
    for g0 in range(0, w.shape[1], CFG.block_size):
        group = w[:, g0 : g0 + CFG.block_size]
        scales = F.block_scales(group, CFG, state)
        # GPTQ quantizes a group in column chunks of varying width
        for a, b in ((0, 1), (1, 4), (4, 16)):
            out[:, g0 + a : g0 + b] = F.qdq_with_scales(group[:, a:b], scales, CFG, state)
    assert bits_equal(out, F.fake_quant(w, CFG))


def test_shared_global_scale_for_fused_shards():
    q_w, k_w, v_w = _weight(12, n=64), _weight(13, n=32) * 3, _weight(14, n=32)
    state = shared_global_state([q_w, k_w, v_w])
    fused = torch.cat([q_w, k_w, v_w])
    assert bits_equal(state["global_scale"], F.tensor_state(fused, CFG)["global_scale"])
    # llm-compressor fuses by taking the min of per-shard global scales: same value
    per_shard = torch.cat([F.tensor_state(x, CFG)["global_scale"] for x in (q_w, k_w, v_w)])
    assert bits_equal(state["global_scale"], per_shard.min().reshape(1))
    shards = [F.quantize(x, CFG, state=state) for x in (q_w, k_w, v_w)]
    for s in shards:
        assert bits_equal(s.tensors["weight_global_scale"], state["global_scale"])
    # quantizing shards with the shared scale == quantizing the fused weight
    whole = F.quantize(fused, CFG)
    for name in ("weight_packed", "weight_scale"):
        assert bits_equal(torch.cat([s.tensors[name] for s in shards]), whole.tensors[name])
    # a python float is accepted as the shared scale too
    as_float = F.quantize(q_w, CFG, state={"global_scale": state["global_scale"].item()})
    assert bits_equal(as_float.tensors["weight_packed"], shards[0].tensors["weight_packed"])


def test_zero_weights_and_blocks_stay_finite():
    z = torch.zeros(8, 32)
    q = F.quantize(z, CFG)
    assert q.tensors["weight_global_scale"].item() == 1.0
    assert (q.tensors["weight_scale"].float() == 0.125).all()  # compressed-tensors' eps
    assert torch.equal(F.dequantize(q), z)
    assert torch.equal(F.fake_quant(z, CFG), z)
    w = _weight(15, n=8, k=32)
    w[:, :16] = 0
    d = F.dequantize(F.quantize(w, CFG))
    assert torch.isfinite(d).all() and (d[:, :16] == 0).all()


@pytest.mark.parametrize(
    "w,match",
    [
        (torch.randn(64), "2-D"),
        (torch.randn(4, 24), "multiple of the block size 16"),
        (torch.tensor([[float("nan")] + [0.0] * 15]), "NaN/Inf"),
        (torch.tensor([[float("inf")] + [0.0] * 15]), "NaN/Inf"),
    ],
)
def test_bad_weights_raise_quant_error(w, match):
    with pytest.raises(QuantError, match=match):
        F.quantize(w, CFG)
    if match == "NaN/Inf":  # fake_quant (every layer of every QAT forward) reads no value back: it propagates
        assert not torch.isfinite(F.fake_quant(w, CFG)).all()
        return
    with pytest.raises(QuantError, match=match):
        F.fake_quant(w, CFG)


def test_bad_config_state_and_hook_inputs_raise():
    with pytest.raises(QuantError, match="even"):
        NVFP4Config(block_size=15)
    with pytest.raises(QuantError, match="NVFP4Config"):
        F.quantize(_weight(0), make_config("mxfp4"))
    with pytest.raises(QuantError, match="global_scale"):
        F.quantize(_weight(0), CFG, state={})
    with pytest.raises(QuantError, match="finite positive"):
        F.quantize(_weight(0), CFG, state={"global_scale": 0.0})
    with pytest.raises(QuantError, match="NaN/Inf"):
        shared_global_state([_weight(0), torch.full((2, 16), float("nan"))])
    with pytest.raises(QuantError, match="no weights"):
        shared_global_state([])
    state = F.tensor_state(_weight(0), CFG)
    with pytest.raises(QuantError, match=r"\[N, 16\]"):
        F.block_scales(_weight(0)[:, :8], CFG, state)
    with pytest.raises(QuantError, match="1..16"):
        F.qdq_with_scales(_weight(0)[:, :17], torch.ones(64, 1).to(torch.float8_e4m3fn), CFG, state)
    q = F.quantize(_weight(0), CFG)
    with pytest.raises(QuantError, match="lacks"):
        F.dequantize(QTensor(CFG, q.shape, {"weight_packed": q.tensors["weight_packed"]}))


def test_registered_and_nameable():
    assert get_format("nvfp4") is F
    cfg = make_config("nvfp4")
    assert cfg == CFG and cfg.block_size == 16 and cfg.bits == 4
    assert spec_string(cfg) == "nvfp4"
    assert cfg.to_dict() == {"format": "nvfp4", "block_size": 16}
    q = F.quantize(_weight(0), cfg).to("cpu")
    assert q.dequantize().shape == (64, 256)


def test_frozen_block_scales_in_state():
    # a state carrying a QTensor's block scales keeps that grid (QAT from a calibrated model)
    cfg = NVFP4Config()
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    qt = F.quantize(w, cfg)
    state = {"global_scale": qt.tensors["weight_global_scale"], "weight_scale": qt.tensors["weight_scale"]}
    moved = w * 0.5
    q2 = F.quantize(moved, cfg, state=state)
    assert torch.equal(q2.tensors["weight_scale"].view(torch.uint8), qt.tensors["weight_scale"].view(torch.uint8))
    assert torch.equal(q2.dequantize(), F.fake_quant(moved, cfg, state=state))
    assert not torch.equal(q2.dequantize(), F.fake_quant(moved, cfg, state={"global_scale": state["global_scale"]}))
    with pytest.raises(QuantError, match="weight_scale must be"):
        F.quantize(w[:4], cfg, state=state)
