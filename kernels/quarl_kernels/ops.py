"""torch.library custom ops around the weight-only GEMMs, with autograd.

    torch.ops.quarl.wo_linear(x, packed, scale, zero, gscale, fmt, group, n, k) -> y
        y[..., N] = x[..., K] @ dequant(W)^T                        (no bias)
    torch.ops.quarl.wo_linear_t(dy, packed, scale, zero, gscale, fmt, group, n, k) -> dx
        dx[..., K] = dy[..., N] @ dequant(W)                        (the backward)
    torch.ops.quarl.wo_linear_epilogue(x, ..., k, bias, a, b, scaling, gate=None) -> y
        y = x @ dequant(W)^T + bias + scaling * a @ b^T              (inference: no autograd)
        (with gate: silu(gate) * y, the MLP's activation in the up projection's last pass)
    torch.ops.quarl.wo_linear_epilogue_a(x, ..., k, bias, a_w, a_lo, b, scaling, splits) -> (y, parts)
        the same, for a LoRA group's first projection: parts = x @ a_w^T as fp32 split partials
        (computed inside the GEMV launch), y's LoRA term from columns [a_lo, a_lo + r) of them

``fmt`` is a quarl format name ("nvfp4", "mxfp4", "int"), ``group`` its block /
group size; the tensors are exactly the layer's compressed-tensors buffers
(``weight_packed``, ``weight_scale``, ``weight_zero_point`` or None,
``weight_global_scale`` or None). Being custom ops with fake (meta)
implementations, they trace through ``torch.compile`` as single opaque nodes.

Devices. CUDA runs the Triton kernels; every other device runs the reference
(``quarl.quant`` dequantize, then matmul), so the ops are correct anywhere and
the GPU path is checked against exactly what QuantLinear's reference computes.

Autograd. ``wo_linear`` gets ``dx = wo_linear_t(dy, ...)``; the packed weight
and its scales are frozen (no gradient), as in QLoRA / QeRL: LoRA adapters
train on top, upstream layers still receive dx.
"""

from __future__ import annotations

import torch

from quarl_kernels.formats import FORMAT_IDS

_LIB = "quarl"


def _as_words(t: torch.Tensor) -> torch.Tensor | None:
    """int32 view [N, G/4] of a contiguous byte tensor [N, G], or None when G % 4 or alignment forbid."""
    if t.shape[-1] % 4 or not t.is_contiguous() or t.data_ptr() % 4:
        return None
    return t.view(torch.int32)


def _packed_weight(packed, scale, zero, gscale, fmt: str, group: int, n: int, k: int):
    """The kernels' view of a layer's tensors: no copies except for non-contiguous scales."""
    from quarl_kernels.wo_gemm import PackedWeight

    # FP4: uint8 [N, K/2] -> [N, K/8]; blocked (4-D, ``quarl.quant.packed_layout``): the same words in [64, 8]
    # blocks, handed to the kernels as an [N, K/8] view whose stride(0) is still K/8
    blocked = packed.dim() == 4
    words = (packed if packed.dtype == torch.int32 else packed.view(torch.int32)).view(n, k // 8)
    scale = scale.contiguous()
    if fmt == "int":
        byte_t = None if zero is None else zero.contiguous()
    else:
        byte_t = scale = scale.view(torch.uint8)  # e4m3 / e8m0 bits; the kernel decodes them
    # byte tensors travel as int32 words when they can: 4-byte loads pipeline, 1-byte loads stall
    as_words = None if byte_t is None else _as_words(byte_t)
    bytes32 = byte_t is not None and as_words is not None
    if bytes32:
        if fmt == "int":
            zero = as_words
        else:
            scale = as_words
    elif fmt == "int" and zero is not None:
        zero = byte_t
    return PackedWeight(FORMAT_IDS[fmt], group, n, k, words, scale, zero, gscale, bytes32, blocked)


def _reference_weight(packed, scale, zero, gscale, fmt: str, group: int, n: int, k: int, dtype) -> torch.Tensor:
    """The numerics oracle: the format's own dequantize (what QuantLinear's reference uses)."""
    from quarl.quant.base import QTensor, get_format
    from quarl.quant.packed_layout import row_major
    from quarl.quant.spec import make_config

    packed = row_major(packed)

    if fmt == "int":
        cfg = make_config({"format": "int", "bits": 4, "group_size": group, "symmetric": zero is None})
        tensors = {"weight_packed": packed, "weight_scale": scale}
        if zero is not None:
            tensors["weight_zero_point"] = zero
    else:
        cfg = make_config({"format": fmt, "block_size": group})
        tensors = {"weight_packed": packed, "weight_scale": scale}
        if gscale is not None:
            tensors["weight_global_scale"] = gscale
    return get_format(fmt).dequantize(QTensor(cfg, (n, k), tensors), dtype)


def _wo_linear_reference(x, packed, scale, zero, gscale, fmt, group, n, k):
    w = _reference_weight(packed, scale, zero, gscale, fmt, group, n, k, x.dtype)
    return torch.nn.functional.linear(x, w)


def _wo_linear_t_reference(dy, packed, scale, zero, gscale, fmt, group, n, k):
    w = _reference_weight(packed, scale, zero, gscale, fmt, group, n, k, dy.dtype)
    return dy @ w


@torch.library.custom_op(f"{_LIB}::wo_linear", mutates_args=())
def wo_linear(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
    gscale: torch.Tensor | None, fmt: str, group: int, n: int, k: int,
) -> torch.Tensor:
    return _wo_linear_reference(x, packed, scale, zero, gscale, fmt, group, n, k)


@wo_linear.register_kernel("cuda")
def _wo_linear_cuda(x, packed, scale, zero, gscale, fmt, group, n, k):
    from quarl_kernels.wo_gemm import wo_matmul

    x2 = x.reshape(-1, k)  # [M, K]
    y = wo_matmul(x2, _packed_weight(packed, scale, zero, gscale, fmt, group, n, k))
    return y.reshape(*x.shape[:-1], n)


@wo_linear.register_fake
def _wo_linear_fake(x, packed, scale, zero, gscale, fmt, group, n, k):
    return x.new_empty((*x.shape[:-1], n))


@torch.library.custom_op(f"{_LIB}::wo_linear_t", mutates_args=())
def wo_linear_t(
    dy: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
    gscale: torch.Tensor | None, fmt: str, group: int, n: int, k: int,
) -> torch.Tensor:
    return _wo_linear_t_reference(dy, packed, scale, zero, gscale, fmt, group, n, k)


@wo_linear_t.register_kernel("cuda")
def _wo_linear_t_cuda(dy, packed, scale, zero, gscale, fmt, group, n, k):
    from quarl_kernels.wo_gemm import wo_matmul_t

    dy2 = dy.reshape(-1, n)  # [M, N]
    dx = wo_matmul_t(dy2, _packed_weight(packed, scale, zero, gscale, fmt, group, n, k))
    return dx.reshape(*dy.shape[:-1], k)


@wo_linear_t.register_fake
def _wo_linear_t_fake(dy, packed, scale, zero, gscale, fmt, group, n, k):
    return dy.new_empty((*dy.shape[:-1], k))


@torch.library.custom_op(f"{_LIB}::wo_linear_epilogue", mutates_args=())
def wo_linear_epilogue(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
    gscale: torch.Tensor | None, fmt: str, group: int, n: int, k: int,
    bias: torch.Tensor | None, a: torch.Tensor | None, b: torch.Tensor | None, scaling: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ dequant(W)^T + bias + scaling * a @ b^T``; on CUDA the bias and the LoRA branch are added in
    the GEMM's last pass (``launch.Epilogue``). ``a`` is ``[..., r]`` or, with one more leading dimension, the
    fp32 split partials ``[S, ..., r]`` of ``x @ A^T`` (``quarl_kernels.lora_a``: summed, then rounded to x's
    dtype). ``gate`` ``[..., N]``: return ``silu(gate) * that`` instead (the MLP's up projection, its activation in
    the same pass). Inference only: no autograd is registered."""
    if a is not None and a.dim() == x.dim() + 1:
        a = _sum_parts(a).to(x.dtype)
    w = _reference_weight(packed, scale, zero, gscale, fmt, group, n, k, x.dtype)
    y = torch.nn.functional.linear(x, w, None if bias is None else bias.to(x.dtype))
    y = y if a is None else y + scaling * (a @ b.to(a.dtype).t())
    if gate is None:
        return y
    from quarl_kernels.fused_ops import silu_mul_reference

    return silu_mul_reference(gate, y)


def _sum_parts(a: torch.Tensor) -> torch.Tensor:
    """Split partials [S, ...] summed in split order (fp32), as the last pass sums them."""
    out = a[0].clone()
    for s in range(1, a.shape[0]):
        out += a[s]
    return out


@wo_linear_epilogue.register_kernel("cuda")
def _wo_linear_epilogue_cuda(x, packed, scale, zero, gscale, fmt, group, n, k, bias, a, b, scaling, gate=None):
    from quarl_kernels.launch import Epilogue
    from quarl_kernels.wo_gemm import wo_matmul

    if a is None:
        a2 = None
    elif a.dim() == x.dim() + 1:  # [S, M, r] fp32 partials (a view of a column slice, strides kept)
        a2 = a.reshape(a.shape[0], -1, a.shape[-1])
    else:
        a2 = a.reshape(-1, a.shape[-1])  # [M, r]: a view (row stride kept) of a column slice
    g2 = None if gate is None else gate.reshape(-1, n)
    epi = Epilogue(bias, a2, None if b is None else b.contiguous(), scaling, gate=g2)
    y = wo_matmul(x.reshape(-1, k), _packed_weight(packed, scale, zero, gscale, fmt, group, n, k), epi=epi)  # [M, N]
    return y.reshape(*x.shape[:-1], n)


@wo_linear_epilogue.register_fake
def _wo_linear_epilogue_fake(x, packed, scale, zero, gscale, fmt, group, n, k, bias, a, b, scaling, gate=None):
    return x.new_empty((*x.shape[:-1], n))


@torch.library.custom_op(f"{_LIB}::wo_linear_epilogue_a", mutates_args=())
def wo_linear_epilogue_a(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
    gscale: torch.Tensor | None, fmt: str, group: int, n: int, k: int,
    bias: torch.Tensor | None, a_w: torch.Tensor, a_lo: int, b: torch.Tensor, scaling: float, splits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`wo_linear_epilogue` of the first projection of a LoRA group, which also computes the group's
    ``x @ a_w^T`` (``a_w [R, K]``: the stacked A of the group). Returns ``(y, parts)``: ``parts [splits, ..., R]``
    fp32 partials of that product (on CUDA computed by extra programs of the GEMV launch, ``quarl_kernels.lora_a``;
    ``splits`` must be ``lora_a.splits_for(k, rows)`` there), and ``y`` with the LoRA term of columns
    ``[a_lo, a_lo + r)`` of them, ``r = b.shape[-1]``. The other projections pass their column slices of ``parts``
    to :func:`wo_linear_epilogue`. Here: ``F.linear``'s output in split 0, zeros in the rest."""
    parts = x.new_zeros((splits, *x.shape[:-1], a_w.shape[0]), dtype=torch.float32)
    parts[0] = torch.nn.functional.linear(x, a_w.to(x.dtype)).float()
    r = b.shape[-1]
    return wo_linear_epilogue(x, packed, scale, zero, gscale, fmt, group, n, k, bias, parts[..., a_lo:a_lo + r], b,
                              scaling), parts


@wo_linear_epilogue_a.register_kernel("cuda")
def _wo_linear_epilogue_a_cuda(x, packed, scale, zero, gscale, fmt, group, n, k, bias, a_w, a_lo, b, scaling, splits):
    from quarl_kernels import lora_a
    from quarl_kernels.launch import Epilogue
    from quarl_kernels.wo_gemm import wo_matmul

    x2 = x.reshape(-1, k)
    if splits != lora_a.splits_for(k, x2.shape[0]):
        raise ValueError(f"wo_linear_epilogue_a: splits={splits}, but the kernels split K={k} at {x2.shape[0]} rows "
                         f"into {lora_a.splits_for(k, x2.shape[0])} (pass quarl_kernels.lora_a.splits_for(k, rows))")
    la = lora_a.LoraA(a_w, torch.empty(splits, x2.shape[0], a_w.shape[0], device=x.device, dtype=torch.float32))
    r = b.shape[-1]
    epi = Epilogue(bias, la.out[..., a_lo:a_lo + r], b.contiguous(), scaling, lora_a=la)
    y = wo_matmul(x2, _packed_weight(packed, scale, zero, gscale, fmt, group, n, k), epi=epi)  # [M, N]
    return y.reshape(*x.shape[:-1], n), la.out.view(splits, *x.shape[:-1], a_w.shape[0])


@wo_linear_epilogue_a.register_fake
def _wo_linear_epilogue_a_fake(x, packed, scale, zero, gscale, fmt, group, n, k, bias, a_w, a_lo, b, scaling, splits):
    return x.new_empty((*x.shape[:-1], n)), x.new_empty((splits, *x.shape[:-1], a_w.shape[0]), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    _, packed, scale, zero, gscale, fmt, group, n, k = inputs
    ctx.save_for_backward(packed, scale, zero, gscale)
    ctx.meta = (fmt, group, n, k)


def _backward(ctx, dy):
    packed, scale, zero, gscale = ctx.saved_tensors
    dx = torch.ops.quarl.wo_linear_t(dy.contiguous(), packed, scale, zero, gscale, *ctx.meta)
    return dx, None, None, None, None, None, None, None, None


torch.library.register_autograd(f"{_LIB}::wo_linear", _backward, setup_context=_setup_context)


class WoLinearEager(torch.autograd.Function):
    """``torch.ops.quarl.wo_linear`` with its backward, for eager training: the same kernels (the op's CUDA ones on
    CUDA tensors, its reference elsewhere) and the same saved tensors, called without the dispatcher. Why: the
    custom op's Python-registered autograd costs ~40 us of host time per call on top of the kernel launch (CPU
    measurement, RESULTS "Issue 17, session 12"); a LoRA micro-batch calls the base ~600 times (forward,
    checkpointed recompute, backward x 7 projections x 28 layers), and the update phase is partly host-bound.
    ``torch.compile`` keeps tracing the custom op (``registration.forward``)."""

    @staticmethod
    def forward(ctx, x, packed, scale, zero, gscale, fmt, group, n, k):
        ctx.save_for_backward(packed, scale, zero, gscale)
        ctx.meta = (fmt, group, n, k)
        fn = _wo_linear_cuda if x.is_cuda else _wo_linear_reference
        return fn(x, packed, scale, zero, gscale, fmt, group, n, k)

    @staticmethod
    def backward(ctx, dy):
        packed, scale, zero, gscale = ctx.saved_tensors
        fn = _wo_linear_t_cuda if dy.is_cuda else _wo_linear_t_reference
        return fn(dy.contiguous(), packed, scale, zero, gscale, *ctx.meta), None, None, None, None, None, None, None, None


def layer_args(layer) -> tuple:
    """The op arguments after ``x`` for a frozen QuantLinear with a supported format."""
    cfg = layer.config
    if cfg.name == "int":
        return (layer.weight_packed, layer.weight_scale, getattr(layer, "weight_zero_point", None), None,
                "int", cfg.group_size, layer.out_features, layer.in_features)
    gs = layer.weight_global_scale if cfg.name == "nvfp4" else None
    return (layer.weight_packed, layer.weight_scale, None, gs, cfg.name, cfg.block_size,
            layer.out_features, layer.in_features)
