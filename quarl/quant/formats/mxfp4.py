"""MXFP4 (OCP Microscaling): E2M1 elements, 32-element blocks along K, one
E8M0 power-of-two scale per block -- byte-compatible with compressed-tensors'
``mxfp4-pack-quantized`` format (``weight_packed`` uint8 [N, K/2],
``weight_scale`` uint8 [N, K/32] holding the biased exponent, bias 127).

Versus NVFP4: no global scale and a coarser scale (a power of two, so up to
a factor 2 of headroom is wasted per block) over twice as many elements, in
exchange for a trivially cheap scale (an exponent add) and no per-tensor
state. Expect about 1.4 dB less SQNR than NVFP4 (19.0 vs 20.4 dB) on Gaussian weights.

Scale choice. The OCP MX v1.0 spec sets the block exponent to
``floor(log2(amax)) - emax_elem`` (emax_elem = 2 for E2M1), so ``amax / X``
lies in [4, 8) and everything above 6 saturates. compressed-tensors (and
vLLM's reference_mxfp4) first round ``amax`` to the nearest power of two at
E2M1's mantissa width -- i.e. bump the exponent when the mantissa of amax is
>= 1.75 -- so a block whose max would land in [7, 8) is rescaled to [3.5, 4)
instead of being clipped by up to 25%. We follow compressed-tensors bit for
bit, since that is what vLLM loads and what llm-compressor writes:

    amax_r    = amax rounded up to 2**k when amax >= 1.75 * 2**(k-1)
    e[n, b]   = clamp(127 + floor(log2(amax_r)) - 2, 0, 254)       (stored)
    code      = e2m1( W / 2**(e - 127) )                           (stored)

computed exactly with integer ops on the fp32 bit pattern (adding 2**21
carries into the exponent exactly when the top two mantissa bits are set).
An all-zero block gets e = 0 (scale 2**-127), so its codes are 0 and nothing
is NaN. The single deviation from compressed-tensors: for a block with amax
>= 1.75 * 2**127 (near fp32 max) its log2 overflows to inf and it stores 255,
which E8M0 reserves for NaN; we store the finite 253 (2**126) and saturate.

GPTQ hooks: there is no tensor state; ``block_scales`` returns the uint8
exponents ``[N, 1]`` of one 32-column group and ``qdq_with_scales`` rounds
1..32 columns with them. Group by group on unchanged weights this equals
``fake_quant`` bit for bit (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from quarl.quant.base import Format, FormatConfig, QTensor, QuantError, cat_group_scales, check_weight, register
from quarl.quant.formats.fp4 import (
    E2M1_EMAX,
    blocks,
    check_fp4_block,
    decode_e2m1,
    e2m1_codes_signed,
    encode_e2m1,
    pack_fp4,
    qdq_e2m1,
    unpack_fp4,
)

E8M0_BIAS = 127
E8M0_MAX_EXP = 254  # 255 is NaN in E8M0 (unreachable from finite fp32 amax: at most 253)
TENSOR_NAMES = ("weight_packed", "weight_scale")


@dataclass(frozen=True)
class MXFP4Config(FormatConfig):
    """MXFP4 weights. ``block_size`` 32 is the OCP format (and all vLLM loads);
    other even sizes are allowed for experiments."""

    name: ClassVar[str] = "mxfp4"
    block_size: int = 32

    def __post_init__(self) -> None:
        check_fp4_block("mxfp4", self.block_size, 32)

    @property
    def bits(self) -> float:
        return 4


def e8m0_exponents(amax: torch.Tensor) -> torch.Tensor:
    """Block amax (>= 0, any shape) -> biased E8M0 scale exponents, uint8."""
    bits = amax.float().contiguous().view(torch.int32)  # sign bit is 0: amax >= 0
    # round_to_power_2: +2**21 carries into the exponent iff mantissa >= 0.75
    biased = ((bits + (1 << 21)) >> 23) & 0xFF  # = 127 + floor(log2(amax_r)), 0 for amax_r == 0
    return (biased - E2M1_EMAX).clamp(0, E8M0_MAX_EXP).to(torch.uint8)


def e8m0_to_float(exp: torch.Tensor) -> torch.Tensor:
    """uint8 biased exponents -> fp32 ``2**(e - 127)``, built from bits (exact,
    including the subnormal 2**-127 for e == 0)."""
    e = exp.to(torch.int32)
    bits = torch.where(e > 0, e << 23, torch.full_like(e, 1 << 22))
    return bits.view(torch.float32)


class MXFP4(Format):
    name = "mxfp4"
    config_cls = MXFP4Config

    def _check_cfg(self, cfg: FormatConfig) -> MXFP4Config:
        if not isinstance(cfg, MXFP4Config):
            raise QuantError(f"mxfp4: expected an MXFP4Config, got {type(cfg).__name__}; use make_config('mxfp4')")
        return cfg

    def _prepare(self, w: torch.Tensor, cfg: FormatConfig):
        cfg = self._check_cfg(cfg)
        check_weight(w, cfg.block_size, self.name)
        w32 = blocks(w.detach().float(), cfg.block_size)  # [N, G, B]
        exp = e8m0_exponents(w32.abs().amax(-1))  # [N, G] uint8
        return cfg, w32, exp

    def quantize(self, w: torch.Tensor, cfg: FormatConfig, *, state: dict | None = None) -> QTensor:
        # ``state`` is accepted for interface symmetry; MXFP4 has no tensor state.
        cfg, w32, exp = self._prepare(w, cfg)
        codes = encode_e2m1(w32 / e8m0_to_float(exp)[..., None])  # [N, G, B]
        tensors = {"weight_packed": pack_fp4(codes.flatten(-2)), "weight_scale": exp}
        return QTensor(cfg, (w.shape[0], w.shape[1]), tensors)

    def dequantize(self, q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        missing = [k for k in TENSOR_NAMES if k not in q.tensors]
        if missing:
            raise QuantError(f"mxfp4: QTensor lacks {missing}; it was not produced by the mxfp4 format")
        n, k = q.shape
        b = q.config.block_size
        packed, exp = q.tensors["weight_packed"], q.tensors["weight_scale"]
        if tuple(packed.shape) != (n, k // 2) or tuple(exp.shape) != (n, k // b) or exp.dtype != torch.uint8:
            raise QuantError(
                f"mxfp4: tensors {tuple(packed.shape)}/{tuple(exp.shape)} {exp.dtype} do not match "
                f"weight {q.shape} with block {b} and uint8 exponents; the QTensor is corrupt"
            )
        vals = blocks(decode_e2m1(unpack_fp4(packed)), b)  # [N, G, B] fp32
        return (vals * e8m0_to_float(exp)[..., None]).flatten(-2).to(dtype)

    def fake_quant(self, w: torch.Tensor, cfg: FormatConfig, *, state: dict | None = None) -> torch.Tensor:
        """STE fake quantization; forward values equal ``dequantize(quantize(w))`` exactly."""
        cfg, w32, exp = self._prepare(w, cfg)
        q = qdq_e2m1(w32, e8m0_to_float(exp)[..., None]).flatten(-2).to(w.dtype)  # [N, K]
        return q + (w - w.detach()) if w.requires_grad else q

    # --- GPTQ hooks --------------------------------------------------------
    def block_scales(self, w_block: torch.Tensor, cfg: FormatConfig, state: dict) -> torch.Tensor:
        """uint8 E8M0 exponents ``[N, 1]`` of one aligned ``[N, block_size]`` group."""
        cfg = self._check_cfg(cfg)
        if w_block.dim() != 2 or w_block.shape[1] != cfg.block_size:
            raise QuantError(f"mxfp4: block_scales needs an [N, {cfg.block_size}] group, got {tuple(w_block.shape)}")
        return e8m0_exponents(w_block.detach().float().abs().amax(-1, keepdim=True))

    def qdq_with_scales(
        self, w_cols: torch.Tensor, scales: torch.Tensor, cfg: FormatConfig, state: dict
    ) -> torch.Tensor:
        cfg = self._check_cfg(cfg)
        if w_cols.dim() != 2 or not 1 <= w_cols.shape[1] <= cfg.block_size:
            raise QuantError(
                f"mxfp4: qdq_with_scales takes [N, 1..{cfg.block_size}] columns, got {tuple(w_cols.shape)}"
            )
        return qdq_e2m1(w_cols, e8m0_to_float(scales.reshape(-1, 1))).to(w_cols.dtype)

    # --- owned here as well: the GPTQ packer and the compressed-tensors mapping -----------------
    def pack_with_scales(self, cfg: FormatConfig, q: torch.Tensor, scales: list, state: dict) -> dict:
        exp = cat_group_scales(scales).to(torch.uint8)  # [N, G]
        codes = e2m1_codes_signed(blocks(q, cfg.block_size) / e8m0_to_float(exp)[..., None])
        return {"weight_packed": pack_fp4(codes.flatten(-2)), "weight_scale": exp}

    def ct_unrepresentable(self, cfg: FormatConfig) -> str | None:
        if cfg.block_size != 32:
            return f"mxfp4 with block_size {cfg.block_size} (the MX format is 32)"
        return None

    def ct_scheme(self, cfg: FormatConfig, targets: list[str]):
        from compressed_tensors.quantization import preset_name_to_scheme

        s = preset_name_to_scheme("MXFP4A16", targets)
        s.format = "mxfp4-pack-quantized"
        return s

    def from_ct_weights(self, w: dict) -> FormatConfig | None:
        hit = (w.get("type"), w.get("num_bits"), w.get("group_size")) == ("float", 4, 32)
        return self.config_cls() if hit else None


MXFP4_FORMAT = register(MXFP4())
