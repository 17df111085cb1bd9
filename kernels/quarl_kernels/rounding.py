"""Round-to-nearest-even casts from fp32 that give the same bits on the GPU and in Triton's interpreter.

The fused elementwise kernels (``norm``, ``rope``, ``act``) promise PyTorch's
results bit for bit, and PyTorch rounds every bf16/fp16 op separately: it
computes ``a * b`` in fp32 and rounds the result to the storage dtype
(round-to-nearest-even). The kernels therefore compute in fp32 and round
explicitly after each op that PyTorch would round, with these helpers.

On the GPU a plain ``x.to(dtype)`` is already RNE (``cvt.rn.bf16.f32``,
``cvt.rn.f16.f32``, ``cvt.rn.satfinite.e4m3x2.f32``). Triton 3.6's CPU
interpreter is not: it *truncates* fp32 -> bf16, and its fp32 -> fp8 "RTNE"
rounds ties away and drops the mantissa carry. Under ``INTERPRET`` the helpers
first round the fp32 value in software to one that the target represents
exactly (so the interpreter's conversion has nothing left to round), which lets
the CPU tests demand exact equality with PyTorch. fp16 needs no help (NumPy's
``astype(float16)`` is RNE). The software path is compiled out on the GPU.
"""

from __future__ import annotations

import struct

import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)  # float8_e4m3fn's largest finite value
# fp32(1 / 448): CUDA PyTorch divides by a Python-float 448 as a multiply by this
INV_FP8_MAX = tl.constexpr(struct.unpack("f", struct.pack("f", 1.0 / 448.0))[0])
FP32_EPS = tl.constexpr(2.0**-23)  # torch.finfo(torch.float32).eps: the scale of an all-zero block


@triton.jit
def round_to(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 ``x`` -> ``dtype`` (bf16 / fp16 / fp32), round to nearest even."""
    if INTERPRET and dtype == tl.bfloat16:
        # RNE on the bit pattern: add 0x7FFF plus the lowest kept bit, drop the low 16 bits
        # (carries into the exponent as they should; overflow rounds to inf like the hardware)
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        x = b.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def round_to_fp8(x, INTERPRET: tl.constexpr):
    """fp32 ``x`` already clamped to [-448, 448] -> float8_e4m3fn, round to nearest even
    (what ``x.clamp(-448, 448).to(torch.float8_e4m3fn)`` gives)."""
    if INTERPRET:
        a = tl.abs(x)
        # normal range (>= 2**-6): 3 mantissa bits kept, 20 dropped, RNE on the bit pattern
        b = a.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFFF + ((b >> 20) & 1)) & 0xFFF00000
        normal = b.to(tl.float32, bitcast=True)
        # subnormal range: multiples of 2**-9; fp32 addition at 2**14 (ulp 2**-9) rounds RNE
        sub = (a + 16384.0) - 16384.0
        r = tl.where(a < 0.015625, sub, normal).to(tl.uint32, bitcast=True)
        sign = x.to(tl.uint32, bitcast=True) & 0x80000000  # keeps -0.0 as -0.0 (byte 0x80)
        x = (r | sign).to(tl.float32, bitcast=True)
    return x.to(tl.float8e4nv)
