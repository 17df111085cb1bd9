"""Launch helpers shared by the weight-only GEMM modules (``wo_gemm``, ``gemv``, ``mma_decode``, ``norm``).

They lived in ``wo_gemm``, which ``gemv`` and ``mma_decode`` then imported back
inside their launchers while ``wo_gemm`` imported them: an import circle between
kernel modules. One small module below all of them removes it.
"""

from __future__ import annotations

import os
import typing

import torch
import triton
import triton.language as tl

__all__ = ["DecodeOperands", "decode_operands", "env_flag", "finish_splits", "interpreting", "num_sms",
           "splitk_reduce_kernel"]


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


class DecodeOperands(typing.NamedTuple):
    """What the register-decode kernels (``mma_decode``, ``wgmma_decode``) take besides the weight words."""

    x2: torch.Tensor  # [M, K] bf16, contiguous
    scale: torch.Tensor  # [N, G]: e4m3 / e8m0 bytes (NVFP4 / MXFP4), fp32 or bf16 (INT4)
    zero: torch.Tensor  # [N, G] int8 zero points (INT4 with zeros), else ``scale`` (unused)
    gscale: torch.Tensor  # NVFP4's global scale, else ``scale`` (unused)
    y: torch.Tensor  # [M, N] output in x's dtype
    out: torch.Tensor  # where the kernel writes: ``y``, or fp32 partials [S, M, N] when split over K
    out_strides: tuple[int, int]  # (split, row) strides of ``out``


def _byte_view(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, G] bytes of a byte tensor passed either as bytes or as its int32 view [N, G/4]."""
    return t.view(dtype) if t.dtype in (torch.int32, torch.uint8, torch.int8, torch.float8_e4m3fn) else t


def decode_operands(x2: torch.Tensor, pw, split: int, int4: bool) -> DecodeOperands:
    """Operands and output buffers of one decode launch of ``pw`` (a ``wo_gemm.PackedWeight``)."""
    m = x2.shape[0]
    if int4:
        s = pw.scale  # [N, G] fp32 (or bf16)
        z = _byte_view(pw.zero, torch.int8) if pw.zero is not None else s
    else:
        s = _byte_view(pw.scale, torch.uint8)  # [N, G] e4m3 / e8m0 bytes
        z = s
    gs = pw.gscale if pw.gscale is not None else s
    y = torch.empty((m, pw.n), device=x2.device, dtype=x2.dtype)
    out = y if split == 1 else torch.empty((split, m, pw.n), device=x2.device, dtype=torch.float32)
    strides = (0, y.stride(0)) if split == 1 else (out.stride(0), out.stride(1))
    return DecodeOperands(x2.contiguous(), s, z, gs, y, out, strides)


def finish_splits(ops: DecodeOperands, split: int) -> torch.Tensor:
    """``ops.y``: the fp32 partials summed in split order (deterministic) when the launch was split over K."""
    if split > 1:
        mn = ops.y.numel()
        splitk_reduce_kernel[(triton.cdiv(mn, 1024),)](ops.out, ops.y, mn, SPLIT_K=split, BLOCK=1024, num_warps=4)
    return ops.y

