"""Launch helpers shared by the weight-only GEMM modules (``wo_gemm``, ``gemv``, ``mma_decode``, ``norm``).

They lived in ``wo_gemm``, which ``gemv`` and ``mma_decode`` then imported back
inside their launchers while ``wo_gemm`` imported them: an import circle between
kernel modules. One small module below all of them removes it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["env_flag", "interpreting", "num_sms", "splitk_reduce_kernel"]


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (split-K sizing)."""
    if device.type != "cuda":  # TRITON_INTERPRET=1 runs on CPU tensors: pretend an H100
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (CPU emulation: no inline PTX, no Gluon)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_ON = ("1", "true", "on", "yes")
_OFF = ("", "0", "false", "off", "no")


def env_flag(name: str, default: bool) -> bool:
    """An on/off switch from the environment: 1 / true / on / yes, or 0 / false / off / no
    (case-insensitive); unset means ``default``. Anything else is an error naming the variable."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in _ON:
        return True
    if v in _OFF:
        return False
    raise ValueError(f"{name}={raw!r} is neither on nor off: set it to 1 (on) or 0 (off)")


@triton.jit
def splitk_reduce_kernel(ws_ptr, y_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """y[i] = sum_s ws[s, i] in split order (deterministic). ws [S, M*N] fp32."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)
