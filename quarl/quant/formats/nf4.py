"""NF4: QLoRA's 4-bit NormalFloat with per-block absmax scaling, bit-compatible with bitsandbytes.

Number system
    16 code values (``NF4_CODE``) copied from bitsandbytes (``_NF4_QUANT_TABLE`` in
    ``bitsandbytes/backends/utils.py``, identical to ``dDequantizeNF4`` in
    ``csrc/kernels.cu``): quantiles of N(0, 1) normalised to [-1, 1], with an exact 0.
    A weight block of ``block_size`` (64) consecutive elements along K is scaled by
    ``1 / absmax(block)`` and each element goes to the nearest code. bitsandbytes
    decides "nearest" with a decision tree of strict ``x > midpoint`` tests, the
    midpoints being float64 averages of neighbouring codes rounded to float32; we use
    the same float32 midpoints with ``torch.bucketize(right=False)``, so an exact tie
    goes to the *lower* code, as in bitsandbytes. Like bitsandbytes we multiply by
    the reciprocal of absmax (not divide) and clamp to [-1, 1].

Packing
    Two codes per byte, ``weight_packed`` uint8 ``[N, K/2]``; element ``2j`` in the
    HIGH nibble and ``2j+1`` in the low nibble (bitsandbytes:
    ``packed = q[::2] << 4 | q[1::2]``). Our row-major ``[N, K/2]`` bytes are exactly
    bitsandbytes' flat ``[N*K/2, 1]`` storage, and our ``[N, K/64]`` absmax is its flat
    absmax vector, because blocks never straddle rows (K % block_size == 0).
    Note the opposite nibble order from compressed-tensors' int4 packing.

Double quantization (``double_quant=True``), as bitsandbytes ``compress_statistics``:
    the fp32 absmax vector ``a`` (flattened ``[N*K/64]``) is shifted by its mean
    ``offset = a.mean()``, then quantized blockwise (``dq_block_size`` = 256
    consecutive absmax values per block) with bitsandbytes' signed 8-bit *dynamic
    tree* map (``create_dynamic_map(signed=True)``, rebuilt here bit for bit in
    float32): ``absmax2[j] = max|a - offset|`` over block j, code = nearest map
    entry to ``(a - offset) * (1/absmax2[j])``. Decoded absmax is
    ``map[code] * absmax2[j] + offset``. Difference from bitsandbytes: its CUDA
    kernel finds the nearest 8-bit entry by binary search, which breaks exact
    midpoint ties towards the search pivot; we break them towards the lower entry
    (ties have measure zero on real weights).
    Tensors: ``weight_scale`` uint8 ``[N, K/64]`` (bnb ``absmax``),
    ``weight_scale_absmax`` fp32 ``[ceil(N*K/64/256)]`` (bnb ``state2.absmax``),
    ``weight_scale_offset`` fp32 ``[1]`` (bnb ``offset``). Without it,
    ``weight_scale`` is the fp32 absmax ``[N, K/64]``.

Memory: 4 bits/weight + 32/64 (fp32 absmax) = 4.5, or with double quantization
4 + 8/64 + 32/(64*256) ~= 4.127 (``NF4Config.memory_bits``).

All-zero blocks get absmax 0; we multiply by 0 instead of 1/0, so they decode to
exact zeros (bitsandbytes would produce NaN there).

GPTQ hooks: without double quantization a group's scale is its own absmax. With it,
a group's decoded scale depends on ``offset`` and on the second-level absmax of
the 256-wide flat block it falls in, so ``tensor_state`` computes those from the
whole (original) weight, and ``block_scales`` must then be called once per group
in K order: the state carries a cursor (``"next_group"``) telling it which column
of absmax codes it is producing. Call ``tensor_state`` again to restart.
``quantize(w, state=...)`` uses a double-quant state only if it was computed for a
weight of the same shape: bitsandbytes has no notion of statistics shared across
fused q/k/v shards, so a state computed over concatenated shards is ignored.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import torch

from quarl.quant.base import Format, FormatConfig, QTensor, QuantError, cat_group_scales, check_weight, register

# bitsandbytes' NF4 table, index = 4-bit code.
NF4_CODE: tuple[float, ...] = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)  # fmt: skip
_CODE = torch.tensor(NF4_CODE, dtype=torch.float32)
# float64 midpoints rounded to float32: the constants of bitsandbytes' dQuantizeNF4 tree
_MIDS = torch.tensor([(a + b) / 2 for a, b in itertools.pairwise(NF4_CODE)], dtype=torch.float64).float()


def dynamic_map_signed() -> torch.Tensor:
    """bitsandbytes ``create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)``.

    Dynamic tree quantization (Dettmers 2016): for exponent i in 0..6, 2**i linear
    fraction values (means of consecutive ``linspace(0.1, 1, 2**i + 1)`` points, in
    float32) scaled by 10**(i-6), both signs, plus 0 and 1.0; 256 sorted values.
    """
    data: list[float] = []
    for i in range(7):
        bounds = torch.linspace(0.1, 1, 2**i + 1)  # float32, as in bitsandbytes
        means = (bounds[:-1] + bounds[1:]) / 2.0
        data += (10 ** (-6 + i) * means).tolist()
        data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0.0, 1.0]
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


_DYN = dynamic_map_signed()
_DYN_MIDS = (_DYN[:-1] + _DYN[1:]) * 0.5  # float32, as the CUDA kernel computes them

_TABLES_ON: dict[tuple[int, torch.device], torch.Tensor] = {}


def _table(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One of the tables above on ``device``, copied there once: a host-to-device copy per call would
    also make the decode step impossible to capture in a CUDA graph (the engine then decodes eagerly)."""
    if device.type == "cpu":
        return t
    key = (id(t), device)
    if key not in _TABLES_ON:
        _TABLES_ON[key] = t.to(device)
    return _TABLES_ON[key]


@dataclass(frozen=True)
class NF4Config(FormatConfig):
    """NF4 weights: ``block_size`` elements along K per absmax; optional QLoRA double quantization."""

    name = "nf4"
    block_size: int = 64
    double_quant: bool = False
    dq_block_size: int = 256

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size % 2:
            raise QuantError(
                f"nf4: block_size must be a positive even number (bitsandbytes uses 64), got {self.block_size}"
            )
        if self.dq_block_size <= 0:
            raise QuantError(f"nf4: dq_block_size must be positive (bitsandbytes uses 256), got {self.dq_block_size}")

    @property
    def bits(self) -> float:
        return 4.0

    @property
    def scale_bits(self) -> float:
        """Scale storage per weight element."""
        if self.double_quant:
            return 8 / self.block_size + 32 / (self.block_size * self.dq_block_size)
        return 32 / self.block_size

    @property
    def memory_bits(self) -> float:
        return self.bits + self.scale_bits


def _safe_recip(a: torch.Tensor) -> torch.Tensor:
    # 1/absmax, with 0 for all-zero blocks so they encode to code 7 (0.0) instead of NaN
    return torch.where(a > 0, 1.0 / a, torch.zeros_like(a))


def _encode(w: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """``w`` [N, c] fp32, ``absmax`` [N, 1] -> codes [N, c] uint8 (nearest, ties to lower)."""
    x = (w * _safe_recip(absmax)).clamp(-1.0, 1.0)
    return torch.bucketize(x, _table(_MIDS, x.device), right=False).to(torch.uint8)


def _decode(codes: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    return _table(_CODE, codes.device)[codes.long()] * absmax  # fp32


def _dq_stats(absmax_flat: torch.Tensor, cfg: NF4Config) -> tuple[torch.Tensor, torch.Tensor]:
    """Second-level parameters for the flat fp32 absmax vector: (offset [1], absmax2 [nb2])."""
    offset = absmax_flat.mean().reshape(1)
    centered = absmax_flat - offset
    nb2 = -(-centered.numel() // cfg.dq_block_size)
    pad = nb2 * cfg.dq_block_size - centered.numel()
    absmax2 = torch.nn.functional.pad(centered.abs(), (0, pad)).view(nb2, cfg.dq_block_size).amax(dim=1)
    return offset, absmax2


def _dq_encode(absmax_flat: torch.Tensor, offset: torch.Tensor, absmax2_per: torch.Tensor) -> torch.Tensor:
    """fp32 absmax values with their own second-level absmax -> 8-bit dynamic-map codes."""
    x = ((absmax_flat - offset) * _safe_recip(absmax2_per)).clamp(-1.0, 1.0)
    return torch.bucketize(x, _table(_DYN_MIDS, x.device), right=False).to(torch.uint8)


def _dq_decode(codes: torch.Tensor, offset: torch.Tensor, absmax2_per: torch.Tensor) -> torch.Tensor:
    return _table(_DYN, codes.device)[codes.long()] * absmax2_per + offset


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] codes in 0..15 -> [N, K/2] uint8, element 2j in the high nibble (bitsandbytes order)."""
    c = codes.to(torch.uint8)
    return (c[:, 0::2] << 4) | c[:, 1::2]


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: [N, K/2] uint8 -> [N, K] uint8."""
    return torch.stack((packed >> 4, packed & 0xF), dim=-1).flatten(-2)


class NF4Format(Format):
    name = "nf4"
    config_cls = NF4Config

    def _absmax(self, w: torch.Tensor, cfg: NF4Config) -> torch.Tensor:
        n, k = w.shape
        return w.float().abs().view(n, k // cfg.block_size, cfg.block_size).amax(dim=-1)  # [N, K/B]

    def quantize(self, w: torch.Tensor, cfg: NF4Config, *, state: dict | None = None) -> QTensor:
        check_weight(w, cfg.block_size, "nf4")
        n, k = w.shape
        g = k // cfg.block_size
        absmax = self._absmax(w, cfg)  # [N, G]
        tensors: dict[str, torch.Tensor] = {}
        if cfg.double_quant:
            # bitsandbytes double-quantizes each weight on its own: a state computed over
            # several fused shards (quantize_model's shared scales) has another shape and
            # does not apply, so only a state for exactly this weight is used.
            use = state is not None and state.get("shape") == tuple(w.shape)
            st = state if use else self.tensor_state(w, cfg)
            offset, absmax2 = st["offset"].to(w.device), st["absmax2"].to(w.device)
            per = absmax2.repeat_interleave(cfg.dq_block_size)[: n * g].view(n, g)  # [N, G]
            qa = _dq_encode(absmax, offset, per)
            tensors.update(weight_scale=qa, weight_scale_absmax=absmax2, weight_scale_offset=offset)
            absmax = _dq_decode(qa, offset, per)  # the 4-bit codes are chosen against the decoded scale
        else:
            tensors["weight_scale"] = absmax
        codes = _encode(w.float().view(n, g, cfg.block_size), absmax.unsqueeze(-1)).view(n, k)
        tensors["weight_packed"] = pack_nibbles(codes)
        return QTensor(cfg, (n, k), tensors)

    def dequantize(self, q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        cfg: NF4Config = q.config  # type: ignore[assignment]
        n, k = q.shape
        g = k // cfg.block_size
        t = q.tensors
        if cfg.double_quant:
            per = t["weight_scale_absmax"].repeat_interleave(cfg.dq_block_size)[: n * g].view(n, g)
            absmax = _dq_decode(t["weight_scale"], t["weight_scale_offset"], per)
        else:
            absmax = t["weight_scale"]
        codes = unpack_nibbles(t["weight_packed"]).view(n, g, cfg.block_size)
        return _decode(codes, absmax.unsqueeze(-1)).view(n, k).to(dtype)

    # --- GPTQ hooks ----------------------------------------------------------
    def tensor_state(self, w: torch.Tensor, cfg: NF4Config) -> dict:
        if not cfg.double_quant:
            return {}
        check_weight(w, cfg.block_size, "nf4")
        offset, absmax2 = _dq_stats(self._absmax(w, cfg).flatten(), cfg)
        return {"offset": offset, "absmax2": absmax2, "shape": tuple(w.shape),
                "n_groups": w.shape[1] // cfg.block_size, "next_group": 0}  # fmt: skip

    def block_scales(self, w_block: torch.Tensor, cfg: NF4Config, state: dict) -> torch.Tensor:
        """Decoded absmax [N, 1] (fp32) for one group of ``block_size`` columns."""
        if w_block.shape[1] != cfg.block_size:
            raise QuantError(f"nf4: block_scales expects {cfg.block_size} columns, got {w_block.shape[1]}")
        absmax = w_block.float().abs().amax(dim=1, keepdim=True)  # [N, 1]
        if not cfg.double_quant:
            return absmax
        if "next_group" not in state:
            raise QuantError("nf4 double_quant: block_scales needs the state from tensor_state(w, cfg)")
        j, g, n = state["next_group"], state["n_groups"], w_block.shape[0]
        if j >= g:
            raise QuantError(f"nf4 double_quant: all {g} groups already scaled; call tensor_state again to restart")
        state["next_group"] = j + 1
        # flat absmax index of (row r, group j) is r*g + j
        idx = torch.arange(n, device=w_block.device) * g + j
        per = state["absmax2"].to(w_block.device)[idx // cfg.dq_block_size].unsqueeze(1)  # [N, 1]
        offset = state["offset"].to(w_block.device)
        return _dq_decode(_dq_encode(absmax, offset, per), offset, per)

    def qdq_with_scales(self, w_cols: torch.Tensor, scales: torch.Tensor, cfg: NF4Config, state: dict) -> torch.Tensor:
        return _decode(_encode(w_cols.float(), scales), scales).to(w_cols.dtype)

    # --- owned here as well: the spec grammar, the GPTQ packer and the compressed-tensors mapping -----------------
    def parse_spec(self, s: str) -> FormatConfig | None:
        m = re.fullmatch(r"nf4(?:-(dq)(\d*))?(?:-b(\d+))?", s)  # nf4[-dq[256]][-b64]
        if not m:
            return None
        kw: dict = {"double_quant": bool(m[1])}
        if m[2]:
            kw["dq_block_size"] = int(m[2])
        if m[3]:
            kw["block_size"] = int(m[3])
        return NF4Config(**kw)

    def spec_string(self, cfg: FormatConfig) -> str:
        dq = "" if not cfg.double_quant else "-dq" if cfg.dq_block_size == 256 else f"-dq{cfg.dq_block_size}"
        return "nf4" + dq + ("" if cfg.block_size == 64 else f"-b{cfg.block_size}")

    def pack_with_scales(self, cfg: FormatConfig, q: torch.Tensor, scales: list, state: dict) -> dict:
        n, k = q.shape
        absmax = cat_group_scales(scales).float()  # [N, G] (decoded, when double-quantized)
        g = absmax.shape[1]
        codes = _encode(q.view(n, g, cfg.block_size), absmax.unsqueeze(-1)).view(n, k)
        out = {"weight_packed": pack_nibbles(codes)}
        if not cfg.double_quant:
            out["weight_scale"] = absmax
            return out
        # Recover each group's 8-bit code: the one whose decoded value is *exactly* the
        # scale GPTQ used (re-encoding could flip a tie between two close map entries).
        offset, absmax2 = state["offset"].to(q.device), state["absmax2"].to(q.device)
        per = absmax2.repeat_interleave(cfg.dq_block_size)[: n * g].view(n, g)  # [N, G]
        cand = _table(_DYN, q.device)[None, None, :] * per[..., None] + offset  # [N, G, 256]
        hit = cand == absmax[..., None]
        if not hit.any(-1).all():
            raise QuantError("nf4 double-quant: a GPTQ scale is not on the second-level grid; the state does not "
                             "match")
        out.update(weight_scale=hit.float().argmax(-1).to(torch.uint8), weight_scale_absmax=absmax2,
                   weight_scale_offset=offset)
        return out

    def ct_unrepresentable(self, cfg: FormatConfig) -> str | None:
        return "NF4 has no compressed-tensors format (vLLM reads NF4 only from bitsandbytes checkpoints)"


FORMAT = register(NF4Format())
