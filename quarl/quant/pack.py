"""Pack a calibrated weight (values on the grid + the scales GPTQ froze) into a QTensor.

``Format.quantize`` always derives scales from the weight it is given. After
GPTQ that is wrong: each group's scales were fixed from the error-updated
weights *before* the group's columns were rounded, so re-deriving them from
the rounded result ``Q`` would pick different scales (e.g. when the largest
element of a block was moved down by an earlier update) and re-round ``Q``.
The checkpoint must hold exactly the numbers GPTQ chose, so we build the
QTensor from ``Q`` and the recorded per-group scales ourselves.

This is the one place outside ``quarl/quant/formats`` that knows each format's
storage layout; it uses the formats' own encoders (``encode_e2m1``,
``pack_int32`` ...) so that the bytes match ``quantize`` exactly, and every
result is checked: ``dequantize(packed) == Q`` bit for bit, or we raise.
(A ``pack_with_scales`` hook on :class:`quarl.quant.base.Format` would be the
natural home for this; until the format contract grows one, it lives here.)
"""

from __future__ import annotations

from typing import Any

import torch

from quarl.quant.base import FormatConfig, QTensor, QuantError, get_format


def _cat_cols(scales: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([s.reshape(s.shape[0], -1) for s in scales], dim=1)


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of values already on the grid, keeping the sign of -0.0 (code 8):
    ``quantize`` emits -0 for small negatives that round to zero, and we want its bytes."""
    from quarl.quant.formats.fp4 import encode_e2m1

    return encode_e2m1(x) | (torch.signbit(x).to(torch.uint8) << 3)


def _pack_nvfp4(cfg, q: torch.Tensor, scales: list, state: dict) -> dict:
    from quarl.quant.formats.fp4 import blocks, pack_fp4
    from quarl.quant.formats.nvfp4 import _divisor, _global_scale

    gs = _global_scale(state, q.device)  # [1]
    scale = _cat_cols(scales)  # [N, G] float8_e4m3fn
    codes = _e2m1_codes(blocks(q, cfg.block_size) / _divisor(scale, gs)[..., None])  # [N, G, B]
    return {"weight_packed": pack_fp4(codes.flatten(-2)), "weight_scale": scale, "weight_global_scale": gs}


def _pack_mxfp4(cfg, q: torch.Tensor, scales: list, state: dict) -> dict:
    from quarl.quant.formats.fp4 import blocks, pack_fp4
    from quarl.quant.formats.mxfp4 import e8m0_to_float

    exp = _cat_cols(scales).to(torch.uint8)  # [N, G]
    codes = _e2m1_codes(blocks(q, cfg.block_size) / e8m0_to_float(exp)[..., None])
    return {"weight_packed": pack_fp4(codes.flatten(-2)), "weight_scale": exp}


def _pack_int(cfg, q: torch.Tensor, scales: list, state: dict) -> dict:
    from quarl.quant.formats.intk import pack_int32

    n, k = q.shape
    scale = _cat_cols([s for s, _ in scales])  # [N, G] fp32
    zp = None if cfg.symmetric else _cat_cols([z for _, z in scales])  # [N, G] fp32 holding ints
    qg = q.view(n, -1, cfg.group_size) / scale.unsqueeze(-1)  # [N, G, g]
    if zp is not None:
        qg = qg + zp.unsqueeze(-1)
    codes = torch.round(qg.clamp(cfg.qmin, cfg.qmax)).view(n, k)
    out = {"weight_packed": pack_int32((codes - cfg.qmin).to(torch.int64), cfg.bits), "weight_scale": scale}
    if zp is not None:
        out["weight_zero_point"] = zp.to(torch.int8)
    return out


def _pack_nf4(cfg, q: torch.Tensor, scales: list, state: dict) -> dict:
    from quarl.quant.formats.nf4 import _DYN, _encode, pack_nibbles

    n, k = q.shape
    absmax = _cat_cols(scales).float()  # [N, G] (decoded, when double-quantized)
    g = absmax.shape[1]
    codes = _encode(q.view(n, g, cfg.block_size), absmax.unsqueeze(-1)).view(n, k)
    out = {"weight_packed": pack_nibbles(codes)}
    if not cfg.double_quant:
        out["weight_scale"] = absmax
        return out
    # Recover each group's 8-bit code: the one whose decoded value is *exactly* the
    # scale GPTQ used (re-encoding could flip a tie between two close map entries).
    offset, absmax2 = state["offset"].to(q.device), state["absmax2"].to(q.device)
    per = absmax2.repeat_interleave(cfg.dq_block_size)[: n * g].view(n, g)  # [N, G]
    cand = _DYN.to(q.device)[None, None, :] * per[..., None] + offset  # [N, G, 256]
    hit = cand == absmax[..., None]
    if not hit.any(-1).all():
        raise QuantError("nf4 double-quant: a GPTQ scale is not on the second-level grid; the state does not match")
    out.update(
        weight_scale=hit.float().argmax(-1).to(torch.uint8), weight_scale_absmax=absmax2, weight_scale_offset=offset
    )
    return out


def _pack_fp8(cfg, q: torch.Tensor, scales: list, state: dict) -> dict:
    from quarl.quant.formats.fp8 import _row_scales, _to_fp8

    n, _k = q.shape
    if cfg.granularity == "tensor":
        s = state["scale"].to(q.device).reshape(1)
        return {"weight": _to_fp8(q / s), "weight_scale": s}
    tiles = torch.stack([s.reshape(-1) for s in scales], dim=1)  # [N/B, K/B]
    s_full = _row_scales(tiles, n, cfg.block_size).repeat_interleave(cfg.block_size, dim=1)  # [N, K]
    return {"weight": _to_fp8(q / s_full), "weight_scale": tiles}


_PACKERS = {"nvfp4": _pack_nvfp4, "mxfp4": _pack_mxfp4, "int": _pack_int, "nf4": _pack_nf4, "fp8": _pack_fp8}


def pack_qtensor(cfg: FormatConfig, q: torch.Tensor, scales: list[Any], state: dict) -> QTensor:
    """``q`` [N, K] (exactly on the grid defined by ``scales``) -> QTensor; verified bit-exact."""
    packer = _PACKERS.get(cfg.name)
    if packer is None:
        raise QuantError(f"calibration cannot pack format {cfg.name!r} yet; known: {sorted(_PACKERS)}")
    q = q.detach().float().contiguous()
    qt = QTensor(cfg, (q.shape[0], q.shape[1]), packer(cfg, q, scales, state))
    back = get_format(cfg.name).dequantize(qt, torch.float32)
    if not torch.equal(back, q):
        bad = (back != q).sum().item()
        raise QuantError(
            f"{cfg.name}: packing the calibrated weight is not exact ({bad} of {q.numel()} values "
            f"differ, max {float((back - q).abs().max()):.3g}); this is a bug in quarl.quant.pack"
        )
    return qt
