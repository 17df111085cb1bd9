"""Pack a calibrated weight (values on the grid + the scales GPTQ froze) into a QTensor.

``Format.quantize`` always derives scales from the weight it is given. After
GPTQ that is wrong: each group's scales were fixed from the error-updated
weights *before* the group's columns were rounded, so re-deriving them from
the rounded result ``Q`` would pick different scales (e.g. when the largest
element of a block was moved down by an earlier update) and re-round ``Q``.
The checkpoint must hold exactly the numbers GPTQ chose, so we build the
QTensor from ``Q`` and the recorded per-group scales ourselves.

Each format packs its own (``Format.pack_with_scales`` in its module, with the
encoders ``quantize`` uses, so the bytes match exactly); this module checks every
result: ``dequantize(packed) == Q`` bit for bit, or we raise.
"""

from __future__ import annotations

from typing import Any

import torch

from quarl.quant.base import FormatConfig, QTensor, QuantError, get_format


def pack_qtensor(cfg: FormatConfig, q: torch.Tensor, scales: list[Any], state: dict) -> QTensor:
    """``q`` [N, K] (exactly on the grid defined by ``scales``) -> QTensor; verified bit-exact."""
    fmt = get_format(cfg.name)
    q = q.detach().float().contiguous()
    qt = QTensor(cfg, (q.shape[0], q.shape[1]), fmt.pack_with_scales(cfg, q, scales, state))
    back = fmt.dequantize(qt, torch.float32)
    if not torch.equal(back, q):
        bad = (back != q).sum().item()
        raise QuantError(
            f"{cfg.name}: packing the calibrated weight is not exact ({bad} of {q.numel()} values "
            f"differ, max {float((back - q).abs().max()):.3g}); this is a bug in quarl.quant.pack"
        )
    return qt
