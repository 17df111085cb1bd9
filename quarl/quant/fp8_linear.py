"""The FP8 training linear of Jet-RL / DeepSeek-V3: every GEMM of a linear layer in FP8.

    forward   Y  = X W^T     X in 1x128 groups (per token, along K), W in 128x128 tiles
    DGrad     dX = dY W      dY in 1x128 groups (per token, along N), W in the same 128x128 tiles
    WGrad     dW = dY^T X    dY^T and X^T in 1x128 groups along the token axis (128x1 in their
                             [M, N] / [M, K] layouts): the reduction runs over tokens, and a scale
                             must be constant along a reduction block for the GEMM to apply it

``wgrad="tiles"`` (opt-in, not Jet-RL's recipe): X^T in 128x128 tiles (128 tokens x 128 channels per
scale) instead of 1x128 groups, so WGrad runs the same "1x128 x 128x128" kernel as the forward and
DGrad. The 1x128 x 1x128 kernels (cuBLAS's and DeepGEMM's) reach only ~1.1x BF16 on Hopper, the
1D2D ones 1.4-1.6x (benchmarks/RESULTS.md "Jet-RL"); the price is a coarser X in the weight
gradient (SmolLM2 on GSM8K text: dW relative error 2.08% mean over 16 projections, against 1.82%).

All operands are E4M3 with FP32 scales from :mod:`quarl.quant.formats.fp8` (the same
quantizers that are bit-identical to compressed-tensors), every GEMM accumulates in
FP32, the gradients passed between operators are in the activation dtype (BF16 on
GPU) and the weight gradient in the master weight's dtype (BF16 or FP32). What is
saved for the backward pass is FP8: X^T quantized for WGrad (1 byte per element
instead of 2) and the weight's FP8 tiles, reused transposed for DGrad -- a 128x128
tile quantization of W^T is exactly the transpose of W's, so the forward and DGrad
see the same weight bits.
The three GEMMs run through :func:`quarl.quant.fp8_gemm.blockwise_gemm` (cuBLAS's ``scaled_mm``, DeepGEMM, the
FP8 GEMV for decode rows, or the same operands emulated in FP32: that module says which, where), and every operand
comes from :mod:`quarl.quant.fp8_operands` (the quantizers in the GEMMs' layouts, one activation quantized once for
the projections that read it, the weight's tiles). This module is the autograd function, the master weight's cached
tiles between optimizer steps, and :func:`fp8_linear`.

Shapes that are not multiples of 128 (SmolLM2: 576) are zero-padded to the next
multiple before quantization: zeros change no amax, so the short last block gets the
scale of its own values, exactly as the weight format's short tiles do. cuBLAS also
needs the rows of ``A`` to be a multiple of 4 (tokens are padded on CUDA).

``fp8_linear(x, weight, bias)`` is the autograd entry point; ``weight`` is either a
high-precision master weight (full-parameter Jet-RL: quantized on every call, so the
GEMMs always see the current weights) or a frozen, already-quantized
``QTensor`` (an FP8 base under LoRA: no WGrad).
"""
from __future__ import annotations

import torch
from torch.autograd.graph import increment_version
from torch.optim.optimizer import register_optimizer_step_post_hook

from quarl.quant.base import QTensor, QuantError
from quarl.quant.formats.fp8 import ACT_GROUP

# Re-exported: the GEMM's and the operands' names, which callers (fp8_stack, fp8_swiglu, benchmarks) import from here
from quarl.quant.fp8_gemm import (  # noqa: F401
    CUBLAS_FALLBACKS,
    DEEPGEMM_FALLBACKS,
    FP8_GEMV_LIMIT_M,
    FP8_GEMV_MAX_M,
    GEMM_BACKENDS,
    _cublas_ok,
    _deep_gemm,
    _deepgemm,
    _gemv_module,
    add_bias,
    blockwise_gemm,
    deepgemm_available,
    gemm_backend,
    gemv_rows,
)
from quarl.quant.fp8_operands import (  # noqa: F401
    _X_SLOT,
    BLOCK,
    QUANT_BACKENDS,
    _fused_module,
    _pad2,
    _quantize_x,
    _round_up,
    _scales_t,
    _tiles_padded,
    _transposed,
    _weight_tiles,
    _x_tiles_t,
    clear_input_memo,
    memo_on,
    quant_backend,
    quantize_act_gemm,
    quantize_input,
    quantize_weight_128x128,
    quantize_weight_padded,
    shared_input,
)


# --------------------------------------------------------------------------- autograd
class FP8LinearFunction(torch.autograd.Function):
    """``y = x @ W^T + b`` with the three GEMMs in FP8 (module docstring). Inputs:
    ``x`` [..., K]; ``wq, ws`` the weight's FP8 tiles padded to multiples of 128; ``weight`` the master
    [N, K] (None for a frozen base: no WGrad); ``n`` the true out features; ``memo``: reuse / leave X's
    quantization for the next projection reading the same X (:func:`quantize_input`; :func:`fp8_linear` passes
    :func:`memo_on`)."""

    @staticmethod
    def forward(ctx, x, weight, bias, wq, ws, n, memo=False, wgrad_tiles=False):
        # wq [Np, Kp] (padded to multiples of 128), ws [Np/128, Kp/128], n: the true out features
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)  # [M, K]
        m = x2.shape[0]
        kp, np_ = wq.shape[1], wq.shape[0]
        mp = _round_up(m, 4) if x.is_cuda else m
        need_w = weight is not None and ctx.needs_input_grad[1]
        # X in 1x128 groups along K for this GEMM and, for WGrad, X^T in 1x128 groups along the tokens
        # (128x1 of X), saved in FP8: xq [Mp, Kp], xs [Mp, Kp/128], xtq [Kp, M128], xts [Kp, M128/128]
        # (wgrad_tiles: xtq, xts are X^T in 128x128 tiles, xts [Kp/128, M128/128])
        xq, xs, xtq, xts = quantize_input(x, x2, mp, kp, _round_up(m, BLOCK) if need_w else None, memo,
                                          wgrad_tiles)
        y = blockwise_gemm(xq, xs, wq, ws, True, x.dtype)[:m, :n]  # [M, N]
        if bias is not None:
            y = add_bias(y, bias)
        ctx.save_for_backward(wq, ws, xtq, xts)
        ctx.shape = (lead, m, n, k, kp, np_)
        ctx.x_dtype = x.dtype
        ctx.w_dtype = weight.dtype if weight is not None else None
        ctx.b_dtype = bias.dtype if bias is not None else None
        ctx.wgrad_tiles = wgrad_tiles
        return y.reshape(*lead, n)

    @staticmethod
    def backward(ctx, dy):
        wq_p, ws, xtq, xts = ctx.saved_tensors
        clear_input_memo()  # the forward's operands need not outlive it (the saved ones are in ctx)
        lead, m, n, k, _, np_ = ctx.shape
        dy2 = dy.reshape(-1, n)  # [M, N]
        dx = dw = db = None
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        mp = _round_up(m, 4) if dy.is_cuda else m
        # dY in 1x128 groups along N (DGrad) and dY^T along the tokens (WGrad), one pass:
        # dyq [Mp, Np], dys [Mp, Np/128], dytq [Np, M128], dyts [Np, M128/128]
        dyq, dys, dytq, dyts = quantize_act_gemm(dy2, mp, np_, xtq.shape[1] if need_w else None, row_groups=need_x)
        if need_x:  # DGrad: dX = dY W, reduction over N; W^T tiles = transposed W tiles
            wtq = _transposed(wq_p)  # [Kp, Np]
            dx = blockwise_gemm(dyq, dys, wtq, _scales_t(ws), True, ctx.x_dtype)[:m, :k]
            dx = dx.reshape(*lead, k)
        if need_w:  # WGrad: dW = dY^T X, reduction over tokens, written in the master weight's dtype
            dw = blockwise_gemm(dytq, dyts, xtq, xts, ctx.wgrad_tiles, ctx.w_dtype)[:n, :k]
            dw = dw if dw.is_contiguous() else dw.contiguous()
        if ctx.b_dtype is not None and ctx.needs_input_grad[2]:
            db = dy2.sum(0, dtype=torch.float32).to(ctx.b_dtype)  # fp32 accumulation, no fp32 copy of dY
        return (dx, dw, db, None, None, None, None, None)[:len(ctx.needs_input_grad)]  # memo / wgrad_tiles given or not


# Optimizer steps that move no version counter. torch's fused AdamW (``_fused_adamw_``, ``fused=True``) and
# bitsandbytes' 8-bit optimizers write the parameters in kernels of their own and leave ``_version`` where it
# was, so a cache keyed on the version alone kept serving the tiles of the weights before the step: the FP8
# forward of every later step ran on the first step's weights (found in session 26: ``fp8_model_step.py``'s
# fused AdamW, the rl stage's default ``adamw8bit``). Every ``torch.optim.Optimizer`` -- bitsandbytes'
# subclasses too -- runs the global post-step hooks, so one hook moving a counter marks "weights may have
# changed" for all of them; the cache keys on (version, counter).
_OPTIMIZER_STEPS = [0]


def _count_step(_opt, _args, _kwargs) -> None:
    _OPTIMIZER_STEPS[0] += 1


register_optimizer_step_post_hook(_count_step)


def weights_changed() -> None:
    """Mark every master weight's FP8 tiles stale: for code that writes weights in place outside autograd's
    version counting and outside a ``torch.optim`` optimizer's ``step`` (those are counted already)."""
    _OPTIMIZER_STEPS[0] += 1


def _master_tiles(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Master weight [N, K] -> (padded FP8 tiles [Np, Kp], scales): quantized once per optimizer
    step (the weight's ``_version`` moves, or an optimizer stepped: see ``_OPTIMIZER_STEPS``), however many
    micro-batches or decode steps use it."""
    hit = getattr(w, "_quarl_fp8", None)
    version = (w._version, _OPTIMIZER_STEPS[0])
    if hit is not None and hit[0] == version and hit[1].device == w.device:
        return hit[1], hit[2]
    if hit is not None and (made := _tiles_in_place(w, hit[1], hit[2])) is not None:
        w._quarl_fp8 = (version, *made)
        return made
    # [Np, Kp], [Np/128, Kp/128], and DGrad's transposed tiles [Kp, Np] when the kernel writes them
    qp, s, qt = _weight_tiles(w, transpose=w.requires_grad)
    if hit is not None and hit[1].shape == qp.shape and hit[1].device == qp.device:
        # in place: the addresses stay, so a CUDA graph captured on them (rollout) reads the new weight
        hit[1].copy_(qp)
        hit[2].copy_(s)
        qp, s = hit[1], hit[2]
    if qt is not None:
        qp._quarl_t = (qp._version, qt)
    w._quarl_fp8 = (version, qp, s)
    return qp, s


def _tiles_in_place(w: torch.Tensor, q: torch.Tensor, s: torch.Tensor):
    """On the ``triton`` backend, a changed master weight's tiles re-made by the quantizer straight into their old
    storage (and the transposed tiles into theirs) -> (q, s), else None. The copy of fresh tiles into the old ones
    that :func:`_master_tiles` does otherwise was 0.24 ms of a 32B-width layer's step at one micro-batch per
    optimizer step (H200, RESULTS.md "Session 26"). The kernel moves no version counter, so it is moved here: caches
    keyed on it (the DGrad operand's transposed scales, :func:`_scales_t`) are re-made, and autograd still refuses a
    backward whose saved tiles changed since its forward, as after the copy."""
    if q.device != w.device or quant_backend(w) != "triton":
        return None
    old_t = getattr(q, "_quarl_t", None)
    qt = old_t[1] if old_t is not None else None
    transpose = w.requires_grad
    if transpose and qt is None:
        return None
    try:
        q, s, qt = _fused_module().quantize_tiles(w.detach(), transpose, out=(q, s, qt if transpose else None))
    except ValueError:  # the shapes changed: fresh tiles
        return None
    increment_version([q, s, *([qt] if qt is not None else [])])
    if qt is not None:
        q._quarl_t = (q._version, qt)
    return q, s


def refresh_master_tiles(module: torch.nn.Module) -> int:
    """Re-quantize, in place, the FP8 tiles of every master weight of ``module`` whose weight changed since they were
    made (an optimizer step, an in-place write); returns how many. A CUDA graph captured on the tiles (the fast
    engine's decode step) reads them by address without running :func:`fp8_linear`, so the engine calls this before
    each rollout: the graphs then never replay the weights of an earlier optimizer step, and a re-capture never
    records the quantization itself. Weights never run through the FP8 linear have no tiles and are skipped."""
    n = 0
    with torch.no_grad():
        for p in module.parameters():
            hit = getattr(p, "_quarl_fp8", None)
            if hit is not None and hit[0] != (p._version, _OPTIMIZER_STEPS[0]):
                _master_tiles(p)
                n += 1
    return n


def _frozen_tiles(qt: QTensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, s = qt.tensors["weight"], qt.tensors["weight_scale"]
    hit = getattr(q, "_quarl_fp8", None)
    if hit is not None and hit[0] == q._version and hit[1].device == q.device:
        return hit[1], hit[2]
    n, k = q.shape
    qp = _pad2(q, _round_up(n, BLOCK), _round_up(k, BLOCK))
    q._quarl_fp8 = (q._version, qp, s)
    return qp, s


WGRAD_MODES = ("1x128", "tiles")


def fp8_linear(x: torch.Tensor, weight: torch.Tensor | QTensor, bias: torch.Tensor | None = None,
               wgrad: str = "1x128") -> torch.Tensor:
    """``x`` [..., K] @ ``weight``^T [+ bias] through FP8 GEMMs; differentiable in ``x``, a master
    ``weight`` and ``bias``. ``weight``: a tensor [N, K] (quantized to 128x128 tiles whenever it has
    changed) or an ``fp8-block`` QTensor (frozen). ``wgrad``: X^T's grouping in the weight gradient,
    ``1x128`` (Jet-RL) or ``tiles`` (module docstring). Returns ``x.dtype``."""
    if wgrad not in WGRAD_MODES:
        raise QuantError(f"fp8_linear: wgrad must be one of {WGRAD_MODES}, got {wgrad!r}")
    if isinstance(weight, QTensor):
        cfg = weight.config
        if cfg.name != "fp8" or cfg.granularity != "block" or cfg.block_size != BLOCK:
            raise QuantError(f"fp8_linear needs an fp8-block (128x128) weight, got {cfg}")
        wq, ws = _frozen_tiles(weight)
        return FP8LinearFunction.apply(x, None, bias, wq, ws, weight.shape[0], memo_on())
    if ACT_GROUP != BLOCK:  # pragma: no cover - a constant; the GEMM layouts assume it
        raise QuantError("fp8_linear assumes 1x128 activation groups")
    wq, ws = _master_tiles(weight)
    # no autograd graph (rollout, eval): pass no master weight, so the forward skips X^T's quantization for a
    # WGrad that never comes (inside the Function, needs_input_grad still says True under no_grad)
    grad = torch.is_grad_enabled()
    return FP8LinearFunction.apply(x, weight if grad else None, bias, wq, ws, weight.shape[0], memo_on(),
                                   wgrad == "tiles")


__all__ = [
    "FP8_GEMV_MAX_M",
    "GEMM_BACKENDS",
    "WGRAD_MODES",
    "FP8LinearFunction",
    "add_bias",
    "blockwise_gemm",
    "clear_input_memo",
    "fp8_linear",
    "gemm_backend",
    "quantize_input",
    "quantize_weight_128x128",
    "refresh_master_tiles",
    "shared_input",
    "weights_changed",
]
