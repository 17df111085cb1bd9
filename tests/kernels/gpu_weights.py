"""Quantized test weights for the GPU kernel tests, as the kernels take them (``wo_gemm.PackedWeight``)."""

from __future__ import annotations

import torch


def packed_weights(spec: str, n: int, k: int, seed: int = 0):
    """A ``0.05 randn`` [n, k] weight quantized with ``spec`` on the GPU: (the quantized tensor, its row-major
    ``PackedWeight``, the same words in ``packed_layout``'s [64, 8] blocks -- None when n is not a whole number of
    64-row bands)."""
    from quarl_kernels.ops import _packed_weight

    from quarl.quant import get_format, make_config, packed_layout

    torch.manual_seed(seed)
    c = make_config(spec)
    q = get_format(c.name).quantize(torch.randn(n, k, device="cuda") * 0.05, c)
    t = q.tensors
    args = (t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), t.get("weight_global_scale"),
            c.name, c.block_size, n, k)
    blk = _packed_weight(packed_layout.block(args[0]), *args[1:]) if n % 64 == 0 else None
    return q, _packed_weight(*args), blk
