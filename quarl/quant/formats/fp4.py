"""The E2M1 (FP4) element codec shared by NVFP4 and MXFP4.

E2M1 is a 4-bit float: 1 sign bit, 2 exponent bits, 1 mantissa bit, no
inf/NaN. Its 16 codes decode to ``±{0, 0.5, 1, 1.5, 2, 3, 4, 6}``; code bit 3
is the sign and bits 0-2 index the magnitude table, so code ``c`` means
``(-1)**(c >> 3) * E2M1_VALUES[c & 7]`` (the OCP MX v1.0 / NVIDIA layout, and
the one compressed-tensors and vLLM use).

Encoding is round-to-nearest with ties to the even *code* (the mantissa bit
0), saturating at ±6 -- what a hardware cvt.rn.satfinite does:

    0.25 -> 0   0.75 -> 1   1.25 -> 1   1.75 -> 2   2.5 -> 2   3.5 -> 4   5 -> 4

The sign bit is set iff the input is strictly negative, so a small negative
value that rounds to zero encodes as -0 (code 8) while an exact -0.0 encodes
as +0 (code 0). This matches compressed-tensors bit for bit (both its CPU
``cast_to_fp4`` + ``pack_fp4_to_uint8`` path and its Triton kernel), which is
what makes our packed bytes identical to its checkpoints; -0 decodes to -0.0,
so the value is the same either way.

Packing puts two codes per byte, the even column in the LOW nibble
(``byte = code[2j] | code[2j+1] << 4``), again matching compressed-tensors.

Everything here is vectorized torch on any device; the scale handling
(per-block, per-tensor) belongs to the format modules. Inputs are computed in
float32: the thresholds below are exact in fp32, and both formats produce the
scaled value ``w / scale`` in fp32 anyway.
"""

from __future__ import annotations

import torch

from quarl.quant.base import QuantError

E2M1_MAX = 6.0
E2M1_EMAX = 2  # floor(log2(6)): the largest E2M1 exponent, used by MX scales
# Magnitudes indexed by code & 7.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between consecutive magnitudes; a value exactly on the midpoint
# after an odd code (0.75, 1.75, 3.5) rounds up to the even code, the others
# (0.25, 1.25, 2.5, 5.0) round down to the even code.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_ROUND_UP_TIES = (0.75, 1.75, 3.5)

_TABLES: dict[torch.device, torch.Tensor] = {}


def _value_table(device: torch.device) -> torch.Tensor:
    """fp32 [8] magnitude table, created once per device."""
    t = _TABLES.get(device)
    if t is None:
        t = _TABLES[device] = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return t


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round ``x`` (any shape, any float dtype) to E2M1 codes: uint8 in [0, 15].

    Round-to-nearest-even at ties, saturating at ±6; NaN is not supported
    (the format modules reject non-finite weights before calling this).
    """
    x = x.float()
    a = x.abs()
    # Magnitude code = number of midpoints below |x|; at a tie the comparison
    # is >= when the code above is even, > when the code below is even.
    # Saturation falls out (everything > 5 -> code 7). Seven uint8 compares
    # beat bucketize + isin ~7x on CPU.
    mag = torch.zeros_like(a, dtype=torch.uint8)
    for mid in _MIDPOINTS:
        mag += (a >= mid) if mid in _ROUND_UP_TIES else (a > mid)
    return mag | ((x < 0).to(torch.uint8) << 3)


def decode_e2m1(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """E2M1 codes (uint8 in [0, 15]) -> values of ``dtype`` (exact in any float dtype)."""
    if codes.dtype != torch.uint8:
        raise QuantError(f"E2M1 codes must be uint8, got {codes.dtype}; use encode_e2m1 or unpack_fp4")
    mag = _value_table(codes.device)[(codes & 7).long()]  # same shape as codes
    neg = (codes & 8).bool()
    return torch.where(neg, -mag, mag).to(dtype)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value (fp32): ``decode_e2m1(encode_e2m1(x))`` bit for bit, in a third of the kernels.

    The E2M1 magnitudes are a grid of step 0.5 below 2, 1 in [2, 4) and 2 from 4 on (saturating at 6),
    so the nearest value is ``round(|x| / step) * step`` with torch.round's ties-to-even, which is the
    codec's tie rule at every midpoint (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
    5 -> 4); the divisions by powers of two are exact. The sign is set iff x < 0, as in the codec
    (-0.0 -> +0, a small negative -> -0). This is the hot path of fake quantization (every QAT
    forward) and of GPTQ's column loop.
    """
    x = x.float()
    a = x.abs()
    step = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))
    m = (torch.round(a / step) * step).clamp_(max=E2M1_MAX)
    return torch.where(x < 0, -m, m)


def e2m1_codes_signed(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of values already on the grid, keeping the sign of -0.0 (code 8):
    ``quantize`` emits -0 for small negatives that round to zero, and packing must match its bytes."""
    return encode_e2m1(x) | (torch.signbit(x).to(torch.uint8) << 3)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """``[..., K]`` uint8 codes -> ``[..., K/2]`` bytes, even column in the low nibble."""
    if codes.dtype != torch.uint8:
        raise QuantError(f"pack_fp4 expects uint8 codes, got {codes.dtype}; encode with encode_e2m1 first")
    if codes.shape[-1] % 2:
        raise QuantError(f"pack_fp4 needs an even last dimension to pair codes, got shape {tuple(codes.shape)}")
    pairs = codes.unflatten(-1, (codes.shape[-1] // 2, 2))  # [..., K/2, 2]
    return (pairs[..., 0] & 0xF) | ((pairs[..., 1] & 0xF) << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """``[..., K/2]`` bytes -> ``[..., K]`` uint8 codes (inverse of ``pack_fp4``)."""
    if packed.dtype != torch.uint8:
        raise QuantError(f"unpack_fp4 expects uint8 packed bytes, got {packed.dtype}")
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)  # [..., K/2, 2] -> [..., K]


def qdq_e2m1(x: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize with a precomputed per-element (broadcast) divisor.

    ``round_e2m1(x / divisor) * divisor`` in fp32: the exact arithmetic both
    FP4 formats use in ``quantize`` + ``dequantize``, kept in one place so that
    fake_quant, dequantize and the GPTQ hooks agree bit for bit.
    """
    return round_e2m1(x.float() / divisor) * divisor


def blocks(w: torch.Tensor, block: int) -> torch.Tensor:
    """``[N, K]`` -> ``[N, K/block, block]`` view (K already checked divisible)."""
    return w.unflatten(-1, (w.shape[-1] // block, block))


def check_fp4_block(fmt: str, block_size, default: int) -> None:
    """Shared config check of the FP4 formats: two codes per byte need an even block."""
    from quarl.quant.base import QuantError

    if not isinstance(block_size, int) or block_size < 2 or block_size % 2:
        raise QuantError(
            f"{fmt}: block_size must be a positive even integer (two FP4 codes per byte), "
            f"got {block_size!r}; use the default {default}"
        )
