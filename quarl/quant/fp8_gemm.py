"""The blockwise-scaled FP8 GEMM of the training linear (:mod:`quarl.quant.fp8_linear`) and where it runs.

One GEMM, four routes (:func:`blockwise_gemm`): both operands are given as
``[rows, K]`` with the reduction along K, ``A`` in 1x128 groups and ``B`` in 1x128
groups or 128x128 tiles.

* CUDA, compute capability 9.0 (Hopper): ``torch.nn.functional.scaled_mm`` with
  ``ScalingType.BlockWise1x128`` / ``BlockWise128x128`` (cuBLASLt), the scale layouts
  that :func:`quarl.quant.formats.fp8.cublas_blockwise_scales` documents; the
  quantizers are fused Triton kernels (``quarl_kernels.fp8_quant``: one pass per operand,
  X and dY in both groupings at once, codes and scales written in these layouts; bit-identical
  to the eager quantizers). ``QUARL_FP8_QUANT=compile`` / ``eager`` selects the PyTorch ones
  (see :func:`quarl.quant.fp8_operands.quant_backend`).
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
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
import torch.nn.functional as F

from quarl.quant.base import QuantError
from quarl.quant.formats.fp8 import dequantize_act_1x128
from quarl.quant.fp8_operands import BLOCK

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



__all__ = [
    "CUBLAS_FALLBACKS",
    "DEEPGEMM_FALLBACKS",
    "FP8_GEMV_LIMIT_M",
    "FP8_GEMV_MAX_M",
    "GEMM_BACKENDS",
    "add_bias",
    "blockwise_gemm",
    "deepgemm_available",
    "gemm_backend",
    "gemv_rows",
]
