"""The FP8 operands of the training linear (:mod:`quarl.quant.fp8_linear`), in the layouts its GEMMs read.

Activations and gradients in 1x128 groups (along K for the forward's X and DGrad's dY; along the tokens for WGrad's
X^T and dY^T, which is 128x1 of X / dY), weights in 128x128 tiles, all E4M3 with FP32 scales and zero-padded to
multiples of 128 (:func:`quantize_act_gemm`, :func:`quantize_weight_padded`). Three implementations of the same
quantizers (:func:`quant_backend`): the fused Triton kernels of ``quarl_kernels.fp8_quant`` (the CUDA default: one
pass per operand, both groupings at once), the PyTorch ones through ``torch.compile``, and the PyTorch ones eagerly
(the oracle; bit-identical to compressed-tensors' through :mod:`quarl.quant.formats.fp8`).

One activation is quantized once when several projections read it (q / k / v, gate / up: :func:`quantize_input`'s
memo, :func:`shared_input` for the rollout), and a weight's transposed tiles / scales ride on the tensors they
belong to (:func:`_transposed`, :func:`_scales_t`), kept while the tensor's version is unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
import weakref

import torch
import torch.nn.functional as F

from quarl.quant.base import QuantError
from quarl.quant.formats.fp8 import FORMAT, FP8Config, _scale_from_amax, _to_fp8, quantize_act_1x128

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


# --------------------------------------------------------------------------- one activation, quantized once
# q, k and v read the same normed hidden state, gate and up another: their forward A operand and WGrad's
# X^T are the same bits, so the first projection's quantization serves the next ones -- one pass over X
# instead of three (two), and the X^T saved for backward is one tensor shared by the three, not three
# copies. One slot, keyed by the tensor itself (a weak reference: the slot never keeps X alive, and a new
# tensor at a recycled id or address never hits), its version counter (every in-place write through
# PyTorch moves it), data pointer, shape, strides and the layout asked for. Only under autograd
# (training): rollout and eval run under no_grad and may refill static buffers (CUDA-graph inputs) with
# kernels that move no version counter, so they never memoize. The backward pass empties the slot, so the
# last forward's operands are not held through it. ``QUARL_FP8_MEMO=0`` turns it off.
_X_SLOT: list = [None]  # [(weakref to x, key, (q, s, qt, st))]


_SHARED = [0]  # depth of open shared_input() scopes


def memo_on() -> bool:
    """Whether a call now may use the memo: under autograd (asked outside the autograd Function, whose
    forward runs with grad mode off) or inside :func:`shared_input`, and not ``QUARL_FP8_MEMO=0``."""
    return (torch.is_grad_enabled() or _SHARED[0] > 0) and os.environ.get("QUARL_FP8_MEMO", "1") != "0"


@contextlib.contextmanager
def shared_input():
    """A scope in which FP8 projections reading the same, unchanged X share one quantization of it under no_grad
    too (the memo above). The rollout engine opens one around a decoder layer's q / k / v and around its MLP:
    those projections read one X that nothing rewrites inside the scope, so the hazard that keeps no_grad calls off
    the memo (a static CUDA-graph buffer refilled, between two forwards, by a kernel that moves no version counter)
    cannot arise within it. At decode that is 3 of the 7 quantizer launches of a layer (108 of a Qwen3-8B step);
    the codes are the same, so the outputs are. The slot is emptied when the outermost scope opens and closes."""
    if _SHARED[0] == 0:
        clear_input_memo()
    _SHARED[0] += 1
    try:
        yield
    finally:
        _SHARED[0] -= 1
        if _SHARED[0] == 0:
            clear_input_memo()


def _x_tiles_t(x2: torch.Tensor, t_rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x2`` [M, K] -> X^T in 128x128 tiles: codes [Kp, Mt] and tile scales [Kp/128, Mt/128] (``wgrad="tiles"``;
    the tiles of X^T are the transposed tiles of X, as for the weight)."""
    q, s, qt = _weight_tiles(x2, transpose=True)  # [Mt, Kp], [Mt/128, Kp/128], [Kp, Mt] or None
    if q.shape != (t_rows, cols):
        raise QuantError(f"X^T tiles: got {tuple(q.shape)}, expected ({t_rows}, {cols})")
    return (qt if qt is not None else q.t().contiguous()), s.t().contiguous()


def _quantize_x(x2: torch.Tensor, rows: int, cols: int, t_rows: int | None, t_tiles: bool):
    if t_rows is None or not t_tiles:
        return quantize_act_gemm(x2, rows, cols, t_rows)
    if quant_backend(x2) == "triton":  # row groups and X^T's tiles from one launch setting, no unused codes
        return _fused_module().quantize_act(x2, rows, cols, t_rows, t_tiles=True)
    q, s, _, _ = quantize_act_gemm(x2, rows, cols, None)
    return (q, s, *_x_tiles_t(x2, t_rows, cols))


def quantize_input(x: torch.Tensor, x2: torch.Tensor, rows: int, cols: int, t_rows: int | None, memo: bool = True,
                   t_tiles: bool = False):
    """``x2`` = ``x`` as [M, K] -> :func:`quantize_act_gemm`'s ``(q, s, qt, st)`` (row groups, and X^T when
    ``t_rows``: in 1x128 groups along the tokens, or with ``t_tiles`` in 128x128 tiles); with ``memo``, reusing
    the previous call's operands when it quantized the same, unchanged ``x``, and leaving its own for the next
    call."""
    if not memo:
        return _quantize_x(x2, rows, cols, t_rows, t_tiles)
    key = (x2.data_ptr(), x._version, tuple(x2.shape), x2.stride(), x2.dtype, x2.device, rows, cols, t_tiles)
    slot = _X_SLOT[0]
    if slot is not None and slot[0]() is x and slot[1] == key and (t_rows is None or slot[2][2] is not None):
        q, s, qt, st = slot[2]
        if t_rows is None:
            return q, s, None, None
        if qt.shape[1] == t_rows:
            return q, s, qt, st
    out = _quantize_x(x2, rows, cols, t_rows, t_tiles)
    _X_SLOT[0] = (weakref.ref(x), key, out)
    return out


def clear_input_memo() -> None:
    """Drop the memoized activation operands (the backward pass does; tests)."""
    _X_SLOT[0] = None


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
        # a column block of stacked tiles (quarl.quant.fp8_stack) when the projection runs alone: copied
        return hit[1] if hit[1].is_contiguous() else hit[1].contiguous()
    return q.t().contiguous()


def _scales_t(s: torch.Tensor) -> torch.Tensor:
    """Tile scales [Np/128, Kp/128] -> [Kp/128, Np/128] contiguous (DGrad's B scales), kept beside ``s``
    while it is unchanged: once per weight version (a frozen base: once), not once per backward."""
    hit = getattr(s, "_quarl_t", None)
    if hit is not None and hit[0] == s._version:
        return hit[1]
    st = s.t().contiguous()
    s._quarl_t = (s._version, st)
    return st


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



__all__ = [
    "BLOCK",
    "QUANT_BACKENDS",
    "clear_input_memo",
    "memo_on",
    "quant_backend",
    "quantize_act_gemm",
    "quantize_input",
    "quantize_weight_128x128",
    "quantize_weight_padded",
    "shared_input",
]
