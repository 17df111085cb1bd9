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
* DeepGEMM (SM90, wherever ``deep_gemm`` imports; ``QUARL_FP8_GEMM=auto``, the default, or ``deepgemm``):
  DeepSeek's kernel for the two GEMMs with 128x128 weight tiles (forward, DGrad, and WGrad with
  ``wgrad="tiles"``: ``fp8_gemm_nt``'s 1D2D kernel, 1.11-1.25x cuBLAS's per layer on an H200, up to 1.6x on
  the small k/v GEMMs, bit-identical outputs; the rollout's decode GEMMs above the GEMV's rows too: Jet-RL's
  Qwen3-8B rollout at batch 64 1.29x BF16 against cuBLAS's 1.06x, session 30), cuBLAS for the 1x128 x 1x128
  WGrad (DeepGEMM's 1D1D kernel was 0.89-1.04x cuBLAS's and writes FP32). DeepGEMM is not on PyPI and
  compiles its kernels at run time with ``nvcc``; it is an optional extra for images that build it
  (benchmarks/RESULTS.md "Jet-RL"). ``QUARL_FP8_GEMM=cublas`` keeps cuBLAS everywhere.
* decode rows (``M <= FP8_GEMV_MAX_M`` rows, 128x128 weight tiles: rollout and eval) on CUDA: the FP8 GEMV
  (``quarl_kernels.fp8_gemv``), the same blockwise-scaled product streamed at weight-read speed where cuBLAS's
  kernels are tuned for large M. ``QUARL_FP8_GEMV=0`` keeps cuBLAS / DeepGEMM there, ``1`` takes the GEMV up to
  64 rows.
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

import contextlib
import functools
import os
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch.autograd.graph import increment_version
from torch.optim.optimizer import register_optimizer_step_post_hook

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


# --------------------------------------------------------------------------- the GEMM
GEMM_BACKENDS = ("auto", "cublas", "deepgemm", "emulate")


@functools.cache
def deepgemm_available() -> bool:
    """Whether :func:`_deep_gemm` gets the package (built for this machine: it is not on PyPI)."""
    try:
        _deep_gemm()
    except Exception:  # noqa: BLE001 -- not installed (QuantError), or a build for another torch / CUDA failing to load
        return False
    return True


def gemm_backend() -> str:
    """``QUARL_FP8_GEMM``: ``auto`` (the default: DeepGEMM where it imports, else cuBLAS -- the same FP8 operands
    and FP32 block sums), ``cublas`` (cuBLAS on SM90, emulated elsewhere), ``deepgemm`` (DeepGEMM on SM90; an error
    without it) or ``emulate`` (FP32 everywhere); anything else is an error naming the variable."""
    mode = os.environ.get("QUARL_FP8_GEMM", "auto").strip().lower() or "auto"
    if mode not in GEMM_BACKENDS:
        raise QuantError(f"QUARL_FP8_GEMM={mode!r}: expected one of {', '.join(GEMM_BACKENDS)}")
    if mode == "auto":
        return "deepgemm" if deepgemm_available() else "cublas"
    return mode


def _cublas_ok(t: torch.Tensor) -> bool:
    if not t.is_cuda or gemm_backend() == "emulate":
        return False
    return _sm90(t.device.index if t.device.index is not None else torch.cuda.current_device())


@functools.cache
def _deep_gemm():
    try:
        import deep_gemm
    except ImportError as e:
        raise QuantError("QUARL_FP8_GEMM=deepgemm needs the deep_gemm package (github.com/deepseek-ai/DeepGEMM, "
                         "built with nvcc for SM90); install it or unset QUARL_FP8_GEMM for cuBLAS") from e
    return deep_gemm


def _deepgemm(a, sa, b, sb, out_dtype: torch.dtype) -> torch.Tensor:
    """:func:`blockwise_gemm` with 128x128 tiles on B, on DeepGEMM's 1D2D kernel: A [M, K] with M-major
    1x128 scales (``sa`` as the quantizers store it: no copy), B [N, K] K-major, output bf16 or fp32."""
    d = torch.empty(a.shape[0], b.shape[0], device=a.device,
                    dtype=out_dtype if out_dtype in (torch.bfloat16, torch.float32) else torch.bfloat16)
    _deep_gemm().fp8_gemm_nt((a, sa), (b, sb.contiguous()), d, recipe=(1, 128, 128))
    return d if d.dtype == out_dtype else d.to(out_dtype)


@functools.cache
def _sm90(index: int) -> bool:
    return hasattr(F, "scaled_mm") and torch.cuda.get_device_capability(index) == (9, 0)


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
DEEPGEMM_FALLBACKS: dict[tuple, str] = {}  # (A shape, B shape) -> why DeepGEMM refused it (then cuBLAS)
SCALE_LAYOUT: dict[bool, int] = {}  # b_tiles -> index of the B-scale layout this torch/cuBLAS took (tried first)


# Rows up to which the decode GEMV takes the 1x128 x 128x128 GEMM by default (QUARL_FP8_GEMV unset; the H100
# sweep in RESULTS.md "An FP8 decode GEMV": faster than cuBLAS to 16 rows, slower at 64), and with QUARL_FP8_GEMV=1
FP8_GEMV_MAX_M = 16
FP8_GEMV_LIMIT_M = 64


def gemv_rows() -> int:
    """``QUARL_FP8_GEMV``: unset / ``auto`` -> :data:`FP8_GEMV_MAX_M`, ``0`` -> never, ``1`` -> up to
    :data:`FP8_GEMV_LIMIT_M` rows."""
    mode = os.environ.get("QUARL_FP8_GEMV", "auto").strip().lower() or "auto"
    if mode not in ("auto", "0", "1"):
        raise QuantError(f"QUARL_FP8_GEMV={mode!r}: use auto, 0 (never) or 1 (up to 64 rows)")
    return {"auto": FP8_GEMV_MAX_M, "0": 0, "1": FP8_GEMV_LIMIT_M}[mode]


@functools.cache
def _gemv_module():
    """``quarl_kernels.fp8_gemv``, or None (no Triton / kernels package: the GEMMs below serve)."""
    try:
        from quarl_kernels import fp8_gemv
    except Exception as e:  # noqa: BLE001 - any import failure means: no GEMV here
        warnings.warn(f"quarl_kernels.fp8_gemv unavailable ({type(e).__name__}: {e}); FP8 decode uses cuBLAS",
                      RuntimeWarning, stacklevel=2)
        return None
    return fp8_gemv


def _gemv_ok(a: torch.Tensor) -> bool:
    if a.shape[0] > FP8_GEMV_LIMIT_M:  # training-sized GEMMs leave here, before any environment lookup
        return False
    if a.shape[0] > gemv_rows() or gemm_backend() == "emulate":
        return False
    on_device = _cublas_ok(a) or (not a.is_cuda and os.environ.get("TRITON_INTERPRET") == "1"
                                  and os.environ.get("QUARL_FP8_GEMV") == "1")  # its CPU test
    return on_device and _gemv_module() is not None


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
    if b_tiles and _gemv_ok(a):  # decode rows: the FP8 GEMV (module docstring)
        return _gemv_module().fp8_gemv(a, sa, b, sb, out_dtype)
    if b_tiles and _cublas_ok(a) and a.shape[0] % 4 == 0 and b.shape[0] % 16 == 0 and gemm_backend() == "deepgemm":
        key = (tuple(a.shape), tuple(b.shape))
        if key not in DEEPGEMM_FALLBACKS:
            try:
                return _deepgemm(a, sa, b, sb, out_dtype)
            except RuntimeError as e:  # a shape or layout its kernels refuse: cuBLAS below, the same numbers
                DEEPGEMM_FALLBACKS[key] = str(e).splitlines()[0] if str(e) else type(e).__name__
                warnings.warn(f"DeepGEMM refused the FP8 GEMM {key}: {DEEPGEMM_FALLBACKS[key]}; using cuBLAS for it",
                              RuntimeWarning, stacklevel=2)
    if _cublas_ok(a) and a.shape[0] % 4 == 0 and b.shape[0] % 16 == 0:
        sa_mm = sa if sa.stride(0) == 1 else sa.t().contiguous().t()  # [M, K/128], M-major (the kernels' layout)
        if b_tiles:  # [N/128, K/128] -> K-blocks padded to a multiple of 4, transposed (see fp8.py); already a
            # multiple (every 7B/8B projection): the transposed view of the same storage, no copy kernel. Not
            # cached when padding is needed: a CUDA graph must re-read scales that rollout rewrites in place
            pad = -sb.shape[1] % 4
            layouts = (lambda: sb.t() if pad == 0 and sb.is_contiguous() else F.pad(sb, (0, pad)).t(),)
            tb = F.ScalingType.BlockWise128x128
        else:  # 1x128 on B: [N, K/128] like A's (torch 2.11 asks for this shape); N-major as A's, else row-major
            layouts = (lambda: sb if sb.stride(0) == 1 else sb.t().contiguous().t(), sb.contiguous)
            tb = F.ScalingType.BlockWise1x128
        # built lazily, the one that worked before first: no copy kernel and no raised error per call
        order = range(len(layouts))
        if SCALE_LAYOUT.get(b_tiles, 0) != 0:
            order = [SCALE_LAYOUT[b_tiles], *(i for i in order if i != SCALE_LAYOUT[b_tiles])]
        err = None
        for i in order:
            try:
                y = F.scaled_mm(a, b.t(), sa_mm, F.ScalingType.BlockWise1x128, layouts[i](), tb, output_dtype=out_dtype)
            except (RuntimeError, ValueError) as e:  # a layout this torch/cuBLAS refuses: try the next
                err = e
                continue
            SCALE_LAYOUT[b_tiles] = i
            return y
        # a cuBLAS without this scaling pair: the same numbers, emulated
        _note_fallback(f"{'1x128 x 128x128' if b_tiles else '1x128 x 1x128'}: {str(err).splitlines()[0]}")
    a32 = dequantize_act_1x128(a, sa)  # [M, K] exact in fp32
    b32 = _dequant_tiles(b, sb) if b_tiles else dequantize_act_1x128(b, sb)  # [N, K]
    return (a32 @ b32.t()).to(out_dtype)


@functools.cache
def _launch_module():
    """``quarl_kernels.launch`` (its in-place epilogue pass), or None (no Triton / kernels package)."""
    try:
        from quarl_kernels import launch
    except Exception:  # noqa: BLE001 - any import failure means: PyTorch's add
        return None
    return launch


def add_bias(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``y + bias`` (``y`` [M, N], a GEMM's fresh output; ``bias`` [N] cast to y's dtype first). On CUDA, a contiguous
    ``y`` gets the weight-only kernels' epilogue pass in place (``quarl_kernels.launch.finish``: fp32 sum, one
    rounding -- PyTorch's bits): PyTorch's broadcast add runs its non-vectorized kernel, 0.3 ms of a 55 ms 32B-width
    FP8 layer on an H200 for the q / k / v biases (RESULTS.md "Session 26")."""
    b = bias.to(y.dtype)
    if y.is_cuda and y.dim() == 2 and y.is_contiguous() and b.is_contiguous() and _launch_module() is not None:
        launch = _launch_module()
        return launch.finish(y, y, 1, launch.Epilogue(bias=b))
    return y + b


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
