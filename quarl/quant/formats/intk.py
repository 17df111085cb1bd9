"""INT-k (k in 2, 3, 4, 8): group-wise integer weights in compressed-tensors' pack-quantized layout.

Conventions are compressed-tensors' (``calculate_qparams`` / ``_quantize`` /
``pack_to_int32``), which are also GPTQ's and llm-compressor's, so a weight
quantized here exports with a rename and decodes identically in vLLM:

  * groups of ``group_size`` (128) consecutive elements along K, one fp32 scale each;
  * signed code range ``[qmin, qmax] = [-2**(k-1), 2**(k-1) - 1]``;
  * asymmetric (default): ``lo = min(min(x), 0)``, ``hi = max(max(x), 0)`` (0 is always
    representable), ``scale = (hi - lo) / (2**k - 1)``,
    ``zp = round(clamp(qmin - lo / scale, qmin, qmax))`` (int8),
    ``q = round(clamp(x / scale + zp, qmin, qmax))``, ``x' = (q - zp) * scale``.
    Adding ``2**(k-1)`` to q and zp gives the textbook unsigned form: codes in
    ``[0, 2**k - 1]``, zero point ``round(-lo / scale)``;
  * symmetric (``-sym``): ``scale = amax / ((2**k - 1) / 2)`` (e.g. amax / 7.5 for int4),
    ``q = round(clamp(x / scale, qmin, qmax))``, no zero point. The most negative code
    is used (x = -amax -> -7.5 -> -8) and +amax clips to qmax * scale: that is the
    compressed-tensors / GPTQ convention, chosen over amax / (2**(k-1) - 1) for
    exchangeability of checkpoints;
  * rounding is ``torch.round`` (half to even); a zero scale (all-zero group) becomes
    float32 eps, so such groups decode to exact zeros.

Packing (``weight_packed`` int32 ``[N, ceil(K*k/32)]``): codes are offset to unsigned
(``q + 2**(k-1)``) and written as one dense little-endian bit stream per row,
element i at bit ``i*k`` (bit ``i*k % 32`` of word ``i*k // 32``). For k in 2/4/8 that
is the classic "32/k values per int32, element 0 in the low bits". For k = 3, every
32 elements fill exactly 3 words and values straddle word boundaries; this is
compressed-tensors >= 0.13's dense layout (older releases wasted 2 bits per word).
Other tensors: ``weight_scale`` fp32 ``[N, K/g]``; ``weight_zero_point`` int8 ``[N, K/g]``
(signed, asymmetric only; :func:`to_compressed_tensors` packs it along N as the
pack-quantized checkpoint format stores it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from quarl.quant.base import Format, FormatConfig, QTensor, QuantError, cat_group_scales, check_weight, register

SUPPORTED_BITS = (2, 3, 4, 8)
_EPS = torch.finfo(torch.float32).eps
_U32 = 1 << 32


@dataclass(frozen=True)
class IntConfig(FormatConfig):
    """Group-wise integer weights: ``bits`` per code, ``group_size`` columns per scale."""

    name = "int"
    bits: int = 4  # type: ignore[assignment]  (a field here, a property on the base)
    group_size: int = 128
    symmetric: bool = False

    def __post_init__(self) -> None:
        if self.bits not in SUPPORTED_BITS:
            raise QuantError(f"int: bits={self.bits} is not supported; use one of {SUPPORTED_BITS}")
        if self.group_size <= 0:
            raise QuantError(f"int: group_size must be positive (128 is the usual choice), got {self.group_size}")

    @property
    def block_size(self) -> int:
        return self.group_size

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1))

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @property
    def scale_bits(self) -> float:
        # fp32 scale (+ a zero point of `bits` bits when asymmetric, as stored packed)
        return (32 + (0 if self.symmetric else self.bits)) / self.group_size

    @property
    def memory_bits(self) -> float:
        return self.bits + self.scale_bits


# --- packing -------------------------------------------------------------------------
def _word_layout(bits: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    start = torch.arange(32, device=device) * bits
    return start // 32, start % 32  # word index [32], bit offset [32]


def pack_int32(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes ``[R, C]`` in ``[0, 2**bits)`` -> int32 ``[R, ceil(C*bits/32)]`` (dense bit stream)."""
    r, c = codes.shape
    groups = -(-c // 32)
    v = torch.nn.functional.pad(codes.to(torch.int64), (0, groups * 32 - c)).view(r, groups, 32)
    word, off = _word_layout(bits, codes.device)
    out = torch.zeros(r, groups, bits + 1, dtype=torch.int64, device=codes.device)  # +1: spill word
    out.scatter_add_(2, word.expand(r, groups, 32), (v << off) & (_U32 - 1))
    spill = off + bits > 32  # element straddles into the next word
    if spill.any():
        out.scatter_add_(2, (word[spill] + 1).expand(r, groups, -1), v[..., spill] >> (32 - off[spill]))
    words = out[..., :bits].reshape(r, groups * bits)[:, : -(-c * bits // 32)]
    return torch.where(words >= 1 << 31, words - _U32, words).to(torch.int32)


def unpack_int32(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`pack_int32`: int32 ``[R, W]`` -> unsigned codes ``[R, cols]`` (int64)."""
    r, w = packed.shape
    groups = -(-cols // 32)
    u = packed.to(torch.int64) & (_U32 - 1)
    u = torch.nn.functional.pad(u, (0, groups * bits + 1 - w)).view(r, -1)  # room for the spill word
    word, off = _word_layout(bits, packed.device)
    base = (torch.arange(groups, device=packed.device) * bits)[:, None]  # [G, 1]
    lo = u[:, base + word] >> off  # [R, G, 32]
    hi = u[:, base + word + 1] << (32 - off)
    mask = (1 << bits) - 1
    return ((lo | torch.where(off + bits > 32, hi, torch.zeros_like(hi))) & mask).reshape(r, -1)[:, :cols]


# --- quantization math ---------------------------------------------------------------
def group_qparams(wg: torch.Tensor, cfg: IntConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``wg`` [..., g] fp32 -> (scale [..., 1] fp32, zero point [..., 1] fp32 holding ints, or None)."""
    lo = wg.amin(dim=-1, keepdim=True).clamp(max=0)
    hi = wg.amax(dim=-1, keepdim=True).clamp(min=0)
    rng = float((1 << cfg.bits) - 1)
    if cfg.symmetric:
        scale = torch.maximum(-lo, hi) / (rng / 2)
    else:
        scale = (hi - lo) / rng
    scale = torch.where(scale == 0, torch.full_like(scale, _EPS), scale)
    if cfg.symmetric:
        return scale, None
    return scale, torch.round((cfg.qmin - lo / scale).clamp(cfg.qmin, cfg.qmax))


def _qparams(wg: torch.Tensor, cfg: IntConfig, state: dict | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The group parameters of ``wg`` [N, G, g]: from the weight, or frozen ones from ``state``.

    A state carrying ``weight_scale`` [N, G] (and ``weight_zero_point`` for asymmetric formats: a
    QTensor's own tensors) keeps that grid -- QAT from a calibrated (e.g. GPTQ) model rounds onto
    the calibrated grid, so its step 0 is the calibrated model exactly."""
    if not state or "weight_scale" not in state:
        return group_qparams(wg, cfg)
    n, g = wg.shape[:2]
    scale, zp = state["weight_scale"], state.get("weight_zero_point")
    if tuple(scale.shape) != (n, g) or (zp is None) != cfg.symmetric or (zp is not None and tuple(zp.shape) != (n, g)):
        raise QuantError(f"int{cfg.bits}: frozen state needs weight_scale {(n, g)}"
                         + ("" if cfg.symmetric else f" and weight_zero_point {(n, g)}")
                         + f", got {sorted(state)} of shapes {[tuple(v.shape) for v in state.values()]}")
    return scale.float().unsqueeze(-1), None if zp is None else zp.float().unsqueeze(-1)


def _quant(w: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor | None, cfg: IntConfig) -> torch.Tensor:
    t = w / scale
    if zp is not None:
        t = t + zp
    return torch.round(t.clamp(cfg.qmin, cfg.qmax))  # fp32 holding signed codes


def _dequant(q: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor | None) -> torch.Tensor:
    return ((q - zp) if zp is not None else q) * scale


class IntFormat(Format):
    name = "int"
    config_cls = IntConfig

    def quantize(self, w: torch.Tensor, cfg: IntConfig, *, state: dict | None = None) -> QTensor:
        check_weight(w, cfg.group_size, f"int{cfg.bits}")
        n, k = w.shape
        wg = w.float().view(n, k // cfg.group_size, cfg.group_size)  # [N, G, g]
        scale, zp = _qparams(wg, cfg, state)  # [N, G, 1]
        q = _quant(wg, scale, zp, cfg).view(n, k)
        tensors = {
            "weight_packed": pack_int32((q - cfg.qmin).to(torch.int64), cfg.bits),
            "weight_scale": scale.squeeze(-1),
        }
        if zp is not None:
            tensors["weight_zero_point"] = zp.squeeze(-1).to(torch.int8)
        return QTensor(cfg, (n, k), tensors)

    def dequantize(self, q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        cfg: IntConfig = q.config  # type: ignore[assignment]
        n, k = q.shape
        codes = unpack_int32(q.tensors["weight_packed"], cfg.bits, k).float() + cfg.qmin
        scale = q.tensors["weight_scale"].unsqueeze(-1)  # [N, G, 1]
        zp = q.tensors.get("weight_zero_point")
        zp = zp.float().unsqueeze(-1) if zp is not None else None
        return _dequant(codes.view(n, -1, cfg.group_size), scale, zp).view(n, k).to(dtype)

    def fake_quant(self, w: torch.Tensor, cfg: IntConfig, *, state: dict | None = None) -> torch.Tensor:
        """STE fake quantization; forward values equal ``dequantize(quantize(w))`` exactly.

        The same group parameters and rounding as ``quantize`` without the bit packing and unpacking
        (codes and zero points are small integers held exactly in fp32, scales stay fp32): a QAT
        forward pays a dozen elementwise kernels per layer instead of the packer's ~60, and no device
        sync (no value check: a non-finite weight shows up in the loss, which the trainers check)."""
        check_weight(w, cfg.group_size, f"int{cfg.bits}", finite=False)
        n, k = w.shape
        wg = w.detach().float().view(n, k // cfg.group_size, cfg.group_size)  # [N, G, g]
        scale, zp = _qparams(wg, cfg, state)  # [N, G, 1]
        q = _dequant(_quant(wg, scale, zp, cfg), scale, zp).view(n, k).to(w.dtype)
        return q + (w - w.detach()) if w.requires_grad else q

    # --- GPTQ hooks ----------------------------------------------------------
    def block_scales(self, w_block: torch.Tensor, cfg: IntConfig, state: dict):
        """(scale [N, 1], zero point [N, 1] or None) for one group."""
        if w_block.shape[1] != cfg.group_size:
            raise QuantError(f"int: block_scales expects {cfg.group_size} columns, got {w_block.shape[1]}")
        return group_qparams(w_block.float(), cfg)

    def qdq_with_scales(self, w_cols: torch.Tensor, scales, cfg: IntConfig, state: dict) -> torch.Tensor:
        scale, zp = scales
        return _dequant(_quant(w_cols.float(), scale, zp, cfg), scale, zp).to(w_cols.dtype)

    # --- owned here as well: the spec grammar, the GPTQ packer and the compressed-tensors mapping -----------------
    def parse_spec(self, s: str) -> FormatConfig | None:
        m = re.fullmatch(r"w(\d)g(\d+)", s)  # Reasoning-QAT's spelling: w3g128 == int3-g128
        if m:
            return IntConfig(bits=int(m[1]), group_size=int(m[2]), symmetric=False)
        m = re.fullmatch(r"int(\d)((?:-g\d+)?)((?:-sym)?)", s)  # int{2,3,4,8}[-g128][-sym]
        if m:
            kw: dict = {"bits": int(m[1]), "symmetric": bool(m[3])}
            if m[2]:
                kw["group_size"] = int(m[2][2:])
            return IntConfig(**kw)
        return None

    def spec_string(self, cfg: FormatConfig) -> str:
        return f"int{cfg.bits}-g{cfg.group_size}" + ("-sym" if cfg.symmetric else "")

    def pack_with_scales(self, cfg: FormatConfig, q: torch.Tensor, scales: list, state: dict) -> dict:
        n, k = q.shape
        scale = cat_group_scales([s for s, _ in scales])  # [N, G] fp32
        zp = None if cfg.symmetric else cat_group_scales([z for _, z in scales])  # [N, G] fp32 holding ints
        qg = q.view(n, -1, cfg.group_size) / scale.unsqueeze(-1)  # [N, G, g]
        if zp is not None:
            qg = qg + zp.unsqueeze(-1)
        codes = torch.round(qg.clamp(cfg.qmin, cfg.qmax)).view(n, k)
        out = {"weight_packed": pack_int32((codes - cfg.qmin).to(torch.int64), cfg.bits), "weight_scale": scale}
        if zp is not None:
            out["weight_zero_point"] = zp.to(torch.int8)
        return out

    def ct_unrepresentable(self, cfg: FormatConfig) -> str | None:
        return None

    def ct_scheme(self, cfg: FormatConfig, targets: list[str]):
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

        args = QuantizationArgs(num_bits=cfg.bits, type="int", symmetric=cfg.symmetric, strategy="group",
                                group_size=cfg.group_size, dynamic=False)
        s = QuantizationScheme(targets=targets, weights=args)
        s.format = "pack-quantized"
        return s

    def from_ct_weights(self, w: dict) -> FormatConfig | None:
        if w.get("type") == "int" and w.get("strategy") == "group":
            return IntConfig(bits=w.get("num_bits"), group_size=w.get("group_size"),
                             symmetric=bool(w.get("symmetric")))
        return None

    def to_ct_tensors(self, q: QTensor) -> dict[str, torch.Tensor]:
        return to_compressed_tensors(q)

    def from_ct_tensors(self, cfg: FormatConfig, shape: tuple[int, int], t: dict) -> dict[str, torch.Tensor]:
        if "weight_zero_point" in t:
            zp = t["weight_zero_point"]  # int32 [ceil(N*bits/32), G], packed along N
            t["weight_zero_point"] = (unpack_int32(zp.t().contiguous(), cfg.bits, shape[0]).t() + cfg.qmin).to(
                torch.int8)
        return t


def quantization_args(cfg: IntConfig) -> dict:
    """compressed-tensors ``QuantizationArgs`` fields describing this config."""
    return {"num_bits": cfg.bits, "type": "int", "symmetric": cfg.symmetric, "strategy": "group",
            "group_size": cfg.group_size}  # fmt: skip


def to_compressed_tensors(q: QTensor) -> dict[str, torch.Tensor]:
    """State dict of one Linear in compressed-tensors' ``pack-quantized`` checkpoint format."""
    cfg: IntConfig = q.config  # type: ignore[assignment]
    out = {
        "weight_packed": q.tensors["weight_packed"],
        "weight_scale": q.tensors["weight_scale"],
        "weight_shape": torch.tensor(q.shape),
    }
    if "weight_zero_point" in q.tensors:  # packed along N (dim 0), as PackedQuantizationCompressor does
        zp_u = q.tensors["weight_zero_point"].to(torch.int64) - cfg.qmin  # [N, G]
        out["weight_zero_point"] = pack_int32(zp_u.t(), cfg.bits).t().contiguous()
    return out


FORMAT = register(IntFormat())
