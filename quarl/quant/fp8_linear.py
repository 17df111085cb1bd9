"""The FP8 training linear of Jet-RL / DeepSeek-V3: every GEMM of a linear layer in FP8.

    forward   Y  = X W^T     X in 1x128 groups (per token, along K), W in 128x128 tiles
    DGrad     dX = dY W      dY in 1x128 groups (per token, along N), W in the same 128x128 tiles
    WGrad     dW = dY^T X    dY^T and X^T in 1x128 groups along the token axis (128x1 in their
                             [M, N] / [M, K] layouts): the reduction runs over tokens, and a scale
                             must be constant along a reduction block for the GEMM to apply it

All operands are E4M3 with FP32 scales from :mod:`quarl.quant.formats.fp8` (the same
quantizers that are bit-identical to compressed-tensors), every GEMM accumulates in
FP32, the gradients passed between operators are in the activation dtype (BF16 on
GPU) and the weight gradient in the master weight's dtype (BF16 or FP32). What is
saved for the backward pass is FP8: X^T quantized for WGrad (1 byte per element
instead of 2) and the weight's FP8 tiles, reused transposed for DGrad -- a 128x128
tile quantization of W^T is exactly the transpose of W's, so the forward and DGrad
see the same weight bits.

One GEMM, two backends (:func:`blockwise_gemm`): both operands are given as
``[rows, K]`` with the reduction along K, ``A`` in 1x128 groups and ``B`` in 1x128
groups or 128x128 tiles.

* CUDA, compute capability 9.0 (Hopper): ``torch.nn.functional.scaled_mm`` with
  ``ScalingType.BlockWise1x128`` / ``BlockWise128x128`` (cuBLASLt), the scale layouts
  that :func:`quarl.quant.formats.fp8.cublas_blockwise_scales` documents; the
  quantizers are fused Triton kernels (``quarl_kernels.fp8_quant``: one pass per operand,
  X and dY in both groupings at once, codes and scales written in these layouts; bit-identical
  to the eager quantizers). ``QUARL_FP8_QUANT=compile`` / ``eager`` selects the PyTorch ones
  (see :func:`quant_backend`).
* anywhere else (CPU tests, other GPUs, ``QUARL_FP8_GEMM=emulate``): the *same* FP8
  operands dequantized exactly to FP32 and multiplied in FP32. It differs from the
  cuBLAS result by FP32 summation order only (tested on the device).

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

import functools
import os
import warnings

import torch
import torch.nn.functional as F

from quarl.quant.base import QTensor, QuantError
from quarl.quant.formats.fp8 import (
    ACT_GROUP,
    FORMAT,
    FP8Config,
    _scale_from_amax,
    _to_fp8,
    dequantize_act_1x128,
    quantize_act_1x128,
)

BLOCK = 128
_WCFG = FP8Config("block", BLOCK)


# --------------------------------------------------------------------------- quantizers
# Three implementations of the same quantizers, picked per call by QUARL_FP8_QUANT (CUDA):
#   triton   (the CUDA default) quarl_kernels.fp8_quant: one kernel per operand that reads it once and
#            writes the codes and scales in the GEMM layouts -- X and dY in both groupings (1x128 along
#            K / N and along the tokens) in one pass, W's tiles and their transpose in one pass;
#            bit-identical to eager (tested on CPU through the Triton interpreter and on the GPU)
#   compile  the PyTorch quantizers through torch.compile (the previous default; its approximate
#            division rounds rare near-ties the other way, benchmarks/RESULTS.md "Jet-RL")
#   eager    the PyTorch quantizers as written: the oracle (``QUARL_FP8_COMPILE=0`` also selects it)
# CPU runs eager, except ``QUARL_FP8_QUANT=triton`` under ``TRITON_INTERPRET=1`` (the kernels' CPU test).
QUANT_BACKENDS = ("triton", "compile", "eager")


@functools.cache
def _fused_module():
    """``quarl_kernels.fp8_quant``, or None (no Triton / quarl_kernels: the compiled path serves)."""
    try:
        from quarl_kernels import fp8_quant
    except Exception as e:  # noqa: BLE001 - any import failure means: no fused kernels here
        warnings.warn(f"quarl_kernels.fp8_quant unavailable ({type(e).__name__}: {e}); FP8 quantizers fall back "
                      f"to torch.compile", RuntimeWarning, stacklevel=2)
        return None
    return fp8_quant


def quant_backend(t: torch.Tensor) -> str:
    """The quantizer implementation for tensors on ``t``'s device: triton | compile | eager."""
    b = os.environ.get("QUARL_FP8_QUANT", "").strip().lower()
    if b and b not in QUANT_BACKENDS:
        raise QuantError(f"QUARL_FP8_QUANT={b!r}: use one of {', '.join(QUANT_BACKENDS)}")
    if not t.is_cuda:
        return "triton" if b == "triton" and os.environ.get("TRITON_INTERPRET") == "1" else "eager"
    if not b:
        b = "eager" if os.environ.get("QUARL_FP8_COMPILE", "1") == "0" else "triton"
    if b == "triton" and _fused_module() is None:
        return "compile"
    return b


@functools.cache
def _compiled_quant():
    return torch.compile(quantize_act_1x128, dynamic=True)


def _quant_1x128(x: torch.Tensor, backend: str = "eager") -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [R, C] -> (q [R, C] E4M3 contiguous, s [R, C/128] fp32): ``quantize_act_1x128``, eager or
    compiled (one fused kernel reading ``x`` once, also when ``x`` is a transposed view)."""
    q, s = _compiled_quant()(x) if backend == "compile" else quantize_act_1x128(x)
    return q.contiguous(), s.contiguous()


def quantize_act_gemm(x: torch.Tensor, rows: int, cols: int, t_rows: int | None = None, row_groups: bool = True):
    """``x`` [M, C] -> ``(q, s, qt, st)``, the GEMM operands of one activation or gradient:

    * ``row_groups``: ``q`` [rows, cols] E4M3, ``s`` [rows, cols/128]: 1x128 groups along C (rows >= M
      and cols >= C zero-padded; forward X, DGrad dY);
    * ``t_rows`` (a multiple of 128): ``qt`` [cols, t_rows], ``st`` [cols, t_rows/128]: x^T in 1x128
      groups along the tokens, i.e. 128x1 of x (WGrad's X^T and dY^T).

    One kernel for both on the ``triton`` backend; the PyTorch quantizers otherwise."""
    backend = quant_backend(x)
    if backend == "triton":
        return _fused_module().quantize_act(x, rows, cols, t_rows, row_groups=row_groups)
    q = s = qt = st = None
    if row_groups:
        q, s = _quant_1x128(_pad2(x, rows, cols), backend)
    if t_rows is not None:
        qt, st = _quant_1x128(_pad2(x, t_rows, cols).t(), backend)
    return q, s, qt, st


def quantize_weight_128x128(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [N, K] -> (q [N, K] E4M3, s [ceil(N/128), ceil(K/128)] fp32): the ``fp8-block`` format."""
    qt = FORMAT.quantize(w.detach(), _WCFG)
    return qt.tensors["weight"], qt.tensors["weight_scale"]


def _tiles_padded(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [Np, Kp] (multiples of 128) -> (q [Np, Kp], s [Np/128, Kp/128]): the ``fp8-block``
    arithmetic (amax / 448, eps for zero tiles, divide, clamp, round-to-nearest-even cast) on a
    4-D view instead of a full-size scale matrix; bit-identical to :func:`quantize_weight_128x128`
    (tested), and one fused kernel under ``torch.compile``."""
    n, k = w.shape
    t = w.float().view(n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    s = _scale_from_amax(t.abs().amax(dim=(1, 3)))  # [Np/128, Kp/128]
    q = _to_fp8(t / s[:, None, :, None]).view(n, k)
    return q, s


@functools.cache
def _compiled_tiles():
    return torch.compile(_tiles_padded, dynamic=True)


def _weight_tiles(w: torch.Tensor, transpose: bool = False):
    """``w`` [N, K] -> (q [Np, Kp], s [Np/128, Kp/128], qt [Kp, Np] or None): the padded tiles and, on
    the ``triton`` backend with ``transpose``, their transpose from the same pass (else None)."""
    backend = quant_backend(w)
    if backend == "triton":
        return _fused_module().quantize_tiles(w.detach(), transpose)
    n, k = w.shape
    wp = _pad2(w.detach(), _round_up(n, BLOCK), _round_up(k, BLOCK))
    q, s = _compiled_tiles()(wp) if backend == "compile" else _tiles_padded(wp)
    return q, s, None


def quantize_weight_padded(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [N, K] -> (q [Np, Kp] zero-padded to multiples of 128, s [Np/128, Kp/128]), the layout the
    GEMMs take (Triton kernel on CUDA, see :func:`quant_backend`)."""
    q, s, _ = _weight_tiles(w)
    return q, s


def _transposed(q: torch.Tensor) -> torch.Tensor:
    """``q`` [Np, Kp] FP8 tiles -> [Kp, Np] contiguous (DGrad's B operand): the copy the quantizer
    wrote beside them when it is current, else a transpose."""
    hit = getattr(q, "_quarl_t", None)
    if hit is not None and hit[0] == q._version:
        return hit[1]
    return q.t().contiguous()


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _pad2(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad a 2-D tensor to [rows, cols] (FP8 through its bytes: 0x00 is +0.0)."""
    pr, pc = rows - x.shape[0], cols - x.shape[1]
    if pr == 0 and pc == 0:
        return x
    if x.dtype == torch.float8_e4m3fn:
        return F.pad(x.view(torch.uint8), (0, pc, 0, pr)).view(torch.float8_e4m3fn)
    return F.pad(x, (0, pc, 0, pr))


# --------------------------------------------------------------------------- the GEMM
def _cublas_ok(t: torch.Tensor) -> bool:
    if not t.is_cuda or os.environ.get("QUARL_FP8_GEMM", "auto") == "emulate":
        return False
    return hasattr(F, "scaled_mm") and torch.cuda.get_device_capability(t.device) == (9, 0)


# Caches ride on the tensors themselves (a tensor attribute lives and dies with the tensor; a
# WeakKeyDictionary would compare tensors with ==): the emulated path keeps the FP32 dequantized
# tiles of a weight while its FP8 tensor lives (a frozen base, or a master weight between
# optimizer steps), so CPU decoding does not redo them per token.
def _dequant_tiles(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    hit = getattr(q, "_quarl_deq", None)
    if hit is not None and hit[0] is s and hit[1] == q._version:
        return hit[2]
    r, c = q.shape
    full = s.repeat_interleave(BLOCK, dim=0)[:r].repeat_interleave(BLOCK, dim=1)[:, :c]
    out = q.float() * full
    q._quarl_deq = (s, q._version, out)
    return out


CUBLAS_FALLBACKS: dict[str, str] = {}  # scaling pair -> why cuBLAS refused it (then emulated)


def _note_fallback(msg: str) -> None:
    key = msg.split(":", 1)[0]
    if key not in CUBLAS_FALLBACKS:
        CUBLAS_FALLBACKS[key] = msg
        warnings.warn(f"FP8 blockwise GEMM {msg}; using the emulated FP32 path for it (slow)", RuntimeWarning,
                      stacklevel=3)


def blockwise_gemm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, b_tiles: bool,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """``a`` [M, K] E4M3 (1x128 scales ``sa`` [M, K/128]) times ``b`` [N, K] E4M3 transposed -> [M, N].

    ``b_tiles``: ``sb`` is [N/128, K/128] (128x128 tiles) rather than [N, K/128] (1x128 groups).
    K must be a multiple of 128 (callers pad); FP32 accumulation, result cast to ``out_dtype``.
    """
    if a.shape[1] % BLOCK or b.shape[1] != a.shape[1]:
        raise QuantError(f"blockwise_gemm: reduction sizes {a.shape[1]} / {b.shape[1]} must match and be "
                         f"multiples of {BLOCK} (pad before quantizing)")
    if _cublas_ok(a) and a.shape[0] % 4 == 0 and b.shape[0] % 16 == 0:
        sa_mm = sa.t().contiguous().t()  # [M, K/128], M-major
        if b_tiles:  # [N/128, K/128] -> K-blocks padded to a multiple of 4, transposed (see fp8.py); already a
            # multiple (every 7B/8B projection): the transposed view of the same storage, no copy kernel. Not
            # cached when padding is needed: a CUDA graph must re-read scales that rollout rewrites in place
            pad = -sb.shape[1] % 4
            layouts = [sb.t() if pad == 0 and sb.is_contiguous() else F.pad(sb, (0, pad)).t()]
            tb = F.ScalingType.BlockWise128x128
        else:  # 1x128 on B: [N, K/128] like A's (torch 2.11 asks for this shape); N-major as A's
            layouts = [sb.t().contiguous().t(), sb.contiguous()]
            tb = F.ScalingType.BlockWise1x128
        err = None
        for sb_mm in layouts:
            try:
                return F.scaled_mm(a, b.t(), sa_mm, F.ScalingType.BlockWise1x128, sb_mm, tb, output_dtype=out_dtype)
            except (RuntimeError, ValueError) as e:  # a layout this torch/cuBLAS refuses: try the next
                err = e
        # a cuBLAS without this scaling pair: the same numbers, emulated
        _note_fallback(f"{'1x128 x 128x128' if b_tiles else '1x128 x 1x128'}: {str(err).splitlines()[0]}")
    a32 = dequantize_act_1x128(a, sa)  # [M, K] exact in fp32
    b32 = _dequant_tiles(b, sb) if b_tiles else dequantize_act_1x128(b, sb)  # [N, K]
    return (a32 @ b32.t()).to(out_dtype)


# --------------------------------------------------------------------------- autograd
class FP8LinearFunction(torch.autograd.Function):
    """``y = x @ W^T + b`` with the three GEMMs in FP8 (module docstring). Inputs:
    ``x`` [..., K]; ``wq, ws`` the weight's FP8 tiles padded to multiples of 128; ``weight`` the master
    [N, K] (None for a frozen base: no WGrad); ``n`` the true out features."""

    @staticmethod
    def forward(ctx, x, weight, bias, wq, ws, n):
        # wq [Np, Kp] (padded to multiples of 128), ws [Np/128, Kp/128], n: the true out features
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)  # [M, K]
        m = x2.shape[0]
        kp, np_ = wq.shape[1], wq.shape[0]
        mp = _round_up(m, 4) if x.is_cuda else m
        need_w = weight is not None and ctx.needs_input_grad[1]
        # X in 1x128 groups along K for this GEMM and, for WGrad, X^T in 1x128 groups along the tokens
        # (128x1 of X), saved in FP8: xq [Mp, Kp], xs [Mp, Kp/128], xtq [Kp, M128], xts [Kp, M128/128]
        xq, xs, xtq, xts = quantize_act_gemm(x2, mp, kp, _round_up(m, BLOCK) if need_w else None)
        y = blockwise_gemm(xq, xs, wq, ws, True, x.dtype)[:m, :n]  # [M, N]
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(wq, ws, xtq, xts)
        ctx.shape = (lead, m, n, k, kp, np_)
        ctx.x_dtype = x.dtype
        ctx.w_dtype = weight.dtype if weight is not None else None
        ctx.b_dtype = bias.dtype if bias is not None else None
        return y.reshape(*lead, n)

    @staticmethod
    def backward(ctx, dy):
        wq_p, ws, xtq, xts = ctx.saved_tensors
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
            dx = blockwise_gemm(dyq, dys, wtq, ws.t().contiguous(), True, ctx.x_dtype)[:m, :k]
            dx = dx.reshape(*lead, k)
        if need_w:  # WGrad: dW = dY^T X, reduction over tokens, written in the master weight's dtype
            dw = blockwise_gemm(dytq, dyts, xtq, xts, False, ctx.w_dtype)[:n, :k]
            dw = dw if dw.is_contiguous() else dw.contiguous()
        if ctx.b_dtype is not None and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0).to(ctx.b_dtype)
        return dx, dw, db, None, None, None


def _master_tiles(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Master weight [N, K] -> (padded FP8 tiles [Np, Kp], scales): quantized once per optimizer
    step (the weight's ``_version`` moves), however many micro-batches or decode steps use it."""
    hit = getattr(w, "_quarl_fp8", None)
    if hit is not None and hit[0] == w._version and hit[1].device == w.device:
        return hit[1], hit[2]
    # [Np, Kp], [Np/128, Kp/128], and DGrad's transposed tiles [Kp, Np] when the kernel writes them
    qp, s, qt = _weight_tiles(w, transpose=w.requires_grad)
    if hit is not None and hit[1].shape == qp.shape and hit[1].device == qp.device:
        # in place: the addresses stay, so a CUDA graph captured on them (rollout) reads the new weight
        hit[1].copy_(qp)
        hit[2].copy_(s)
        qp, s = hit[1], hit[2]
    if qt is not None:
        qp._quarl_t = (qp._version, qt)
    w._quarl_fp8 = (w._version, qp, s)
    return qp, s


def _frozen_tiles(qt: QTensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, s = qt.tensors["weight"], qt.tensors["weight_scale"]
    hit = getattr(q, "_quarl_fp8", None)
    if hit is not None and hit[0] == q._version and hit[1].device == q.device:
        return hit[1], hit[2]
    n, k = q.shape
    qp = _pad2(q, _round_up(n, BLOCK), _round_up(k, BLOCK))
    q._quarl_fp8 = (q._version, qp, s)
    return qp, s


def fp8_linear(x: torch.Tensor, weight: torch.Tensor | QTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` [..., K] @ ``weight``^T [+ bias] through FP8 GEMMs; differentiable in ``x``, a master
    ``weight`` and ``bias``. ``weight``: a tensor [N, K] (quantized to 128x128 tiles whenever it has
    changed) or an ``fp8-block`` QTensor (frozen). Returns ``x.dtype``."""
    if isinstance(weight, QTensor):
        cfg = weight.config
        if cfg.name != "fp8" or cfg.granularity != "block" or cfg.block_size != BLOCK:
            raise QuantError(f"fp8_linear needs an fp8-block (128x128) weight, got {cfg}")
        wq, ws = _frozen_tiles(weight)
        return FP8LinearFunction.apply(x, None, bias, wq, ws, weight.shape[0])
    if ACT_GROUP != BLOCK:  # pragma: no cover - a constant; the GEMM layouts assume it
        raise QuantError("fp8_linear assumes 1x128 activation groups")
    wq, ws = _master_tiles(weight)
    # no autograd graph (rollout, eval): pass no master weight, so the forward skips X^T's quantization for a
    # WGrad that never comes (inside the Function, needs_input_grad still says True under no_grad)
    return FP8LinearFunction.apply(x, weight if torch.is_grad_enabled() else None, bias, wq, ws, weight.shape[0])


__all__ = ["FP8LinearFunction", "blockwise_gemm", "fp8_linear", "quantize_weight_128x128"]
